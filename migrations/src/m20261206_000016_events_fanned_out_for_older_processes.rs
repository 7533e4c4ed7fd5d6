//! Older processes keep working while a deployment upgrades past `m20261205_000015`
//! (expand, then contract).
//!
//! `m20261205_000015` dropped `events.fanned_out`. A process built before it still writes
//! that column with every event and sets it when its fan-out has made the event's
//! deliveries: against the new schema its final statement failed, so during a rolling
//! deployment it could not settle a payment (the payment stayed `ENVIADA` until the
//! reconciler asked the provider) and its events were not queued.
//!
//! The column is back, for those processes only:
//! - its default is `TRUE`: current processes never name it, so their events count as
//!   handled (they are queued in `events_to_fan_out` with the event);
//! - an older process writes `FALSE`, and a trigger queues that event in
//!   `events_to_fan_out` in the same statement, so current processes fan it out too (an
//!   older process's fan-out may make the same deliveries: both insert them with
//!   `ON CONFLICT DO NOTHING`, so each delivery exists once);
//! - the older fan-out's scan (`fanned_out = FALSE`, by id) has a partial index holding only
//!   those events, so it costs nothing once the older processes are gone.
//!
//! On PostgreSQL it also queues the refund events written since `m20261205_000015` and not
//! delivered: until now the refund's one-statement write did not queue them.
//!
//! The contract step — dropping the trigger, the index and the column — comes in a later
//! release, once no process built before `m20261205_000015` can still be running.

use sea_orm_migration::prelude::*;
use sea_orm_migration::schema::*;
use sea_orm_migration::sea_orm::DbBackend;

#[derive(DeriveMigrationName)]
pub struct Migration;

const INDEX: &str = "events_not_fanned_out_idx";
const TRIGGER: &str = "events_of_older_processes";
const FUNCTION: &str = "events_queue_for_fan_out";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    /// One transaction, so one connection, on SQLite too: another connection of the pool
    /// may still hold the schema from before `m20261205_000015` dropped the column, and
    /// SQLite checks an `ADD COLUMN` against the schema the connection holds.
    fn use_transaction(&self) -> Option<bool> {
        Some(true)
    }

    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // A statement that reads `events` makes this connection load the current schema.
        manager
            .get_connection()
            .execute_unprepared(r#"SELECT 1 FROM "events" LIMIT 1"#)
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table("events")
                    .add_column(boolean("fanned_out").default(true))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name(INDEX)
                    .table("events")
                    .col("id")
                    .and_where(Expr::col("fanned_out").eq(false))
                    .if_not_exists()
                    .to_owned(),
            )
            .await?;
        let db = manager.get_connection();
        match manager.get_database_backend() {
            DbBackend::Postgres => {
                // Refund events written on PostgreSQL since `m20261205_000015` were not
                // queued (the refund's one-statement write lacked the queue's insert): those
                // not delivered yet are queued now.
                db.execute_unprepared(
                    r#"INSERT INTO "events_to_fan_out" ("event_id")
  SELECT "e"."id" FROM "events" "e"
  WHERE "e"."event_type" LIKE 'reembolso.%'
    AND "e"."created_at" >= (SELECT to_timestamp(min("applied_at")) FROM "seaql_migrations"
                             WHERE "version" = 'm20261205_000015_events_to_fan_out')
    AND NOT EXISTS (SELECT 1 FROM "webhook_deliveries" "d" WHERE "d"."event_id" = "e"."id")
  ON CONFLICT DO NOTHING"#,
                )
                .await?;
                db.execute_unprepared(&format!(
                    r#"CREATE OR REPLACE FUNCTION "{FUNCTION}"() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO "events_to_fan_out" ("event_id") VALUES (NEW."id") ON CONFLICT DO NOTHING;
  RETURN NULL;
END $$"#
                ))
                .await?;
                db.execute_unprepared(&format!(
                    r#"DROP TRIGGER IF EXISTS "{TRIGGER}" ON "events""#
                ))
                .await?;
                db.execute_unprepared(&format!(
                    r#"CREATE TRIGGER "{TRIGGER}" AFTER INSERT ON "events"
  FOR EACH ROW WHEN (NEW."fanned_out" = FALSE) EXECUTE FUNCTION "{FUNCTION}"()"#
                ))
                .await?;
            }
            _ => {
                db.execute_unprepared(&format!(
                    r#"CREATE TRIGGER IF NOT EXISTS "{TRIGGER}" AFTER INSERT ON "events"
  FOR EACH ROW WHEN NEW."fanned_out" = FALSE
  BEGIN
    INSERT OR IGNORE INTO "events_to_fan_out" ("event_id") VALUES (NEW."id");
  END"#
                ))
                .await?;
            }
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        if manager.get_database_backend() == DbBackend::Postgres {
            db.execute_unprepared(&format!(
                r#"DROP TRIGGER IF EXISTS "{TRIGGER}" ON "events""#
            ))
            .await?;
            db.execute_unprepared(&format!(r#"DROP FUNCTION IF EXISTS "{FUNCTION}"()"#))
                .await?;
        } else {
            db.execute_unprepared(&format!(r#"DROP TRIGGER IF EXISTS "{TRIGGER}""#))
                .await?;
        }
        manager
            .drop_index(
                Index::drop()
                    .name(INDEX)
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
}
