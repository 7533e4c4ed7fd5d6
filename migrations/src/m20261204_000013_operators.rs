//! Operators: the people of on-call, each with a token of their own (`op_…`, only its
//! SHA-256 stored) and a role (`lector` reads, `operador` also acts), so the admin API and
//! the console know who did what. `PAGOS_ADMIN_TOKEN` stays as the break-glass token.
//!
//! A revoked operator keeps its row (`revoked_at` set): the audit trail names it.

use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

const TABLE: &str = "operators";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(TABLE)
                    .if_not_exists()
                    .col(uuid("id").primary_key())
                    .col(string_len("name", 64))
                    .col(string_len("role", 16))
                    .col(string_len("token_hash", 64))
                    .col(timestamp_with_time_zone("created_at"))
                    .col(timestamp_with_time_zone_null("revoked_at"))
                    .to_owned(),
            )
            .await?;
        for (name, column) in [
            ("operators_name_key", "name"),
            ("operators_token_hash_key", "token_hash"),
        ] {
            manager
                .create_index(
                    Index::create()
                        .name(name)
                        .table(TABLE)
                        .col(column)
                        .unique()
                        .if_not_exists()
                        .to_owned(),
                )
                .await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table(TABLE).if_exists().to_owned())
            .await
    }
}
