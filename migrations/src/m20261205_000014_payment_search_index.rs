//! The payment search's index (`GET /v1/pagos`: a merchant's payments, newest first)
//! becomes one that only the search can use.
//!
//! `payments (merchant_id, created_at)` served `merchant_id = …` alone, so PostgreSQL could
//! also plan on it the look-up that registering a payment makes (does this key have a
//! payment of this generation or a later one? `payments_merchant_key_idx` answers it in one
//! probe). Before a table's first `ANALYZE` — a new database, its first minute of traffic —
//! the two cost the same to the planner, it sometimes took the search index, and a
//! connection's prepared statement kept that plan: every create then read all the
//! merchant's payments, and create throughput halved within seconds.
//!
//! The new index is partial on a condition every payment meets (`version >= 0`), written
//! out only by the search: no other statement can use it, whatever the statistics say. It
//! also carries `id`, the search's second sort key.
//!
//! The events' foreign key to `merchants` was meant to go here on PostgreSQL, but this
//! `up` never dropped it; `m20261213_000027` does (a change here would never run on the
//! databases already past it). So this `down` leaves it alone, and that one's `down`
//! brings it back.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

const OLD: &str = "payments_merchant_created_idx";
const NEW: &str = "payments_search_idx";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_index(
                Index::create()
                    .name(NEW)
                    .table("payments")
                    .col("merchant_id")
                    .col("created_at")
                    .col("id")
                    .and_where(Expr::col("version").gte(0))
                    .if_not_exists()
                    .to_owned(),
            )
            .await?;
        manager
            .drop_index(
                Index::drop()
                    .name(OLD)
                    .table("payments")
                    .if_exists()
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_index(
                Index::create()
                    .name(OLD)
                    .table("payments")
                    .col("merchant_id")
                    .col("created_at")
                    .if_not_exists()
                    .to_owned(),
            )
            .await?;
        manager
            .drop_index(
                Index::drop()
                    .name(NEW)
                    .table("payments")
                    .if_exists()
                    .to_owned(),
            )
            .await
    }
}
