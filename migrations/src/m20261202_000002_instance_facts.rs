//! Facts about the deployment that must not change silently between runs, such as which
//! gateway this database's payments were sent through.

use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table("instance_facts")
                    .if_not_exists()
                    .col(string_len("name", 64).primary_key())
                    .col(string_len("value", 255))
                    .col(timestamp_with_time_zone("recorded_at"))
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table("instance_facts").if_exists().to_owned())
            .await
    }
}
