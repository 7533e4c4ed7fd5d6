//! The three gateway protocols pagos speaks — the reference protocol, Stripe and Mercado
//! Pago — as one table, and one stateful fake provider on wiremock that keeps each one's
//! rules: a key sent again with the same request replays its charge, a key sent with
//! another request is refused the way that provider refuses it, search finds charges by
//! reference unless its index lags; refunds likewise (made once per key, listed the way
//! each provider lists them). Scenarios about the money path run once per provider.

use crate::helpers::{Backend, Spawn, TestApp};
use serde_json::{Value, json};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use wiremock::matchers::{method, path, path_regex};
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Provider {
    Reference,
    Stripe,
    MercadoPago,
}

pub const ALL: [Provider; 3] = [Provider::Reference, Provider::Stripe, Provider::MercadoPago];

/// What a created charge looks like to the test, whatever the provider.
#[derive(Clone, Debug)]
pub struct Made {
    pub key: String,
    pub reference: String,
    pub body: Vec<u8>,
}

impl Provider {
    /// `PAGOS_GATEWAY`.
    pub fn gateway(self) -> &'static str {
        match self {
            Provider::Reference => "http",
            Provider::Stripe => "stripe",
            Provider::MercadoPago => "mercadopago",
        }
    }

    /// A payment request this provider can charge (`monto` in minor units of COP).
    pub fn payment(self, monto: i64) -> Value {
        let mut body = json!({"creditoId": "42", "monto": monto, "moneda": "COP"});
        match self {
            Provider::Reference => {}
            Provider::Stripe => {
                body["medioPago"] =
                    json!({"id": "pm_1Q0PsIJvEtkwdCNYMSaVuRz6", "cliente": "cus_NffrFeUfNV2Hib"});
            }
            Provider::MercadoPago => {
                body["medioPago"] = json!({"id": "visa", "token": "ff8080814c11e237014c1ff593b57b4d",
                    "email": "payer@example.com", "documento": {"tipo": "CC", "numero": "1020304050"}});
            }
        }
        body
    }

    fn create_path(self) -> &'static str {
        match self {
            Provider::Reference => "/v1/charges",
            Provider::Stripe => "/v1/payment_intents",
            Provider::MercadoPago => "/v1/payments",
        }
    }

    fn search_path(self) -> &'static str {
        match self {
            Provider::Reference => "/v1/charges",
            Provider::Stripe => "/v1/payment_intents/search",
            Provider::MercadoPago => "/v1/payments/search",
        }
    }

    fn key_header(self) -> &'static str {
        match self {
            Provider::MercadoPago => "x-idempotency-key",
            _ => "idempotency-key",
        }
    }

    /// The reference and amount (as the provider writes it) of a create request.
    fn read_create(self, request: &Request) -> (String, Value) {
        match self {
            Provider::Reference => {
                let body: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
                (
                    body["reference"].as_str().unwrap_or_default().to_owned(),
                    body["amount"].clone(),
                )
            }
            Provider::Stripe => {
                let form: HashMap<String, String> = url::form_urlencoded::parse(&request.body)
                    .into_owned()
                    .collect();
                (
                    form.get("metadata[pagos_reference]")
                        .cloned()
                        .unwrap_or_default(),
                    form.get("amount")
                        .and_then(|a| a.parse::<i64>().ok())
                        .map_or(Value::Null, Value::from),
                )
            }
            Provider::MercadoPago => {
                let body: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
                (
                    body["external_reference"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                    body["transaction_amount"].clone(),
                )
            }
        }
    }

    fn read_search(self, request: &Request) -> String {
        let query = |name: &str| crate::helpers::query_param(request, name);
        match self {
            Provider::Reference => query("reference"),
            // Strict: a search in another form finds nothing.
            Provider::Stripe => query("query")
                .strip_prefix("metadata['pagos_reference']:'")
                .and_then(|rest| rest.strip_suffix('\''))
                .unwrap_or_default()
                .to_owned(),
            Provider::MercadoPago => query("external_reference"),
        }
    }

    /// The provider's id of the fake's `n`-th charge (from 1).
    pub fn charge_id(self, n: usize) -> String {
        match self {
            Provider::Reference => format!("ch_fake_{n}"),
            Provider::Stripe => format!("pi_fake{n:020}"),
            Provider::MercadoPago => (1_000_000_000u64 + n as u64).to_string(),
        }
    }

    /// A succeeded charge, numbered `n`, about `reference`.
    fn charge(self, n: usize, reference: &str, amount: &Value) -> Value {
        match self {
            Provider::Reference => json!({"id": self.charge_id(n), "status": "succeeded",
                "amount": amount, "currency": "COP", "reference": reference, "declineCode": null}),
            Provider::Stripe => {
                let mut pi: Value = serde_json::from_str(include_str!(
                    "../../fixtures/stripe/payment_intent_succeeded.json"
                ))
                .expect("fixture");
                pi["id"] = Value::from(self.charge_id(n));
                pi["amount"] = amount.clone();
                pi["currency"] = Value::from("cop");
                pi["metadata"]["pagos_reference"] = Value::from(reference);
                pi
            }
            Provider::MercadoPago => {
                let mut payment: Value = serde_json::from_str(include_str!(
                    "../../fixtures/mercadopago/payment_approved.json"
                ))
                .expect("fixture");
                payment["id"] = Value::from(1_000_000_000u64 + n as u64);
                payment["transaction_amount"] = amount.clone();
                payment["currency_id"] = Value::from("COP");
                payment["external_reference"] = Value::from(reference);
                payment
            }
        }
    }

    /// A charge numbered `n` about `reference`, declined as a duplicate of a recent
    /// payment of the same card and amount (what a provider that forgot a key answers
    /// its resend when the first try's charge was made).
    fn declined_as_duplicate(self, n: usize, reference: &str, amount: &Value) -> Value {
        let mut charge = self.charge(n, reference, amount);
        match self {
            Provider::Reference => {
                charge["status"] = Value::from("declined");
                charge["declineCode"] = Value::from("duplicate_transaction");
            }
            Provider::Stripe => {
                let mut pi: Value = serde_json::from_str(include_str!(
                    "../../fixtures/stripe/payment_intent_requires_payment_method.json"
                ))
                .expect("fixture");
                for field in ["id", "amount", "currency", "metadata"] {
                    pi[field] = charge[field].clone();
                }
                pi["last_payment_error"]["decline_code"] = Value::from("duplicate_transaction");
                charge = pi;
            }
            Provider::MercadoPago => {
                charge["status"] = Value::from("rejected");
                charge["status_detail"] = Value::from("cc_rejected_duplicated_payment");
            }
        }
        charge
    }

    /// `charge` naming `reference` as its payment, or none (its reference left out).
    fn naming(self, mut charge: Value, reference: Option<&str>) -> Value {
        let (holder, field) = match self {
            Provider::Reference => (&mut charge, "reference"),
            Provider::Stripe => (&mut charge["metadata"], "pagos_reference"),
            Provider::MercadoPago => (&mut charge, "external_reference"),
        };
        match (reference, holder.as_object_mut()) {
            (Some(reference), _) => holder[field] = Value::from(reference),
            (None, Some(fields)) => {
                fields.remove(field);
            }
            (None, None) => {}
        }
        charge
    }

    /// Where refunds are made: the path's pattern.
    fn refunds_path(self) -> &'static str {
        match self {
            Provider::Reference | Provider::Stripe => "^/v1/refunds$",
            Provider::MercadoPago => "^/v1/payments/[0-9]+/refunds$",
        }
    }

    /// The charge, the reference (Mercado Pago's refund request carries none) and the
    /// amount (as the provider writes it; `Null`: the whole charge) of a refund request.
    fn read_refund(self, request: &Request) -> (String, String, Value) {
        match self {
            Provider::Reference => {
                let body: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
                let text = |field: &str| body[field].as_str().unwrap_or_default().to_owned();
                (text("charge"), text("reference"), body["amount"].clone())
            }
            Provider::Stripe => {
                let form: HashMap<String, String> = url::form_urlencoded::parse(&request.body)
                    .into_owned()
                    .collect();
                let field = |name: &str| form.get(name).cloned().unwrap_or_default();
                (
                    field("payment_intent"),
                    field("metadata[pagos_reference]"),
                    form.get("amount")
                        .and_then(|a| a.parse::<i64>().ok())
                        .map_or(Value::Null, Value::from),
                )
            }
            Provider::MercadoPago => {
                let body: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
                let payment = request.url.path().split('/').nth(3).unwrap_or_default();
                (payment.to_owned(), String::new(), body["amount"].clone())
            }
        }
    }

    /// The provider's id of the fake's `n`-th refund (from 1).
    pub fn refund_id(self, n: usize) -> String {
        match self {
            Provider::Reference => format!("re_fake_{n}"),
            Provider::Stripe => format!("re_fake{n:020}"),
            Provider::MercadoPago => (2_000_000_000u64 + n as u64).to_string(),
        }
    }

    /// A succeeded refund, numbered `n`, of `charge` about `reference` (Mercado Pago's
    /// refunds carry none).
    fn refund(self, n: usize, charge: &str, reference: &str, amount: &Value) -> Value {
        match self {
            Provider::Reference => json!({"id": self.refund_id(n), "status": "succeeded",
                "charge": charge, "amount": amount, "currency": "COP", "reference": reference,
                "failureCode": null}),
            Provider::Stripe => {
                let mut refund: Value = serde_json::from_str(include_str!(
                    "../../fixtures/stripe/refund_succeeded.json"
                ))
                .expect("fixture");
                refund["id"] = Value::from(self.refund_id(n));
                refund["amount"] = amount.clone();
                refund["currency"] = Value::from("cop");
                refund["payment_intent"] = Value::from(charge);
                refund["metadata"]["pagos_reference"] = Value::from(reference);
                refund
            }
            Provider::MercadoPago => {
                let mut refund: Value = serde_json::from_str(include_str!(
                    "../../fixtures/mercadopago/refund_approved.json"
                ))
                .expect("fixture");
                refund["id"] = Value::from(2_000_000_000u64 + n as u64);
                refund["payment_id"] = Value::from(charge.parse::<u64>().unwrap_or_default());
                refund["amount"] = amount.clone();
                refund["amount_refunded_to_payer"] = amount.clone();
                refund
            }
        }
    }

    /// Another refund, numbered `n`, than the one asked (of `charge`, for `amount`):
    /// `Some` names another pagos refund, `None` none. Mercado Pago's refunds carry no
    /// reference, so what tells another refund apart is what they do carry: `Some` is a
    /// refund of another payment, `None` one of the same payment for another amount.
    fn another_refund(self, n: usize, charge: &str, amount: &Value, other: Option<&str>) -> Value {
        match self {
            Provider::Reference | Provider::Stripe => {
                let mut refund = self.refund(n, charge, other.unwrap_or_default(), amount);
                if other.is_none() {
                    let holder = match self {
                        Provider::Stripe => &mut refund["metadata"],
                        _ => &mut refund,
                    };
                    if let Some(fields) = holder.as_object_mut() {
                        fields.remove(match self {
                            Provider::Stripe => "pagos_reference",
                            _ => "reference",
                        });
                    }
                }
                refund
            }
            Provider::MercadoPago => match other {
                Some(_) => self.refund(n, &self.charge_id(n), "", amount),
                None => self.refund(n, charge, "", &json!(123.45)),
            },
        }
    }

    /// What a refund look-up asks for: a reference, a PaymentIntent or a payment id.
    fn refund_lookup(self, request: &Request) -> String {
        match self {
            Provider::Reference => crate::helpers::query_param(request, "reference"),
            Provider::Stripe => crate::helpers::query_param(request, "payment_intent"),
            Provider::MercadoPago => request
                .url
                .path()
                .split('/')
                .nth(3)
                .unwrap_or_default()
                .to_owned(),
        }
    }

    /// Whether `refund` answers a look-up for `asked`.
    fn refund_found(self, refund: &Value, asked: &str) -> bool {
        let field = match self {
            Provider::Reference => &refund["reference"],
            Provider::Stripe => &refund["payment_intent"],
            Provider::MercadoPago => &refund["payment_id"],
        };
        match field {
            Value::String(s) => s == asked,
            Value::Number(n) => n.to_string() == asked,
            _ => false,
        }
    }

    fn refund_list(self, found: Vec<Value>) -> Value {
        match self {
            Provider::Reference => json!({ "data": found }),
            Provider::Stripe => {
                json!({"object": "list", "url": "/v1/refunds", "has_more": false, "data": found})
            }
            Provider::MercadoPago => Value::from(found),
        }
    }

    fn search_answer(self, found: Vec<Value>) -> Value {
        match self {
            Provider::Reference => json!({ "data": found }),
            Provider::Stripe => {
                json!({"object": "search_result", "url": "/v1/payment_intents/search",
                       "has_more": false, "next_page": null, "data": found})
            }
            Provider::MercadoPago => {
                json!({"paging": {"total": found.len(), "limit": 30, "offset": 0}, "results": found})
            }
        }
    }

    /// How the provider answers a key sent again with another request.
    fn key_reused(self) -> ResponseTemplate {
        match self {
            Provider::Reference => {
                ResponseTemplate::new(422).set_body_json(json!({"error": "idempotency_key_reused"}))
            }
            Provider::Stripe => ResponseTemplate::new(400).set_body_json(
                serde_json::from_str::<Value>(include_str!(
                    "../../fixtures/stripe/error_idempotency_key_reused.json"
                ))
                .expect("fixture"),
            ),
            // Mercado Pago documents a 409 when "the idempotency process is not
            // fulfilled" for a payment already made under the key.
            Provider::MercadoPago => ResponseTemplate::new(409).set_body_json(json!({
                "status": "409", "error": "Conflict",
                "message": "The process has not been completed yet. Try again later.",
                "cause": [{"code": "401001", "description": "idempotency key already used"}]})),
        }
    }

    /// A refusal with `status` in the provider's own error shape.
    fn refusal(self, status: u16) -> ResponseTemplate {
        let body = match self {
            Provider::Reference => json!({"error": "refused"}),
            Provider::Stripe => json!({"error": {"type": "invalid_request_error",
                "message": if status == 401 { "Invalid API Key provided: sk_live_****" }
                           else { "Received unknown parameter" }}}),
            Provider::MercadoPago => json!({"status": status, "error": "bad_request",
                "message": if status == 401 { "invalid access token" } else { "invalid parameters" },
                "cause": []}),
        };
        ResponseTemplate::new(status).set_body_json(body)
    }

    /// Starts pagos on `backend` against a fresh fake of this provider.
    pub async fn spawn(self, backend: Backend, flags: &[&'static str]) -> (TestApp, FakeProvider) {
        self.spawn_as(Spawn::new(backend).flags(flags)).await
    }

    /// Starts pagos as `spawn` says, against a fresh fake of this provider.
    pub async fn spawn_as(self, spawn: Spawn<'_>) -> (TestApp, FakeProvider) {
        let app = spawn.provider(self.gateway()).start().await;
        let fake = FakeProvider::new(self);
        fake.mount(app.gateway()).await;
        (app, fake)
    }
}

/// What the next create requests (of charges: `FakeProvider::next`; of refunds:
/// `next_refunds`) get, in order, before the provider's own rules apply.
#[derive(Clone, Debug)]
pub enum Next {
    /// Charge, but answer after this long (past pagos' timeout: the answer is lost).
    AnswerLate(Duration),
    /// Refuse with this status, without charging.
    Refuse(u16),
    /// Charge, but answer with another charge about another payment (`Some`: its
    /// reference) or about none (the reference left out): a gateway bug, or a proxy
    /// replaying another request's answer. For a refund: refund, but answer with another
    /// refund (`Provider::another_refund`).
    AnswerNaming(Option<String>),
    /// Forget the key (as a provider past its key memory does) and decline the request
    /// as a duplicate of a recent payment: a new declined charge under the reference.
    DeclineAsDuplicate,
}

#[derive(Clone)]
pub struct FakeProvider {
    pub provider: Provider,
    state: Arc<Mutex<State>>,
}

#[derive(Default)]
struct State {
    /// key → (the request's body, the charge made).
    by_key: HashMap<String, (Vec<u8>, Value)>,
    by_reference: HashMap<String, Vec<Value>>,
    script: VecDeque<Next>,
    search_lags: bool,
    /// The reference of every search, in order.
    searches: Vec<String>,
    charges: usize,
    creates: Vec<Made>,
    /// Refunds: key → (the request's body, the refund made); every refund made, in order;
    /// the key of every refund request received; what the next refund requests get.
    refunds_by_key: HashMap<String, (Vec<u8>, Value)>,
    refunds: Vec<Value>,
    refund_keys: Vec<String>,
    refund_script: VecDeque<Next>,
}

impl FakeProvider {
    pub fn new(provider: Provider) -> Self {
        FakeProvider {
            provider,
            state: Arc::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The next create requests get these answers, in order.
    pub fn next(&self, answers: impl IntoIterator<Item = Next>) {
        self.lock().script.extend(answers);
    }

    /// The next refund requests get these answers, in order.
    pub fn next_refunds(&self, answers: impl IntoIterator<Item = Next>) {
        self.lock().refund_script.extend(answers);
    }

    /// Refunds made (never counting replays).
    pub fn refunds_made(&self) -> usize {
        self.lock().refunds.len()
    }

    /// The key of every refund request received, in order.
    pub fn refund_keys(&self) -> Vec<String> {
        self.lock().refund_keys.clone()
    }

    /// While set, search finds nothing (its index has not caught up).
    pub fn search_lags(&self, lags: bool) {
        self.lock().search_lags = lags;
    }

    /// Charges made (never counting replays).
    pub fn charges(&self) -> usize {
        self.lock().charges
    }

    /// The reference every search asked for, in order (empty: not in the provider's form).
    pub fn searches(&self) -> Vec<String> {
        self.lock().searches.clone()
    }

    /// Every create request received, in order.
    pub fn creates(&self) -> Vec<Made> {
        self.lock().creates.clone()
    }

    pub async fn mount(&self, server: &MockServer) {
        Mock::given(method("POST"))
            .and(path(self.provider.create_path()))
            .respond_with(Create(self.clone()))
            .mount(server)
            .await;
        Mock::given(method("GET"))
            .and(path(self.provider.search_path()))
            .respond_with(Search(self.clone()))
            .mount(server)
            .await;
        Mock::given(method("POST"))
            .and(path_regex(self.provider.refunds_path()))
            .respond_with(MakeRefund(self.clone()))
            .mount(server)
            .await;
        Mock::given(method("GET"))
            .and(path_regex(self.provider.refunds_path()))
            .respond_with(ListRefunds(self.clone()))
            .mount(server)
            .await;
        if self.provider == Provider::MercadoPago {
            // The account's currency (a Colombian account, COP), asked once per process.
            Mock::given(method("GET"))
                .and(path("/users/me"))
                .respond_with(
                    ResponseTemplate::new(200)
                        .set_body_json(crate::helpers::fixture("mercadopago", "users_me")),
                )
                .with_priority(10)
                .mount(server)
                .await;
        }
    }
}

fn key_of(provider: Provider, request: &Request) -> String {
    request
        .headers
        .get(provider.key_header())
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}

struct MakeRefund(FakeProvider);

impl Respond for MakeRefund {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let provider = self.0.provider;
        let key = key_of(provider, request);
        let (charge, reference, mut amount) = provider.read_refund(request);
        let mut state = self.0.lock();
        if amount.is_null() {
            // Mercado Pago's total refund names no amount: the whole payment.
            let paid = state.by_key.values().map(|(_, c)| c).find(|c| {
                c["id"].as_u64().map(|id| id.to_string()).as_deref() == Some(charge.as_str())
            });
            amount = paid.map_or(Value::Null, |c| c["transaction_amount"].clone());
        }
        state.refund_keys.push(key.clone());
        let (delay, naming) = match state.refund_script.pop_front() {
            Some(Next::Refuse(status)) => return provider.refusal(status),
            Some(Next::AnswerLate(delay)) => (delay, None),
            Some(Next::AnswerNaming(other)) => (Duration::ZERO, Some(other)),
            Some(Next::DeclineAsDuplicate) => {
                unreachable!("a refund is never declined as a duplicate here")
            }
            None => (Duration::ZERO, None),
        };
        if let Some((body, refund)) = state.refunds_by_key.get(&key) {
            return if *body == request.body {
                ResponseTemplate::new(200)
                    .insert_header("Idempotent-Replayed", "true")
                    .set_body_json(refund.clone())
                    .set_delay(delay)
            } else {
                provider.key_reused()
            };
        }
        let n = state.refunds.len() + 1;
        let refund = provider.refund(n, &charge, &reference, &amount);
        state
            .refunds_by_key
            .insert(key, (request.body.clone(), refund.clone()));
        state.refunds.push(refund.clone());
        let status = if provider == Provider::Stripe {
            200
        } else {
            201
        };
        let answer = match naming {
            // Another refund (numbered far from the fake's own), of the same amount.
            Some(other) => provider.another_refund(1000 + n, &charge, &amount, other.as_deref()),
            None => refund,
        };
        ResponseTemplate::new(status)
            .set_body_json(answer)
            .set_delay(delay)
    }
}

struct ListRefunds(FakeProvider);

impl Respond for ListRefunds {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let provider = self.0.provider;
        let asked = provider.refund_lookup(request);
        let state = self.0.lock();
        let found = state
            .refunds
            .iter()
            .filter(|r| provider.refund_found(r, &asked))
            .cloned()
            .collect();
        ResponseTemplate::new(200).set_body_json(provider.refund_list(found))
    }
}

struct Create(FakeProvider);

impl Respond for Create {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let provider = self.0.provider;
        let key = key_of(provider, request);
        let (reference, amount) = provider.read_create(request);
        let mut state = self.0.lock();
        state.creates.push(Made {
            key: key.clone(),
            reference: reference.clone(),
            body: request.body.clone(),
        });
        let (delay, naming) = match state.script.pop_front() {
            Some(Next::Refuse(status)) => return provider.refusal(status),
            Some(Next::AnswerLate(delay)) => (delay, None),
            Some(Next::AnswerNaming(other)) => (Duration::ZERO, Some(other)),
            Some(Next::DeclineAsDuplicate) => {
                let declined =
                    provider.declined_as_duplicate(2000 + state.creates.len(), &reference, &amount);
                state
                    .by_key
                    .insert(key, (request.body.clone(), declined.clone()));
                state
                    .by_reference
                    .entry(reference)
                    .or_default()
                    .push(declined.clone());
                let status = if provider == Provider::Stripe {
                    200
                } else {
                    201
                };
                return ResponseTemplate::new(status).set_body_json(declined);
            }
            None => (Duration::ZERO, None),
        };
        if let Some((body, charge)) = state.by_key.get(&key) {
            return if *body == request.body {
                ResponseTemplate::new(200)
                    .insert_header("Idempotent-Replayed", "true")
                    .set_body_json(charge.clone())
                    .set_delay(delay)
            } else {
                provider.key_reused()
            };
        }
        state.charges += 1;
        let charge = provider.charge(state.charges, &reference, &amount);
        state
            .by_key
            .insert(key, (request.body.clone(), charge.clone()));
        state
            .by_reference
            .entry(reference)
            .or_default()
            .push(charge.clone());
        let status = if provider == Provider::Stripe {
            200
        } else {
            201
        };
        let answer = match naming {
            // Another charge (numbered far from the fake's own), of the same amount.
            Some(other) => provider.naming(
                provider.charge(
                    1000 + state.charges,
                    other.as_deref().unwrap_or(""),
                    &amount,
                ),
                other.as_deref(),
            ),
            None => charge,
        };
        ResponseTemplate::new(status)
            .set_body_json(answer)
            .set_delay(delay)
    }
}

struct Search(FakeProvider);

impl Respond for Search {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let provider = self.0.provider;
        let reference = provider.read_search(request);
        let mut state = self.0.lock();
        state.searches.push(reference.clone());
        let found = if state.search_lags {
            vec![]
        } else {
            state
                .by_reference
                .get(&reference)
                .cloned()
                .unwrap_or_default()
        };
        ResponseTemplate::new(200).set_body_json(provider.search_answer(found))
    }
}
