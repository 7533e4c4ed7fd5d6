//! Reports of a charge on-call's `FALLIDA` resolution recorded, made final.
//!
//! A `FALLIDA` resolution records every succeeded charge it weighed in `webhook_charges`
//! (`last_event_id` `resolution`), so that the provider's later report of the charge
//! neither refunds it again nor reopens the payment. They were written at sequence 0,
//! which any event of the charge overtook: a late `pending` event moved the record, and
//! the charge's next `succeeded` event was then taken for a new orphan charge. pagos now
//! writes them above every event's sequence; this does the same to those written before
//! and not overtaken since. Every statement can run again.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .get_connection()
            .execute_unprepared(&format!(
                r#"UPDATE "webhook_charges" SET "last_sequence" = {} WHERE "last_event_id" = 'resolution' AND "status" = 'succeeded'"#,
                i64::MAX
            ))
            .await?;
        Ok(())
    }

    /// Nothing to undo: an older pagos reads the sequence as any other.
    async fn down(&self, _manager: &SchemaManager) -> Result<(), DbErr> {
        Ok(())
    }
}
