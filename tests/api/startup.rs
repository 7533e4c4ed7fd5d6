//! What an operator sees when pagos starts, with the real binary: a database that cannot
//! be opened is one line saying where and why (never the URL's password), exit code 2,
//! from every command that opens it; and logs carry colour only on a terminal.

use crate::helpers::Backend;
use crate::process::{BIN, free_port};
use std::io::{Read, Write};
use std::process::{Command, Output};

const PASSWORD: &str = "hunter2-do-not-print";

fn pagos(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(BIN);
    command
        .args(args)
        .env_remove("PAGOS_DATABASE_URL")
        .env_remove("NO_COLOR");
    for (k, v) in env {
        command.env(k, v);
    }
    command.output().expect("pagos runs")
}

/// Asserts exit code 2 and one line of stderr holding every one of `says`, without the
/// password; returns the line.
fn refused_with(output: &Output, says: &[&str]) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(output.status.code(), Some(2), "exit 2: {stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
    for part in says {
        assert!(stderr.contains(part), "says {part:?}: {stderr}");
    }
    assert!(
        !stderr.contains(PASSWORD),
        "the password is never printed: {stderr}"
    );
    assert!(
        stderr.contains("PAGOS_DATABASE_URL"),
        "names the setting: {stderr}"
    );
    stderr
}

/// `command` (as words) with `--database-url url` and what it needs besides.
fn with_url<'a>(command: &[&'a str], url: &'a str) -> Vec<&'a str> {
    let mut args = command.to_vec();
    args.extend_from_slice(&["--database-url", url]);
    args
}

const EVERY_COMMAND: [&[&str]; 4] = [
    &["serve", "--bind", "127.0.0.1:0"],
    &["migrate"],
    &["reconcile", "--once"],
    &["merchants", "add", "acme"],
];

#[test]
fn a_closed_port_is_connection_refused_from_every_command_naming_host_port_and_database() {
    let port = free_port();
    let url = format!("postgres://postgres:{PASSWORD}@127.0.0.1:{port}/pagos");
    for command in EVERY_COMMAND {
        let output = pagos(&with_url(command, &url), &[]);
        refused_with(
            &output,
            &[
                &format!("127.0.0.1:{port}"),
                "database \"pagos\"",
                "user \"postgres\"",
                "connection refused",
            ],
        );
    }
}

/// The test server's URL with another user and database.
fn postgres_url(admin: &str, user: &str, password: Option<&str>, database: &str) -> String {
    let mut url = url::Url::parse(admin).expect("PAGOS_TEST_POSTGRES_URL is a URL");
    url.set_username(user).expect("a user");
    url.set_password(password).expect("a password");
    url.set_path(database);
    url.to_string()
}

#[test]
fn a_missing_database_and_a_missing_role_are_named() {
    let Some(Backend::Postgres(admin)) = Backend::postgres() else {
        return;
    };
    let missing_db = format!("pagos_missing_{}", uuid::Uuid::new_v4().simple());
    let url = postgres_url(&admin, "postgres", Some(PASSWORD), &missing_db);
    refused_with(
        &pagos(&with_url(&["migrate"], &url), &[]),
        &["no such database", &missing_db],
    );
    // Trust authentication accepts any role that exists; a missing one is refused.
    let missing_role = format!("pagos_nobody_{}", uuid::Uuid::new_v4().simple());
    let url = postgres_url(&admin, &missing_role, Some(PASSWORD), &missing_db);
    refused_with(
        &pagos(&with_url(&["migrate"], &url), &[]),
        &["no such role", &missing_role],
    );
}

#[test]
fn tls_that_cannot_be_had_is_said_so_with_the_sslmode_asked() {
    // A server that answers PostgreSQL's SSLRequest with "N": it has no TLS.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let server = std::thread::spawn(move || {
        if let Ok((mut socket, _)) = listener.accept() {
            let mut request = [0u8; 8];
            let _ = socket.read_exact(&mut request);
            let _ = socket.write_all(b"N");
            let mut rest = Vec::new();
            let _ = socket.read_to_end(&mut rest);
        }
    });
    let url = format!("postgres://postgres:{PASSWORD}@127.0.0.1:{port}/pagos?sslmode=require");
    refused_with(
        &pagos(&with_url(&["migrate"], &url), &[]),
        &[
            "TLS failed",
            "server does not support TLS",
            "sslmode=require",
        ],
    );
    let _ = server.join();

    // The test server, whose certificate (if it has TLS at all) no public CA signed.
    if let Some(Backend::Postgres(admin)) = Backend::postgres() {
        let mut url = url::Url::parse(&postgres_url(&admin, "postgres", Some(PASSWORD), "pagos"))
            .expect("URL");
        url.query_pairs_mut().append_pair("sslmode", "verify-full");
        refused_with(
            &pagos(&with_url(&["migrate"], url.as_str()), &[]),
            &["TLS failed", "sslmode=verify-full"],
        );
    }
}

#[test]
fn a_malformed_url_or_an_unknown_host_is_refused_without_the_password() {
    let bad_port = format!("postgres://postgres:{PASSWORD}@127.0.0.1:99999/pagos");
    refused_with(
        &pagos(&with_url(&["migrate"], &bad_port), &[]),
        &["invalid setting PAGOS_DATABASE_URL", "invalid port number"],
    );
    let bad_mode = format!("postgres://postgres:{PASSWORD}@127.0.0.1/pagos?sslmode=sometimes");
    refused_with(
        &pagos(&with_url(&["migrate"], &bad_mode), &[]),
        &["invalid setting PAGOS_DATABASE_URL", "sometimes"],
    );
    let unknown = format!("postgres://postgres:{PASSWORD}@pagos-db.invalid:5432/pagos");
    refused_with(
        &pagos(&with_url(&["migrate"], &unknown), &[]),
        &["pagos-db.invalid"],
    );
}

#[test]
fn an_sqlite_file_that_cannot_be_created_names_its_directory() {
    let dir = tempfile::tempdir().expect("dir");
    let missing = dir.path().join("no").join("such").join("pagos.db");
    let url = format!("sqlite://{}?mode=rwc", missing.display());
    for command in EVERY_COMMAND {
        refused_with(
            &pagos(&with_url(command, &url), &[]),
            &[
                &missing.display().to_string(),
                "does not exist",
                &dir.path().join("no").join("such").display().to_string(),
            ],
        );
    }
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"not a directory").expect("write");
    let url = format!("sqlite://{}?mode=rwc", file.join("pagos.db").display());
    refused_with(
        &pagos(&with_url(&["migrate"], &url), &[]),
        &["is not a directory"],
    );
}

const ESC: &str = "\u{1b}[";

/// `pagos migrate` on a fresh SQLite file, logging at INFO.
fn migrate_args(dir: &tempfile::TempDir) -> Vec<String> {
    vec![
        "migrate".into(),
        "--database-url".into(),
        format!("sqlite://{}?mode=rwc", dir.path().join("logs.db").display()),
    ]
}

#[test]
fn logs_to_a_pipe_carry_no_colour_codes_with_or_without_no_color() {
    for no_color in [None, Some("1")] {
        let dir = tempfile::tempdir().expect("dir");
        let args = migrate_args(&dir);
        let mut env = vec![("RUST_LOG", "info")];
        if let Some(value) = no_color {
            env.push(("NO_COLOR", value));
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let output = pagos(&args, &env);
        assert!(output.status.success());
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains("INFO"), "logs were written: {stderr}");
        assert!(
            !stderr.contains(ESC),
            "no ANSI codes ({no_color:?}): {stderr:?}"
        );
    }
}

#[test]
fn logs_to_a_terminal_are_coloured_unless_no_color_is_set() {
    // util-linux `script` runs the command on a pseudo-terminal and copies what it
    // writes there to its own stdout.
    let has_script = Command::new("script")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_script {
        eprintln!("skipped: `script` (util-linux) is not installed; the terminal case did not run");
        return;
    }
    for (no_color, coloured) in [(None, true), (Some(""), true), (Some("1"), false)] {
        let dir = tempfile::tempdir().expect("dir");
        let command_line = std::iter::once(BIN.to_owned())
            .chain(migrate_args(&dir))
            .map(|word| format!("'{word}'"))
            .collect::<Vec<_>>()
            .join(" ");
        let mut command = Command::new("script");
        command
            .args(["-q", "-e", "-c", &command_line, "/dev/null"])
            .env("RUST_LOG", "info")
            .env_remove("NO_COLOR")
            .stdin(std::process::Stdio::null());
        if let Some(value) = no_color {
            command.env("NO_COLOR", value);
        }
        let output = command.output().expect("script runs");
        let seen = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "{seen}");
        assert!(seen.contains("INFO"), "logs were written: {seen:?}");
        assert_eq!(
            seen.contains(ESC),
            coloured,
            "NO_COLOR={no_color:?} on a terminal: {seen:?}"
        );
    }
}

/// Two processes of a deployment starting together on a fresh PostgreSQL database: one
/// migrates, the other waits for it and finds nothing left to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_processes_migrating_a_fresh_postgres_database_at_once_both_start() {
    let Some(backend) = Backend::postgres() else {
        return;
    };
    for _ in 0..3 {
        let database = crate::helpers::TestDatabase::create(&backend).await;
        let settings = crate::helpers::settings(&database.url, &[]);
        let (first, second) = tokio::join!(
            pagos::app::open_and_migrate(&settings.database),
            pagos::app::open_and_migrate(&settings.database),
        );
        let first = first.expect("the first process starts");
        let second = second.expect("the second process starts");
        let _ = first.close().await;
        let _ = second.close().await;
    }
}

/// A migration whose `ALTER TABLE` must wait for a long transaction on `payments` (a report
/// left open) gives up its place in the table's lock queue within the lock timeout,
/// instead of making every payment's statement on the table wait behind it for as long
/// as the transaction lasts, and runs again until it gets the lock: then it is applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_migration_waiting_behind_a_long_transaction_lets_payments_through_and_applies_after_it()
{
    use sea_orm::{ConnectionTrait, TransactionTrait};
    let Some(backend) = Backend::postgres() else {
        return;
    };
    let (database, db) = crate::helpers::TestDatabase::with_acme(&backend).await;
    let m22 = "m20261210_000022_last_error";
    db.execute_unprepared(&format!(
        r#"DELETE FROM "seaql_migrations" WHERE "version" = '{m22}'"#
    ))
    .await
    .expect("back to before m22 (its columns stay: it adds them IF NOT EXISTS)");
    let report = sea_orm::Database::connect(database.url.as_str())
        .await
        .expect("a reporting connection");
    let long = report.begin().await.expect("a long transaction");
    long.execute_unprepared(r#"SELECT count(*) FROM "payments""#)
        .await
        .expect("it reads payments, and holds its lock until it ends");

    let settings = crate::helpers::settings(&database.url, &[]);
    let start = tokio::spawn(async move { pagos::app::open_and_migrate(&settings.database).await });
    let waiting = r#"SELECT count(*) AS "n" FROM "pg_locks"
        WHERE NOT "granted" AND "mode" = 'AccessExclusiveLock' AND "relation" = 'payments'::regclass"#;
    let mut queued = false;
    for _ in 0..400 {
        let row = db
            .query_one_raw(sea_orm::Statement::from_string(
                sea_orm::DbBackend::Postgres,
                waiting,
            ))
            .await
            .expect("pg_locks")
            .expect("a row");
        if row.try_get::<i64>("", "n").expect("n") > 0 {
            queued = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    assert!(
        queued,
        "the migration's ALTER TABLE waits for the long transaction"
    );

    // A payment's statement on the table, while the long transaction goes on.
    let read = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        db.execute_unprepared(r#"SELECT count(*) FROM "payments""#),
    )
    .await;
    assert!(
        matches!(read, Ok(Ok(_))),
        "a payment's statement went through while the migration waited: {read:?}"
    );
    assert!(
        !start.is_finished(),
        "the migration waits for its lock still"
    );

    long.commit().await.expect("the long transaction ends");
    let started = tokio::time::timeout(std::time::Duration::from_secs(60), start)
        .await
        .expect("start-up goes on once the lock is free")
        .expect("task")
        .expect("the migrations are applied");
    let recorded = started
        .query_one_raw(sea_orm::Statement::from_string(
            sea_orm::DbBackend::Postgres,
            format!(r#"SELECT count(*) AS "n" FROM "seaql_migrations" WHERE "version" = '{m22}'"#),
        ))
        .await
        .expect("query")
        .expect("a row")
        .try_get::<i64>("", "n")
        .expect("n");
    assert_eq!(recorded, 1, "m22 applied and recorded once");
}

/// `m20261208_000018` builds its index `CONCURRENTLY` (so outside a transaction: PostgreSQL
/// refuses it inside one), and a build interrupted halfway, which leaves an INVALID index
/// behind, is built again by the next start rather than taken as done.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_invalid_index_left_by_an_interrupted_concurrent_build_is_built_again() {
    use sea_orm::ConnectionTrait;
    let Some(backend) = Backend::postgres() else {
        return;
    };
    let (database, db) = crate::helpers::TestDatabase::with_acme(&backend).await;
    // Back to before m18 (its column stays: `ADD COLUMN IF NOT EXISTS`), with two events,
    // and a concurrent build of its index that failed: a duplicate in a unique index.
    for sql in [
        r#"DELETE FROM "seaql_migrations" WHERE "version" = 'm20261208_000018_events_in_commit_order'"#,
        r#"DROP INDEX "events_merchant_commit_order_idx""#,
        r#"CREATE INDEX "events_merchant_id_idx" ON "events" ("merchant_id", "id")"#,
        r#"INSERT INTO "events" ("id", "merchant_id", "event_type", "subject_id", "sequence", "body", "created_at")
             SELECT 'evt_' || n, "id", 'pago.completado', gen_random_uuid(), 1, '{}', now()
             FROM "merchants", generate_series(1, 2) AS n"#,
    ] {
        db.execute_unprepared(sql).await.expect(sql);
    }
    let interrupted = db
        .execute_unprepared(
            r#"CREATE UNIQUE INDEX CONCURRENTLY "events_merchant_commit_order_idx" ON "events" (("merchant_id" IS NOT NULL))"#,
        )
        .await;
    assert!(interrupted.is_err(), "the build fails halfway");
    let index = r#"SELECT "indisvalid" AS "valid", pg_get_indexdef("indexrelid") AS "def"
        FROM "pg_index" WHERE "indexrelid" = to_regclass('events_merchant_commit_order_idx')"#;
    let read = async |db: &sea_orm::DatabaseConnection| {
        let row = db
            .query_one_raw(sea_orm::Statement::from_string(
                sea_orm::DbBackend::Postgres,
                index,
            ))
            .await
            .expect("query")
            .expect("the index exists");
        (
            row.try_get::<bool>("", "valid").expect("valid"),
            row.try_get::<String>("", "def").expect("def"),
        )
    };
    assert!(!read(&db).await.0, "left INVALID");
    let _ = db.close().await;

    let db = database.migrated().await;
    let (valid, def) = read(&db).await;
    assert!(valid, "built again, valid: {def}");
    assert!(
        def.contains(r#"(merchant_id, tx, id)"#),
        "the migration's own index: {def}"
    );
    let old = db
        .query_one_raw(sea_orm::Statement::from_string(
            sea_orm::DbBackend::Postgres,
            "SELECT to_regclass('events_merchant_id_idx') IS NULL AS gone",
        ))
        .await
        .expect("query")
        .expect("a row")
        .try_get::<bool>("", "gone")
        .expect("bool");
    assert!(old, "the old index is dropped");
}

/// A role's or database's `statement_timeout` (set for the payments' statements) cut an
/// index built `CONCURRENTLY` on a large table: outside a transaction, `SET LOCAL` could
/// not lift it, and every start of the new release failed, cut again. The migrations now
/// run on connections of their own without the limit; here m25's index over a million
/// reports, under a database default of 100 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_statement_timeout_of_the_database_does_not_cut_an_index_built_concurrently() {
    use sea_orm::ConnectionTrait;
    let Some(backend) = Backend::postgres() else {
        return;
    };
    let (database, db) = crate::helpers::TestDatabase::with_acme(&backend).await;
    let name = database
        .url
        .rsplit('/')
        .next()
        .and_then(|rest| rest.split('?').next())
        .expect("a database name")
        .to_owned();
    for sql in [
        r#"DELETE FROM "seaql_migrations" WHERE "version" = 'm20261211_000025_webhook_reports_by_age'"#.to_owned(),
        r#"DROP INDEX "webhook_charges_updated_idx""#.to_owned(),
        r#"INSERT INTO "webhook_charges" ("source", "charge_id", "reference", "status", "amount", "currency", "last_sequence", "last_event_id", "first_seen_at", "updated_at")
             SELECT 'http', 'ch_' || n, 'ref_' || n, 'declined', 1000, 'COP', 1, 'evt_' || n, now(), now() - (n || ' seconds')::interval
             FROM generate_series(1, 1000000) AS n"#.to_owned(),
        format!(r#"ALTER DATABASE "{name}" SET statement_timeout = '100ms'"#),
    ] {
        db.execute_unprepared(&sql).await.expect(&sql);
    }
    let _ = db.close().await;

    let db = database.migrated().await;
    let valid = db
        .query_one_raw(sea_orm::Statement::from_string(
            sea_orm::DbBackend::Postgres,
            r#"SELECT "indisvalid" AS "valid" FROM "pg_index" WHERE "indexrelid" = to_regclass('webhook_charges_updated_idx')"#,
        ))
        .await
        .expect("query")
        .expect("the index exists")
        .try_get::<bool>("", "valid")
        .expect("valid");
    assert!(valid, "built, valid");
    let limit = db
        .query_one_raw(sea_orm::Statement::from_string(
            sea_orm::DbBackend::Postgres,
            "SHOW statement_timeout",
        ))
        .await
        .expect("query")
        .expect("a row")
        .try_get::<String>("", "statement_timeout")
        .expect("the setting");
    assert_eq!(
        limit, "100ms",
        "the payments' statements keep the database's limit"
    );
}

/// The webhook indexes built `CONCURRENTLY` (m19, m20, m25) are built again when a build was
/// interrupted and left them INVALID (here: marked so in the catalog), not taken as done.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn webhook_indexes_left_invalid_by_an_interrupted_build_are_built_again() {
    use sea_orm::ConnectionTrait;
    let Some(backend) = Backend::postgres() else {
        return;
    };
    let (database, db) = crate::helpers::TestDatabase::with_acme(&backend).await;
    let indexes = [
        (
            "m20261209_000019_attempts_by_endpoint",
            "webhook_attempts_endpoint_idx",
        ),
        (
            "m20261209_000020_due_by_endpoint",
            "webhook_deliveries_endpoint_due_idx",
        ),
        (
            "m20261211_000025_webhook_reports_by_age",
            "webhook_charges_updated_idx",
        ),
        (
            "m20261211_000025_webhook_reports_by_age",
            "webhook_refunds_updated_idx",
        ),
    ];
    for (version, index) in indexes {
        for sql in [
            format!(r#"DELETE FROM "seaql_migrations" WHERE "version" = '{version}'"#),
            format!(
                r#"UPDATE "pg_index" SET "indisvalid" = false WHERE "indexrelid" = to_regclass('{index}')"#
            ),
        ] {
            db.execute_unprepared(&sql).await.expect(&sql);
        }
    }
    let valid = async |db: &sea_orm::DatabaseConnection, index: &str| {
        db.query_one_raw(sea_orm::Statement::from_string(
            sea_orm::DbBackend::Postgres,
            format!(
                r#"SELECT "indisvalid" AS "valid" FROM "pg_index" WHERE "indexrelid" = to_regclass('{index}')"#
            ),
        ))
        .await
        .expect("query")
        .expect("the index exists")
        .try_get::<bool>("", "valid")
        .expect("valid")
    };
    for (_, index) in indexes {
        assert!(!valid(&db, index).await, "{index} left INVALID");
    }
    let _ = db.close().await;
    let db = database.migrated().await;
    for (_, index) in indexes {
        assert!(valid(&db, index).await, "{index} built again");
    }
}

/// On SQLite a migration of several statements (m06: two `ADD COLUMN`, then an index) that
/// stops halfway leaves nothing of itself: the next start runs it whole. Here its last
/// statement fails (a table holds the index's name), as a kill there would stop it.
#[tokio::test]
async fn an_sqlite_migration_stopped_halfway_runs_whole_at_the_next_start() {
    use migration::{Migrator, MigratorTrait};
    use sea_orm::ConnectionTrait;
    let database = crate::helpers::TestDatabase::create(&Backend::Sqlite).await;
    let settings = crate::helpers::settings(&database.url, &[]);
    let db = pagos::db::connect(&settings.database).await.expect("open");
    Migrator::up(&db, Some(5)).await.expect("up to m05");
    db.execute_unprepared(r#"CREATE TABLE "payments_merchant_key_idx" ("x" INTEGER)"#)
        .await
        .expect("the name of m06's index taken");
    Migrator::up(&db, Some(1))
        .await
        .expect_err("m06 stops at its last statement");
    db.execute_unprepared(r#"DROP TABLE "payments_merchant_key_idx""#)
        .await
        .expect("the name freed");
    let _ = db.close().await;
    let db = pagos::app::open_and_migrate(&settings.database)
        .await
        .expect("the next start migrates to the end");
    let _ = db.close().await;
}

/// A process waiting for another's migrations (PostgreSQL's lock held elsewhere) is told
/// to stop: it stops there, cleanly, never serving — not only once it would have served.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_while_waiting_for_another_process_migrations_stops_before_serving() {
    use sea_orm::ConnectionTrait;
    let Some(backend) = Backend::postgres() else {
        return;
    };
    let database = crate::helpers::TestDatabase::create(&backend).await;
    let other = sea_orm::Database::connect(database.url.as_str())
        .await
        .expect("another process's connection");
    // The key `migrate` locks: 0x7061676f736d6967 ("pagosmig").
    other
        .execute_unprepared("SELECT pg_advisory_lock(8097867333364443495)")
        .await
        .expect("the migrations' lock, held by another process");
    let dir = tempfile::tempdir().expect("dir");
    let log = dir.path().join("serve.log");
    let port = free_port().to_string();
    // Killed when dropped, however the test ends.
    let mut serve = crate::binary::Running(
        crate::binary::pagos(
            &[
                "serve",
                "--database-url",
                &database.url,
                "--bind",
                &format!("127.0.0.1:{port}"),
            ],
            Some(&log),
        )
        .spawn()
        .expect("pagos serve"),
    );
    let logs = || std::fs::read_to_string(&log).unwrap_or_default();
    for _ in 0..200 {
        if logs().contains("another process is applying migrations") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    assert!(
        logs().contains("another process is applying migrations"),
        "{}",
        logs()
    );

    let sent = Command::new("kill")
        .args(["-TERM", &serve.0.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(sent.success());
    let mut exited = None;
    for _ in 0..200 {
        if let Some(status) = serve.0.try_wait().expect("wait") {
            exited = Some(status);
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    let Some(status) = exited else {
        panic!("still waiting for the lock after SIGTERM:\n{}", logs());
    };
    assert!(status.success(), "a clean exit: {status}\n{}", logs());
    assert!(logs().contains("stopped before serving"), "{}", logs());
    assert!(!logs().contains("pagos listening"), "{}", logs());
}

/// A SQLite URL that would keep nothing is refused by every command, naming the setting:
/// `sqlite:` names no file (before: `pagos: applying migrations: Execution Error: … no such
/// table: payments`, exit 1: each connection had a temporary database of its own), and a
/// database in memory is lost at exit with every payment in it (before: `serve` ran on it).
#[test]
fn an_sqlite_url_without_a_file_or_in_memory_is_refused_by_every_command() {
    let dir = tempfile::tempdir().expect("dir");
    let memory = format!("sqlite://{}?mode=memory", dir.path().join("m.db").display());
    for (url, says) in [
        ("sqlite:", "names no file"),
        ("sqlite://", "names no file"),
        ("sqlite::memory:", "in-memory SQLite database"),
        (memory.as_str(), "in-memory SQLite database"),
    ] {
        for command in EVERY_COMMAND {
            let line = refused_with(
                &pagos(&with_url(command, url), &[]),
                &["invalid setting PAGOS_DATABASE_URL (--database-url)", says],
            );
            assert!(
                line.contains("sqlite://FILE?mode=rwc"),
                "what to do: {line}"
            );
        }
    }
    assert!(
        !dir.path().join("m.db").exists(),
        "nothing was created before refusing"
    );
}

/// A read-only SQLite URL (`mode=ro`, `immutable=1`) is refused by every command that
/// writes, naming the setting, exit 2 (before: `serve` stopped with `pagos: Execution
/// Error: … attempt to write a readonly database`, exit 1), and still serves the commands
/// that only read.
#[test]
fn a_read_only_sqlite_url_is_refused_by_the_commands_that_write() {
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("p.db");
    let migrated = pagos(
        &[
            "migrate",
            "--database-url",
            &format!("sqlite://{}?mode=rwc", file.display()),
        ],
        &[],
    );
    assert!(migrated.status.success(), "{migrated:?}");
    for query in ["mode=ro", "immutable=1"] {
        let url = format!("sqlite://{}?{query}", file.display());
        for command in EVERY_COMMAND.iter().copied().chain([
            &["merchants", "keys", "add", "acme"][..],
            &["operators", "add", "ana"],
        ]) {
            refused_with(
                &pagos(&with_url(command, &url), &[]),
                &[
                    "invalid setting PAGOS_DATABASE_URL (--database-url)",
                    "read-only",
                    "this command writes",
                ],
            );
        }
        for command in [
            &["merchants", "list"][..],
            &["merchants", "keys", "list", "acme"],
            &["operators", "list"],
        ] {
            let output = pagos(&with_url(command, &url), &[]);
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert!(
                !stderr.contains("PAGOS_DATABASE_URL"),
                "{command:?} only reads: {stderr}"
            );
        }
    }
}

/// Asserts exit code 2 and a last line of stderr (what `serve` logged while it started
/// comes before it) naming `setting` and holding every one of `says`; returns the line.
fn setting_refused(output: &Output, setting: &str, says: &[&str]) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(output.status.code(), Some(2), "exit 2: {stderr}");
    let last = stderr
        .trim_end()
        .lines()
        .last()
        .unwrap_or_default()
        .to_owned();
    assert!(
        last.starts_with(&format!("pagos: invalid setting {setting}: ")),
        "names {setting}: {stderr}"
    );
    for part in says {
        assert!(last.contains(part), "says {part:?}: {stderr}");
    }
    last
}

/// An address pagos cannot listen on, whether no interface of this host has it or
/// another process listens there, is a bad setting: exit 2, one line naming it. Before:
/// `pagos: cannot listen on … (PAGOS_BIND): …`, exit 1, which an orchestrator takes for a
/// crash to restart, not a configuration to fix. Nothing is sent anywhere: binding an
/// address this host does not have fails at once.
#[test]
fn an_address_that_cannot_be_listened_on_stops_serve_naming_it_with_exit_2() {
    let dir = tempfile::tempdir().expect("dir");
    let db = format!("sqlite://{}?mode=rwc", dir.path().join("p.db").display());
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let taken = taken.local_addr().expect("addr").to_string();
    let serve = |env: &[(&str, &str)]| pagos(&["serve", "--database-url", &db], env);

    setting_refused(
        &serve(&[("PAGOS_BIND", "203.0.113.5:18661")]),
        "PAGOS_BIND (--bind)",
        &[
            "cannot listen on 203.0.113.5:18661",
            "no interface of this host has that address",
        ],
    );
    setting_refused(
        &serve(&[("PAGOS_BIND", &taken)]),
        "PAGOS_BIND (--bind)",
        &[
            &format!("cannot listen on {taken}"),
            "another process listens on that port",
        ],
    );
    for admin in ["203.0.113.5:18662", taken.as_str()] {
        setting_refused(
            &serve(&[("PAGOS_BIND", "127.0.0.1:0"), ("PAGOS_ADMIN_BIND", admin)]),
            "PAGOS_ADMIN_BIND (--admin-bind)",
            &[&format!("cannot listen on {admin}")],
        );
    }
    // Refused before the database is touched: before, the new release's migrations had
    // run and the database was pinned to these settings by then. Here not even created.
    assert!(
        !dir.path().join("p.db").exists(),
        "the database was not opened: {:?}",
        std::fs::read_dir(dir.path()).map(|d| d.count())
    );
    // The standalone sandbox gateway's own address too.
    setting_refused(
        &pagos(&["sandbox-gateway"], &[("PAGOS_SANDBOX_BIND", &taken)]),
        "PAGOS_SANDBOX_BIND (--bind)",
        &[&format!("cannot listen on {taken}")],
    );
}

/// `PAGOS_LOG_FORMAT`, a flag of every command, is named when its value is bad, as every
/// other setting is (before: `pagos: invalid value 'xml' for '--log-format <LOG_FORMAT>'`,
/// without the variable an operator set).
#[test]
fn a_bad_log_format_is_refused_naming_pagos_log_format() {
    for command in [&["serve"][..], &["migrate"], &["merchants", "list"]] {
        let by_env = pagos(command, &[("PAGOS_LOG_FORMAT", "xml")]);
        let mut with_flag = command.to_vec();
        with_flag.extend_from_slice(&["--log-format", "xml"]);
        for output in [by_env, pagos(&with_flag, &[])] {
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert_eq!(output.status.code(), Some(2), "exit 2: {stderr}");
            assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
            assert!(
                stderr.starts_with("pagos: invalid setting PAGOS_LOG_FORMAT: invalid value 'xml'"),
                "{command:?}: {stderr}"
            );
        }
    }
}
