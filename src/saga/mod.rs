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
use state::{Event, PaymentState};
use std::sync::Arc;
use std::time::Duration;
use store::{Actor, Changes, StoreError, Written};

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
}

impl SagaDeps {
    /// How long the write that marks a payment or refund sent holds it: for the whole
    /// send, so nobody else can claim and send it meanwhile. A request already holds it
    /// for its lease, which is longer than any send (checked at start): None. A worker's
    /// claim (`claimed_until`) may be running out.
    pub fn send_hold_until(
        &self,
        actor: Actor,
        claimed_until: Option<chrono::DateTime<chrono::Utc>>,
    ) -> Option<chrono::DateTime<chrono::Utc>> {
        (actor != Actor::Request).then(|| {
            let hold = store::now_plus(self.send_hold);
            claimed_until.map_or(hold, |held| held.max(hold))
        })
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
const RENDER: store::Render = store::Render {
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
    changes: Changes,
    actor: Actor,
    reason: &str,
) -> Result<Written, StoreError> {
    let plan = store::plan(current, event, changes, actor, reason, RENDER)?;
    Ok(plan.write(tx, current).await?)
}

/// One event committed on its own (`store::plan`, written by itself), with the rendered
/// answer.
pub async fn apply_now(
    db: &DatabaseConnection,
    current: &payment::Model,
    event: Event,
    changes: Changes,
    actor: Actor,
    reason: &str,
) -> Result<Written, StoreError> {
    let plan = store::plan(current, event, changes, actor, reason, RENDER)?;
    Ok(plan.write_now(db, current).await?)
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

/// Marks the payment ENVIADA, calls the gateway (with retries, same key), and records the
/// outcome. Returns the payment as it stands afterwards — possibly as someone else left
/// it, if they moved it first (fencing).
pub async fn send(
    deps: &SagaDeps,
    current: payment::Model,
    actor: Actor,
) -> Result<payment::Model, StoreError> {
    // Once any try of this payment may have reached the gateway (it was marked ENVIADA
    // before), only a readable charge status settles it: a refusal of this send proves
    // nothing about the charge an earlier one may have made.
    let maybe_sent_before = current.state == PaymentState::Enviada;
    let hold_until = deps.send_hold_until(actor, current.claimed_until);
    let reason = match (actor, current.state.as_str()) {
        (Actor::Request, _) => "sending to the gateway",
        (_, "EN_PROCESO") => "sending to the gateway (registered, never sent)",
        _ => "resending to the gateway with the same key (the provider has no charge for it)",
    };
    let sent = match apply_now(
        &deps.db,
        &current,
        Event::Send,
        Changes {
            count_attempt: true,
            hold_until,
            ..Changes::default()
        },
        actor,
        reason,
    )
    .await?
    {
        Written::Applied(sent) => *sent,
        Written::Fenced => return reload(deps, &current).await,
    };
    failpoint::hit("after_mark_sent");

    let outcome = retry::charge(
        deps.gateway.as_ref(),
        &charge_request(&sent),
        deps.policy,
        maybe_sent_before,
    )
    .await;
    failpoint::hit("after_gateway_response");
    tracing::info!(payment_id = %sent.id, outcome = outcome_name(&outcome), "gateway answered");
    record_outcome(deps, sent, outcome, actor).await
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
/// for another amount or currency than the payment's never settles it: on-call decides.
pub fn settlement(p: &payment::Model, charge: &Charge) -> Option<(Event, Changes, String)> {
    if charge.status == ChargeStatus::Succeeded
        && (charge.amount != p.amount || charge.currency != p.currency)
    {
        return Some((
            Event::Escalate,
            Changes {
                gateway_ref: Some(charge.id.clone()),
                ..Changes::default()
            },
            format!(
                "charge {} is for {} {}, but the payment is for {} {}",
                charge.id, charge.amount, charge.currency, p.amount, p.currency
            ),
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
        ChargeStatus::Declined => {
            let code = charge
                .decline_code
                .clone()
                .unwrap_or_else(|| "declined".into());
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

/// Writes what the gateway said: final states freeze the key's answer; pending and
/// unknown hand the payment to the reconciler.
pub async fn record_outcome(
    deps: &SagaDeps,
    sent: payment::Model,
    outcome: ChargeOutcome,
    actor: Actor,
) -> Result<payment::Model, StoreError> {
    let (event, changes, reason) = match outcome {
        ChargeOutcome::Succeeded(charge) | ChargeOutcome::Declined(charge) => {
            match settlement(&sent, &charge) {
                Some(settled) => settled,
                None => return Ok(sent),
            }
        }
        ChargeOutcome::Rejected { status, detail } => (
            Event::Declined,
            Changes {
                decline_code: Some(format!("{GATEWAY_REJECTED_PREFIX}_{status}")),
                ..Changes::default()
            },
            format!("gateway refused the request with {status}: {detail}"),
        ),
        ChargeOutcome::Pending(charge) => {
            // Doubled for each earlier send.
            let due = deps.next_look(sent.attempts - 1);
            return match store::hand_over(&deps.db, &sent, Some(charge.id), due).await? {
                Written::Applied(p) => Ok(*p),
                Written::Fenced => reload(deps, &sent).await,
            };
        }
        ChargeOutcome::Unknown(why) => {
            tracing::warn!(payment_id = %sent.id, why, "gateway outcome unknown; the reconciler will ask the provider");
            // Doubled for each earlier send.
            let due = deps.next_look(sent.attempts - 1);
            return match store::hand_over(&deps.db, &sent, None, due).await? {
                Written::Applied(p) => Ok(*p),
                Written::Fenced => reload(deps, &sent).await,
            };
        }
    };
    match apply_now(&deps.db, &sent, event, changes, actor, &reason).await? {
        Written::Applied(p) => Ok(*p),
        Written::Fenced => reload(deps, &sent).await,
    }
}

async fn reload(deps: &SagaDeps, p: &payment::Model) -> Result<payment::Model, StoreError> {
    tracing::info!(payment_id = %p.id, "payment moved by someone else first; keeping their decision");
    Ok(store::find_payment(&deps.db, p.id)
        .await?
        .unwrap_or_else(|| p.clone()))
}
