//! Two columns on `payments`, for two rules of the money path:
//!
//! - `generation`: how many earlier payments of this merchant used the same client key
//!   (0 the first time). The payment's id and gateway key are derived from it
//!   (`idempotency::derive`), so a client key reused after the reaper purged it gets a
//!   gateway key no gateway remembers. Existing payments are generation 0: that is the
//!   gateway key they were sent with. The index finds a key's payments (and so its next
//!   generation) without a scan.
//! - `claimed_until`: while in the future, one worker (a request, a reconciliation pass,
//!   on-call's "reconcile now") owns the payment and nobody else may send it. NULL when
//!   nobody holds it. Older binaries ignore both columns.

use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

const INDEX: &str = "payments_merchant_key_idx";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // One column per statement: SQLite alters one thing at a time.
        manager
            .alter_table(
                Table::alter()
                    .table("payments")
                    .add_column(integer("generation").default(0))
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table("payments")
                    .add_column(timestamp_with_time_zone_null("claimed_until"))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name(INDEX)
                    .table("payments")
                    .col("merchant_id")
                    .col("idempotency_key")
                    .col("generation")
                    .if_not_exists()
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_index(
                Index::drop()
                    .name(INDEX)
                    .table("payments")
                    .if_exists()
                    .to_owned(),
            )
            .await?;
        for column in ["claimed_until", "generation"] {
            manager
                .alter_table(
                    Table::alter()
                        .table("payments")
                        .drop_column(column)
                        .to_owned(),
                )
                .await?;
        }
        Ok(())
    }
}
