//! On PostgreSQL, the events' foreign key to `merchants` (`events_merchant_fk`) goes, as
//! `m20261205_000014` said it would but never did.
//!
//! Its check locked the merchant's row (`FOR KEY SHARE`) once more in every payment's
//! final statement, and with many payments of one merchant finishing at once those locks
//! are shared by several transactions, which PostgreSQL keeps in multixacts — a cost on the
//! create path. Nothing relies on it: an event's merchant is its payment's, whose own
//! foreign key holds, or the merchant that asked for the refund (authenticated, so
//! existing); and merchants are never deleted.
//!
//! Dropped `IF EXISTS`, so it can run again (README's rollback to a release built before
//! `m20261208_000018` deletes this record too). The `ALTER TABLE` reads and rewrites no
//! row: it waits for the transactions writing `events` at that moment, then holds
//! `events` and `merchants` for an instant. Releases built before it keep
//! working without the key: none of them relies on it either.
//!
//! SQLite keeps it: it cannot drop a foreign key without rebuilding the table, and with its
//! one writer at a time there is no lock of the merchant's row to share.

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::DbBackend;

#[derive(DeriveMigrationName)]
pub struct Migration;

const KEY: &str = "events_merchant_fk";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if manager.get_database_backend() == DbBackend::Postgres {
            manager
                .get_connection()
                .execute_unprepared(&format!(
                    r#"ALTER TABLE "events" DROP CONSTRAINT IF EXISTS "{KEY}""#
                ))
                .await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if manager.get_database_backend() == DbBackend::Postgres {
            manager
                .create_foreign_key(
                    ForeignKey::create()
                        .name(KEY)
                        .from("events", "merchant_id")
                        .to("merchants", "id")
                        .to_owned(),
                )
                .await?;
        }
        Ok(())
    }
}
