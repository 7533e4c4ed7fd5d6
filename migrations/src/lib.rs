//! Schema migrations for pagos, run by `pagos migrate` and at the start of `pagos serve`.
//!
//! Every migration must run unchanged on PostgreSQL (production) and SQLite (embedded
//! default). It must never rewrite or drop data a running older binary still relies on.
//!
//! Every migration runs in one transaction, with the record that it ran, on both
//! databases: `Migrator` runs each as `Whole`, whose `use_transaction` is `Some(true)`
//! unless the migration says otherwise (PostgreSQL's default already; SQLite's is no
//! transaction, and its DDL is transactional). A process killed halfway
//! through a migration leaves nothing of it, and the next start runs it whole; without
//! the transaction, the next start met the first half already there (`duplicate column
//! name`, `UNIQUE constraint failed`) and never started. A migration that cannot run in a
//! transaction (`m20261208_000018`, and the indexes built with `concurrently`: `CREATE
//! INDEX CONCURRENTLY`) says so, and each of its statements must be able to run again.
//!
//! Every migration from `m20261208_000018` on can also run again whole on a schema that
//! already has it: README's rollback to a release built before it deletes their records
//! and keeps the schema, and the next upgrade runs them again. Tables, indexes and
//! columns are made `IF NOT EXISTS` (`columns::add`), constraints dropped `IF EXISTS`, and
//! data is only rewritten where it is not yet as the migration leaves it.
//!
//! On PostgreSQL a migration in a transaction waits at most `LOCK_TIMEOUT` for a lock
//! (`SET LOCAL lock_timeout`): an `ALTER TABLE` waiting behind a long transaction holds its
//! place in the table's lock queue, and every payment's statement on the table would wait
//! behind it for as long. It gives up instead, and `pagos` runs it again after a pause
//! (`db::migrate`). Nor is it cut by a role's or database's `statement_timeout`
//! (`SET LOCAL statement_timeout = 0`): cut, it would be run and cut again at every start.

pub use sea_orm_migration::prelude::*;

mod columns;
mod concurrently;

mod m20261202_000001_init;
mod m20261202_000002_instance_facts;
mod m20261202_000003_webhooks;
mod m20261202_000004_payment_method;
mod m20261202_000005_claim_index;
mod m20261203_000006_payment_generations;
mod m20261203_000007_api_keys;
mod m20261203_000008_merchant_names;
mod m20261204_000009_refunds;
mod m20261204_000010_refund_event_sequence;
mod m20261204_000011_events;
mod m20261204_000012_delivery_rounds;
mod m20261204_000013_operators;
mod m20261205_000014_payment_search_index;
mod m20261205_000015_events_to_fan_out;
mod m20261206_000016_events_fanned_out_for_older_processes;
mod m20261207_000017_older_webhook_secret;
mod m20261208_000018_events_in_commit_order;
mod m20261209_000019_attempts_by_endpoint;
mod m20261209_000020_due_by_endpoint;
mod m20261210_000021_operator_actions;
mod m20261210_000022_last_error;
mod m20261210_000023_webhook_refunds;
mod m20261211_000024_delivery_claims;
mod m20261211_000025_webhook_reports_by_age;
mod m20261212_000026_reported_currency_upper;
mod m20261213_000027_events_without_merchant_fk;
mod m20261214_000028_resolution_reports_final;
mod m20261215_000029_overruled_reports_shown_otherwise;

pub struct Migrator;

/// How long a migration in a transaction waits for a lock on PostgreSQL before it gives
/// up, to be run again (module docs).
pub const LOCK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

/// Whether `err` is PostgreSQL giving up a wait for a lock (`LOCK_TIMEOUT`, SQLSTATE
/// 55P03): nothing of the migration stays, and it can be run again.
pub fn is_lock_timeout(err: &DbErr) -> bool {
    use sea_orm_migration::sea_orm::{RuntimeErr, sqlx};
    match err {
        DbErr::Exec(RuntimeErr::SqlxError(e)) | DbErr::Query(RuntimeErr::SqlxError(e)) => {
            matches!(e.as_ref(), sqlx::Error::Database(d) if d.code().as_deref() == Some("55P03"))
        }
        _ => false,
    }
}

#[async_trait::async_trait]
impl MigratorTrait for Migrator {
    fn migrations() -> Vec<Box<dyn MigrationTrait>> {
        vec![
            whole(m20261202_000001_init::Migration),
            whole(m20261202_000002_instance_facts::Migration),
            whole(m20261202_000003_webhooks::Migration),
            whole(m20261202_000004_payment_method::Migration),
            whole(m20261202_000005_claim_index::Migration),
            whole(m20261203_000006_payment_generations::Migration),
            whole(m20261203_000007_api_keys::Migration),
            whole(m20261203_000008_merchant_names::Migration),
            whole(m20261204_000009_refunds::Migration),
            whole(m20261204_000010_refund_event_sequence::Migration),
            whole(m20261204_000011_events::Migration),
            whole(m20261204_000012_delivery_rounds::Migration),
            whole(m20261204_000013_operators::Migration),
            whole(m20261205_000014_payment_search_index::Migration),
            whole(m20261205_000015_events_to_fan_out::Migration),
            whole(m20261206_000016_events_fanned_out_for_older_processes::Migration),
            whole(m20261207_000017_older_webhook_secret::Migration),
            whole(m20261208_000018_events_in_commit_order::Migration),
            whole(m20261209_000019_attempts_by_endpoint::Migration),
            whole(m20261209_000020_due_by_endpoint::Migration),
            whole(m20261210_000021_operator_actions::Migration),
            whole(m20261210_000022_last_error::Migration),
            whole(m20261210_000023_webhook_refunds::Migration),
            whole(m20261211_000024_delivery_claims::Migration),
            whole(m20261211_000025_webhook_reports_by_age::Migration),
            whole(m20261212_000026_reported_currency_upper::Migration),
            whole(m20261213_000027_events_without_merchant_fk::Migration),
            whole(m20261214_000028_resolution_reports_final::Migration),
            whole(m20261215_000029_overruled_reports_shown_otherwise::Migration),
        ]
    }
}

/// `migration`, run in one transaction unless it says otherwise (module docs).
fn whole(migration: impl MigrationTrait + 'static) -> Box<dyn MigrationTrait> {
    Box::new(Whole(Box::new(migration)))
}

/// A migration run in one transaction on both databases, unless its own
/// `use_transaction` says otherwise.
struct Whole(Box<dyn MigrationTrait>);

impl MigrationName for Whole {
    fn name(&self) -> &str {
        self.0.name()
    }
}

#[async_trait::async_trait]
impl MigrationTrait for Whole {
    fn use_transaction(&self) -> Option<bool> {
        self.0.use_transaction().or(Some(true))
    }

    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if manager.get_database_backend() == sea_orm_migration::sea_orm::DbBackend::Postgres
            && self.use_transaction() == Some(true)
        {
            manager
                .get_connection()
                .execute_unprepared(&format!(
                    "SET LOCAL lock_timeout = '{}ms'; SET LOCAL statement_timeout = 0",
                    LOCK_TIMEOUT.as_millis()
                ))
                .await?;
        }
        self.0.up(manager).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        self.0.down(manager).await
    }
}
