//! The Mercado Pago adapter against wiremock serving `fixtures/mercadopago/`: the request
//! pagos sends, the status mapping, timeouts settled by a search, resends with the same
//! key inside the key window and review outside it, and signed notifications whose
//! payment is asked from Mercado Pago, applied once.

use crate::helpers::{Backend, TestApp, json};
use crate::on_both_databases;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use wiremock::matchers::{method, path, path_regex};
use wiremock::{Mock, Request, Respond, ResponseTemplate};

on_both_databases!(
    a_rejection_whose_detail_holds_a_nul_is_recorded_not_refused_at_every_delivery,
    a_long_refusal_naming_the_key_past_its_first_300_characters_is_an_unknown_outcome,
    the_request_pagos_sends_is_mercadopagos_documented_shape,
    every_status_in_the_mapping_table_maps_as_documented,
    what_mercadopago_cannot_charge_is_refused_with_422_and_nothing_is_stored,
    a_signed_notification_settles_a_pending_payment_and_a_wrong_signature_is_refused,
    a_duplicated_notification_applies_once_and_asks_mercadopago_once,
    a_notification_mercadopago_cannot_be_asked_about_is_refused_with_503_and_nothing_recorded,
    a_payment_mercadopago_just_notified_but_does_not_show_yet_is_asked_about_again,
    a_refund_of_a_completed_payment_sends_it_to_manual_review,
    a_stale_or_future_timestamp_is_refused_with_401_and_mercadopago_is_not_asked,
    one_signed_notification_delivered_again_is_a_duplicate_and_asks_mercadopago_once,
    a_notification_fetch_is_metered_like_every_gateway_call,
    a_full_refund_made_through_pagos_keeps_the_payment_completada_without_review,
    partial_refunds_through_pagos_that_add_up_keep_it_completada_even_before_the_last_answer_is_recorded,
    a_full_refund_of_a_payment_mercadopago_reports_in_lower_case_clp_keeps_it_completada,
    money_returned_beyond_pagos_refunds_or_charged_back_still_sends_the_payment_to_review,
    a_refund_pagos_never_sent_does_not_cover_money_returned_outside_pagos,
    a_refund_under_review_without_its_mercadopago_id_is_resolved_by_naming_it_or_overruling,
    a_refund_named_while_a_sibling_of_the_same_amount_awaits_its_answer_is_refused,
    a_blind_fallido_naming_a_rejected_refund_while_an_unheld_one_of_the_amount_is_approved_is_refused,
    an_unsettled_payment_mercadopago_shows_charged_back_goes_to_review_never_402,
    a_chargeback_the_seller_won_leaves_the_payment_completada,
    a_payment_in_another_currency_than_the_accounts_is_refused_before_anything_is_sent,
    centavos_of_colombian_pesos_are_refused_with_422_before_mercadopago_is_asked,
);

const WEBHOOK_SECRET: &str = "mp_webhook_secret_test";
const TOKEN: &str = "ff8080814c11e237014c1ff593b57b4d";

fn fixture(name: &str) -> Value {
    crate::helpers::fixture("mercadopago", name)
}

async fn spawn(backend: Backend, flags: &[&str]) -> TestApp {
    crate::helpers::provider_app(backend, "mercadopago", WEBHOOK_SECRET, flags).await
}

fn card(description: &str) -> Value {
    json!({"creditoId": "42", "monto": 250000, "moneda": "COP", "descripcion": description,
           "medioPago": {"id": "visa", "token": TOKEN, "emisor": "310",
                         "email": "payer@example.com",
                         "documento": {"tipo": "CC", "numero": "1020304050"}}})
}

/// A Mercado Pago payment id of its own for each pagos payment (digits only).
fn mp_id(reference: &str) -> u64 {
    let hex: String = reference.replace('-', "").chars().rev().take(12).collect();
    u64::from_str_radix(&hex, 16).expect("hex") % 10_000_000_000
}

/// `payment` made about the request that asked: id, amount and reference from it.
fn about(mut payment: Value, request: &Value) -> Value {
    let reference = request["external_reference"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    payment["id"] = Value::from(mp_id(&reference));
    payment["transaction_amount"] = request["transaction_amount"].clone();
    payment["external_reference"] = Value::from(reference);
    payment
}

/// Answers each payment with the fixture named in its `description`
/// (`<http status> <fixture>`).
struct ByDescription;

impl Respond for ByDescription {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let body: Value = serde_json::from_slice(&request.body).expect("JSON body");
        let description = body["description"].as_str().unwrap_or_default().to_owned();
        let (status, name) = description.split_once(' ').expect("`<status> <fixture>`");
        let status: u16 = status.parse().expect("status");
        let answer = fixture(name);
        let answer = if status < 300 {
            about(answer, &body)
        } else {
            answer
        };
        ResponseTemplate::new(status).set_body_json(answer)
    }
}

/// A stateful Mercado Pago: payments kept by idempotency key (a key reused answers the
/// same payment), found by search, and read by id.
#[derive(Clone)]
struct FakeMercadoPago(Arc<Mutex<FakeState>>);

struct FakeState {
    new_payments: &'static str,
    by_key: HashMap<String, Value>,
    by_id: HashMap<u64, Value>,
    reads_fail: bool,
    /// Reads by id answer 404 (Mercado Pago's reads lagging behind its notifications).
    reads_lag: bool,
    /// Refunds made, by key (a key reused answers the same refund).
    refunds_by_key: HashMap<String, Value>,
    /// Refunds are made, but answered 500 (the answer lost).
    refund_answers_lost: bool,
    /// The `currency_id` new payments carry, when not the one of the fixture.
    currency_written: Option<&'static str>,
}

impl FakeMercadoPago {
    fn new(new_payments: &'static str) -> Self {
        FakeMercadoPago(Arc::new(Mutex::new(FakeState {
            new_payments,
            by_key: HashMap::new(),
            by_id: HashMap::new(),
            reads_fail: false,
            reads_lag: false,
            refunds_by_key: HashMap::new(),
            refund_answers_lost: false,
            currency_written: None,
        })))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, FakeState> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn reads_fail(&self, fail: bool) {
        self.lock().reads_fail = fail;
    }

    fn reads_lag(&self, lag: bool) {
        self.lock().reads_lag = lag;
    }

    fn refund_answers_lost(&self, lost: bool) {
        self.lock().refund_answers_lost = lost;
    }

    /// New payments carry `currency_id` as `code` (a code in lower case, say).
    fn writes_currency(&self, code: &'static str) {
        self.lock().currency_written = Some(code);
    }

    /// The refunds Mercado Pago made.
    fn refunds_made(&self) -> usize {
        self.lock().refunds_by_key.len()
    }

    /// Mercado Pago changes the payment of pagos payment `reference`.
    fn set(&self, reference: &str, fixture_name: &str, updated: &str) {
        let mut state = self.lock();
        let id = mp_id(reference);
        let current = state.by_id.get(&id).cloned().expect("a payment");
        let mut next = fixture(fixture_name);
        for field in [
            "id",
            "transaction_amount",
            "currency_id",
            "external_reference",
        ] {
            next[field] = current[field].clone();
        }
        next["date_last_updated"] = Value::from(updated);
        state.by_id.insert(id, next.clone());
        for payment in state.by_key.values_mut() {
            if payment["id"] == next["id"] {
                *payment = next.clone();
            }
        }
    }

    /// A refund `id` of `amount` (pesos) of the payment of `reference`, made in Mercado
    /// Pago's panel outside pagos, as the fixture `fixture_name` has it: listed with the
    /// payment's refunds, made by no key.
    fn panel_refund(&self, reference: &str, fixture_name: &str, id: u64, amount: f64) {
        let mut state = self.lock();
        let payment_id = mp_id(reference);
        let payment = state.by_id.get_mut(&payment_id).expect("a payment");
        let mut refund = fixture(fixture_name);
        refund["id"] = Value::from(id);
        refund["payment_id"] = Value::from(payment_id);
        refund["amount"] = Value::from(amount);
        let mut listed = payment["refunds"].as_array().cloned().unwrap_or_default();
        listed.push(refund);
        payment["refunds"] = Value::from(listed);
    }

    /// The payment of `reference` now says `detail` (`status_detail`).
    fn set_detail(&self, reference: &str, detail: &str) {
        let mut state = self.lock();
        let id = mp_id(reference);
        let payment = state.by_id.get_mut(&id).expect("a payment");
        payment["status_detail"] = Value::from(detail);
    }

    async fn mount(&self, server: &wiremock::MockServer) {
        Mock::given(method("POST"))
            .and(path("/v1/payments"))
            .respond_with(FakeCreate(self.clone()))
            .mount(server)
            .await;
        Mock::given(method("GET"))
            .and(path("/v1/payments/search"))
            .respond_with(FakeSearch(self.clone()))
            .with_priority(1)
            .mount(server)
            .await;
        Mock::given(method("GET"))
            .and(path_regex(r"^/v1/payments/[0-9]+$"))
            .respond_with(FakeRead(self.clone()))
            .with_priority(2)
            .mount(server)
            .await;
        Mock::given(method("POST"))
            .and(path_regex(r"^/v1/payments/[0-9]+/refunds$"))
            .respond_with(FakeRefund(self.clone()))
            .mount(server)
            .await;
        Mock::given(method("GET"))
            .and(path_regex(r"^/v1/payments/[0-9]+/refunds$"))
            .respond_with(FakeRefundList(self.clone()))
            .mount(server)
            .await;
    }
}

/// The `X-Idempotency-Key` of a request to Mercado Pago (each pagos sends has one).
fn key_of(request: &Request) -> String {
    request.headers["x-idempotency-key"]
        .to_str()
        .expect("key")
        .to_owned()
}

/// The payment id of a request to `/v1/payments/{id}` or below it.
fn payment_id_of(request: &Request) -> u64 {
    request
        .url
        .path()
        .split('/')
        .nth(3)
        .and_then(|id| id.parse().ok())
        .expect("numeric id")
}

/// `GET /v1/payments/{id}/refunds`: the payment's refunds, as its refund list has them.
struct FakeRefundList(FakeMercadoPago);

impl Respond for FakeRefundList {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let id = payment_id_of(request);
        let state = self.0.lock();
        let listed = state
            .by_id
            .get(&id)
            .and_then(|p| p["refunds"].as_array().cloned())
            .unwrap_or_default();
        ResponseTemplate::new(200).set_body_json(listed)
    }
}

/// `POST /v1/payments/{id}/refunds`: one refund per key (the body's amount, or all that
/// is left for `{}`), and the payment changes as Mercado Pago's does: its refunded
/// amount and refund list grow, and it turns `refunded` once all of it went back.
struct FakeRefund(FakeMercadoPago);

impl Respond for FakeRefund {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let key = key_of(request);
        let id = payment_id_of(request);
        let body: Value = serde_json::from_slice(&request.body).expect("JSON body");
        let mut state = self.0.lock();
        if !state.refunds_by_key.contains_key(&key) {
            let mut payment = state.by_id.get(&id).cloned().expect("a payment");
            let whole = payment["transaction_amount"].as_f64().expect("amount");
            let before = payment["transaction_amount_refunded"]
                .as_f64()
                .unwrap_or(0.0);
            let amount = body["amount"].as_f64().unwrap_or(whole - before);
            let n = state.refunds_by_key.len() as u64 + 1;
            let mut refund = fixture("refund_approved");
            refund["id"] = Value::from(1_009_042_015 + n);
            refund["payment_id"] = Value::from(id);
            refund["amount"] = Value::from(amount);
            refund["amount_refunded_to_payer"] = Value::from(amount);
            let refunded = before + amount;
            payment["transaction_amount_refunded"] = Value::from(refunded);
            let mut listed = payment["refunds"].as_array().cloned().unwrap_or_default();
            listed.push(refund.clone());
            payment["refunds"] = Value::from(listed);
            let (status, detail) = if refunded >= whole {
                ("refunded", "refunded")
            } else {
                ("approved", "partially_refunded")
            };
            payment["status"] = Value::from(status);
            payment["status_detail"] = Value::from(detail);
            payment["date_last_updated"] =
                Value::from(format!("2026-12-03T09:{n:02}:00.000-05:00"));
            state.by_id.insert(id, payment.clone());
            for kept in state.by_key.values_mut() {
                if kept["id"] == payment["id"] {
                    *kept = payment.clone();
                }
            }
            state.refunds_by_key.insert(key.clone(), refund);
        }
        if state.refund_answers_lost {
            return ResponseTemplate::new(500).set_body_json(fixture("error_internal"));
        }
        ResponseTemplate::new(201).set_body_json(state.refunds_by_key[&key].clone())
    }
}

struct FakeCreate(FakeMercadoPago);

impl Respond for FakeCreate {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let key = key_of(request);
        let body: Value = serde_json::from_slice(&request.body).expect("JSON body");
        let mut state = self.0.lock();
        if let Some(existing) = state.by_key.get(&key) {
            return ResponseTemplate::new(200).set_body_json(existing.clone());
        }
        let mut payment = about(fixture(state.new_payments), &body);
        if let Some(code) = state.currency_written {
            payment["currency_id"] = Value::from(code);
        }
        let id = payment["id"].as_u64().expect("id");
        state.by_key.insert(key, payment.clone());
        state.by_id.insert(id, payment.clone());
        ResponseTemplate::new(201).set_body_json(payment)
    }
}

struct FakeSearch(FakeMercadoPago);

impl Respond for FakeSearch {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let reference = crate::helpers::query_param(request, "external_reference");
        let state = self.0.lock();
        let found =
            crate::helpers::matching(state.by_id.values(), "external_reference", &reference);
        let mut answer = if found.is_empty() {
            fixture("search_empty")
        } else {
            fixture("search_found")
        };
        answer["paging"]["total"] = Value::from(found.len());
        answer["results"] = Value::from(found);
        ResponseTemplate::new(200).set_body_json(answer)
    }
}

struct FakeRead(FakeMercadoPago);

impl Respond for FakeRead {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let state = self.0.lock();
        if state.reads_fail {
            return ResponseTemplate::new(500).set_body_json(fixture("error_internal"));
        }
        let id = payment_id_of(request);
        match state.by_id.get(&id).filter(|_| !state.reads_lag) {
            Some(payment) => ResponseTemplate::new(200).set_body_json(payment.clone()),
            None => ResponseTemplate::new(404).set_body_json(
                json!({"message": "Payment not found", "error": "not_found", "status": 404, "cause": []}),
            ),
        }
    }
}

async fn requests(app: &TestApp, verb: &str, filter: impl Fn(&str) -> bool) -> Vec<Request> {
    crate::helpers::received(app.gateway(), verb, filter).await
}

async fn posts(app: &TestApp) -> Vec<Request> {
    requests(app, "POST", |p| p == "/v1/payments").await
}

async fn reads(app: &TestApp) -> usize {
    requests(app, "GET", |p| {
        p.starts_with("/v1/payments/") && p != "/v1/payments/search"
    })
    .await
    .len()
}

async fn the_request_pagos_sends_is_mercadopagos_documented_shape(backend: Backend) {
    let app = spawn(backend, &[]).await;
    FakeMercadoPago::new("payment_approved")
        .mount(app.gateway())
        .await;
    let (status, pago) = app
        .pay_read("k-shape", &card("Cuota 3 del crédito 42"))
        .await;
    assert_eq!(status, 201, "{pago}");
    let id = pago["id"].as_str().expect("id");
    assert_eq!(pago["estado"], "COMPLETADA");
    assert_eq!(pago["gatewayRef"], mp_id(id).to_string());
    assert_eq!(
        pago["medioPago"],
        json!({"id": "visa"}),
        "no token, e-mail or document"
    );

    let sent = posts(&app).await;
    assert_eq!(sent.len(), 1);
    let request = &sent[0];
    assert_eq!(request.method.as_str(), "POST");
    assert_eq!(request.url.path(), "/v1/payments");
    assert_eq!(request.headers["authorization"], "Bearer gw_secret");
    assert_eq!(request.headers["content-type"], "application/json");
    let key = request.headers["x-idempotency-key"]
        .to_str()
        .expect("ASCII");
    assert!(key.starts_with("pagos-") && key.len() <= 255, "{key}");

    let body: Value = serde_json::from_slice(&request.body).expect("JSON");
    let mut expected = fixture("payment_request");
    expected["external_reference"] = Value::from(id);
    for field in [
        "transaction_amount",
        "description",
        "payment_method_id",
        "token",
        "installments",
        "issuer_id",
        "payer",
        "external_reference",
    ] {
        assert_eq!(body[field], expected[field], "field {field}");
    }
    assert_eq!(body, expected, "no field more, no field less");
    assert_eq!(
        body["transaction_amount"].as_f64(),
        Some(2500.0),
        "COP 250000 cents is 2500.00"
    );
}

async fn every_status_in_the_mapping_table_maps_as_documented(backend: Backend) {
    let app = spawn(backend, &[]).await;
    Mock::given(method("POST"))
        .and(path("/v1/payments"))
        .respond_with(ByDescription)
        .mount(app.gateway())
        .await;
    crate::helpers::assert_mapping(
        &app,
        &[
            ("201 payment_approved", 201, "COMPLETADA", None),
            ("201 payment_pending", 202, "ENVIADA", None),
            ("201 payment_in_process", 202, "ENVIADA", None),
            ("201 payment_authorized", 202, "ENVIADA", None),
            ("201 payment_in_mediation", 202, "ENVIADA", None),
            (
                "201 payment_rejected",
                402,
                "FALLIDA",
                Some("cc_rejected_insufficient_amount"),
            ),
            (
                "201 payment_cancelled",
                402,
                "FALLIDA",
                Some("cancelled_expired"),
            ),
            ("201 payment_refunded", 402, "FALLIDA", Some("refunded")),
            // Taken, then disputed (a create's answer replayed long after): not "no money
            // taken"; on-call decides.
            ("201 payment_charged_back", 202, "REVISION_MANUAL", None),
            (
                "400 error_bad_request",
                402,
                "FALLIDA",
                Some("gateway_rejected_400"),
            ),
        ],
        card,
    )
    .await;
    assert_eq!(posts(&app).await.len(), 10, "one call each");
}

async fn what_mercadopago_cannot_charge_is_refused_with_422_and_nothing_is_stored(
    backend: Backend,
) {
    let app = spawn(backend, &[]).await;
    FakeMercadoPago::new("payment_approved")
        .mount(app.gateway())
        .await;
    for (body, fields) in [
        (
            json!({"creditoId": "42", "monto": 250000, "moneda": "COP"}),
            vec!["medioPago"],
        ),
        (
            json!({"creditoId": "42", "monto": 250000, "moneda": "COP",
                   "medioPago": "pm_1Q0PsIJvEtkwdCNYMSaVuRz6"}),
            vec!["medioPago.email"],
        ),
        (
            json!({"creditoId": "42", "monto": 9900, "moneda": "USD",
                   "medioPago": {"id": "efecty", "email": "payer@example.com"}}),
            vec!["moneda"],
        ),
    ] {
        let (status, problem) = app.pay_read("k-422", &body).await;
        assert_eq!(status, 422, "{body}");
        let got = crate::helpers::listed(&problem, "errores", "campo");
        assert_eq!(got, fields, "{body}");
    }
    assert_eq!(app.count_rows().await, (0, 0), "a 422 stores nothing");
    assert!(posts(&app).await.is_empty());
    let cash = json!({"creditoId": "42", "monto": 250000, "moneda": "COP",
                      "medioPago": {"id": "efecty", "email": "payer@example.com"}});
    let (status, _) = app.pay_read("k-422", &cash).await;
    assert_eq!(status, 201, "the same key works with a corrected body");
    let body: Value = serde_json::from_slice(&posts(&app).await[0].body).expect("JSON");
    assert_eq!(body["payment_method_id"], "efecty");
    assert!(body.get("token").is_none() && body.get("installments").is_none());
}

/// `x-signature` as Mercado Pago computes it, here independently of pagos' code.
fn x_signature(secret: &str, data_id: &str, request_id: &str, ts: i64) -> String {
    let manifest = format!("id:{data_id};request-id:{request_id};ts:{ts};");
    format!(
        "ts={ts},v1={}",
        crate::helpers::hmac_hex(secret, &[manifest.as_bytes()])
    )
}

fn notification(notification_id: u64, data_id: &str) -> Vec<u8> {
    let mut n = fixture("notification_payment_updated");
    n["id"] = Value::from(notification_id);
    n["data"]["id"] = Value::from(data_id);
    serde_json::to_vec(&n).expect("JSON")
}

/// The `x-request-id` Mercado Pago sends with notification `notification_id`: one per
/// notification, as Mercado Pago's are.
fn request_id(notification_id: u64) -> String {
    format!("bb56a2f1-6aae-46ac-982e-{notification_id:012}")
}

const REQUEST_ID: &str = "bb56a2f1-6aae-46ac-982e-9dcd3581d08e";

async fn notify_signed(
    app: &TestApp,
    data_id: &str,
    body: &[u8],
    signature: &str,
) -> reqwest::Response {
    notify_signed_as(app, data_id, body, signature, REQUEST_ID).await
}

async fn notify_signed_as(
    app: &TestApp,
    data_id: &str,
    body: &[u8],
    signature: &str,
    request_id: &str,
) -> reqwest::Response {
    crate::helpers::post_webhook(
        app,
        &format!("/v1/webhooks/mercadopago?data.id={data_id}&type=payment"),
        &[("x-signature", signature), ("x-request-id", request_id)],
        body,
    )
    .await
}

async fn notify(app: &TestApp, notification_id: u64, data_id: &str) -> reqwest::Response {
    let request_id = request_id(notification_id);
    let signature = x_signature(
        WEBHOOK_SECRET,
        data_id,
        &request_id,
        chrono::Utc::now().timestamp(),
    );
    notify_signed_as(
        app,
        data_id,
        &notification(notification_id, data_id),
        &signature,
        &request_id,
    )
    .await
}

async fn outcome(answer: reqwest::Response) -> String {
    assert_eq!(answer.status(), 200);
    json(answer).await["resultado"]
        .as_str()
        .expect("resultado")
        .to_owned()
}

/// A payment Mercado Pago left pending, on an app of its own, and what Mercado Pago says of
/// it when asked afterwards (`then`, as of 2026-12-02 11:00 in Bogotá): the app, the
/// fake, the payment's pagos id and its Mercado Pago id (as notifications name it).
async fn pending_then(
    backend: Backend,
    key: &str,
    then: &str,
) -> (TestApp, FakeMercadoPago, String, String) {
    let app = spawn(backend, &[]).await;
    let fake = FakeMercadoPago::new("payment_pending");
    fake.mount(app.gateway()).await;
    let id = pending_payment(&app, key).await;
    let data_id = mp_id(&id).to_string();
    fake.set(&id, then, "2026-12-02T11:00:00.000-05:00");
    (app, fake, id, data_id)
}

/// A payment Mercado Pago left pending (cash at Efecty); returns its id.
async fn pending_payment(app: &TestApp, key: &str) -> String {
    let cash = json!({"creditoId": "42", "monto": 250000, "moneda": "COP",
                      "medioPago": {"id": "efecty", "email": "payer@example.com"}});
    let (status, pago) = app.pay_read(key, &cash).await;
    assert_eq!(status, 202, "{pago}");
    pago["id"].as_str().expect("id").to_owned()
}

async fn a_signed_notification_settles_a_pending_payment_and_a_wrong_signature_is_refused(
    backend: Backend,
) {
    let (app, _fake, id, data_id) = pending_then(backend, "k-wh", "payment_approved").await;

    let body = notification(7001, &data_id);
    let now = chrono::Utc::now().timestamp();
    for signature in [
        x_signature("other_secret", &data_id, REQUEST_ID, now),
        x_signature(WEBHOOK_SECRET, "999", REQUEST_ID, now),
        x_signature(WEBHOOK_SECRET, &data_id, "another-request", now),
        format!("v1={}", "ab".repeat(32)),
    ] {
        let answer = notify_signed(&app, &data_id, &body, &signature).await;
        assert_eq!(answer.status(), 401, "{signature}");
    }
    assert_eq!(
        app.recorded().await,
        (0, 0),
        "a refused notification records nothing"
    );
    assert_eq!(reads(&app).await, 0, "nor asks Mercado Pago anything");

    assert_eq!(
        outcome(notify(&app, 7001, &data_id).await).await,
        "aplicado"
    );
    let payment = app.payment(&id).await;
    assert_eq!(payment.state, "COMPLETADA");
    assert_eq!(payment.gateway_ref, Some(data_id.clone()));

    let other_type = serde_json::to_vec(&fixture("notification_merchant_order")).expect("JSON");
    let signature = x_signature(WEBHOOK_SECRET, "26262399173", REQUEST_ID, now);
    let answer = notify_signed(&app, "26262399173", &other_type, &signature).await;
    assert_eq!(outcome(answer).await, "ignorado");
}

/// A rejection whose `status_detail` holds a NUL, which PostgreSQL's text refuses: the
/// charge is held to what pagos stores as every adapter's answers are, the NUL kept as
/// U+FFFD. Before, on PostgreSQL, its report could not be written: a 503 at every
/// delivery, the payment left to the reconciler.
async fn a_rejection_whose_detail_holds_a_nul_is_recorded_not_refused_at_every_delivery(
    backend: Backend,
) {
    let (app, fake, id, data_id) = pending_then(backend, "k-nul", "payment_rejected").await;
    fake.set_detail(&id, "cc_rejected\u{0}other");
    assert_eq!(
        outcome(notify(&app, 7101, &data_id).await).await,
        "aplicado"
    );
    let payment = app.payment(&id).await;
    assert_eq!(payment.state, "FALLIDA");
    assert_eq!(
        payment.decline_code.as_deref(),
        Some("cc_rejected\u{FFFD}other")
    );
}

/// A 400 whose body names the idempotency key only past its first 300 characters (a
/// second `cause`): a payment may exist under the key. Before, the key was looked for in
/// the 300 characters kept for the error's words, cut into JSON that does not parse: a
/// plain refusal, 402 FALLIDA. Now the whole body is read: unknown, 202 ENVIADA.
async fn a_long_refusal_naming_the_key_past_its_first_300_characters_is_an_unknown_outcome(
    backend: Backend,
) {
    let app = spawn(backend, &["--gateway-retries", "0"]).await;
    let body = json!({"status": 400, "error": "bad_request", "message": "invalid request",
    "cause": [
        {"code": "4020", "description": "x".repeat(300), "data": "2026-12-02T11:00:00.000-05:00"},
        {"code": "401001", "description": "idempotency key already used with another request"},
    ]});
    Mock::given(wiremock::matchers::method("POST"))
        .and(wiremock::matchers::path("/v1/payments"))
        .respond_with(ResponseTemplate::new(400).set_body_json(body))
        .mount(app.gateway())
        .await;
    let (status, pago) = app.pay_read("k-long-refusal", &card("long refusal")).await;
    assert_eq!(status, 202, "{pago}");
    assert_eq!(pago["estado"], "ENVIADA", "{pago}");
}

async fn a_duplicated_notification_applies_once_and_asks_mercadopago_once(backend: Backend) {
    let (app, _fake, id, data_id) = pending_then(backend, "k-dup", "payment_approved").await;

    assert_eq!(
        outcome(notify(&app, 7002, &data_id).await).await,
        "aplicado"
    );
    for _ in 0..3 {
        assert_eq!(
            outcome(notify(&app, 7002, &data_id).await).await,
            "duplicado"
        );
    }
    assert_eq!(
        reads(&app).await,
        1,
        "a known notification is not asked about again"
    );
    assert_eq!(
        app.recorded().await,
        (2, 1),
        "the notification's id and its request's, one charge"
    );

    // Another notification about the same, unchanged payment changes nothing either.
    assert_eq!(
        outcome(notify(&app, 7003, &data_id).await).await,
        "obsoleto"
    );
    assert_eq!(app.payment(&id).await.state, "COMPLETADA");
}

async fn a_notification_mercadopago_cannot_be_asked_about_is_refused_with_503_and_nothing_recorded(
    backend: Backend,
) {
    let (app, fake, id, data_id) = pending_then(backend, "k-503", "payment_rejected").await;
    fake.reads_fail(true);

    let answer = notify(&app, 7004, &data_id).await;
    assert_eq!(answer.status(), 503);
    assert!(answer.headers().contains_key("retry-after"));
    assert_eq!(app.recorded().await, (0, 0));
    assert_eq!(app.payment(&id).await.state, "ENVIADA");

    fake.reads_fail(false);
    assert_eq!(
        outcome(notify(&app, 7004, &data_id).await).await,
        "aplicado"
    );
    let payment = app.payment(&id).await;
    assert_eq!(payment.state, "FALLIDA");
    assert_eq!(
        payment.decline_code.as_deref(),
        Some("cc_rejected_insufficient_amount")
    );
}

/// A payment pagos never learned was approved (its notifications lost) is read
/// `charged_back`: it took the money and the payer disputed it, which the seller may win
/// (`reimbursed`) or still be fighting. Neither a notification nor the reconciler's
/// look-up answers it `FALLIDA` (402, no money taken): on-call decides.
async fn an_unsettled_payment_mercadopago_shows_charged_back_goes_to_review_never_402(
    backend: Backend,
) {
    let (app, _fake, id, data_id) =
        pending_then(backend.clone(), "k-disputed", "payment_charged_back").await;
    assert_eq!(
        outcome(notify(&app, 7401, &data_id).await).await,
        "revision_manual"
    );
    let payment = app.payment(&id).await;
    assert_eq!(payment.state, "REVISION_MANUAL");
    assert_eq!(payment.decline_code, None, "never told declined");

    // The same read by the reconciler's look-up.
    let app = spawn(backend, &["--stale-after", "1s"]).await;
    let fake = FakeMercadoPago::new("payment_pending");
    fake.mount(app.gateway()).await;
    let id = pending_payment(&app, "k-disputed-looked-up").await;
    fake.set(&id, "payment_charged_back", "2026-12-02T11:00:00.000-05:00");
    let report = app.reconcile(&id).await;
    assert_eq!(report["revisionManual"], 1, "{report}");
    let (status, pago) = app
        .pay_read(
            "k-disputed-looked-up",
            &json!({"creditoId": "42", "monto": 250000, "moneda": "COP",
                    "medioPago": {"id": "efecty", "email": "payer@example.com"}}),
        )
        .await;
    assert_eq!(
        status, 202,
        "the retry is not told no money was taken: {pago}"
    );
    assert_eq!(pago["estado"], "REVISION_MANUAL");
}

/// A dispute the seller won: Mercado Pago keeps the payment `charged_back` and says
/// `reimbursed` (the money stays with the seller; `settled` when it went back to the payer).
/// The dispute's opening sends a paid payment to review, as before, and on-call resolves it
/// COMPLETADA; the notification that the seller won leaves it COMPLETADA. Before, read as
/// declined, it sent the payment back to review and told the merchant
/// `pago.revision_manual` again, at every notification. An unsettled payment read so is
/// COMPLETADA: the money stands.
async fn a_chargeback_the_seller_won_leaves_the_payment_completada(backend: Backend) {
    let app = spawn(backend.clone(), &[]).await;
    let fake = FakeMercadoPago::new("payment_approved");
    fake.mount(app.gateway()).await;
    let (id, data_id) = approved_payment(&app, "k-dispute-won").await;
    fake.set(
        &id,
        "payment_charged_back_in_process",
        "2026-12-03T09:00:00.000-05:00",
    );
    assert_eq!(
        outcome(notify(&app, 7411, &data_id).await).await,
        "revision_manual"
    );
    let resolved = app
        .resolved_as(
            crate::helpers::ADMIN_TOKEN,
            &id,
            &json!({"estado": "COMPLETADA", "motivo": "ticket 12: dispute documented",
                    "contraProveedor": "the dispute is open; the documents were sent"}),
        )
        .await;
    assert_eq!(resolved["pago"]["estado"], "COMPLETADA", "{resolved}");

    fake.set(
        &id,
        "payment_charged_back_reimbursed",
        "2026-12-20T09:00:00.000-05:00",
    );
    assert_eq!(
        outcome(notify(&app, 7412, &data_id).await).await,
        "sin_cambios"
    );
    assert_eq!(app.payment(&id).await.state, "COMPLETADA");
    assert_eq!(
        revision_events(&app, &id).await,
        1,
        "told once, when the dispute opened"
    );

    let (app, _fake, id, data_id) = pending_then(
        backend,
        "k-dispute-won-unsettled",
        "payment_charged_back_reimbursed",
    )
    .await;
    assert_eq!(
        outcome(notify(&app, 7413, &data_id).await).await,
        "aplicado"
    );
    assert_eq!(app.payment(&id).await.state, "COMPLETADA");
}

/// How often `app` asked Mercado Pago its account (`GET /users/me`), and how many
/// payments it sent.
async fn asked(app: &TestApp) -> (usize, usize) {
    let requests = app.gateway().received_requests().await.expect("recorded");
    let me = requests
        .iter()
        .filter(|r| r.url.path() == "/users/me")
        .count();
    let paid = requests
        .iter()
        .filter(|r| r.url.path() == "/v1/payments" && r.method.as_str() == "POST")
        .count();
    (me, paid)
}

/// `GET /users/me` says the account is of `site` (`MLC`: Chile, CLP), before any payment.
async fn account_in(server: &wiremock::MockServer, site: &str) {
    let mut account = fixture("users_me");
    account["site_id"] = Value::from(site);
    Mock::given(method("GET"))
        .and(path("/users/me"))
        .respond_with(ResponseTemplate::new(200).set_body_json(account))
        .with_priority(1)
        .mount(server)
        .await;
}

/// Mercado Pago's payments carry no currency: it charges the amount in its account's
/// (here a Colombian one, COP). A payment in Chilean pesos was sent and charged 250,000
/// COP for 250,000 CLP, and went to review when the answer said COP. Now it is refused
/// (422 naming `moneda`), nothing stored, nothing sent; the account's currency is asked
/// once (`GET /users/me`); `PAGOS_MERCADOPAGO_MONEDA` gives way to it, and is used when
/// Mercado Pago cannot say. When it cannot say and nothing is set, a new payment is 503,
/// nothing stored.
async fn a_payment_in_another_currency_than_the_accounts_is_refused_before_anything_is_sent(
    backend: Backend,
) {
    let app = spawn(backend.clone(), &[]).await;
    let fake = FakeMercadoPago::new("payment_approved");
    fake.mount(app.gateway()).await;
    let mut pesos = card("in Chilean pesos");
    pesos["moneda"] = json!("CLP");
    for key in ["k-clp-on-cop", "k-clp-on-cop-again"] {
        let (status, problem) = app.pay_read(key, &pesos).await;
        assert_eq!(status, 422, "{problem}");
        assert_eq!(problem["type"], "/problems/validation-failed", "{problem}");
        assert_eq!(problem["errores"][0]["campo"], "moneda", "{problem}");
        let detail = problem["errores"][0]["detalle"].as_str().expect("detalle");
        assert!(detail.contains("charges in COP"), "{detail}");
    }
    assert_eq!(app.count_rows().await, (0, 0), "nothing stored");
    let (status, pago) = app.pay_read("k-cop", &card("in COP")).await;
    assert_eq!(status, 201, "{pago}");
    assert_eq!(asked(&app).await, (1, 1), "asked once; one payment sent");

    // Given: still asked once, and the account's word wins over a setting that names
    // another currency (a Chilean setting on this Colombian account would bring back the
    // 250,000 COP charge for 250,000 CLP).
    let mistaken = spawn(backend.clone(), &["--mercadopago-moneda", "CLP"]).await;
    FakeMercadoPago::new("payment_approved")
        .mount(mistaken.gateway())
        .await;
    let (status, problem) = mistaken.pay_read("k-clp-set", &pesos).await;
    assert_eq!(status, 422, "{problem}");
    assert_eq!(problem["errores"][0]["campo"], "moneda", "{problem}");
    let (status, pago) = mistaken.pay_read("k-cop-set", &card("in COP")).await;
    assert_eq!(status, 201, "{pago}");
    assert_eq!(asked(&mistaken).await, (1, 1));

    // Given, and Mercado Pago cannot say (a token that may not read the account): the
    // setting is used, and not asked again.
    let chilean = spawn(backend.clone(), &["--mercadopago-moneda", "CLP"]).await;
    Mock::given(method("GET"))
        .and(path("/users/me"))
        .respond_with(ResponseTemplate::new(403).set_body_json(fixture("error_internal")))
        .with_priority(1)
        .mount(chilean.gateway())
        .await;
    let fake = FakeMercadoPago::new("payment_approved");
    fake.writes_currency("CLP");
    fake.mount(chilean.gateway()).await;
    let (status, pago) = chilean.pay_read("k-clp", &pesos).await;
    assert_eq!(status, 201, "{pago}");
    let (status, problem) = chilean.pay_read("k-cop-on-clp", &card("in COP")).await;
    assert_eq!(status, 422, "{problem}");
    let (status, pago) = chilean.pay_read("k-clp-2", &pesos).await;
    assert_eq!(status, 201, "{pago}");
    assert_eq!(asked(&chilean).await, (1, 2));

    // Mercado Pago cannot say.
    let unsaid = spawn(backend, &[]).await;
    Mock::given(method("GET"))
        .and(path("/users/me"))
        .respond_with(ResponseTemplate::new(500).set_body_json(fixture("error_internal")))
        .with_priority(1)
        .mount(unsaid.gateway())
        .await;
    FakeMercadoPago::new("payment_approved")
        .mount(unsaid.gateway())
        .await;
    let answer = unsaid.pay("k-unsaid", &card("currency unknown")).await;
    assert_eq!(answer.status(), 503);
    assert!(answer.headers().contains_key("retry-after"));
    assert_eq!(unsaid.count_rows().await, (0, 0), "nothing stored");
    // A body refused for its own faults is told so meanwhile, not to send it again.
    let twice = card("monto written twice").to_string().replacen(
        r#""monto":250000"#,
        r#""monto":1000,"monto":250000"#,
        1,
    );
    assert!(twice.contains(r#""monto":1000"#), "{twice}");
    let answer = unsaid
        .http
        .post(unsaid.url("/v1/pagos"))
        .bearer_auth(crate::helpers::API_KEY)
        .header("Idempotency-Key", "k-unsaid-twice")
        .header("Content-Type", "application/json")
        .body(twice)
        .send()
        .await
        .expect("answered");
    let status = answer.status();
    let problem: Value = answer.json().await.expect("JSON");
    assert_eq!(status, 422, "{problem}");
    assert_eq!(problem["errores"][0]["campo"], "monto", "{problem}");
    assert_eq!(unsaid.count_rows().await, (0, 0), "nothing stored");
}

/// Mercado Pago's reads lag behind its notifications: a payment it notified a moment ago
/// may answer 404. Before, the notification was acknowledged and never came again, and
/// what it reported (here a charge-back of a COMPLETADA payment) was lost: the payment
/// stayed COMPLETADA. Now a young one is refused (503, nothing recorded, not taken for a
/// duplicate), and its next delivery, once Mercado Pago shows the payment, is applied. An
/// old one whose payment is still not found is acknowledged, as before.
async fn a_payment_mercadopago_just_notified_but_does_not_show_yet_is_asked_about_again(
    backend: Backend,
) {
    let app = spawn(backend, &[]).await;
    let fake = FakeMercadoPago::new("payment_approved");
    fake.mount(app.gateway()).await;
    let (status, pago) = app.pay_read("k-lag", &card("charged back later")).await;
    assert_eq!(status, 201);
    let id = pago["id"].as_str().expect("id").to_owned();
    let data_id = mp_id(&id).to_string();
    fake.set(&id, "payment_charged_back", "2026-12-03T09:00:00.000-05:00");
    fake.reads_lag(true);
    let mut young: Value = serde_json::from_slice(&notification(7201, &data_id)).expect("JSON");
    young["date_created"] = Value::from(chrono::Utc::now().to_rfc3339());
    let young = serde_json::to_vec(&young).expect("JSON");
    let deliver = async || {
        let signature = x_signature(
            WEBHOOK_SECRET,
            &data_id,
            &request_id(7201),
            chrono::Utc::now().timestamp(),
        );
        notify_signed_as(&app, &data_id, &young, &signature, &request_id(7201)).await
    };

    let answer = deliver().await;
    assert_eq!(answer.status(), 503);
    assert!(answer.headers().contains_key("retry-after"));
    assert_eq!(app.recorded().await, (0, 0), "nothing recorded");
    assert_eq!(app.payment(&id).await.state, "COMPLETADA");

    fake.reads_lag(false);
    assert_eq!(outcome(deliver().await).await, "revision_manual");
    assert_eq!(app.payment(&id).await.state, "REVISION_MANUAL");

    fake.reads_lag(true);
    assert_eq!(
        outcome(notify(&app, 7203, &data_id).await).await,
        "ignorado",
        "made long ago: acknowledged"
    );
}

async fn a_refund_of_a_completed_payment_sends_it_to_manual_review(backend: Backend) {
    let app = spawn(backend, &[]).await;
    let fake = FakeMercadoPago::new("payment_approved");
    fake.mount(app.gateway()).await;
    let (status, pago) = app.pay_read("k-refund", &card("refunded later")).await;
    assert_eq!(status, 201);
    let id = pago["id"].as_str().expect("id").to_owned();
    let data_id = mp_id(&id).to_string();
    fake.set(&id, "payment_refunded", "2026-12-03T09:00:00.000-05:00");

    assert_eq!(
        outcome(notify(&app, 7005, &data_id).await).await,
        "revision_manual"
    );
    assert_eq!(app.payment(&id).await.state, "REVISION_MANUAL");
    let replay = app.pay("k-refund", &card("refunded later")).await;
    assert_eq!(
        replay.status(),
        201,
        "what the client was told stays frozen"
    );
}

async fn a_stale_or_future_timestamp_is_refused_with_401_and_mercadopago_is_not_asked(
    backend: Backend,
) {
    let (app, _fake, id, data_id) = pending_then(backend, "k-ts", "payment_approved").await;
    let body = notification(7100, &data_id);
    let now = chrono::Utc::now().timestamp();
    // Correctly signed, 330 s either side of now (a margin for a slow machine: the server
    // reads its clock later than the test): seconds, and the same in milliseconds.
    for ts in [now - 330, now + 330, (now - 330) * 1000, (now + 330) * 1000] {
        let signature = x_signature(WEBHOOK_SECRET, &data_id, REQUEST_ID, ts);
        let answer = notify_signed(&app, &data_id, &body, &signature).await;
        assert_eq!(answer.status(), 401, "ts={ts}");
        let problem = json(answer).await;
        assert!(
            crate::helpers::text_has(&problem, "detail", "5 minutes"),
            "{problem}"
        );
    }
    assert_eq!(reads(&app).await, 0, "Mercado Pago is not asked");
    assert_eq!(app.recorded().await, (0, 0), "nothing is recorded");
    assert_eq!(app.payment(&id).await.state, "ENVIADA");
    assert!(
        app.metrics()
            .await
            .lines()
            .any(|l| l == "pagos_webhook_events_total{outcome=\"refused_timestamp\"} 4"),
        "counted like every refused signature"
    );

    // Inside the tolerance, in seconds or in milliseconds, it is applied.
    let signature = x_signature(WEBHOOK_SECRET, &data_id, REQUEST_ID, (now - 240) * 1000);
    let answer = notify_signed(&app, &data_id, &body, &signature).await;
    assert_eq!(outcome(answer).await, "aplicado");
    assert_eq!(app.payment(&id).await.state, "COMPLETADA");
}

async fn one_signed_notification_delivered_again_is_a_duplicate_and_asks_mercadopago_once(
    backend: Backend,
) {
    let (app, _fake, id, data_id) = pending_then(backend, "k-replay", "payment_approved").await;

    // One notification as Mercado Pago signed it, captured.
    let request_id = request_id(7101);
    let signature = x_signature(
        WEBHOOK_SECRET,
        &data_id,
        &request_id,
        chrono::Utc::now().timestamp(),
    );
    let body = notification(7101, &data_id);
    let deliver = |body: Vec<u8>| {
        let (data_id, signature, request_id) = (&data_id, &signature, &request_id);
        let app = &app;
        async move { outcome(notify_signed_as(app, data_id, &body, signature, request_id).await).await }
    };
    assert_eq!(deliver(body.clone()).await, "aplicado");
    assert_eq!(deliver(body).await, "duplicado", "the same request again");
    // The body is not signed: another notification id does not make it another request.
    assert_eq!(
        deliver(notification(7999, &data_id)).await,
        "duplicado",
        "a replay with its body's id changed"
    );
    assert_eq!(reads(&app).await, 1, "Mercado Pago asked once");
    assert_eq!(app.payment(&id).await.state, "COMPLETADA");

    // Mercado Pago's next notification (its own request id) is asked about again.
    assert_eq!(
        outcome(notify(&app, 7102, &data_id).await).await,
        "obsoleto"
    );
    assert_eq!(reads(&app).await, 2);
}

async fn a_notification_fetch_is_metered_like_every_gateway_call(backend: Backend) {
    let (app, _fake, _id, data_id) = pending_then(backend, "k-metered", "payment_approved").await;

    assert_eq!(
        outcome(notify(&app, 7201, &data_id).await).await,
        "aplicado"
    );
    assert_eq!(
        outcome(notify(&app, 7202, "9999999999").await).await,
        "ignorado",
        "a payment Mercado Pago does not have"
    );
    let text = app.metrics().await;
    for line in [
        "pagos_gateway_calls_total{operation=\"fetch\",outcome=\"found\"} 1",
        "pagos_gateway_calls_total{operation=\"fetch\",outcome=\"not_found\"} 1",
        "pagos_gateway_call_duration_seconds_count{operation=\"fetch\"} 2",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} in:\n{text}");
    }
}

/// A card payment Mercado Pago approved (201 COMPLETADA); its pagos id and Mercado Pago id.
async fn approved_payment(app: &TestApp, key: &str) -> (String, String) {
    let (status, pago) = app.pay_read(key, &card("refunded later")).await;
    assert_eq!(status, 201, "{pago}");
    let id = pago["id"].as_str().expect("id").to_owned();
    let data_id = mp_id(&id).to_string();
    (id, data_id)
}

/// A merchant refund through pagos; (status, the refund).
async fn refund_through_pagos(app: &TestApp, id: &str, key: &str, body: Value) -> (u16, Value) {
    let answer = crate::refunds::refund(app, id, key, &body).await;
    let status = answer.status().as_u16();
    (status, json(answer).await)
}

/// Notification `n` of payment `id` (Mercado Pago's `data_id`, now `refunded`) changes
/// nothing: the payment stays COMPLETADA and nobody is told to review it.
async fn notified_and_still_completada(app: &TestApp, n: u64, id: &str, data_id: &str) {
    assert_eq!(outcome(notify(app, n, data_id).await).await, "sin_cambios");
    assert_eq!(app.payment(id).await.state, "COMPLETADA");
    assert_eq!(revision_events(app, id).await, 0, "no pago.revision_manual");
}

/// The `pago.revision_manual` events told about payment `id`.
async fn revision_events(app: &TestApp, id: &str) -> u64 {
    use pagos::entities::event;
    use sea_orm::{ColumnTrait, EntityTrait, PaginatorTrait, QueryFilter};
    event::Entity::find()
        .filter(event::Column::SubjectId.eq(uuid::Uuid::parse_str(id).expect("uuid")))
        .filter(event::Column::EventType.eq(event::EventType::PagoRevisionManual))
        .count(&app.db)
        .await
        .expect("count")
}

/// The payment as its merchant reads it.
async fn merchant_view(app: &TestApp, id: &str) -> Value {
    let answer = app
        .http
        .get(app.url(&format!("/v1/pagos/{id}")))
        .bearer_auth(crate::helpers::API_KEY)
        .send()
        .await
        .expect("sent");
    assert_eq!(answer.status(), 200);
    json(answer).await
}

async fn a_full_refund_made_through_pagos_keeps_the_payment_completada_without_review(
    backend: Backend,
) {
    let app = spawn(backend, &[]).await;
    let fake = FakeMercadoPago::new("payment_approved");
    fake.mount(app.gateway()).await;
    let (id, data_id) = approved_payment(&app, "k-full").await;

    let (status, refund) = refund_through_pagos(&app, &id, "r-full", json!({})).await;
    assert_eq!(status, 201, "{refund}");
    assert_eq!(refund["estado"], "COMPLETADO");
    assert_eq!(fake.refunds_made(), 1);

    // Mercado Pago marks the payment `refunded` and notifies: pagos' own doing.
    notified_and_still_completada(&app, 7301, &id, &data_id).await;
    let pago = merchant_view(&app, &id).await;
    assert_eq!(pago["estado"], "COMPLETADA");
    assert_eq!(pago["montoReembolsado"], 250000);
    let detail = json(app.admin_get(&format!("/admin/pagos/{id}")).await).await;
    assert!(
        crate::helpers::listed(&detail, "transiciones", "motivo")
            .iter()
            .any(|m| m.contains("7301") && m.contains("pagos' own refunds")),
        "the audit trail says why: {detail}"
    );
    // Nothing is left to refund, and that is the answer (not "not refundable").
    let (status, problem) = refund_through_pagos(&app, &id, "r-more", json!({"monto": 100})).await;
    assert_eq!(status, 422, "{problem}");
    assert_eq!(problem["type"], "/problems/refund-exceeds-remaining");
}

/// A payment in Chilean pesos (no decimals) whose Mercado Pago answers write the currency
/// in lower case (`clp`), fully refunded through pagos: the notification of the now
/// `refunded` payment is pagos' own doing. Before, the amount returned was read with two
/// decimals (`clp` is no code pagos knows) and looked 100 times the payment, so a payment
/// the merchant had refunded through pagos went to on-call's review.
async fn a_full_refund_of_a_payment_mercadopago_reports_in_lower_case_clp_keeps_it_completada(
    backend: Backend,
) {
    let app = spawn(backend, &[]).await;
    let fake = FakeMercadoPago::new("payment_approved");
    fake.writes_currency("clp");
    fake.mount(app.gateway()).await;
    account_in(app.gateway(), "MLC").await;
    let mut pesos = card("refunded later");
    pesos["moneda"] = json!("CLP");
    pesos["monto"] = json!(25000);
    let (status, pago) = app.pay_read("k-clp", &pesos).await;
    assert_eq!(status, 201, "{pago}");
    assert_eq!(pago["moneda"], "CLP");
    let id = pago["id"].as_str().expect("id").to_owned();
    let data_id = mp_id(&id).to_string();

    let (status, refund) = refund_through_pagos(&app, &id, "r-clp", json!({})).await;
    assert_eq!(status, 201, "{refund}");
    assert_eq!(refund["estado"], "COMPLETADO");
    assert_eq!(refund["monto"], 25000);
    assert_eq!(fake.refunds_made(), 1);

    notified_and_still_completada(&app, 7305, &id, &data_id).await;
    let pago = merchant_view(&app, &id).await;
    assert_eq!(pago["estado"], "COMPLETADA");
    assert_eq!(pago["montoReembolsado"], 25000);
}

async fn partial_refunds_through_pagos_that_add_up_keep_it_completada_even_before_the_last_answer_is_recorded(
    backend: Backend,
) {
    let app = spawn(backend, &[]).await;
    let fake = FakeMercadoPago::new("payment_approved");
    fake.mount(app.gateway()).await;
    let (id, data_id) = approved_payment(&app, "k-parts").await;

    let (status, _) = refund_through_pagos(&app, &id, "r-1", json!({"monto": 100000})).await;
    assert_eq!(status, 201);
    assert_eq!(
        outcome(notify(&app, 7311, &data_id).await).await,
        "sin_cambios",
        "partly refunded: still approved"
    );
    // The rest: Mercado Pago makes it, but its answer is lost, so pagos holds the refund
    // ENVIADO when the notification of the now `refunded` payment arrives.
    fake.refund_answers_lost(true);
    let (status, refund) = refund_through_pagos(&app, &id, "r-2", json!({})).await;
    assert_eq!(status, 202, "{refund}");
    assert_eq!(refund["estado"], "ENVIADO");
    assert_eq!(
        fake.refunds_made(),
        2,
        "one refund per key, however often sent"
    );
    notified_and_still_completada(&app, 7312, &id, &data_id).await;
}

async fn money_returned_beyond_pagos_refunds_or_charged_back_still_sends_the_payment_to_review(
    backend: Backend,
) {
    let app = spawn(backend, &[]).await;
    let fake = FakeMercadoPago::new("payment_approved");
    fake.mount(app.gateway()).await;
    for (n, (key, then)) in [
        ("k-beyond", "payment_refunded"),
        ("k-chargeback", "payment_charged_back"),
    ]
    .into_iter()
    .enumerate()
    {
        let (id, data_id) = approved_payment(&app, key).await;
        let (status, _) =
            refund_through_pagos(&app, &id, &format!("r-{key}"), json!({"monto": 100000})).await;
        assert_eq!(status, 201);
        // The rest went back outside pagos (Mercado Pago's panel), or the payer disputed it.
        fake.set(&id, then, "2026-12-04T09:00:00.000-05:00");
        assert_eq!(
            outcome(notify(&app, 7321 + n as u64, &data_id).await).await,
            "revision_manual",
            "{then}"
        );
        assert_eq!(app.payment(&id).await.state, "REVISION_MANUAL", "{then}");
        assert_eq!(revision_events(&app, &id).await, 1, "{then}");
    }
}

/// A full refund registered `EN_PROCESO` whose request died before it marked it sent (a
/// crash, a database error: 500), then the merchant refunds the payment in Mercado Pago's
/// panel. The refund pagos holds never reached Mercado Pago, so what went back is not its
/// doing: the payment goes to review, and on-call is told before the reconciler sends a
/// refund Mercado Pago can only refuse.
async fn a_refund_pagos_never_sent_does_not_cover_money_returned_outside_pagos(backend: Backend) {
    use pagos::saga::refund::store::{self, Registered, Registration};
    let app = spawn(backend, &[]).await;
    let fake = FakeMercadoPago::new("payment_approved");
    fake.mount(app.gateway()).await;
    let (id, data_id) = approved_payment(&app, "k-never-sent").await;
    let payment =
        pagos::saga::store::find_payment(&app.db, uuid::Uuid::parse_str(&id).expect("uuid"))
            .await
            .expect("read")
            .expect("the payment");

    // The whole payment registered for a refund, held by its (dead) request for an hour:
    // nobody sends it during the test.
    let registered = store::register(
        &app.db,
        Registration {
            merchant: payment.merchant_id,
            scope: pagos::entities::refund::KeyScope::Merchant,
            key: "r-never-sent",
            fingerprint: "fingerprint",
            payment: payment.id,
            amount: None,
            reason: None,
            audit: None,
            requested_by: "merchant".into(),
            lease: std::time::Duration::from_secs(3600),
            payment_states: &[pagos::saga::state::PaymentState::Completada],
            charge: None,
            charge_amount: None,
        },
    )
    .await
    .expect("registered");
    let Registered::Started(refund) = registered else {
        panic!("expected a new refund, got {registered:?}");
    };
    assert_eq!(refund.state.as_str(), "EN_PROCESO");
    assert_eq!(refund.amount, 250000);

    // Mercado Pago's panel refunds it all; Mercado Pago notifies.
    fake.set(&id, "payment_refunded", "2026-12-04T09:00:00.000-05:00");
    assert_eq!(
        outcome(notify(&app, 7331, &data_id).await).await,
        "revision_manual",
        "a refund never sent covers nothing"
    );
    assert_eq!(fake.refunds_made(), 0, "pagos sent no refund");
    assert_eq!(app.payment(&id).await.state, "REVISION_MANUAL");
    assert_eq!(revision_events(&app, &id).await, 1, "pago.revision_manual");
    let detail = json(app.admin_get(&format!("/admin/pagos/{id}")).await).await;
    assert!(
        crate::helpers::listed(&detail, "transiciones", "motivo")
            .iter()
            .any(|m| m.contains("contradicting COMPLETADA")),
        "the audit trail says why: {detail}"
    );
}

/// Mercado Pago's refunds carry no pagos reference: without the refund's own id (its answer
/// lost) pagos cannot tell whether Mercado Pago made it, and the reconciler hands it to
/// on-call ("no refund at the provider after … of sends with the same key"). Neither
/// answer is taken on pagos' word alone; on-call names the refund it found in Mercado
/// Pago's panel (pagos asks Mercado Pago about that one), or overrules with a reason.
async fn a_refund_under_review_without_its_mercadopago_id_is_resolved_by_naming_it_or_overruling(
    backend: Backend,
) {
    let app = spawn(backend, &["--give-up-after", "1s", "--stale-after", "1s"]).await;
    let fake = FakeMercadoPago::new("payment_approved");
    fake.mount(app.gateway()).await;
    let (id, _) = approved_payment(&app, "k-review").await;
    fake.refund_answers_lost(true);
    let mut refunds = Vec::new();
    for key in ["r-1", "r-2"] {
        let (status, refund) = refund_through_pagos(&app, &id, key, json!({"monto": 50000})).await;
        assert_eq!(status, 202, "{refund}");
        assert!(refund["gatewayRef"].is_null(), "{refund}");
        refunds.push(refund["id"].as_str().expect("id").to_owned());
    }
    assert_eq!(fake.refunds_made(), 2);
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    for refund in &refunds {
        let report = json(
            app.admin_post("/admin/reconciliaciones", &json!({ "reembolsoId": refund }))
                .await,
        )
        .await;
        assert_eq!(report["reembolsos"]["revisionManual"], 1, "{report}");
    }
    let resolve = |refund: &str, body: Value| {
        let path = format!("/admin/reembolsos/{refund}/resolucion");
        let app = &app;
        async move { app.admin_post(&path, &body).await }
    };
    let (first, second) = (&refunds[0], &refunds[1]);
    // Mercado Pago made refund 1009042016 for the first, 1009042017 for the second.

    for estado in ["COMPLETADO", "FALLIDO"] {
        let answer = resolve(first, json!({"estado": estado, "motivo": "checked"})).await;
        let problem = crate::helpers::problem(answer, 409, estado).await;
        assert_eq!(problem["type"], "/problems/provider-disagrees", "{problem}");
        for said in ["gatewayRef", "contraProveedor"] {
            assert!(
                crate::helpers::text_has(&problem, "detail", said),
                "{said}: {problem}"
            );
        }
    }

    // Named: Mercado Pago shows it approved for the refund's amount.
    let answer = resolve(
        first,
        json!({"estado": "COMPLETADO", "motivo": "panel", "gatewayRef": "1009042016"}),
    )
    .await;
    assert_eq!(answer.status(), 200);
    let done = json(answer).await;
    assert_eq!(done["reembolso"]["estado"], "COMPLETADO", "{done}");
    assert_eq!(done["reembolso"]["gatewayRef"], "1009042016");

    // The first's refund is not the second's; a FALLIDO naming its own is refused too.
    for body in [
        json!({"estado": "COMPLETADO", "motivo": "panel", "gatewayRef": "1009042016"}),
        json!({"estado": "FALLIDO", "motivo": "panel", "gatewayRef": "1009042017"}),
    ] {
        let answer = resolve(second, body.clone()).await;
        let problem = crate::helpers::problem(answer, 409, &body.to_string()).await;
        assert_eq!(problem["type"], "/problems/provider-disagrees", "{problem}");
    }

    // Overruled: on-call says what the panel shows, and names the refund it shows — never
    // without naming it, or another refund could be settled on the same money.
    let why = "Mercado Pago's panel shows refund 1009042017 approved for 500.00";
    let unnamed = resolve(
        second,
        json!({"estado": "COMPLETADO", "motivo": "ticket 9", "contraProveedor": why}),
    )
    .await;
    assert_eq!(unnamed.status(), 422);
    let answer = resolve(
        second,
        json!({"estado": "COMPLETADO", "motivo": "ticket 9", "contraProveedor": why,
               "gatewayRef": "1009042017"}),
    )
    .await;
    assert_eq!(answer.status(), 200);
    let done = json(answer).await;
    assert_eq!(done["reembolso"]["estado"], "COMPLETADO");
    let last = crate::helpers::last_transition(&done);
    for said in ["ticket 9", why, "overrul"] {
        assert!(
            crate::helpers::text_has(&last, "motivo", said),
            "{said} in {last}"
        );
    }
    let pago = merchant_view(&app, &id).await;
    assert_eq!(pago["montoReembolsado"], 100000);
    assert_eq!(fake.refunds_made(), 2, "nothing sent again");
}

/// Two refunds of one payment for the same amount, both answers lost. The first is under
/// review; the second is still being settled (sent, no provider id). In Mercado Pago's
/// panel on-call sees one approved refund for that amount, but it is the second's: named
/// for the first, the second's resend would then be answered with it too and settle it,
/// two pagos refunds (and `montoReembolsado`) on one provider refund's money while the
/// customer got half. The resolution waits for the sibling to settle or be handed to
/// review; then the refund is told apart (the second holds it), and the first is resolved
/// with its own.
async fn a_refund_named_while_a_sibling_of_the_same_amount_awaits_its_answer_is_refused(
    backend: Backend,
) {
    let app = spawn(backend, &["--give-up-after", "1s", "--stale-after", "1s"]).await;
    let fake = FakeMercadoPago::new("payment_approved");
    fake.mount(app.gateway()).await;
    let (id, _) = approved_payment(&app, "k-siblings").await;
    fake.refund_answers_lost(true);
    let mut refunds = Vec::new();
    for key in ["r-first", "r-second"] {
        let (status, refund) = refund_through_pagos(&app, &id, key, json!({"monto": 50000})).await;
        assert_eq!(status, 202, "{refund}");
        refunds.push(refund["id"].as_str().expect("id").to_owned());
    }
    let (first, second) = (&refunds[0], &refunds[1]);
    // Mercado Pago made 1009042016 for the first, 1009042017 for the second.
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let reconcile = |refund: &str| {
        let body = json!({ "reembolsoId": refund });
        let app = &app;
        async move { json(app.admin_post("/admin/reconciliaciones", &body).await).await }
    };
    let report = reconcile(first).await;
    assert_eq!(report["reembolsos"]["revisionManual"], 1, "{report}");
    let resolve = |refund: &str, body: Value| {
        let path = format!("/admin/reembolsos/{refund}/resolucion");
        let app = &app;
        async move { app.admin_post(&path, &body).await }
    };

    let seen_in_the_panel =
        json!({"estado": "COMPLETADO", "motivo": "panel", "gatewayRef": "1009042017"});
    let answer = resolve(first, seen_in_the_panel.clone()).await;
    let problem = crate::helpers::problem(answer, 409, "a sibling awaits its answer").await;
    assert_eq!(problem["type"], "/problems/provider-disagrees", "{problem}");
    assert!(
        crate::helpers::text_has(&problem, "detail", second),
        "names the sibling: {problem}"
    );
    let overruled = json!({"estado": "COMPLETADO", "motivo": "panel", "gatewayRef": "1009042017",
                           "contraProveedor": "the panel shows 1009042017 approved"});
    let answer = resolve(first, overruled).await;
    crate::helpers::problem(answer, 409, "overruled too").await;

    // The second is handed to review too; on-call settles it with its own refund, and
    // then that refund is told apart from the first's.
    let report = reconcile(second).await;
    assert_eq!(report["reembolsos"]["revisionManual"], 1, "{report}");
    let answer = resolve(second, seen_in_the_panel.clone()).await;
    assert_eq!(answer.status(), 200);
    let answer = resolve(first, seen_in_the_panel).await;
    crate::helpers::problem(answer, 409, "now the second's").await;
    let answer = resolve(
        first,
        json!({"estado": "COMPLETADO", "motivo": "panel", "gatewayRef": "1009042016"}),
    )
    .await;
    assert_eq!(answer.status(), 200);
    let pago = merchant_view(&app, &id).await;
    assert_eq!(
        pago["montoReembolsado"], 100000,
        "each provider refund counted once"
    );
    assert_eq!(fake.refunds_made(), 2, "nothing sent twice");
}

/// A refund's answer was lost, and Mercado Pago made it (1009042016, approved). In the
/// panel on-call finds a rejected refund of the same amount (1009042099, an attempt made
/// there) and resolves the pagos refund FALLIDO naming it. Before, that was checked against
/// the refund named only, and taken: the amount freed and the merchant told
/// `reembolso.fallido` while the customer had the money, a second refund giving it twice.
/// Now the payment's whole refund list is read, and the approved refund no pagos refund
/// holds refuses it (409 naming it); resolved COMPLETADO naming that one, it is counted
/// once.
async fn a_blind_fallido_naming_a_rejected_refund_while_an_unheld_one_of_the_amount_is_approved_is_refused(
    backend: Backend,
) {
    let app = spawn(backend, &["--give-up-after", "1s", "--stale-after", "1s"]).await;
    let fake = FakeMercadoPago::new("payment_approved");
    fake.mount(app.gateway()).await;
    let (id, _) = approved_payment(&app, "k-blind-fallido").await;
    fake.refund_answers_lost(true);
    let (status, refund) = refund_through_pagos(&app, &id, "r-lost", json!({"monto": 50000})).await;
    assert_eq!(status, 202, "{refund}");
    let refund = refund["id"].as_str().expect("id").to_owned();
    fake.panel_refund(&id, "refund_rejected", 1_009_042_099, 500.0);
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let report = json(
        app.admin_post("/admin/reconciliaciones", &json!({ "reembolsoId": refund }))
            .await,
    )
    .await;
    assert_eq!(report["reembolsos"]["revisionManual"], 1, "{report}");
    let path = format!("/admin/reembolsos/{refund}/resolucion");

    let named_rejected =
        json!({"estado": "FALLIDO", "motivo": "panel: rechazado", "gatewayRef": "1009042099"});
    let answer = app.admin_post(&path, &named_rejected).await;
    let problem = crate::helpers::problem(answer, 409, "an approved refund no one holds").await;
    assert_eq!(problem["type"], "/problems/provider-disagrees", "{problem}");
    assert!(
        crate::helpers::text_has(&problem, "detail", "1009042016"),
        "names the approved refund: {problem}"
    );
    let read = json(
        app.get_as(crate::helpers::API_KEY, &format!("/v1/reembolsos/{refund}"))
            .await,
    )
    .await;
    assert_eq!(read["estado"], "REVISION_MANUAL", "nothing changed: {read}");

    let answer = app
        .admin_post(
            &path,
            &json!({"estado": "COMPLETADO", "motivo": "panel", "gatewayRef": "1009042016"}),
        )
        .await;
    assert_eq!(answer.status(), 200);
    let pago = merchant_view(&app, &id).await;
    assert_eq!(pago["montoReembolsado"], 50000);
    assert_eq!(fake.refunds_made(), 1, "nothing sent again");
}

/// Mercado Pago takes Colombian pesos in whole pesos: a `monto` with centavos, of a
/// payment or of a refund, is the merchant's 422 naming `monto` with nothing stored and
/// nothing sent — not a charge or refund Mercado Pago refuses with a 400, answered as a
/// decline (402 FALLIDA, or a FALLIDO refund) with the key used up.
async fn centavos_of_colombian_pesos_are_refused_with_422_before_mercadopago_is_asked(
    backend: Backend,
) {
    let app = spawn(backend, &[]).await;
    let fake = FakeMercadoPago::new("payment_approved");
    fake.mount(app.gateway()).await;
    let mut with_centavos = card("2500.50 COP");
    with_centavos["monto"] = json!(250050);
    let (status, problem) = app.pay_read("k-centavos", &with_centavos).await;
    assert_eq!(status, 422, "{problem}");
    assert_eq!(
        crate::helpers::listed(&problem, "errores", "campo"),
        vec!["monto"]
    );
    assert!(
        problem["errores"][0]["detalle"]
            .as_str()
            .is_some_and(|d| d.contains("multiple of 100")),
        "{problem}"
    );
    assert_eq!(app.count_rows().await, (0, 0), "a 422 stores nothing");
    assert!(posts(&app).await.is_empty(), "Mercado Pago was not asked");

    let (id, _) = approved_payment(&app, "k-whole").await;
    let (status, problem) =
        refund_through_pagos(&app, &id, "r-centavos", json!({"monto": 50050})).await;
    assert_eq!(status, 422, "{problem}");
    assert_eq!(
        crate::helpers::listed(&problem, "errores", "campo"),
        vec!["monto"]
    );
    assert_eq!(fake.refunds_made(), 0, "no refund sent");
    let listed = app
        .get_as(
            crate::helpers::API_KEY,
            &format!("/v1/pagos/{id}/reembolsos"),
        )
        .await;
    assert_eq!(json(listed).await["reembolsos"], json!([]), "nor stored");
    let (status, refund) =
        refund_through_pagos(&app, &id, "r-centavos", json!({"monto": 50000})).await;
    assert_eq!(status, 201, "the same key, corrected: {refund}");
    assert_eq!(fake.refunds_made(), 1);
}
