//! Two changes that keep the create path as fast as before the outbox.
//!
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
//! On PostgreSQL, the events' foreign key to `merchants` goes: its check locked the
//! merchant's row (`FOR KEY SHARE`) once more in every payment's final statement, and with
//! many payments of one merchant finishing at once those locks are shared by several
//! transactions, which PostgreSQL keeps in multixacts — a cost on the create path. An
//! event's merchant is its payment's (or refund's), whose own foreign key already holds,
//! and merchants are never deleted. SQLite keeps it (it cannot drop a foreign key without
//! rebuilding the table, and has one writer anyway).

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::DbBackend;

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
        if manager.get_database_backend() == DbBackend::Postgres {
            manager
                .create_foreign_key(
                    ForeignKey::create()
                        .name("events_merchant_fk")
                        .from("events", "merchant_id")
                        .to("merchants", "id")
                        .to_owned(),
                )
                .await?;
        }
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
