//! An endpoint's deliveries by state and due time: `webhook_deliveries (endpoint_id,
//! state, next_attempt_at)`, in place of `(endpoint_id, state)`.
//!
//! The delivery worker's claim takes, for each `ACTIVO` endpoint, its oldest due
//! `PENDIENTE` deliveries up to its room (`PER_ENDPOINT` less its attempts in flight), so
//! one endpoint's backlog never fills a claim that another merchant's delivery waits
//! behind. Each endpoint's part is then a short read of this index, whatever its backlog.
//! The old index is a prefix of this one: everything that used it (reactivation, removing
//! an endpoint) uses this one.
//!
//! `CONCURRENTLY` on PostgreSQL, outside a transaction; an INVALID index left by an
//! interrupted build is built again. Plainly on SQLite. Every statement can run again.

use crate::concurrently;
use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

const OLD_INDEX: &str = "webhook_deliveries_endpoint_idx";
const INDEX: &str = "webhook_deliveries_endpoint_due_idx";

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
            "webhook_deliveries",
            r#""endpoint_id", "state", "next_attempt_at""#,
        )
        .await?;
        concurrently::drop_index(manager, OLD_INDEX).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        concurrently::create_index(
            manager,
            OLD_INDEX,
            "webhook_deliveries",
            r#""endpoint_id", "state""#,
        )
        .await?;
        concurrently::drop_index(manager, INDEX).await
    }
}
