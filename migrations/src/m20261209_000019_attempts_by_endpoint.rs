//! An endpoint's attempts by time: `webhook_attempts (endpoint_id, attempted_at)`.
//!
//! Attempts are never purged. The console's webhooks page reads each troubled endpoint's
//! last attempts (`WHERE endpoint_id = … ORDER BY attempted_at DESC LIMIT 5`) and removing
//! an endpoint deletes its attempts; with no index led by `endpoint_id`, both read every
//! attempt ever stored.
//!
//! Built `CONCURRENTLY` on PostgreSQL, so outside a transaction (an index build over a
//! large table must not stall the delivery worker's writes); an INVALID index left by an
//! interrupted build is built again. Plainly on SQLite. Every statement can run again.

use crate::concurrently;
use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

const INDEX: &str = "webhook_attempts_endpoint_idx";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    /// No transaction: `CREATE INDEX CONCURRENTLY` cannot run in one (module docs).
    fn use_transaction(&self) -> Option<bool> {
        Some(false)
    }

    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        concurrently::create_index(
            manager,
            INDEX,
            "webhook_attempts",
            r#""endpoint_id", "attempted_at""#,
        )
        .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        concurrently::drop_index(manager, INDEX).await
    }
}
