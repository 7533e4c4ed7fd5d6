//! A webhook endpoint keeps a second replaced secret: `older_secret`, signing until
//! `older_secret_until`.
//!
//! A secret goes on signing for 24 h after a rotation replaces it, whatever rotations
//! follow. With one `previous_secret` a second rotation within those 24 h overwrote it,
//! and the first secret stopped signing at once: a merchant who rotated, lost the answer
//! (a secret is shown once) and rotated again still verified with it, and every delivery
//! failed its signature check. Now a rotation moves a previous secret still within its
//! 24 h here; a third rotation within 24 h drops the oldest.
//!
//! Both columns are nullable and new: nothing is rewritten, and a process built before
//! this migration keeps working (it never names them, and signs with the current and the
//! previous secret as before).

use crate::columns;
use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

const TABLE: &str = "webhook_endpoints";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        columns::add(
            manager,
            TABLE,
            vec![
                string_len_null("older_secret", 128),
                timestamp_with_time_zone_null("older_secret_until"),
            ],
        )
        .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        columns::drop(manager, TABLE, &["older_secret_until", "older_secret"]).await
    }
}
