//! The events the delivery worker has not fanned out yet get a table of their own.
//!
//! They were the events with `fanned_out = false`, found through an index on that flag:
//! fanning an event out then updated its row — a second copy of its body (~1 KiB) and an
//! entry in each of its four indexes, for every event, in the same database the payments
//! are written to. Now a new event's id also goes into `events_to_fan_out` (one narrow row,
//! in the same statement or transaction as the event), and fanning it out deletes that
//! row: `events` is only ever inserted into. Events not fanned out when this migration
//! runs are queued; the flag and its index go.

use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

const TABLE: &str = "events_to_fan_out";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
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
