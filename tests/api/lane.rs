//! The PostgreSQL connections kept for the saga's statements (`db::query_one_on_pool`,
//! returned without sqlx's ping): never more connections than `PAGOS_DATABASE_POOL_SIZE`;
//! a connection the server dropped (a restart, a failover, an administrator's
//! `pg_terminate_backend`) costs at most the one statement it was running; one whose
//! statement was abandoned half-way is never lent again; each runs read committed, as
//! the pool's do.

use crate::helpers::{Backend, TestDatabase};
use pagos::db::DatabaseArgs;
use pagos::db::query_one_on_pool;
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, Statement};
use std::time::Duration;

fn sql(text: &str) -> Statement {
    Statement::from_string(DbBackend::Postgres, text.to_owned())
}

/// The connections open to `database` now, seen from another session.
async fn connections_to(watcher: &DatabaseConnection, database: &str) -> i64 {
    watcher
        .query_one_raw(sql(&format!(
            "SELECT count(*) AS n FROM pg_stat_activity WHERE datname = '{database}'"
        )))
        .await
        .expect("count")
        .expect("a row")
        .try_get::<i64>("", "n")
        .expect("n")
}

/// A database of its own opened as pagos opens it with a pool size of 4 (2 connections
/// kept for the saga's statements, 2 in the pool), its name, and a connection to the
/// server's default database to watch it from.
async fn database() -> Option<(TestDatabase, DatabaseConnection, String, DatabaseConnection)> {
    let backend = Backend::postgres()?;
    let Backend::Postgres(server) = &backend else {
        unreachable!()
    };
    let watcher = sea_orm::Database::connect(server.as_str())
        .await
        .expect("the server");
    let database = TestDatabase::create(&backend).await;
    let name = database
        .url
        .rsplit('/')
        .next()
        .expect("a database name")
        .split('?')
        .next()
        .expect("a name")
        .to_owned();
    let db = pagos::db::connect(&DatabaseArgs {
        url: database.url.clone(),
        pool_size: 4,
    })
    .await
    .expect("open");
    Some((database, db, name, watcher))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_saga_statements_and_the_pool_together_hold_no_more_connections_than_the_pool_size() {
    let Some((_database, db, name, watcher)) = database().await else {
        return;
    };
    let mut work = tokio::task::JoinSet::new();
    for i in 0..12 {
        let saga = db.clone();
        work.spawn(async move {
            let row = query_one_on_pool(&saga, sql(&format!("SELECT {i} AS n, pg_sleep(0.2)")))
                .await
                .expect("a saga statement")
                .expect("a row");
            assert_eq!(row.try_get::<i32>("", "n").expect("n"), i);
        });
        let db = db.clone();
        work.spawn(async move {
            db.query_one_raw(sql("SELECT pg_sleep(0.2)"))
                .await
                .expect("a statement through the pool");
        });
    }
    let mut most = 0;
    while !work.is_empty() {
        most = most.max(connections_to(&watcher, &name).await);
        tokio::select! {
            done = work.join_next() => { done.expect("a task").expect("it ran"); }
            () = tokio::time::sleep(Duration::from_millis(20)) => {}
        }
    }
    assert!(most <= 4, "{most} connections open with a pool size of 4");
    assert!(
        most >= 3,
        "the statements ran side by side ({most} connections)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_connection_the_server_dropped_costs_at_most_the_statement_it_was_running() {
    let Some((_database, db, _name, watcher)) = database().await else {
        return;
    };
    let first = kept_connection(&db).await;
    watcher
        .execute_raw(sql(&format!("SELECT pg_terminate_backend({first})")))
        .await
        .expect("terminated");
    tokio::time::sleep(Duration::from_millis(200)).await;

    let mut failed = 0;
    let mut answered = Vec::new();
    for _ in 0..5 {
        match backend_pid(&db).await {
            Ok(pid) => answered.push(pid),
            Err(_) => failed += 1,
        }
    }
    assert!(
        failed <= 1,
        "{failed} statements failed after one connection was dropped"
    );
    assert!(
        answered.iter().all(|pid| *pid != first),
        "the dropped connection was used again: {answered:?}"
    );
}

/// The backend serving a saga statement now.
async fn backend_pid(db: &DatabaseConnection) -> Result<i32, sea_orm::DbErr> {
    query_one_on_pool(db, sql("SELECT pg_backend_pid() AS pid"))
        .await
        .map(|row| row.expect("a row").try_get::<i32>("", "pid").expect("pid"))
}

/// The backend of the kept connection that serves one saga statement after another
/// (the same one both times: it went back to the lane and was lent again).
async fn kept_connection(db: &DatabaseConnection) -> i32 {
    let first = backend_pid(db).await.expect("a statement");
    assert_eq!(
        backend_pid(db).await.expect("a statement"),
        first,
        "one statement after another: the same kept connection"
    );
    first
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_connection_whose_statement_was_abandoned_half_way_is_never_lent_again() {
    let Some((_database, db, _name, _watcher)) = database().await else {
        return;
    };
    let kept = kept_connection(&db).await;
    // A request whose client hung up, or that ran out of time, drops its statement's
    // future after sending it: the connection may hold its answer, or half a message.
    let abandoned = tokio::time::timeout(
        Duration::from_millis(100),
        query_one_on_pool(&db, sql("SELECT 'first' AS which, pg_sleep(0.5)")),
    )
    .await;
    assert!(abandoned.is_err(), "the statement was abandoned");
    for _ in 0..4 {
        assert_ne!(
            backend_pid(&db).await.expect("the next statement"),
            kept,
            "the abandoned statement's connection was lent again"
        );
    }
}

/// What a saga statement (a lane connection) and a pooled one show of `setting`, on a
/// database whose default for it is `value`, opened after the default was set (as a
/// process started then opens its connections); None without PostgreSQL.
async fn shown_under_the_databases_default(setting: &str, value: &str) -> Option<[String; 2]> {
    let (database, _opened_before, name, watcher) = database().await?;
    watcher
        .execute_raw(sql(&format!(
            "ALTER DATABASE \"{name}\" SET {setting} = '{value}'"
        )))
        .await
        .expect("the database's default");
    let db = pagos::db::connect(&DatabaseArgs {
        url: database.url.clone(),
        pool_size: 4,
    })
    .await
    .expect("open");
    let show = sql(&format!("SHOW {setting}"));
    let on_lane = query_one_on_pool(&db, show.clone())
        .await
        .expect("a saga statement")
        .expect("a row");
    let pooled = db
        .query_one_raw(show)
        .await
        .expect("a pooled statement")
        .expect("a row");
    Some([on_lane, pooled].map(|row| row.try_get::<String>("", setting).expect("the setting")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_saga_statements_run_read_committed_whatever_the_databases_default() {
    let Some(shown) =
        shown_under_the_databases_default("default_transaction_isolation", "repeatable read").await
    else {
        return;
    };
    assert_eq!(shown, ["read committed", "read committed"]);
}

/// A database (or role) whose default is `synchronous_commit = off`, set for speed: a
/// payment answered 201 could be lost in a crash of the database server. pagos' sessions
/// commit to disk whatever the default (`local`), pool and lane alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_saga_statements_commit_to_disk_whatever_the_databases_default() {
    let Some(shown) = shown_under_the_databases_default("synchronous_commit", "off").await else {
        return;
    };
    assert_eq!(shown, ["local", "local"]);
}

/// A host that dies, freezes or is cut off inside a transaction holds its payment's lock
/// until the server hears of it: behind a silent partition, hours of requests for that
/// payment waiting. With the server's default (no limit), pagos' sessions end a
/// transaction left idle for 30 s, pool and lane alike; a limit the database sets is kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_transaction_left_idle_by_a_lost_host_is_ended_by_the_server() {
    let Some(shown) =
        shown_under_the_databases_default("idle_in_transaction_session_timeout", "0").await
    else {
        return;
    };
    assert_eq!(shown, ["30s", "30s"]);
    let Some(kept) =
        shown_under_the_databases_default("idle_in_transaction_session_timeout", "5s").await
    else {
        return;
    };
    assert_eq!(kept, ["5s", "5s"]);

    // What it buys: a row locked by a transaction its host stopped tending is free again.
    let Some((database, db, _name, _watcher)) = database().await else {
        return;
    };
    db.execute_raw(sql("CREATE TABLE held (id int PRIMARY KEY)"))
        .await
        .expect("a table");
    db.execute_raw(sql("INSERT INTO held VALUES (1)"))
        .await
        .expect("a row");
    let lost = sea_orm::TransactionTrait::begin(&db).await.expect("begin");
    lost.query_one_raw(sql("SELECT id FROM held WHERE id = 1 FOR UPDATE"))
        .await
        .expect("the lock")
        .expect("a row");
    // Another session, with no limit of its own, waits for the lock; the lost one never
    // says another word.
    let other = sea_orm::Database::connect(database.url.as_str())
        .await
        .expect("another session");
    let waited = tokio::time::timeout(
        Duration::from_secs(120),
        other.execute_raw(sql("UPDATE held SET id = 1 WHERE id = 1")),
    )
    .await;
    assert!(
        matches!(waited, Ok(Ok(_))),
        "the row is still locked by a transaction idle for two minutes: {waited:?}"
    );
    assert!(
        lost.commit().await.is_err(),
        "the idle transaction was rolled back by the server, not committed"
    );
}
