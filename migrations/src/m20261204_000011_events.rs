//! Telling merchants: the outbox of events, their endpoints, and every delivery and
//! attempt.
//!
//! - `events`: one row per change a merchant must know, written in the same statement or
//!   transaction as the change. Its `body` is the exact bytes every delivery sends.
//!   `fanned_out` is false until the delivery worker has made its deliveries (one per
//!   endpoint that wants it).
//! - `webhook_endpoints`: a merchant's URLs, their secrets (the current one and, during a
//!   rotation, the previous one until `previous_secret_until`), `ACTIVO`/`DESACTIVADO`.
//! - `webhook_deliveries`: one row per (event, endpoint): where it stands, how many
//!   attempts, when the next is due (also the worker's claim).
//! - `webhook_attempts`: every attempt, kept: time, status, latency, first 1 KiB of the
//!   answer, error.

use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table("events")
                    .if_not_exists()
                    // `evt_` + a UUIDv7 in hex: ordered by time of writing.
                    .col(string_len("id", 40).primary_key())
                    .col(uuid("merchant_id"))
                    .col(string_len("event_type", 40))
                    // The payment (or refund) it is about.
                    .col(uuid("subject_id"))
                    .col(big_integer("sequence"))
                    .col(text("body"))
                    .col(timestamp_with_time_zone("created_at"))
                    .col(boolean("fanned_out").default(false))
                    .foreign_key(
                        ForeignKey::create()
                            .name("events_merchant_fk")
                            .from("events", "merchant_id")
                            .to("merchants", "id"),
                    )
                    .to_owned(),
            )
            .await?;
        // `GET /v1/eventos`: a merchant's events by id (the cursor).
        manager
            .create_index(
                Index::create()
                    .name("events_merchant_id_idx")
                    .table("events")
                    .col("merchant_id")
                    .col("id")
                    .if_not_exists()
                    .to_owned(),
            )
            .await?;
        // One event per step of a subject: a second write of one transition is refused.
        manager
            .create_index(
                Index::create()
                    .name("events_subject_sequence_key")
                    .table("events")
                    .col("subject_id")
                    .col("sequence")
                    .unique()
                    .if_not_exists()
                    .to_owned(),
            )
            .await?;
        // The worker's fan-out scan: few rows are not fanned out.
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
            .create_table(
                Table::create()
                    .table("webhook_endpoints")
                    .if_not_exists()
                    .col(uuid("id").primary_key())
                    .col(uuid("merchant_id"))
                    .col(string_len("url", 2048))
                    // Comma-separated event types; NULL: every type.
                    .col(text_null("event_types"))
                    .col(string_len("secret", 128))
                    .col(string_len_null("previous_secret", 128))
                    .col(timestamp_with_time_zone_null("previous_secret_until"))
                    .col(string_len("state", 20))
                    // The first failure after the last success (None: the last attempt
                    // succeeded, or there was none).
                    .col(timestamp_with_time_zone_null("failing_since"))
                    .col(text_null("disabled_reason"))
                    .col(timestamp_with_time_zone("created_at"))
                    .col(timestamp_with_time_zone("updated_at"))
                    .foreign_key(
                        ForeignKey::create()
                            .name("webhook_endpoints_merchant_fk")
                            .from("webhook_endpoints", "merchant_id")
                            .to("merchants", "id"),
                    )
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("webhook_endpoints_merchant_idx")
                    .table("webhook_endpoints")
                    .col("merchant_id")
                    .if_not_exists()
                    .to_owned(),
            )
            .await?;

        manager
            .create_table(
                Table::create()
                    .table("webhook_deliveries")
                    .if_not_exists()
                    .col(string_len("event_id", 40))
                    .col(uuid("endpoint_id"))
                    .col(uuid("merchant_id"))
                    // PENDIENTE, ENTREGADA, ABANDONADA (the schedule ran out).
                    .col(string_len("state", 20))
                    .col(integer("attempts").default(0))
                    // When the next attempt is due; a worker that claims the delivery
                    // moves it past its attempt, so nobody else takes it meanwhile.
                    .col(timestamp_with_time_zone("next_attempt_at"))
                    .col(timestamp_with_time_zone_null("delivered_at"))
                    .col(timestamp_with_time_zone("created_at"))
                    .col(timestamp_with_time_zone("updated_at"))
                    .primary_key(
                        Index::create()
                            .name("webhook_deliveries_pkey")
                            .col("event_id")
                            .col("endpoint_id"),
                    )
                    .foreign_key(
                        ForeignKey::create()
                            .name("webhook_deliveries_event_fk")
                            .from("webhook_deliveries", "event_id")
                            .to("events", "id"),
                    )
                    .foreign_key(
                        ForeignKey::create()
                            .name("webhook_deliveries_endpoint_fk")
                            .from("webhook_deliveries", "endpoint_id")
                            .to("webhook_endpoints", "id")
                            .on_delete(ForeignKeyAction::Cascade),
                    )
                    .to_owned(),
            )
            .await?;
        // The worker's claim: pending deliveries, due first.
        manager
            .create_index(
                Index::create()
                    .name("webhook_deliveries_due_idx")
                    .table("webhook_deliveries")
                    .col("state")
                    .col("next_attempt_at")
                    .if_not_exists()
                    .to_owned(),
            )
            .await?;
        // Reactivation and the endpoint's pending deliveries.
        manager
            .create_index(
                Index::create()
                    .name("webhook_deliveries_endpoint_idx")
                    .table("webhook_deliveries")
                    .col("endpoint_id")
                    .col("state")
                    .if_not_exists()
                    .to_owned(),
            )
            .await?;

        manager
            .create_table(
                Table::create()
                    .table("webhook_attempts")
                    .if_not_exists()
                    .col(uuid("id").primary_key())
                    .col(string_len("event_id", 40))
                    .col(uuid("endpoint_id"))
                    .col(integer("number"))
                    .col(timestamp_with_time_zone("attempted_at"))
                    .col(integer_null("status"))
                    .col(big_integer("latency_ms"))
                    .col(text("answer"))
                    .col(text_null("error"))
                    .col(string_len("outcome", 20))
                    .foreign_key(
                        ForeignKey::create()
                            .name("webhook_attempts_endpoint_fk")
                            .from("webhook_attempts", "endpoint_id")
                            .to("webhook_endpoints", "id")
                            .on_delete(ForeignKeyAction::Cascade),
                    )
                    .to_owned(),
            )
            .await?;
        // A delivery's attempts; one number per attempt of a delivery.
        manager
            .create_index(
                Index::create()
                    .name("webhook_attempts_delivery_key")
                    .table("webhook_attempts")
                    .col("event_id")
                    .col("endpoint_id")
                    .col("number")
                    .unique()
                    .if_not_exists()
                    .to_owned(),
            )
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for table in [
            "webhook_attempts",
            "webhook_deliveries",
            "webhook_endpoints",
            "events",
        ] {
            manager
                .drop_table(Table::drop().table(table).if_exists().to_owned())
                .await?;
        }
        Ok(())
    }
}
