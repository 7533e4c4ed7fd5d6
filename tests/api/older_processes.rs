//! Processes and databases of other releases.
//!
//! A rolling deployment past `m20261205_000015`: processes built before it still write
//! `events.fanned_out` (`FALSE`) with each event and fan out by that flag. Their statements
//! must keep working against the current schema, and the events they write must reach the
//! merchant through the current processes' fan-out, those written while the migration runs
//! included.
//!
//! A rollback to a release built before `m20261208_000018` (README, "Upgrading and rolling
//! back"): its migration rows are deleted and the schema stays, so the next upgrade runs
//! those migrations again on a schema that already has them.

use crate::helpers::Backend;
use crate::on_both_databases;
use crate::receiver::Receiver;
use crate::webhooks_out::{delivering, event_of, eventually, pay};
use sea_orm::ConnectionTrait;
use std::time::Duration;

on_both_databases!(
    an_event_written_by_an_older_process_is_queued_and_delivered,
    a_column_a_newer_release_adds_while_a_process_serves_leaves_its_claims_working,
);

/// A newer release adds a column to `payments` and `refunds` (as `m20261210_000022` did)
/// while an older process serves: that process's reconciler claims with a statement it
/// prepared on each connection. Before, the claim returned `*`, whose result type the
/// column changed, and PostgreSQL refused the cached plan (`cached plan must not change
/// result type`) on every connection until it was recycled: every pass, every "reconcile
/// now" and every retry that found its payment due failed through the rolling upgrade.
async fn a_column_a_newer_release_adds_while_a_process_serves_leaves_its_claims_working(
    backend: Backend,
) {
    let app = crate::helpers::Spawn::new(backend)
        .flags(&["--database-pool-size", "2"])
        .start()
        .await;
    let _fake = app
        .with_fake(crate::helpers::FakeGateway::charging("pending"))
        .await;
    let (status, pago) = app
        .pay_read(
            "k-claimed-across-a-migration",
            &crate::helpers::payment_body(),
        )
        .await;
    assert_eq!(status, 202, "{pago}");
    let id = pago["id"].as_str().expect("id").to_owned();
    let pass = async || {
        let answer = app
            .admin_post("/admin/reconciliaciones", &serde_json::json!({}))
            .await;
        assert_eq!(answer.status(), 200, "a whole pass");
        app.reconcile(&id).await
    };
    // Every connection of the pool has prepared the claims.
    for _ in 0..4 {
        pass().await;
    }

    for table in ["payments", "refunds"] {
        app.db
            .execute_unprepared(&format!(
                r#"ALTER TABLE "{table}" ADD COLUMN "added_by_a_newer_release" TEXT"#
            ))
            .await
            .expect("the newer release's migration");
    }

    for _ in 0..4 {
        let report = pass().await;
        assert_eq!(report["examinados"], 1, "{report}");
        assert_eq!(report["errores"], 0, "{report}");
    }
}

async fn an_event_written_by_an_older_process_is_queued_and_delivered(backend: Backend) {
    let (app, _fake) = delivering(backend, &[]).await;
    let receiver = Receiver::start().await;
    app.register_endpoint(&receiver.url("/")).await;

    let current = event_of(&app, &pay(&app, "k-1").await).await;
    eventually(
        Duration::from_secs(10),
        "the current event delivered",
        async || receiver.deliveries().len() == 1,
    )
    .await;

    // What an older process's final statement wrote: every column, the flag unset.
    let older = pagos::outbox::new_id();
    app.db
        .execute_unprepared(&format!(
            r#"INSERT INTO "events" ("id", "merchant_id", "event_type", "subject_id", "sequence", "body", "created_at", "fanned_out")
               SELECT '{older}', "merchant_id", "event_type", "subject_id", "sequence" + 1,
                      REPLACE("body", '{current}', '{older}'), "created_at", FALSE
               FROM "events" WHERE "id" = '{current}'"#,
            current = current.id
        ))
        .await
        .expect("an older process's insert still runs");

    // An older process's fan-out scan sees only what older processes wrote…
    let unset = app
        .db
        .query_all_raw(sea_orm::Statement::from_string(
            app.db.get_database_backend(),
            r#"SELECT "id" FROM "events" WHERE "fanned_out" = FALSE"#,
        ))
        .await
        .expect("an older process's fan-out scan still runs");
    let unset: Vec<String> = unset
        .iter()
        .map(|row| row.try_get("", "id").expect("id"))
        .collect();
    assert_eq!(
        unset,
        vec![older.clone()],
        "the current event counts as handled"
    );

    // …and the current processes deliver it, once.
    eventually(
        Duration::from_secs(10),
        "the older event delivered",
        async || receiver.deliveries().len() == 2,
    )
    .await;
    let got = &receiver.deliveries()[1];
    assert_eq!(got.header("webhook-id"), older);
    assert!(String::from_utf8_lossy(&got.body).contains(&older));

    // An older process's fan-out may still take it: marking it is harmless.
    app.db
        .execute_unprepared(&format!(
            r#"UPDATE "events" SET "fanned_out" = TRUE WHERE "id" = '{older}'"#
        ))
        .await
        .expect("an older process's fan-out update still runs");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(receiver.deliveries().len(), 2, "each event delivered once");
}

/// A migration the next release might bring: unknown to this binary.
const NEWER: &str = "m20991231_000099_from_a_newer_release";

/// This database, migrated, then marked as migrated by a newer release too.
async fn migrated_by_a_newer_release(backend: &Backend) -> crate::helpers::TestDatabase {
    let database = crate::helpers::TestDatabase::create(backend).await;
    let db = database.migrated().await;
    db.execute_unprepared(&format!(
        r#"INSERT INTO "seaql_migrations" ("version", "applied_at") VALUES ('{NEWER}', 0)"#
    ))
    .await
    .expect("a newer release's migration recorded");
    let _ = db.close().await;
    database
}

on_both_databases!(
    a_database_migrated_by_a_newer_release_is_used_without_migrating,
    a_database_lacking_its_own_migrations_and_holding_unknown_ones_is_refused,
);

/// A rollback, or an older pod restarting mid-deployment: the previous release starts.
async fn a_database_migrated_by_a_newer_release_is_used_without_migrating(backend: Backend) {
    let database = migrated_by_a_newer_release(&backend).await;
    let settings = crate::helpers::settings(&database.url, &[]);
    let db = pagos::app::open_and_migrate(&settings.database)
        .await
        .expect("a process of the previous release starts");
    pagos::app::add_merchant(&db, "acme", None)
        .await
        .expect("and works on the newer schema");
    let _ = db.close().await;
    let db = pagos::db::open(&settings.database)
        .await
        .expect("the other commands open it too");
    let rows = db
        .query_one_raw(sea_orm::Statement::from_string(
            db.get_database_backend(),
            format!(r#"SELECT COUNT(*) AS n FROM "seaql_migrations" WHERE "version" = '{NEWER}'"#),
        ))
        .await
        .expect("query")
        .expect("a row")
        .try_get::<i64>("", "n")
        .expect("a count");
    assert_eq!(rows, 1, "the newer release's record is left as it was");
}

async fn a_database_lacking_its_own_migrations_and_holding_unknown_ones_is_refused(
    backend: Backend,
) {
    let database = migrated_by_a_newer_release(&backend).await;
    let settings = crate::helpers::settings(&database.url, &[]);
    let db = pagos::db::connect(&settings.database).await.expect("open");
    db.execute_unprepared(
        r#"DELETE FROM "seaql_migrations" WHERE "version" = 'm20261208_000018_events_in_commit_order'"#,
    )
    .await
    .expect("one of this binary's migrations forgotten");
    let _ = db.close().await;
    for opened in [
        pagos::app::open_and_migrate(&settings.database).await,
        pagos::db::open(&settings.database).await,
    ] {
        let err = opened.expect_err("refused");
        let line = format!("{err:#}");
        assert!(
            err.downcast_ref::<pagos::db::MigrationError>().is_some(),
            "a migration error (exit 2): {line}"
        );
        assert!(line.contains(NEWER), "names the unknown migration: {line}");
        assert!(
            line.contains("m20261208_000018_events_in_commit_order"),
            "names the missing one: {line}"
        );
        assert_eq!(line.lines().count(), 1, "one line: {line}");
    }
}

on_both_databases!(a_database_rolled_back_as_the_readme_says_upgrades_again_keeping_its_rows);

/// README's rollback to a release built before `m20261208_000018` (its `DELETE` as
/// written), then the upgrade again: every migration from it on runs again on a schema
/// that has it, and the payments stay.
async fn a_database_rolled_back_as_the_readme_says_upgrades_again_keeping_its_rows(
    backend: Backend,
) {
    use migration::{Migrator, MigratorTrait};
    let (app, _fake) = delivering(backend, &[]).await;
    let payments = [pay(&app, "k-1").await, pay(&app, "k-2").await];

    let deleted = app
        .db
        .execute_unprepared("DELETE FROM seaql_migrations WHERE version >= 'm20261208_000018'")
        .await
        .expect("the README's DELETE runs");
    assert!(deleted.rows_affected() > 0, "it forgets migrations");

    let settings = crate::helpers::settings(app.database_url(), &[]);
    let upgraded = pagos::app::open_and_migrate(&settings.database)
        .await
        .map_err(|err| format!("{err:#}"))
        .expect("the upgrade after the rollback migrates");
    let applied = upgraded
        .query_one_raw(sea_orm::Statement::from_string(
            upgraded.get_database_backend(),
            r#"SELECT COUNT(*) AS n FROM "seaql_migrations""#,
        ))
        .await
        .expect("query")
        .expect("a row")
        .try_get::<i64>("", "n")
        .expect("a count");
    assert_eq!(
        usize::try_from(applied).expect("count"),
        Migrator::migrations().len(),
        "every migration recorded again"
    );
    let _ = upgraded.close().await;

    for id in &payments {
        let answer = app
            .get_as(crate::helpers::API_KEY, &format!("/v1/pagos/{id}"))
            .await;
        assert_eq!(answer.status(), 200, "payment {id} still there");
        assert_eq!(app.payment(id).await.state, "COMPLETADA");
    }
}

/// Whether PostgreSQL's `events` still has its foreign key to `merchants`.
async fn has_events_merchant_fk(db: &sea_orm::DatabaseConnection) -> bool {
    db.query_one_raw(sea_orm::Statement::from_string(
        sea_orm::DbBackend::Postgres,
        r#"SELECT 1 AS "found" FROM "pg_constraint" WHERE "conname" = 'events_merchant_fk'"#,
    ))
    .await
    .expect("query")
    .is_some()
}

/// On PostgreSQL events carry no foreign key to `merchants` (its check locked the
/// merchant's row in every payment's final statement): a database migrated by an earlier
/// release loses it, and migrating down to before `m20261205_000014` brings it back once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_events_lose_their_foreign_key_to_merchants_and_get_it_back_going_down() {
    use migration::{Migrator, MigratorTrait};
    let Some(backend) = Backend::postgres() else {
        return;
    };
    let (database, db) = crate::helpers::TestDatabase::with_acme(&backend).await;
    assert!(!has_events_merchant_fk(&db).await, "dropped by migrating");
    let _ = db.close().await;

    let settings = crate::helpers::settings(&database.url, &[]);
    let db = pagos::db::connect(&settings.database).await.expect("open");
    let from_m14 = Migrator::migrations().len()
        - Migrator::migrations()
            .iter()
            .position(|m| m.name() == "m20261205_000014_payment_search_index")
            .expect("the migration");
    Migrator::down(&db, Some(u32::try_from(from_m14).expect("count")))
        .await
        .map_err(|err| format!("{err:#}"))
        .expect("down to before m14");
    assert!(has_events_merchant_fk(&db).await, "back, as m11 made it");
    Migrator::up(&db, None)
        .await
        .map_err(|err| format!("{err:#}"))
        .expect("up again");
    assert!(!has_events_merchant_fk(&db).await, "dropped again");
}

/// The rolling upgrade past `m20261205_000015` on PostgreSQL: an older process's event
/// written while the migration runs (its transaction began before, commits after the
/// migration started) is queued for the fan-out like those committed before it. m15 takes
/// `events` before it reads what to queue, so it waits for that transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_an_older_process_event_committed_while_m15_runs_is_queued() {
    use migration::{Migrator, MigratorTrait};
    use sea_orm::TransactionTrait;
    let Some(backend) = Backend::postgres() else {
        return;
    };
    let database = crate::helpers::TestDatabase::create(&backend).await;
    let settings = crate::helpers::settings(&database.url, &[]);
    let db = pagos::db::connect(&settings.database).await.expect("open");
    let before_m15 = Migrator::migrations()
        .iter()
        .position(|m| m.name() == "m20261205_000015_events_to_fan_out")
        .expect("the migration");
    Migrator::up(&db, Some(u32::try_from(before_m15).expect("count")))
        .await
        .expect("the schema an older process runs on");
    db.execute_unprepared(
        r#"INSERT INTO "merchants" ("id", "name", "api_key_hash", "created_at")
           VALUES (gen_random_uuid(), 'acme', repeat('0', 64), now())"#,
    )
    .await
    .expect("a merchant");

    // An older process's final statement, its transaction not committed yet.
    let older = pagos::outbox::new_id();
    let process = sea_orm::Database::connect(database.url.as_str())
        .await
        .expect("an older process's connection");
    let in_flight = process.begin().await.expect("begin");
    in_flight
        .execute_unprepared(&format!(
            r#"INSERT INTO "events" ("id", "merchant_id", "event_type", "subject_id", "sequence", "body", "created_at", "fanned_out")
               SELECT '{older}', "id", 'pago.completado', gen_random_uuid(), 1, '{{}}', now(), FALSE
               FROM "merchants""#
        ))
        .await
        .expect("an older process's insert");

    let args = settings.database.clone();
    let migrating = tokio::spawn(async move { pagos::app::open_and_migrate(&args).await });
    // The migration waits on `events` for the older process's transaction.
    eventually(
        Duration::from_secs(10),
        "the migration waits for the older process's transaction",
        async || {
            db.query_one_raw(sea_orm::Statement::from_string(
                sea_orm::DbBackend::Postgres,
                r#"SELECT 1 AS "waiting" FROM "pg_locks"
                   WHERE NOT "granted" AND "relation" = 'events'::regclass"#,
            ))
            .await
            .expect("query")
            .is_some()
        },
    )
    .await;
    in_flight.commit().await.expect("the older process commits");
    let migrated = migrating
        .await
        .expect("the migration's task")
        .map_err(|err| format!("{err:#}"))
        .expect("migrated");
    let _ = migrated.close().await;
    let _ = process.close().await;

    let queued = db
        .query_one_raw(sea_orm::Statement::from_string(
            sea_orm::DbBackend::Postgres,
            format!(
                r#"SELECT 1 AS "queued" FROM "events_to_fan_out" WHERE "event_id" = '{older}'"#
            ),
        ))
        .await
        .expect("query")
        .is_some();
    assert!(
        queued,
        "the older process's event is queued for the fan-out"
    );
}
