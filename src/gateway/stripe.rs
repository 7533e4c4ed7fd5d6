//! The Stripe adapter (`PAGOS_GATEWAY=stripe`): one PaymentIntent per payment, created and
//! confirmed off-session in one call (`POST /v1/payment_intents`, form-encoded) with the
//! gateway key in `Idempotency-Key` and the payment id in `metadata[pagos_reference]`;
//! looked up with `GET /v1/payment_intents/search` on that metadata.
//!
//! It classifies answers and maps PaymentIntent statuses, nothing more (the table is in
//! `status_of` and in docs/gateways/stripe.md). It never reads search's silence as proof:
//! search is eventually consistent, and "nothing found" only means "nothing indexed yet";
//! the reconciler's answer to it is a resend with the same key, which Stripe replays.
//!
//! Refunds: `POST /v1/refunds` (form-encoded: `payment_intent`, `amount`,
//! `metadata[pagos_reference]` = the pagos refund id) with the refund's own key; looked up
//! by listing `GET /v1/refunds?payment_intent=` and keeping those that carry the reference.
//! Refund statuses map in `refund_status_of`; `refund_event` reads the refund of a
//! `refund.*` / `charge.refund.updated` event (pure, for the webhook consumer).

use super::classify::{AmountSaid, KeySaid, refund_refusal, refusal};
use super::http::{Api, fetch_one, refusal_body, search, transport};
use super::{
    Charge, ChargeRequest, ChargeStatus, Gateway, GatewayError, Refund, RefundLookup,
    RefundRequest, RefundStatus, amount, known_refund_status,
};
use async_trait::async_trait;
use reqwest::StatusCode;
use serde::Deserialize;
use std::collections::HashMap;
use std::time::Duration;
use uuid::Uuid;

/// Stripe's production API.
pub const PRODUCTION_URL: &str = "https://api.stripe.com";

/// The Stripe API version every request pins (`Stripe-Version`), so that what Stripe
/// answers does not depend on the account's default version: search needs 2020-08-27 or
/// later, the PaymentIntent statuses read here 2019-02-11 or later. Set the webhook
/// endpoint to the same version in the Dashboard (docs/gateways/stripe.md): its events
/// are rendered in the endpoint's version, and `refund.*` events come for every refund
/// only from this one on.
pub const API_VERSION: &str = "2024-10-28.acacia";

/// How long Stripe honours an idempotency key: keys "can be pruned once they are at least
/// 24 hours old", so a resend inside 24 hours replays the first answer.
pub const KEY_WINDOW: Duration = Duration::from_secs(24 * 60 * 60);

/// The metadata key that carries the pagos payment id (on a PaymentIntent) or refund id
/// (on a Refund).
pub const REFERENCE_KEY: &str = "pagos_reference";

/// The metadata key that carries a refund's reason in the merchant's words (Stripe's own
/// `reason` takes only `duplicate`, `fraudulent` or `requested_by_customer`).
pub const REASON_KEY: &str = "pagos_reason";

/// How many pages of 100 refunds a look-up reads before it gives up (unknown outcome): a
/// PaymentIntent with more than a thousand refunds is not one pagos made.
const MAX_REFUND_PAGES: usize = 10;

pub struct StripeGateway {
    api: Api,
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
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct ApiError {
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub code: Option<String>,
    pub decline_code: Option<String>,
    pub message: Option<String>,
    /// The parameter the error is about (`amount`, …).
    pub param: Option<String>,
    /// On a card error, the PaymentIntent as the failed confirmation left it.
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
/// | `requires_payment_method` | declined (the confirmation failed: `last_payment_error`); without an error, pending (not confirmed yet: a lagging search's snapshot of its creation) |
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
        let mut status = status_of(&self.status).ok_or_else(|| {
            GatewayError::Unknown(format!(
                "PaymentIntent {} has a status pagos does not know: {}",
                self.id, self.status
            ))
        })?;
        // `requires_payment_method` with no error is a PaymentIntent not confirmed yet:
        // the status it is created in, which a search index lagging behind the
        // confirmation still shows (a charged customer would be answered declined). Only
        // a failed confirmation (its `last_payment_error`, or the card error it came
        // with) is a decline.
        if self.status == "requires_payment_method"
            && error.is_none()
            && self.last_payment_error.is_none()
        {
            status = ChargeStatus::Pending;
        }
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
            charged_back: false,
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

/// A Stripe Refund, trimmed to what pagos reads (fields stable across API versions).
#[derive(Clone, Debug, Deserialize)]
pub struct StripeRefund {
    pub id: String,
    /// Nullable in Stripe's reference.
    #[serde(default)]
    pub status: Option<String>,
    pub amount: i64,
    pub currency: String,
    #[serde(default)]
    pub payment_intent: Option<String>,
    #[serde(default)]
    pub charge: Option<String>,
    #[serde(default)]
    pub metadata: HashMap<String, String>,
    #[serde(default)]
    pub failure_reason: Option<String>,
    #[serde(default)]
    pub created: i64,
}

/// What a Refund's status means (docs/gateways/stripe.md):
///
/// | status | refund |
/// | --- | --- |
/// | `succeeded` | succeeded (it may still turn `failed` later: the card was closed, …) |
/// | `pending` | pending |
/// | `requires_action` | pending: the customer must give details for the money to go back (some non-card methods) |
/// | `failed` | failed, code `failure_reason` |
/// | `canceled` | failed (a `requires_action` refund canceled), code `failure_reason` else `canceled` |
///
/// None: a status this version does not know (or none); the outcome is unknown.
pub fn refund_status_of(status: &str) -> Option<RefundStatus> {
    match status {
        "succeeded" => Some(RefundStatus::Succeeded),
        "pending" | "requires_action" => Some(RefundStatus::Pending),
        "failed" | "canceled" => Some(RefundStatus::Failed),
        _ => None,
    }
}

impl StripeRefund {
    /// The pagos refund id this Refund carries, if pagos made it.
    pub fn reference(&self) -> Option<&str> {
        self.metadata.get(REFERENCE_KEY).map(String::as_str)
    }

    /// The Refund in pagos' terms (amount in pagos' minor units, currency upper case, the
    /// charge its PaymentIntent).
    pub fn to_refund(&self) -> Result<Refund, GatewayError> {
        let shown = self.status.as_deref().unwrap_or("(none)");
        let status = known_refund_status(self.status.as_deref(), refund_status_of, || {
            format!(
                "Refund {} has a status pagos does not know: {shown}",
                self.id
            )
        })?;
        let currency = self.currency.to_ascii_uppercase();
        let amount = amount::from_stripe(self.amount, &currency)
            .map_err(|e| GatewayError::Unknown(format!("Refund {}: amount {e}", self.id)))?;
        let failure_code = (status == RefundStatus::Failed).then(|| {
            let code = self
                .failure_reason
                .as_deref()
                .filter(|r| !r.is_empty())
                .unwrap_or(shown);
            super::decline_code(code)
        });
        Ok(Refund {
            id: self.id.clone(),
            status,
            charge: self
                .payment_intent
                .clone()
                .or_else(|| self.charge.clone())
                .unwrap_or_default(),
            amount,
            currency,
            reference: self.reference().unwrap_or_default().to_owned(),
            failure_code,
        })
    }
}

/// The form body of `POST /v1/refunds` for `req`: the same bytes on every send of one
/// refund.
pub fn refund_form(req: &RefundRequest) -> Result<String, String> {
    let stripe_amount = amount::to_stripe(req.amount, &req.currency).map_err(|e| e.to_string())?;
    let mut form = url::form_urlencoded::Serializer::new(String::new());
    form.append_pair("payment_intent", &req.charge)
        .append_pair("amount", &stripe_amount.to_string())
        .append_pair(
            &format!("metadata[{REFERENCE_KEY}]"),
            &req.reference.to_string(),
        );
    if let Some(reason) = &req.reason {
        form.append_pair(&format!("metadata[{REASON_KEY}]"), reason);
    }
    Ok(form.finish())
}

/// What a Stripe error says about a refused refund's amount: `charge_already_refunded`
/// (nothing left), `amount_too_large`, or the refusal Stripe sends without a code, on
/// `param: amount`, "Refund amount (…) is greater than unrefunded amount on charge (…)".
pub fn refund_amount_said(error: &ApiError) -> AmountSaid {
    let code = error.code.as_deref();
    let over_unrefunded = error.param.as_deref() == Some("amount")
        && error
            .message
            .as_deref()
            .is_some_and(|m| m.to_ascii_lowercase().contains("unrefunded"));
    if matches!(code, Some("charge_already_refunded" | "amount_too_large")) || over_unrefunded {
        AmountSaid::ExceedsRemaining
    } else {
        AmountSaid::Nothing
    }
}

#[derive(Deserialize)]
struct RefundList {
    data: Vec<StripeRefund>,
    #[serde(default)]
    has_more: bool,
}

/// The refund events whose object is a Refund.
pub const REFUND_EVENTS: [&str; 4] = [
    "refund.created",
    "refund.updated",
    "refund.failed",
    "charge.refund.updated",
];

/// `created` is in seconds: below 10^10 until the year 2286.
const RANK_STEP: i64 = 10_000_000_000;

/// The ordering key of a refund's state as reported by an event created at `created` (unix
/// seconds). Stripe has no per-object sequence and delivers in any order, so a state
/// outranks the states that come before it: pending (1) < succeeded (2) < failed (3). A
/// refund can turn `failed` after `succeeded`, never the other way, so a late `succeeded`
/// event never undoes a `failed` one; between two of one rank, the later event wins.
pub fn refund_sequence(status: RefundStatus, created: i64) -> i64 {
    let rank = match status {
        RefundStatus::Pending => 1,
        RefundStatus::Succeeded => 2,
        RefundStatus::Failed => 3,
    };
    rank * RANK_STEP + created.clamp(0, RANK_STEP - 1)
}

/// A refund as one Stripe event reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RefundEvent {
    /// `evt_…`: the dedupe key.
    pub id: String,
    pub kind: String,
    pub refund: Refund,
    /// `refund_sequence` of the state reported.
    pub sequence: i64,
}

/// Why an event's body could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unreadable Stripe refund event: {0}")]
pub struct UnreadableEvent(pub String);

#[derive(Deserialize)]
struct EventEnvelope {
    id: String,
    #[serde(rename = "type")]
    kind: String,
    created: i64,
    data: EventData,
}

#[derive(Deserialize)]
struct EventData {
    object: serde_json::Value,
}

/// The refund a Stripe event reports, from bytes whose signature was already verified.
/// `None`: not a refund event (`REFUND_EVENTS`), a refund pagos did not make (no
/// `metadata.pagos_reference`), or one whose status is null or one pagos does not know
/// (logged: the event says nothing pagos can act on, and refusing it would only make
/// Stripe send it again for days; the reconciler asks Stripe about a refund in flight).
pub fn refund_event(raw: &[u8]) -> Result<Option<RefundEvent>, UnreadableEvent> {
    let envelope: EventEnvelope = serde_json::from_slice(raw)
        .map_err(|e| UnreadableEvent(format!("not a Stripe event: {e}")))?;
    if !REFUND_EVENTS.contains(&envelope.kind.as_str()) {
        return Ok(None);
    }
    if envelope.object_is_not("refund") {
        return Err(UnreadableEvent(format!(
            "a {} event whose `data.object` is not a refund",
            envelope.kind
        )));
    }
    let refund: StripeRefund = serde_json::from_value(envelope.data.object)
        .map_err(|e| UnreadableEvent(format!("`data.object` is not a Refund: {e}")))?;
    if refund.reference().is_none() {
        return Ok(None);
    }
    if refund
        .status
        .as_deref()
        .and_then(refund_status_of)
        .is_none()
    {
        tracing::warn!(
            event_id = %envelope.id,
            refund_id = %refund.id,
            status = refund.status.as_deref().unwrap_or("(null)"),
            "Stripe refund event with a status pagos does not know: acknowledged and ignored"
        );
        return Ok(None);
    }
    let refund = refund
        .to_refund()
        .map_err(|e| UnreadableEvent(format!("`data.object`: {e}")))?;
    Ok(Some(RefundEvent {
        id: envelope.id,
        kind: envelope.kind,
        sequence: refund_sequence(refund.status, envelope.created),
        refund,
    }))
}

impl EventEnvelope {
    fn object_is_not(&self, kind: &str) -> bool {
        self.data.object["object"]
            .as_str()
            .is_some_and(|object| object != kind)
    }
}

impl StripeGateway {
    pub fn new(base: &str, secret: &str, timeout: Duration) -> Result<Self, reqwest::Error> {
        Ok(StripeGateway {
            api: Api::with_headers(
                base,
                secret,
                timeout,
                reqwest::header::HeaderMap::from_iter([(
                    reqwest::header::HeaderName::from_static("stripe-version"),
                    reqwest::header::HeaderValue::from_static(API_VERSION),
                )]),
            )?,
        })
    }

    /// `GET /v1/payment_intents/{id}`: the PaymentIntent as Stripe holds it now; None
    /// when Stripe has no such PaymentIntent, or `id` cannot be one (`pi_` and letters,
    /// digits or `_`: nothing else reaches the URL's path).
    pub async fn fetch_intent(&self, id: &str) -> Result<Option<PaymentIntent>, GatewayError> {
        let is_intent = id.len() > 3
            && id.starts_with("pi_")
            && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !is_intent {
            return Ok(None);
        }
        fetch_one(
            &self.api,
            &format!("/v1/payment_intents/{id}"),
            &format!("Stripe PaymentIntent {id}"),
        )
        .await
    }

    /// `POST {path}` with a form `body`, authenticated and under `key`.
    async fn post_form(
        &self,
        path: &str,
        key: &str,
        body: String,
    ) -> Result<reqwest::Response, GatewayError> {
        self.api
            .post(path)
            .header("Idempotency-Key", key)
            .header(
                reqwest::header::CONTENT_TYPE,
                "application/x-www-form-urlencoded",
            )
            .body(body)
            .send()
            .await
            .map_err(|e| transport(&e))
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
        let text = refusal_body(resp).await?;
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

    async fn classify_refund(&self, resp: reqwest::Response) -> Result<Refund, GatewayError> {
        let status = resp.status();
        if status.is_success() {
            let bytes = resp.bytes().await.map_err(|e| transport(&e))?;
            let made: StripeRefund = serde_json::from_slice(&bytes).map_err(|e| {
                GatewayError::Unknown(format!("unreadable {status} answer from Stripe: {e}"))
            })?;
            tracing::debug!(refund = made.id, status = ?made.status, "Stripe answered a refund");
            // Stripe echoes the metadata pagos set: a Refund without the reference is not
            // known to be this refund's, and `retry::refund` does not believe it.
            return made.to_refund();
        }
        let text = refusal_body(resp).await?;
        let error = serde_json::from_str::<ErrorBody>(&text)
            .map(|b| b.error)
            .ok();
        let said = if error.as_ref().and_then(|e| e.kind.as_deref()) == Some("idempotency_error") {
            KeySaid::UsedWithAnotherRequest
        } else {
            KeySaid::Nothing
        };
        let amount = error
            .as_ref()
            .map_or(AmountSaid::Nothing, refund_amount_said);
        let excerpt: String = text.chars().take(300).collect();
        Err(refund_refusal("Stripe", status, said, amount, &excerpt))
    }
}

#[async_trait]
impl Gateway for StripeGateway {
    async fn charge(&self, req: &ChargeRequest) -> Result<Charge, GatewayError> {
        let body = form_body(req)
            .map_err(|why| GatewayError::rejected(422, format!("not sent to Stripe: {why}")))?;
        let resp = self
            .post_form("/v1/payment_intents", &req.gateway_key, body)
            .await?;
        self.classify_charge(resp).await
    }

    async fn lookup(&self, reference: Uuid) -> Result<Vec<Charge>, GatewayError> {
        let mut url = url::Url::parse(&format!("{}/v1/payment_intents/search", self.api.base))
            .map_err(|e| GatewayError::Unknown(format!("bad Stripe URL: {e}")))?;
        url.query_pairs_mut()
            .append_pair("query", &search_query(reference))
            .append_pair("limit", "10");
        let found: SearchResult = search(&self.api, url, "Stripe search").await?;
        let reference = reference.to_string();
        found
            .data
            .iter()
            .filter(|pi| pi.reference() == Some(reference.as_str()))
            .map(|pi| pi.to_charge(None))
            .collect()
    }

    async fn refund(&self, req: &RefundRequest) -> Result<Refund, GatewayError> {
        let body = refund_form(req)
            .map_err(|why| GatewayError::rejected(422, format!("not sent to Stripe: {why}")))?;
        let resp = self
            .post_form("/v1/refunds", &req.gateway_key, body)
            .await?;
        self.classify_refund(resp).await
    }

    async fn lookup_refunds(&self, refund: &RefundLookup) -> Result<Vec<Refund>, GatewayError> {
        let reference = refund.reference.to_string();
        let ours = |r: &StripeRefund| {
            r.reference() == Some(reference.as_str())
                || refund.gateway_ref.as_deref() == Some(r.id.as_str())
        };
        let mut found = Vec::new();
        let mut after: Option<String> = None;
        for _ in 0..MAX_REFUND_PAGES {
            let mut url = url::Url::parse(&format!("{}/v1/refunds", self.api.base))
                .map_err(|e| GatewayError::Unknown(format!("bad Stripe URL: {e}")))?;
            url.query_pairs_mut()
                .append_pair("payment_intent", &refund.charge)
                .append_pair("limit", "100");
            if let Some(after) = &after {
                url.query_pairs_mut().append_pair("starting_after", after);
            }
            let page: RefundList = search(&self.api, url, "Stripe refund list").await?;
            for listed in page.data.iter().filter(|r| ours(r)) {
                let mut mapped = listed.to_refund()?;
                mapped.reference.clone_from(&reference);
                found.push(mapped);
            }
            match page.data.last() {
                Some(last) if page.has_more => after = Some(last.id.clone()),
                _ => return Ok(found),
            }
        }
        Err(GatewayError::Unknown(format!(
            "PaymentIntent {} has more than {} refunds; pagos reads no further",
            refund.charge,
            MAX_REFUND_PAGES * 100
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::PaymentMethod;
    use crate::gateway::test_charge_request;

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

    /// A PaymentIntent as created, before its confirmation (what a lagging search index
    /// still shows of one confirmed since): pending, never a decline. With the card error
    /// its confirmation came with, a decline.
    #[test]
    fn requires_payment_method_without_an_error_is_not_confirmed_yet_not_declined() {
        let mut created = intent("requires_payment_method");
        created.last_payment_error = None;
        let charge = created.to_charge(None).expect("known status");
        assert_eq!(charge.status, ChargeStatus::Pending);
        assert_eq!(charge.decline_code, None);
        let card_error: ApiError = serde_json::from_value(serde_json::json!(
            {"type":"card_error","code":"card_declined","decline_code":"do_not_honor"}
        ))
        .expect("an error");
        let declined = created.to_charge(Some(&card_error)).expect("known status");
        assert_eq!(declined.status, ChargeStatus::Declined);
        assert_eq!(declined.decline_code.as_deref(), Some("do_not_honor"));
    }

    #[test]
    fn the_form_body_carries_every_documented_field_and_is_stable() {
        let req = test_charge_request(
            "Cuota 3 & más",
            PaymentMethod {
                customer: Some("cus_NffrFeUfNV2Hib".into()),
                ..PaymentMethod::with_id("pm_1Q0PsIJvEtkwdCNYMSaVuRz6")
            },
        );
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

    fn stripe_refund(fixture: &str) -> StripeRefund {
        serde_json::from_str(fixture).expect("a Refund")
    }

    #[test]
    fn every_refund_status_in_the_table_maps_as_documented() {
        use RefundStatus::*;
        for (fixture, status, code) in [
            (
                include_str!("../../fixtures/stripe/refund_succeeded.json"),
                Succeeded,
                None,
            ),
            (
                include_str!("../../fixtures/stripe/refund_pending.json"),
                Pending,
                None,
            ),
            (
                include_str!("../../fixtures/stripe/refund_requires_action.json"),
                Pending,
                None,
            ),
            (
                include_str!("../../fixtures/stripe/refund_failed.json"),
                Failed,
                Some("expired_or_canceled_card"),
            ),
            (
                include_str!("../../fixtures/stripe/refund_canceled.json"),
                Failed,
                Some("canceled"),
            ),
        ] {
            let refund = stripe_refund(fixture).to_refund().expect("known status");
            assert_eq!(refund.status, status, "{fixture}");
            assert_eq!(refund.failure_code.as_deref(), code, "{fixture}");
            assert_eq!(
                refund.charge, "pi_3MtwBwLkdIwHu7ix28a3tqPa",
                "the PaymentIntent"
            );
            assert_eq!((refund.amount, refund.currency.as_str()), (50_000, "COP"));
            assert_eq!(refund.reference, "7f3c2a10-5b6e-4d8f-9a1c-2e4b6d8f0a12");
        }
        let mut odd = stripe_refund(include_str!("../../fixtures/stripe/refund_succeeded.json"));
        for status in [Some("teleported".to_owned()), None] {
            odd.status = status;
            assert!(matches!(odd.to_refund(), Err(GatewayError::Unknown(_))));
        }
    }

    fn refund_request() -> RefundRequest {
        RefundRequest {
            gateway_key: "rk".into(),
            charge: "pi_3MtwBwLkdIwHu7ix28a3tqPa".into(),
            amount: 50_000,
            currency: "COP".into(),
            reference: Uuid::parse_str("7f3c2a10-5b6e-4d8f-9a1c-2e4b6d8f0a12").expect("uuid"),
            reason: Some("solicitud del cliente".into()),
            whole: false,
        }
    }

    #[test]
    fn the_refund_form_is_the_documented_one_and_stable() {
        let req = refund_request();
        let body = refund_form(&req).expect("a body");
        assert_eq!(refund_form(&req).expect("a body"), body);
        assert_eq!(
            body,
            include_str!("../../fixtures/stripe/create_refund_request.txt").trim_end()
        );
        let pairs: Vec<(String, String)> = url::form_urlencoded::parse(body.as_bytes())
            .into_owned()
            .collect();
        let names: Vec<&str> = pairs.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            names,
            [
                "payment_intent",
                "amount",
                "metadata[pagos_reference]",
                "metadata[pagos_reason]"
            ]
        );
        let plain = refund_form(&RefundRequest {
            reason: None,
            whole: true,
            ..req
        })
        .expect("a body");
        assert!(!plain.contains("pagos_reason"), "{plain}");
        assert!(
            plain.contains("amount=50000"),
            "Stripe takes the amount even for the whole"
        );
    }

    fn error(fixture: &str) -> ApiError {
        serde_json::from_str::<ErrorBody>(fixture)
            .expect("an error")
            .error
    }

    #[test]
    fn stripes_over_refund_refusals_are_told_apart_from_other_refusals() {
        for fixture in [
            include_str!("../../fixtures/stripe/error_charge_already_refunded.json"),
            include_str!("../../fixtures/stripe/error_refund_exceeds_unrefunded.json"),
            r#"{"error":{"type":"invalid_request_error","code":"amount_too_large","param":"amount","message":"Amount must be no more than $999,999.99"}}"#,
        ] {
            assert_eq!(
                refund_amount_said(&error(fixture)),
                AmountSaid::ExceedsRemaining,
                "{fixture}"
            );
        }
        for fixture in [
            include_str!("../../fixtures/stripe/error_payment_method_missing.json"),
            include_str!("../../fixtures/stripe/error_idempotency_key_reused.json"),
            r#"{"error":{"type":"invalid_request_error","param":"payment_intent","message":"No such payment_intent: 'pi_x'; unrefunded"}}"#,
        ] {
            assert_eq!(
                refund_amount_said(&error(fixture)),
                AmountSaid::Nothing,
                "{fixture}"
            );
        }
    }

    #[test]
    fn refund_events_report_the_refund_in_pagos_terms_and_ignore_the_rest() {
        let created = refund_event(
            include_str!("../../fixtures/stripe/event_refund_created.json").as_bytes(),
        )
        .expect("readable")
        .expect("a refund of pagos'");
        assert_eq!(created.kind, "refund.created");
        assert_eq!(created.id, "evt_3MtwBwLkdIwHu7ix1Rc4Nw7A");
        assert_eq!(created.refund.status, RefundStatus::Succeeded);
        assert_eq!(
            created.refund.reference,
            "7f3c2a10-5b6e-4d8f-9a1c-2e4b6d8f0a12"
        );

        let pending = refund_event(
            include_str!("../../fixtures/stripe/event_refund_updated_pending.json").as_bytes(),
        )
        .expect("readable")
        .expect("a refund");
        assert_eq!(pending.refund.status, RefundStatus::Pending);

        for fixture in [
            include_str!("../../fixtures/stripe/event_refund_failed.json"),
            include_str!("../../fixtures/stripe/event_charge_refund_updated.json"),
        ] {
            let failed = refund_event(fixture.as_bytes())
                .expect("readable")
                .expect("a refund");
            assert_eq!(failed.refund.status, RefundStatus::Failed, "{fixture}");
            assert_eq!(
                failed.refund.failure_code.as_deref(),
                Some("expired_or_canceled_card")
            );
            // Failed after succeeded: the later state wins, whatever order they arrive in.
            assert!(failed.sequence > created.sequence);
        }
        assert!(created.sequence > pending.sequence);

        // A payment's event, and a refund pagos did not make, are not refunds of pagos'.
        assert_eq!(
            refund_event(
                include_str!("../../fixtures/stripe/event_payment_intent_succeeded.json")
                    .as_bytes()
            ),
            Ok(None)
        );
        let mut foreign: serde_json::Value = serde_json::from_str(include_str!(
            "../../fixtures/stripe/event_refund_created.json"
        ))
        .expect("json");
        foreign["data"]["object"]["metadata"] = serde_json::json!({});
        let raw = serde_json::to_vec(&foreign).expect("json");
        assert_eq!(refund_event(&raw), Ok(None));
        // A refund event whose object is not a refund is not silently taken.
        foreign["data"]["object"]["object"] = serde_json::json!("charge");
        assert!(refund_event(&serde_json::to_vec(&foreign).expect("json")).is_err());
        // One whose status is null (nullable in Stripe's reference) or unknown says nothing
        // pagos can act on: acknowledged and ignored, not refused for Stripe to resend.
        let mut odd: serde_json::Value = serde_json::from_str(include_str!(
            "../../fixtures/stripe/event_refund_created.json"
        ))
        .expect("json");
        for status in [serde_json::json!("teleported"), serde_json::Value::Null] {
            odd["data"]["object"]["status"] = status;
            assert_eq!(
                refund_event(&serde_json::to_vec(&odd).expect("json")),
                Ok(None)
            );
        }
        assert!(refund_event(b"not json").is_err());
    }

    #[test]
    fn a_late_succeeded_never_outranks_failed_and_a_later_event_of_one_rank_wins() {
        use RefundStatus::*;
        assert!(refund_sequence(Failed, 100) > refund_sequence(Succeeded, 200));
        assert!(refund_sequence(Succeeded, 100) > refund_sequence(Pending, 200));
        assert!(refund_sequence(Pending, 201) > refund_sequence(Pending, 200));
    }
}
