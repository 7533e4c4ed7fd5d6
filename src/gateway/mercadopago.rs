//! The Mercado Pago adapter (`PAGOS_GATEWAY=mercadopago`): `POST /v1/payments` (JSON)
//! with the gateway key in `X-Idempotency-Key` and the payment id in
//! `external_reference`; looked up with `GET /v1/payments/search?external_reference=`;
//! and `GET /v1/payments/{id}`, which the webhook consumer needs because Mercado Pago's
//! notifications carry only the payment's id.
//!
//! It classifies answers and maps payment statuses, nothing more (the table is in
//! `status_of` and in docs/gateways/mercadopago.md).
//!
//! Refunds: `POST /v1/payments/{id}/refunds` with the refund's own key in
//! `X-Idempotency-Key` and `X-Render-In-Process-Refunds: true` (so a refund still in
//! process is a 201 `in_process`, not a 400), body `{"amount": <decimal>}` or `{}` for the
//! whole payment when the charge is of its amount (`charged_exactly`). A Mercado Pago refund carries nothing of pagos' (its request takes only
//! the amount), so a look-up finds a refund only by the id an earlier answer gave
//! (`GET /v1/payments/{id}/refunds`); without one it finds nothing, and a resend with the
//! same key is the way to learn what became of the refund. For the same reason a refund's
//! answer is taken for the refund asked only when its payment and amount are the ones asked
//! (`MercadoPagoRefund::answers`); any other is an unknown outcome.

use super::classify::{AmountSaid, KeySaid, refund_refusal, refusal};
use super::http::{Api, ask, detail, excerpt, fetch_one, read, refusal_body, search, transport};
use super::{
    Charge, ChargeRequest, ChargeStatus, Gateway, GatewayError, Refund, RefundLookup,
    RefundRequest, RefundStatus, amount, known_refund_status,
};
use async_trait::async_trait;
use reqwest::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::time::Duration;
use uuid::Uuid;

/// Mercado Pago's production API.
pub const PRODUCTION_URL: &str = "https://api.mercadopago.com";

/// How long pagos assumes Mercado Pago honours an `X-Idempotency-Key`. Mercado Pago does
/// not document how long it remembers a key, so this is deliberately short: a resend
/// happens only while the first request is recent; later, on-call decides.
pub const KEY_WINDOW: Duration = Duration::from_secs(60 * 60);

pub struct MercadoPagoGateway {
    api: Api,
    /// The currency the account charges in, once known: what Mercado Pago said, or
    /// `PAGOS_MERCADOPAGO_MONEDA` when it could not say.
    currency: tokio::sync::OnceCell<String>,
    /// `PAGOS_MERCADOPAGO_MONEDA`: checked against the account once, used when Mercado
    /// Pago cannot say.
    configured: Option<String>,
    /// Held while Mercado Pago is asked (one ask at a time: the requests meanwhile wait
    /// for its answer), with when the last ask failed and why: those that waited on it
    /// fail with it, rather than each ask again in turn.
    asking: tokio::sync::Mutex<Option<(std::time::Instant, String)>>,
    /// Whether an ask of the account's currency has ended, told or not
    /// (`configured_checked`).
    first_ask_ended: std::sync::atomic::AtomicBool,
    /// `PAGOS_GATEWAY_TIMEOUT`: what one try of a request may take, all its requests
    /// together (a whole refund reads its charge first).
    timeout: Duration,
    /// Whether a charge is of a whole refund's amount (`charged_exactly`), by charge,
    /// currency and amount: a Mercado Pago payment's `transaction_amount` never changes,
    /// so a retry of the refund, or its resend, does not read the charge again.
    exact: moka::sync::Cache<(String, String, i64), bool>,
}

/// How long a failed ask of the account's currency answers for the requests after it.
const FAILED_ASK_HOLDS: Duration = Duration::from_secs(1);

/// How long after a failed ask (not a refusal of the token) the account's currency is
/// asked again while `PAGOS_MERCADOPAGO_MONEDA` stands in for it.
const CONFIGURED_ASKED_AGAIN: Duration = Duration::from_secs(60);

/// The currency of a Mercado Pago site (`site_id`: the account's country).
fn site_currency(site: &str) -> Option<&'static str> {
    Some(match site {
        "MLA" => "ARS",
        "MLB" => "BRL",
        "MLC" => "CLP",
        "MCO" => "COP",
        "MLM" => "MXN",
        "MPE" => "PEN",
        "MLU" => "UYU",
        _ => return None,
    })
}

/// What `GET /users/me` says of the account, trimmed to what pagos reads.
#[derive(Deserialize)]
struct Account {
    site_id: String,
}

/// A Mercado Pago payment, trimmed to what pagos reads.
#[derive(Clone, Debug, Deserialize)]
pub struct Payment {
    /// A number on the wire.
    pub id: Value,
    pub status: String,
    #[serde(default)]
    pub status_detail: Option<String>,
    pub transaction_amount: amount::MajorUnits,
    #[serde(default)]
    pub currency_id: Option<String>,
    #[serde(default)]
    pub external_reference: Option<String>,
    #[serde(default)]
    pub date_created: Option<String>,
    #[serde(default)]
    pub date_last_updated: Option<String>,
    /// How much of the payment went back, when Mercado Pago says.
    #[serde(default)]
    pub transaction_amount_refunded: Option<amount::MajorUnits>,
    /// The payment's refunds, when Mercado Pago lists them with it.
    #[serde(default)]
    pub refunds: Vec<ListedRefund>,
}

/// A refund as a payment lists it: only what `Payment::returned` reads.
#[derive(Clone, Debug, Deserialize)]
pub struct ListedRefund {
    pub amount: amount::MajorUnits,
    #[serde(default)]
    pub status: Option<String>,
}

#[derive(Deserialize)]
struct SearchResult {
    results: Vec<Payment>,
}

/// What a payment's status means for its pagos payment (docs/gateways/mercadopago.md):
///
/// | status | charge |
/// | --- | --- |
/// | `approved` | succeeded |
/// | `pending`, `in_process`, `authorized` | pending |
/// | `in_mediation` | pending (a dispute on an approved payment: a final payment keeps its state until it is decided) |
/// | `rejected`, `cancelled` | declined |
/// | `refunded`, `charged_back` | declined: the money went back; a COMPLETADA payment told so goes to REVISION_MANUAL, unless it is `refunded` by pagos' own refunds (`Payment::returned`); `charged_back` (the charge's `charged_back` flag) sends an unsettled payment to REVISION_MANUAL too: the money was taken, and the dispute is open (`in_process`) or went the payer's way (`settled`) |
/// | `charged_back` / `reimbursed` | succeeded (`Payment::to_charge`): the dispute was decided for the seller, the money stays; a COMPLETADA payment stays so |
///
/// None: a status this version does not know; the outcome is unknown.
pub fn status_of(status: &str) -> Option<ChargeStatus> {
    match status {
        "approved" => Some(ChargeStatus::Succeeded),
        "pending" | "in_process" | "authorized" | "in_mediation" => Some(ChargeStatus::Pending),
        "rejected" | "cancelled" | "refunded" | "charged_back" => Some(ChargeStatus::Declined),
        _ => None,
    }
}

/// How far along a status is, for ordering what two reads of one payment said: pending
/// (1), final (2), money returned after being final (3).
pub fn rank(status: &str) -> i64 {
    match status {
        "approved" | "rejected" | "cancelled" => 2,
        "refunded" | "charged_back" => 3,
        _ => 1,
    }
}

impl Payment {
    /// The payment's id as text (`"1234567890"`); empty when it is not one (see
    /// `id_text`).
    pub fn id_text(&self) -> String {
        id_text(&self.id)
    }

    /// The payment's currency code, in upper case (`clp` is pagos' `CLP`); empty when
    /// the payment does not say.
    fn currency(&self) -> String {
        self.currency_id
            .clone()
            .unwrap_or_default()
            .to_ascii_uppercase()
    }

    /// The payment as a charge (amount in pagos' minor units).
    pub fn to_charge(&self) -> Result<Charge, GatewayError> {
        let id = self.id_text();
        let status = status_of(&self.status).ok_or_else(|| {
            GatewayError::Unknown(format!(
                "Mercado Pago payment {id} has a status pagos does not know: {}",
                self.status
            ))
        })?;
        let currency = self.currency();
        let exponent = amount::iso_exponent(&currency, 2);
        let minor = amount::from_decimal(self.transaction_amount, exponent)
            .map_err(|e| GatewayError::Unknown(format!("Mercado Pago payment {id}: amount {e}")))?;
        let detail = self.status_detail.as_deref().filter(|d| !d.is_empty());
        // A dispute decided for the seller: Mercado Pago leaves the payment `charged_back`
        // and says `reimbursed` (`settled` when the money went back to the payer). The
        // money stands, as for `approved`: read as declined, every later notification of
        // a dispute the seller won sent a paid payment back to review.
        let won = self.status == "charged_back" && detail == Some("reimbursed");
        let status = if won { ChargeStatus::Succeeded } else { status };
        let decline_code =
            (status == ChargeStatus::Declined).then(|| match (self.status.as_str(), detail) {
                ("rejected", Some(detail)) => detail.to_owned(),
                ("cancelled", Some(detail)) => format!("cancelled_{detail}"),
                (status, _) => status.to_owned(),
            });
        Ok(Charge {
            id,
            status,
            amount: minor,
            currency,
            reference: self.external_reference.clone().unwrap_or_default(),
            decline_code: decline_code.as_deref().map(super::decline_code),
            charged_back: self.status == "charged_back" && !won,
        })
    }

    /// For a `refunded` payment, how much of it went back, in pagos' minor units: None for
    /// any other status (`charged_back` included: a chargeback is never pagos' doing).
    ///
    /// `refunded` is Mercado Pago's word for "all of it went back" (a partial refund
    /// leaves the payment `approved`), so the figure is never less than the whole
    /// payment: the largest of `transaction_amount`, `transaction_amount_refunded` and the
    /// sum of the listed refunds that were not refused. pagos keeps a COMPLETADA payment
    /// so only when its own refunds cover that much.
    pub fn returned(&self) -> Result<Option<i64>, GatewayError> {
        if self.status != "refunded" {
            return Ok(None);
        }
        let id = self.id_text();
        let exponent = amount::iso_exponent(&self.currency(), 2);
        let minor = |value: amount::MajorUnits| {
            amount::from_decimal(value, exponent).map_err(|e| {
                GatewayError::Unknown(format!("Mercado Pago payment {id}: refunded amount {e}"))
            })
        };
        let whole = minor(self.transaction_amount)?;
        let said = self.transaction_amount_refunded.map(minor).transpose()?;
        let mut listed: i64 = 0;
        for refund in &self.refunds {
            if matches!(refund.status.as_deref(), Some("rejected" | "cancelled")) {
                continue;
            }
            listed = listed.saturating_add(minor(refund.amount)?);
        }
        Ok(Some(whole.max(said.unwrap_or(0)).max(listed)))
    }

    /// When Mercado Pago last changed the payment, in milliseconds (0 when it does not
    /// say).
    pub fn updated_at_millis(&self) -> i64 {
        self.date_last_updated
            .as_deref()
            .or(self.date_created.as_deref())
            .and_then(|d| chrono::DateTime::parse_from_rfc3339(d).ok())
            .map_or(0, |d| d.timestamp_millis().max(0))
    }
}

#[derive(Debug, PartialEq, Serialize)]
pub struct PaymentBody {
    pub transaction_amount: amount::MajorUnits,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    pub payment_method_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub installments: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub issuer_id: Option<String>,
    pub payer: Payer,
    pub external_reference: String,
}

#[derive(Debug, PartialEq, Serialize)]
pub struct Payer {
    pub email: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub identification: Option<Identification>,
}

#[derive(Debug, PartialEq, Serialize)]
pub struct Identification {
    #[serde(rename = "type")]
    pub kind: String,
    pub number: String,
}

/// The body of `POST /v1/payments` for `req`: the same on every send of one payment.
pub fn payment_body(req: &ChargeRequest) -> Result<PaymentBody, String> {
    let method = req
        .payment_method
        .as_ref()
        .ok_or("the payment has no medioPago")?;
    let email = method
        .payer_email
        .clone()
        .ok_or("medioPago has no payer e-mail")?;
    let exponent = amount::iso_exponent(&req.currency, 2);
    let transaction_amount = amount::to_decimal(req.amount, exponent).map_err(|e| e.to_string())?;
    Ok(PaymentBody {
        transaction_amount,
        description: req.description.clone(),
        payment_method_id: method.id.clone(),
        token: method.token.clone(),
        // A card payment needs its installments; one unless the payer chose more.
        installments: method
            .token
            .as_ref()
            .map(|_| method.installments.unwrap_or(1)),
        issuer_id: method.issuer.clone(),
        payer: Payer {
            email,
            identification: method.document.as_ref().map(|d| Identification {
                kind: d.kind.clone(),
                number: d.number.clone(),
            }),
        },
        external_reference: req.reference.to_string(),
    })
}

/// What a Mercado Pago error body says about the idempotency key. Mercado Pago documents
/// a 409 ("the process has not been completed yet") for a key still being processed,
/// which the classifier already reads as unknown, and documents no answer for a key
/// reused with another body; an error that names the idempotency key in its `error`,
/// `message` or `cause` is read as that, so that it is never taken for a refusal.
pub fn key_said(body: &str) -> KeySaid {
    let Ok(value) = serde_json::from_str::<Value>(body) else {
        return KeySaid::Nothing;
    };
    let mut texts = vec![&value["error"], &value["message"]];
    if let Some(causes) = value["cause"].as_array() {
        for cause in causes {
            texts.push(&cause["description"]);
            texts.push(&cause["code"]);
        }
    }
    let names_the_key = texts.iter().filter_map(|t| t.as_str()).any(|t| {
        let t = t.to_ascii_lowercase();
        t.contains("idempotency") || t.contains("idempotencia") || t.contains("idempotência")
    });
    if names_the_key {
        KeySaid::UsedWithAnotherRequest
    } else {
        KeySaid::Nothing
    }
}

/// A Mercado Pago refund, trimmed to what pagos reads. Its amount is in the payment's
/// currency, which the refund does not name.
#[derive(Clone, Debug, Deserialize)]
pub struct MercadoPagoRefund {
    /// A number on the wire.
    pub id: Value,
    #[serde(default)]
    pub payment_id: Value,
    pub amount: amount::MajorUnits,
    #[serde(default)]
    pub status: Option<String>,
    #[serde(default)]
    pub date_created: Option<String>,
}

/// What a refund's status means (docs/gateways/mercadopago.md):
///
/// | status | refund |
/// | --- | --- |
/// | `approved` | succeeded |
/// | `in_process`, `pending` | pending (Pix in contingency, …; with `X-Render-In-Process-Refunds`) |
/// | `rejected`, `cancelled` | failed, code the status |
///
/// None: a status this version does not know (or none); the outcome is unknown.
pub fn refund_status_of(status: &str) -> Option<RefundStatus> {
    match status {
        "approved" => Some(RefundStatus::Succeeded),
        "in_process" | "pending" => Some(RefundStatus::Pending),
        "rejected" | "cancelled" => Some(RefundStatus::Failed),
        _ => None,
    }
}

/// A Mercado Pago id (a whole number on the wire, or its text) as text; empty for
/// anything else (`null`, `true`, `1.5`, an object), which pagos then does not believe
/// (`storable`): such an id would be stored as the charge's reference (`"null"`), and no
/// refund or notification could ever name it.
fn id_text(id: &Value) -> String {
    match id {
        Value::String(s) => s.clone(),
        Value::Number(n) if n.is_u64() || n.is_i64() => n.to_string(),
        _ => String::new(),
    }
}

impl MercadoPagoRefund {
    pub fn id_text(&self) -> String {
        id_text(&self.id)
    }

    /// Whether this refund, the answer to `req`, can be the refund asked for. It carries no
    /// reference of pagos' (Mercado Pago's refund request takes only the amount), so what it
    /// does carry is checked: the payment refunded (`payment_id`, when the answer has it)
    /// and the amount, which for the refund asked is the amount asked (a total refund's is
    /// the whole payment's, which is `req.amount`). Another payment's refund, or another
    /// amount's (another refund of this payment), is not this refund. Two refunds of one
    /// payment for one amount cannot be told apart from the answer alone.
    pub fn answers(&self, req: &RefundRequest) -> Result<(), String> {
        let payment = id_text(&self.payment_id);
        if !payment.is_empty() && payment != req.charge {
            return Err(format!(
                "a refund of payment {payment}, not of {}",
                req.charge
            ));
        }
        let exponent = amount::iso_exponent(&req.currency, 2);
        match amount::from_decimal(self.amount, exponent) {
            Ok(minor) if minor == req.amount => Ok(()),
            _ => Err(format!(
                "a refund of {} {}, not of {} minor units",
                self.amount.0, req.currency, req.amount
            )),
        }
    }

    /// The refund in pagos' terms: `currency` is the payment's (the refund has none),
    /// `reference` the pagos refund it answers for (the refund does not carry it).
    pub fn to_refund(&self, currency: &str, reference: &str) -> Result<Refund, GatewayError> {
        let id = self.id_text();
        let shown = self.status.as_deref().unwrap_or("(none)");
        let status = known_refund_status(self.status.as_deref(), refund_status_of, || {
            format!("Mercado Pago refund {id} has a status pagos does not know: {shown}")
        })?;
        let currency = currency.to_ascii_uppercase();
        let exponent = amount::iso_exponent(&currency, 2);
        let minor = amount::from_decimal(self.amount, exponent)
            .map_err(|e| GatewayError::Unknown(format!("Mercado Pago refund {id}: amount {e}")))?;
        Ok(Refund {
            id,
            status,
            charge: id_text(&self.payment_id),
            amount: minor,
            currency,
            reference: reference.to_owned(),
            failure_code: (status == RefundStatus::Failed).then(|| super::decline_code(shown)),
        })
    }
}

/// The body of `POST /v1/payments/{id}/refunds`: `{"amount": <decimal>}`, or `{}` for the
/// whole payment (Mercado Pago's total refund).
#[derive(Debug, PartialEq, Serialize)]
pub struct RefundBody {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub amount: Option<amount::MajorUnits>,
}

/// The refund body for `req`: the same on every send of one refund.
pub fn refund_body(req: &RefundRequest) -> Result<RefundBody, String> {
    if req.whole {
        return Ok(RefundBody { amount: None });
    }
    let exponent = amount::iso_exponent(&req.currency, 2);
    let amount = amount::to_decimal(req.amount, exponent).map_err(|e| e.to_string())?;
    Ok(RefundBody {
        amount: Some(amount),
    })
}

/// Whether `id` can be a Mercado Pago payment id (a number).
/// A Mercado Pago payment id as Mercado Pago writes it: digits, no leading zero. Another
/// spelling of an id (`0123` for `123`) would reach the same payment while pagos, which
/// matches ids by their bytes (whose charge it is, the reports), took it for another.
fn is_payment_id(id: &str) -> bool {
    !id.is_empty() && !id.starts_with('0') && id.bytes().all(|b| b.is_ascii_digit())
}

/// The header that makes a refund still in process answer 201 `in_process` instead of 400.
const RENDER_IN_PROCESS: &str = "X-Render-In-Process-Refunds";

impl MercadoPagoGateway {
    pub fn new(base: &str, secret: &str, timeout: Duration) -> Result<Self, reqwest::Error> {
        Ok(MercadoPagoGateway {
            api: Api::new(base, secret, timeout)?,
            currency: tokio::sync::OnceCell::new(),
            configured: None,
            asking: tokio::sync::Mutex::new(None),
            first_ask_ended: std::sync::atomic::AtomicBool::new(false),
            timeout,
            exact: moka::sync::Cache::new(10_000),
        })
    }

    /// The same, told the account charges in `currency` (`PAGOS_MERCADOPAGO_MONEDA`).
    /// Mercado Pago is still asked, once: its word is the one that says what a payment
    /// is charged in, so a setting that names another currency gives way to it (an ERROR
    /// says so); the setting is used only when Mercado Pago cannot say (a token that may
    /// not read `/users/me`, an outage), and then without asking again.
    pub fn charging_in(mut self, currency: Option<String>) -> Self {
        self.configured = currency;
        self
    }

    /// The currency to charge in when `PAGOS_MERCADOPAGO_MONEDA` says `configured`: what
    /// Mercado Pago says, which wins (an ERROR when they differ); `configured` while it
    /// cannot say. A token refused the read (401, 403) keeps `configured` for good; another
    /// failure (a timeout, a 5xx) is asked again `CONFIGURED_ASKED_AGAIN` later, so that a
    /// wrong setting is not kept for the process's life by one failed ask at start. Never
    /// waits on an ask another request is making.
    async fn configured_checked(&self, configured: &str) -> String {
        // Until the first ask has ended, a payment waits for it (a wrong setting must not
        // charge the first payments after a start); after a failed one, never.
        let mut last_failure = if self
            .first_ask_ended
            .load(std::sync::atomic::Ordering::Acquire)
        {
            match self.asking.try_lock() {
                Ok(held) => held,
                Err(_) => return configured.to_owned(),
            }
        } else {
            self.asking.lock().await
        };
        if let Some(currency) = self.currency.get() {
            return currency.clone();
        }
        if last_failure
            .as_ref()
            .is_some_and(|(at, _)| at.elapsed() < CONFIGURED_ASKED_AGAIN)
        {
            return configured.to_owned();
        }
        let asked = self.ask_currency().await;
        self.first_ask_ended
            .store(true, std::sync::atomic::Ordering::Release);
        match asked {
            Ok(currency) => {
                if currency != configured {
                    tracing::error!(
                        "PAGOS_MERCADOPAGO_MONEDA says {configured}, but the Mercado Pago account charges in {currency} (GET /users/me): payments are taken in {currency} only, those in {configured} refused 422; correct the setting"
                    );
                }
                let _ = self.currency.set(currency.clone());
                currency
            }
            Err((err, refused)) => {
                if refused {
                    // The token refused (401/403), or an account site pagos has no
                    // currency for: asking again would say the same. The error says which.
                    tracing::warn!(
                        error = %err,
                        "Mercado Pago's account could not tell pagos its currency, and asking again would say the same: charging in PAGOS_MERCADOPAGO_MONEDA's {configured}, as set, without asking again"
                    );
                    let _ = self.currency.set(configured.to_owned());
                } else {
                    tracing::warn!(
                        error = %err,
                        "Mercado Pago did not say which currency its account charges in: charging in PAGOS_MERCADOPAGO_MONEDA's {configured} meanwhile; asked again in a minute"
                    );
                    *last_failure = Some((std::time::Instant::now(), err.to_string()));
                }
                configured.to_owned()
            }
        }
    }

    /// `GET /users/me`: the currency of the account's site. The error says whether
    /// Mercado Pago refused the token this read (401, 403: it will not say, asked again).
    async fn ask_currency(&self) -> Result<String, (GatewayError, bool)> {
        let resp = self
            .api
            .get("/users/me")
            .send()
            .await
            .map_err(|e| (transport(&e), false))?;
        let status = resp.status();
        if !status.is_success() {
            let refused = matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN);
            return Err((
                GatewayError::Unknown(format!(
                    "Mercado Pago answered {status} when asked its account's currency (GET /users/me; PAGOS_MERCADOPAGO_MONEDA is used when it cannot say): {}",
                    detail(resp).await
                )),
                refused,
            ));
        }
        let account: Account = read(resp, "Mercado Pago account (GET /users/me)")
            .await
            .map_err(|e| (e, false))?;
        site_currency(&account.site_id)
            .map(str::to_owned)
            .ok_or_else(|| {
                (
                    GatewayError::Unknown(format!(
                        "the Mercado Pago account's site is {:?}, whose currency pagos does not charge in",
                        account.site_id
                    )),
                    true,
                )
            })
    }

    /// Sends a create `request` (authenticated: `Api::post`) with `body`, under `key`.
    async fn send(
        &self,
        request: reqwest::RequestBuilder,
        key: &str,
        body: &impl Serialize,
    ) -> Result<reqwest::Response, GatewayError> {
        request
            .header("X-Idempotency-Key", key)
            .json(body)
            .send()
            .await
            .map_err(|e| transport(&e))
    }

    /// Whether the charge `req` refunds is of `req`'s amount and currency: only then is
    /// the whole payment's refund sent as Mercado Pago's total refund (`{}`), which gives
    /// back the whole charge. A payment on-call kept on a charge of another amount (an
    /// overrule) is refunded its own amount, never the charge's. `transaction_amount`
    /// never changes, so every send of one refund carries the same body. Asked before
    /// anything is sent: when Mercado Pago cannot say, or has no such payment, nothing is
    /// sent (an unknown outcome: asked again, with the same key, until on-call is given
    /// the refund).
    async fn charged_exactly(&self, req: &RefundRequest) -> Result<bool, GatewayError> {
        let asked = (req.charge.clone(), req.currency.clone(), req.amount);
        if let Some(exact) = self.exact.get(&asked) {
            return Ok(exact);
        }
        let Some(charge) = self.fetch(&req.charge).await? else {
            return Err(GatewayError::Unknown(format!(
                "Mercado Pago has no payment {} to refund: nothing was sent",
                req.charge
            )));
        };
        let currency = charge.currency();
        let exponent = amount::iso_exponent(&currency, 2);
        let exact = currency.eq_ignore_ascii_case(&req.currency)
            && amount::from_decimal(charge.transaction_amount, exponent)
                .is_ok_and(|charged| charged == req.amount);
        self.exact.insert(asked, exact);
        Ok(exact)
    }

    /// `GET /v1/payments/{id}`: the payment as Mercado Pago holds it now; None when
    /// Mercado Pago has no such payment. `id` must be Mercado Pago's numeric id.
    pub async fn fetch(&self, id: &str) -> Result<Option<Payment>, GatewayError> {
        if !is_payment_id(id) {
            return Ok(None);
        }
        fetch_one(
            &self.api,
            &format!("/v1/payments/{id}"),
            &format!("Mercado Pago payment {id}"),
        )
        .await
    }
}

#[async_trait]
impl Gateway for MercadoPagoGateway {
    async fn account_currency(&self) -> Result<Option<String>, GatewayError> {
        if let Some(currency) = self.currency.get() {
            return Ok(Some(currency.clone()));
        }
        if let Some(configured) = &self.configured {
            return Ok(Some(self.configured_checked(configured).await));
        }
        let mut last_failure = self.asking.lock().await;
        if let Some(currency) = self.currency.get() {
            return Ok(Some(currency.clone()));
        }
        if let Some((at, why)) = last_failure.as_ref()
            && at.elapsed() < FAILED_ASK_HOLDS
        {
            return Err(GatewayError::Unknown(why.clone()));
        }
        match self.ask_currency().await {
            Ok(currency) => {
                let _ = self.currency.set(currency.clone());
                Ok(Some(currency))
            }
            Err((err, _)) => {
                let why = match &err {
                    GatewayError::Unknown(why) => why.clone(),
                    other => other.to_string(),
                };
                *last_failure = Some((std::time::Instant::now(), why));
                Err(err)
            }
        }
    }

    async fn charge(&self, req: &ChargeRequest) -> Result<Charge, GatewayError> {
        let body = payment_body(req).map_err(|why| {
            GatewayError::rejected(422, format!("not sent to Mercado Pago: {why}"))
        })?;
        let request = self.api.post("/v1/payments");
        let resp = self.send(request, &req.gateway_key, &body).await?;
        let status = resp.status();
        if status.is_success() {
            let payment: Payment =
                read(resp, &format!("{status} answer from Mercado Pago")).await?;
            return payment.to_charge();
        }
        // What it says of the key is read in the whole body, never in the excerpt kept.
        let text = refusal_body(resp).await?;
        Err(refusal(
            "Mercado Pago",
            status,
            key_said(&text),
            &excerpt(&text),
        ))
    }

    async fn lookup(&self, reference: Uuid) -> Result<Vec<Charge>, GatewayError> {
        let mut url = url::Url::parse(&format!("{}/v1/payments/search", self.api.base))
            .map_err(|e| GatewayError::Unknown(format!("bad Mercado Pago URL: {e}")))?;
        url.query_pairs_mut()
            .append_pair("external_reference", &reference.to_string())
            .append_pair("sort", "date_created")
            .append_pair("criteria", "desc");
        let found: SearchResult = search(&self.api, url, "Mercado Pago search").await?;
        let reference = reference.to_string();
        found
            .results
            .iter()
            .filter(|p| p.external_reference.as_deref() == Some(reference.as_str()))
            .map(Payment::to_charge)
            .collect()
    }

    async fn refund(&self, req: &RefundRequest) -> Result<Refund, GatewayError> {
        let not_sent =
            |why: String| GatewayError::rejected(422, format!("not sent to Mercado Pago: {why}"));
        if !is_payment_id(&req.charge) {
            return Err(not_sent(format!(
                "{:?} is not a Mercado Pago payment id",
                req.charge.chars().take(40).collect::<String>()
            )));
        }
        let started = std::time::Instant::now();
        let mut body = refund_body(req).map_err(not_sent)?;
        if body.amount.is_none() && !self.charged_exactly(req).await? {
            body = refund_body(&RefundRequest {
                whole: false,
                ..req.clone()
            })
            .map_err(not_sent)?;
        }
        // The charge's read and the refund's send together take no longer than one
        // request may: the retries', the hold's and the lease's arithmetic
        // (`retry::worst_case`) count one request a try. Too little left to send: tried
        // again, nothing sent (its read is not made again).
        let left = self.timeout.saturating_sub(started.elapsed());
        if left < self.timeout / 4 {
            return Err(GatewayError::Unknown(format!(
                "reading charge {} took most of this try's PAGOS_GATEWAY_TIMEOUT: the refund was not sent",
                req.charge
            )));
        }
        let request = self
            .api
            .post(&format!("/v1/payments/{}/refunds", req.charge))
            .header(RENDER_IN_PROCESS, "true")
            .timeout(left);
        let resp = self.send(request, &req.gateway_key, &body).await?;
        let status = resp.status();
        if status.is_success() {
            let made: MercadoPagoRefund =
                read(resp, &format!("{status} answer from Mercado Pago")).await?;
            // Nothing on the refund names the pagos refund: it is taken for this refund only
            // if what it carries is what was asked (`MercadoPagoRefund::answers`).
            if let Err(why) = made.answers(req) {
                return Err(GatewayError::Unknown(format!(
                    "Mercado Pago answered refund {}, {why}: not believed",
                    made.id_text()
                )));
            }
            let mut refund = made.to_refund(&req.currency, &req.reference.to_string())?;
            if refund.charge.is_empty() {
                refund.charge.clone_from(&req.charge);
            }
            return Ok(refund);
        }
        let text = refusal_body(resp).await?;
        // Mercado Pago documents no error of its own for a refund over what is left of the
        // payment: its refusals are read as refusals of the request as a whole.
        Err(refund_refusal(
            "Mercado Pago",
            status,
            key_said(&text),
            AmountSaid::Nothing,
            &excerpt(&text),
        ))
    }

    async fn lookup_refunds(&self, refund: &RefundLookup) -> Result<Vec<Refund>, GatewayError> {
        // Nothing on a Mercado Pago refund names the pagos refund: without the id an answer
        // gave, no refund of the payment can be told to be this one.
        let Some(known) = refund.gateway_ref.as_deref() else {
            return Ok(Vec::new());
        };
        self.refund_list(refund, Some(known)).await
    }

    async fn refunds_of_charge(&self, refund: &RefundLookup) -> Result<Vec<Refund>, GatewayError> {
        self.refund_list(refund, None).await
    }
}

impl MercadoPagoGateway {
    /// The payment's refund list (`GET /v1/payments/{id}/refunds`, read whole), only the
    /// refund `known` where one is named.
    async fn refund_list(
        &self,
        refund: &RefundLookup,
        known: Option<&str>,
    ) -> Result<Vec<Refund>, GatewayError> {
        if !is_payment_id(&refund.charge) {
            return Ok(Vec::new());
        }
        let request = self
            .api
            .get(&format!("/v1/payments/{}/refunds", refund.charge))
            .header(RENDER_IN_PROCESS, "true");
        let listed: Vec<MercadoPagoRefund> = ask(request, "Mercado Pago refund list").await?;
        let reference = refund.reference.to_string();
        listed
            .iter()
            .filter(|r| known.is_none_or(|known| r.id_text() == known))
            .map(|r| {
                let mut found = r.to_refund(&refund.currency, &reference)?;
                if found.charge.is_empty() {
                    found.charge.clone_from(&refund.charge);
                }
                Ok(found)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{PayerDocument, PaymentMethod};
    use crate::gateway::test_charge_request;
    use serde_json::json;

    fn payment(status: &str, detail: &str) -> Payment {
        serde_json::from_str(
            &json!({
                "id": 1_234_567_890u64, "status": status, "status_detail": detail,
                "transaction_amount": 2500, "currency_id": "COP",
                "external_reference": "01a236bf-3ba3-730c-b454-685f40f9d62b",
                "date_created": "2026-12-02T10:00:00.000-05:00",
                "date_last_updated": "2026-12-02T10:05:00.000-05:00",
            })
            .to_string(),
        )
        .expect("a payment")
    }

    #[test]
    fn every_status_in_the_table_maps_as_documented() {
        use ChargeStatus::*;
        for (status, detail, charge, code) in [
            ("approved", "accredited", Succeeded, None),
            ("pending", "pending_waiting_payment", Pending, None),
            ("in_process", "pending_contingency", Pending, None),
            ("authorized", "pending_capture", Pending, None),
            ("in_mediation", "", Pending, None),
            (
                "rejected",
                "cc_rejected_insufficient_amount",
                Declined,
                Some("cc_rejected_insufficient_amount"),
            ),
            ("cancelled", "expired", Declined, Some("cancelled_expired")),
            ("refunded", "refunded", Declined, Some("refunded")),
            ("charged_back", "settled", Declined, Some("charged_back")),
            ("charged_back", "in_process", Declined, Some("charged_back")),
            ("charged_back", "reimbursed", Succeeded, None),
        ] {
            let mapped = payment(status, detail).to_charge().expect("known status");
            assert_eq!(mapped.status, charge, "{status}");
            assert_eq!(
                mapped.charged_back(),
                status == "charged_back" && detail != "reimbursed",
                "{status} {detail}"
            );
            assert_eq!(mapped.decline_code.as_deref(), code, "{status}");
            assert_eq!(mapped.id, "1234567890");
            assert_eq!(mapped.amount, 250_000, "2500 COP is 250000 cents");
            assert_eq!(mapped.currency, "COP");
        }
        assert!(payment("lost_in_space", "").to_charge().is_err());
        let long = payment("rejected", &"x".repeat(300))
            .to_charge()
            .expect("read");
        assert_eq!(
            long.decline_code.map(|c| c.len()),
            Some(100),
            "fits the column"
        );
    }

    #[test]
    fn a_payment_id_is_taken_only_as_mercadopago_writes_it() {
        assert!(super::is_payment_id("1234567890"));
        for other in ["", "01234567890", "0", "+123", "12a", " 123"] {
            assert!(!super::is_payment_id(other), "{other:?}");
        }
    }

    #[test]
    fn a_payment_answered_without_a_usable_id_is_not_believed() {
        for id in [
            json!(null),
            json!(true),
            json!(1.5),
            json!({"id": 1}),
            json!(""),
        ] {
            let mut answer = json!({"status": "approved", "transaction_amount": 2500,
                                    "currency_id": "COP"});
            answer["id"] = id.clone();
            let payment: Payment = serde_json::from_value(answer).expect("read");
            let charge = payment.to_charge().expect("a known status");
            let err = crate::gateway::storable::charge(charge)
                .expect_err("settled on a charge no refund could name");
            assert!(err.is_retryable(), "{id}: an unknown outcome, not {err}");
        }
        let payment: Payment = serde_json::from_value(
            json!({"id": 1_234_567_890u64, "status": "approved", "transaction_amount": 2500,
                   "currency_id": "COP"}),
        )
        .expect("read");
        assert_eq!(payment.to_charge().expect("known").id, "1234567890");
    }

    #[test]
    fn a_refunded_payment_returned_all_of_itself_at_least() {
        let with = |status: &str, extra: serde_json::Value| {
            let mut value = json!({"id": 1, "status": status, "transaction_amount": 2500,
                                   "currency_id": "COP"});
            for (k, v) in extra.as_object().expect("object") {
                value[k] = v.clone();
            }
            serde_json::from_value::<Payment>(value).expect("a payment")
        };
        assert_eq!(with("approved", json!({})).returned(), Ok(None));
        assert_eq!(
            with("approved", json!({"transaction_amount_refunded": 400})).returned(),
            Ok(None),
            "a partial refund leaves the payment approved"
        );
        assert_eq!(with("charged_back", json!({})).returned(), Ok(None));
        assert_eq!(with("refunded", json!({})).returned(), Ok(Some(250_000)));
        assert_eq!(
            with("refunded", json!({"transaction_amount_refunded": 2500})).returned(),
            Ok(Some(250_000))
        );
        assert_eq!(
            with("refunded", json!({"transaction_amount_refunded": 1000})).returned(),
            Ok(Some(250_000)),
            "never less than the whole payment"
        );
        assert_eq!(
            with(
                "refunded",
                json!({"refunds": [{"amount": 2000, "status": "approved"},
                                   {"amount": 900, "status": "approved"},
                                   {"amount": 500, "status": "rejected"}]})
            )
            .returned(),
            Ok(Some(290_000)),
            "more than the payment went back: counted as said"
        );
        assert!(
            with("refunded", json!({"transaction_amount_refunded": 0.001}))
                .returned()
                .is_err(),
            "never rounded"
        );
    }

    #[test]
    fn later_states_rank_higher() {
        assert!(rank("pending") < rank("approved"));
        assert!(rank("approved") < rank("refunded"));
        assert_eq!(rank("rejected"), rank("approved"));
        assert_eq!(
            payment("approved", "").updated_at_millis(),
            chrono::DateTime::parse_from_rfc3339("2026-12-02T15:05:00Z")
                .expect("date")
                .timestamp_millis()
        );
    }

    #[test]
    fn the_body_carries_every_documented_field() {
        let req = test_charge_request(
            "Cuota 3",
            PaymentMethod {
                token: Some("ff8080814c11e237014c1ff593b57b4d".into()),
                payer_email: Some("payer@example.com".into()),
                document: Some(PayerDocument {
                    kind: "CC".into(),
                    number: "1020304050".into(),
                }),
                ..PaymentMethod::with_id("visa")
            },
        );
        let body = serde_json::to_value(payment_body(&req).expect("body")).expect("json");
        assert_eq!(
            body,
            json!({
                "transaction_amount": 2500.0,
                "description": "Cuota 3",
                "payment_method_id": "visa",
                "token": "ff8080814c11e237014c1ff593b57b4d",
                "installments": 1,
                "payer": {"email": "payer@example.com",
                          "identification": {"type": "CC", "number": "1020304050"}},
                "external_reference": "00000000-0000-0000-0000-000000000000",
            })
        );
        let cash = ChargeRequest {
            payment_method: Some(PaymentMethod {
                payer_email: Some("payer@example.com".into()),
                ..PaymentMethod::with_id("efecty")
            }),
            ..req
        };
        let body = serde_json::to_value(payment_body(&cash).expect("body")).expect("json");
        assert!(body.get("token").is_none() && body.get("installments").is_none());
    }

    #[test]
    fn every_refund_status_in_the_table_maps_as_documented() {
        use RefundStatus::*;
        for (fixture, status, code) in [
            (
                include_str!("../../fixtures/mercadopago/refund_approved.json"),
                Succeeded,
                None,
            ),
            (
                include_str!("../../fixtures/mercadopago/refund_in_process.json"),
                Pending,
                None,
            ),
            (
                include_str!("../../fixtures/mercadopago/refund_rejected.json"),
                Failed,
                Some("rejected"),
            ),
            (
                include_str!("../../fixtures/mercadopago/refund_cancelled.json"),
                Failed,
                Some("cancelled"),
            ),
        ] {
            let read: MercadoPagoRefund = serde_json::from_str(fixture).expect("a refund");
            let refund = read.to_refund("cop", "r-1").expect("known status");
            assert_eq!(refund.status, status, "{fixture}");
            assert_eq!(refund.failure_code.as_deref(), code, "{fixture}");
            assert_eq!(refund.charge, "1234567890");
            assert_eq!(refund.amount, 50_000, "500 COP is 50000 cents");
            assert_eq!(refund.currency, "COP");
            assert_eq!(refund.reference, "r-1");
        }
        let pending: MercadoPagoRefund =
            serde_json::from_str(&json!({"id": 1, "amount": 5, "status": "pending"}).to_string())
                .expect("a refund");
        assert_eq!(pending.to_refund("COP", "r").map(|r| r.status), Ok(Pending));
        for status in [json!("lost_in_space"), serde_json::Value::Null] {
            let odd: MercadoPagoRefund =
                serde_json::from_str(&json!({"id": 1, "amount": 5, "status": status}).to_string())
                    .expect("a refund");
            assert!(matches!(
                odd.to_refund("COP", "r"),
                Err(GatewayError::Unknown(_))
            ));
        }
        let inexact: MercadoPagoRefund =
            serde_json::from_str(r#"{"id": 1, "amount": 5.005, "status": "approved"}"#)
                .expect("a refund");
        assert!(inexact.to_refund("COP", "r").is_err(), "never rounded");
    }

    #[test]
    fn a_refund_answers_the_request_only_for_its_payment_and_amount() {
        let approved: MercadoPagoRefund = serde_json::from_str(include_str!(
            "../../fixtures/mercadopago/refund_approved.json"
        ))
        .expect("a refund");
        let asked = RefundRequest {
            gateway_key: "k".into(),
            charge: "1234567890".into(),
            amount: 50_000,
            currency: "COP".into(),
            reference: Uuid::nil(),
            reason: None,
            whole: false,
        };
        assert_eq!(approved.answers(&asked), Ok(()), "500 COP of 1234567890");
        let whole = RefundRequest {
            whole: true,
            ..asked.clone()
        };
        assert_eq!(
            approved.answers(&whole),
            Ok(()),
            "the whole is the amount asked"
        );
        let other_payment = RefundRequest {
            charge: "1234567891".into(),
            ..asked.clone()
        };
        assert!(approved.answers(&other_payment).is_err());
        let other_amount = RefundRequest {
            amount: 20_000,
            ..asked.clone()
        };
        assert!(approved.answers(&other_amount).is_err());
        let mut unnamed = approved.clone();
        unnamed.payment_id = Value::Null;
        assert_eq!(unnamed.answers(&asked), Ok(()), "only the amount to go by");
        assert!(unnamed.answers(&other_amount).is_err());
    }

    #[test]
    fn the_refund_body_is_the_exact_decimal_amount_or_empty_for_the_whole() {
        let req = RefundRequest {
            gateway_key: "rk".into(),
            charge: "1234567890".into(),
            amount: 50_000,
            currency: "COP".into(),
            reference: Uuid::nil(),
            reason: Some("solicitud del cliente".into()),
            whole: false,
        };
        let body = serde_json::to_value(refund_body(&req).expect("body")).expect("json");
        let documented: serde_json::Value = serde_json::from_str(include_str!(
            "../../fixtures/mercadopago/refund_request.json"
        ))
        .expect("fixture");
        assert_eq!(body, documented);
        assert_eq!(
            serde_json::to_string(&body).expect("json"),
            r#"{"amount":500.0}"#
        );
        let cents = RefundRequest {
            amount: 1_234,
            ..req.clone()
        };
        assert_eq!(
            serde_json::to_string(&refund_body(&cents).expect("body")).expect("json"),
            r#"{"amount":12.34}"#
        );
        let whole = RefundRequest {
            whole: true,
            ..req.clone()
        };
        assert_eq!(
            serde_json::to_string(&refund_body(&whole).expect("body")).expect("json"),
            "{}"
        );
        let huge = RefundRequest {
            amount: i64::MAX,
            ..req
        };
        assert!(refund_body(&huge).is_err(), "refused, never rounded");
    }
}
