//! How a payment looks on the wire, and the answer each state gets.
//!
//! Pure and deterministic: the answer frozen on an idempotency key and the one rendered
//! later from the same row are the same bytes.

use crate::entities::payment;
use crate::http::problem::{Kind, Problem};
use crate::saga::state::PaymentState;
use chrono::SecondsFormat;
use serde::Serialize;
use uuid::Uuid;

/// The payment representation of the contract.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Pago {
    pub id: Uuid,
    pub credito_id: String,
    /// Minor units of `moneda`.
    pub monto: i64,
    pub moneda: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub descripcion: Option<String>,
    /// The payment method charged: only its `id` (a Stripe `pm_…` or a Mercado Pago
    /// `payment_method_id`), never a token, e-mail or document.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub medio_pago: Option<MedioPago>,
    pub estado: PaymentState,
    pub gateway_ref: Option<String>,
    /// RFC 3339.
    pub creado_en: String,
    /// RFC 3339.
    pub actualizado_en: String,
}

/// What the representation shows of a payment method.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct MedioPago {
    #[schema(example = "pm_1Q0PsIJvEtkwdCNYMSaVuRz6")]
    pub id: String,
}

impl MedioPago {
    /// From the stored contract JSON; only the id is kept.
    fn of_stored(stored: &str) -> Option<MedioPago> {
        let value: serde_json::Value = serde_json::from_str(stored).ok()?;
        let id = value.get("id")?.as_str()?.to_owned();
        Some(MedioPago { id })
    }
}

impl Pago {
    pub fn of(p: &payment::Model) -> Pago {
        Pago {
            id: p.id,
            credito_id: p.credit_id.clone(),
            monto: p.amount,
            moneda: p.currency.clone(),
            descripcion: p.description.clone(),
            medio_pago: p.payment_method.as_deref().and_then(MedioPago::of_stored),
            estado: p.state.parse().unwrap_or(PaymentState::RevisionManual),
            gateway_ref: p.gateway_ref.clone(),
            creado_en: p.created_at.to_rfc3339_opts(SecondsFormat::Millis, true),
            actualizado_en: p.updated_at.to_rfc3339_opts(SecondsFormat::Millis, true),
        }
    }
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

impl Answer {
    pub fn content_type(&self) -> &'static str {
        if self.status >= 400 {
            crate::http::problem::PROBLEM_JSON
        } else {
            "application/json"
        }
    }
}

/// 201 COMPLETADA, 402 FALLIDA (problem with the payment under `pago`), 202 otherwise.
pub fn answer(p: &payment::Model) -> Answer {
    let pago = Pago::of(p);
    match pago.estado {
        PaymentState::Completada => Answer {
            status: 201,
            body: serde_json::to_string(&pago).unwrap_or_default(),
        },
        PaymentState::Fallida => {
            let code = p.decline_code.clone().unwrap_or_else(|| "declined".into());
            let problem = if code.starts_with(GATEWAY_REJECTED_PREFIX) {
                Problem::new(Kind::GatewayRejected).detail(format!(
                    "The gateway refused the charge ({code}); no money was taken. Correct the payment and send it with a new Idempotency-Key."
                ))
            } else if code == RESOLVED_FAILED {
                Problem::new(Kind::PaymentDeclined).detail(
                    "The payment could not be confirmed with the gateway; operations reviewed it and marked it failed. No charge stands.",
                )
            } else {
                Problem::new(Kind::PaymentDeclined)
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
