//! Opening the database and starting write transactions the same way everywhere.
//!
//! SQLite runs in WAL mode with a busy timeout, and every write transaction is
//! `BEGIN IMMEDIATE`: a deferred transaction that reads and then writes can fail at once
//! with "database is locked" (busy timeouts do not apply to lock upgrades). Its commits are
//! `synchronous=FULL`: with `NORMAL` in WAL mode a power loss can roll back a committed
//! transaction (SQLite documents it), a payment whose merchant was already told 201.
//!
//! Before the pool is built, one connection is tried alone, so that a database that cannot
//! be opened stops the process within seconds with one line saying where and why (the
//! pool would retry until its acquire timeout and say only that it timed out). Those lines
//! never carry the URL: it may hold a password.

use sea_orm::sqlx::postgres::{PgConnectOptions, PgConnection, PgSslMode};
use sea_orm::sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqliteSynchronous,
};
use sea_orm::sqlx::{self, Connection as _};
use sea_orm::{
    ConnectOptions, Database, DatabaseConnection, DatabaseTransaction, DbBackend, DbErr,
    SqliteTransactionMode, TransactionOptions, TransactionTrait,
};
use std::str::FromStr;
use std::time::Duration;

use anyhow::Context;

mod lane;
use migration::{Migrator, MigratorTrait};

/// Where the database is and how many connections to it: flattened into every command
/// that opens one (`config`).
#[derive(Clone, Debug, clap::Args)]
pub struct DatabaseArgs {
    /// Database URL: sqlite://FILE?mode=rwc (embedded) or postgres://USER@HOST/DB. One
    /// connection is tried at start: if it fails, one line says where and why (exit 2)
    #[arg(
        long = "database-url",
        env = "PAGOS_DATABASE_URL",
        default_value = "sqlite://pagos.db?mode=rwc",
        value_name = "URL"
    )]
    pub url: String,
    /// Database connections in the pool
    #[arg(long = "database-pool-size", env = "PAGOS_DATABASE_POOL_SIZE", default_value_t = 16,
          value_parser = clap::value_parser!(u32).range(1..=1000), value_name = "N")]
    pub pool_size: u32,
}

/// Opens the database and applies pending migrations: `pagos serve` and `pagos migrate`
/// only. A database already migrated by a newer release is used as it is.
pub async fn open_and_migrate(args: &DatabaseArgs) -> anyhow::Result<DatabaseConnection> {
    let db = connect(args).await?;
    migrate(&db).await?;
    Ok(db)
}

/// Opens the database for every command but `serve` and `migrate`, which migrate it.
/// A database pagos never touched is set up on its first use, whichever command it is
/// (the contract's `pagos merchants add` on a new database, before any `serve`). One that
/// a release has migrated is never migrated by another command: a newer CLI on a laptop
/// must not migrate production by the way, and under a read-only session
/// (`PGOPTIONS='-c default_transaction_read_only=on'`) nothing may be created. If it
/// lacks migrations this binary needs, it is refused (run `pagos migrate` first).
pub async fn open(args: &DatabaseArgs) -> anyhow::Result<DatabaseConnection> {
    open_for(args, Access::Write).await
}

/// As `open`, for a command that only reads (`merchants list`, `merchants keys list`,
/// `operators list`): a read-only SQLite URL (`mode=ro`) is accepted.
pub async fn open_to_read(args: &DatabaseArgs) -> anyhow::Result<DatabaseConnection> {
    open_for(args, Access::Read).await
}

async fn open_for(args: &DatabaseArgs, access: Access) -> anyhow::Result<DatabaseConnection> {
    let db = connect_for(args, access).await?;
    match migrations_of(&db)
        .await
        .context("reading the applied migrations")?
    {
        Migrations::Current | Migrations::Newer(_) => Ok(db),
        Migrations::Behind(pending) if pending.len() == Migrator::migrations().len() => {
            migrate(&db).await?;
            Ok(db)
        }
        Migrations::Behind(pending) => Err(MigrationError::NotMigrated(pending).into()),
        Migrations::Mixed { pending, unknown } => {
            Err(MigrationError::Mixed { pending, unknown }.into())
        }
    }
}

/// What `migrate` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Migrated {
    /// Applied these migrations (none when the database was up to date).
    Applied(Vec<String>),
    /// Nothing: the database holds every migration of this binary and newer ones.
    ByNewerRelease(Vec<String>),
}

/// Why the migrations of the database and of this binary do not fit. One line each.
#[derive(Debug, thiserror::Error)]
pub enum MigrationError {
    #[error(
        "the database lacks {} migration(s) this pagos needs (first: {}): run `pagos migrate` first",
        .0.len(),
        .0.first().map(String::as_str).unwrap_or("?")
    )]
    NotMigrated(Vec<String>),
    #[error(
        "the database holds migrations this pagos does not know ({}) but lacks some of its own ({}): it was migrated by another line of releases; run the release that migrated it",
        .unknown.join(", "),
        .pending.join(", ")
    )]
    Mixed {
        pending: Vec<String>,
        unknown: Vec<String>,
    },
}

/// Where the database's migrations stand against those this binary knows.
#[derive(Debug, PartialEq, Eq)]
enum Migrations {
    /// Every migration this binary knows is applied, and no other.
    Current,
    /// Some of this binary's migrations are not applied; no unknown one is.
    Behind(Vec<String>),
    /// Every migration this binary knows is applied, and these newer ones too: a newer
    /// release migrated it, and by the expand/contract rule (`migrations/src/lib.rs`) this
    /// binary still works on it.
    Newer(Vec<String>),
    /// Some of this binary's migrations are missing and unknown ones are applied.
    Mixed {
        pending: Vec<String>,
        unknown: Vec<String>,
    },
}

/// Whether the database holds table `name` (read, never created).
pub async fn table_exists(db: &DatabaseConnection, name: &str) -> Result<bool, DbErr> {
    use sea_orm::{ConnectionTrait, Statement};
    let backend = db.get_database_backend();
    let exists = match backend {
        DbBackend::Postgres => "SELECT to_regclass($1) IS NOT NULL AS found",
        _ => {
            "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?) AS found"
        }
    };
    Ok(
        match db
            .query_one_raw(Statement::from_sql_and_values(
                backend,
                exists,
                [name.into()],
            ))
            .await?
        {
            Some(row) => row.try_get::<bool>("", "found")?,
            None => false,
        },
    )
}

/// Reads `seaql_migrations` without creating it (a missing table: nothing applied).
async fn migrations_of(db: &DatabaseConnection) -> Result<Migrations, DbErr> {
    use sea_orm::{ConnectionTrait, Statement};
    let backend = db.get_database_backend();
    let found = table_exists(db, "seaql_migrations").await?;
    let applied: std::collections::BTreeSet<String> = if found {
        db.query_all_raw(Statement::from_string(
            backend,
            r#"SELECT "version" FROM "seaql_migrations""#,
        ))
        .await?
        .iter()
        .map(|row| row.try_get::<String>("", "version"))
        .collect::<Result<_, _>>()?
    } else {
        Default::default()
    };
    let known: Vec<String> = Migrator::migrations()
        .iter()
        .map(|m| m.name().to_owned())
        .collect();
    let pending: Vec<String> = known
        .iter()
        .filter(|name| !applied.contains(*name))
        .cloned()
        .collect();
    let unknown: Vec<String> = applied
        .iter()
        .filter(|name| !known.contains(*name))
        .cloned()
        .collect();
    Ok(match (pending.is_empty(), unknown.is_empty()) {
        (true, true) => Migrations::Current,
        (false, true) => Migrations::Behind(pending),
        (true, false) => Migrations::Newer(unknown),
        (false, false) => Migrations::Mixed { pending, unknown },
    })
}

/// Applies this binary's pending migrations, unless a newer release has migrated the
/// database already. On PostgreSQL under a session advisory lock, so that processes
/// starting together migrate one after the other (the next finds nothing to do).
pub async fn migrate(db: &DatabaseConnection) -> anyhow::Result<Migrated> {
    if db.get_database_backend() != DbBackend::Postgres {
        return migrate_holding_the_lock(db).await;
    }
    let lock = MigrationLock::take(db).await?;
    let migrated = match migration_connections(db).await {
        Ok(migrating) => {
            let migrated = migrate_holding_the_lock(&migrating).await;
            let _ = migrating.close().await;
            migrated
        }
        Err(err) => Err(anyhow::Error::new(err).context("connections for the migrations")),
    };
    lock.release().await;
    migrated
}

/// Connections of their own for the migrations (PostgreSQL), as the pool's but with no
/// `statement_timeout`: a role's or database's limit (set for the payments' statements)
/// would cut an index built `CONCURRENTLY` on a large table, outside any transaction
/// where `SET LOCAL` could lift it, and the build, cut again at every start, would keep
/// every new release from starting. Two: a migration's transaction and a statement beside
/// it never wait for each other.
async fn migration_connections(db: &DatabaseConnection) -> Result<DatabaseConnection, sqlx::Error> {
    let options = db.get_postgres_connection_pool().connect_options();
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .min_connections(0)
        .acquire_timeout(Duration::from_secs(10))
        .after_connect(|connection, _| {
            Box::pin(async move {
                session_defaults(connection).await?;
                sea_orm::sqlx::Executor::execute(&mut *connection, "SET statement_timeout = 0")
                    .await
                    .map(|_| ())
            })
        })
        .connect_with((*options).clone())
        .await?;
    Ok(sea_orm::SqlxPostgresConnector::from_sqlx_postgres_pool(
        pool,
    ))
}

async fn migrate_holding_the_lock(db: &DatabaseConnection) -> anyhow::Result<Migrated> {
    match migrations_of(db)
        .await
        .context("reading the applied migrations")?
    {
        Migrations::Current => Ok(Migrated::Applied(Vec::new())),
        Migrations::Behind(pending) => {
            apply(db, &pending).await?;
            Ok(Migrated::Applied(pending))
        }
        Migrations::Newer(unknown) => {
            tracing::info!(
                newer = %unknown.join(","),
                "the database was migrated by a newer release; starting without migrating (its migrations expand the schema, which this release still works on)"
            );
            Ok(Migrated::ByNewerRelease(unknown))
        }
        Migrations::Mixed { pending, unknown } => {
            Err(MigrationError::Mixed { pending, unknown }.into())
        }
    }
}

/// How many times a migration that gave up waiting for a lock (`migration::LOCK_TIMEOUT`)
/// is run again before start-up stops, and the pause between two runs, in which the
/// statements queued behind it go through.
const LOCK_WAITS: u32 = 40;
const LOCK_WAIT_PAUSE: Duration = Duration::from_secs(3);

/// Runs `Migrator::up`, again after a pause where a migration gave up waiting for a lock
/// another session holds on its tables (PostgreSQL: a long transaction, a `LOCK TABLE`):
/// it left nothing, and each wait ended within `migration::LOCK_TIMEOUT`, so that the
/// payments queued behind it go through.
async fn apply(db: &DatabaseConnection, pending: &[String]) -> anyhow::Result<()> {
    let mut waits = 0;
    loop {
        let Err(err) = Migrator::up(db, None).await else {
            return Ok(());
        };
        if !migration::is_lock_timeout(&err) {
            return Err(anyhow::Error::new(err).context("applying migrations"));
        }
        let stuck = match migrations_of(db).await {
            Ok(Migrations::Behind(left)) => left.first().cloned(),
            _ => None,
        };
        let at = stuck
            .as_deref()
            .or(pending.first().map(String::as_str))
            .unwrap_or("?");
        waits += 1;
        if waits >= LOCK_WAITS {
            return Err(anyhow::anyhow!(
                "migration {at} waited {LOCK_WAITS} times for a lock another session holds on its tables (a long transaction: see pg_stat_activity and pg_locks); end it and start again"
            ));
        }
        tracing::warn!(
            migration = at,
            wait = waits,
            of = LOCK_WAITS,
            "a migration gave up waiting {} ms for a lock another session holds on its tables (a long transaction); the statements queued behind it go through, and it runs again in {} s",
            migration::LOCK_TIMEOUT.as_millis(),
            LOCK_WAIT_PAUSE.as_secs()
        );
        tokio::time::sleep(LOCK_WAIT_PAUSE).await;
    }
}

/// The key of the session advisory lock that `migrate` holds on PostgreSQL ("pagosmig").
const MIGRATION_LOCK: i64 = 0x7061_676f_736d_6967;

/// How long a process waiting for another's migrations sleeps between two tries.
const MIGRATION_LOCK_RETRY: Duration = Duration::from_millis(250);

/// PostgreSQL's session advisory lock `MIGRATION_LOCK`, held on a connection of its own,
/// taken out of the pool (which opens another in its place) so that the migrations run on
/// the pool meanwhile.
struct MigrationLock(sqlx::PgConnection);

impl MigrationLock {
    /// Tries again and again rather than waiting in `pg_advisory_lock`: a session waiting
    /// in a statement holds a snapshot, which `CREATE INDEX CONCURRENTLY` of the process
    /// migrating would wait for (a deadlock).
    async fn take(db: &DatabaseConnection) -> anyhow::Result<MigrationLock> {
        let mut connection = db
            .get_postgres_connection_pool()
            .acquire()
            .await
            .context("a connection for the migrations' lock")?
            .detach();
        let mut told = false;
        loop {
            let taken: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
                .bind(MIGRATION_LOCK)
                .fetch_one(&mut connection)
                .await
                .context("taking the migrations' lock")?;
            if taken {
                return Ok(MigrationLock(connection));
            }
            if !told {
                tracing::info!("another process is applying migrations; waiting for it");
                told = true;
            }
            tokio::time::sleep(MIGRATION_LOCK_RETRY).await;
        }
    }

    /// Unlocks and closes the connection (closing alone would release it too).
    async fn release(mut self) {
        let _ = sqlx::query("SELECT pg_advisory_unlock($1)")
            .bind(MIGRATION_LOCK)
            .execute(&mut self.0)
            .await;
        let _ = self.0.close().await;
    }
}

/// How long the first connection may take before start-up gives up on it.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Why the database could not be opened. Each renders as one line naming what to fix.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("invalid setting PAGOS_DATABASE_URL (--database-url): {0}")]
    BadUrl(String),
    /// `target` says which server and database (never the URL), `cause` what went wrong.
    #[error("cannot open {target}: {cause} (PAGOS_DATABASE_URL, --database-url)")]
    Unreachable { target: String, cause: String },
    #[error("cannot open the database: {0}")]
    Pool(DbErr),
}

/// What a command does with the database: a SQLite URL that opens it read-only is
/// refused at start for a command that writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Access {
    Read,
    Write,
}

/// Opens the database for a command that writes to it.
pub async fn connect(args: &DatabaseArgs) -> Result<DatabaseConnection, OpenError> {
    connect_for(args, Access::Write).await
}

async fn connect_for(args: &DatabaseArgs, access: Access) -> Result<DatabaseConnection, OpenError> {
    let url = args.url.as_str();
    let is_sqlite = url.starts_with("sqlite:");
    if is_sqlite {
        if let Some(why) = sqlite_refusal(url, access) {
            return Err(OpenError::BadUrl(why));
        }
        probe_sqlite(url).await?;
    } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        probe_postgres(url).await?;
    } else {
        return Err(OpenError::BadUrl(
            "expected sqlite://FILE?mode=rwc or postgres://USER@HOST/DB".into(),
        ));
    }
    // On PostgreSQL the statements every payment makes have connections of their own,
    // out of the same number (`lane`).
    let (lane_size, pool_size) = if is_sqlite {
        (0, args.pool_size)
    } else {
        lane::split(args.pool_size)
    };
    let mut options = ConnectOptions::new(url);
    options
        .max_connections(pool_size)
        .min_connections(1)
        .connect_timeout(Duration::from_secs(5))
        .acquire_timeout(Duration::from_secs(10))
        // sqlx pings a pooled connection on every checkout unless told otherwise: one more
        // round trip in the path of every query (4 of the 22 a created payment cost,
        // 1 of a replay's 3; benches/run.sh counts them). Ping only connections idle long
        // enough to have been dropped by a firewall or a proxy. A busy connection the
        // server dropped (a restart) fails its one query and is discarded when sqlx pings
        // it on its way back to the pool; the request answers 503 and its retry, with the
        // same key, goes through.
        .test_before_acquire_if_idle_for(Duration::from_secs(30))
        .sqlx_logging(false)
        // Every transaction of pagos' own is read committed, whatever the server's default
        // (`ALTER DATABASE/ROLE … SET default_transaction_isolation`, a `PGOPTIONS`): the
        // refund's check of what is left sums under the payment's lock and must see what
        // committed while it waited, and a fenced write must wait for the row, not fail
        // (repeatable read answered racing refunds 503). Set once per connection, as a
        // session default, so it costs no statement per transaction and reaches the
        // statements sent on sqlx's pool directly; not a startup option, which a
        // connection pooler in front of PostgreSQL may refuse.
        .map_sqlx_postgres_pool_opts(|pool| {
            pool.after_connect(|connection, _| Box::pin(session_defaults(connection)))
        })
        // SQLite rolls a transaction back by itself when a write in it fails for want of
        // space or by an I/O error; sqlx still counts it open, and the `ROLLBACK` pagos
        // then sends fails ("no transaction is active") without correcting the count. Back
        // in the pool, such a connection would begin its next transactions as savepoints,
        // and after one of them rolled back (`ROLLBACK TO` ends nothing) every later
        // "commit" would release a savepoint inside a transaction never committed, holding
        // the write lock: answers for writes nobody else ever sees. A connection that comes
        // back still counted in a transaction is closed instead (the ping first lets the
        // rollback queued when its transaction was dropped run).
        .map_sqlx_sqlite_pool_opts(|pool| {
            pool.after_release(|connection, _| {
                Box::pin(async move {
                    sea_orm::sqlx::Connection::ping(connection).await?;
                    let open = sea_orm::sqlx::Connection::is_in_transaction(connection);
                    if open {
                        tracing::warn!(
                            "a SQLite connection left counted in a transaction SQLite had rolled back (disk full, or an I/O error): closed"
                        );
                    }
                    Ok(!open)
                })
            })
        })
        .map_sqlx_sqlite_opts(|opts| {
            opts.journal_mode(SqliteJournalMode::Wal)
                .synchronous(SqliteSynchronous::Full)
                .busy_timeout(Duration::from_secs(10))
                .foreign_keys(true)
        });
    let db = Database::connect(options).await.map_err(OpenError::Pool)?;
    if lane_size > 0 {
        lane::open_beside(db.get_postgres_connection_pool(), lane_size);
    }
    Ok(db)
}

/// What every PostgreSQL connection of pagos' sets once, as it opens.
async fn session_defaults(connection: &mut PgConnection) -> Result<(), sqlx::Error> {
    sea_orm::sqlx::Executor::execute(
        &mut *connection,
        "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL READ COMMITTED",
    )
    .await?;
    // A commit pagos answers a merchant for is on disk before the answer: with
    // `synchronous_commit = off` (a role's or database's default, set for speed) a 201
    // could be lost in a crash of the database server, the customer charged and the
    // payment forgotten. `off` is raised to `local` (the WAL flushed on this server);
    // any other value, replication's included, is kept.
    sea_orm::sqlx::Executor::execute(
        &mut *connection,
        "SELECT set_config('synchronous_commit', 'local', false) WHERE current_setting('synchronous_commit') = 'off'",
    )
    .await?;
    // pagos never waits on anything but its own next statement inside a transaction (no
    // gateway call, no merchant's webhook): a transaction idle for long is one whose host
    // died, froze or was cut off, and it holds its payment's lock until the server hears
    // of it — hours, behind a silent network partition, every request for that payment
    // and every claim on it waiting. With no limit of the database's or role's (the
    // server's default, 0), the server ends such a session after 30 s of it and
    // rolls its transaction back (nothing half-written: the transaction was never
    // committed). A limit already set is kept.
    sea_orm::sqlx::Executor::execute(connection, IDLE_IN_TRANSACTION_LIMIT)
        .await
        .map(|_| ())
}

/// How long a pagos transaction may sit idle before the server ends it (see
/// `session_defaults`): far beyond any pause of a live process between two statements.
const IDLE_IN_TRANSACTION_LIMIT: &str = "SELECT set_config('idle_in_transaction_session_timeout', '30s', false) WHERE current_setting('idle_in_transaction_session_timeout') IN ('0', '0ms')";

/// One PostgreSQL connection, alone, within `PROBE_TIMEOUT`; closed at once.
async fn probe_postgres(url: &str) -> Result<(), OpenError> {
    // Parsed by hand first: sqlx's errors for a malformed URL are vaguer, and ours never
    // repeat the URL.
    url::Url::parse(url).map_err(|e| {
        OpenError::BadUrl(format!(
            "not a valid URL ({e}); expected postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE"
        ))
    })?;
    let options =
        PgConnectOptions::from_str(url).map_err(|e| OpenError::BadUrl(bad_url_reason(&e)))?;
    let target = postgres_target(&options);
    let unreachable = |cause: String| OpenError::Unreachable {
        target: target.clone(),
        cause,
    };
    let is_socket = options.get_socket().is_some() || options.get_host().starts_with('/');
    if !is_socket {
        // Resolved apart, so that a name that does not resolve is told as such.
        let host = options
            .get_host()
            .trim_start_matches('[')
            .trim_end_matches(']');
        let resolved = tokio::time::timeout(
            PROBE_TIMEOUT,
            tokio::net::lookup_host((host, options.get_port())),
        )
        .await
        .map(|found| found.map(|mut addresses| addresses.next().is_some()));
        match resolved {
            Ok(Ok(true)) => {}
            Ok(_) => {
                return Err(unreachable(format!(
                    "host {:?} not found (no address for that name)",
                    options.get_host()
                )));
            }
            Err(_) => {
                return Err(unreachable(format!(
                    "the name {:?} did not resolve within {}s",
                    options.get_host(),
                    PROBE_TIMEOUT.as_secs()
                )));
            }
        }
    }
    match tokio::time::timeout(PROBE_TIMEOUT, PgConnection::connect_with(&options)).await {
        Ok(Ok(connection)) => {
            let _ = connection.close().await;
            Ok(())
        }
        Ok(Err(err)) => Err(unreachable(postgres_cause(&err, &options))),
        Err(_) => Err(unreachable(format!(
            "no answer within {}s (a firewall dropping packets, or the wrong host or port?)",
            PROBE_TIMEOUT.as_secs()
        ))),
    }
}

/// "PostgreSQL at HOST:PORT, database "D" as user "U"".
fn postgres_target(options: &PgConnectOptions) -> String {
    let place = match options.get_socket() {
        Some(socket) => format!("socket {}", socket.display()),
        None => format!("{}:{}", options.get_host(), options.get_port()),
    };
    let user = options.get_username();
    let database = options.get_database().unwrap_or(user);
    format!("PostgreSQL at {place}, database {database:?} as user {user:?}")
}

/// What a failed first connection means, in words an operator can act on.
fn postgres_cause(err: &sqlx::Error, options: &PgConnectOptions) -> String {
    let user = options.get_username();
    let database = options.get_database().unwrap_or(user);
    match err {
        sqlx::Error::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => {
            "connection refused: nothing listens there (is PostgreSQL running, on that host and port?)".into()
        }
        // rustls reports a refused certificate through the socket, as an I/O error.
        sqlx::Error::Io(io)
            if io
                .get_ref()
                .is_some_and(|inner| inner.is::<rustls::Error>()) =>
        {
            tls_cause(io, options)
        }
        sqlx::Error::Io(io) => format!("the connection failed: {io}"),
        sqlx::Error::Tls(tls) => tls_cause(tls, options),
        sqlx::Error::Database(db) => {
            let message = db.message();
            match db.code().as_deref() {
                Some("28P01") => format!("authentication failed: {message} (check the user and password in the URL)"),
                Some("28000") if message.contains("does not exist") => {
                    format!("no such role: {message} (create it, or fix the user in the URL)")
                }
                Some("28000") => format!("authentication refused: {message} (see the server's pg_hba.conf)"),
                Some("3D000") => format!(
                    "no such database: {message} (create it with `createdb {database}`, or fix the database in the URL)"
                ),
                Some("53300") => format!("the server refuses more connections: {message}"),
                Some(code) => format!("the server refused the connection: {message} (SQLSTATE {code})"),
                None => format!("the server refused the connection: {message}"),
            }
        }
        sqlx::Error::Protocol(why) => {
            format!("the server does not answer as PostgreSQL does ({why}): is this port PostgreSQL's?")
        }
        other => other.to_string(),
    }
}

/// A failed TLS handshake, with the `sslmode` the URL asks for and what to check.
fn tls_cause(detail: &dyn std::fmt::Display, options: &PgConnectOptions) -> String {
    let mode = match options.get_ssl_mode() {
        PgSslMode::Disable => "disable",
        PgSslMode::Allow => "allow",
        PgSslMode::Prefer => "prefer",
        PgSslMode::Require => "require",
        PgSslMode::VerifyCa => "verify-ca",
        PgSslMode::VerifyFull => "verify-full",
    };
    format!(
        "TLS failed ({detail}) with sslmode={mode}: check that the server offers TLS and, \
         for verify-ca or verify-full, that sslrootcert names the CA that signed its \
         certificate"
    )
}

/// Why sqlx refused a URL, without the URL.
fn bad_url_reason(err: &sqlx::Error) -> String {
    match err {
        sqlx::Error::Configuration(why) => format!("{why}"),
        other => other.to_string(),
    }
}

/// Why the SQLite `url` cannot hold pagos' data for `access`, read before anything is
/// opened: a database in memory (lost at exit, every payment with it), no file at all
/// (SQLite then gives each connection a temporary database of its own: the migrations
/// made one, the first query another), or a read-only one for a command that writes.
/// (Read as sqlx reads it, which does not tell whether the database is in memory.)
fn sqlite_refusal(url: &str, access: Access) -> Option<String> {
    let rest = url
        .trim_start_matches("sqlite://")
        .trim_start_matches("sqlite:");
    let (database, params) = rest.split_once('?').unwrap_or((rest, ""));
    let mut in_memory = database == ":memory:" || database.starts_with("file::memory:");
    let mut read_only = None;
    for (key, value) in url::form_urlencoded::parse(params.as_bytes()) {
        match (&*key, &*value) {
            ("mode", "memory") => in_memory = true,
            ("mode", "ro") => read_only = Some("mode=ro"),
            ("immutable", "true" | "1") => read_only = Some("immutable"),
            _ => {}
        }
    }
    const NAME_A_FILE: &str = "name a file: sqlite://FILE?mode=rwc";
    if in_memory {
        return Some(format!(
            "an in-memory SQLite database (:memory:, mode=memory) is lost when pagos exits, with every payment in it; {NAME_A_FILE}"
        ));
    }
    if database.is_empty() {
        return Some(format!(
            "the SQLite URL names no file (SQLite would give each connection a temporary database of its own, gone when it closes); {NAME_A_FILE}"
        ));
    }
    match read_only {
        Some(how) if access == Access::Write => Some(format!(
            "{how} opens the SQLite database read-only, and this command writes to it; use mode=rw or mode=rwc (a read-only URL serves only `merchants list`, `merchants keys list` and `operators list`)"
        )),
        _ => None,
    }
}

/// One SQLite connection, alone: the file is opened (and created with `mode=rwc`) as the
/// pool would, so a missing directory or a read-only place is told here.
async fn probe_sqlite(url: &str) -> Result<(), OpenError> {
    let options =
        SqliteConnectOptions::from_str(url).map_err(|e| OpenError::BadUrl(bad_url_reason(&e)))?;
    let path = options.get_filename().to_path_buf();
    let target = format!("the SQLite database {}", path.display());
    let unreachable = |cause: String| OpenError::Unreachable {
        target: target.clone(),
        cause,
    };
    match tokio::time::timeout(PROBE_TIMEOUT, SqliteConnection::connect_with(&options)).await {
        Ok(Ok(connection)) => {
            let _ = connection.close().await;
            Ok(())
        }
        Ok(Err(sqlx::Error::Database(db))) if db.code().as_deref() == Some("14") => {
            let directory = path
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(std::path::Path::new("."));
            let why = if !directory.exists() {
                format!("the directory {} does not exist", directory.display())
            } else if !directory.is_dir() {
                format!("{} is not a directory", directory.display())
            } else {
                format!(
                    "unable to open the file (can pagos write in {}? with mode=ro, the file must exist)",
                    directory.display()
                )
            };
            Err(unreachable(why))
        }
        Ok(Err(sqlx::Error::Database(db))) => Err(unreachable(db.message().to_owned())),
        Ok(Err(err)) => Err(unreachable(err.to_string())),
        Err(_) => Err(unreachable(format!(
            "not opened within {}s (another process holding a lock?)",
            PROBE_TIMEOUT.as_secs()
        ))),
    }
}

/// Begins a transaction that will write: `BEGIN IMMEDIATE` on SQLite, plain `BEGIN`
/// on PostgreSQL (read committed: every connection's default, set in `connect`).
pub async fn begin_write(db: &DatabaseConnection) -> Result<DatabaseTransaction, DbErr> {
    let options = TransactionOptions {
        sqlite_transaction_mode: (db.get_database_backend() == DbBackend::Sqlite)
            .then_some(SqliteTransactionMode::Immediate),
        ..TransactionOptions::default()
    };
    db.begin_with_options(options).await
}

/// Deletes the rows of `table` that `pick` selects (a query on `table` itself, with its
/// own `LIMIT`), by their physical address: `ctid = ANY(ARRAY(…))` on PostgreSQL, `rowid
/// IN (…)` on SQLite; returns how many. The pick runs once, first, and the delete finds
/// its rows by address, whatever plan a prepared statement settles on: `(key) IN (…)`
/// let PostgreSQL's generic plan hash-join the pick against a scan of the whole table
/// (a second per thousand keys at a million rows, instead of a few milliseconds).
pub async fn delete_picked(
    db: &DatabaseConnection,
    table: &str,
    mut pick: sea_orm::sea_query::SelectStatement,
) -> Result<u64, DbErr> {
    use sea_orm::ConnectionTrait;
    use sea_orm::sea_query::{Alias, Expr};
    let backend = db.get_database_backend();
    let (address, matching) = match backend {
        DbBackend::Postgres => ("ctid", ("= ANY(ARRAY(", "))")),
        _ => ("rowid", ("IN (", ")")),
    };
    pick.clear_selects();
    pick.expr(Expr::col(Alias::new(address)));
    let picked = backend.build(&pick);
    let sql = format!(
        r#"DELETE FROM "{table}" WHERE "{address}" {}{}{}"#,
        matching.0, picked.sql, matching.1
    );
    let deleted = db
        .execute_raw(sea_orm::Statement::from_sql_and_values(
            backend,
            sql,
            picked.values.map(|values| values.0).unwrap_or_default(),
        ))
        .await?;
    Ok(deleted.rows_affected())
}

/// `statement` on PostgreSQL, run on the sqlx pool beneath `db` instead of through
/// `DatabaseConnection`: the same pool, the same SQL and values, the same errors, the row
/// as sea-orm gives it. Only for the statements every payment makes (a registration, a
/// fenced write): `DatabaseConnection` holds every backend's future in one, some
/// kilobytes it copies several times per statement, which was a fifth of a created
/// payment's instructions in pagos (callgrind, docs/benchmarks.md). Panics on another
/// backend: callers are the PostgreSQL statements of `saga::store`.
pub async fn query_one_on_pool(
    db: &DatabaseConnection,
    statement: sea_orm::Statement,
) -> Result<Option<sea_orm::QueryResult>, DbErr> {
    use sea_orm::{ConnAcquireErr, RuntimeErr};
    use std::sync::Arc;
    let sea_orm::Statement { sql, values, .. } = statement;
    let query = sqlx::query_with(
        sqlx::AssertSqlSafe(sql.as_str()),
        sea_query_sqlx::SqlxValues(values.unwrap_or_else(|| sea_orm::Values(Vec::new()))),
    );
    let acquire_err = |err| match err {
        sqlx::Error::PoolTimedOut => DbErr::ConnectionAcquire(ConnAcquireErr::Timeout),
        sqlx::Error::PoolClosed => DbErr::ConnectionAcquire(ConnAcquireErr::ConnectionClosed),
        err => DbErr::Conn(RuntimeErr::SqlxError(Arc::new(err))),
    };
    let pool = db.get_postgres_connection_pool();
    let answer = match lane::lend(pool).await {
        Some((lane, mut lent)) => {
            let answer = query.fetch_optional(lent.connection()).await;
            if answer.is_ok() && !pool.is_closed() {
                lane.give_back(lent);
            }
            answer
        }
        None => {
            let mut connection = pool.acquire().await.map_err(acquire_err)?;
            query.fetch_optional(&mut *connection).await
        }
    };
    answer
        .map(|row| row.map(sea_orm::QueryResult::from))
        .map_err(|err| DbErr::Query(RuntimeErr::SqlxError(Arc::new(err))))
}

/// Now, truncated to milliseconds: what is written is exactly what is read back and shown
/// (SQLite and PostgreSQL keep different sub-second precision).
pub fn now() -> chrono::DateTime<chrono::Utc> {
    use chrono::DurationRound;
    let now = wall();
    now.duration_trunc(chrono::TimeDelta::milliseconds(1))
        .unwrap_or(now)
}

/// The most this host's clock may be off the database server's. Claims, send holds and a
/// payment's age against the gateway's key window compare times that other processes
/// wrote with their own clocks: a host ahead by more than a send's margin (5 s) would take
/// another process's held payment for free and send its key again while that send is in
/// flight; one behind would resend past the key window.
pub const MAX_CLOCK_SKEW: chrono::TimeDelta = chrono::TimeDelta::seconds(2);

/// `span` to the millisecond, for people to read.
pub fn whole_millis(span: chrono::TimeDelta) -> std::time::Duration {
    std::time::Duration::from_millis(u64::try_from(span.num_milliseconds()).unwrap_or(0))
}

/// Why a process whose clock is `skew` ahead of the database's (behind, if negative) must
/// not start; None when it may.
pub fn clock_refusal(skew: chrono::TimeDelta) -> Option<String> {
    if skew.abs() <= MAX_CLOCK_SKEW {
        return None;
    }
    let by = humantime::format_duration(whole_millis(skew.abs()));
    let side = if skew > chrono::TimeDelta::zero() {
        "ahead of"
    } else {
        "behind"
    };
    Some(format!(
        "this host's clock is {by} {side} the database server's (at most {}s is safe: claims and send holds compare times other processes wrote); set the host's time (NTP) and start again",
        MAX_CLOCK_SKEW.num_seconds()
    ))
}

/// This host's wall clock (stepped by a test's `PAGOS_CLOCK_STEP`, built with
/// `failpoints`).
pub fn wall() -> chrono::DateTime<chrono::Utc> {
    chrono::Utc::now() + crate::failpoint::clock_step()
}

/// How often a serving process checks its clock again ([`clock_goes_off`]).
pub const CLOCK_WATCH_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// Waits until this host's clock goes wrong while the process serves, and answers why:
/// more than `MAX_CLOCK_SKEW` off the database server's (PostgreSQL), or stepped back by
/// more than that since the last look (SQLite, read and written on this host's clock: a
/// clock set back makes every payment look younger than it is, and an `EN_PROCESO` one
/// whose send the records lost could be sent again past the gateway's key window). A
/// clock that goes forward on SQLite is let be (a machine waking from sleep does that).
/// A look the database does not answer is no answer: the next one asks again.
pub async fn clock_goes_off(db: &DatabaseConnection) -> String {
    let mut last = (wall(), std::time::Instant::now());
    loop {
        tokio::time::sleep(CLOCK_WATCH_EVERY).await;
        if db.get_database_backend() == DbBackend::Postgres {
            // A slow answer says little of the database's time: only one that came back
            // within a second is weighed.
            if let Ok((skew, round_trip)) = skew_from_the_databases(db).await
                && round_trip <= chrono::TimeDelta::seconds(1)
                && let Some(why) = clock_refusal(skew)
            {
                return why;
            }
            continue;
        }
        let now = (wall(), std::time::Instant::now());
        let walked = now.0.signed_duration_since(last.0);
        let elapsed = chrono::TimeDelta::from_std(now.1.duration_since(last.1))
            .unwrap_or(chrono::TimeDelta::MAX);
        let back = elapsed - walked;
        if back > MAX_CLOCK_SKEW {
            let by = humantime::format_duration(whole_millis(back));
            return format!(
                "this host's clock was set back by {by} while pagos served (at most {}s is safe: a payment's age against the gateway's key window is read on it); set the host's time (NTP) and start again",
                MAX_CLOCK_SKEW.num_seconds()
            );
        }
        last = now;
    }
}

/// How far this host's clock is ahead of the database server's (behind, if negative),
/// and how long the asking took (PostgreSQL only).
async fn skew_from_the_databases(
    db: &DatabaseConnection,
) -> Result<(chrono::TimeDelta, chrono::TimeDelta), DbErr> {
    let before = wall();
    use sea_orm::{ConnectionTrait, Statement};
    let row = db
        .query_one_raw(Statement::from_string(
            DbBackend::Postgres,
            "SELECT clock_timestamp() AS at",
        ))
        .await?
        .ok_or_else(|| DbErr::RecordNotFound("the database did not say its time".into()))?;
    let after = wall();
    let theirs: chrono::DateTime<chrono::Utc> = row.try_get("", "at")?;
    let ours = before + (after - before) / 2;
    Ok((ours.signed_duration_since(theirs), after - before))
}

/// Refuses to go on when this host's clock is off the database server's by more than
/// `MAX_CLOCK_SKEW` (PostgreSQL: SQLite is read and written on this host's clock).
pub async fn check_clock(db: &DatabaseConnection) -> anyhow::Result<()> {
    if db.get_database_backend() != DbBackend::Postgres {
        return Ok(());
    }
    let (skew, _) = skew_from_the_databases(db).await?;
    match clock_refusal(skew) {
        Some(why) => anyhow::bail!(why),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clock_more_than_two_seconds_off_the_databases_is_refused_either_way() {
        use chrono::TimeDelta;
        assert_eq!(clock_refusal(TimeDelta::zero()), None);
        assert_eq!(clock_refusal(TimeDelta::milliseconds(1999)), None);
        assert_eq!(clock_refusal(TimeDelta::milliseconds(-2000)), None);
        let ahead = clock_refusal(TimeDelta::seconds(30)).expect("refused");
        assert!(ahead.contains("30s ahead of"), "{ahead}");
        let behind = clock_refusal(TimeDelta::milliseconds(-2500)).expect("refused");
        assert!(behind.contains("2s 500ms behind"), "{behind}");
    }
    use sea_orm::ConnectionTrait;

    #[tokio::test]
    async fn sqlite_commits_are_synchronous_full() {
        let dir = tempfile::tempdir().expect("temp dir");
        let args = DatabaseArgs {
            url: format!(
                "sqlite://{}?mode=rwc",
                dir.path().join("pagos.db").display()
            ),
            pool_size: 1,
        };
        let db = connect(&args).await.expect("open");
        let row = db
            .query_one_raw(sea_orm::Statement::from_string(
                DbBackend::Sqlite,
                "PRAGMA synchronous",
            ))
            .await
            .expect("pragma")
            .expect("a row");
        let level: i32 = row.try_get_by_index(0).expect("a number");
        assert_eq!(level, 2, "FULL is 2 (NORMAL is 1)");
    }

    /// A write SQLite rolls back whole when it fails (a disk that is full at `COMMIT`, an
    /// I/O error; here a trigger's `RAISE(ROLLBACK)`, which SQLite treats the same way)
    /// must not leave its connection believing it is still in that transaction: its next
    /// "commit" would release a savepoint, commit nothing and keep the write lock, and
    /// pagos would answer for writes no other connection, and no restart, ever sees.
    #[tokio::test]
    async fn after_a_write_sqlite_rolled_back_itself_the_next_commit_is_really_committed() {
        let dir = tempfile::tempdir().expect("temp dir");
        let url = format!(
            "sqlite://{}?mode=rwc",
            dir.path().join("pagos.db").display()
        );
        let db = connect(&DatabaseArgs {
            url: url.clone(),
            pool_size: 1,
        })
        .await
        .expect("open");
        let run = |sql: &str| sea_orm::Statement::from_string(DbBackend::Sqlite, sql.to_owned());
        for sql in [
            "CREATE TABLE t (v TEXT)",
            "CREATE TRIGGER full BEFORE INSERT ON t WHEN NEW.v = 'lost' \
             BEGIN SELECT RAISE(ROLLBACK, 'database or disk is full'); END",
        ] {
            db.execute_raw(run(sql)).await.expect("set up");
        }
        let tx = begin_write(&db).await.expect("begin");
        let failed = tx
            .execute_raw(run("INSERT INTO t VALUES ('lost')"))
            .await
            .expect_err("rolled back");
        assert!(failed.to_string().contains("full"), "{failed}");
        drop(tx);
        // Then a transaction with nothing to write, rolled back (a reconciler's claim
        // with nothing due), and one that commits.
        begin_write(&db)
            .await
            .expect("begin")
            .rollback()
            .await
            .expect("rollback");
        let tx = begin_write(&db).await.expect("begin");
        tx.execute_raw(run("INSERT INTO t VALUES ('kept')"))
            .await
            .expect("insert");
        tx.commit().await.expect("commit");

        let other = connect(&DatabaseArgs { url, pool_size: 1 })
            .await
            .expect("open again");
        let kept = other
            .query_all_raw(run("SELECT v FROM t"))
            .await
            .expect("read")
            .len();
        assert_eq!(kept, 1, "the committed row, as another connection reads it");
    }
}
