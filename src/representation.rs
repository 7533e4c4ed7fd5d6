//! How a payment looks on the wire, and the answer each state gets.
//!
//! Pure and deterministic: the answer frozen on an idempotency key and the one rendered
//! later from the same row are the same bytes.

use crate::entities::idempotency_key::FrozenAnswer;
use crate::entities::payment;
use chrono::SecondsFormat;
use pagos_types::PaymentState;
use pagos_types::problem::{Problem, ProblemType};

pub use pagos_types::payment::{MedioPago, Pago};

/// What the representation shows of a stored `medioPago` (the contract JSON): its id only.
fn medio_pago_of_stored(stored: &str) -> Option<MedioPago> {
    let value: serde_json::Value = serde_json::from_str(stored).ok()?;
    let id = value.get("id")?.as_str()?.to_owned();
    Some(MedioPago { id })
}

/// The contract's representation of a stored payment.
pub fn pago(p: &payment::Model) -> Pago {
    Pago {
        id: p.id,
        credit_id: p.credit_id.clone(),
        amount: p.amount,
        currency: p.currency.clone(),
        description: p.description.clone(),
        payment_method: p.payment_method.as_deref().and_then(medio_pago_of_stored),
        state: p.state,
        gateway_ref: p.gateway_ref.clone(),
        refunded_amount: None,
        created_at: p.created_at.to_rfc3339_opts(SecondsFormat::Millis, true),
        updated_at: p.updated_at.to_rfc3339_opts(SecondsFormat::Millis, true),
    }
}

/// A payment as an event's `datos` shows it: its representation, the same bytes as an
/// answer's.
///
/// Rendered in the store's write, which reads no refunds: `montoReembolsado` is 0, as in
/// the answer to the request (a payment moving into a final state from `ENVIADA` has no
/// refunds yet). A payment that may have refunds (one leaving `COMPLETADA`, `FALLIDA` or
/// `REVISION_MANUAL`) is told with them (`datos_refunded`, `saga::apply`).
pub fn datos(p: &payment::Model) -> String {
    datos_refunded(p, 0)
}

/// A payment as an event's `datos` shows it, `refunded` of it given back (`montoReembolsado`,
/// as `GET /v1/pagos/{id}` shows it).
pub fn datos_refunded(p: &payment::Model, refunded: i64) -> String {
    serde_json::to_string(&pago_with_refunds(p, refunded)).unwrap_or_default()
}

/// `decline_code` of a payment on-call resolved as failed.
pub const RESOLVED_FAILED: &str = "resolved_by_on_call";

/// Why the gateway refused a charge outright (not a decline): kept in `decline_code`.
pub const GATEWAY_REJECTED_PREFIX: &str = "gateway_rejected";

/// An answer to `POST /v1/pagos` for a payment in its current state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    pub status: u16,
    pub body: String,
}

impl From<FrozenAnswer> for Answer {
    /// A frozen answer, replayed: the same status and bytes.
    fn from(frozen: FrozenAnswer) -> Answer {
        Answer {
            status: frozen.status,
            body: frozen.body,
        }
    }
}

impl Answer {
    pub fn content_type(&self) -> &'static str {
        if self.status >= 400 {
            pagos_types::problem::PROBLEM_JSON
        } else {
            "application/json"
        }
    }
}

/// The answer a payment that became final freezes on its key (`saga::store::Render`).
pub fn frozen(p: &payment::Model) -> FrozenAnswer {
    let Answer { status, body } = answer(p);
    FrozenAnswer { status, body }
}

/// 201 COMPLETADA, 402 FALLIDA (problem with the payment under `pago`), 202 otherwise.
pub fn answer(p: &payment::Model) -> Answer {
    // A payment is refunded only once COMPLETADA, and only after its answer is frozen:
    // the answer to the request that made it has nothing refunded yet.
    let pago = pago_with_refunds(p, 0);
    match pago.state {
        PaymentState::Completada => Answer {
            status: 201,
            body: serde_json::to_string(&pago).unwrap_or_default(),
        },
        PaymentState::Fallida => {
            let code = p.decline_code.clone().unwrap_or_else(|| "declined".into());
            let problem = if code.starts_with(GATEWAY_REJECTED_PREFIX) {
                Problem::new(ProblemType::GatewayRejected).detail(format!(
                    "The gateway refused the charge ({code}); no money was taken. Correct the payment and send it with a new Idempotency-Key."
                ))
            } else if code == RESOLVED_FAILED {
                Problem::new(ProblemType::PaymentDeclined).detail(
                    "The payment could not be confirmed with the gateway; operations reviewed it and marked it failed. No charge stands.",
                )
            } else {
                Problem::new(ProblemType::PaymentDeclined)
                    .detail(format!("The gateway declined the payment: {code}."))
            };
            let problem = problem.with("declineCode", &code).with("pago", &pago);
            Answer {
                status: 402,
                body: String::from_utf8(problem.to_bytes()).unwrap_or_default(),
            }
        }
        PaymentState::EnProceso | PaymentState::Enviada | PaymentState::RevisionManual => Answer {
            status: 202,
            body: serde_json::to_string(&pago).unwrap_or_default(),
        },
    }
}

/// The contract's representation of a stored refund (section 6).
pub fn reembolso(r: &crate::entities::refund::Model) -> pagos_types::Reembolso {
    pagos_types::Reembolso {
        id: r.id,
        payment_id: r.payment_id,
        amount: r.amount,
        currency: r.currency.clone(),
        state: r.state,
        reason: r.reason.clone(),
        gateway_ref: r.gateway_ref.clone(),
        created_at: r.created_at.to_rfc3339_opts(SecondsFormat::Millis, true),
        updated_at: r.updated_at.to_rfc3339_opts(SecondsFormat::Millis, true),
    }
}

/// A payment as `GET` shows it: with `montoReembolsado`, the sum of its `COMPLETADO`
/// refunds.
pub fn pago_with_refunds(p: &payment::Model, refunded: i64) -> Pago {
    Pago {
        refunded_amount: Some(refunded),
        ..pago(p)
    }
}

/// 201 COMPLETADO, 422 FALLIDO (`refund-refused`, the refund under `reembolso`), 202
/// otherwise: the answer to `POST /v1/pagos/{id}/reembolsos` for a refund as it stands.
pub fn refund_answer(r: &crate::entities::refund::Model) -> Answer {
    use pagos_types::RefundState;
    let reembolso = reembolso(r);
    match r.state {
        RefundState::Completado => Answer {
            status: 201,
            body: serde_json::to_string(&reembolso).unwrap_or_default(),
        },
        RefundState::Fallido => {
            let code = r.failure_code.clone().unwrap_or_else(|| "failed".into());
            let problem = Problem::new(ProblemType::RefundRefused)
                .detail(format!(
                    "The gateway did not refund ({code}); no money went back. What is left of the payment can be refunded with a new Idempotency-Key."
                ))
                .with("failureCode", &code)
                .with("reembolso", &reembolso);
            Answer {
                status: 422,
                body: String::from_utf8(problem.to_bytes()).unwrap_or_default(),
            }
        }
        RefundState::EnProceso | RefundState::Enviado | RefundState::RevisionManual => Answer {
            status: 202,
            body: serde_json::to_string(&reembolso).unwrap_or_default(),
        },
    }
}

/// A refund as an event's `datos` shows it: its representation.
pub fn refund_datos(r: &crate::entities::refund::Model) -> String {
    serde_json::to_string(&reembolso(r)).unwrap_or_default()
}

/// The answer a refund that became final freezes on its key
/// (`saga::refund::store::Render`).
pub fn refund_frozen(r: &crate::entities::refund::Model) -> FrozenAnswer {
    let Answer { status, body } = refund_answer(r);
    FrozenAnswer { status, body }
}
