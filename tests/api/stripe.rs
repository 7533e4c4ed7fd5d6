//! The Stripe adapter against wiremock serving `fixtures/stripe/`: the request pagos
//! sends, the status mapping, timeouts settled by a search, resends with the same key
//! inside Stripe's key window and review outside it, and signed webhooks applied once.

use crate::helpers::{Backend, TestApp, json};
use crate::on_both_databases;
use pagos::entities::payment::PaymentState;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use wiremock::matchers::{method, path, path_regex};
use wiremock::{Mock, Request, Respond, ResponseTemplate};

on_both_databases!(
    the_request_pagos_sends_is_stripes_documented_shape,
    every_status_in_the_mapping_table_maps_as_documented,
    without_medio_pago_the_request_is_refused_with_422_and_nothing_is_stored,
    requires_action_goes_to_manual_review_past_the_give_up_horizon,
    a_lagging_search_showing_the_intent_as_created_is_not_read_as_a_decline,
    completada_while_stripe_cannot_be_asked_is_refused_over_a_failure_its_events_reported,
    a_signed_event_settles_a_pending_payment_and_a_wrong_signature_is_refused,
    a_duplicated_event_applies_once,
    a_pending_event_after_the_final_one_changes_nothing,
    events_pagos_does_not_act_on_are_acknowledged_and_unknown_references_are_orphans,
    every_request_to_stripe_pins_the_api_version_the_adapter_reads,
    a_dispute_sends_a_completada_payment_to_review_and_one_won_or_an_inquiry_leaves_it,
    a_dispute_whose_payment_intent_stripe_cannot_show_now_is_refused_for_stripe_to_send_again,
);

const WEBHOOK_SECRET: &str = "whsec_test_stripe";
const PM: &str = "pm_1Q0PsIJvEtkwdCNYMSaVuRz6";
const CUSTOMER: &str = "cus_NffrFeUfNV2Hib";

fn fixture(name: &str) -> Value {
    crate::helpers::fixture("stripe", name)
}

async fn spawn(backend: Backend, flags: &[&str]) -> TestApp {
    crate::helpers::provider_app(backend, "stripe", WEBHOOK_SECRET, flags).await
}

fn body(description: &str) -> Value {
    json!({"creditoId": "42", "monto": 250000, "moneda": "COP", "descripcion": description,
           "medioPago": {"id": PM, "cliente": CUSTOMER}})
}

/// The form fields of a request pagos sent.
fn form(request: &Request) -> HashMap<String, String> {
    url::form_urlencoded::parse(&request.body)
        .into_owned()
        .collect()
}

/// A PaymentIntent id of its own for each payment (webhook rows are keyed by it).
fn intent_id(reference: &str) -> String {
    format!("pi_{}", &reference.replace('-', "")[..24])
}

/// `pi` made about the payment that asked: its id, amount, currency and reference.
fn about(mut pi: Value, form: &HashMap<String, String>) -> Value {
    let reference = form
        .get("metadata[pagos_reference]")
        .cloned()
        .unwrap_or_default();
    pi["id"] = Value::from(intent_id(&reference));
    pi["amount"] = Value::from(
        form.get("amount")
            .and_then(|a| a.parse::<i64>().ok())
            .unwrap_or(0),
    );
    pi["currency"] = Value::from(form.get("currency").cloned().unwrap_or_default());
    pi["metadata"]["pagos_reference"] = Value::from(reference);
    pi
}

/// Answers each payment with the fixture named in its `descripcion`
/// (`<http status> <fixture>`): one app, every scenario.
struct ByDescription;

impl Respond for ByDescription {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let form = form(request);
        let description = form.get("description").cloned().unwrap_or_default();
        let (status, name) = description.split_once(' ').expect("`<status> <fixture>`");
        let status: u16 = status.parse().expect("status");
        let mut answer = fixture(name);
        if answer.get("error").is_some() {
            if let Some(pi) = answer["error"].get("payment_intent").cloned() {
                answer["error"]["payment_intent"] = about(pi, &form);
            }
        } else {
            answer = about(answer, &form);
        }
        ResponseTemplate::new(status).set_body_json(answer)
    }
}

/// A stateful Stripe: PaymentIntents kept by idempotency key (a key reused replays the
/// first answer, as Stripe does) and found by search.
#[derive(Clone)]
struct FakeStripe(Arc<Mutex<FakeState>>);

struct FakeState {
    new_intents: &'static str,
    by_key: HashMap<String, Value>,
    by_reference: HashMap<String, Vec<Value>>,
    searches: Vec<String>,
}

impl FakeStripe {
    fn new(new_intents: &'static str) -> Self {
        FakeStripe(Arc::new(Mutex::new(FakeState {
            new_intents,
            by_key: HashMap::new(),
            by_reference: HashMap::new(),
            searches: Vec::new(),
        })))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, FakeState> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn mount(&self, server: &wiremock::MockServer) {
        Mock::given(method("POST"))
            .and(path("/v1/payment_intents"))
            .respond_with(FakeCreate(self.clone()))
            .mount(server)
            .await;
        Mock::given(method("GET"))
            .and(path("/v1/payment_intents/search"))
            .respond_with(FakeSearch(self.clone()))
            .mount(server)
            .await;
        Mock::given(method("GET"))
            .and(path_regex(r"^/v1/payment_intents/pi_[A-Za-z0-9_]+$"))
            .respond_with(FakeFetch(self.clone()))
            .mount(server)
            .await;
    }
}

/// `GET /v1/payment_intents/{id}`: the PaymentIntent as made, or Stripe's 404.
struct FakeFetch(FakeStripe);

impl Respond for FakeFetch {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let id = request
            .url
            .path()
            .trim_start_matches("/v1/payment_intents/");
        let state = self.0.lock();
        match state.by_key.values().find(|pi| pi["id"] == id) {
            Some(pi) => ResponseTemplate::new(200).set_body_json(pi.clone()),
            None => ResponseTemplate::new(404).set_body_json(json!({"error": {
                "type": "invalid_request_error", "code": "resource_missing",
                "message": format!("No such payment_intent: '{id}'"), "param": "intent"}})),
        }
    }
}

struct FakeCreate(FakeStripe);

impl Respond for FakeCreate {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let key = request.headers["idempotency-key"]
            .to_str()
            .expect("key")
            .to_owned();
        let form = form(request);
        let mut state = self.0.lock();
        if let Some(existing) = state.by_key.get(&key) {
            return ResponseTemplate::new(200)
                .insert_header("Idempotent-Replayed", "true")
                .set_body_json(existing.clone());
        }
        let pi = about(fixture(state.new_intents), &form);
        let reference = pi["metadata"]["pagos_reference"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        state.by_key.insert(key, pi.clone());
        state
            .by_reference
            .entry(reference)
            .or_default()
            .push(pi.clone());
        ResponseTemplate::new(200).set_body_json(pi)
    }
}

struct FakeSearch(FakeStripe);

impl Respond for FakeSearch {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let query = crate::helpers::query_param(request, "query");
        let mut state = self.0.lock();
        state.searches.push(query.clone());
        let reference = query
            .trim_start_matches("metadata['pagos_reference']:'")
            .trim_end_matches('\'');
        let found = match state.by_reference.get(reference) {
            Some(found) => found.clone(),
            _ => vec![],
        };
        let mut answer = if found.is_empty() {
            fixture("search_empty")
        } else {
            fixture("search_found")
        };
        answer["data"] = Value::from(found);
        ResponseTemplate::new(200).set_body_json(answer)
    }
}

async fn posts(app: &TestApp) -> Vec<Request> {
    crate::helpers::received(app.gateway(), "POST", |p| p == "/v1/payment_intents").await
}

fn report_says(report: &Value, field: &str) {
    assert_eq!(report["examinados"], 1, "{report}");
    assert_eq!(report[field], 1, "{report}");
}

async fn the_request_pagos_sends_is_stripes_documented_shape(backend: Backend) {
    let app = spawn(backend, &[]).await;
    FakeStripe::new("payment_intent_succeeded")
        .mount(app.gateway())
        .await;
    let (status, pago) = app
        .pay_read("k-shape", &body("Cuota 3 del crédito 42"))
        .await;
    assert_eq!(status, 201, "{pago}");
    let id = pago["id"].as_str().expect("id");
    assert_eq!(pago["estado"], "COMPLETADA");
    assert_eq!(pago["gatewayRef"], intent_id(id));
    assert_eq!(
        pago["medioPago"],
        json!({"id": PM}),
        "the method's id only, never more"
    );

    let sent = posts(&app).await;
    assert_eq!(sent.len(), 1);
    let request = &sent[0];
    assert_eq!(request.method.as_str(), "POST");
    assert_eq!(request.url.path(), "/v1/payment_intents");
    assert_eq!(request.headers["authorization"], "Bearer sk_test_gw_secret");
    assert_eq!(
        request.headers["content-type"],
        "application/x-www-form-urlencoded"
    );
    let key = request.headers["idempotency-key"].to_str().expect("ASCII");
    assert!(key.starts_with("pagos-") && key.len() <= 255, "{key}");
    assert_ne!(key, "k-shape", "the derived key, not the client's");

    // Field by field against the fixture of what Stripe documents.
    let expected: HashMap<String, String> = url::form_urlencoded::parse(
        include_str!("../../fixtures/stripe/create_payment_intent_request.txt")
            .trim_end()
            .as_bytes(),
    )
    .into_owned()
    .map(|(k, v)| {
        if k == "metadata[pagos_reference]" {
            (k, id.to_owned())
        } else {
            (k, v)
        }
    })
    .collect();
    let sent = form(request);
    for field in [
        "amount",
        "currency",
        "confirm",
        "off_session",
        "payment_method",
        "customer",
        "automatic_payment_methods[enabled]",
        "automatic_payment_methods[allow_redirects]",
        "description",
        "metadata[pagos_reference]",
    ] {
        assert_eq!(sent.get(field), expected.get(field), "field {field}");
    }
    assert_eq!(sent, expected, "no field more, no field less");
    assert_eq!(sent["amount"], "250000", "COP in cents: Stripe's unit");
    assert_eq!(sent["currency"], "cop");
}

async fn every_status_in_the_mapping_table_maps_as_documented(backend: Backend) {
    let app = spawn(backend, &[]).await;
    Mock::given(method("POST"))
        .and(path("/v1/payment_intents"))
        .respond_with(ByDescription)
        .mount(app.gateway())
        .await;
    crate::helpers::assert_mapping(
        &app,
        &[
            ("200 payment_intent_succeeded", 201, "COMPLETADA", None),
            ("200 payment_intent_processing", 202, "ENVIADA", None),
            ("200 payment_intent_requires_action", 202, "ENVIADA", None),
            (
                "200 payment_intent_requires_payment_method",
                402,
                "FALLIDA",
                Some("insufficient_funds"),
            ),
            (
                "200 payment_intent_canceled",
                402,
                "FALLIDA",
                Some("canceled_abandoned"),
            ),
            (
                "402 error_card_declined",
                402,
                "FALLIDA",
                Some("insufficient_funds"),
            ),
            (
                "402 error_authentication_required",
                402,
                "FALLIDA",
                Some("authentication_required"),
            ),
            (
                "400 error_payment_method_missing",
                402,
                "FALLIDA",
                Some("gateway_rejected_400"),
            ),
            // The key met other parameters: a PaymentIntent may exist, so never FALLIDA.
            ("400 error_idempotency_key_reused", 202, "ENVIADA", None),
        ],
        body,
    )
    .await;
    // One call per payment (declines and refusals are not retried), four tries for the
    // unknown outcome.
    assert_eq!(posts(&app).await.len(), 8 + 4);
}

async fn without_medio_pago_the_request_is_refused_with_422_and_nothing_is_stored(
    backend: Backend,
) {
    let app = spawn(backend, &[]).await;
    FakeStripe::new("payment_intent_succeeded")
        .mount(app.gateway())
        .await;
    let (status, problem) = app
        .pay_read(
            "k-422",
            &json!({"creditoId": "42", "monto": 250000, "moneda": "COP"}),
        )
        .await;
    assert_eq!(status, 422);
    assert!(
        problem["type"]
            .as_str()
            .is_some_and(|t| t.ends_with("validation-failed"))
    );
    assert_eq!(problem["errores"][0]["campo"], "medioPago", "{problem}");
    let (status, problem) = app
        .pay_read(
            "k-422",
            &json!({"creditoId": "42", "monto": 250000, "moneda": "COP",
                "medioPago": {"id": "visa", "email": "payer@example.com"}}),
        )
        .await;
    assert_eq!(status, 422);
    let fields = crate::helpers::listed(&problem, "errores", "campo");
    assert_eq!(fields, ["medioPago.id", "medioPago.email"]);
    assert_eq!(app.count_rows().await, (0, 0), "a 422 stores nothing");
    assert!(posts(&app).await.is_empty());

    let (status, _) = app.pay_read("k-422", &body("corrected")).await;
    assert_eq!(status, 201, "the same key works with a corrected body");
}

async fn requires_action_goes_to_manual_review_past_the_give_up_horizon(backend: Backend) {
    let app = spawn(backend, &["--give-up-after", "1s", "--stale-after", "1s"]).await;
    let fake = FakeStripe::new("payment_intent_requires_action");
    fake.mount(app.gateway()).await;
    let (status, pago) = app.pay_read("k-3ds", &body("needs authentication")).await;
    assert_eq!(status, 202);
    let id = pago["id"].as_str().expect("id").to_owned();

    report_says(&app.reconcile(&id).await, "pendientes");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    report_says(&app.reconcile(&id).await, "revisionManual");
    assert_eq!(posts(&app).await.len(), 1);
}

/// The create's answer was lost (a timeout: 202, ENVIADA), and Stripe's search, behind
/// the confirmation, still shows the PaymentIntent as it was created:
/// `requires_payment_method` with no `last_payment_error`. Before, that was read as a
/// decline: the payment FALLIDA (402 to the merchant, `pago.fallido`) while the customer
/// was charged. It is a PaymentIntent not confirmed yet: the payment stays pending, and
/// the next look, once the index caught up, settles it.
async fn a_lagging_search_showing_the_intent_as_created_is_not_read_as_a_decline(backend: Backend) {
    let app = spawn(backend, &[]).await;
    let fake = FakeStripe::new("payment_intent_processing");
    fake.mount(app.gateway()).await;
    let (status, pago) = app.pay_read("k-lagging-index", &body("cuota 4")).await;
    assert_eq!(status, 202, "{pago}");
    let id = pago["id"].as_str().expect("id").to_owned();
    let snapshot = |status: &str| {
        let mut state = fake.lock();
        for pi in state.by_reference.get_mut(&id).expect("the intent") {
            pi["status"] = Value::from(status);
            pi["last_payment_error"] = Value::Null;
        }
    };

    snapshot("requires_payment_method");
    report_says(&app.reconcile(&id).await, "pendientes");
    let read = app.payment(&id).await;
    assert_eq!(read.state, PaymentState::Enviada, "not declined: {read:?}");

    snapshot("succeeded");
    report_says(&app.reconcile(&id).await, "completados");
    assert_eq!(app.payment(&id).await.state, PaymentState::Completada);
    assert_eq!(posts(&app).await.len(), 1, "one charge asked");
}

/// A PaymentIntent under review that Stripe's events reported failed, while Stripe cannot
/// be asked: the report is all pagos knows of it, so on-call's `COMPLETADA` is refused
/// (409, nothing changed) unless overruled. (While Stripe answers, its search is believed:
/// a succeeded PaymentIntent never fails afterwards.)
async fn completada_while_stripe_cannot_be_asked_is_refused_over_a_failure_its_events_reported(
    backend: Backend,
) {
    let app = spawn(backend, &["--give-up-after", "1s", "--stale-after", "1s"]).await;
    let fake = FakeStripe::new("payment_intent_requires_action");
    fake.mount(app.gateway()).await;
    let (status, pago) = app
        .pay_read("k-3ds-failed", &body("needs authentication"))
        .await;
    assert_eq!(status, 202);
    let id = pago["id"].as_str().expect("id").to_owned();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    report_says(&app.reconcile(&id).await, "revisionManual");
    let failed = event(
        "event_payment_intent_payment_failed",
        "evt_pi_failed",
        &id,
        now(),
    );
    let answer = deliver_signed(
        &app,
        &failed,
        &stripe_signature(WEBHOOK_SECRET, now(), &failed),
    )
    .await;
    assert_eq!(answer.status(), 200);

    app.gateway().reset().await;
    Mock::given(method("GET"))
        .and(path("/v1/payment_intents/search"))
        .respond_with(ResponseTemplate::new(503))
        .mount(app.gateway())
        .await;
    let asked = json!({"estado": "COMPLETADA", "motivo": "the customer says they paid",
                       "gatewayRef": intent_id(&id)});
    let answer = app
        .resolve_as(crate::helpers::ADMIN_TOKEN, &id, &asked)
        .await;
    let problem = crate::helpers::problem(answer, 409, "COMPLETADA over a reported failure").await;
    assert_eq!(problem["type"], "/problems/provider-disagrees", "{problem}");
    assert_eq!(app.payment(&id).await.state, "REVISION_MANUAL");
}

/// The header Stripe sends, computed here independently of pagos' code.
fn stripe_signature(secret: &str, t: i64, body: &[u8]) -> String {
    format!(
        "{},v0={}",
        crate::helpers::timestamped_signature(secret, t, body),
        "0".repeat(64)
    )
}

fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

/// The fixture event `name` about payment `id`, created at `created`.
fn event(name: &str, event_id: &str, id: &str, created: i64) -> Vec<u8> {
    let mut event = fixture(name);
    event["id"] = Value::from(event_id);
    event["created"] = Value::from(created);
    let object = &mut event["data"]["object"];
    object["id"] = Value::from(intent_id(id));
    object["metadata"]["pagos_reference"] = Value::from(id);
    serde_json::to_vec(&event).expect("JSON")
}

async fn deliver_signed(app: &TestApp, body: &[u8], signature: &str) -> reqwest::Response {
    crate::helpers::post_webhook(
        app,
        "/v1/webhooks/stripe",
        &[("Stripe-Signature", signature)],
        body,
    )
    .await
}

async fn deliver(app: &TestApp, body: &[u8]) -> String {
    let answer = deliver_signed(app, body, &stripe_signature(WEBHOOK_SECRET, now(), body)).await;
    crate::helpers::resultado(answer).await
}

/// A payment Stripe left `processing`; returns its id.
async fn processing_payment(app: &TestApp, key: &str) -> String {
    let (status, pago) = app.pay_read(key, &body("bank debit")).await;
    assert_eq!(status, 202, "{pago}");
    pago["id"].as_str().expect("id").to_owned()
}

async fn a_signed_event_settles_a_pending_payment_and_a_wrong_signature_is_refused(
    backend: Backend,
) {
    let app = spawn(backend, &[]).await;
    FakeStripe::new("payment_intent_processing")
        .mount(app.gateway())
        .await;
    let id = processing_payment(&app, "k-wh").await;
    let body = event("event_payment_intent_succeeded", "evt_ok", &id, now());

    for signature in [
        stripe_signature("whsec_wrong", now(), &body),
        stripe_signature(WEBHOOK_SECRET, now() - 600, &body),
        format!("v1={}", "ab".repeat(32)),
        String::new(),
    ] {
        let answer = deliver_signed(&app, &body, &signature).await;
        assert_eq!(answer.status(), 401, "{signature:?}");
    }
    assert_eq!(
        app.recorded().await,
        (0, 0),
        "a refused event records nothing"
    );
    assert_eq!(app.payment(&id).await.state, "ENVIADA");

    assert_eq!(deliver(&app, &body).await, "aplicado");
    let payment = app.payment(&id).await;
    assert_eq!(payment.state, "COMPLETADA");
    let replay = app.pay("k-wh", &body_of_key()).await;
    assert_eq!(replay.status(), 201, "the key answers the settled state");

    let failed = event(
        "event_payment_intent_payment_failed",
        "evt_failed",
        &processing_payment(&app, "k-wh-2").await,
        now(),
    );
    assert_eq!(deliver(&app, &failed).await, "aplicado");
}

fn body_of_key() -> Value {
    body("bank debit")
}

async fn a_duplicated_event_applies_once(backend: Backend) {
    let app = spawn(backend, &[]).await;
    FakeStripe::new("payment_intent_processing")
        .mount(app.gateway())
        .await;
    let id = processing_payment(&app, "k-dup").await;
    let body = event("event_payment_intent_succeeded", "evt_dup", &id, now());

    let answers = futures::future::join_all((0..8).map(|_| deliver(&app, &body))).await;
    let applied = answers.iter().filter(|a| *a == "aplicado").count();
    assert_eq!(applied, 1, "{answers:?}");
    assert!(
        answers.iter().all(|a| a == "aplicado" || a == "duplicado"),
        "{answers:?}"
    );
    assert_eq!(deliver(&app, &body).await, "duplicado");
    assert_eq!(app.recorded().await, (1, 1));
    assert_eq!(app.payment(&id).await.state, "COMPLETADA");
}

async fn a_pending_event_after_the_final_one_changes_nothing(backend: Backend) {
    let app = spawn(backend, &[]).await;
    FakeStripe::new("payment_intent_processing")
        .mount(app.gateway())
        .await;
    let id = processing_payment(&app, "k-order").await;
    let t = now();
    let succeeded = event("event_payment_intent_succeeded", "evt_final", &id, t);
    // Created later, delivered later, yet it reports an earlier state.
    let processing = event("event_payment_intent_processing", "evt_late", &id, t + 5);
    assert_eq!(deliver(&app, &succeeded).await, "aplicado");
    assert_eq!(deliver(&app, &processing).await, "obsoleto");
    assert_eq!(app.payment(&id).await.state, "COMPLETADA");
}

async fn events_pagos_does_not_act_on_are_acknowledged_and_unknown_references_are_orphans(
    backend: Backend,
) {
    let app = spawn(backend, &[]).await;
    // Counted from 0 at the start: an alert on its increase sees the first one.
    let orphans = "pagos_webhook_events_total{outcome=\"huerfano\"}";
    let text = app.metrics().await;
    assert!(
        crate::helpers::has_line(&text, &format!("{orphans} 0")),
        "{text}"
    );
    let stranger = uuid::Uuid::now_v7().to_string();
    let created = event(
        "event_payment_intent_created",
        "evt_created",
        &stranger,
        now(),
    );
    assert_eq!(deliver(&app, &created).await, "ignorado");

    let mut not_ours: Value = serde_json::from_slice(&event(
        "event_payment_intent_succeeded",
        "evt_other",
        &stranger,
        now(),
    ))
    .expect("JSON");
    not_ours["data"]["object"]["metadata"] = json!({"order_id": "6735"});
    let not_ours = serde_json::to_vec(&not_ours).expect("JSON");
    assert_eq!(deliver(&app, &not_ours).await, "ignorado");

    // Signed by Stripe, in a status pagos does not know (a PaymentIntent's, a Refund's
    // null): acknowledged, not refused for Stripe to send again for days.
    let mut odd: Value = serde_json::from_slice(&event(
        "event_payment_intent_succeeded",
        "evt_odd_status",
        &stranger,
        now(),
    ))
    .expect("JSON");
    odd["data"]["object"]["status"] = json!("teleported");
    assert_eq!(
        deliver(&app, &serde_json::to_vec(&odd).expect("JSON")).await,
        "ignorado"
    );
    let mut refund = fixture("event_refund_created");
    refund["id"] = json!("evt_refund_null_status");
    refund["data"]["object"]["status"] = Value::Null;
    assert_eq!(
        deliver(&app, &serde_json::to_vec(&refund).expect("JSON")).await,
        "ignorado"
    );

    let orphan = event(
        "event_payment_intent_succeeded",
        "evt_orphan",
        &stranger,
        now(),
    );
    assert_eq!(deliver(&app, &orphan).await, "huerfano");
    let text = app.metrics().await;
    assert!(
        crate::helpers::has_line(&text, &format!("{orphans} 1")),
        "{text}"
    );
    let orphans = json(app.admin_get("/admin/cargos-huerfanos").await).await;
    assert_eq!(orphans[0]["fuente"], "stripe", "{orphans}");
    assert_eq!(orphans[0]["referencia"], stranger.as_str());
    assert_eq!(orphans[0]["monto"], 250000);
    assert_eq!(orphans[0]["moneda"], "COP");
}

/// A dispute event about payment `id`'s PaymentIntent, in `status`, created at `created`.
fn dispute(event_id: &str, id: &str, status: &str, created: i64) -> Vec<u8> {
    let mut event = fixture("event_charge_dispute_created");
    event["id"] = Value::from(event_id);
    event["created"] = Value::from(created);
    if status != "needs_response" {
        event["type"] = Value::from("charge.dispute.closed");
    }
    event["data"]["object"]["payment_intent"] = Value::from(intent_id(id));
    event["data"]["object"]["status"] = Value::from(status);
    serde_json::to_vec(&event).expect("JSON")
}

/// Stripe keeps a disputed PaymentIntent `succeeded`: only the dispute says the money was
/// withdrawn. A `COMPLETADA` payment whose charge is disputed goes to on-call, the
/// merchant told `pago.revision_manual`; an earlier `succeeded` event delivered late
/// does not settle it back. A dispute won, or an inquiry (no money withdrawn), leaves a
/// `COMPLETADA` payment so; a dispute of a PaymentIntent pagos did not make is ignored.
async fn a_dispute_sends_a_completada_payment_to_review_and_one_won_or_an_inquiry_leaves_it(
    backend: Backend,
) {
    let app = spawn(backend, &["--metrics-refresh", "100ms"]).await;
    let fake = FakeStripe::new("payment_intent_succeeded");
    fake.mount(app.gateway()).await;
    let paid = async |key: &str| {
        let (status, pago) = app.pay_read(key, &body("card")).await;
        assert_eq!(status, 201, "{pago}");
        pago["id"].as_str().expect("id").to_owned()
    };
    let t = now();

    let kept = paid("k-dispute-won").await;
    for (event_id, status) in [
        ("evt_inquiry", "warning_needs_response"),
        ("evt_won", "won"),
    ] {
        let answer = deliver(&app, &dispute(event_id, &kept, status, t)).await;
        assert_ne!(answer, "ignorado", "{status}: a dispute of pagos' payment");
        assert_eq!(app.payment(&kept).await.state, "COMPLETADA", "{status}");
    }

    let disputed = paid("k-dispute-lost").await;
    let newest_review = "pagos_newest_manual_review_age_seconds{operation=\"payment\"}";
    let text = app
        .scrape_until("the gauges read", |text| {
            crate::helpers::has_line(text, "pagos_database_up 1")
        })
        .await;
    assert!(!text.contains(newest_review), "none under review yet");
    assert_eq!(
        deliver(&app, &dispute("evt_opened", &disputed, "needs_response", t)).await,
        "revision_manual"
    );
    let payment = app.payment(&disputed).await;
    assert_eq!(payment.state, "REVISION_MANUAL");
    let detail = json(app.admin_get(&format!("/admin/pagos/{disputed}")).await).await;
    let last = crate::helpers::last_transition(&detail);
    for said in ["dispute_needs_response", "contradicting COMPLETADA"] {
        assert!(
            crate::helpers::text_has(&last, "motivo", said),
            "{said} in {last}"
        );
    }
    app.scrape_until("a payment new in review", |text| {
        text.lines().any(|line| line.starts_with(newest_review))
    })
    .await;
    let told = crate::outbox::events_of(&app, &disputed).await;
    assert_eq!(
        told.last().map(|e| e.event_type),
        Some(pagos_types::EventType::PagoRevisionManual),
        "the merchant is told"
    );
    let late = event(
        "event_payment_intent_succeeded",
        "evt_late_ok",
        &disputed,
        t - 60,
    );
    assert_eq!(deliver(&app, &late).await, "obsoleto");
    assert_eq!(app.payment(&disputed).await.state, "REVISION_MANUAL");

    // On-call: Stripe's search still shows the PaymentIntent succeeded, yet COMPLETADA is
    // refused over the dispute; a dispute won in the dashboard is said with contraProveedor.
    let asked = json!({"estado": "COMPLETADA", "motivo": "ticket 12",
                       "gatewayRef": intent_id(&disputed)});
    let answer = app
        .resolve_as(crate::helpers::ADMIN_TOKEN, &disputed, &asked)
        .await;
    let problem = crate::helpers::problem(answer, 409, "COMPLETADA over a dispute").await;
    assert_eq!(problem["type"], "/problems/provider-disagrees", "{problem}");
    assert!(
        crate::helpers::text_has(&problem, "detail", "dispute_needs_response"),
        "{problem}"
    );
    let mut overruled = asked.clone();
    overruled["contraProveedor"] = json!("dispute dp_1QdsPuJvEtkwdCNYr9Tq4X3m won (dashboard)");
    let answer = app
        .resolve_as(crate::helpers::ADMIN_TOKEN, &disputed, &overruled)
        .await;
    assert_eq!(answer.status(), 200);
    assert_eq!(app.payment(&disputed).await.state, "COMPLETADA");

    let stranger = dispute("evt_stranger", &uuid::Uuid::now_v7().to_string(), "lost", t);
    assert_eq!(deliver(&app, &stranger).await, "ignorado");
}

/// A dispute names only its PaymentIntent: while Stripe cannot show it, nothing is
/// recorded and the event is refused 503, so that Stripe delivers it again.
async fn a_dispute_whose_payment_intent_stripe_cannot_show_now_is_refused_for_stripe_to_send_again(
    backend: Backend,
) {
    let app = spawn(backend, &[]).await;
    let fake = FakeStripe::new("payment_intent_succeeded");
    fake.mount(app.gateway()).await;
    let (status, pago) = app.pay_read("k-dispute-503", &body("card")).await;
    assert_eq!(status, 201, "{pago}");
    let id = pago["id"].as_str().expect("id").to_owned();
    let before = app.recorded().await;
    // Once: a scoped mock with a priority cannot be taken back (wiremock sorts its mocks
    // by priority, and a guard then takes back another one).
    Mock::given(method("GET"))
        .and(path(format!("/v1/payment_intents/{}", intent_id(&id))))
        .respond_with(ResponseTemplate::new(500).set_body_json(fixture("error_api")))
        .with_priority(1)
        .up_to_n_times(1)
        .mount(app.gateway())
        .await;
    let body = dispute("evt_while_down", &id, "needs_response", now());
    let answer = deliver_signed(&app, &body, &stripe_signature(WEBHOOK_SECRET, now(), &body)).await;
    assert_eq!(answer.status(), 503);
    assert_eq!(app.recorded().await, before, "nothing recorded");
    assert_eq!(app.payment(&id).await.state, "COMPLETADA");
    assert_eq!(
        deliver(&app, &body).await,
        "revision_manual",
        "delivered again"
    );
    assert_eq!(app.payment(&id).await.state, "REVISION_MANUAL");
}

/// Stripe answers in the account's default API version unless a request names one: an
/// account on a version before search (2020-08-27) would answer every look-up with an
/// error, and every payment left by a timeout would wait for on-call. Every request pagos
/// sends, charge, search, refund and refund list, names the version it was written for.
async fn every_request_to_stripe_pins_the_api_version_the_adapter_reads(backend: Backend) {
    let app = spawn(backend, &[]).await;
    FakeStripe::new("payment_intent_processing")
        .mount(app.gateway())
        .await;
    // Stripe did not answer the refund: pagos looks it up by listing the intent's refunds.
    Mock::given(method("POST"))
        .and(path("/v1/refunds"))
        .respond_with(ResponseTemplate::new(503))
        .mount(app.gateway())
        .await;
    let id = processing_payment(&app, "k-version").await;
    app.reconcile(&id).await;
    let body = event("event_payment_intent_succeeded", "evt_version", &id, now());
    assert_eq!(deliver(&app, &body).await, "aplicado");
    let asked = app
        .http
        .post(app.url(&format!("/v1/pagos/{id}/reembolsos")))
        .bearer_auth(crate::helpers::API_KEY)
        .header("Idempotency-Key", "r-version")
        .json(&json!({"monto": 1000}))
        .send()
        .await
        .expect("sent");
    assert_eq!(
        asked.status(),
        202,
        "a refund Stripe did not answer is pending"
    );
    let refund = json(asked).await["id"].as_str().expect("id").to_owned();
    let report = app
        .admin_post("/admin/reconciliaciones", &json!({ "reembolsoId": refund }))
        .await;
    assert_eq!(report.status(), 200);

    let sent = app.gateway().received_requests().await.unwrap_or_default();
    for (method, path) in [
        ("POST", "/v1/payment_intents"),
        ("GET", "/v1/payment_intents/search"),
        ("POST", "/v1/refunds"),
        ("GET", "/v1/refunds"),
    ] {
        assert!(
            sent.iter()
                .any(|r| r.method.as_str() == method && r.url.path() == path),
            "pagos sent no {method} {path}"
        );
    }
    for request in &sent {
        assert_eq!(
            request.headers.get("stripe-version").map(|v| v.as_bytes()),
            Some(&b"2024-10-28.acacia"[..]),
            "{} {}",
            request.method,
            request.url.path()
        );
    }
}
