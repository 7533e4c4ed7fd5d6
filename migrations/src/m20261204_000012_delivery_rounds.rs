//! A delivery sent again (an endpoint reactivated with redelivery) starts its schedule
//! over while its attempts keep their numbers: `round_start` is the number of attempts it
//! had when the current round began, so the schedule counts from there.
//!
//! And the index of a merchant's payment search (`GET /v1/pagos`, newest first).

use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table("webhook_deliveries")
                    .add_column(integer("round_start").default(0))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("payments_merchant_created_idx")
                    .table("payments")
                    .col("merchant_id")
                    .col("created_at")
                    .if_not_exists()
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_index(
                Index::drop()
                    .name("payments_merchant_created_idx")
                    .table("payments")
                    .if_exists()
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table("webhook_deliveries")
                    .drop_column("round_start")
                    .to_owned(),
            )
            .await
    }
}
