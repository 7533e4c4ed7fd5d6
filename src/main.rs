//! The `pagos` command line: parse, build, run. Nothing else lives here.

use clap::Parser;
use pagos::config::{Cli, Command, one_line_error};
use pagos::{app, telemetry};
use std::process::ExitCode;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err)
            if !err.use_stderr()
                || err.kind()
                    == clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand =>
        {
            err.exit()
        }
        Err(err) => {
            eprintln!("{}", one_line_error(&err));
            return ExitCode::from(2);
        }
    };
    telemetry::init(cli.log_format);
    // reqwest and sqlx each enable a different rustls crypto provider; with both, rustls
    // picks none by itself and certificate verification (PostgreSQL's verify-ca and
    // verify-full) would panic. `Err` means one is installed already: fine.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    match run(cli.command).await {
        Ok(code) => code,
        Err(err) => {
            eprintln!("pagos: {err:#}");
            // A bad setting or a database that cannot be opened: the operator fixes the
            // configuration (exit 2, as for every setting refused at start).
            let is_setup = err.downcast_ref::<pagos::config::SettingError>().is_some()
                || err.downcast_ref::<pagos::db::OpenError>().is_some()
                || err.downcast_ref::<pagos::db::MigrationError>().is_some();
            if is_setup {
                ExitCode::from(2)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

async fn run(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Serve(settings) => {
            if let Err(err) = settings.validate() {
                eprintln!("pagos: {err}");
                return Ok(ExitCode::from(2));
            }
            if let Err(err) = bad_database_url(&settings.database.url) {
                eprintln!("pagos: {err}");
                return Ok(ExitCode::from(2));
            }
            app::serve(*settings).await?;
        }
        Command::Migrate(database) => match app::migrate(&database).await? {
            app::Migrated::Applied(applied) if applied.is_empty() => {
                eprintln!("pagos: migrations applied (none was pending)");
            }
            app::Migrated::Applied(applied) => {
                eprintln!("pagos: migrations applied ({})", applied.len());
            }
            app::Migrated::ByNewerRelease(_) => {
                eprintln!("pagos: nothing to apply: the database was migrated by a newer release");
            }
        },
        Command::Merchants { action } => return pagos::merchants::cli::run(action).await,
        Command::SandboxGateway(args) => pagos::gateway::sandbox_server::run(args).await?,
        Command::Pay(args) => return pagos_client::cli::run(*args).await,
        Command::Refund(args) => return pagos_client::refund_cli::run(*args).await,
        Command::Operators { action } => return pagos::operators::cli::run(action).await,
        Command::Reconcile(args) => {
            if !args.once {
                // `PAGOS_RECONCILE_ONCE=false`: one pass is the only mode.
                let refused = pagos::config::SettingError {
                    env: "PAGOS_RECONCILE_ONCE",
                    flag: "once",
                    message: "must be true: one pass is the only mode of `pagos reconcile` (the periodic reconciler runs inside `pagos serve`)".to_owned(),
                };
                eprintln!("pagos: {refused}");
                return Ok(ExitCode::from(2));
            }
            if let Err(err) = args.settings.validate() {
                eprintln!("pagos: {err}");
                return Ok(ExitCode::from(2));
            }
            let ran_by = args.operator();
            return app::reconcile_once(*args.settings, ran_by).await;
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn bad_database_url(url: &str) -> Result<(), String> {
    let ok = url.starts_with("sqlite:")
        || url.starts_with("postgres://")
        || url.starts_with("postgresql://");
    if ok {
        Ok(())
    } else {
        Err("invalid setting PAGOS_DATABASE_URL (--database-url): expected sqlite://FILE?mode=rwc or postgres://USER@HOST/DB".into())
    }
}
