//! Refunds, the saga's compensating step (contract section 6): the `refunds` table, one row
//! per refund with its own idempotency key, and `refund_transitions`, its audit trail.
//!
//! A refund's key lives on its row, in a key space of its own: (merchant, scope, key) is
//! unique, where the scope tells a merchant's key (`merchant`) from on-call's (`admin`)
//! and pagos' own compensation of an orphan charge (`orphan`). The same string used for a
//! payment and for a refund names two different things. Frozen answers are `text`, as the
//! payments' are, so a replay returns the original bytes.

use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table("refunds")
                    .if_not_exists()
                    .col(pk_uuid("id"))
                    .col(uuid("payment_id"))
                    .col(uuid("merchant_id"))
                    .col(string_len("key_scope", 20))
                    .col(string_len("idempotency_key", 255))
                    .col(char_len("fingerprint", 64))
                    .col(string_len("key_status", 20))
                    .col(integer_null("response_code"))
                    .col(text_null("response_body"))
                    .col(timestamp_with_time_zone_null("lease_until"))
                    .col(string_len("charge_ref", 255))
                    .col(big_integer("amount"))
                    .col(char_len("currency", 3))
                    .col(string_len_null("reason", 255))
                    .col(string_len_null("requested_by", 200))
                    .col(string_len("state", 20))
                    .col(big_integer("version"))
                    .col(integer("attempts"))
                    .col(string_len("gateway_key", 255))
                    .col(string_len_null("gateway_ref", 255))
                    .col(string_len_null("failure_code", 100))
                    .col(timestamp_with_time_zone("next_attempt_at"))
                    .col(timestamp_with_time_zone_null("claimed_until"))
                    .col(timestamp_with_time_zone("created_at"))
                    .col(timestamp_with_time_zone("updated_at"))
                    .foreign_key(
                        ForeignKey::create()
                            .name("refunds_payment_fk")
                            .from("refunds", "payment_id")
                            .to("payments", "id"),
                    )
                    .to_owned(),
            )
            .await?;
        // The key space: a retry finds its refund, a race on one key has one winner.
        manager
            .create_index(
                Index::create()
                    .name("refunds_key_idx")
                    .table("refunds")
                    .col("merchant_id")
                    .col("key_scope")
                    .col("idempotency_key")
                    .unique()
                    .if_not_exists()
                    .to_owned(),
            )
            .await?;
        // A payment's refunds: what is left of it, its listing.
        manager
            .create_index(
                Index::create()
                    .name("refunds_payment_idx")
                    .table("refunds")
                    .col("payment_id")
                    .if_not_exists()
                    .to_owned(),
            )
            .await?;
        // The reconciler's scan, as the payments'.
        manager
            .create_index(
                Index::create()
                    .name("refunds_due_idx")
                    .table("refunds")
                    .col("state")
                    .col("next_attempt_at")
                    .if_not_exists()
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table("refund_transitions")
                    .if_not_exists()
                    .col(pk_uuid("id"))
                    .col(uuid("refund_id"))
                    .col(string_len_null("from_state", 20))
                    .col(string_len("to_state", 20))
                    .col(string_len("actor", 20))
                    .col(text("reason"))
                    .col(timestamp_with_time_zone("created_at"))
                    .foreign_key(
                        ForeignKey::create()
                            .name("refund_transitions_refund_fk")
                            .from("refund_transitions", "refund_id")
                            .to("refunds", "id"),
                    )
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("refund_transitions_refund_idx")
                    .table("refund_transitions")
                    .col("refund_id")
                    .if_not_exists()
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for table in ["refund_transitions", "refunds"] {
            manager
                .drop_table(Table::drop().table(table).if_exists().to_owned())
                .await?;
        }
        Ok(())
    }
}
