//! `claimed_until` on `webhook_deliveries`: until when a delivery worker holds the
//! delivery (its attempt in flight), written by the claim and cleared when the attempt is
//! stored. A claim used to be only `next_attempt_at` moved past the attempt, which
//! anything that reschedules the delivery erases: reactivating a `DESACTIVADO` endpoint
//! made every pending delivery due now, one in flight included, and another worker sent
//! that attempt again. Claims now skip a delivery whose `claimed_until` has not run out,
//! whatever its `next_attempt_at` says.
//!
//! No index change: the claim still reads each endpoint's due deliveries in order from
//! `webhook_deliveries_endpoint_due_idx`, and a delivery held but due again (rescheduled
//! while in flight) is one of the attempts in flight, a handful at most per endpoint.
//!
//! Nullable, with no default: older binaries, which name their columns, write and read
//! deliveries as before. Their claims neither write nor check it; a delivery one of them
//! stores keeps a claim of a newer process until it runs out.

use crate::columns;
use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        columns::add(
            manager,
            "webhook_deliveries",
            vec![timestamp_with_time_zone_null("claimed_until")],
        )
        .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        columns::drop(manager, "webhook_deliveries", &["claimed_until"]).await
    }
}
