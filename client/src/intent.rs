//! A payment intent: what to pay, and the one idempotency key that pays it.
//!
//! This room must never mint a key per attempt. The key is made once, when the intent is
//! made, and every retry — in this process or in the next one, after a crash — sends that
//! same key with the same body.

use chrono::{DateTime, Utc};
use pagos_types::key::{IdempotencyKey, KeyError};
use pagos_types::request::{Currency, FieldError, NewPayment, PaymentMethod};
use serde_json::{Map, Value};
use std::fmt;
use std::sync::{Arc, Mutex};
use uuid::Uuid;

/// The `Idempotency-Key` of one intent: valid by the server's own rules (1–255 visible
/// ASCII characters).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct IntentKey(String);

impl IntentKey {
    /// A fresh random key (a UUID v4): what every new intent gets.
    pub fn generate() -> IntentKey {
        // The hyphenated form of a UUID is 36 visible ASCII characters: always a valid key.
        IntentKey(Uuid::new_v4().to_string())
    }

    /// A key made elsewhere, such as one kept by the caller next to its pending payment.
    pub fn parse(raw: &str) -> Result<IntentKey, KeyError> {
        IdempotencyKey::parse(raw.as_bytes()).map(|key| IntentKey(key.as_str().to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for IntentKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A `POST /v1/pagos` body the server will accept: it passed the server's own parser.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PaymentRequest(NewPayment);

/// A payment the server would refuse, with every offending field.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid payment: {}", describe(.0))]
pub struct InvalidRequest(pub Vec<FieldError>);

fn describe(errors: &[FieldError]) -> String {
    errors
        .iter()
        .map(|e| format!("{} {}", e.campo, e.detalle))
        .collect::<Vec<_>>()
        .join("; ")
}

impl PaymentRequest {
    /// `credit_id` (1–64 characters), `amount` in minor units of `currency` (positive),
    /// `currency` an ISO 4217 code the service supports.
    ///
    /// ```
    /// use pagos_client::PaymentRequest;
    ///
    /// let request = PaymentRequest::new("42", 250_000, "COP").expect("valid");
    /// assert_eq!(request.amount(), 250_000);
    /// assert!(PaymentRequest::new("42", 0, "COP").is_err());
    /// ```
    pub fn new(
        credit_id: impl Into<String>,
        amount: i64,
        currency: &str,
    ) -> Result<PaymentRequest, InvalidRequest> {
        let mut body = Map::new();
        body.insert("creditoId".into(), Value::String(credit_id.into()));
        body.insert("monto".into(), Value::from(amount));
        body.insert("moneda".into(), Value::String(currency.to_owned()));
        PaymentRequest::from_json(&Value::Object(body))
    }

    /// The same payment with a `descripcion` (at most 255 characters).
    pub fn with_description(
        self,
        description: impl Into<String>,
    ) -> Result<PaymentRequest, InvalidRequest> {
        let mut body = self.to_json();
        body["descripcion"] = Value::String(description.into());
        PaymentRequest::from_json(&body)
    }

    /// The same payment, paid with `method` (`medioPago`): what a server charging through
    /// Stripe or Mercado Pago needs. The fields a gateway does not use are refused by the
    /// server, which knows its gateway; this checks only their form.
    ///
    /// ```
    /// use pagos_client::{PaymentMethod, PaymentRequest};
    ///
    /// // Stripe: a saved PaymentMethod, and the Customer it belongs to.
    /// let stripe = PaymentMethod {
    ///     customer: Some("cus_NffrFeUfNV2Hib".into()),
    ///     ..PaymentMethod::with_id("pm_1Q0PsIJvEtkwdCNYMSaVuRz6")
    /// };
    /// let request = PaymentRequest::new("42", 250_000, "COP")?.with_payment_method(stripe)?;
    /// assert_eq!(request.to_json()["medioPago"]["cliente"], "cus_NffrFeUfNV2Hib");
    ///
    /// // Mercado Pago: the card token of its JS SDK, installments and the payer's e-mail.
    /// let card = PaymentMethod {
    ///     token: Some("ff8080814c11e237014c1ff593b57b4d".into()),
    ///     installments: Some(1),
    ///     payer_email: Some("payer@example.com".into()),
    ///     ..PaymentMethod::with_id("visa")
    /// };
    /// let request = PaymentRequest::new("42", 250_000, "COP")?.with_payment_method(card)?;
    /// assert_eq!(request.payment_method().map(|m| m.id.as_str()), Some("visa"));
    /// # Ok::<(), pagos_client::InvalidRequest>(())
    /// ```
    pub fn with_payment_method(
        self,
        method: PaymentMethod,
    ) -> Result<PaymentRequest, InvalidRequest> {
        let mut body = self.to_json();
        body["medioPago"] = method.to_json();
        PaymentRequest::from_json(&body)
    }

    /// Parses a body in the contract's JSON form (as kept in the journal).
    pub fn from_json(body: &Value) -> Result<PaymentRequest, InvalidRequest> {
        NewPayment::from_json(body)
            .map(PaymentRequest)
            .map_err(InvalidRequest)
    }

    /// The body sent to `POST /v1/pagos`.
    pub fn to_json(&self) -> Value {
        let mut body = Map::new();
        body.insert("creditoId".into(), Value::String(self.0.credit_id.clone()));
        body.insert("monto".into(), Value::from(self.0.amount));
        body.insert(
            "moneda".into(),
            Value::String(self.0.currency.code().to_owned()),
        );
        if let Some(description) = &self.0.description {
            body.insert("descripcion".into(), Value::String(description.clone()));
        }
        if let Some(method) = &self.0.payment_method {
            body.insert("medioPago".into(), method.to_json());
        }
        Value::Object(body)
    }

    pub fn credit_id(&self) -> &str {
        &self.0.credit_id
    }

    /// Minor units of `currency`.
    pub fn amount(&self) -> i64 {
        self.0.amount
    }

    pub fn currency(&self) -> Currency {
        self.0.currency
    }

    pub fn description(&self) -> Option<&str> {
        self.0.description.as_deref()
    }

    /// How the payer pays (`medioPago`), when given.
    pub fn payment_method(&self) -> Option<&PaymentMethod> {
        self.0.payment_method.as_ref()
    }
}

/// One intention to pay: a request and the key that every attempt at it carries.
///
/// It remembers when its first request left (a moment before, never after), and so do
/// its clones: `pay` notes it before sending, so paying the same value again a day later
/// is measured from that first send ([`PayError::Expired`](crate::PayError::Expired) once
/// the server may have let the key go), with or without a journal. Only in memory: an
/// intent rebuilt from a kept key knows it from [`first_sent_at`](Intent::first_sent_at)
/// (or from the journal, which keeps when the intent was written, just before its first
/// request). `Intent` has no serialized form; keep the key and that time.
///
/// ```
/// use pagos_client::{Intent, PaymentRequest};
///
/// let intent = Intent::new(PaymentRequest::new("42", 250_000, "COP").expect("valid"));
/// let retry = intent.clone();
/// assert_eq!(retry.key(), intent.key(), "a retry is the same intent, with the same key");
/// ```
#[derive(Clone, Debug)]
pub struct Intent {
    key: IntentKey,
    request: PaymentRequest,
    first_sent: FirstSent,
}

/// When an intent's first request left, shared by the intent and its clones: a `pay` of a
/// clone (a copy kept by the caller, a spawned task's) still tells the next `pay` of the
/// original how old its key is. It only ever moves earlier, so an intent's age errs long:
/// stopping early asks a human, stopping late may pay twice.
#[derive(Clone, Default)]
struct FirstSent(Arc<Mutex<Option<DateTime<Utc>>>>);

impl FirstSent {
    fn get(&self) -> Option<DateTime<Utc>> {
        *crate::lock(&self.0)
    }

    fn no_later_than(&self, at: DateTime<Utc>) {
        let mut sent = crate::lock(&self.0);
        *sent = Some(sent.map_or(at, |sent| sent.min(at)));
    }
}

impl fmt::Debug for FirstSent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.get(), f)
    }
}

/// One intent is its key and its request; when it was first sent is what is known about
/// it, not what it is.
impl PartialEq for Intent {
    fn eq(&self, other: &Intent) -> bool {
        self.key == other.key && self.request == other.request
    }
}

impl Eq for Intent {}

impl Intent {
    /// A new intent with a fresh UUID v4 key. Make it once per payment and keep it (a
    /// journal does): a new intent for a retry is how double charges happen.
    pub fn new(request: PaymentRequest) -> Intent {
        Intent {
            key: IntentKey::generate(),
            request,
            first_sent: FirstSent::default(),
        }
    }

    /// An intent whose key the caller already keeps (for instance in its own database,
    /// next to the pending payment). Give it [`first_sent_at`](Intent::first_sent_at)
    /// too: the server honours a key only for its `PAGOS_KEY_RETENTION` (24 h by default)
    /// after the key's first request.
    pub fn with_key(key: IntentKey, request: PaymentRequest) -> Intent {
        Intent {
            key,
            request,
            first_sent: FirstSent::default(),
        }
    }

    /// The same intent, whose first request left at `at` (or earlier: when the caller
    /// first asked to pay it is a safe choice). The server keeps a key for
    /// `PAGOS_KEY_RETENTION` after its first request, and once it let the key go, the same
    /// key makes a **new** payment; so `pay` sends nothing for an intent first sent longer
    /// ago than that ([`PayError::Expired`](crate::PayError::Expired)): look its payment up
    /// first. A journal keeps the date from then on. An intent already known to be sent
    /// earlier (by a `pay` of it or of a clone) keeps the earlier time, and its clones see
    /// this one.
    ///
    /// ```
    /// use pagos_client::{Intent, IntentKey, PaymentRequest};
    ///
    /// let request = PaymentRequest::new("42", 250_000, "COP").expect("valid");
    /// let sent = chrono::Utc::now() - chrono::Duration::hours(3);
    /// let kept = IntentKey::parse("pago-42-cuota-3").expect("key");
    /// let retry = Intent::with_key(kept, request).first_sent_at(sent);
    /// assert_eq!(retry.first_sent(), Some(sent));
    /// ```
    pub fn first_sent_at(self, at: DateTime<Utc>) -> Intent {
        self.first_sent.no_later_than(at);
        self
    }

    pub fn key(&self) -> &IntentKey {
        &self.key
    }

    pub fn request(&self) -> &PaymentRequest {
        &self.request
    }

    /// When its first request left (or a moment before), as the caller said
    /// ([`Intent::first_sent_at`]) or as a `pay` of this intent or a clone of it noted
    /// before sending it; `None` while neither did.
    pub fn first_sent(&self) -> Option<DateTime<Utc>> {
        self.first_sent.get()
    }

    /// A request of it is about to leave; its first left no later than `at`.
    pub(crate) fn sending(&self, at: DateTime<Utc>) {
        self.first_sent.no_later_than(at);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn request() -> PaymentRequest {
        PaymentRequest::new("42", 250_000, "COP").expect("valid")
    }

    #[test]
    fn each_new_intent_gets_its_own_uuid_v4_key() {
        let a = Intent::new(request());
        let b = Intent::new(request());
        assert_ne!(a.key(), b.key());
        let parsed = Uuid::parse_str(a.key().as_str()).expect("a UUID");
        assert_eq!(parsed.get_version_num(), 4);
    }

    #[test]
    fn the_body_is_the_contracts_json() {
        assert_eq!(
            request().to_json(),
            json!({"creditoId": "42", "monto": 250000, "moneda": "COP"})
        );
        let described = request().with_description("cuota 3").expect("valid");
        assert_eq!(described.to_json()["descripcion"], "cuota 3");
        assert_eq!(
            PaymentRequest::from_json(&described.to_json()),
            Ok(described)
        );
    }

    #[test]
    fn the_payment_method_goes_in_the_body_and_comes_back_from_it() {
        let method = PaymentMethod {
            payer_email: Some("payer@example.com".into()),
            ..PaymentMethod::with_id("efecty")
        };
        let request = request()
            .with_payment_method(method.clone())
            .expect("valid");
        assert_eq!(
            request.to_json(),
            json!({"creditoId": "42", "monto": 250000, "moneda": "COP",
                   "medioPago": {"id": "efecty", "email": "payer@example.com"}})
        );
        let read = PaymentRequest::from_json(&request.to_json()).expect("valid");
        assert_eq!(read.payment_method(), Some(&method));
        let bad = PaymentMethod::with_id("pm 1");
        let err = request.with_payment_method(bad).expect_err("refused");
        assert_eq!(err.0[0].campo, "medioPago.id");
    }

    #[test]
    fn a_payment_the_server_would_refuse_cannot_be_built() {
        let err = PaymentRequest::new("", -5, "XXX").expect_err("refused");
        let fields: Vec<_> = err.0.iter().map(|e| e.campo.as_str()).collect();
        assert_eq!(fields, ["creditoId", "monto", "moneda"]);
        assert!(request().with_description("x".repeat(256)).is_err());
    }

    #[test]
    fn a_key_kept_elsewhere_follows_the_servers_rules() {
        assert_eq!(
            IntentKey::parse("pago-42-cuota-3").map(|k| k.to_string()),
            Ok("pago-42-cuota-3".to_owned())
        );
        assert_eq!(IntentKey::parse(""), Err(KeyError::Empty));
        assert_eq!(IntentKey::parse("a b"), Err(KeyError::NotVisibleAscii));
    }
}
