//! The first schema: merchants, idempotency keys, payments and their audit trail.
//!
//! Stored answers are `text`, not `jsonb`: PostgreSQL would re-format a `jsonb` value and
//! replays must return the original bytes.

use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table("merchants")
                    .if_not_exists()
                    .col(pk_uuid("id"))
                    .col(string_len("name", 200))
                    .col(string_len_uniq("api_key_hash", 64))
                    .col(timestamp_with_time_zone("created_at"))
                    .to_owned(),
            )
            .await?;

        manager
            .create_table(
                Table::create()
                    .table("payments")
                    .if_not_exists()
                    .col(pk_uuid("id"))
                    .col(uuid("merchant_id"))
                    .col(string_len("idempotency_key", 255))
                    .col(string_len("credit_id", 64))
                    .col(big_integer("amount"))
                    .col(char_len("currency", 3))
                    .col(string_len_null("description", 255))
                    .col(string_len("state", 20))
                    .col(big_integer("version"))
                    .col(integer("attempts"))
                    .col(string_len("gateway_key", 255))
                    .col(string_len_null("gateway_ref", 255))
                    .col(string_len_null("decline_code", 100))
                    .col(timestamp_with_time_zone("next_attempt_at"))
                    .col(timestamp_with_time_zone("created_at"))
                    .col(timestamp_with_time_zone("updated_at"))
                    .foreign_key(
                        ForeignKey::create()
                            .name("payments_merchant_fk")
                            .from("payments", "merchant_id")
                            .to("merchants", "id"),
                    )
                    .to_owned(),
            )
            .await?;
        // The reconciler's scan: non-terminal payments ordered by when they are due.
        manager
            .create_index(
                Index::create()
                    .name("payments_due_idx")
                    .table("payments")
                    .col("state")
                    .col("next_attempt_at")
                    .to_owned(),
            )
            .await?;

        manager
            .create_table(
                Table::create()
                    .table("idempotency_keys")
                    .if_not_exists()
                    .col(uuid("merchant_id"))
                    .col(string_len("key", 255))
                    .col(char_len("fingerprint", 64))
                    .col(uuid("payment_id"))
                    .col(string_len("status", 20))
                    .col(integer_null("response_code"))
                    .col(text_null("response_body"))
                    .col(timestamp_with_time_zone_null("lease_until"))
                    .col(timestamp_with_time_zone("created_at"))
                    .col(timestamp_with_time_zone("updated_at"))
                    .primary_key(
                        Index::create()
                            .name("idempotency_keys_pkey")
                            .col("merchant_id")
                            .col("key"),
                    )
                    .foreign_key(
                        ForeignKey::create()
                            .name("idempotency_keys_payment_fk")
                            .from("idempotency_keys", "payment_id")
                            .to("payments", "id"),
                    )
                    .to_owned(),
            )
            .await?;
        // The reaper's scan: oldest keys first.
        manager
            .create_index(
                Index::create()
                    .name("idempotency_keys_created_idx")
                    .table("idempotency_keys")
                    .col("created_at")
                    .to_owned(),
            )
            .await?;

        manager
            .create_table(
                Table::create()
                    .table("payment_transitions")
                    .if_not_exists()
                    .col(pk_uuid("id"))
                    .col(uuid("payment_id"))
                    .col(string_len_null("from_state", 20))
                    .col(string_len("to_state", 20))
                    .col(string_len("actor", 20))
                    .col(text("reason"))
                    .col(timestamp_with_time_zone("created_at"))
                    .foreign_key(
                        ForeignKey::create()
                            .name("payment_transitions_payment_fk")
                            .from("payment_transitions", "payment_id")
                            .to("payments", "id"),
                    )
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("payment_transitions_payment_idx")
                    .table("payment_transitions")
                    .col("payment_id")
                    .col("created_at")
                    .to_owned(),
            )
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for table in [
            "payment_transitions",
            "idempotency_keys",
            "payments",
            "merchants",
        ] {
            manager
                .drop_table(Table::drop().table(table).if_exists().to_owned())
                .await?;
        }
        Ok(())
    }
}
