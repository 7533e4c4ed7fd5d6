//! Reports of a charge on-call's `FALLIDA` resolution weighed, made final.
//!
//! A `FALLIDA` resolution records every succeeded charge it weighed in `webhook_charges`,
//! so that the provider's later report of the charge neither refunds it again nor reopens
//! the payment. pagos wrote those records at sequence 0 and only where no report was kept:
//! a `pending` report kept already stayed `pending`, a late `pending` event overtook the
//! record, and then the charge's `succeeded` event was taken for a new orphan charge and
//! refunded in full — for a charge on-call had settled outside pagos (kept by agreement,
//! money returned another way), a second refund. pagos now writes them above every
//! event's sequence, marked `resolution-overruled` where the resolution overruled the
//! provider. This does the same to what was written before:
//!
//! 1. every report of a charge that a resolution of its payment overruling the provider
//!    named (its audit row: `[overruling the provider, which showed ch_… succeeded …]`),
//!    whatever became of the report since: succeeded, final, `resolution-overruled`;
//! 2. every other report the resolution recorded and no event moved since: final.
//!
//! A resolution with `reembolsar` left a compensation refund of the charge, which a later
//! report finds, so its records need nothing more. Every statement can run again.
//!
//! The audit row lists every charge the provider showed, in any status (`ch_1 succeeded
//! for …, ch_2 pending for …`): only a charge listed succeeded is matched. (Its first
//! version matched the charge's id anywhere in the row, and made final as succeeded a
//! charge shown pending or declined: the customer's later payment of it was never
//! refunded. `m20261215_000029` mends what it wrote.)

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::DbBackend;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        let position = position(manager.get_database_backend());
        let last = i64::MAX;
        let shown_succeeded = shown_succeeded(position);
        db.execute_unprepared(&format!(
            r#"UPDATE "webhook_charges"
SET "status" = 'succeeded', "decline_code" = NULL, "last_sequence" = {last},
    "last_event_id" = 'resolution-overruled'
WHERE "payment_id" IS NOT NULL AND EXISTS (
  SELECT 1 FROM "payment_transitions" AS "t"
  WHERE "t"."payment_id" = "webhook_charges"."payment_id"
    AND "t"."actor" = 'admin' AND "t"."to_state" = 'FALLIDA'
    AND "t"."reason" LIKE '%[overruling the provider, which showed %'
    AND {shown_succeeded})"#
        ))
        .await?;
        db.execute_unprepared(&format!(
            r#"UPDATE "webhook_charges" SET "last_sequence" = {last} WHERE "last_event_id" = 'resolution' AND "status" = 'succeeded'"#
        ))
        .await?;
        Ok(())
    }

    /// Nothing to undo: an older pagos reads the sequence as any other.
    async fn down(&self, _manager: &SchemaManager) -> Result<(), DbErr> {
        Ok(())
    }
}

/// The backend's function of where one text stands in another (0: nowhere).
pub(crate) fn position(backend: DbBackend) -> &'static str {
    match backend {
        DbBackend::Sqlite => "instr",
        _ => "strpos",
    }
}

/// SQL: audit row `"t"."reason"` lists the report's charge as the provider showed it
/// succeeded (`showed ch_1 succeeded for …` or `…, ch_1 succeeded for …`), with `position`
/// the backend's `strpos`/`instr`.
pub(crate) fn shown_succeeded(position: &str) -> String {
    let listed = |before: &str| {
        format!(
            r#"{position}("t"."reason", '{before}' || "webhook_charges"."charge_id" || ' succeeded for ') > 0"#
        )
    };
    format!("({} OR {})", listed("showed "), listed(", "))
}
