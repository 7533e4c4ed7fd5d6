//! Gateway webhooks: the ids of the events already applied, and what each gateway last
//! told us about each of its charges (also where orphan charges are kept).
//!
//! Nothing here is ever updated by anything but the webhook consumer; the reaper only
//! deletes `processed_messages` rows older than the retention.

use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // Dedupe by id: one row per (gateway, event id) applied, written in the same
        // transaction as the event's effect.
        manager
            .create_table(
                Table::create()
                    .table("processed_messages")
                    .if_not_exists()
                    .col(string_len("source", 32))
                    .col(string_len("message_id", 255))
                    .col(timestamp_with_time_zone("received_at"))
                    .primary_key(
                        Index::create()
                            .name("processed_messages_pkey")
                            .col("source")
                            .col("message_id"),
                    )
                    .to_owned(),
            )
            .await?;
        // The retention purge's scan.
        manager
            .create_index(
                Index::create()
                    .name("processed_messages_received_idx")
                    .table("processed_messages")
                    .col("received_at")
                    .to_owned(),
            )
            .await?;

        // One row per charge the gateway told us about (natural key: gateway + charge
        // id): the last sequence applied and the state it reported. `payment_id` is null
        // for an orphan: a charge whose reference matches no payment of ours.
        manager
            .create_table(
                Table::create()
                    .table("webhook_charges")
                    .if_not_exists()
                    .col(string_len("source", 32))
                    .col(string_len("charge_id", 255))
                    .col(string_len("reference", 255))
                    .col(uuid_null("payment_id"))
                    .col(string_len("status", 20))
                    .col(big_integer("amount"))
                    .col(string_len("currency", 16))
                    .col(string_len_null("decline_code", 100))
                    .col(big_integer("last_sequence"))
                    .col(string_len("last_event_id", 255))
                    .col(timestamp_with_time_zone("first_seen_at"))
                    .col(timestamp_with_time_zone("updated_at"))
                    .primary_key(
                        Index::create()
                            .name("webhook_charges_pkey")
                            .col("source")
                            .col("charge_id"),
                    )
                    .foreign_key(
                        ForeignKey::create()
                            .name("webhook_charges_payment_fk")
                            .from("webhook_charges", "payment_id")
                            .to("payments", "id"),
                    )
                    .to_owned(),
            )
            .await?;
        // On-call's list of orphans (payment_id IS NULL), oldest first; and a payment's
        // charges.
        manager
            .create_index(
                Index::create()
                    .name("webhook_charges_payment_idx")
                    .table("webhook_charges")
                    .col("payment_id")
                    .col("first_seen_at")
                    .to_owned(),
            )
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for table in ["webhook_charges", "processed_messages"] {
            manager
                .drop_table(Table::drop().table(table).if_exists().to_owned())
                .await?;
        }
        Ok(())
    }
}
