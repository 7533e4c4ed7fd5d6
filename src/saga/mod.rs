//! The saga of one payment: register → mark sent → gateway call → settle or hand over.
//!
//! `state` is the pure state machine; `store` is the database work; this module runs the
//! steps in order. `registry` decides what a request with a key gets; `reconcile` settles
//! what was left in between (shared by the HTTP handlers and the periodic worker, which
//! import it and never each other). It must never hold a transaction across the gateway call, and never
//! call the gateway for a payment it has not first marked ENVIADA.

pub mod backoff;
pub mod reconcile;
pub mod refund;
pub mod registry;
pub mod state;
pub mod store;

use crate::entities::payment;
use crate::failpoint;
use crate::gateway::retry::{self, ChargeOutcome, RetryPolicy};
use crate::gateway::{Charge, ChargeRequest, ChargeStatus, Gateway};
use crate::representation::{self, GATEWAY_REJECTED_PREFIX};
use sea_orm::DatabaseConnection;
use state::{Event, PaymentState, SagaState};
use std::sync::Arc;
use std::time::Duration;
use store::{Actor, Changes, LastError, SagaRow, Step, StoreError, Written};

/// What the saga needs from the application.
#[derive(Clone)]
pub struct SagaDeps {
    pub db: DatabaseConnection,
    pub gateway: Arc<dyn Gateway>,
    pub policy: RetryPolicy,
    /// How long until the reconciler looks at a payment handed over to it.
    pub stale_after: Duration,
    /// How long a send can take, every try and backoff included, plus a margin: a send
    /// starts only from a write that holds the payment at least this long.
    pub send_hold: Duration,
    /// How long a send can take, every try and backoff included (`send_hold` without its
    /// margin): a send begins only with this much left on the hold its write wrote.
    pub send_lasts: Duration,
    /// How long the gateway remembers a send's key (`PAGOS_GATEWAY_KEY_WINDOW`), counted
    /// from the row's creation: a send begins only if it ends inside it.
    pub key_window: Duration,
}

impl SagaDeps {
    /// How long the write that marks a payment or refund sent holds it: for the whole
    /// send, counted from that write, so nobody else can claim and send it meanwhile.
    /// What holds it already (a worker's claim, a request's lease from its registration)
    /// may be running out: a request's lease was counted from before its registration
    /// waited for a connection or a lock, and a stalled database can use up what the lease
    /// had beyond a send. Never less than what holds it already.
    pub fn send_hold_until(
        &self,
        claimed_until: Option<chrono::DateTime<chrono::Utc>>,
    ) -> chrono::DateTime<chrono::Utc> {
        let hold = store::now_plus(self.send_hold);
        claimed_until.map_or(hold, |held| held.max(hold))
    }

    /// When the reconciler looks at a payment or refund again: `PAGOS_STALE_AFTER`,
    /// doubled `doublings` times (with jitter), so a gateway that keeps failing is not
    /// asked or resent to every period.
    pub fn next_look(&self, doublings: i32) -> chrono::DateTime<chrono::Utc> {
        let jitter: f64 = rand::Rng::random(&mut rand::rng());
        crate::db::now() + backoff::backoff(self.stale_after, doublings, jitter)
    }
}

/// What the store writes rendered: the key's frozen answer and the event's `datos`.
pub(crate) const RENDER: store::Render = store::Render {
    answer: representation::frozen,
    datos: representation::datos,
};

/// Applies `event` to `current` in `tx` (`store::plan`, written in `tx`), freezing the
/// key's answer as the contract renders it when the payment becomes final. Every decision
/// goes through here or `apply_now`: the store writes, the answer is rendered above it.
pub async fn apply<C: sea_orm::ConnectionTrait>(
    tx: &C,
    current: &payment::Model,
    event: Event,
    changes: impl Into<Step>,
    actor: Actor,
    reason: &str,
) -> Result<Written, StoreError> {
    let mut plan = current.plan(event, changes.into(), actor, reason, RENDER)?;
    if !PaymentState::IN_FLIGHT.contains(&current.state) {
        // A payment that was COMPLETADA, FALLIDA or under review may have refunds: its
        // event says how much went back, as its read does (never a 0 a merchant's ledger
        // would take for true).
        // Summed under the payment's lock (`refunded_amount_locked` says why).
        let refunded = refund::store::refunded_amount_locked(tx, current.id)
            .await
            .map_err(StoreError::Db)?;
        crate::failpoint::pause("after_refunded_sum").await;
        if refunded > 0 {
            plan.retell(&representation::datos_refunded(&plan.next, refunded));
        }
    }
    Ok(plan.write(tx, current).await?)
}

pub fn charge_request(p: &payment::Model) -> ChargeRequest {
    ChargeRequest {
        gateway_key: p.gateway_key.clone(),
        amount: p.amount,
        currency: p.currency.clone(),
        reference: p.id,
        description: p.description.clone(),
        payment_method: p.payment_method.as_deref().and_then(|stored| {
            let parsed = serde_json::from_str(stored)
                .ok()
                .and_then(|v| crate::domain::PaymentMethod::from_json(&v).ok());
            if parsed.is_none() {
                // Written by `register` from a parsed method: only a bug or a hand edit
                // gets here. The adapter refuses a charge without one.
                tracing::error!(payment_id = %p.id, "stored medioPago does not parse");
            }
            parsed
        }),
    }
}

/// A saga's row (a payment, a refund) as its steps send it (`send`). What is a payment's
/// or a refund's own is said here; its log lines stay in its own module.
pub trait Saga: SagaRow {
    type Error: std::fmt::Display + From<sea_orm::DbErr> + From<Self::Illegal> + Send;
    /// Its table, where it is read again when someone else moved it first.
    type Table: store::Claimable<Model = Self>;
    /// What a send reads before it marks the row sent.
    type Prepared: Send;
    /// What the gateway said to a send.
    type Outcome: Send;
    /// The reason of the mark: a request's send, the send of a row never sent, a resend.
    const SEND_REASONS: [&'static str; 3];
    /// The failpoints right after the mark and right after the gateway's answer.
    const FAILPOINTS: [&'static str; 2];
    /// The key's frozen answer and the event's `datos` as the contract renders them
    /// (`representation`): the store writes them, it never renders.
    const RENDER: Self::Render;

    /// What the send reads before it marks the row sent.
    fn prepare(
        &self,
        deps: &SagaDeps,
    ) -> impl Future<Output = Result<Self::Prepared, Self::Error>> + Send;

    /// The gateway call of a send of the row as marked, with retries and the same key.
    fn call(
        &self,
        deps: &SagaDeps,
        prepared: Self::Prepared,
        maybe_sent_before: bool,
    ) -> impl Future<Output = Self::Outcome> + Send;

    /// Its log line of the gateway's answer.
    fn log_answered(&self, outcome: &Self::Outcome);

    /// What the gateway's answer to a send means for the row (its log line when the
    /// answer says nothing).
    fn settle(&self, outcome: Self::Outcome) -> Settle<Self::Event>;

    /// Its log line when someone else moved the row first.
    fn log_moved(&self);
}

/// What the gateway's answer to a send means for its row.
pub enum Settle<E> {
    /// A decision: the event, what it records, and why.
    Move(E, Step, String),
    /// Not final yet: the reconciler asks the provider again later, by the reference the
    /// provider gave.
    Pending(String),
    /// Not known (`why`: a timeout, a 5xx, a refused connection): the reconciler asks the
    /// provider later, and `why` is the row's last error meanwhile.
    Unknown(String),
}

/// One event committed on its own, with the answer rendered for the key.
pub async fn apply_now<R: Saga>(
    db: &DatabaseConnection,
    current: &R,
    event: R::Event,
    changes: impl Into<Step>,
    actor: Actor,
    reason: &str,
) -> Result<Written<R>, R::Error> {
    let plan = current.plan(event, changes.into(), actor, reason, R::RENDER)?;
    Ok(plan.write_now(db, current).await?)
}

/// Marks the payment or refund sent, calls the gateway (with retries, same key), and
/// records the outcome. Returns the row as it stands afterwards — possibly as someone
/// else left it, if they moved it first (fencing).
pub async fn send<R: Saga>(deps: &SagaDeps, current: R, actor: Actor) -> Result<R, R::Error> {
    Ok(match send_reporting(deps, current, actor).await? {
        Sending::Made(after) | Sending::NotSent(after) | Sending::Fenced(after) => after,
    })
}

/// What `send_reporting` came to: the row after the send, or as someone else left it when
/// they moved it before it was marked sent (nothing was sent).
pub enum Sending<R> {
    Made(R),
    /// Marked sent, but handed back to the reconciler without a call (its hold, or the
    /// gateway's key window, too short for a send).
    NotSent(R),
    Fenced(R),
}

/// `send`, saying whether this call sent anything: a pass counts a payment someone else
/// moved first as skipped (`omitidos`), not as what they made of it.
pub async fn send_reporting<R: Saga>(
    deps: &SagaDeps,
    current: R,
    actor: Actor,
) -> Result<Sending<R>, R::Error> {
    // Once any try of this row may have reached the gateway (it was marked sent before),
    // only a readable status settles it: a refusal of this send proves nothing about what
    // an earlier one may have done.
    let maybe_sent_before = current.state() == R::State::SENT;
    let hold_until = Some(deps.send_hold_until(current.claimed_until()));
    let [request, never_sent, resend] = R::SEND_REASONS;
    let reason = match actor {
        Actor::Request => request,
        _ if current.state() == R::State::NEVER_SENT => never_sent,
        _ => resend,
    };
    let prepared = current.prepare(deps).await?;
    failpoint::pause("before_mark_sent").await;
    let marked = Step {
        count_attempt: true,
        hold_until,
        ..Step::default()
    };
    let sent = match apply_now(&deps.db, &current, R::State::SEND, marked, actor, reason).await? {
        Written::Applied(sent) => *sent,
        Written::Fenced => return Ok(Sending::Fenced(reload(deps, &current).await?)),
    };
    let [after_mark_sent, after_gateway_response] = R::FAILPOINTS;
    failpoint::hit(after_mark_sent);
    // The hold was counted before the write, which may have waited (for a connection, for
    // a lock) past its margin: a send begun now could outlast it, and another process,
    // seeing it run out, send the same again. Not sent, then: handed to the reconciler,
    // which looks it up (nothing is there) and sends it with the same key.
    if let Some(short) = hold_short_of_a_send(deps, &sent) {
        let why = format!(
            "not sent: the write that marked it sent came back with {} of its hold left, less than a send may last; the reconciler sends it",
            humantime::format_duration(short)
        );
        tracing::warn!(id = %sent.id(), "{why}");
        let written = hand_over(deps, &sent, None, LastError::Now(why)).await?;
        return Ok(Sending::NotSent(kept(deps, written, &sent).await?));
    }
    // The reconciler chose to send inside the gateway's key window, but its write may
    // have waited since: a send that could end past the window might reach a gateway that
    // has forgotten the key, and charge a second time beside a first send it cannot see.
    // Not sent: handed to the reconciler, which, past the window, gives it to on-call.
    if let Some(age) = past_the_key_window(
        crate::db::now() - sent.created_at(),
        deps.send_lasts,
        deps.key_window,
    ) {
        let why = format!(
            "not sent: registered {} ago, a send now could end past the gateway's key window ({}); the reconciler decides",
            humantime::format_duration(age),
            humantime::format_duration(deps.key_window)
        );
        tracing::warn!(id = %sent.id(), "{why}");
        let written = hand_over(deps, &sent, None, LastError::Now(why)).await?;
        return Ok(Sending::NotSent(kept(deps, written, &sent).await?));
    }

    let outcome = sent.call(deps, prepared, maybe_sent_before).await;
    failpoint::hit(after_gateway_response);
    sent.log_answered(&outcome);
    Ok(Sending::Made(
        record_outcome(deps, sent, outcome, actor).await?,
    ))
}

/// The row's age (whole seconds) when a send begun at that `age`, lasting up to
/// `send_lasts`, could end past the gateway's `key_window`.
fn past_the_key_window(
    age: chrono::TimeDelta,
    send_lasts: Duration,
    key_window: Duration,
) -> Option<Duration> {
    let age = age.to_std().unwrap_or_default();
    (age + send_lasts >= key_window).then(|| Duration::from_secs(age.as_secs()))
}

/// What is left of the hold `sent` was marked sent with, if less than a send may last
/// (whole milliseconds).
fn hold_short_of_a_send<R: Saga>(deps: &SagaDeps, sent: &R) -> Option<Duration> {
    let until = sent.claimed_until()?;
    let left = (until - crate::db::now()).to_std().unwrap_or_default();
    (left < deps.send_lasts).then(|| Duration::from_millis(left.as_millis() as u64))
}

/// Writes what the gateway said: final states freeze the key's answer; pending and
/// unknown hand the row to the reconciler.
pub async fn record_outcome<R: Saga>(
    deps: &SagaDeps,
    sent: R,
    outcome: R::Outcome,
    actor: Actor,
) -> Result<R, R::Error> {
    let written = match sent.settle(outcome) {
        Settle::Move(event, step, reason) => {
            apply_now(&deps.db, &sent, event, step, actor, &reason).await?
        }
        // The provider answered: whatever error came before, it now waits on the provider.
        Settle::Pending(gateway_ref) => {
            hand_over(deps, &sent, Some(gateway_ref), LastError::Cleared).await?
        }
        Settle::Unknown(why) => {
            let error = LastError::Now(format!("send's outcome unknown: {why}"));
            hand_over(deps, &sent, None, error).await?
        }
    };
    kept(deps, written, &sent).await
}

/// Hands `sent` to the reconciler, due again after the backoff of its sends (doubled for
/// each earlier one).
async fn hand_over<R: Saga>(
    deps: &SagaDeps,
    sent: &R,
    gateway_ref: Option<String>,
    error: LastError,
) -> Result<Written<R>, sea_orm::DbErr> {
    let due = deps.next_look(sent.attempts() - 1);
    store::hand_over(&deps.db, sent, gateway_ref, &error, due).await
}

/// The row a fenced write of `current` left: as written, or, if someone else moved it
/// first, as they left it.
pub async fn kept<R: Saga>(
    deps: &SagaDeps,
    written: Written<R>,
    current: &R,
) -> Result<R, R::Error> {
    match written {
        Written::Applied(row) => Ok(*row),
        Written::Fenced => reload(deps, current).await,
    }
}

/// The row as someone else left it, who moved it first (its log line says so).
async fn reload<R: Saga>(deps: &SagaDeps, current: &R) -> Result<R, R::Error> {
    current.log_moved();
    let found = store::find_row::<R::Table>(&deps.db, current.id()).await?;
    Ok(found.unwrap_or_else(|| current.clone()))
}

/// A payment as its steps send it.
impl Saga for payment::Model {
    type Error = StoreError;
    type Prepared = ();
    type Outcome = ChargeOutcome;
    type Table = payment::Entity;
    const SEND_REASONS: [&'static str; 3] = [
        "sending to the gateway",
        "sending to the gateway (registered, never sent)",
        "resending to the gateway with the same key (the provider has no charge for it)",
    ];
    const FAILPOINTS: [&'static str; 2] = ["after_mark_sent", "after_gateway_response"];
    const RENDER: store::Render = RENDER;

    async fn prepare(&self, _deps: &SagaDeps) -> Result<(), StoreError> {
        Ok(())
    }

    async fn call(&self, deps: &SagaDeps, (): (), maybe_sent_before: bool) -> ChargeOutcome {
        retry::charge(
            deps.gateway.as_ref(),
            &charge_request(self),
            deps.policy,
            maybe_sent_before,
        )
        .await
    }

    fn log_answered(&self, outcome: &ChargeOutcome) {
        tracing::info!(payment_id = %self.id, outcome = outcome_name(outcome), "gateway answered");
    }

    fn settle(&self, outcome: ChargeOutcome) -> Settle<Event> {
        match outcome {
            // A pending answer too: one of another charge than the payment's own (a
            // second charge, which may yet succeed) or of another amount goes to review
            // instead of taking the payment's `gatewayRef`.
            ChargeOutcome::Succeeded(charge)
            | ChargeOutcome::Declined(charge)
            | ChargeOutcome::Pending(charge) => match settlement(self, &charge) {
                Some((event, changes, reason)) => Settle::Move(event, changes.into(), reason),
                None => Settle::Pending(charge.id),
            },
            ChargeOutcome::Rejected { status, detail } => Settle::Move(
                Event::Declined,
                Step {
                    code: Some(format!("{GATEWAY_REJECTED_PREFIX}_{status}")),
                    ..Step::default()
                },
                format!("gateway refused the request with {status}: {detail}"),
            ),
            ChargeOutcome::Unknown(why) => {
                tracing::warn!(payment_id = %self.id, why, "gateway outcome unknown; the reconciler will ask the provider");
                Settle::Unknown(why)
            }
        }
    }

    fn log_moved(&self) {
        tracing::info!(payment_id = %self.id, "payment moved by someone else first; keeping their decision");
    }
}

pub fn outcome_name(outcome: &ChargeOutcome) -> &'static str {
    match outcome {
        ChargeOutcome::Succeeded(_) => "succeeded",
        ChargeOutcome::Declined(_) => "declined",
        ChargeOutcome::Pending(_) => "pending",
        ChargeOutcome::Rejected { .. } => "rejected",
        ChargeOutcome::Unknown(_) => "unknown",
    }
}

/// The event a final charge means for its payment, and what to record with it. A charge
/// that is not the payment's own never settles it, whether it succeeded or was declined:
/// one for another amount or currency (a gateway answering a key's earlier request, after
/// the database forgot the payment and the client changed its body), or another charge
/// than the one the provider named for the payment before (a second charge). On-call
/// decides, as for the webhook of such a charge: a decline of a request the gateway never
/// evaluated is not the payment's decline. A pending charge that is its own settles
/// nothing (None); one that is not goes to on-call as well.
pub fn settlement(p: &payment::Model, charge: &Charge) -> Option<(Event, Changes, String)> {
    let said = match charge.status {
        ChargeStatus::Succeeded => "charge",
        ChargeStatus::Pending => "pending charge",
        ChargeStatus::Declined => "declined charge",
    };
    let not_its_own = if charge.amount != p.amount || charge.currency != p.currency {
        Some(format!(
            "{said} {} is for {} {}, but the payment is for {} {}",
            charge.id, charge.amount, charge.currency, p.amount, p.currency
        ))
    } else {
        p.gateway_ref
            .as_deref()
            .filter(|named| *named != charge.id)
            .map(|named| {
                format!(
                    "{said} {}, but the provider named {named} for this payment before: a second charge",
                    charge.id
                )
            })
    };
    if let Some(why) = not_its_own {
        // The charge the provider named first stays recorded; the other is in the reason.
        return Some((
            Event::Escalate,
            Changes {
                gateway_ref: p.gateway_ref.is_none().then(|| charge.id.clone()),
                ..Changes::default()
            },
            why,
        ));
    }
    match charge.status {
        ChargeStatus::Succeeded => Some((
            Event::Charged,
            Changes {
                gateway_ref: Some(charge.id.clone()),
                ..Changes::default()
            },
            format!("gateway charged ({})", charge.id),
        )),
        ChargeStatus::Declined if charge.charged_back() => Some((
            Event::Escalate,
            Changes {
                gateway_ref: p.gateway_ref.is_none().then(|| charge.id.clone()),
                ..Changes::default()
            },
            format!(
                "charge {} was charged back: it took the money and the payer disputed it, so it is not a decline (no money taken); on-call decides whether the money stands",
                charge.id
            ),
        )),
        ChargeStatus::Declined => {
            let code = charge
                .decline_code
                .as_deref()
                .map_or_else(|| "declined".into(), crate::gateway::decline_code);
            Some((
                Event::Declined,
                Changes {
                    gateway_ref: Some(charge.id.clone()),
                    decline_code: Some(code.clone()),
                    ..Changes::default()
                },
                format!("gateway declined ({}): {code}", charge.id),
            ))
        }
        ChargeStatus::Pending => None,
    }
}

#[cfg(test)]
mod tests {
    use super::past_the_key_window;
    use chrono::TimeDelta;
    use std::time::Duration;

    /// A send begins only if it ends inside the gateway's key window, whatever the
    /// reconciler saw when it chose to send: its write may have waited since.
    #[test]
    fn a_send_that_could_end_past_the_key_window_is_not_begun() {
        let hour = Duration::from_secs(3600);
        let lasts = Duration::from_secs(52);
        assert_eq!(
            past_the_key_window(TimeDelta::seconds(3), lasts, hour),
            None,
            "a request's own send"
        );
        assert_eq!(
            past_the_key_window(TimeDelta::seconds(3600 - 53), lasts, hour),
            None,
            "ends a second inside"
        );
        assert_eq!(
            past_the_key_window(TimeDelta::seconds(3600 - 52), lasts, hour),
            Some(Duration::from_secs(3548)),
            "would end at the window's edge"
        );
        assert_eq!(
            past_the_key_window(TimeDelta::minutes(62), lasts, hour),
            Some(Duration::from_secs(62 * 60)),
            "chosen at 58 min, its write waited 4"
        );
        assert_eq!(
            past_the_key_window(TimeDelta::seconds(-5), lasts, hour),
            None,
            "a clock a little behind the row's"
        );
    }
}
