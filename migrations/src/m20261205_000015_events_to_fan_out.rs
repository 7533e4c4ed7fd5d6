//! The events the delivery worker has not fanned out yet get a table of their own.
//!
//! They were the events with `fanned_out = false`, found through an index on that flag:
//! fanning an event out then updated its row — a second copy of its body (~1 KiB) and an
//! entry in each of its four indexes, for every event, in the same database the payments
//! are written to. Now a new event's id also goes into `events_to_fan_out` (one narrow row,
//! in the same statement or transaction as the event), and fanning it out deletes that
//! row: `events` is only ever inserted into. Events not fanned out when this migration
//! runs are queued; the flag and its index go.
//!
//! On PostgreSQL it first takes `events` (`ACCESS EXCLUSIVE`, which dropping the index and
//! the column take anyway), so it waits for the older processes' transactions writing
//! events before it reads which to queue. It used to read first (read committed: only the
//! events committed by then) and wait later, at `DROP INDEX`: an event of an older
//! process committed meanwhile kept `fanned_out = FALSE`, lost with the column, and was
//! never fanned out — a webhook never sent, during the rolling upgrade README calls safe.
//! Taking the lock first, rather than later, also never upgrades a weaker lock it holds,
//! so it cannot deadlock with a transaction that read `events` and then writes it. This
//! changed after the migration was released: it makes an upgrade that has not run it yet
//! correct, and changes nothing on a database past it (a migration runs once).
//! On SQLite the first statement, a write, waits for the writer in flight (or fails, and
//! the next start runs the migration again), and a writer reads every commit before its
//! own: nothing to add.

use sea_orm_migration::sea_orm::DbBackend;
use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

const TABLE: &str = "events_to_fan_out";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if manager.get_database_backend() == DbBackend::Postgres {
            // Before reading what to queue: see the module docs.
            manager
                .get_connection()
                .execute_unprepared(r#"LOCK TABLE "events" IN ACCESS EXCLUSIVE MODE"#)
                .await?;
        }
        manager
            .create_table(
                Table::create()
                    .table(TABLE)
                    .if_not_exists()
                    .col(string_len("event_id", 40).primary_key())
                    .to_owned(),
            )
            .await?;
        manager
            .get_connection()
            .execute_unprepared(
                r#"INSERT INTO "events_to_fan_out" ("event_id") SELECT "id" FROM "events" WHERE "fanned_out" = FALSE"#,
            )
            .await?;
        manager
            .drop_index(
                Index::drop()
                    .name("events_fan_out_idx")
                    .table("events")
                    .if_exists()
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table("events")
                    .drop_column("fanned_out")
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table("events")
                    .add_column(boolean("fanned_out").default(true))
                    .to_owned(),
            )
            .await?;
        manager
            .get_connection()
            .execute_unprepared(
                r#"UPDATE "events" SET "fanned_out" = FALSE WHERE "id" IN (SELECT "event_id" FROM "events_to_fan_out")"#,
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("events_fan_out_idx")
                    .table("events")
                    .col("fanned_out")
                    .col("id")
                    .if_not_exists()
                    .to_owned(),
            )
            .await?;
        manager
            .drop_table(Table::drop().table(TABLE).if_exists().to_owned())
            .await
    }
}
