//! What a gateway's webhooks last told us about each of its refunds: `webhook_refunds`,
//! shaped like `webhook_charges`. A provider's search lags behind its events, so on-call's
//! resolution of a refund under review weighs what its webhooks reported too.
//!
//! A new table, empty when made: its indexes are built with it, in the migration's
//! transaction. Every statement can run again (`IF NOT EXISTS`): a rollback as README
//! describes deletes this migration's record and keeps the table. Nothing but the refund event consumer writes it; the reaper purges it
//! (from `m20261211_000025`, which indexes it by age for that).

use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // One row per refund the gateway told us about (natural key: gateway + refund id):
        // the last sequence applied and the state it reported. `refund_id` and
        // `payment_id` are null when the reference names no refund of ours.
        manager
            .create_table(
                Table::create()
                    .table("webhook_refunds")
                    .if_not_exists()
                    .col(string_len("source", 32))
                    .col(string_len("provider_refund_id", 255))
                    .col(string_len("reference", 255))
                    .col(uuid_null("refund_id"))
                    .col(uuid_null("payment_id"))
                    .col(string_len("charge_id", 255))
                    .col(string_len("status", 20))
                    .col(big_integer("amount"))
                    .col(string_len("currency", 16))
                    .col(string_len_null("failure_code", 100))
                    .col(big_integer("last_sequence"))
                    .col(string_len("last_event_id", 255))
                    .col(timestamp_with_time_zone("first_seen_at"))
                    .col(timestamp_with_time_zone("updated_at"))
                    .primary_key(
                        Index::create()
                            .name("webhook_refunds_pkey")
                            .col("source")
                            .col("provider_refund_id"),
                    )
                    .foreign_key(
                        ForeignKey::create()
                            .name("webhook_refunds_refund_fk")
                            .from("webhook_refunds", "refund_id")
                            .to("refunds", "id"),
                    )
                    .foreign_key(
                        ForeignKey::create()
                            .name("webhook_refunds_payment_fk")
                            .from("webhook_refunds", "payment_id")
                            .to("payments", "id"),
                    )
                    .to_owned(),
            )
            .await?;
        // A refund's reports (its resolution), and a payment's (its console page).
        for (name, column) in [
            ("webhook_refunds_refund_idx", "refund_id"),
            ("webhook_refunds_payment_idx", "payment_id"),
        ] {
            manager
                .create_index(
                    Index::create()
                        .name(name)
                        .table("webhook_refunds")
                        .col(column)
                        .col("first_seen_at")
                        .if_not_exists()
                        .to_owned(),
                )
                .await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(
                Table::drop()
                    .table("webhook_refunds")
                    .if_exists()
                    .to_owned(),
            )
            .await
    }
}
