//! `refunds.last_event_sequence`: the highest `sequence` of a gateway refund event applied
//! to the refund (the third strategy of at-least-once consumers: an event at or below it
//! is stale and changes nothing). NULL until the first event. Older binaries ignore it.

use crate::columns;
use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        columns::add(
            manager,
            "refunds",
            vec![big_integer_null("last_event_sequence")],
        )
        .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        columns::drop(manager, "refunds", &["last_event_sequence"]).await
    }
}
