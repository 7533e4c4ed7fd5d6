//! `last_error` and `last_error_at` on `payments` and `refunds`: the last error of a
//! look-up or a send at the provider (a 5xx, a timeout, a refused connection) and when,
//! written with the reschedule that follows it and cleared when the row settles. The
//! console's queue and `GET /admin/pagos/{id}` show it: why a payment keeps waiting was
//! only in the logs.
//!
//! Nullable, so older binaries' writes (which name their columns) leave it alone: a row an
//! older process settles keeps its last error until a newer one writes it.

use crate::columns;
use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

const TABLES: [&str; 2] = ["payments", "refunds"];

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for table in TABLES {
            columns::add(
                manager,
                table,
                vec![
                    text_null("last_error"),
                    timestamp_with_time_zone_null("last_error_at"),
                ],
            )
            .await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for table in TABLES {
            columns::drop(manager, table, &["last_error", "last_error_at"]).await?;
        }
        Ok(())
    }
}
