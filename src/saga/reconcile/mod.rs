//! Reconciliation: settles payments left in between by crashes, timeouts and pending
//! charges, by asking the provider. One pass over every due payment, or one payment. The
//! periodic worker (`reconciler`) runs passes inside `pagos serve`, `pagos reconcile
//! --once` runs one, the admin API runs one on demand, and a client retry that finds its
//! payment due reconciles that one: they all call this, which imports none of them.
//!
//! It never sends a payment it has not claimed, never works on a payment with less than
//! its look-up's time left on its claim, never resends outside the gateway's key window,
//! and writes every decision through the fenced store, so any number of processes can run
//! it side by side without two of them working on one payment at once.

pub mod decide;
pub mod work;

use crate::entities::payment;
use crate::gateway::{Charge, GatewayError};
use crate::metrics::Metrics;
use crate::saga::state::{Event, PaymentState};
use crate::saga::store::{self, Changes, When};
use crate::saga::{self, SagaDeps};
use chrono::{DateTime, TimeDelta, Utc};
use decide::{Decision, Handled, Horizons, Tally};
use serde::Serialize;
use std::sync::Arc;
use std::time::Duration;
use uuid::Uuid;
use work::{Bounds, Reconcilable};

/// Exactly what reconciling needs: the saga's dependencies (database, metered gateway,
/// retry policy, hold times), the metrics it counts in, and its limits. Built once by the
/// composition root; cheap to clone.
#[derive(Clone)]
pub struct Reconciler {
    pub saga: SagaDeps,
    pub metrics: Arc<Metrics>,
    pub horizons: Horizons,
    /// Provider calls in flight at once in a pass, and the claim batch
    /// (`PAGOS_RECONCILE_CONCURRENCY`).
    pub concurrency: u32,
    /// How long a claim keeps other processes away: one payment's whole work, and never
    /// shorter than the lease.
    pub claim_for: Duration,
    /// The most a payment's work takes before the fenced write that settles it or holds
    /// it for a send (`work::Bounds::before_hold`).
    pub before_hold: Duration,
}

/// Added to one look-up's timeout for the reads and writes around it when a claimed row
/// is taken up (`work::Bounds::before_hold`).
pub const TAKE_UP_MARGIN: Duration = Duration::from_secs(5);

impl Reconciler {
    /// What the work on one claimed payment is bounded by.
    fn bounds(&self) -> Bounds {
        Bounds {
            horizons: self.horizons,
            before_hold: self.before_hold,
            claim_for: self.claim_for,
        }
    }

    /// The same limits, for refunds (`saga::refund::reconcile`).
    pub fn refund_limits(&self) -> crate::saga::refund::reconcile::RefundLimits {
        crate::saga::refund::reconcile::RefundLimits {
            horizons: self.horizons,
            concurrency: self.concurrency,
            before_hold: self.before_hold,
            claim_for: self.claim_for,
        }
    }
}

/// The settings a `Reconciler` is made from.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// `PAGOS_GATEWAY_KEY_WINDOW`.
    pub key_window: Duration,
    /// `PAGOS_GIVE_UP_AFTER`.
    pub give_up_after: Duration,
    /// `PAGOS_GATEWAY_TIMEOUT`: one call, a look-up or one try of a send.
    pub gateway_timeout: Duration,
    /// `PAGOS_LEASE`.
    pub lease: Duration,
    /// `PAGOS_RECONCILE_CONCURRENCY`.
    pub concurrency: u32,
}

impl Reconciler {
    pub fn new(saga: SagaDeps, metrics: Arc<Metrics>, limits: Limits) -> Reconciler {
        let horizons = Horizons {
            key_window: store::chrono_after(limits.key_window),
            // A resend must finish (every try, every backoff) inside the window.
            resend_margin: store::chrono_after(saga.policy.worst_case(limits.gateway_timeout)),
            give_up_after: store::chrono_after(limits.give_up_after),
        };
        // A claim lasts one payment's whole work: a look-up, then a send with every try
        // and backoff, plus a margin.
        let work_bound = limits.gateway_timeout + saga.send_hold;
        Reconciler {
            horizons,
            concurrency: limits.concurrency,
            claim_for: limits.lease.max(work_bound),
            before_hold: limits.gateway_timeout + TAKE_UP_MARGIN,
            saga,
            metrics,
        }
    }
}

/// The report of one pass (contract section 3): what it did with payments, and beside
/// them what it did with refunds.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Report {
    #[serde(flatten)]
    pub pagos: Tally,
    /// What the pass did with refunds (contract section 6), counted the same way; left
    /// out when it touched none.
    #[serde(skip_serializing_if = "Tally::is_empty")]
    pub reembolsos: Tally,
}

impl Report {
    /// The report as an audit row of on-call's says it (`operators::actions`): each count
    /// that is not zero, by the report's own names (`examinados` always).
    pub fn in_words(&self) -> String {
        let tally = |t: &Tally| {
            [
                ("examinados", t.examinados),
                ("completados", t.completados),
                ("fallidos", t.fallidos),
                ("reenviados", t.reenviados),
                ("pendientes", t.pendientes),
                ("revisionManual", t.revision_manual),
                ("errores", t.errores),
                ("omitidos", t.omitidos),
            ]
            .iter()
            .filter(|(name, n)| *n > 0 || *name == "examinados")
            .map(|(name, n)| format!("{name} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
        };
        let mut parts = Vec::new();
        if !self.pagos.is_empty() || self.reembolsos.is_empty() {
            parts.push(format!("pagos: {}", tally(&self.pagos)));
        }
        if !self.reembolsos.is_empty() {
            parts.push(format!("reembolsos: {}", tally(&self.reembolsos)));
        }
        parts.join("; ")
    }
}

impl From<PaymentState> for Handled {
    /// What a payment's state after the work says was done.
    fn from(state: PaymentState) -> Handled {
        match state {
            PaymentState::Completada => Handled::Completed,
            PaymentState::Fallida => Handled::Failed,
            PaymentState::RevisionManual => Handled::ManualReview,
            PaymentState::EnProceso | PaymentState::Enviada => Handled::Resent,
        }
    }
}

/// A payment's `Handled`: one metric label (and one bucket of the report's `Tally`).
impl Handled {
    fn metric(self) -> &'static str {
        match self {
            Handled::Completed => "completed",
            Handled::Failed => "failed",
            Handled::Resent => "resent",
            Handled::Rescheduled => "rescheduled",
            Handled::ManualReview => "manual_review",
            Handled::Error => "error",
            Handled::Skipped => "skipped",
        }
    }
}

/// A pass the database cut short (a claim failed): what it did until then, which is
/// written and stays done, and the error. The payments it had in hand were finished first
/// (`work::pass`).
#[derive(Debug, thiserror::Error)]
#[error("the reconciliation pass was cut short: {source}")]
pub struct PassError {
    pub report: Box<Report>,
    pub source: sea_orm::DbErr,
}

/// One pass over every payment due when it started, then over the refunds due
/// (`work::pass`: a pipeline of `reconcile_concurrency` look-ups, each payment a task of
/// its own). Cut short by the database, it still says what it did (`PassError`).
///
/// With `stop` (`serve`'s), a stop signal ends it early: no more claims, the work in hand
/// finishes, and what is left is due again once its claims run out.
pub async fn run_pass(r: &Reconciler, stop: Option<&work::Stop>) -> Result<Report, PassError> {
    let mut report = Report::default();
    let payments =
        work::pass::<payment::Entity>(&r.saga, r.bounds(), r.concurrency, stop, |outcome| {
            r.metrics.decision(outcome.metric());
            report.pagos.add(outcome);
        })
        .await;
    let cut_short = |report, source| PassError {
        report: Box::new(report),
        source,
    };
    if let Err(err) = payments {
        return Err(cut_short(report, err));
    }
    // Refunds left in between, after the payments (a pass's refunds are few).
    let (refunds, done) =
        crate::saga::refund::reconcile::run_pass(&r.saga, &r.refund_limits(), stop).await;
    report.reembolsos = refunds;
    if let Err(err) = done {
        return Err(cut_short(report, err));
    }
    r.metrics.reconciler_passes.inc();
    if !report.pagos.is_empty() {
        tracing::info!(?report, "reconciliation pass done");
    }
    Ok(report)
}

/// One payment, now (`When::Now`: on-call) or only if it is due (`When::IfDue`: a
/// client retry), unless someone holds it: a request still sending it, a pass, another
/// "reconcile now". Then it is skipped (`omitidos`), never worked on twice at once.
pub async fn reconcile_one(r: &Reconciler, id: Uuid, when: When) -> Result<Report, sea_orm::DbErr> {
    let outcome =
        match store::claim_one::<payment::Entity>(&r.saga.db, id, when, r.claim_for).await? {
            Some(claimed) => {
                let outcome = work::process(&r.saga, r.bounds(), None, claimed).await;
                r.metrics.decision(outcome.metric());
                outcome
            }
            None => Handled::Skipped,
        };
    let mut report = Report::default();
    report.pagos.add(outcome);
    Ok(report)
}

/// A payment as the reconciler works on it (`work`), in this module's log lines.
impl Reconcilable for payment::Model {
    type Changes = Changes;
    const ESCALATE: Event = Event::Escalate;

    fn lookup(
        &self,
        deps: &SagaDeps,
    ) -> impl Future<Output = Result<Vec<Charge>, GatewayError>> + Send {
        deps.gateway.lookup(self.id)
    }

    fn named(&self) -> Option<&str> {
        self.gateway_ref.as_deref()
    }

    fn settlement(&self, charge: &Charge) -> Option<(Event, Changes, String)> {
        saga::settlement(self, charge)
    }

    fn log_taken_by_another(&self) {
        tracing::warn!(payment_id = %self.id, "claim ran out before the payment was taken up; another worker has it");
    }

    fn log_renewal_failed(id: Uuid, err: &sea_orm::DbErr) {
        tracing::error!(payment_id = %id, error = %err, "renewing a claim failed; the payment will be retried");
    }

    fn log_decision(&self, decision: &Decision) {
        tracing::info!(payment_id = %self.id, estado = %self.state, decision = ?decision, "reconciler decision");
    }

    fn log_rescheduled(&self, why: &str, due: DateTime<Utc>) {
        tracing::info!(payment_id = %self.id, why, next = %due, "rescheduled");
    }

    fn log_escalated(&self, why: &str) {
        tracing::warn!(payment_id = %self.id, why, "moved to REVISION_MANUAL");
    }

    fn log_failed(id: Uuid, err: &store::StoreError) {
        tracing::error!(payment_id = %id, error = %err, "reconciling a payment failed; it will be retried");
    }

    fn log_panicked(err: &tokio::task::JoinError) {
        tracing::error!(error = %err, "reconciling a payment panicked; it will be retried when its claim runs out");
    }
}

/// Time since `created_at`, for reports and listings.
pub fn age(created_at: DateTime<Utc>) -> TimeDelta {
    crate::db::now() - created_at
}
