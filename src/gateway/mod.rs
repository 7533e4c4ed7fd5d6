//! Talking to payment gateways: the `Gateway` trait (charges, and refunds of them), the
//! shared reading of answers, the retry policy, and the adapters (reference HTTP protocol,
//! in-process sandbox, Stripe, Mercado Pago), with the amount conversions the providers need.
//!
//! This room never touches the database and never decides a payment's or a refund's state:
//! it reports what the gateway said, or that nobody knows.

pub mod amount;
pub mod classify;
pub mod http;
pub mod mercadopago;
pub mod retry;
pub mod sandbox;
pub mod sandbox_server;
pub mod storable;
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

/// A currency code as a provider sent it, in upper case, as pagos writes its own (`cop`
/// from a gateway modelled on Stripe's is `COP`): a charge or refund is compared with its
/// payment or refund by its code, and a code in another case must not read as another
/// currency.
fn currency_code<'de, D: serde::Deserializer<'de>>(said: D) -> Result<String, D::Error> {
    String::deserialize(said).map(|code| code.to_ascii_uppercase())
}

/// A charge as the gateway reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Charge {
    pub id: String,
    pub status: ChargeStatus,
    pub amount: i64,
    #[serde(deserialize_with = "currency_code")]
    pub currency: String,
    pub reference: String,
    #[serde(default)]
    pub decline_code: Option<String>,
    /// Declined because it took the money and its payer disputed it (Mercado Pago's
    /// `charged_back`, whatever its `status_detail`: the dispute open, won by the seller,
    /// or the money returned). Only an adapter that reads a dispute says so: never the
    /// reference protocol's JSON, whose `declineCode` is free text.
    #[serde(skip)]
    pub charged_back: bool,
}

impl Charge {
    /// A charge that took the money and was then disputed: declined, but not "no money
    /// taken". A payment not yet settled goes to review, never `FALLIDA`.
    pub fn charged_back(&self) -> bool {
        self.status == ChargeStatus::Declined && self.charged_back
    }

    /// Declined as a duplicate of a recent payment of the same card and amount (Mercado
    /// Pago's `cc_rejected_duplicated_payment`, Stripe's `duplicate_transaction`): after a
    /// try that may have reached the gateway, the duplicate may be this payment's own.
    pub fn declined_as_duplicate(&self) -> bool {
        self.status == ChargeStatus::Declined
            && matches!(
                self.decline_code.as_deref(),
                Some("cc_rejected_duplicated_payment" | "duplicate_transaction")
            )
    }

    /// Whether the charge names `reference` (a payment id) as its own: the reference
    /// protocol's `reference`, Stripe's `metadata.pagos_reference`, Mercado Pago's
    /// `external_reference`. Empty (the answer carried none) or another is not.
    pub fn is_for(&self, reference: Uuid) -> bool {
        Uuid::parse_str(&self.reference).ok() == Some(reference)
    }
}

/// What pagos asks a gateway to refund: part or all of a charge it made. Every send of one
/// refund carries the same `gateway_key` and the same body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RefundRequest {
    /// Unique to the refund (never a payment's key).
    pub gateway_key: String,
    /// The provider's id of the charge refunded: the reference protocol's `ch_…`, Stripe's
    /// PaymentIntent `pi_…`, Mercado Pago's payment id (a payment's `gatewayRef`).
    pub charge: String,
    /// Minor units of `currency`, positive.
    pub amount: i64,
    /// The charge's currency.
    pub currency: String,
    /// The pagos refund id: what look-ups search for.
    pub reference: Uuid,
    /// Why, in the merchant's words; the providers that keep a note carry it.
    pub reason: Option<String>,
    /// `amount` is the whole charge (so no other refund of it exists). Mercado Pago takes a
    /// total refund as an empty body, and some of its payment methods refuse a partial one
    /// even for the whole amount; the others ignore it. Derived from what pagos stores
    /// (amount = the payment's `monto`), so it is the same on every send.
    pub whole: bool,
}

impl RefundRequest {
    /// What to look this refund up with, knowing the provider's refund id if an answer gave
    /// one.
    pub fn lookup(&self, gateway_ref: Option<String>) -> RefundLookup {
        RefundLookup {
            charge: self.charge.clone(),
            currency: self.currency.clone(),
            reference: self.reference,
            gateway_ref,
        }
    }
}

/// What pagos knows of a refund when it asks the gateway what became of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RefundLookup {
    /// The provider's id of the charge refunded (as in `RefundRequest`).
    pub charge: String,
    /// The charge's currency (Mercado Pago's refunds carry amounts without one).
    pub currency: String,
    /// The pagos refund id.
    pub reference: Uuid,
    /// The provider's refund id, once an answer gave one (a refund left pending). A
    /// provider whose refunds carry no reference of pagos' (Mercado Pago) finds a refund
    /// only by it.
    pub gateway_ref: Option<String>,
}

/// The reference protocol's refund body (what `POST /v1/refunds` takes, contract section 6).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefundBody {
    pub charge: String,
    pub amount: i64,
    pub currency: String,
    pub reference: String,
}

impl From<&RefundRequest> for RefundBody {
    fn from(req: &RefundRequest) -> Self {
        RefundBody {
            charge: req.charge.clone(),
            amount: req.amount,
            currency: req.currency.clone(),
            reference: req.reference.to_string(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RefundStatus {
    /// The money went back (a provider may still report it failed later: Stripe).
    Succeeded,
    /// No money went back.
    Failed,
    /// Accepted; settled later.
    Pending,
}

/// A refund as the gateway reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Refund {
    pub id: String,
    pub status: RefundStatus,
    /// The provider's id of the charge refunded.
    pub charge: String,
    /// Minor units of `currency`.
    pub amount: i64,
    #[serde(deserialize_with = "currency_code")]
    pub currency: String,
    /// The pagos refund id.
    pub reference: String,
    /// Why a failed refund failed.
    #[serde(default)]
    pub failure_code: Option<String>,
}

impl Refund {
    /// Whether the refund names `reference` (a pagos refund id) as its own: the reference
    /// protocol's `reference`, Stripe's `metadata.pagos_reference`; a Mercado Pago refund
    /// carries none, and its adapter names the refund asked for only after checking what
    /// the refund does carry (`mercadopago::MercadoPagoRefund::answers`). Empty (the answer
    /// carried none) or another is not.
    pub fn is_for(&self, reference: Uuid) -> bool {
        Uuid::parse_str(&self.reference).ok() == Some(reference)
    }
}

/// What a refusal is about, when the provider's answer says so.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RejectReason {
    /// Nothing pagos tells apart: the request as a whole was refused.
    Other,
    /// A refund over what is left of its charge (reference protocol
    /// `amount_exceeds_remaining`, Stripe `charge_already_refunded` and its "greater than
    /// unrefunded amount" refusal).
    ExceedsRemaining,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GatewayError {
    /// Timeout, 5xx, reset connection, 409 (still in flight), 429, refused credentials,
    /// the key used with another request, unreadable answer: the charge (or refund) may or
    /// may not exist. Safe to retry with the same key (`classify`).
    #[error("outcome unknown: {0}")]
    Unknown(String),
    /// Any other 4xx: the gateway refused this request. It proves nothing was made only
    /// if no earlier try may have reached the gateway (`retry::charge`, `retry::refund`).
    /// Retrying the same request cannot help.
    #[error("gateway refused the request with {status}: {detail}")]
    Rejected {
        status: u16,
        detail: String,
        reason: RejectReason,
    },
}

/// A provider's refund status (`status`, absent on some answers) as its table (`known`)
/// reads it; absent, or one the table does not know, it is `Unknown`, as `unknown` says.
pub fn known_refund_status(
    status: Option<&str>,
    known: fn(&str) -> Option<RefundStatus>,
    unknown: impl FnOnce() -> String,
) -> Result<RefundStatus, GatewayError> {
    status
        .and_then(known)
        .ok_or_else(|| GatewayError::Unknown(unknown()))
}

/// The longest decline code pagos stores (`payments.decline_code`, `webhook_charges`).
pub const MAX_DECLINE_CODE_LEN: usize = 100;

/// A provider's decline code cut to what pagos stores, a NUL (which PostgreSQL's text
/// refuses) kept as U+FFFD: a provider's string must never make a write fail, again on
/// every retry.
pub fn decline_code(code: &str) -> String {
    code.chars()
        .take(MAX_DECLINE_CODE_LEN)
        .map(|c| if c == '\0' { '\u{FFFD}' } else { c })
        .collect()
}

impl GatewayError {
    pub fn is_retryable(&self) -> bool {
        matches!(self, GatewayError::Unknown(_))
    }
}

impl GatewayError {
    /// A refusal of the request as a whole.
    pub fn rejected(status: u16, detail: impl Into<String>) -> Self {
        GatewayError::Rejected {
            status,
            detail: detail.into(),
            reason: RejectReason::Other,
        }
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

    /// Creates (or, for a key already used, replays) a refund of part or all of a charge.
    async fn refund(&self, req: &RefundRequest) -> Result<Refund, GatewayError>;

    /// Every refund the gateway holds for this refund (its reference, or its provider id
    /// when one is known). Empty means none the gateway can attribute to it (yet): never
    /// proof that the refund does not exist, only that a resend with the same key is the
    /// way to find out (the provider replays it, or makes the only one).
    async fn lookup_refunds(&self, refund: &RefundLookup) -> Result<Vec<Refund>, GatewayError>;

    /// Every refund the provider holds of the refund's charge, whoever asked for it: what
    /// on-call's resolution of a refund the provider cannot attribute checks (Mercado Pago,
    /// whose refunds carry no pagos reference). Empty where refunds carry pagos' reference
    /// (`lookup_refunds` attributes them) and the check never asks.
    async fn refunds_of_charge(&self, refund: &RefundLookup) -> Result<Vec<Refund>, GatewayError> {
        let _ = refund;
        Ok(Vec::new())
    }

    /// The one currency the account charges in, whatever a request says (Mercado Pago,
    /// whose payments carry no currency: it charges the amount in its account's). None
    /// where each request names its currency.
    async fn account_currency(&self) -> Result<Option<String>, GatewayError> {
        Ok(None)
    }
}

/// What the adapters' body tests send: COP 250,000 with the gateway key `gk`, the nil
/// reference, `description` and `method`.
#[cfg(test)]
pub(crate) fn test_charge_request(description: &str, method: PaymentMethod) -> ChargeRequest {
    ChargeRequest {
        gateway_key: "gk".into(),
        amount: 250_000,
        currency: "COP".into(),
        reference: Uuid::nil(),
        description: Some(description.into()),
        payment_method: Some(method),
    }
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

    #[test]
    fn refunds_read_and_write_the_reference_protocol() {
        let refund: Refund = serde_json::from_str(include_str!(
            "../../fixtures/reference-gateway/refund_failed.json"
        ))
        .expect("parses");
        assert_eq!(refund.status, RefundStatus::Failed);
        assert_eq!(
            refund.failure_code.as_deref(),
            Some("expired_or_canceled_card")
        );
        let written = serde_json::to_value(&refund).expect("json");
        assert_eq!(written["failureCode"], "expired_or_canceled_card");
        assert_eq!(written["status"], "failed");

        let req = RefundRequest {
            gateway_key: "k".into(),
            charge: "ch_1".into(),
            amount: 50_000,
            currency: "COP".into(),
            reference: Uuid::nil(),
            reason: Some("solicitud del cliente".into()),
            whole: false,
        };
        let body = serde_json::to_value(RefundBody::from(&req)).expect("json");
        let documented: serde_json::Value = serde_json::from_str(include_str!(
            "../../fixtures/reference-gateway/refund_request.json"
        ))
        .expect("fixture");
        let keys = |v: &serde_json::Value| {
            let mut k: Vec<String> = v
                .as_object()
                .map(|o| o.keys().cloned().collect())
                .unwrap_or_default();
            k.sort();
            k
        };
        assert_eq!(
            keys(&body),
            keys(&documented),
            "the contract's four fields, no more"
        );
        assert_eq!(body["reference"], Uuid::nil().to_string());
    }
}
