//! Reports `m20261214_000028`'s first version made final wrongly, mended.
//!
//! That version made final as succeeded, settled outside pagos (`resolution-overruled`),
//! every report of a charge whose id appeared anywhere in the audit row of a `FALLIDA`
//! resolution that overruled the provider; the row lists every charge the provider showed,
//! pending and declined ones too. A charge shown pending (a voucher not paid yet) was then
//! never refunded once the customer paid it: its `succeeded` event was stale, and the
//! merchant had been told 402. pagos itself marks only the charges a resolution weighed
//! succeeded.
//!
//! So a report marked `resolution-overruled` whose charge no overruling resolution of its
//! payment lists succeeded is given back what the row says the provider showed — pending,
//! or else declined — at sequence 0, so that the charge's next event moves it: a
//! `succeeded` one is then an orphan charge of a failed payment (refunded, or on-call's,
//! by `PAGOS_ORPHAN_CHARGES`). Its decline code and event id are not known any more
//! (`last_event_id` says `resolution-unmarked`). A charge paid while the mark stood had
//! its `succeeded` event taken as stale and gets none again: runbooks/refunds.md lists
//! these rows for on-call to check at the provider. Can run again.

use sea_orm_migration::prelude::*;

use crate::m20261214_000028_resolution_reports_final::{position, shown_succeeded};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        let position = position(manager.get_database_backend());
        let overruling = r#""t"."payment_id" = "webhook_charges"."payment_id"
    AND "t"."actor" = 'admin' AND "t"."to_state" = 'FALLIDA'
    AND "t"."reason" LIKE '%[overruling the provider, which showed %'"#;
        let succeeded = shown_succeeded(position);
        let pending = format!(
            r#"({position}("t"."reason", 'showed ' || "webhook_charges"."charge_id" || ' pending for ') > 0
      OR {position}("t"."reason", ', ' || "webhook_charges"."charge_id" || ' pending for ') > 0)"#
        );
        db.execute_unprepared(&format!(
            r#"UPDATE "webhook_charges"
SET "status" = CASE WHEN EXISTS (
      SELECT 1 FROM "payment_transitions" AS "t" WHERE {overruling} AND {pending})
    THEN 'pending' ELSE 'declined' END,
    "decline_code" = NULL, "last_sequence" = 0, "last_event_id" = 'resolution-unmarked'
WHERE "last_event_id" = 'resolution-overruled' AND "payment_id" IS NOT NULL
  AND NOT EXISTS (
    SELECT 1 FROM "payment_transitions" AS "t" WHERE {overruling} AND {succeeded})"#
        ))
        .await?;
        Ok(())
    }

    /// Nothing to undo: the reports read as any event's.
    async fn down(&self, _manager: &SchemaManager) -> Result<(), DbErr> {
        Ok(())
    }
}
