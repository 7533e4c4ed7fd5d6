//! A delivery sent again (an endpoint reactivated with redelivery) starts its schedule
//! over while its attempts keep their numbers: `round_start` is the number of attempts it
//! had when the current round began, so the schedule counts from there.

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
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
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
