//! The reconciler's work on one claimed payment or refund, the same for both: taken up
//! only with a whole work's claim left, asked about at the provider when its state needs
//! it, decided by the table (`decide`), and the decision written through the fenced store.
//!
//! What is a payment's or a refund's own — how the provider is asked, how it is sent and
//! settled, and its log lines, which stay in its own module — is said by `Reconcilable`.

use crate::entities::payment_transition::Actor;
use crate::gateway::GatewayError;
use crate::saga::reconcile::decide::{Decision, Facts, Handled, Horizons, Reconciled};
use crate::saga::reconcile::decide::{decide, needs_lookup};
use crate::saga::store::{self, Claimable, LastError, Rewritten, SagaRow, Step, Written};
use crate::saga::{self, Saga, SagaDeps};
use chrono::{DateTime, Utc};
use sea_orm::DbErr;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::task::{JoinError, JoinSet};
use tracing::Instrument;
use uuid::Uuid;

/// What the provider holds for a row of `R`: a charge, a refund.
pub type HeldBy<R> = <<R as SagaRow>::State as Reconciled>::Held;

/// A payment or a refund as the reconciler works on it.
pub trait Reconcilable: Saga<State: Reconciled + Into<Handled>> + Rewritten {
    /// What a decision changes besides the state.
    type Changes: Into<Step> + Send;
    /// The event that hands it to on-call (`REVISION_MANUAL`).
    const ESCALATE: Self::Event;

    /// What the provider holds for it.
    fn lookup(
        &self,
        deps: &SagaDeps,
    ) -> impl Future<Output = Result<Vec<HeldBy<Self>>, GatewayError>> + Send;

    /// Its id at the provider, from an answer before (a pending one), if any.
    fn named(&self) -> Option<&str>;

    /// What a final answer of the provider's means for it; None: not final yet.
    fn settlement(&self, held: &HeldBy<Self>) -> Option<(Self::Event, Self::Changes, String)>;

    /// Its log line of the claim that ran out before it was taken up (someone else has it).
    fn log_taken_by_another(&self);
    /// Its log line of a renewal of its claim that failed.
    fn log_renewal_failed(id: Uuid, err: &DbErr);
    /// Its log line of the table's decision.
    fn log_decision(&self, decision: &Decision<HeldBy<Self>>);
    /// Its log line of a look again at `due`.
    fn log_rescheduled(&self, why: &str, due: DateTime<Utc>);
    /// Its log line of a move to on-call.
    fn log_escalated(&self, why: &str);
    /// Its log line of a work that failed.
    fn log_failed(id: Uuid, err: &Self::Error);
    /// Its log line of a work whose task panicked (it stays claimed until its claim runs
    /// out, and is retried then).
    fn log_panicked(err: &JoinError);
}

/// What the work on one claimed row is bounded by.
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    pub horizons: Horizons,
    /// The most a row's work takes before its next fenced write, the one that settles,
    /// reschedules or escalates it, or marks it sent and so holds it for the whole send:
    /// one look-up, plus a margin for the reads and writes around it. (A Stripe refund's
    /// look-up may read several pages, each within the timeout: a claim that runs out in
    /// the middle costs at most a second look-up by another worker, whose claim moves the
    /// version, so the fenced writes still let only one of them send or settle.)
    pub before_hold: Duration,
    /// How long a claim keeps other processes away.
    pub claim_for: Duration,
}

/// What tells a pass to stop: `serve`'s stop signal (`true` once `SIGTERM` arrived). An
/// on-demand pass (on-call's, `pagos reconcile --once`) has none and runs to its end.
pub type Stop = tokio::sync::watch::Receiver<bool>;

/// One pass over every row of `E` due when it started: payments or refunds. Rows
/// rescheduled during the pass are left for the next one, so a pass always ends. `each`
/// is told what became of every row examined.
///
/// The look-ups are a pipeline, not a series of batches: `concurrency` provider calls are
/// in flight at any moment (a permit each), and the next batch is claimed as soon as the
/// last of the one before has been taken into the work, while its look-ups are still in
/// flight. Waiting for a whole batch to finish before claiming the next left the permits
/// idle behind the slowest look-up of each batch (1.77 × the ideal time in
/// `benches/run.sh`). A row gives its permit back once its look-up is answered, so the
/// write that settles it does not keep the next one from being asked about (it kept a
/// permit for about as long as the look-up itself under load: 2.35 × the ideal time).
/// Each row's work is a task of its own, so the runtime's worker threads share the pass:
/// polled all by the pass's one task, a look-up's answer waited for that task to finish
/// polling the others (1.26 × the ideal time, 1.18 × as tasks). A row whose task panics
/// is counted as `Handled::Error` and stays claimed until its claim runs out.
///
/// A claim that fails ends the claiming; the rows in hand are still finished before the
/// error is returned (they are claimed: dropping them would only delay them until their
/// claim runs out).
pub async fn pass<E>(
    deps: &SagaDeps,
    bounds: Bounds,
    concurrency: u32,
    stop: Option<&Stop>,
    mut each: impl FnMut(Handled),
) -> Result<(), DbErr>
where
    E: Claimable<Model: Reconcilable + Send + 'static>,
{
    let started: DateTime<Utc> = crate::db::now();
    let concurrency = concurrency.max(1);
    let batch = u64::from(concurrency);
    let calls = Arc::new(Semaphore::new(concurrency as usize));
    let shared = Arc::new(deps.clone());
    // Rows in the work at once: those calling the provider or waiting to, and those being
    // written after their call.
    let working = 2 * concurrency as usize;
    let mut in_hand: VecDeque<E::Model> = VecDeque::new();
    let mut in_flight = JoinSet::new();
    let mut claiming = None;
    let mut more = true;
    let mut claim_failed = None;
    loop {
        // Told to stop (SIGTERM): no more claims, and the rows claimed but not taken up
        // are given back, due now, for another process's next pass (left claimed, they
        // waited a whole claim); those in the work finish.
        if stop.is_some_and(|stop| *stop.borrow()) {
            more = false;
            for row in in_hand.drain(..) {
                give_back(deps, &row).await;
            }
        }
        while in_flight.len() < working
            && let Some(row) = in_hand.pop_front()
        {
            let (deps, calls, stop) = (shared.clone(), calls.clone(), stop.cloned());
            // In the caller's span (an on-demand pass's request), as when polled here.
            in_flight.spawn(
                async move {
                    let permit = calls.acquire().await.ok();
                    // Told to stop while it waited for a slot: not taken up, given back
                    // as the rows in hand are (no new call to the provider after SIGTERM).
                    if stop.is_some_and(|stop| *stop.borrow()) {
                        give_back(&deps, &row).await;
                        return Handled::Skipped;
                    }
                    process(&deps, bounds, permit, row).await
                }
                .in_current_span(),
            );
        }
        if in_hand.is_empty() && more && claiming.is_none() {
            claiming = Some(Box::pin(store::claim_due::<E>(
                &deps.db,
                started,
                batch,
                bounds.claim_for,
            )));
        }
        tokio::select! {
            Some(outcome) = in_flight.join_next(), if !in_flight.is_empty() => {
                each(outcome.unwrap_or_else(|err| {
                    E::Model::log_panicked(&err);
                    Handled::Error
                }));
            }
            claimed = async { claiming.as_mut().expect("guarded").await }, if claiming.is_some() => {
                claiming = None;
                match claimed {
                    Ok(claimed) if claimed.is_empty() => more = false,
                    Ok(claimed) => in_hand.extend(claimed),
                    Err(err) => {
                        more = false;
                        claim_failed = Some(err);
                    }
                }
            }
            else => break,
        }
    }
    claim_failed.map_or(Ok(()), Err)
}

/// Gives back the claim of a row not taken up (`store::release_claim`). A failure only
/// delays the row until its claim runs out, as after a crash.
async fn give_back<R: Reconcilable>(deps: &SagaDeps, row: &R) {
    if let Err(err) = store::release_claim(&deps.db, row).await {
        tracing::warn!(id = %row.id(), error = %err, "a claim not taken up could not be given back; it runs out");
    }
}

/// The work on one claimed row: what it came to, one bucket of a report.
///
/// In a pass, the row's provider calls — its look-up, and a send if the table decides
/// one — hold `permit`, one of the pass's, and the row is taken up only once it has one:
/// a pass holds `PAGOS_RECONCILE_CONCURRENCY` calls in flight at most, while the writes
/// that settle rows already looked up go on beside them, the permit given back.
pub async fn process<R: Reconcilable>(
    deps: &SagaDeps,
    bounds: Bounds,
    permit: Option<SemaphorePermit<'_>>,
    claimed: R,
) -> Handled {
    let id = claimed.id();
    let claimed = match take_up(deps, bounds, claimed).await {
        Ok(Some(claimed)) => claimed,
        Ok(None) => return Handled::Skipped,
        Err(err) => {
            R::log_renewal_failed(id, &err);
            return Handled::Error;
        }
    };
    match decide_and_apply(deps, &bounds.horizons, claimed, permit).await {
        Ok(outcome) => outcome,
        Err(err) => {
            R::log_failed(id, &err);
            Handled::Error
        }
    }
}

/// A row is worked on only with its work up to its next fenced write left on its claim
/// (`Bounds::before_hold`): a send is held by the write that marks it sent, never by the
/// claim. One claimed ahead may have waited for a slot for as long as another row's whole
/// work; its claim is renewed (a fenced write) when less is left. If someone else took it
/// meanwhile (its claim ran out), it is theirs: None.
async fn take_up<R: Reconcilable>(
    deps: &SagaDeps,
    bounds: Bounds,
    claimed: R,
) -> Result<Option<R>, DbErr> {
    let needed = crate::db::now() + store::chrono_after(bounds.before_hold);
    if claimed.claimed_until().is_some_and(|until| until >= needed) {
        return Ok(Some(claimed));
    }
    let until = store::now_plus(bounds.claim_for);
    Ok(match store::renew_claim(&deps.db, &claimed, until).await? {
        Written::Applied(renewed) => Some(*renewed),
        Written::Fenced => {
            claimed.log_taken_by_another();
            None
        }
    })
}

/// A pending charge (refund) found that is not the row's own (another than the one the
/// provider named for it before, another amount or currency) is settled as a send's
/// pending answer is (`saga::settlement`): to review at once, keeping the first, rather
/// than waited on until `PAGOS_GIVE_UP_AFTER` while the merchant is told 202.
fn not_its_own_pending<R: Reconcilable>(
    decision: Decision<HeldBy<R>>,
    lookup: Option<&Result<Vec<HeldBy<R>>, GatewayError>>,
    claimed: &R,
) -> Decision<HeldBy<R>> {
    use crate::saga::reconcile::decide::Held;
    match (decision, lookup) {
        (Decision::Reschedule(why), Some(Ok(found))) => match found.as_slice() {
            [one] if one.is_pending() && claimed.settlement(one).is_some() => {
                Decision::Settle(one.clone())
            }
            _ => Decision::Reschedule(why),
        },
        (decision, _) => decision,
    }
}

async fn decide_and_apply<R: Reconcilable>(
    deps: &SagaDeps,
    horizons: &Horizons,
    claimed: R,
    permit: Option<SemaphorePermit<'_>>,
) -> Result<Handled, R::Error> {
    let state = claimed.state();
    let lookup = if needs_lookup(state) {
        Some(claimed.lookup(deps).await)
    } else {
        None
    };
    crate::failpoint::hit("reconcile_after_lookup");
    let facts = Facts {
        state,
        created_at: claimed.created_at(),
        now: crate::db::now(),
        lookup: lookup.as_ref(),
        named: claimed.named(),
    };
    let decision = not_its_own_pending(decide(&facts, horizons), lookup.as_ref(), &claimed);
    claimed.log_decision(&decision);
    // What the look-up says of the row's last error, whatever is decided: a failed one is
    // the error from now, one the provider answered clears the error before (it waits on
    // the provider now, not on an error).
    let last_error = match &lookup {
        Some(Err(err)) => LastError::Now(format!("provider lookup failed: {err}")),
        Some(Ok(_)) => LastError::Cleared,
        None => LastError::Kept,
    };
    // Only a send calls the provider again; every other decision is a write.
    if !matches!(decision, Decision::Send) {
        drop(permit);
    }
    match decision {
        Decision::Send => Ok(
            match saga::send_reporting(deps, claimed, Actor::Reconciler).await? {
                saga::Sending::Made(after) => after.state().into(),
                // Handed back unsent: looked at again, not resent.
                saga::Sending::NotSent(_) => Handled::Rescheduled,
                // Someone else moved it first (a webhook, a request's retry): nothing was
                // sent, and what it came to is theirs.
                saga::Sending::Fenced(_) => Handled::Skipped,
            },
        ),
        Decision::Settle(held) => {
            let Some((event, changes, reason)) = claimed.settlement(&held) else {
                return Ok(Handled::Rescheduled);
            };
            let reason = format!("provider lookup: {reason}");
            Ok(
                match saga::apply_now(
                    &deps.db,
                    &claimed,
                    event,
                    changes,
                    Actor::Reconciler,
                    &reason,
                )
                .await?
                {
                    Written::Applied(moved) => moved.state().into(),
                    Written::Fenced => Handled::Skipped,
                },
            )
        }
        Decision::Reschedule(why) => {
            let due = deps.next_look(claimed.attempts());
            claimed.log_rescheduled(&why, due);
            Ok(
                match store::reschedule(&deps.db, &claimed, due, &last_error).await? {
                    Written::Applied(_) => Handled::Rescheduled,
                    Written::Fenced => Handled::Skipped,
                },
            )
        }
        Decision::Escalate(why) => {
            claimed.log_escalated(&why);
            Ok(
                match saga::apply_now(
                    &deps.db,
                    &claimed,
                    R::ESCALATE,
                    // Escalated because the provider cannot be asked: on-call, paged, reads
                    // the look-up's error.
                    Step {
                        last_error,
                        ..Step::default()
                    },
                    Actor::Reconciler,
                    &why,
                )
                .await?
                {
                    Written::Applied(_) => Handled::ManualReview,
                    Written::Fenced => Handled::Skipped,
                },
            )
        }
        Decision::Skip => Ok(Handled::Skipped),
    }
}
