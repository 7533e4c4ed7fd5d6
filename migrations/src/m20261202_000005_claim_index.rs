//! The reconciler's claim as an ordered index scan: unsettled payments by due time.
//!
//! The claim asks for the oldest due payments among EN_PROCESO and ENVIADA, `LIMIT n FOR
//! UPDATE SKIP LOCKED`. Over `payments_due_idx (state, next_attempt_at)` PostgreSQL must
//! fetch every due row of both states and sort them all before locking the first n
//! (measured: 18 ms per claim with 10,000 due payments, claims of 32 at a time). This
//! partial index holds only unsettled payments, in due order, so a claim reads about n
//! entries; settled payments leave it, so it stays as small as the backlog. Its predicate
//! is the claim query's own, written with the same literals (`saga::store::reconcilable`).

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

const INDEX: &str = "payments_unsettled_due_idx";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_index(
                Index::create()
                    .name(INDEX)
                    .table("payments")
                    .col("next_attempt_at")
                    .and_where(Expr::col("state").is_in(["EN_PROCESO", "ENVIADA"]))
                    .if_not_exists()
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_index(
                Index::drop()
                    .name(INDEX)
                    .table("payments")
                    .if_exists()
                    .to_owned(),
            )
            .await
    }
}
