//! The Stripe adapter (`PAGOS_GATEWAY=stripe`): one PaymentIntent per payment, created and
//! confirmed off-session in one call (`POST /v1/payment_intents`, form-encoded) with the
//! gateway key in `Idempotency-Key` and the payment id in `metadata[pagos_reference]`;
//! looked up with `GET /v1/payment_intents/search` on that metadata.
//!
//! It classifies answers and maps PaymentIntent statuses, nothing more (the table is in
//! `status_of` and in docs/gateways/stripe.md). It never reads search's silence as proof:
//! search is eventually consistent, and "nothing found" only means "nothing indexed yet";
//! the reconciler's answer to it is a resend with the same key, which Stripe replays.

use super::classify::{KeySaid, refusal};
use super::http::{client, search, transport};
use super::{Charge, ChargeRequest, ChargeStatus, Gateway, GatewayError, amount};
use async_trait::async_trait;
use reqwest::StatusCode;
use serde::Deserialize;
use std::collections::HashMap;
use std::time::Duration;
use uuid::Uuid;

/// Stripe's production API.
pub const PRODUCTION_URL: &str = "https://api.stripe.com";

/// How long Stripe honours an idempotency key: keys "can be pruned once they are at least
/// 24 hours old", so a resend inside 24 hours replays the first answer.
pub const KEY_WINDOW: Duration = Duration::from_secs(24 * 60 * 60);

/// The metadata key that carries the pagos payment id.
pub const REFERENCE_KEY: &str = "pagos_reference";

pub struct StripeGateway {
    client: reqwest::Client,
    base: String,
    secret: String,
}

/// A PaymentIntent, trimmed to what pagos reads (fields stable across API versions).
#[derive(Clone, Debug, Deserialize)]
pub struct PaymentIntent {
    pub id: String,
    pub status: String,
    pub amount: i64,
    pub currency: String,
    #[serde(default)]
    pub metadata: HashMap<String, String>,
    #[serde(default)]
    pub last_payment_error: Option<ApiError>,
    #[serde(default)]
    pub cancellation_reason: Option<String>,
    #[serde(default)]
    pub created: i64,
}

/// Stripe's error object (`{"error":{…}}`, and a PaymentIntent's `last_payment_error`).
#[derive(Clone, Debug, Deserialize)]
pub struct ApiError {
    #[serde(rename = "type", default)]
    pub kind: Option<String>,
    #[serde(default)]
    pub code: Option<String>,
    #[serde(default)]
    pub decline_code: Option<String>,
    #[serde(default)]
    pub message: Option<String>,
    /// On a card error, the PaymentIntent as the failed confirmation left it.
    #[serde(default)]
    pub payment_intent: Option<Box<PaymentIntent>>,
}

#[derive(Deserialize)]
struct ErrorBody {
    error: ApiError,
}

#[derive(Deserialize)]
struct SearchResult {
    data: Vec<PaymentIntent>,
}

/// What a PaymentIntent's status means for its payment (docs/gateways/stripe.md):
///
/// | status | charge |
/// | --- | --- |
/// | `succeeded` | succeeded |
/// | `processing` | pending (asynchronous methods settle later) |
/// | `requires_action` | pending: the issuer asks for authentication pagos cannot give off-session; past `PAGOS_GIVE_UP_AFTER` the reconciler sends it to REVISION_MANUAL |
/// | `requires_confirmation`, `requires_capture` | pending (pagos confirms and captures automatically; seen only if someone changed the PaymentIntent) |
/// | `requires_payment_method` | declined (the confirmation failed: `last_payment_error`) |
/// | `canceled` | declined (no money moved) |
///
/// None: a status this version does not know; the outcome is unknown.
pub fn status_of(status: &str) -> Option<ChargeStatus> {
    match status {
        "succeeded" => Some(ChargeStatus::Succeeded),
        "processing" | "requires_action" | "requires_confirmation" | "requires_capture" => {
            Some(ChargeStatus::Pending)
        }
        "requires_payment_method" | "canceled" => Some(ChargeStatus::Declined),
        _ => None,
    }
}

/// Why a declined PaymentIntent was declined: the issuer's `decline_code`, else Stripe's
/// error `code`, else the status itself.
fn decline_code(pi: &PaymentIntent, error: Option<&ApiError>) -> String {
    if pi.status == "canceled" {
        return match &pi.cancellation_reason {
            Some(reason) => format!("canceled_{reason}"),
            None => "canceled".into(),
        };
    }
    error
        .or(pi.last_payment_error.as_ref())
        .and_then(|e| e.decline_code.clone().or_else(|| e.code.clone()))
        .unwrap_or_else(|| pi.status.clone())
}

impl PaymentIntent {
    /// The payment id this PaymentIntent carries, if pagos made it.
    pub fn reference(&self) -> Option<&str> {
        self.metadata.get(REFERENCE_KEY).map(String::as_str)
    }

    /// The PaymentIntent as a charge (amount in pagos' minor units, currency upper case).
    /// `error` is the card error that came with it, if any.
    pub fn to_charge(&self, error: Option<&ApiError>) -> Result<Charge, GatewayError> {
        let status = status_of(&self.status).ok_or_else(|| {
            GatewayError::Unknown(format!(
                "PaymentIntent {} has a status pagos does not know: {}",
                self.id, self.status
            ))
        })?;
        let currency = self.currency.to_ascii_uppercase();
        let amount = amount::from_stripe(self.amount, &currency)
            .map_err(|e| GatewayError::Unknown(format!("PaymentIntent {}: amount {e}", self.id)))?;
        Ok(Charge {
            id: self.id.clone(),
            status,
            amount,
            currency,
            reference: self.reference().unwrap_or_default().to_owned(),
            decline_code: (status == ChargeStatus::Declined)
                .then(|| super::decline_code(&decline_code(self, error))),
        })
    }
}

/// The form body of `POST /v1/payment_intents` for `req`: the same bytes on every send
/// of one payment (Stripe refuses a key reused with other parameters).
pub fn form_body(req: &ChargeRequest) -> Result<String, String> {
    let method = req
        .payment_method
        .as_ref()
        .ok_or("the payment has no medioPago (a saved PaymentMethod pm_…)")?;
    let stripe_amount = amount::to_stripe(req.amount, &req.currency).map_err(|e| e.to_string())?;
    let mut form = url::form_urlencoded::Serializer::new(String::new());
    form.append_pair("amount", &stripe_amount.to_string())
        .append_pair("currency", &req.currency.to_ascii_lowercase())
        .append_pair("confirm", "true")
        .append_pair("off_session", "true")
        .append_pair("payment_method", &method.id);
    if let Some(customer) = &method.customer {
        form.append_pair("customer", customer);
    }
    // Server-side confirmation cannot follow a redirect: methods that need one are not
    // offered (without this, Stripe asks for a return_url).
    form.append_pair("automatic_payment_methods[enabled]", "true")
        .append_pair("automatic_payment_methods[allow_redirects]", "never");
    if let Some(description) = &req.description {
        form.append_pair("description", description);
    }
    form.append_pair(
        &format!("metadata[{REFERENCE_KEY}]"),
        &req.reference.to_string(),
    );
    Ok(form.finish())
}

/// The search query for the PaymentIntents of one payment.
pub fn search_query(reference: Uuid) -> String {
    // A UUID has no quote or backslash: nothing to escape.
    format!("metadata['{REFERENCE_KEY}']:'{reference}'")
}

impl StripeGateway {
    pub fn new(base: &str, secret: &str, timeout: Duration) -> Result<Self, reqwest::Error> {
        Ok(StripeGateway {
            client: client(timeout)?,
            base: base.trim_end_matches('/').to_owned(),
            secret: secret.to_owned(),
        })
    }

    async fn classify_charge(&self, resp: reqwest::Response) -> Result<Charge, GatewayError> {
        let status = resp.status();
        let replayed = resp
            .headers()
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true");
        if status.is_success() {
            let bytes = resp.bytes().await.map_err(|e| transport(&e))?;
            let pi: PaymentIntent = serde_json::from_slice(&bytes).map_err(|e| {
                GatewayError::Unknown(format!("unreadable {status} answer from Stripe: {e}"))
            })?;
            tracing::debug!(
                payment_intent = pi.id,
                replayed,
                status = pi.status,
                "Stripe answered"
            );
            return pi.to_charge(None);
        }
        // The whole body: a card error embeds the PaymentIntent, far past any excerpt.
        let text = resp.text().await.unwrap_or_default();
        let error = serde_json::from_str::<ErrorBody>(&text)
            .map(|b| b.error)
            .ok();
        // A card error (402) comes with the PaymentIntent it left declined: an answer that
        // carries the charge, so its status is readable.
        if status == StatusCode::PAYMENT_REQUIRED
            && let Some(err) = &error
            && let Some(pi) = &err.payment_intent
        {
            return pi.to_charge(Some(err));
        }
        // The key was used with other parameters: a PaymentIntent may exist under it.
        let said = if error.as_ref().and_then(|e| e.kind.as_deref()) == Some("idempotency_error") {
            KeySaid::UsedWithAnotherRequest
        } else {
            KeySaid::Nothing
        };
        let excerpt: String = text.chars().take(300).collect();
        Err(refusal("Stripe", status, said, &excerpt))
    }
}

#[async_trait]
impl Gateway for StripeGateway {
    async fn charge(&self, req: &ChargeRequest) -> Result<Charge, GatewayError> {
        let body = form_body(req).map_err(|why| GatewayError::Rejected {
            status: 422,
            detail: format!("not sent to Stripe: {why}"),
        })?;
        let resp = self
            .client
            .post(format!("{}/v1/payment_intents", self.base))
            .bearer_auth(&self.secret)
            .header("Idempotency-Key", &req.gateway_key)
            .header(
                reqwest::header::CONTENT_TYPE,
                "application/x-www-form-urlencoded",
            )
            .body(body)
            .send()
            .await
            .map_err(|e| transport(&e))?;
        self.classify_charge(resp).await
    }

    async fn lookup(&self, reference: Uuid) -> Result<Vec<Charge>, GatewayError> {
        let mut url = url::Url::parse(&format!("{}/v1/payment_intents/search", self.base))
            .map_err(|e| GatewayError::Unknown(format!("bad Stripe URL: {e}")))?;
        url.query_pairs_mut()
            .append_pair("query", &search_query(reference))
            .append_pair("limit", "10");
        let found: SearchResult = search(&self.client, url, &self.secret, "Stripe search").await?;
        let reference = reference.to_string();
        found
            .data
            .iter()
            .filter(|pi| pi.reference() == Some(reference.as_str()))
            .map(|pi| pi.to_charge(None))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::PaymentMethod;

    fn intent(status: &str) -> PaymentIntent {
        serde_json::from_value(serde_json::json!({
            "id": "pi_3MtwBwLkdIwHu7ix28a3tqPa", "object": "payment_intent",
            "status": status, "amount": 250000, "currency": "cop",
            "metadata": {"pagos_reference": "01a236bf-3ba3-730c-b454-685f40f9d62b"},
            "last_payment_error": if status == "requires_payment_method" {
                serde_json::json!({"type":"card_error","code":"card_declined","decline_code":"insufficient_funds"})
            } else { serde_json::Value::Null },
            "cancellation_reason": if status == "canceled" { serde_json::json!("abandoned") } else { serde_json::Value::Null },
        }))
        .expect("a PaymentIntent")
    }

    #[test]
    fn every_status_in_the_table_maps_as_documented() {
        use ChargeStatus::*;
        for (status, charge, code) in [
            ("succeeded", Succeeded, None),
            ("processing", Pending, None),
            ("requires_action", Pending, None),
            ("requires_confirmation", Pending, None),
            ("requires_capture", Pending, None),
            (
                "requires_payment_method",
                Declined,
                Some("insufficient_funds"),
            ),
            ("canceled", Declined, Some("canceled_abandoned")),
        ] {
            let mapped = intent(status).to_charge(None).expect("known status");
            assert_eq!(mapped.status, charge, "{status}");
            assert_eq!(mapped.decline_code.as_deref(), code, "{status}");
            assert_eq!(mapped.currency, "COP");
            assert_eq!(mapped.amount, 250_000);
            assert_eq!(mapped.reference, "01a236bf-3ba3-730c-b454-685f40f9d62b");
        }
        assert!(matches!(
            intent("requires_teleportation").to_charge(None),
            Err(GatewayError::Unknown(_))
        ));
    }

    #[test]
    fn the_form_body_carries_every_documented_field_and_is_stable() {
        let req = ChargeRequest {
            gateway_key: "gk".into(),
            amount: 250_000,
            currency: "COP".into(),
            reference: Uuid::nil(),
            description: Some("Cuota 3 & más".into()),
            payment_method: Some(PaymentMethod {
                customer: Some("cus_NffrFeUfNV2Hib".into()),
                ..PaymentMethod::with_id("pm_1Q0PsIJvEtkwdCNYMSaVuRz6")
            }),
        };
        let body = form_body(&req).expect("a body");
        assert_eq!(form_body(&req).expect("a body"), body);
        let pairs: Vec<(String, String)> = url::form_urlencoded::parse(body.as_bytes())
            .into_owned()
            .collect();
        let get = |k: &str| {
            pairs
                .iter()
                .find(|(name, _)| name == k)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(get("amount"), Some("250000"));
        assert_eq!(get("currency"), Some("cop"));
        assert_eq!(get("confirm"), Some("true"));
        assert_eq!(get("off_session"), Some("true"));
        assert_eq!(get("payment_method"), Some("pm_1Q0PsIJvEtkwdCNYMSaVuRz6"));
        assert_eq!(get("customer"), Some("cus_NffrFeUfNV2Hib"));
        assert_eq!(get("description"), Some("Cuota 3 & más"));
        assert_eq!(
            get("metadata[pagos_reference]"),
            Some("00000000-0000-0000-0000-000000000000")
        );
        let without = ChargeRequest {
            payment_method: None,
            ..req
        };
        assert!(form_body(&without).is_err());
    }

    #[test]
    fn the_search_query_names_the_metadata_key_and_the_reference() {
        assert_eq!(
            search_query(Uuid::nil()),
            "metadata['pagos_reference']:'00000000-0000-0000-0000-000000000000'"
        );
    }
}
