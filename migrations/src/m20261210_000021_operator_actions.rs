//! On-call's actions that leave no audit row of their own naming who asked (contract
//! section 8: the audit trail records the operator's name for every action): "reconcile
//! now" of a payment or a refund, a pass run by hand, a webhook endpoint reactivated from
//! the console. The reconciler's and the endpoint's rows say what was done; this says who
//! asked, when, and what came of it.
//!
//! A row is written before the work and completed (`finished_at`, `detail`) when it ends,
//! so a process that stops halfway still leaves who asked. Read newest first (`at`), and
//! by what was acted on (`target`: a payment, a refund, an endpoint; none for a pass).
//! A new table: nothing an older binary reads changes.

use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

const TABLE: &str = "operator_actions";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(TABLE)
                    .if_not_exists()
                    .col(uuid("id").primary_key())
                    .col(timestamp_with_time_zone("at"))
                    .col(string_len("operator", 64))
                    .col(string_len("action", 32))
                    .col(uuid_null("target"))
                    .col(text("detail"))
                    .col(timestamp_with_time_zone_null("finished_at"))
                    .to_owned(),
            )
            .await?;
        for (name, column) in [
            ("operator_actions_at_idx", "at"),
            ("operator_actions_target_idx", "target"),
        ] {
            manager
                .create_index(
                    Index::create()
                        .name(name)
                        .table(TABLE)
                        .col(column)
                        .if_not_exists()
                        .to_owned(),
                )
                .await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table(TABLE).if_exists().to_owned())
            .await
    }
}
