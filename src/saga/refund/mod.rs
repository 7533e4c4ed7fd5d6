//! The refund saga, the compensating step of a payment's: register (with the check of
//! what is left of the payment) → mark sent → gateway call → settle or hand over to the
//! reconciler. The same shape and guarantees as a payment's: one refund at the gateway per
//! refund (one derived gateway key, every send with it), never lost, never half-written.
//!
//! `state` is the pure state machine; `store` is the database work; this module runs the
//! steps. It never holds a transaction across the gateway call, and never calls the
//! gateway for a refund it has not first marked ENVIADO.

pub mod reconcile;
pub mod state;
pub mod store;

use crate::entities::refund;
use crate::gateway::retry::{self, RefundOutcome};
use crate::gateway::{Refund, RefundRequest, RefundStatus, RejectReason};
use crate::representation;
use crate::saga::store::Step;
use crate::saga::{Saga, SagaDeps, Settle};
use state::{Event, RefundState};
use store::{Changes, StoreError};

pub use crate::saga::{apply_now, send};

pub use crate::entities::refund_transition::Actor;

/// `failure_code` of a refund the gateway refused outright.
pub const GATEWAY_REJECTED: &str = "gateway_rejected";

/// `failure_code` of a refund on-call resolved as failed.
pub const RESOLVED_FAILED: &str = "resolved_by_on_call";

/// What the refund store writes rendered: the key's frozen answer and the event's
/// `datos`, and the payment's, for a compensation refund whose failure takes its payment
/// to review.
pub const RENDER: store::Render = store::Render {
    refund: crate::saga::store::Render {
        answer: representation::refund_frozen,
        datos: representation::refund_datos,
    },
    payment: crate::saga::RENDER,
    payment_refunded: representation::datos_refunded,
};

/// What every send of `r` asks the gateway: the same key and the same body. `whole` when
/// the refund is the payment's whole amount (`payment_amount`).
pub fn refund_request(r: &refund::Model, payment_amount: i64) -> RefundRequest {
    RefundRequest {
        gateway_key: r.gateway_key.clone(),
        charge: r.charge_ref.clone(),
        amount: r.amount,
        currency: r.currency.clone(),
        reference: r.id,
        reason: r.reason.clone(),
        whole: r.amount == payment_amount,
    }
}

/// A refund as its steps send it (`saga::send`, also `send` here). Its send reads the
/// payment's amount first: the request says whether the refund is the whole payment.
impl Saga for refund::Model {
    type Error = StoreError;
    /// The payment's amount (0 if the payment is not found).
    type Prepared = i64;
    type Outcome = RefundOutcome;
    type Table = refund::Entity;
    const SEND_REASONS: [&'static str; 3] = [
        "sending the refund to the gateway",
        "sending the refund to the gateway (registered, never sent)",
        "resending the refund with the same key (the provider has none for it)",
    ];
    const FAILPOINTS: [&'static str; 2] =
        ["refund_after_mark_sent", "refund_after_gateway_response"];
    const RENDER: store::Render = RENDER;

    async fn prepare(&self, deps: &SagaDeps) -> Result<i64, StoreError> {
        Ok(crate::saga::store::find_payment(&deps.db, self.payment_id)
            .await?
            .map_or(0, |p| p.amount))
    }

    async fn call(
        &self,
        deps: &SagaDeps,
        payment_amount: i64,
        maybe_sent_before: bool,
    ) -> RefundOutcome {
        retry::refund(
            deps.gateway.as_ref(),
            &refund_request(self, payment_amount),
            deps.policy,
            maybe_sent_before,
        )
        .await
    }

    fn log_answered(&self, outcome: &RefundOutcome) {
        tracing::info!(refund_id = %self.id, outcome = outcome_name(outcome), "gateway answered the refund");
    }

    fn settle(&self, outcome: RefundOutcome) -> Settle<Event> {
        match outcome {
            // A pending answer too: one of another provider refund than the refund's own (a
            // second refund at the provider, which may yet succeed) or of another amount goes
            // to review instead of taking the refund's `gatewayRef`.
            RefundOutcome::Succeeded(found)
            | RefundOutcome::Failed(found)
            | RefundOutcome::Pending(found) => match settlement(self, &found) {
                Some((event, changes, reason)) => Settle::Move(event, changes.into(), reason),
                None => Settle::Pending(found.id),
            },
            RefundOutcome::Rejected {
                status,
                detail,
                reason,
            } => {
                let code = match reason {
                    RejectReason::ExceedsRemaining => "amount_exceeds_remaining".to_owned(),
                    RejectReason::Other => format!("{GATEWAY_REJECTED}_{status}"),
                };
                Settle::Move(
                    Event::Failed,
                    Step {
                        code: Some(code),
                        ..Step::default()
                    },
                    format!("gateway refused the refund with {status}: {detail}"),
                )
            }
            RefundOutcome::Unknown(why) => {
                tracing::warn!(refund_id = %self.id, why, "refund outcome unknown; the reconciler will ask the provider");
                Settle::Unknown(why)
            }
        }
    }

    fn log_moved(&self) {
        tracing::info!(refund_id = %self.id, "refund moved by someone else first; keeping their decision");
    }
}

pub fn outcome_name(outcome: &RefundOutcome) -> &'static str {
    match outcome {
        RefundOutcome::Succeeded(_) => "succeeded",
        RefundOutcome::Failed(_) => "failed",
        RefundOutcome::Pending(_) => "pending",
        RefundOutcome::Rejected { .. } => "rejected",
        RefundOutcome::Unknown(_) => "unknown",
    }
}

/// Why the provider refund `found` (which carries `r`'s reference) is not `r`'s own, if it
/// is not: a refund of another charge than `r`'s (when it names its charge: a report that
/// carries none is not refused for that), or another provider refund than the one the
/// provider named for `r` before (`gatewayRef`): a second refund at the provider. None when
/// it may be `r`'s own (the same id, or `r` has no `gatewayRef` yet: its answer was lost).
pub fn not_its_own(r: &refund::Model, found: &Refund) -> Option<String> {
    let status = status_word(found.status);
    if !found.charge.is_empty() && found.charge != r.charge_ref {
        return Some(format!(
            "refund {} {status} is of charge {}, but the refund is of charge {}: another charge's refund carrying this refund's reference",
            found.id, found.charge, r.charge_ref
        ));
    }
    r.gateway_ref
        .as_deref()
        .filter(|own| *own != found.id)
        .map(|own| {
            format!(
                "refund {} {status}, but the provider named {own} for this refund before: the provider holds 2 refunds for this one refund ({own}, {})",
                found.id, found.id
            )
        })
}

/// Why `found` is not what `r` asked for, if it is not: another amount or currency.
pub fn other_amount(r: &refund::Model, found: &Refund) -> Option<String> {
    (found.amount != r.amount || !found.currency.eq_ignore_ascii_case(&r.currency)).then(|| {
        format!(
            "refund {} is for {} {}, but the refund asked for {} {}",
            found.id, found.amount, found.currency, r.amount, r.currency
        )
    })
}

/// A refund's status as the audit trail says it.
pub fn status_word(status: RefundStatus) -> &'static str {
    match status {
        RefundStatus::Succeeded => "succeeded",
        RefundStatus::Failed => "failed",
        RefundStatus::Pending => "pending",
    }
}

/// The event a gateway refund means for `r`, and what to record with it. None: pending.
/// A refund that is not `r`'s own (another charge's, or another provider refund than the
/// one named for `r` before) or is for another amount or currency never settles it,
/// succeeded or failed: on-call decides, and `r` keeps its own `gatewayRef`.
pub fn settlement(r: &refund::Model, found: &Refund) -> Option<(Event, Changes, String)> {
    if let Some(why) = not_its_own(r, found) {
        // Another provider refund: the refund's own `gatewayRef`, if any, stays.
        return Some((Event::Escalate, Changes::default(), why));
    }
    let changes = Changes {
        gateway_ref: Some(found.id.clone()),
        ..Changes::default()
    };
    if let Some(why) = other_amount(r, found) {
        return Some((Event::Escalate, changes, why));
    }
    match found.status {
        RefundStatus::Succeeded => Some((
            Event::Refunded,
            changes,
            format!("gateway refunded ({})", found.id),
        )),
        RefundStatus::Failed => {
            let code = found
                .failure_code
                .clone()
                .unwrap_or_else(|| "failed".into());
            Some((
                Event::Failed,
                Changes {
                    failure_code: Some(crate::gateway::decline_code(&code)),
                    ..changes
                },
                format!("gateway refund failed ({}): {code}", found.id),
            ))
        }
        RefundStatus::Pending => None,
    }
}

/// What pagos does with a charge it finds for a payment whose answer was `FALLIDA`
/// (`PAGOS_ORPHAN_CHARGES`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum OrphanCharges {
    /// Refund it in full through the refund saga, so the answer (no money taken) becomes
    /// true again.
    #[default]
    Refund,
    /// Send the payment to `REVISION_MANUAL`: on-call decides.
    Review,
}

/// What compensating one charge came to (`compensate_in`). Every charge pagos means to
/// give back ends in exactly one of these; none is dropped without a word.
#[derive(Debug)]
pub enum Compensation {
    /// A refund of what is left of the charge, registered in the caller's transaction.
    Started(Box<refund::Model>),
    /// The charge's compensation refund exists already (the last of pagos' own refunds
    /// of it; the first one's key is the charge's id): whatever that refund came to is the
    /// charge's compensation.
    Taken(Box<refund::Model>),
    /// pagos' `COMPLETADO` refunds of the charge already give all of it back.
    Covered,
    /// A refund of the charge is neither `COMPLETADO` nor `FALLIDO` yet (in flight or
    /// under review): what is left of the charge is not known until it settles, and a
    /// refund of the rest now could be too little (it fails) or too much (the provider
    /// refuses it). Nothing was written.
    Unsettled(Box<refund::Model>),
    /// Not registered (the payment is gone or not `FALLIDA`); nothing was written.
    Refused(store::Registered),
    /// The charge is in another currency than the payment (`currency`): pagos refunds a
    /// payment's charges in the payment's currency only, and a refund of this one would be
    /// asked for in the wrong currency, refused by the provider every time. On-call
    /// decides; nothing was written.
    OtherCurrency { charge: String, currency: String },
}

impl Compensation {
    /// Whether the charge is refunded, or being refunded, by what this came to: false
    /// when it cannot be, as things stand, without on-call.
    pub fn gives_back(&self) -> bool {
        match self {
            Compensation::Started(_) | Compensation::Covered => true,
            Compensation::Taken(r) => {
                !matches!(r.state, RefundState::Fallido | RefundState::RevisionManual)
            }
            Compensation::Unsettled(_)
            | Compensation::Refused(_)
            | Compensation::OtherCurrency { .. } => false,
        }
    }

    /// Why the charge cannot be given back now, for on-call (empty when it can).
    pub fn why_not(&self) -> String {
        match self {
            Compensation::Taken(r) if r.state == RefundState::Fallido => format!(
                "its compensation refund {} failed ({}); a failed refund is never sent again, and only on-call's resolution FALLIDA with reembolsar refunds the charge anew",
                r.id,
                r.failure_code.as_deref().unwrap_or("no code")
            ),
            Compensation::Taken(r) if r.state == RefundState::RevisionManual => format!(
                "its compensation refund {} is under review: settle it first (POST /admin/reembolsos/{}/resolucion)",
                r.id, r.id
            ),
            Compensation::Unsettled(r) => format!(
                "refund {} of it is {}: what is left of the charge is known only once it settles; wait for it (or settle it, if it is under review) and try again",
                r.id, r.state
            ),
            Compensation::OtherCurrency { charge, currency } => format!(
                "charge {charge} is in {currency}, not in the payment's currency: pagos refunds a payment's charges in its own currency only; refund it in the provider's dashboard, then resolve the payment FALLIDA with contraProveedor saying so (its search still shows the charge succeeded)"
            ),
            Compensation::Refused(store::Registered::NoPayment) => "the payment is gone".into(),
            Compensation::Refused(store::Registered::NotRefundable(state)) => {
                format!("the payment is {state}, not FALLIDA")
            }
            Compensation::Refused(store::Registered::ExceedsRemaining { remaining }) => {
                format!("only {remaining} of it is left to refund")
            }
            _ => String::new(),
        }
    }
}

/// What `compensate_in` does with a charge whose compensation refund failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AfterFailure {
    /// Nothing (`Compensation::Taken`): the failure took the payment to on-call, who
    /// decides. A gateway event reporting the charge again.
    Stop,
    /// A new compensation refund of what is left of the charge, with a key of its own:
    /// on-call's resolution `FALLIDA` with `reembolsar`, asked knowing the last one
    /// failed. The failed refund is final and never sent again, so the new one cannot
    /// meet it at the provider. Also when the last one completed but no longer gives all
    /// of the charge back (a refund counted beside it failed since).
    RefundAgain,
}

/// The compensation of an orphan charge: a refund of what is left of `charge` — its
/// amount less pagos' `COMPLETADO` refunds of it (a payment that was `COMPLETADA` may have
/// refunds of its own charge already) — registered in the caller's transaction, in pagos'
/// own key space (the key is the charge's id, so the same charge found twice is refunded
/// once), with an audit row on the payment saying why. The charge's compensation is the
/// last of pagos' own refunds of it: when that one failed, or completed while a refund
/// counted beside it failed since, `after_failure` says whether a new one is made (its
/// key: the charge's id and its number, `ch_…#2`, so a resolution retried makes it once). The refund is due at once: the next reconciliation pass sends
/// it (or on-call's "reconcile now"). The payment must be `FALLIDA`; its row must be
/// locked by the caller or the database serialized (`lock` as `store::register_in`).
pub async fn compensate_in<C: sea_orm::ConnectionTrait>(
    tx: &C,
    p: &crate::entities::payment::Model,
    charge: &crate::gateway::Charge,
    actor: Actor,
    why: &str,
    after_failure: AfterFailure,
    lock: bool,
) -> Result<Compensation, sea_orm::DbErr> {
    use crate::entities::payment_transition as payment_transitions;
    use sea_orm::EntityTrait;
    if !charge.currency.eq_ignore_ascii_case(&p.currency) {
        return Ok(Compensation::OtherCurrency {
            charge: charge.id.clone(),
            currency: charge.currency.clone(),
        });
    }
    let scope = crate::entities::refund::KeyScope::Orphan;
    let earlier = store::of_charge(tx, p.id, &charge.id).await?;
    let compensations: Vec<&refund::Model> =
        earlier.iter().filter(|r| r.key_scope == scope).collect();
    let (key, failed_before) = match compensations.last() {
        None => match store::find_key(tx, p.merchant_id, scope, &charge.id).await? {
            // Taken by a refund of another payment's: never a second refund of it here.
            Some(existing) => return Ok(Compensation::Taken(Box::new(existing))),
            None => (charge.id.clone(), None),
        },
        // On-call asks for the charge to be refunded: whatever the last compensation came
        // to, what is left of the charge now (below) is refunded. A compensation that
        // completed may no longer give all of it back: a refund counted with it, reported
        // failed since, gave nothing back (runbooks/refunds.md, case 10).
        Some(last)
            if after_failure == AfterFailure::RefundAgain
                && matches!(last.state, RefundState::Fallido | RefundState::Completado) =>
        {
            (
                format!("{}#{}", charge.id, compensations.len() + 1),
                (last.state == RefundState::Fallido).then_some(*last),
            )
        }
        Some(last) => return Ok(Compensation::Taken(Box::new((*last).clone()))),
    };
    if let Some(open) = earlier.iter().find(|r| {
        matches!(
            r.state,
            RefundState::EnProceso | RefundState::Enviado | RefundState::RevisionManual
        )
    }) {
        return Ok(Compensation::Unsettled(Box::new(open.clone())));
    }
    let given_back: i64 = earlier
        .iter()
        .filter(|r| r.state == RefundState::Completado)
        .map(|r| r.amount)
        .sum();
    let left = charge.amount - given_back;
    if left <= 0 {
        return Ok(Compensation::Covered);
    }
    let fingerprint = crate::idempotency::fingerprint(
        "COMPENSATE",
        &format!("/v1/pagos/{}", p.id),
        &serde_json::json!({ "charge": charge.id, "monto": charge.amount }),
    );
    // The merchant reads the refund's `motivo`: what it is, never who asked or their note
    // (an on-call resolution's `why` names the operator and carries their words), which
    // the refund's and the payment's audit trails keep.
    let reason = format!(
        "compensation: charge {} is given back (the payment was answered FALLIDA: no money taken)",
        charge.id
    );
    let audit = format!("compensation: {why}");
    let registered = store::register_in(
        tx,
        &store::Registration {
            merchant: p.merchant_id,
            scope,
            key: &key,
            fingerprint: &fingerprint,
            payment: p.id,
            amount: Some(left),
            reason: Some(truncate(&reason, pagos_types::refund::MAX_REASON_LEN)),
            audit: Some(audit),
            requested_by: "pagos".to_owned(),
            lease: std::time::Duration::ZERO,
            payment_states: &[crate::saga::state::PaymentState::Fallida],
            charge: Some(charge.id.clone()),
            charge_amount: Some(charge.amount),
        },
        lock,
    )
    .await?;
    let r = match registered {
        store::Registered::Started(r) => r,
        store::Registered::Taken(r) => return Ok(Compensation::Taken(r)),
        other => return Ok(Compensation::Refused(other)),
    };
    let what = if let Some(failed) = failed_before {
        format!(
            "the charge is refunded again ({left} {cur}; its compensation refund {} failed: {})",
            failed.id,
            failed.failure_code.as_deref().unwrap_or("no code"),
            cur = r.currency
        )
    } else if given_back == 0 {
        "the charge is refunded in full".to_owned()
    } else {
        format!(
            "what is left of the charge is refunded ({left} {cur} of {} {cur}; pagos' refunds of it already gave back {given_back} {cur})",
            charge.amount,
            cur = r.currency
        )
    };
    payment_transitions::Entity::insert(payment_transitions::ActiveModel::from(
        payment_transitions::Model {
            id: uuid::Uuid::now_v7(),
            payment_id: p.id,
            from_state: Some(p.state),
            to_state: p.state,
            actor,
            reason: format!(
                "{why}: the answer was FALLIDA, so {what} (refund {}) to keep it true",
                r.id
            ),
            created_at: r.created_at,
        },
    ))
    .exec_without_returning(tx)
    .await?;
    tracing::warn!(payment_id = %p.id, refund_id = %r.id, charge = charge.id, amount = left, "orphan charge: refunding it");
    Ok(Compensation::Started(r))
}

fn truncate(s: &str, max: usize) -> String {
    s.chars().take(max).collect()
}
