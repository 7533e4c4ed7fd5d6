//! What the gateways' webhooks reported, by age: `webhook_charges (updated_at)` and
//! `webhook_refunds (updated_at)`, for the reaper's purge of reports past their retention
//! (`webhooks::purge_charge_reports`, `purge_refund_reports`).
//!
//! The purge deletes in batches, the oldest report first, through these indexes: the rows
//! a batch deleted are skipped by the next one's index scan, where a scan of the table
//! would read them again until they are vacuumed (as the key purge does through
//! `idempotency_keys (created_at)`). Every event applied moves its row's `updated_at`, so
//! these are written once more per event; nothing else changes.
//!
//! The tables hold one row per charge or refund the gateways ever reported: `CONCURRENTLY`
//! on PostgreSQL, outside a transaction, so webhooks keep being applied while they are
//! built; an INVALID index left by an interrupted build is built again. Plainly on SQLite.
//! Every statement can run again.

use crate::concurrently;
use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

const INDEXES: [(&str, &str); 2] = [
    ("webhook_charges_updated_idx", "webhook_charges"),
    ("webhook_refunds_updated_idx", "webhook_refunds"),
];

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    /// No transaction: `CREATE INDEX CONCURRENTLY` cannot run in one (module docs).
    fn use_transaction(&self) -> Option<bool> {
        Some(false)
    }

    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for (index, table) in INDEXES {
            concurrently::create_index(manager, index, table, r#""updated_at""#).await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for (index, _) in INDEXES {
            concurrently::drop_index(manager, index).await?;
        }
        Ok(())
    }
}
