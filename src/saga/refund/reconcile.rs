//! Reconciliation of refunds left in between (a crash, a timeout, a refund pending at the
//! provider), exactly as payments are reconciled: look the refund up by its reference,
//! settle it from a readable status, resend it with the same gateway key while the gateway
//! still honours the key, and hand it to on-call (`REVISION_MANUAL`) at the horizons.
//!
//! `decide` is the pure decision table; `run_pass` and `reconcile_one` claim refunds the
//! way payments are claimed (nobody else works on a claimed refund) and apply decisions
//! through the fenced store.

use crate::entities::refund;
use crate::gateway::{GatewayError, Refund, RefundLookup, RefundStatus};
use crate::saga::SagaDeps;
use crate::saga::reconcile::decide::{self, Handled, Held, Horizons, Reconciled, Tally, Words};
use crate::saga::reconcile::work::{self, Bounds, Reconcilable};
use crate::saga::refund as steps;
use crate::saga::refund::state::{Event, RefundState};
use crate::saga::refund::store::{Changes, StoreError};
use crate::saga::store::When;
use chrono::{DateTime, Utc};
use std::time::Duration;
use uuid::Uuid;

/// What the reconciler knows about one refund.
pub type Facts<'a> = decide::Facts<'a, RefundState>;

/// What to do with one refund.
pub type Decision = decide::Decision<Refund>;

impl Held for Refund {
    fn id(&self) -> &str {
        &self.id
    }

    fn is_pending(&self) -> bool {
        self.status == RefundStatus::Pending
    }
}

/// The decision table is the payments' (`saga::reconcile::decide`), read for refunds.
impl Reconciled for RefundState {
    type Held = Refund;
    const WORDS: Words = Words {
        held: "refund",
        held_plural: "refunds",
        reconciled: "refund",
        subject: "refund ",
        never_sent_late: "",
        several_advice: "",
    };
}

/// What reconciling refunds needs: the saga's dependencies and the payments' limits.
#[derive(Clone, Copy, Debug)]
pub struct RefundLimits {
    pub horizons: Horizons,
    pub concurrency: u32,
    /// The most a refund's work takes before the fenced write that settles it or holds
    /// it for a send (`work::Bounds::before_hold`).
    pub before_hold: Duration,
    pub claim_for: Duration,
}

impl From<RefundState> for Handled {
    /// What a refund's state after the work says was done.
    fn from(state: RefundState) -> Handled {
        match state {
            RefundState::Completado => Handled::Completed,
            RefundState::Fallido => Handled::Failed,
            RefundState::RevisionManual => Handled::ManualReview,
            RefundState::EnProceso | RefundState::Enviado => Handled::Resent,
        }
    }
}

/// One pass over every refund due when it started, as payments are passed over
/// (`work::pass`: a pipeline of `concurrency` look-ups, each refund a task of its own):
/// what it did, and whether the database cut it short (what it did until then is done).
pub async fn run_pass(
    deps: &SagaDeps,
    limits: &RefundLimits,
    stop: Option<&work::Stop>,
) -> (Tally, Result<(), sea_orm::DbErr>) {
    let mut report = Tally::default();
    let done =
        work::pass::<refund::Entity>(deps, limits.bounds(), limits.concurrency, stop, |handled| {
            report.add(handled)
        })
        .await;
    if !report.is_empty() {
        tracing::info!(?report, "refund reconciliation pass done");
    }
    (report, done)
}

/// One refund now (`if_due` false: on-call) or only if due (a client retry), unless
/// someone holds it.
pub async fn reconcile_one(
    deps: &SagaDeps,
    limits: &RefundLimits,
    id: Uuid,
    if_due: bool,
) -> Result<Tally, sea_orm::DbErr> {
    let mut report = Tally::default();
    let when = if if_due { When::IfDue } else { When::Now };
    match crate::saga::store::claim_one::<refund::Entity>(&deps.db, id, when, limits.claim_for)
        .await?
    {
        Some(claimed) => report.add(work::process(deps, limits.bounds(), None, claimed).await),
        None => report.add(Handled::Skipped),
    }
    Ok(report)
}

impl RefundLimits {
    /// What the work on one claimed refund is bounded by.
    fn bounds(&self) -> Bounds {
        Bounds {
            horizons: self.horizons,
            before_hold: self.before_hold,
            claim_for: self.claim_for,
        }
    }
}

/// What to look `r` up with: its charge, currency and reference, and its provider id once
/// an answer gave one.
pub fn lookup_of(r: &refund::Model) -> RefundLookup {
    RefundLookup {
        charge: r.charge_ref.clone(),
        currency: r.currency.clone(),
        reference: r.id,
        gateway_ref: r.gateway_ref.clone(),
    }
}

/// A refund as the reconciler works on it (`saga::reconcile::work`), in this module's log
/// lines.
impl Reconcilable for refund::Model {
    type Changes = Changes;
    const ESCALATE: Event = Event::Escalate;

    async fn lookup(&self, deps: &SagaDeps) -> Result<Vec<Refund>, GatewayError> {
        deps.gateway.lookup_refunds(&lookup_of(self)).await
    }

    fn named(&self) -> Option<&str> {
        self.gateway_ref.as_deref()
    }

    fn settlement(&self, found: &Refund) -> Option<(Event, Changes, String)> {
        steps::settlement(self, found)
    }

    /// A refund whose claim ran out is skipped without a line of its own.
    fn log_taken_by_another(&self) {}

    fn log_renewal_failed(id: Uuid, err: &sea_orm::DbErr) {
        tracing::error!(refund_id = %id, error = %err, "renewing a refund's claim failed");
    }

    fn log_decision(&self, decision: &Decision) {
        tracing::info!(refund_id = %self.id, estado = %self.state, decision = ?decision, "refund reconciler decision");
    }

    fn log_rescheduled(&self, why: &str, due: DateTime<Utc>) {
        tracing::info!(refund_id = %self.id, why, next = %due, "refund rescheduled");
    }

    fn log_escalated(&self, why: &str) {
        tracing::warn!(refund_id = %self.id, why, "refund moved to REVISION_MANUAL");
    }

    fn log_failed(id: Uuid, err: &StoreError) {
        tracing::error!(refund_id = %id, error = %err, "reconciling a refund failed; it will be retried");
    }

    fn log_panicked(err: &tokio::task::JoinError) {
        tracing::error!(error = %err, "reconciling a refund panicked; it will be retried when its claim runs out");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::GatewayError;
    use crate::saga::reconcile::decide::decide_at;
    use chrono::TimeDelta;

    fn found(status: RefundStatus) -> Refund {
        Refund {
            id: "re_1".into(),
            status,
            charge: "ch_1".into(),
            amount: 100,
            currency: "COP".into(),
            reference: "r".into(),
            failure_code: None,
        }
    }

    #[test]
    fn a_refund_never_sent_is_sent_until_the_horizon() {
        assert_eq!(
            decide_at(RefundState::EnProceso, TimeDelta::hours(1), None),
            Decision::Send
        );
        assert!(matches!(
            decide_at(RefundState::EnProceso, TimeDelta::hours(25), None),
            Decision::Escalate(_)
        ));
    }

    #[test]
    fn a_final_refund_at_the_provider_settles_it() {
        for status in [RefundStatus::Succeeded, RefundStatus::Failed] {
            assert_eq!(
                decide_at(
                    RefundState::Enviado,
                    TimeDelta::minutes(5),
                    Some(Ok(vec![found(status)]))
                ),
                Decision::Settle(found(status))
            );
        }
    }

    #[test]
    fn no_refund_at_the_provider_is_resent_only_inside_the_key_window() {
        assert_eq!(
            decide_at(RefundState::Enviado, TimeDelta::hours(1), Some(Ok(vec![]))),
            Decision::Send
        );
        assert!(matches!(
            decide_at(RefundState::Enviado, TimeDelta::hours(24), Some(Ok(vec![]))),
            Decision::Escalate(ref why) if why.contains("refund twice")
        ));
    }

    #[test]
    fn pending_or_unreachable_is_looked_at_again_until_the_horizon() {
        let err = || Some(Err(GatewayError::Unknown("timeout".into())));
        assert!(matches!(
            decide_at(RefundState::Enviado, TimeDelta::hours(1), err()),
            Decision::Reschedule(_)
        ));
        assert!(matches!(
            decide_at(RefundState::Enviado, TimeDelta::hours(25), err()),
            Decision::Escalate(_)
        ));
        let pending = || Some(Ok(vec![found(RefundStatus::Pending)]));
        assert!(matches!(
            decide_at(RefundState::Enviado, TimeDelta::hours(1), pending()),
            Decision::Reschedule(_)
        ));
        assert!(matches!(
            decide_at(RefundState::Enviado, TimeDelta::hours(25), pending()),
            Decision::Escalate(_)
        ));
    }

    #[test]
    fn two_refunds_at_the_provider_for_one_go_to_on_call() {
        assert!(matches!(
            decide_at(
                RefundState::Enviado,
                TimeDelta::minutes(1),
                Some(Ok(vec![
                    found(RefundStatus::Succeeded),
                    found(RefundStatus::Succeeded)
                ]))
            ),
            Decision::Escalate(_)
        ));
    }

    #[test]
    fn final_and_reviewed_refunds_are_left_alone() {
        for state in [
            RefundState::Completado,
            RefundState::Fallido,
            RefundState::RevisionManual,
        ] {
            assert_eq!(decide_at(state, TimeDelta::hours(1), None), Decision::Skip);
        }
    }
}
