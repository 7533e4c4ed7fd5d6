//! The reaper: a worker that deletes idempotency keys past their retention whose payment
//! is final, and processed webhook ids past theirs. It gets exactly what it uses
//! (`Reaper`), never the application, and imports no other worker nor the HTTP surface.
//!
//! It never deletes a key whose answer is not frozen or whose payment is still in flight:
//! that key is what stops a retry from making a second payment. A key reused after it
//! was purged makes a new payment (documented in the README).

use crate::entities::idempotency_key::KeyStatus;
use crate::entities::{idempotency_key as keys, payment};
use crate::metrics::Metrics;
use crate::saga::state::PaymentState;
use crate::saga::store::chrono_after;
use sea_orm::sea_query::Query;
use sea_orm::{ColumnTrait, DatabaseConnection, DbErr, EntityTrait, QueryFilter};
use std::sync::Arc;
use std::time::Duration;

/// Exactly what the reaper uses.
#[derive(Clone)]
pub struct Reaper {
    pub db: DatabaseConnection,
    pub metrics: Arc<Metrics>,
    /// `PAGOS_KEY_RETENTION`.
    pub key_retention: Duration,
    /// `PAGOS_MESSAGE_RETENTION`.
    pub message_retention: Duration,
}

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
        .filter(keys::Column::Status.eq(KeyStatus::Completed))
        .filter(keys::Column::PaymentId.in_subquery(final_payments))
        .exec(db)
        .await?;
    Ok(deleted.rows_affected)
}

/// Deletes expired idempotency keys of final payments and webhook ids past their
/// retention (a redelivery after that is still stopped by the per-charge sequence).
pub async fn run(reaper: &Reaper) -> Result<(), DbErr> {
    let now = crate::db::now();
    let purged = purge_keys(&reaper.db, now - chrono_after(reaper.key_retention)).await?;
    if purged > 0 {
        reaper.metrics.keys_purged.inc_by(purged);
        tracing::info!(purged, "idempotency keys past retention deleted");
    }
    let messages = crate::webhooks::purge_processed_messages(
        &reaper.db,
        now - chrono_after(reaper.message_retention),
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

/// How often the reaper runs beside a reconciler that passes every `reconcile_every`:
/// about once a minute (it needs no hurry), and never more often than a pass.
pub fn period(reconcile_every: Duration) -> Duration {
    let passes = (60_000 / reconcile_every.as_millis().max(1)).max(1);
    reconcile_every.saturating_mul(u32::try_from(passes).unwrap_or(u32::MAX))
}

/// Reaps every `every`, the first at once, until `stop` fires.
pub async fn run_periodically(
    reaper: Reaper,
    every: Duration,
    stop: tokio::sync::watch::Receiver<bool>,
) {
    crate::signals::every(every, stop, || async {
        if let Err(err) = run(&reaper).await {
            tracing::error!(error = %err, "key reaper failed; retrying later");
        }
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reaper_runs_about_once_a_minute_and_never_more_often_than_a_pass() {
        assert_eq!(period(Duration::from_secs(10)), Duration::from_secs(60));
        assert_eq!(period(Duration::from_secs(7)), Duration::from_secs(56));
        assert_eq!(period(Duration::from_secs(300)), Duration::from_secs(300));
        assert_eq!(period(Duration::from_millis(1)), Duration::from_secs(60));
    }
}
