//! The reaper: a worker that deletes idempotency keys past their retention whose payment
//! is final, processed webhook ids past theirs, and what the gateways' webhooks reported
//! about charges and refunds once nothing needs it. It gets exactly what it uses
//! (`Reaper`), never the application, and imports no other worker nor the HTTP surface.
//!
//! It never deletes a key whose answer is not frozen or whose payment is still in flight:
//! that key is what stops a retry from making a second payment. A key reused after it
//! was purged makes a new payment (documented in the README). It never deletes a webhook
//! report of a payment or refund that is not settled, nor of an orphan charge that may
//! have taken money (`webhooks::purge_charge_reports`, `purge_refund_reports`).
//!
//! Processes may run with different retentions (a rolling deploy that changes
//! `PAGOS_KEY_RETENTION`), and every process's replay cache must forget a key before any
//! reaper deletes it. `Retentions` records this process's retention in `instance_facts`
//! and bounds its replay cache by the smallest of the live processes'; the reaper purges
//! keys only once every process that answers from memory has read its retention
//! (`ReplayCache::may_purge`; why that is enough: `idempotency::cache`).

use crate::entities::idempotency_key::KeyStatus;
use crate::entities::{idempotency_key as keys, instance_fact as facts, payment};
use crate::idempotency::cache::ReplayCache;
use crate::metrics::Metrics;
use crate::saga::state::PaymentState;
use crate::saga::store::chrono_after;
use chrono::{DateTime, Utc};
use sea_orm::sea_query::{Expr, Order, Query};
use sea_orm::{
    ActiveValue::Set, ColumnTrait, DatabaseConnection, DbErr, EntityTrait, ExprTrait, QueryFilter,
};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Exactly what the reaper uses.
#[derive(Clone)]
pub struct Reaper {
    pub db: DatabaseConnection,
    pub metrics: Arc<Metrics>,
    /// `PAGOS_KEY_RETENTION`.
    pub key_retention: Duration,
    /// `PAGOS_MESSAGE_RETENTION`.
    pub message_retention: Duration,
    /// `PAGOS_PURGE_BATCH`: the most rows one delete statement removes.
    pub batch: u64,
    /// This process's replay cache: keys are purged only while it says so
    /// (`ReplayCache::may_purge`).
    pub cache: ReplayCache,
    /// What ages the rows: this host's wall clock, never ahead of the time elapsed since
    /// the process started.
    pub clock: SteadyClock,
}

/// The reaper's clock: this host's wall clock, but never ahead of its reading when the
/// process started plus the time elapsed since on the monotonic clock. Rows are stamped on
/// the hosts' wall clocks; one stepped forward (NTP correcting a host that booted a day
/// behind, a clock set by hand) would make every key look that much older, and a purge
/// then would forget keys inside their retention: a client's retry with such a key makes
/// a second payment, charged again. Aged on the elapsed time instead, they are purged as
/// late as the step, until the process restarts (or another process, whose clock did not
/// step, purges them). A clock stepped back is the wall clock, read as it is (the clock
/// watch stops the process).
#[derive(Clone, Copy, Debug)]
pub struct SteadyClock {
    started: Instant,
    wall: DateTime<Utc>,
}

impl SteadyClock {
    /// The clock of a process starting now.
    pub fn start() -> Self {
        SteadyClock {
            started: Instant::now(),
            wall: crate::db::now(),
        }
    }

    /// Now, and how far the wall clock has run ahead of it.
    pub fn now(&self) -> (DateTime<Utc>, chrono::TimeDelta) {
        let wall = crate::db::now();
        let steady = self.wall + chrono_after(self.started.elapsed());
        if wall > steady {
            (steady, wall - steady)
        } else {
            (wall, chrono::TimeDelta::zero())
        }
    }
}

/// The prefix of the `instance_facts` rows where each process records its retention.
pub const RETENTION_FACT: &str = "key_retention/";

/// How long a retention row is kept once its process stopped refreshing it.
const RETENTION_ROW_KEPT: chrono::TimeDelta = chrono::TimeDelta::days(1);

/// Exactly what recording this process's retention uses.
#[derive(Clone)]
pub struct Retentions {
    pub db: DatabaseConnection,
    /// This process's replay cache, bounded by what the refreshes read.
    pub cache: ReplayCache,
    /// `PAGOS_KEY_RETENTION`.
    pub retention: Duration,
    /// This process's row: `key_retention/<uuid>`.
    pub name: String,
}

impl Retentions {
    /// The process of `cache`, under its name (`ReplayCache::instance`).
    pub fn new(db: DatabaseConnection, cache: ReplayCache, retention: Duration) -> Self {
        let name = format!("{RETENTION_FACT}{}", cache.instance());
        Retentions {
            db,
            cache,
            retention,
            name,
        }
    }

    /// Records this process's retention (whole seconds), reads those of the live
    /// processes into the cache's bound, and deletes the rows of processes gone a day.
    pub async fn refresh(&self) -> Result<(), DbErr> {
        let began = Instant::now();
        let now = crate::db::now();
        facts::Entity::insert(facts::ActiveModel {
            name: Set(self.name.clone()),
            value: Set(self.retention.as_secs().to_string()),
            recorded_at: Set(now),
        })
        .on_conflict(
            sea_orm::sea_query::OnConflict::column(facts::Column::Name)
                .update_columns([facts::Column::Value, facts::Column::RecordedAt])
                .to_owned(),
        )
        .exec_without_returning(&self.db)
        .await?;
        let recorded = Instant::now();
        let live = facts::Entity::find()
            .filter(facts::Column::Name.starts_with(RETENTION_FACT))
            .filter(facts::Column::RecordedAt.gt(now - chrono_after(self.cache.live())))
            .all(&self.db)
            .await?;
        let others = live.iter().filter_map(|row| match row.value.parse::<u64>() {
            Ok(secs) => Some(Duration::from_secs(secs)),
            Err(_) => {
                tracing::warn!(name = %row.name, value = %row.value, "a retention that is not a number of seconds: ignored");
                None
            }
        });
        self.cache.agreed(began, recorded, others);
        facts::Entity::delete_many()
            .filter(facts::Column::Name.starts_with(RETENTION_FACT))
            .filter(facts::Column::RecordedAt.lt(now - RETENTION_ROW_KEPT))
            .exec(&self.db)
            .await?;
        Ok(())
    }

    /// Refreshes every `every`, until dropped (the first refresh is the caller's, before
    /// it serves).
    pub async fn run_periodically(self, every: Duration) {
        let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            self.refresh_or_say().await;
        }
    }

    /// `refresh`, its failure logged (the cache then stops answering in time). One that
    /// takes a whole period fails: what it read could be that old.
    pub async fn refresh_or_say(&self) {
        let every = self.cache.refresh_every();
        let error = match tokio::time::timeout(every, self.refresh()).await {
            Ok(Ok(())) => return,
            Ok(Err(err)) => err.to_string(),
            Err(_) => format!("no answer within {}", humantime::format_duration(every)),
        };
        tracing::error!(%error, "cannot record this process's key retention; retrying later");
        self.cache.answers(Instant::now());
    }

    /// A process stopping: its cache stops answering and its reaper purging, then its
    /// row is deleted (the others' bounds stay where they are).
    pub async fn forget(&self) {
        self.cache.leave();
        if let Err(err) = facts::Entity::delete_by_id(self.name.clone())
            .exec(&self.db)
            .await
        {
            tracing::warn!(error = %err, "cannot delete this process's key retention row; it ages out");
        }
    }
}

/// Deletes expired keys of final payments, oldest first, `batch` keys per statement;
/// returns how many. It does not ask whether the processes' replay caches have read this
/// retention: `run` does (`ReplayCache::may_purge`).
///
/// A day of keys is a million rows: deleted in one statement, they would hold a million
/// row locks and write their whole WAL at once while payments are being created. Each
/// statement here is its own short transaction, and the reaper pauses after each as long
/// as it took, so it never has the database more than half the time.
pub async fn purge_keys(
    db: &DatabaseConnection,
    older_than: DateTime<Utc>,
    batch: u64,
) -> Result<u64, DbErr> {
    in_batches("idempotency keys", batch, None, || {
        purge_key_batch(db, older_than, batch)
    })
    .await
}

/// One statement of `purge_keys`.
async fn purge_key_batch(
    db: &DatabaseConnection,
    older_than: DateTime<Utc>,
    batch: u64,
) -> Result<u64, DbErr> {
    let final_payment = Query::select()
        .expr(Expr::val(1))
        .from(payment::Entity)
        .and_where(
            Expr::col((payment::Entity, payment::Column::Id))
                .equals((keys::Entity, keys::Column::PaymentId)),
        )
        .and_where(payment::Column::State.is_in([
            PaymentState::Completada.as_str(),
            PaymentState::Fallida.as_str(),
        ]))
        // Counted from the payment's last send or settlement, not the key's creation: a
        // gateway remembers a key from its first use, which may be long after the key
        // was registered (a payment sent late by the reconciler).
        .and_where(payment::Column::UpdatedAt.lt(older_than))
        .to_owned();
    // The oldest first, through the index on `created_at`: the keys a statement deleted
    // are skipped by the next one's index scan, where a scan of the table would read
    // them again until they are vacuumed.
    let expired = Query::select()
        .from(keys::Entity)
        .and_where(keys::Column::CreatedAt.lt(older_than))
        .and_where(keys::Column::Status.eq(KeyStatus::Completed))
        .and_where(Expr::exists(final_payment))
        .order_by(keys::Column::CreatedAt, Order::Asc)
        .limit(batch)
        .to_owned();
    crate::db::delete_picked(db, "idempotency_keys", expired).await
}

/// Runs `one` (a delete of at most `batch` rows) until it deletes fewer, pausing after
/// each as long as it took; returns the rows deleted. Logs its progress every 100,000
/// rows: a backlog of days takes minutes. Stops between two batches once `stop` fires (a
/// process shutting down does not wait for a backlog: the next run goes on with it).
async fn in_batches<F, Fut>(
    what: &str,
    batch: u64,
    stop: Option<&tokio::sync::watch::Receiver<bool>>,
    mut one: F,
) -> Result<u64, DbErr>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<u64, DbErr>>,
{
    const PROGRESS_EVERY: u64 = 100_000;
    let mut deleted = 0;
    loop {
        let started = Instant::now();
        let now = one().await?;
        deleted += now;
        if now < batch {
            return Ok(deleted);
        }
        if deleted % PROGRESS_EVERY < now {
            tracing::info!(deleted, "{what} past retention: still deleting");
        }
        tokio::time::sleep(started.elapsed()).await;
        if stop.is_some_and(|stop| *stop.borrow()) {
            tracing::info!(
                deleted,
                "{what} past retention: stopping; the next run goes on"
            );
            return Ok(deleted);
        }
    }
}

/// How long a webhook report is kept after its last event: the key retention, and never
/// less than the event ids' (a report's sequence is what stops a late event about its
/// charge once its id is forgotten, so it outlives the ids of the events it applied).
pub fn report_retention(key_retention: Duration, message_retention: Duration) -> Duration {
    key_retention.max(message_retention)
}

/// How many webhook reports a purge deleted, of charges and of refunds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReportsPurged {
    pub charges: u64,
    pub refunds: u64,
}

/// Deletes the webhook reports of charges and refunds last updated before `older_than`
/// that nothing needs any more (`webhooks::purge_charge_reports`,
/// `purge_refund_reports`), `batch` rows per statement; returns how many.
pub async fn purge_reports(
    db: &DatabaseConnection,
    older_than: DateTime<Utc>,
    batch: u64,
    stop: Option<&tokio::sync::watch::Receiver<bool>>,
) -> Result<ReportsPurged, DbErr> {
    let charges = in_batches("webhook charge reports", batch, stop, || {
        crate::webhooks::purge_charge_reports(db, older_than, batch)
    })
    .await?;
    if stop.is_some_and(|stop| *stop.borrow()) {
        return Ok(ReportsPurged {
            charges,
            refunds: 0,
        });
    }
    let refunds = in_batches("webhook refund reports", batch, stop, || {
        crate::webhooks::purge_refund_reports(db, older_than, batch)
    })
    .await?;
    Ok(ReportsPurged { charges, refunds })
}

/// Deletes expired idempotency keys of final payments, webhook ids past their retention
/// (a redelivery after that is still stopped by the per-charge sequence), and webhook
/// reports past theirs that nothing needs (`purge_reports`).
pub async fn run(reaper: &Reaper, stop: &tokio::sync::watch::Receiver<bool>) -> Result<(), DbErr> {
    // The first run of a process that has just started waits for its first record, then
    // until every other process has had time to read it (`ReplayCache::first_purge_wait`),
    // rather than leave the keys to the next run, a minute on.
    let mut stopping = stop.clone();
    loop {
        let wait = reaper.cache.first_purge_wait(Instant::now());
        if wait.is_zero() {
            break;
        }
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            _ = stopping.wait_for(|stop| *stop) => return Ok(()),
        }
    }
    let (now, ahead) = reaper.clock.now();
    if ahead > crate::db::MAX_CLOCK_SKEW {
        tracing::warn!(
            ahead = %humantime::format_duration(crate::db::whole_millis(ahead)),
            "this host's clock has gone ahead of the time elapsed since pagos started: rows are aged on the elapsed time, and purged that much later until pagos restarts"
        );
    }
    let older_than = now - chrono_after(reaper.key_retention);
    // Checked before every batch: a process that can no longer record its retention
    // stops purging keys before the others stop counting it.
    let purged = in_batches("idempotency keys", reaper.batch, Some(stop), || async {
        if !reaper.cache.may_purge(Instant::now()) {
            return Ok(0);
        }
        purge_key_batch(&reaper.db, older_than, reaper.batch).await
    })
    .await?;
    if purged > 0 {
        reaper.metrics.keys_purged.inc_by(purged);
        tracing::info!(purged, "idempotency keys past retention deleted");
    }
    let older_than = now - chrono_after(reaper.message_retention);
    let messages = in_batches("processed webhook ids", reaper.batch, Some(stop), || {
        crate::webhooks::purge_processed_messages(&reaper.db, older_than, reaper.batch)
    })
    .await?;
    if messages > 0 {
        reaper.metrics.webhook_records_purged("event_ids", messages);
        tracing::info!(
            purged = messages,
            "processed webhook ids past retention deleted"
        );
    }
    let retention = report_retention(reaper.key_retention, reaper.message_retention);
    let reports = purge_reports(
        &reaper.db,
        now - chrono_after(retention),
        reaper.batch,
        Some(stop),
    )
    .await?;
    if reports.charges + reports.refunds > 0 {
        reaper
            .metrics
            .webhook_records_purged("charge_reports", reports.charges);
        reaper
            .metrics
            .webhook_records_purged("refund_reports", reports.refunds);
        tracing::info!(
            charges = reports.charges,
            refunds = reports.refunds,
            "webhook reports of settled payments and refunds past retention deleted"
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
    let stopping = stop.clone();
    crate::signals::every(every, stop, || async {
        if let Err(err) = run(&reaper, &stopping).await {
            tracing::error!(error = %err, "key reaper failed; retrying later");
        }
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_purge_goes_batch_after_batch_and_stops_between_two_when_the_process_stops() {
        let (stopping, stop) = tokio::sync::watch::channel(false);
        let batches = std::sync::atomic::AtomicU64::new(0);
        // Five full batches of 10 to delete; the process is told to stop during the second.
        let deleted = in_batches("rows", 10, Some(&stop), || {
            let n = batches.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            if n == 1 {
                stopping.send_replace(true);
            }
            async move { Ok(if n < 5 { 10 } else { 0 }) }
        })
        .await
        .expect("purge");
        assert_eq!(deleted, 20, "the batch under way finishes; no third begins");

        // Without a stop, until a batch deletes fewer than its size.
        let sizes = std::sync::Mutex::new(vec![3, 10, 10]);
        let deleted = in_batches("rows", 10, None, || {
            let n = sizes.lock().expect("sizes").pop().unwrap_or(0);
            async move { Ok(n) }
        })
        .await
        .expect("purge");
        assert_eq!(deleted, 23);
    }

    #[test]
    fn a_webhook_report_outlives_the_ids_of_its_events() {
        let (hour, week) = (Duration::from_secs(3600), Duration::from_secs(7 * 86400));
        assert_eq!(report_retention(24 * hour, week), week);
        assert_eq!(report_retention(30 * 24 * hour, week), 30 * 24 * hour);
    }

    #[test]
    fn the_reaper_runs_about_once_a_minute_and_never_more_often_than_a_pass() {
        assert_eq!(period(Duration::from_secs(10)), Duration::from_secs(60));
        assert_eq!(period(Duration::from_secs(7)), Duration::from_secs(56));
        assert_eq!(period(Duration::from_secs(300)), Duration::from_secs(300));
        assert_eq!(period(Duration::from_millis(1)), Duration::from_secs(60));
    }
}
