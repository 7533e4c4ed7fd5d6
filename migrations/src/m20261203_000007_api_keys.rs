//! Several API keys per merchant: `api_keys`, one row per key, looked up by its SHA-256.
//!
//! Every merchant's existing key becomes its first row (created when the merchant was).
//! Only the hash was ever stored, so such a key's displayable prefix is `sha256:` and the
//! first 12 hex digits of its hash (the `key_hash` of the logs), not the key's own start.
//!
//! `merchants.api_key_hash` stays: a binary older than this migration, still running
//! during a rolling deploy, authenticates with it. pagos keeps it equal to the merchant's
//! first key until that key is revoked, and then to the hash of nothing anyone holds.

use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

const TABLE: &str = "api_keys";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(TABLE)
                    .if_not_exists()
                    .col(string_len("key_hash", 64).primary_key())
                    .col(uuid("merchant_id"))
                    .col(string_len("prefix", 32))
                    .col(timestamp_with_time_zone("created_at"))
                    .col(timestamp_with_time_zone_null("last_used_at"))
                    .col(timestamp_with_time_zone_null("expires_at"))
                    .col(timestamp_with_time_zone_null("revoked_at"))
                    .foreign_key(
                        ForeignKey::create()
                            .name("api_keys_merchant_fk")
                            .from(TABLE, "merchant_id")
                            .to("merchants", "id"),
                    )
                    .to_owned(),
            )
            .await?;
        // `pagos merchants keys revoke NAME PREFIX` names one key; also the listing's index.
        manager
            .create_index(
                Index::create()
                    .name("api_keys_merchant_prefix_key")
                    .table(TABLE)
                    .col("merchant_id")
                    .col("prefix")
                    .unique()
                    .if_not_exists()
                    .to_owned(),
            )
            .await?;
        // `||` and `substr` mean the same on PostgreSQL and SQLite.
        manager
            .get_connection()
            .execute_unprepared(
                "INSERT INTO api_keys (key_hash, merchant_id, prefix, created_at) \
                 SELECT m.api_key_hash, m.id, 'sha256:' || substr(m.api_key_hash, 1, 12), m.created_at \
                 FROM merchants m \
                 WHERE NOT EXISTS (SELECT 1 FROM api_keys k WHERE k.key_hash = m.api_key_hash)",
            )
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table(TABLE).if_exists().to_owned())
            .await
    }
}
