//! `GET /v1/eventos` pages through a merchant's events in the order they were committed.
//!
//! An event's id (`evt_` + a UUIDv7) is made when its write is planned, before the
//! transaction that stores it waits for a connection or a lock: two writes can commit in
//! the other order, and two hosts' clocks can disagree. Paged by id, a cursor handed out
//! after the later-numbered event had committed passed over the earlier-numbered one
//! committed after it: a merchant polling with `desde` never saw it.
//!
//! - PostgreSQL: `tx`, the writing transaction's id (`pg_current_xact_id()`, 64 bits,
//!   never wrapping), filled in by the column's default, so every statement that writes
//!   an event (the saga's one-statement writes, older processes) sets it without naming
//!   it. The list orders by `(tx, id)` and shows only events of transactions older than
//!   every transaction still running (`pg_snapshot_xmin`): no event can commit behind a
//!   cursor afterwards. Events written before this migration keep `tx = 0`: first, by id,
//!   as before.
//! - SQLite: one writer at a time, and a row's `rowid` is given under the write lock, so
//!   `rowid` is commit order already; the list orders by it.
//!
//! The index `(merchant_id, id)` of the old order is replaced by one of the new order:
//! `(merchant_id, tx, id)` on PostgreSQL, `(merchant_id)` on SQLite (whose every index
//! ends with the `rowid`). A process built before this migration still lists by id,
//! correctly filtered by merchant.
//!
//! On PostgreSQL it runs outside a transaction, one statement at a time: in one
//! transaction the `ADD COLUMN`'s ACCESS EXCLUSIVE lock on `events` would be held through
//! the index build over every event, stalling every payment's final write. The column
//! comes with a constant default (no rewrite, the lock held an instant), and the indexes
//! are built and dropped `CONCURRENTLY`. A concurrent build that was interrupted leaves
//! an INVALID index behind, which `IF NOT EXISTS` would take as done: it is dropped and
//! built again. Every statement can run again, so a migration killed halfway is finished
//! by the next start. On SQLite both statements are quick and can run again too.

use crate::concurrently::drop_if_invalid;
use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::DbBackend;

#[derive(DeriveMigrationName)]
pub struct Migration;

const OLD_INDEX: &str = "events_merchant_id_idx";
const INDEX: &str = "events_merchant_commit_order_idx";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    /// No transaction: `CREATE INDEX CONCURRENTLY` cannot run in one (module docs).
    fn use_transaction(&self) -> Option<bool> {
        Some(false)
    }

    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        if manager.get_database_backend() == DbBackend::Postgres {
            // A constant default first: no rewrite of the rows already there. Then the
            // writing transaction's id for every row written from now on.
            db.execute_unprepared(
                r#"ALTER TABLE "events" ADD COLUMN IF NOT EXISTS "tx" BIGINT NOT NULL DEFAULT 0"#,
            )
            .await?;
            db.execute_unprepared(
                r#"ALTER TABLE "events" ALTER COLUMN "tx" SET DEFAULT (pg_current_xact_id()::text::bigint)"#,
            )
            .await?;
            drop_if_invalid(manager, INDEX).await?;
            db.execute_unprepared(&format!(
                r#"CREATE INDEX CONCURRENTLY IF NOT EXISTS "{INDEX}" ON "events" ("merchant_id", "tx", "id")"#
            ))
            .await?;
            db.execute_unprepared(&format!(
                r#"DROP INDEX CONCURRENTLY IF EXISTS "{OLD_INDEX}""#
            ))
            .await?;
        } else {
            db.execute_unprepared(&format!(
                r#"CREATE INDEX IF NOT EXISTS "{INDEX}" ON "events" ("merchant_id")"#
            ))
            .await?;
            db.execute_unprepared(&format!(r#"DROP INDEX IF EXISTS "{OLD_INDEX}""#))
                .await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        if manager.get_database_backend() == DbBackend::Postgres {
            drop_if_invalid(manager, OLD_INDEX).await?;
            db.execute_unprepared(&format!(
                r#"CREATE INDEX CONCURRENTLY IF NOT EXISTS "{OLD_INDEX}" ON "events" ("merchant_id", "id")"#
            ))
            .await?;
            db.execute_unprepared(&format!(r#"DROP INDEX CONCURRENTLY IF EXISTS "{INDEX}""#))
                .await?;
            db.execute_unprepared(r#"ALTER TABLE "events" DROP COLUMN IF EXISTS "tx""#)
                .await?;
        } else {
            db.execute_unprepared(&format!(
                r#"CREATE INDEX IF NOT EXISTS "{OLD_INDEX}" ON "events" ("merchant_id", "id")"#
            ))
            .await?;
            db.execute_unprepared(&format!(r#"DROP INDEX IF EXISTS "{INDEX}""#))
                .await?;
        }
        Ok(())
    }
}
