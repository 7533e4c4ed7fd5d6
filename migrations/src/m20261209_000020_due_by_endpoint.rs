//! An endpoint's deliveries by state and due time: `webhook_deliveries (endpoint_id,
//! state, next_attempt_at, event_id)`, in place of `(endpoint_id, state)`.
//!
//! The delivery worker's claim takes, for each `ACTIVO` endpoint, its oldest due
//! `PENDIENTE` deliveries up to its room (`PER_ENDPOINT` less its attempts in flight), so
//! one endpoint's backlog never fills a claim that another merchant's delivery waits
//! behind. Each endpoint's part is then a short read of this index, whatever its backlog,
//! in the claim's order `(next_attempt_at, event_id)`: with `event_id` in it, PostgreSQL
//! has no cheaper-looking way to that order. Without it, the planner could take
//! `webhook_deliveries_due_idx (state, next_attempt_at)` and filter by endpoint, reading
//! a whole backlog of another endpoint's due rows before the first of this one's (20 ms
//! a claim behind 100,000 due rows, against 0.1 ms).
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
            r#""endpoint_id", "state", "next_attempt_at", "event_id""#,
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
