//! Currency codes the gateways' webhooks reported, in upper case: `webhook_charges` and
//! `webhook_refunds`.
//!
//! pagos compares a reported charge or refund with its payment by amount and currency, and
//! writes codes in upper case (`COP`). A gateway that writes them as Stripe's API does
//! (`cop`) had its reports stored as sent, before gateway answers were read in upper case;
//! such a report did not count as its payment's charge or refund (on-call's resolution, a
//! refund's settlement from its report). This writes the stored codes as pagos reads them
//! now. Only rows whose code is not already upper case are written; every statement can
//! run again.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

const TABLES: [&str; 2] = ["webhook_charges", "webhook_refunds"];

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        for table in TABLES {
            db.execute_unprepared(&format!(
                r#"UPDATE "{table}" SET "currency" = UPPER("currency") WHERE "currency" <> UPPER("currency")"#
            ))
            .await?;
        }
        Ok(())
    }

    /// Nothing to undo: upper case is what every pagos since reads and writes.
    async fn down(&self, _manager: &SchemaManager) -> Result<(), DbErr> {
        Ok(())
    }
}
