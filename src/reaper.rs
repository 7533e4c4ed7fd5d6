//! The reaper: deletes idempotency keys past their retention whose payment is final, and
//! processed webhook ids past theirs.
//!
//! It never deletes a key whose answer is not frozen or whose payment is still in flight:
//! that key is what stops a retry from making a second payment. A key reused after it
//! was purged makes a new payment (documented in the README).

use crate::app::App;
use crate::entities::{idempotency_key as keys, payment};
use crate::saga::state::PaymentState;
use crate::saga::store::{KEY_COMPLETED, chrono_after};
use sea_orm::sea_query::Query;
use sea_orm::{ColumnTrait, DbErr, EntityTrait, QueryFilter};

/// Deletes expired keys of final payments; returns how many.
pub async fn purge_keys(
    db: &sea_orm::DatabaseConnection,
    older_than: chrono::DateTime<chrono::Utc>,
) -> Result<u64, DbErr> {
    let final_payments = Query::select()
        .column(payment::Column::Id)
        .from(payment::Entity)
        .and_where(payment::Column::State.is_in([
            PaymentState::Completada.as_str(),
            PaymentState::Fallida.as_str(),
        ]))
        // Counted from the payment's last send or settlement, not the key's creation: a
        // gateway remembers a key from its first use, which may be long after the key
        // was registered (a payment sent late by the reconciler).
        .and_where(payment::Column::UpdatedAt.lt(older_than))
        .to_owned();
    let deleted = keys::Entity::delete_many()
        .filter(keys::Column::CreatedAt.lt(older_than))
        .filter(keys::Column::Status.eq(KEY_COMPLETED))
        .filter(keys::Column::PaymentId.in_subquery(final_payments))
        .exec(db)
        .await?;
    Ok(deleted.rows_affected)
}

/// Deletes expired idempotency keys of final payments and webhook ids past their
/// retention (a redelivery after that is still stopped by the per-charge sequence).
pub async fn run(app: &App) -> Result<(), DbErr> {
    let now = crate::db::now();
    let purged = purge_keys(&app.db, now - chrono_after(app.settings.key_retention)).await?;
    if purged > 0 {
        app.metrics.keys_purged.inc_by(purged);
        tracing::info!(purged, "idempotency keys past retention deleted");
    }
    let messages = crate::webhooks::purge_processed_messages(
        &app.db,
        now - chrono_after(app.settings.message_retention),
    )
    .await?;
    if messages > 0 {
        tracing::info!(
            purged = messages,
            "processed webhook ids past retention deleted"
        );
    }
    Ok(())
}
