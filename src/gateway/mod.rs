//! Talking to payment gateways: the `Gateway` trait, the shared reading of answers, the retry
//! policy, and the adapters (reference HTTP protocol, in-process sandbox, Stripe, Mercado
//! Pago), with the amount conversions the providers need.
//!
//! This room never touches the database and never decides a payment's state: it reports
//! what the gateway said, or that nobody knows.

pub mod amount;
pub mod classify;
pub mod http;
pub mod mercadopago;
pub mod retry;
pub mod sandbox;
pub mod sandbox_server;
pub mod stripe;

use crate::domain::PaymentMethod;
use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// What pagos asks a gateway to charge. Every send of one payment carries the same
/// `gateway_key` and the same body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChargeRequest {
    pub gateway_key: String,
    pub amount: i64,
    pub currency: String,
    pub reference: Uuid,
    pub description: Option<String>,
    /// The payer's `medioPago`, for the gateways that charge one (Stripe, Mercado Pago);
    /// the reference protocol does not carry it.
    pub payment_method: Option<PaymentMethod>,
}

/// The reference protocol's charge body (what `POST /v1/charges` takes).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChargeBody {
    pub amount: i64,
    pub currency: String,
    pub reference: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

impl From<&ChargeRequest> for ChargeBody {
    fn from(req: &ChargeRequest) -> Self {
        ChargeBody {
            amount: req.amount,
            currency: req.currency.clone(),
            reference: req.reference.to_string(),
            description: req.description.clone(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ChargeStatus {
    Succeeded,
    Declined,
    Pending,
}

/// A charge as the gateway reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Charge {
    pub id: String,
    pub status: ChargeStatus,
    pub amount: i64,
    pub currency: String,
    pub reference: String,
    #[serde(default)]
    pub decline_code: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GatewayError {
    /// Timeout, 5xx, reset connection, 409 (still in flight), 429, refused credentials,
    /// the key used with another request, unreadable answer: the charge may or may not
    /// exist. Safe to retry with the same key (`classify`).
    #[error("outcome unknown: {0}")]
    Unknown(String),
    /// Any other 4xx: the gateway refused this request. It proves no charge exists only
    /// if no earlier try of the payment may have reached the gateway (`retry::charge`).
    /// Retrying the same request cannot help.
    #[error("gateway refused the request with {status}: {detail}")]
    Rejected { status: u16, detail: String },
}

/// The longest decline code pagos stores (`payments.decline_code`, `webhook_charges`).
pub const MAX_DECLINE_CODE_LEN: usize = 100;

/// A provider's decline code cut to what pagos stores: a provider's string must never
/// make a write fail, again on every retry.
pub fn decline_code(code: &str) -> String {
    code.chars().take(MAX_DECLINE_CODE_LEN).collect()
}

impl GatewayError {
    pub fn is_retryable(&self) -> bool {
        matches!(self, GatewayError::Unknown(_))
    }
}

/// One payment gateway. Each method is one attempt; retries live in `retry`.
#[async_trait]
pub trait Gateway: Send + Sync + 'static {
    /// Creates (or, for a key already used, replays) a charge.
    async fn charge(&self, req: &ChargeRequest) -> Result<Charge, GatewayError>;

    /// Every charge the gateway holds for this payment reference. Empty means none exists
    /// (yet).
    async fn lookup(&self, reference: Uuid) -> Result<Vec<Charge>, GatewayError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_read_the_reference_protocol() {
        let charge: Charge = serde_json::from_str(
            r#"{"id":"ch_1","status":"declined","amount":5,"currency":"COP","reference":"r","declineCode":"insufficient_funds"}"#,
        )
        .expect("parses");
        assert_eq!(charge.status, ChargeStatus::Declined);
        assert_eq!(charge.decline_code.as_deref(), Some("insufficient_funds"));
    }
}
