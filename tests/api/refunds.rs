//! Refunds (contract section 6) over real HTTP, against a stateful reference gateway on
//! wiremock that keeps refunds by key (replaying a key's refund) and by reference
//! (look-ups tell the truth), so a test can count exactly what the gateway made.

use crate::helpers::{
    ADMIN_TOKEN, API_KEY, Backend, Charge, OTHER_API_KEY, Spawn, TestApp, charges, create_once,
    json, mount_route, payment_body, query_param,
};
use crate::on_both_databases;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use wiremock::{MockServer, Request, Respond, ResponseTemplate};

on_both_databases!(
    a_full_refund_returns_the_whole_payment_and_shows_it_refunded,
    partial_refunds_add_up_and_the_last_one_takes_what_is_left,
    the_same_refund_twice_refunds_once_and_replays_the_answer_byte_for_byte,
    a_refund_key_reused_with_another_body_is_422_and_a_payments_key_is_not_a_refunds,
    refund_key_conflicts_and_replays_are_counted_like_a_payments,
    a_refund_over_what_is_left_is_422_with_restante_and_stores_nothing,
    a_payment_that_is_not_completada_cannot_be_refunded,
    another_merchants_payment_and_refund_are_404,
    a_refused_refund_is_422_fallido_and_leaves_the_amount_to_refund_again,
    refunds_that_settle_tell_the_merchant_with_an_event_of_the_refund,
    a_refund_that_times_out_is_202_and_the_reconciler_settles_it,
    a_pass_settles_a_refund_backlog_with_no_more_look_ups_in_flight_than_its_concurrency,
    on_call_refunds_with_a_reason_recorded_in_the_audit_trail,
    a_refund_sent_to_review_because_the_provider_cannot_be_asked_keeps_the_look_ups_error,
    a_refund_with_monto_written_twice_or_a_nul_in_motivo_is_422_and_stores_nothing,
    a_pending_refund_the_gateway_lists_with_an_upper_case_reference_is_settled_by_its_look_up,
);

/// The gateway's refunds, by key and by reference.
#[derive(Clone, Default)]
pub struct FakeRefunds {
    state: Arc<Mutex<RefundsState>>,
}

#[derive(Default)]
struct RefundsState {
    by_key: HashMap<String, Value>,
    /// Every refund made, in order.
    made: Vec<Value>,
    status: Option<&'static str>,
    delay: Duration,
    next: u64,
    lookup_delay: Duration,
    /// When each look-up arrived.
    lookups: Vec<std::time::Instant>,
    /// Look-ups answer no refund (a search lagging behind the refunds made).
    search_lags: bool,
    /// Look-ups answer 500.
    lookups_fail: bool,
    /// New refunds carry their reference in upper case (a gateway that rewrites it).
    references_upper: bool,
}

impl FakeRefunds {
    fn lock(&self) -> std::sync::MutexGuard<'_, RefundsState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// New refunds get `status` (succeeded by default, failed, pending).
    pub fn refunding(&self, status: &'static str) {
        self.lock().status = Some(status);
    }

    /// Every refund made so far now has `status` (a pending refund settling).
    pub fn settle_all(&self, status: &'static str) {
        for made in &mut self.lock().made {
            made["status"] = Value::from(status);
        }
    }

    /// Look-ups answer no refund while `lags` (the provider's search lags behind the
    /// refunds it made).
    pub fn search_lags(&self, lags: bool) {
        self.lock().search_lags = lags;
    }

    /// New refunds carry their reference in upper case, as a gateway that rewrites the
    /// UUID it was sent does; look-ups still find them by it.
    pub fn writes_references_upper_case(&self) {
        self.lock().references_upper = true;
    }

    /// Look-ups answer 500 while `fail`.
    pub fn fail_lookups(&self, fail: bool) {
        self.lock().lookups_fail = fail;
    }

    /// Every answer comes after `delay` (the refund is made at once).
    pub fn delay(&self, delay: Duration) {
        self.lock().delay = delay;
    }

    /// Every look-up from now on is answered after `delay` (and counted by
    /// `most_lookups_at_once`: those before are forgotten).
    pub fn lookup_delay(&self, delay: Duration) {
        let mut state = self.lock();
        state.lookup_delay = delay;
        state.lookups.clear();
    }

    /// The most look-ups that were in flight at once.
    pub fn most_lookups_at_once(&self) -> usize {
        let state = self.lock();
        crate::helpers::most_at_once(&state.lookups, state.lookup_delay)
    }

    /// The refunds the gateway made.
    pub fn made(&self) -> Vec<Value> {
        self.lock().made.clone()
    }

    pub async fn mount(&self, server: &MockServer) {
        charges()
            .respond_with(Charge::succeeded())
            .mount(server)
            .await;
        self.mount_refunds(server).await;
    }

    /// Only the refund endpoints (the test mounts its own charges).
    pub async fn mount_refunds(&self, server: &MockServer) {
        mount_route(server, "POST", "/v1/refunds", MakeRefund(self.clone())).await;
        mount_route(server, "GET", "/v1/refunds", LookRefunds(self.clone())).await;
    }
}

struct MakeRefund(FakeRefunds);

impl Respond for MakeRefund {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let state = &mut *self.0.lock();
        create_once(request, &mut state.by_key, state.delay, |body| {
            state.next += 1;
            let status = state.status.unwrap_or("succeeded");
            let reference = match body["reference"].as_str() {
                Some(sent) if state.references_upper => Value::from(sent.to_uppercase()),
                _ => body["reference"].clone(),
            };
            let refund = json!({
                "id": format!("re_fake_{}", state.next),
                "status": status,
                "charge": body["charge"],
                "amount": body["amount"],
                "currency": body["currency"],
                "reference": reference,
                "failureCode": if status == "failed" { Value::from("expired_or_canceled_card") } else { Value::Null },
            });
            state.made.push(refund.clone());
            refund
        })
    }
}

struct LookRefunds(FakeRefunds);

impl Respond for LookRefunds {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let reference = query_param(request, "reference");
        let mut state = self.0.lock();
        state.lookups.push(std::time::Instant::now());
        if state.lookups_fail {
            return ResponseTemplate::new(500).set_body_json(json!({"error": "unavailable"}));
        }
        let data: Vec<Value> = if state.search_lags {
            Vec::new()
        } else {
            state
                .made
                .iter()
                .filter(|r| {
                    r["reference"]
                        .as_str()
                        .is_some_and(|made| made.eq_ignore_ascii_case(&reference))
                })
                .cloned()
                .collect()
        };
        ResponseTemplate::new(200)
            .set_body_json(json!({ "data": data }))
            .set_delay(state.lookup_delay)
    }
}

/// An app on `backend` with the fake gateway mounted.
pub(crate) async fn app_with(backend: Backend, flags: &[&'static str]) -> (TestApp, FakeRefunds) {
    let app = Spawn::new(backend).flags(flags).start().await;
    let fake = FakeRefunds::default();
    fake.mount(app.gateway()).await;
    (app, fake)
}

/// A COMPLETADA payment of 250000 COP; its id.
pub(crate) async fn paid(app: &TestApp, key: &str) -> String {
    let answer = app.pay(key, &payment_body()).await;
    assert_eq!(answer.status(), 201);
    json(answer).await["id"].as_str().expect("id").to_owned()
}

pub async fn refund_as(
    app: &TestApp,
    api_key: &str,
    payment: &str,
    key: &str,
    body: &Value,
) -> reqwest::Response {
    app.post_keyed(
        api_key,
        &format!("/v1/pagos/{payment}/reembolsos"),
        key,
        body,
    )
    .await
}

pub async fn refund(app: &TestApp, payment: &str, key: &str, body: &Value) -> reqwest::Response {
    refund_as(app, API_KEY, payment, key, body).await
}

async fn a_full_refund_returns_the_whole_payment_and_shows_it_refunded(backend: Backend) {
    let (app, fake) = app_with(backend, &[]).await;
    let payment = paid(&app, "pay-1").await;

    let answer = refund(
        &app,
        &payment,
        "ref-1",
        &json!({"motivo": "solicitud del cliente"}),
    )
    .await;
    assert_eq!(answer.status(), 201);
    let location = crate::helpers::location_of(&answer);
    let body = json(answer).await;
    assert_eq!(body["estado"], "COMPLETADO");
    assert_eq!(body["monto"], 250000);
    assert_eq!(body["moneda"], "COP");
    assert_eq!(body["pagoId"], payment.as_str());
    assert_eq!(body["motivo"], "solicitud del cliente");
    assert_eq!(body["gatewayRef"], "re_fake_1");
    assert_eq!(
        location,
        format!("/v1/reembolsos/{}", body["id"].as_str().expect("id"))
    );

    let made = fake.made();
    assert_eq!(made.len(), 1);
    assert_eq!(made[0]["amount"], 250000);
    assert_eq!(
        made[0]["charge"], "ch_3Pq8sTQ2xY7wZ1",
        "the payment's charge is refunded"
    );
    assert_eq!(made[0]["reference"], body["id"]);

    let read = json(app.get_as(API_KEY, &location).await).await;
    assert_eq!(read, body);
    let pago = json(app.get_as(API_KEY, &format!("/v1/pagos/{payment}")).await).await;
    assert_eq!(
        pago["estado"], "COMPLETADA",
        "a refunded payment stays COMPLETADA"
    );
    assert_eq!(pago["montoReembolsado"], 250000);
    let list = json(
        app.get_as(API_KEY, &format!("/v1/pagos/{payment}/reembolsos"))
            .await,
    )
    .await;
    assert_eq!(list["reembolsos"], json!([body]));

    // Nothing is left: one more is refused, and the gateway is not asked.
    let more = refund(&app, &payment, "ref-2", &json!({})).await;
    assert_eq!(more.status(), 422);
    let problem = json(more).await;
    assert_eq!(problem["type"], "/problems/refund-exceeds-remaining");
    assert_eq!(problem["restante"], 0);
    assert_eq!(fake.made().len(), 1);
}

async fn partial_refunds_add_up_and_the_last_one_takes_what_is_left(backend: Backend) {
    let (app, fake) = app_with(backend, &["--metrics-refresh", "100ms"]).await;
    let payment = paid(&app, "pay-1").await;

    let first = refund(&app, &payment, "ref-1", &json!({"monto": 50000})).await;
    assert_eq!(first.status(), 201);
    assert_eq!(json(first).await["monto"], 50000);
    let second = refund(&app, &payment, "ref-2", &json!({"monto": 100000})).await;
    assert_eq!(second.status(), 201);
    let pago = json(app.get_as(API_KEY, &format!("/v1/pagos/{payment}")).await).await;
    assert_eq!(pago["montoReembolsado"], 150000);

    let rest = refund(&app, &payment, "ref-3", &json!({})).await;
    assert_eq!(rest.status(), 201);
    assert_eq!(json(rest).await["monto"], 100000, "no monto: what is left");
    let amounts: Vec<i64> = fake
        .made()
        .iter()
        .map(|r| r["amount"].as_i64().expect("amount"))
        .collect();
    assert_eq!(amounts, vec![50000, 100000, 100000]);
    let pago = json(app.get_as(API_KEY, &format!("/v1/pagos/{payment}")).await).await;
    assert_eq!(pago["montoReembolsado"], 250000);
    let list = json(
        app.get_as(API_KEY, &format!("/v1/pagos/{payment}/reembolsos"))
            .await,
    )
    .await;
    assert_eq!(list["reembolsos"].as_array().map(Vec::len), Some(3));
    app.scrape_until("pagos_refunds", |text| {
        crate::helpers::has_line(text, r#"pagos_refunds{estado="COMPLETADO"} 3"#)
            && crate::helpers::has_line(text, r#"pagos_refunds{estado="ENVIADO"} 0"#)
    })
    .await;
}

async fn the_same_refund_twice_refunds_once_and_replays_the_answer_byte_for_byte(backend: Backend) {
    let (app, fake) = app_with(backend, &[]).await;
    let payment = paid(&app, "pay-1").await;
    let body = json!({"monto": 50000, "motivo": "devolución"});

    let first = refund(&app, &payment, "ref-1", &body).await;
    assert_eq!(first.status(), 201);
    assert!(first.headers().get("idempotent-replayed").is_none());
    let location = first.headers()["location"].clone();
    let first_body = first.bytes().await.expect("body");

    // Key order and white space do not make another request.
    let again = app
        .http
        .post(app.url(&format!("/v1/pagos/{payment}/reembolsos")))
        .bearer_auth(API_KEY)
        .header("Idempotency-Key", "ref-1")
        .header("Content-Type", "application/json")
        .body(r#"{ "motivo": "devolución",   "monto": 50000 }"#)
        .send()
        .await
        .expect("sent");
    assert_eq!(again.status(), 201);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(again.headers()["location"], location);
    assert_eq!(again.bytes().await.expect("body"), first_body);

    // Nor does `50000.0` for `50000` (the same RFC 8785 form): the body alone would be
    // refused for its form, the key taken with it answers first.
    let again = refund(
        &app,
        &payment,
        "ref-1",
        &json!({"monto": 50000.0, "motivo": "devolución"}),
    )
    .await;
    assert_eq!(again.status(), 201);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(again.bytes().await.expect("body"), first_body);
    let refused = refund(
        &app,
        &payment,
        "ref-2",
        &json!({"monto": 50000.0, "motivo": "devolución"}),
    )
    .await;
    assert_eq!(refused.status(), 422, "a new key written so is refused");
    assert_eq!(fake.made().len(), 1, "one refund at the gateway");
}

async fn a_refund_key_reused_with_another_body_is_422_and_a_payments_key_is_not_a_refunds(
    backend: Backend,
) {
    let (app, fake) = app_with(backend, &[]).await;
    let payment = paid(&app, "shared-key").await;

    // The payment's key names nothing in the refunds' key space.
    let first = refund(&app, &payment, "shared-key", &json!({"monto": 1000})).await;
    assert_eq!(first.status(), 201);

    let other = refund(&app, &payment, "shared-key", &json!({"monto": 2000})).await;
    assert_eq!(other.status(), 422);
    assert_eq!(
        json(other).await["type"],
        "/problems/idempotency-key-reused"
    );
    assert_eq!(fake.made().len(), 1);

    // And the payment's key still replays the payment.
    let replay = app.pay("shared-key", &payment_body()).await;
    assert_eq!(replay.status(), 201);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
}

/// The counter `series` (its name and labels, as rendered) in `text`; 0 while absent (a
/// counter is rendered from its first increment).
fn counter(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

async fn refund_key_conflicts_and_replays_are_counted_like_a_payments(backend: Backend) {
    let (app, fake) = app_with(backend, &[]).await;
    let payment = paid(&app, "pay-1").await;
    let refunds = |outcome: &str| {
        format!("pagos_idempotency_requests_total{{operation=\"refund\",outcome=\"{outcome}\"}}")
    };
    let replays = r#"pagos_replays_total{operation="refund",source="database"}"#;
    let payments = r#"pagos_idempotency_requests_total{operation="payment",outcome="new"}"#;
    let before = app.metrics().await;

    let body = json!({"monto": 1000});
    assert_eq!(refund(&app, &payment, "ref-1", &body).await.status(), 201);
    let replayed = refund(&app, &payment, "ref-1", &body).await;
    assert_eq!(replayed.headers()["idempotent-replayed"], "true");
    let reused = refund(&app, &payment, "ref-1", &json!({"monto": 2000})).await;
    assert_eq!(reused.status(), 422);
    assert_eq!(
        json(reused).await["type"],
        "/problems/idempotency-key-reused"
    );

    // In flight: a refund pending at the gateway, whose lease another request holds (as
    // a request of another process does while the gateway answers it).
    fake.refunding("pending");
    let pending = refund(&app, &payment, "ref-2", &body).await;
    assert_eq!(pending.status(), 202);
    let id = uuid::Uuid::parse_str(json(pending).await["id"].as_str().expect("id")).expect("uuid");
    {
        use pagos::entities::refund;
        use sea_orm::sea_query::Expr;
        use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
        let held = pagos::db::now() + chrono::TimeDelta::minutes(1);
        refund::Entity::update_many()
            .col_expr(refund::Column::LeaseUntil, Expr::value(Some(held)))
            .filter(refund::Column::Id.eq(id))
            .exec(&app.db)
            .await
            .expect("lease the refund");
    }
    let busy = refund(&app, &payment, "ref-2", &body).await;
    assert_eq!(busy.status(), 409);
    assert_eq!(json(busy).await["type"], "/problems/request-in-flight");

    let after = app.metrics().await;
    let moved = |series: &str| counter(&after, series) - counter(&before, series);
    assert_eq!(moved(&refunds("new")), 2.0, "{after}");
    assert_eq!(moved(&refunds("replayed")), 1.0, "{after}");
    assert_eq!(moved(&refunds("mismatch")), 1.0, "{after}");
    assert_eq!(moved(&refunds("in_flight")), 1.0, "{after}");
    assert_eq!(moved(replays), 1.0, "{after}");
    assert_eq!(moved(payments), 0.0, "a refund is not counted as a payment");
}

async fn a_refund_over_what_is_left_is_422_with_restante_and_stores_nothing(backend: Backend) {
    let (app, fake) = app_with(backend, &[]).await;
    let payment = paid(&app, "pay-1").await;
    assert_eq!(
        refund(&app, &payment, "ref-1", &json!({"monto": 200000}))
            .await
            .status(),
        201
    );

    let over = refund(&app, &payment, "ref-2", &json!({"monto": 50001})).await;
    assert_eq!(over.status(), 422);
    assert_eq!(over.headers()["content-type"], "application/problem+json");
    let problem = json(over).await;
    assert_eq!(problem["type"], "/problems/refund-exceeds-remaining");
    assert_eq!(problem["restante"], 50000);
    assert_eq!(fake.made().len(), 1);

    // Nothing was stored under the key: corrected, it goes through.
    let fixed = refund(&app, &payment, "ref-2", &json!({"monto": 50000})).await;
    assert_eq!(fixed.status(), 201);

    // Bad input is refused before anything, and stores nothing either.
    let bad = refund(&app, &payment, "ref-3", &json!({"monto": -1, "otro": 1})).await;
    assert_eq!(bad.status(), 422);
    let problem = json(bad).await;
    assert_eq!(problem["type"], "/problems/validation-failed");
    let missing_key = app
        .post_as(
            API_KEY,
            &format!("/v1/pagos/{payment}/reembolsos"),
            &json!({}),
        )
        .await;
    assert_eq!(missing_key.status(), 400);
    assert_eq!(fake.made().len(), 2);
}

/// A body JSON reads two ways (`monto` twice) and a `motivo` PostgreSQL cannot store (a
/// NUL) are the merchant's to correct: 422 naming the field, nothing refunded or stored,
/// the key free for the corrected request; never a 503 to retry, on either database. The
/// same for on-call's refund, whose audit row keeps what was asked (the NUL as `�`).
async fn a_refund_with_monto_written_twice_or_a_nul_in_motivo_is_422_and_stores_nothing(
    backend: Backend,
) {
    let (app, fake) = app_with(backend, &[]).await;
    let payment = paid(&app, "pay-1").await;
    let send = |path: String, token: &'static str, key: &'static str, raw: &'static str| {
        let request = app
            .http
            .post(app.url(&path))
            .bearer_auth(token)
            .header("Idempotency-Key", key)
            .header("Content-Type", "application/json")
            .body(raw);
        async move { request.send().await.expect("sent") }
    };
    let merchants = format!("/v1/pagos/{payment}/reembolsos");
    let on_call = format!("/admin/pagos/{payment}/reembolsos");
    let refused = [
        (
            &merchants,
            API_KEY,
            r#"{"monto":1000,"monto":250000}"#,
            "monto",
        ),
        (
            &merchants,
            API_KEY,
            r#"{"monto":1000,"motivo":"a\u0000b"}"#,
            "motivo",
        ),
        (
            &on_call,
            ADMIN_TOKEN,
            r#"{"monto":1000,"motivo":"a\u0000b"}"#,
            "motivo",
        ),
        (
            &on_call,
            ADMIN_TOKEN,
            r#"{"motivo":"x","monto":1000,"monto":250000}"#,
            "monto",
        ),
    ];
    for (path, token, raw, campo) in refused {
        let answer = send(path.clone(), token, "ref-bad", raw).await;
        let problem = crate::helpers::problem(answer, 422, raw).await;
        assert_eq!(problem["type"], "/problems/validation-failed", "{raw}");
        assert!(
            crate::helpers::lists_field(&problem, campo),
            "{raw}: lists {campo}: {problem}"
        );
    }
    assert!(fake.made().is_empty(), "nothing refunded");
    let detail = json(app.admin_get(&format!("/admin/pagos/{payment}")).await).await;
    assert_eq!(detail["pago"]["estado"], "COMPLETADA");
    assert!(
        detail.get("reembolsos").is_none(),
        "no refund stored: {detail}"
    );
    let trail = json(
        app.admin_get(&format!("/admin/acciones?objetivo={payment}"))
            .await,
    )
    .await;
    let rows = trail["acciones"].as_array().expect("acciones");
    assert!(
        rows.iter().any(|r| r["detalle"]
            .as_str()
            .is_some_and(|d| d.contains("a\u{FFFD}b") && d.contains("refused (422"))),
        "on-call's refused refund is in the trail: {trail}"
    );

    // The keys were left free: corrected, each request refunds once.
    for (path, token, raw) in [
        (&merchants, API_KEY, r#"{"monto":1000,"motivo":"ab"}"#),
        (&on_call, ADMIN_TOKEN, r#"{"monto":1000,"motivo":"ab"}"#),
    ] {
        assert_eq!(
            send(path.clone(), token, "ref-bad", raw).await.status(),
            201,
            "{raw}"
        );
    }
    assert_eq!(fake.made().len(), 2);
}

async fn a_payment_that_is_not_completada_cannot_be_refunded(backend: Backend) {
    let app = crate::helpers::charging(backend, Charge::declined()).await;
    let answer = app.pay("pay-1", &payment_body()).await;
    assert_eq!(answer.status(), 402);
    let payment = json(answer).await["pago"]["id"]
        .as_str()
        .expect("id")
        .to_owned();

    let refused = refund(&app, &payment, "ref-1", &json!({})).await;
    assert_eq!(refused.status(), 409);
    let problem = json(refused).await;
    assert_eq!(problem["type"], "/problems/payment-not-refundable");
    assert_eq!(problem["estado"], "FALLIDA");
    let refunds_asked = app.gateway_requests_to("/v1/refunds").await.len();
    assert_eq!(refunds_asked, 0);
}

async fn another_merchants_payment_and_refund_are_404(backend: Backend) {
    let (app, fake) = app_with(backend, &[]).await;
    let payment = paid(&app, "pay-1").await;
    let mine = json(refund(&app, &payment, "ref-1", &json!({"monto": 10})).await).await;

    let theirs = refund_as(
        &app,
        OTHER_API_KEY,
        &payment,
        "ref-1",
        &json!({"monto": 10}),
    )
    .await;
    assert_eq!(theirs.status(), 404);
    assert_eq!(json(theirs).await["type"], "/problems/not-found");
    let path = format!("/v1/reembolsos/{}", mine["id"].as_str().expect("id"));
    assert_eq!(app.get_as(OTHER_API_KEY, &path).await.status(), 404);
    assert_eq!(
        app.get_as(OTHER_API_KEY, &format!("/v1/pagos/{payment}/reembolsos"))
            .await
            .status(),
        404
    );
    assert_eq!(
        app.get_as(API_KEY, "/v1/reembolsos/not-a-uuid")
            .await
            .status(),
        404
    );
    let nobody = uuid::Uuid::now_v7();
    assert_eq!(
        refund(&app, &nobody.to_string(), "ref-9", &json!({}))
            .await
            .status(),
        404
    );
    assert_eq!(fake.made().len(), 1);
}

async fn a_refused_refund_is_422_fallido_and_leaves_the_amount_to_refund_again(backend: Backend) {
    let (app, fake) = app_with(backend, &[]).await;
    let payment = paid(&app, "pay-1").await;
    fake.refunding("failed");

    let refused = refund(&app, &payment, "ref-1", &json!({"monto": 250000})).await;
    assert_eq!(refused.status(), 422);
    let refused_bytes = refused.bytes().await.expect("body");
    let problem: Value = serde_json::from_slice(&refused_bytes).expect("json");
    assert_eq!(problem["type"], "/problems/refund-refused");
    assert_eq!(problem["reembolso"]["estado"], "FALLIDO");
    assert_eq!(problem["failureCode"], "expired_or_canceled_card");

    let replay = refund(&app, &payment, "ref-1", &json!({"monto": 250000})).await;
    assert_eq!(replay.status(), 422);
    assert_eq!(replay.bytes().await.expect("body"), refused_bytes);

    // A failed refund took nothing: the whole amount can be refunded again.
    fake.refunding("succeeded");
    let again = refund(&app, &payment, "ref-2", &json!({"monto": 250000})).await;
    assert_eq!(again.status(), 201);
    let pago = json(app.get_as(API_KEY, &format!("/v1/pagos/{payment}")).await).await;
    assert_eq!(pago["montoReembolsado"], 250000);
}

async fn a_refund_that_times_out_is_202_and_the_reconciler_settles_it(backend: Backend) {
    let (app, fake) = app_with(backend, &["--stale-after", "1s"]).await;
    let payment = paid(&app, "pay-1").await;
    // Made at once, answered after the client gave up: every try times out.
    fake.delay(Duration::from_secs(2));

    let answer = refund(&app, &payment, "ref-1", &json!({"monto": 70000})).await;
    assert_eq!(answer.status(), 202);
    let body = json(answer).await;
    assert_eq!(body["estado"], "ENVIADO");
    let id = body["id"].as_str().expect("id").to_owned();
    assert_eq!(fake.made().len(), 1, "every retry carried the same key");
    // In flight, it counts against what is left.
    let over = refund(&app, &payment, "ref-2", &json!({"monto": 180001})).await;
    assert_eq!(over.status(), 422);

    fake.delay(Duration::ZERO);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let report = json(app.admin_post("/admin/reconciliaciones", &json!({})).await).await;
    assert_eq!(report["reembolsos"]["completados"], 1, "{report}");

    let read = json(app.get_as(API_KEY, &format!("/v1/reembolsos/{id}")).await).await;
    assert_eq!(read["estado"], "COMPLETADO");
    assert_eq!(read["gatewayRef"], "re_fake_1");
    assert_eq!(fake.made().len(), 1, "settled by look-up, not sent again");
    // The client's retry now gets the final answer.
    let retry = refund(&app, &payment, "ref-1", &json!({"monto": 70000})).await;
    assert_eq!(retry.status(), 201);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    let pago = json(app.get_as(API_KEY, &format!("/v1/pagos/{payment}")).await).await;
    assert_eq!(pago["montoReembolsado"], 70000);
}

/// A gateway that writes the refund's reference in upper case (the same UUID): its
/// look-up's answer is the refund's own, as its creation's answer is. Before, the look-up
/// read as "no refund": pagos resent with the same key (getting the pending answer again)
/// and, once the key's window closed, sent a refund the gateway had made to on-call's
/// review as "no refund at the provider".
async fn a_pending_refund_the_gateway_lists_with_an_upper_case_reference_is_settled_by_its_look_up(
    backend: Backend,
) {
    let (app, fake) = app_with(backend, &[]).await;
    let payment = paid(&app, "pay-1").await;
    fake.writes_references_upper_case();
    fake.refunding("pending");
    let answer = refund(&app, &payment, "ref-1", &json!({"monto": 70000})).await;
    assert_eq!(answer.status(), 202);
    let body = json(answer).await;
    assert_eq!(body["estado"], "ENVIADO", "{body}");
    let id = body["id"].as_str().expect("id").to_owned();
    let made = fake.made();
    assert_eq!(made.len(), 1);
    assert_eq!(made[0]["reference"], id.to_uppercase());

    fake.settle_all("succeeded");
    let report = json(
        app.admin_post("/admin/reconciliaciones", &json!({ "reembolsoId": id }))
            .await,
    )
    .await;
    assert_eq!(report["reembolsos"]["completados"], 1, "{report}");
    let read = json(app.get_as(API_KEY, &format!("/v1/reembolsos/{id}")).await).await;
    assert_eq!(read["estado"], "COMPLETADO", "{read}");
    assert_eq!(read["gatewayRef"], "re_fake_1");
    let sent = app.gateway_requests_to("/v1/refunds").await;
    assert_eq!(
        sent.iter().filter(|r| r.method.as_str() == "POST").count(),
        1,
        "settled by its look-up, never sent again"
    );
    assert_eq!(fake.made().len(), 1, "one refund made at the gateway");
    let pago = json(app.get_as(API_KEY, &format!("/v1/pagos/{payment}")).await).await;
    assert_eq!(pago["montoReembolsado"], 70000);
}

/// Refunds left in between are reconciled as payments are: `PAGOS_RECONCILE_CONCURRENCY`
/// bounds the refund look-ups a pass has in flight (contract section 1), however many
/// refunds it has claimed, and one pass settles them all, each looked up once.
async fn a_pass_settles_a_refund_backlog_with_no_more_look_ups_in_flight_than_its_concurrency(
    backend: Backend,
) {
    let (app, fake) = app_with(
        backend,
        &["--stale-after", "1s", "--reconcile-concurrency", "2"],
    )
    .await;
    let mut payments = Vec::new();
    for i in 0..7 {
        payments.push(paid(&app, &format!("pay-{i}")).await);
    }
    // Made at once, answered after the client gave up: each refund is left ENVIADO.
    fake.delay(Duration::from_secs(2));
    let answers = futures::future::join_all(payments.iter().enumerate().map(|(i, payment)| {
        let app = &app;
        async move { refund(app, payment, &format!("ref-{i}"), &json!({"monto": 1000})).await }
    }))
    .await;
    let mut refunds = Vec::new();
    for answer in answers {
        assert_eq!(answer.status(), 202);
        refunds.push(json(answer).await["id"].as_str().expect("id").to_owned());
    }
    fake.delay(Duration::ZERO);
    fake.lookup_delay(Duration::from_millis(200));
    let looked_up_before = looked_up(&app).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;

    let report = json(app.admin_post("/admin/reconciliaciones", &json!({})).await).await;
    assert_eq!(report["reembolsos"]["examinados"], 7, "{report}");
    assert_eq!(report["reembolsos"]["completados"], 7, "{report}");
    for id in &refunds {
        let read = json(app.get_as(API_KEY, &format!("/v1/reembolsos/{id}")).await).await;
        assert_eq!(read["estado"], "COMPLETADO", "{id}");
    }
    assert_eq!(fake.made().len(), 7, "settled by look-up, none sent again");
    assert_eq!(
        fake.most_lookups_at_once(),
        2,
        "two refund look-ups at once, never more"
    );
    assert_eq!(
        looked_up(&app).await - looked_up_before,
        7,
        "each refund looked up once"
    );
}

/// The refund look-ups the gateway has received.
async fn looked_up(app: &TestApp) -> usize {
    let requests = app.gateway_requests_to("/v1/refunds").await;
    requests
        .iter()
        .filter(|r| r.method.as_str() == "GET")
        .count()
}

async fn on_call_refunds_with_a_reason_recorded_in_the_audit_trail(backend: Backend) {
    let (app, fake) = app_with(backend, &[]).await;
    let payment = paid(&app, "pay-1").await;
    let path = format!("/admin/pagos/{payment}/reembolsos");
    let post = |body: Value, token: &'static str| {
        let request = app
            .http
            .post(app.url(&path))
            .bearer_auth(token)
            .header("Idempotency-Key", "oncall-1")
            .json(&body);
        async move { request.send().await.expect("sent") }
    };

    assert_eq!(
        post(json!({"monto": 1000}), ADMIN_TOKEN).await.status(),
        422,
        "motivo required"
    );
    assert_eq!(
        post(json!({"monto": 1000, "motivo": "x"}), API_KEY)
            .await
            .status(),
        401
    );
    let done = post(
        json!({"monto": 1000, "motivo": "cliente llamó"}),
        ADMIN_TOKEN,
    )
    .await;
    assert_eq!(done.status(), 201);
    let body = json(done).await;
    assert_eq!(body["estado"], "COMPLETADO");
    assert_eq!(fake.made().len(), 1);

    // The merchant sees it, and its key space is not on-call's.
    let id = body["id"].as_str().expect("id");
    assert_eq!(
        app.get_as(API_KEY, &format!("/v1/reembolsos/{id}"))
            .await
            .status(),
        200
    );
    let mine = refund(&app, &payment, "oncall-1", &json!({"monto": 1000})).await;
    assert_eq!(mine.status(), 201);
    assert_ne!(json(mine).await["id"], body["id"]);
    assert_eq!(fake.made().len(), 2);

    let trail =
        pagos::saga::refund::store::trail(&app.db, uuid::Uuid::parse_str(id).expect("uuid"))
            .await
            .expect("trail");
    assert!(
        trail[0].reason.contains("admin") && trail[0].reason.contains("cliente llamó"),
        "{:?}",
        trail[0]
    );
    assert_eq!(
        trail.last().map(|t| t.to_state.as_str()),
        Some("COMPLETADO")
    );
}

on_both_databases!(
    twenty_concurrent_partial_refunds_never_exceed_the_payment,
    a_second_request_with_the_key_while_the_first_is_in_flight_is_409,
);

async fn twenty_concurrent_partial_refunds_never_exceed_the_payment(backend: Backend) {
    let (app, fake) = app_with(backend, &[]).await;
    twenty_partial_refunds_at_once(&app, &fake).await;
}

/// A DBA may set another isolation level as the database's default (`ALTER DATABASE …
/// SET default_transaction_isolation`, or the role's). Under repeatable read a refund
/// waiting for another's lock would sum what was refunded from a snapshot taken before
/// that refund committed, and both would be registered: pagos' sessions keep read
/// committed whatever the server's default, and the same race refunds no more.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_refunds_fit_the_payment_whatever_isolation_the_database_defaults_to() {
    let Some(backend) = Backend::postgres() else {
        return;
    };
    for level in ["repeatable read", "serializable"] {
        let app = Spawn::new(backend.clone())
            .postgres_default("default_transaction_isolation", level)
            .start()
            .await;
        let fake = FakeRefunds::default();
        fake.mount(app.gateway()).await;
        twenty_partial_refunds_at_once(&app, &fake).await;
    }
}

/// Twenty refunds of 30000 asked at once of a 250000 payment: exactly the eight that fit
/// are made, each once, the rest refused as over what is left.
async fn twenty_partial_refunds_at_once(app: &TestApp, fake: &FakeRefunds) {
    let payment = paid(app, "pay-1").await;
    // A slow gateway, so the refunds really overlap.
    fake.delay(Duration::from_millis(100));

    // 20 × 30000 = 600000 asked of 250000: at most 8 fit.
    let body = json!({"monto": 30000});
    let keys: Vec<String> = (0..20).map(|i| format!("race-{i}")).collect();
    let answers =
        futures::future::join_all(keys.iter().map(|k| refund(app, &payment, k, &body))).await;
    let (mut refunded, mut refused) = (Vec::new(), 0);
    for answer in answers {
        match answer.status().as_u16() {
            201 => refunded.push(json(answer).await["id"].as_str().expect("id").to_owned()),
            422 => {
                let problem = json(answer).await;
                assert_eq!(problem["type"], "/problems/refund-exceeds-remaining");
                refused += 1;
            }
            other => panic!("unexpected status {other}: {}", json(answer).await),
        }
    }
    assert_eq!(refunded.len() + refused, 20);
    assert_eq!(refunded.len(), 8, "every refund that fits, and no more");
    let made = fake.made();
    let sum: i64 = made
        .iter()
        .map(|r| r["amount"].as_i64().expect("amount"))
        .sum();
    assert!(sum <= 250000, "the gateway refunded {sum}");
    let mut seen: Vec<String> = made
        .iter()
        .map(|r| r["reference"].as_str().expect("reference").to_owned())
        .collect();
    seen.sort();
    refunded.sort();
    assert_eq!(
        seen, refunded,
        "the gateway saw exactly the refunds not refused"
    );
    let pago = json(app.get_as(API_KEY, &format!("/v1/pagos/{payment}")).await).await;
    assert_eq!(pago["montoReembolsado"], 240000);
}

async fn a_second_request_with_the_key_while_the_first_is_in_flight_is_409(backend: Backend) {
    let (app, fake) = app_with(backend, &["--gateway-timeout", "10s"]).await;
    let payment = paid(&app, "pay-1").await;
    fake.delay(Duration::from_secs(3));

    let body = json!({"monto": 1000});
    let first = refund(&app, &payment, "ref-1", &body);
    // Once the first is at the gateway (its key taken), well before its answer.
    let second = async {
        crate::helpers::until("the first refund at the gateway", || {
            !fake.made().is_empty()
        })
        .await;
        refund(&app, &payment, "ref-1", &body).await
    };
    let (first, second) = tokio::join!(first, second);
    assert_eq!(first.status(), 201);
    assert_eq!(second.status(), 409);
    assert!(second.headers().contains_key("retry-after"));
    assert_eq!(json(second).await["type"], "/problems/request-in-flight");
    assert_eq!(fake.made().len(), 1);
}

on_both_databases!(a_pending_refund_is_settled_by_refund_events_applied_once_and_in_order);

async fn a_pending_refund_is_settled_by_refund_events_applied_once_and_in_order(backend: Backend) {
    use crate::compensation::{SECRET, deliver_event};
    let (app, fake) = app_with(backend, &["--webhook-secret", SECRET]).await;
    let payment = paid(&app, "pay-1").await;
    fake.refunding("pending");
    let answer = refund(&app, &payment, "ref-1", &json!({"monto": 5000})).await;
    assert_eq!(answer.status(), 202);
    let body = json(answer).await;
    assert_eq!(body["estado"], "ENVIADO");
    assert_eq!(body["gatewayRef"], "re_fake_1");
    let id = body["id"].as_str().expect("id").to_owned();
    let mut made = fake.made()[0].clone();

    made["status"] = json!("succeeded");
    assert_eq!(
        deliver_event(&app, "evt_r1", "refund.updated", 2, made.clone()).await,
        "aplicado"
    );
    assert_eq!(
        deliver_event(&app, "evt_r1", "refund.updated", 2, made.clone()).await,
        "duplicado"
    );
    let mut older = made.clone();
    older["status"] = json!("pending");
    assert_eq!(
        deliver_event(&app, "evt_r0", "refund.updated", 1, older).await,
        "obsoleto"
    );
    let read = json(app.get_as(API_KEY, &format!("/v1/reembolsos/{id}")).await).await;
    assert_eq!(read["estado"], "COMPLETADO");
    // The key's answer was frozen when the event settled it.
    let retry = refund(&app, &payment, "ref-1", &json!({"monto": 5000})).await;
    assert_eq!(retry.status(), 201);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");

    // A refund that fails after it succeeded (Stripe's): on-call is told, never silently.
    made["status"] = json!("failed");
    made["failureCode"] = json!("charge_for_pending_refund_disputed");
    assert_eq!(
        deliver_event(&app, "evt_r2", "refund.updated", 3, made).await,
        "revision_manual"
    );
    let read = json(app.get_as(API_KEY, &format!("/v1/reembolsos/{id}")).await).await;
    assert_eq!(read["estado"], "REVISION_MANUAL");
    let pago = json(app.get_as(API_KEY, &format!("/v1/pagos/{payment}")).await).await;
    assert_eq!(pago["montoReembolsado"], 0, "only COMPLETADO refunds count");
    assert_eq!(fake.made().len(), 1);

    // On-call checks the provider, which shows the refund failed as its last event said,
    // and settles it; the trail says who and why.
    fake.settle_all("failed");
    let resolve = |body: Value| {
        let request = app
            .http
            .post(app.url(&format!("/admin/reembolsos/{id}/resolucion")))
            .bearer_auth(ADMIN_TOKEN)
            .json(&body);
        async move { request.send().await.expect("sent") }
    };
    assert_eq!(
        resolve(json!({"estado": "FALLIDO", "motivo": " "}))
            .await
            .status(),
        422
    );
    let resolved =
        resolve(json!({"estado": "FALLIDO", "motivo": "dashboard: refund failed, card closed"}))
            .await;
    assert_eq!(resolved.status(), 200);
    let detail = json(resolved).await;
    assert_eq!(detail["reembolso"]["estado"], "FALLIDO");
    let last = crate::helpers::last_transition(&detail);
    assert_eq!(last["quien"], "admin");
    assert!(crate::helpers::text_has(&last, "motivo", "card closed"));
    assert_eq!(
        resolve(json!({"estado": "COMPLETADO", "motivo": "again"}))
            .await
            .status(),
        409,
        "only a refund under review is resolved by hand"
    );
    // FALLIDO: its amount can be refunded again.
    let again = refund(&app, &payment, "ref-2", &json!({})).await;
    assert_eq!(again.status(), 202, "the fake still answers pending");
    assert_eq!(json(again).await["monto"], 250000);
}

on_both_databases!(the_openapi_document_describes_the_refund_endpoints);

async fn the_openapi_document_describes_the_refund_endpoints(backend: Backend) {
    let app = Spawn::new(backend).sandbox().start().await;
    let doc = app.openapi().await;
    for path in ["/v1/pagos/{id}/reembolsos", "/admin/pagos/{id}/reembolsos"] {
        let post = &doc["paths"][path]["post"];
        let key = crate::helpers::header_parameter(post, "Idempotency-Key", path);
        assert_eq!(key["required"], true, "{path}");
        crate::helpers::assert_responses(post, &["201", "202", "404", "409", "422"], path);
    }
    // On-call's refund: refused to a lector (403), refused unrecorded (503).
    crate::helpers::assert_responses(
        &doc["paths"]["/admin/pagos/{id}/reembolsos"]["post"],
        &["403", "503"],
        "on-call's refund",
    );
    assert!(doc["paths"]["/v1/pagos/{id}/reembolsos"]["get"].is_object());
    assert!(doc["paths"]["/v1/reembolsos/{id}"]["get"].is_object());
    let resolution = &doc["paths"]["/admin/reembolsos/{id}/resolucion"]["post"];
    crate::helpers::assert_responses(
        resolution,
        &["200", "403", "404", "409", "422", "503"],
        "refund resolution",
    );
    let body = &doc["components"]["schemas"]["ResolucionReembolso"]["properties"];
    for field in ["estado", "motivo", "gatewayRef", "contraProveedor"] {
        assert!(body[field].is_object(), "ResolucionReembolso.{field}");
    }
    let schema = &doc["components"]["schemas"]["Reembolso"]["properties"];
    for field in [
        "id",
        "pagoId",
        "monto",
        "moneda",
        "estado",
        "motivo",
        "gatewayRef",
        "creadoEn",
        "actualizadoEn",
    ] {
        assert!(schema[field].is_object(), "Reembolso.{field}");
    }
    assert!(doc["components"]["schemas"]["Pago"]["properties"]["montoReembolsado"].is_object());
}

on_both_databases!(
    the_client_refunds_with_one_key_per_intent_kept_until_the_refund_settles,
    pagos_refund_refunds_and_prints_the_refund,
);

async fn the_client_refunds_with_one_key_per_intent_kept_until_the_refund_settles(
    backend: Backend,
) {
    use pagos_client::{Client, Journal, PayPolicy, RefundIntent, RefundOutcome, RefundRequest};
    let (app, fake) = app_with(backend, &["--stale-after", "4s", "--gateway-retries", "0"]).await;
    let payment = paid(&app, "pay-1").await;
    let dir = tempfile::tempdir().expect("dir");
    let journal = Journal::open(dir.path().join("journal.db"))
        .await
        .expect("journal");
    let client = Client::new(&app.url("/"), API_KEY)
        .expect("client")
        .with_journal(journal)
        .with_policy(PayPolicy {
            deadline: Duration::from_secs(2),
            min_delay: Duration::from_millis(100),
            max_delay: Duration::from_millis(500),
            ..PayPolicy::default()
        });
    let payment_id = uuid::Uuid::parse_str(&payment).expect("uuid");
    let request = RefundRequest::new(payment_id, Some(40000), Some("devolución")).expect("valid");
    assert!(RefundRequest::new(payment_id, Some(0), None).is_err());

    // The gateway makes the refund and answers too late: 202, kept in the journal.
    fake.delay(Duration::from_secs(2));
    let intent = RefundIntent::new(request.clone());
    match client.refund(&intent).await.expect("an outcome") {
        RefundOutcome::Pending(refund) => assert_eq!(refund.state.as_str(), "ENVIADO"),
        other => panic!("expected pending, got {other:?}"),
    }
    let kept = client
        .kept_refund(&request)
        .await
        .expect("journal")
        .expect("kept");
    assert_eq!(
        kept.key(),
        intent.key(),
        "the same refund asked again: the same key"
    );
    let stored = async || {
        pagos::saga::refund::store::of_payment(&app.db, payment_id)
            .await
            .expect("read")
            .remove(0)
    };
    let waiting = stored().await;
    assert!(
        waiting
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("outcome unknown")),
        "why it waits: {:?}",
        waiting.last_error
    );
    assert!(waiting.last_error_at.is_some());

    // Once the refund is due, asking again settles it from the gateway's look-up.
    fake.delay(Duration::ZERO);
    tokio::time::sleep(Duration::from_secs(4)).await;
    match client.refund(&kept).await.expect("an outcome") {
        RefundOutcome::Refunded(refund) => {
            assert_eq!(refund.amount, 40000);
            assert_eq!(refund.state.as_str(), "COMPLETADO");
        }
        other => panic!("expected refunded, got {other:?}"),
    }
    let settled = stored().await;
    assert_eq!((settled.last_error, settled.last_error_at), (None, None));
    assert!(
        client
            .kept_refund(&request)
            .await
            .expect("journal")
            .is_none(),
        "let go"
    );
    assert_eq!(fake.made().len(), 1, "one refund at the gateway");
}

async fn pagos_refund_refunds_and_prints_the_refund(backend: Backend) {
    let (app, fake) = app_with(backend, &[]).await;
    let payment = paid(&app, "pay-1").await;
    let dir = tempfile::tempdir().expect("dir");
    let journal = dir.path().join("journal.db");
    let (url, journal) = (app.url("/"), journal.to_str().expect("utf-8").to_owned());
    let done = tokio::process::Command::new(crate::process::BIN)
        .args([
            "refund",
            "--url",
            &url,
            "--pago",
            &payment,
            "--monto",
            "60000",
            "--motivo",
            "solicitud del cliente",
            "--journal",
            &journal,
        ])
        .env("PAGOS_API_KEY", API_KEY)
        .output()
        .await
        .expect("pagos refund runs");
    assert_eq!(
        done.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    let refund: Value = serde_json::from_slice(&done.stdout).expect("the refund as JSON");
    assert_eq!(refund["estado"], "COMPLETADO");
    assert_eq!(refund["monto"], 60000);
    assert_eq!(refund["motivo"], "solicitud del cliente");
    assert!(
        !String::from_utf8_lossy(&done.stderr).contains(API_KEY),
        "the API key is never printed"
    );
    assert_eq!(fake.made().len(), 1);
}

on_both_databases!(on_call_reconciles_one_refund_now_without_waiting_for_it_to_be_due);

async fn on_call_reconciles_one_refund_now_without_waiting_for_it_to_be_due(backend: Backend) {
    let (app, fake) = app_with(backend, &[]).await;
    let payment = paid(&app, "pay-1").await;
    fake.delay(Duration::from_secs(2));
    let answer = refund(&app, &payment, "ref-1", &json!({"monto": 1000})).await;
    assert_eq!(answer.status(), 202);
    let id = json(answer).await["id"].as_str().expect("id").to_owned();
    fake.delay(Duration::ZERO);

    // Not due for PAGOS_STALE_AFTER (30 s): a pass leaves it, "this one now" does not.
    let pass = json(app.admin_post("/admin/reconciliaciones", &json!({})).await).await;
    assert!(pass.get("reembolsos").is_none(), "{pass}");
    let report = json(
        app.admin_post("/admin/reconciliaciones", &json!({ "reembolsoId": id }))
            .await,
    )
    .await;
    assert_eq!(report["reembolsos"]["completados"], 1, "{report}");
    let missing = app
        .admin_post(
            "/admin/reconciliaciones",
            &json!({ "reembolsoId": uuid::Uuid::now_v7() }),
        )
        .await;
    assert_eq!(missing.status(), 404);
    assert_eq!(fake.made().len(), 1);
}

/// A refund that settles is an event of the outbox, written with its move: the merchant
/// sees `reembolso.fallido` and `reembolso.completado` with the refund as it was answered.
async fn refunds_that_settle_tell_the_merchant_with_an_event_of_the_refund(backend: Backend) {
    let (app, fake) = app_with(backend, &[]).await;
    let payment = paid(&app, "pay-1").await;
    fake.refunding("failed");
    let refused = refund(&app, &payment, "ref-1", &json!({"monto": 1000})).await;
    assert_eq!(refused.status(), 422);
    let refused_id = json(refused).await["reembolso"]["id"]
        .as_str()
        .expect("id")
        .to_owned();
    fake.refunding("succeeded");
    let made = refund(&app, &payment, "ref-2", &json!({"monto": 2000})).await;
    assert_eq!(made.status(), 201);
    let made: Value = json(made).await;

    let page = json(app.get_as(API_KEY, "/v1/eventos?limite=50").await).await;
    let events: Vec<&Value> = page["eventos"]
        .as_array()
        .expect("eventos")
        .iter()
        .filter(|e| {
            e["tipo"]
                .as_str()
                .is_some_and(|t| t.starts_with("reembolso."))
        })
        .collect();
    assert_eq!(events.len(), 2, "{page}");
    assert_eq!(events[0]["tipo"], "reembolso.fallido");
    assert_eq!(events[0]["datos"]["id"], refused_id.as_str());
    assert_eq!(events[0]["datos"]["estado"], "FALLIDO");
    assert_eq!(events[1]["tipo"], "reembolso.completado");
    assert_eq!(events[1]["datos"], made, "the refund as it was answered");
    assert!(events[1]["secuencia"].as_u64().expect("secuencia") > 0);
    // The payment itself did not change state: no new payment event.
    let payment_events = page["eventos"]
        .as_array()
        .expect("eventos")
        .iter()
        .filter(|e| e["tipo"].as_str().is_some_and(|t| t.starts_with("pago.")))
        .count();
    assert_eq!(payment_events, 1, "only the payment's own pago.completado");
}

on_both_databases!(a_retry_of_a_refund_its_request_sent_to_review_is_answered_its_state);

/// The gateway answers a refund for another amount than asked: its request sends it to
/// REVISION_MANUAL (202). Nobody works on it until on-call decides, so a retry with the
/// same key is answered its state (202, replayed), not 409 "still in flight" for what is
/// left of the first request's lease, and nothing is sent again.
async fn a_retry_of_a_refund_its_request_sent_to_review_is_answered_its_state(backend: Backend) {
    let app = Spawn::new(backend).start().await;
    charges()
        .respond_with(Charge::succeeded())
        .mount(app.gateway())
        .await;
    let payment = paid(&app, "pay-1").await;
    let sent = Arc::new(Mutex::new(0));
    let count = sent.clone();
    mount_route(
        app.gateway(),
        "POST",
        "/v1/refunds",
        move |request: &Request| {
            *count.lock().unwrap_or_else(|e| e.into_inner()) += 1;
            let body: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
            let amount = body["amount"].as_i64().unwrap_or(0) - 1;
            ResponseTemplate::new(201).set_body_json(json!({
                "id": "re_short_1", "status": "succeeded", "charge": body["charge"],
                "amount": amount, "currency": body["currency"], "reference": body["reference"],
            }))
        },
    )
    .await;
    let first = refund(&app, &payment, "ref-1", &json!({"monto": 5000})).await;
    assert_eq!(first.status(), 202);
    let first = json(first).await;
    assert_eq!(first["estado"], "REVISION_MANUAL", "{first}");

    let retry = refund(&app, &payment, "ref-1", &json!({"monto": 5000})).await;
    assert_eq!(retry.status(), 202, "answered its state, not 409");
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(
        retry.headers()["retry-after"],
        "300",
        "it waits for on-call, not for a look-up pagos will never make"
    );
    let again = json(retry).await;
    assert_eq!(again["id"], first["id"]);
    assert_eq!(again["estado"], "REVISION_MANUAL");
    assert_eq!(
        *sent.lock().unwrap_or_else(|e| e.into_inner()),
        1,
        "sent once"
    );
}

on_both_databases!(a_payment_event_tells_what_was_refunded_of_it_as_its_read_does);

/// A payment with a refund of 50,000 COMPLETADO is contradicted by the provider (a charge
/// event says it was declined): its `pago.revision_manual` event shows the payment as
/// `GET /v1/pagos/{id}` does, `montoReembolsado` 50,000 — never 0, which a merchant's
/// ledger updated from events would take for true.
async fn a_payment_event_tells_what_was_refunded_of_it_as_its_read_does(backend: Backend) {
    use crate::compensation::{SECRET, deliver_event};
    let (app, _fake) = app_with(backend, &["--webhook-secret", SECRET]).await;
    let payment = paid(&app, "pay-1").await;
    let answer = refund(&app, &payment, "ref-1", &json!({"monto": 50000})).await;
    assert_eq!(answer.status(), 201);
    let read = json(app.get_as(API_KEY, &format!("/v1/pagos/{payment}")).await).await;
    assert_eq!(read["montoReembolsado"], 50000);

    let charge = json!({"id": read["gatewayRef"], "status": "declined", "amount": 250000,
        "currency": "COP", "reference": payment, "declineCode": "fraudulent"});
    assert_eq!(
        deliver_event(&app, "evt_c1", "charge.updated", 5, charge).await,
        "revision_manual"
    );
    let told = crate::compensation::revision_events(&app, &payment).await;
    assert_eq!(told.len(), 1);
    let read = json(app.get_as(API_KEY, &format!("/v1/pagos/{payment}")).await).await;
    assert_eq!(read["estado"], "REVISION_MANUAL");
    assert_eq!(told[0]["datos"]["montoReembolsado"], 50000, "{}", told[0]);
    assert_eq!(
        told[0]["datos"]["montoReembolsado"],
        read["montoReembolsado"]
    );
}

/// A refund the reconciler sends to REVISION_MANUAL because its give-up horizon passed
/// and the provider cannot be asked keeps the look-up's error as its last error: on-call,
/// paged, reads why.
async fn a_refund_sent_to_review_because_the_provider_cannot_be_asked_keeps_the_look_ups_error(
    backend: Backend,
) {
    use pagos::entities::refund;
    use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, sea_query::Expr};
    let (app, fake) = app_with(backend, &[]).await;
    let payment = paid(&app, "pay-1").await;
    fake.refunding("pending");
    let answer = refund(&app, &payment, "ref-paged", &json!({"monto": 1000})).await;
    assert_eq!(answer.status(), 202);
    let id = json(answer).await["id"].as_str().expect("id").to_owned();
    let id = uuid::Uuid::parse_str(&id).expect("uuid");
    let stored = async || {
        pagos::saga::refund::store::find(&app.db, id)
            .await
            .expect("read")
            .expect("the refund")
    };
    assert_eq!(stored().await.last_error, None, "pending is no error");
    // Registered past the give-up horizon (PAGOS_GIVE_UP_AFTER, 24h).
    refund::Entity::update_many()
        .col_expr(
            refund::Column::CreatedAt,
            Expr::value(pagos::db::now() - chrono::TimeDelta::days(2)),
        )
        .filter(refund::Column::Id.eq(id))
        .exec(&app.db)
        .await
        .expect("backdated");

    fake.fail_lookups(true);
    let answer = app
        .admin_post("/admin/reconciliaciones", &json!({"reembolsoId": id}))
        .await;
    assert_eq!(answer.status(), 200);
    let report = json(answer).await;
    assert_eq!(report["reembolsos"]["revisionManual"], 1, "{report}");
    let paged = stored().await;
    assert_eq!(paged.state.as_str(), "REVISION_MANUAL");
    assert!(
        paged
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("provider lookup failed")),
        "why on-call was paged: {:?}",
        paged.last_error
    );
    assert!(paged.last_error_at.is_some());
}

on_both_databases!(a_refund_without_a_good_idempotency_key_is_told_one_key_per_refund);

/// A refund whose `Idempotency-Key` is missing, malformed or repeated is told to send
/// one key per refund, on the merchant's endpoint and on-call's alike; a payment is
/// still told one per payment. Before, a refund was told "one key … per payment and
/// send it on every retry of that payment": a merchant following it would send a
/// payment's key with every refund of it, and its second refund would be a replay of
/// the first.
async fn a_refund_without_a_good_idempotency_key_is_told_one_key_per_refund(backend: Backend) {
    let (app, fake) = app_with(backend, &[]).await;
    let payment = paid(&app, "pay-1").await;
    let per_refund = "Generate one key (a UUID v4) per refund and send it on every retry of \
                      that refund.";
    for (path, token) in [
        (format!("/v1/pagos/{payment}/reembolsos"), API_KEY),
        (format!("/admin/pagos/{payment}/reembolsos"), ADMIN_TOKEN),
    ] {
        let keys: [&[&str]; 3] = [&[], &["not a key"], &["k-1", "k-2"]];
        for (keys, slug) in keys.into_iter().zip([
            "idempotency-key-missing",
            "idempotency-key-malformed",
            "idempotency-key-malformed",
        ]) {
            let mut request = app
                .http
                .post(app.url(&path))
                .bearer_auth(token)
                .json(&json!({"monto": 1000, "motivo": "cliente llamó"}));
            for key in keys {
                request = request.header("Idempotency-Key", *key);
            }
            let answer = request.send().await.expect("sent");
            assert_eq!(answer.status(), 400, "{path} with {keys:?}");
            let body = json(answer).await;
            assert_eq!(body["type"], format!("/problems/{slug}"), "{body}");
            let detail = body["detail"].as_str().expect("detail");
            assert!(
                detail.ends_with(per_refund),
                "{path} with {keys:?}: {detail}"
            );
            assert!(!detail.contains("payment"), "{detail}");
        }
    }
    assert!(fake.made().is_empty(), "nothing refunded");

    let answer = app
        .http
        .post(app.url("/v1/pagos"))
        .bearer_auth(API_KEY)
        .json(&payment_body())
        .send()
        .await
        .expect("sent");
    assert_eq!(answer.status(), 400);
    assert!(
        json(answer).await["detail"]
            .as_str()
            .is_some_and(|d| d.ends_with(
                "Generate one key (a UUID v4) per payment and send it on every retry of that \
                 payment."
            )),
        "a payment is still told one key per payment"
    );
}

on_both_databases!(
    a_sent_refund_reported_succeeded_under_another_provider_refund_goes_to_review,
    a_completed_refund_reported_with_a_second_provider_refund_goes_to_review,
    a_report_of_another_charges_refund_never_settles_a_refund_whose_answer_was_lost,
    the_refunds_own_report_settles_it_whatever_another_provider_refund_reported,
);

/// An app hearing the reference gateway's signed events, and a refund of 50000 of a paid
/// payment the gateway answered pending (`ENVIADO`, `gatewayRef` `re_fake_1`): the
/// refund's id and what the gateway made (its own provider refund, pending).
async fn sent_refund(backend: Backend) -> (TestApp, FakeRefunds, String, String, Value) {
    let (app, fake) = app_with(backend, &["--webhook-secret", crate::compensation::SECRET]).await;
    let payment = paid(&app, "pay-1").await;
    fake.refunding("pending");
    let answer = refund(&app, &payment, "ref-1", &json!({"monto": 50000})).await;
    assert_eq!(answer.status(), 202);
    let body = json(answer).await;
    assert_eq!(body["estado"], "ENVIADO", "{body}");
    assert_eq!(body["gatewayRef"], "re_fake_1", "{body}");
    let id = body["id"].as_str().expect("id").to_owned();
    let made = fake.made()[0].clone();
    (app, fake, payment, id, made)
}

/// `made` (a provider refund) as another one: `id`, `status`.
fn another(made: &Value, id: &str, status: &str) -> Value {
    let mut other = made.clone();
    other["id"] = json!(id);
    other["status"] = json!(status);
    other
}

/// The provider reports another refund of `made`'s charge, `re_second`, succeeded under
/// the same reference (`evt_second`, sequence 1): the refund goes to review.
async fn second_refund_reported_succeeded(app: &TestApp, made: &Value) {
    let second = another(made, "re_second", "succeeded");
    assert_eq!(
        crate::compensation::deliver_event(app, "evt_second", "refund.updated", 1, second).await,
        "revision_manual"
    );
}

/// What the merchant reads of refund `id` sent to review by a report: `REVISION_MANUAL`
/// with `gateway_ref` (`null` for none), nothing refunded of `payment`, told the refund
/// events `told`; and the last reason of its audit trail, which names each of `names`.
async fn reads_in_review(
    app: &TestApp,
    payment: &str,
    id: &str,
    gateway_ref: Value,
    told: &[&str],
    names: &[&str],
) {
    let read = json(app.get_as(API_KEY, &format!("/v1/reembolsos/{id}")).await).await;
    assert_eq!(read["estado"], "REVISION_MANUAL", "{read}");
    assert_eq!(read["gatewayRef"], gateway_ref, "{read}");
    let pago = json(app.get_as(API_KEY, &format!("/v1/pagos/{payment}")).await).await;
    assert_eq!(
        pago["montoReembolsado"], 0,
        "only COMPLETADO refunds count: {pago}"
    );
    assert_eq!(crate::refund_resolution::refund_events(app).await, told);
    let why = crate::refund_resolution::trail(app, id)
        .await
        .pop()
        .expect("a row");
    for said in names {
        assert!(why.contains(said), "{said} in {why}");
    }
}

/// A refund the gateway answered pending as `re_fake_1`, then reported succeeded under
/// another provider refund id carrying its reference. Before, that report settled it
/// `COMPLETADO`, overwrote its `gatewayRef` with the other id, and told the merchant
/// `reembolso.completado`; re_fake_1 succeeding later changed nothing: a second refund at
/// the provider was never surfaced. Now it goes to `REVISION_MANUAL`, keeps its own
/// `gatewayRef`, and its audit row names the other provider refund.
async fn a_sent_refund_reported_succeeded_under_another_provider_refund_goes_to_review(
    backend: Backend,
) {
    use crate::compensation::deliver_event;
    let (app, _fake, payment, id, made) = sent_refund(backend).await;

    second_refund_reported_succeeded(&app, &made).await;
    reads_in_review(
        &app,
        &payment,
        &id,
        json!("re_fake_1"),
        &["reembolso.revision_manual"],
        &["evt_second", "re_second", "re_fake_1", "2 refunds"],
    )
    .await;

    // Its own refund's events have a sequence of their own (the contract's is per
    // provider refund): not stale for the other's, and kept for on-call's resolution.
    let mut own = made.clone();
    own["status"] = json!("succeeded");
    assert_eq!(
        deliver_event(&app, "evt_own", "refund.updated", 1, own).await,
        "sin_cambios",
        "under review: on-call decides"
    );
    let reported = pagos::webhooks::refunds::reported_for_refund(
        &app.db,
        uuid::Uuid::parse_str(&id).expect("uuid"),
    )
    .await
    .expect("reports");
    let mut ids: Vec<&str> = reported
        .iter()
        .map(|r| r.provider_refund_id.as_str())
        .collect();
    ids.sort_unstable();
    assert_eq!(ids, ["re_fake_1", "re_second"]);
    let read = json(app.get_as(API_KEY, &format!("/v1/reembolsos/{id}")).await).await;
    assert_eq!(read["estado"], "REVISION_MANUAL", "{read}");
}

/// A refund settled `COMPLETADO` by its own provider refund's event, then reported with a
/// second provider refund that succeeded, its sequence lower than the first's. Before, the
/// second was `obsoleto` (the sequence was kept per pagos refund) or, with a higher one,
/// `sin_cambios`: `COMPLETADO` stood whatever the report's id, charge or amount. Now the
/// second refund at the provider sends it to `REVISION_MANUAL`, and the merchant is told.
async fn a_completed_refund_reported_with_a_second_provider_refund_goes_to_review(
    backend: Backend,
) {
    use crate::compensation::deliver_event;
    let (app, _fake, payment, id, made) = sent_refund(backend).await;
    let mut own = made.clone();
    own["status"] = json!("succeeded");
    assert_eq!(
        deliver_event(&app, "evt_own", "refund.updated", 5, own).await,
        "aplicado"
    );
    let read = json(app.get_as(API_KEY, &format!("/v1/reembolsos/{id}")).await).await;
    assert_eq!(read["estado"], "COMPLETADO", "{read}");

    second_refund_reported_succeeded(&app, &made).await;
    reads_in_review(
        &app,
        &payment,
        &id,
        json!("re_fake_1"),
        &["reembolso.completado", "reembolso.revision_manual"],
        &["re_second", "re_fake_1", "was COMPLETADO"],
    )
    .await;
}

/// A refund whose answer was lost (`ENVIADO`, no `gatewayRef`), reported succeeded by a
/// provider refund of another charge that carries its reference. Before, that report
/// settled it `COMPLETADO` with the other refund's id. Now it never settles it: it goes to
/// `REVISION_MANUAL` with no `gatewayRef` of that refund, and the merchant is never told
/// `reembolso.completado`.
async fn a_report_of_another_charges_refund_never_settles_a_refund_whose_answer_was_lost(
    backend: Backend,
) {
    use crate::compensation::deliver_event;
    // The reconciler never looks at the refund here (it would find its own refund at the
    // provider and settle it first, on a loaded machine): only the report is tested.
    let (app, fake) = app_with(
        backend,
        &[
            "--webhook-secret",
            crate::compensation::SECRET,
            "--stale-after",
            "1h",
        ],
    )
    .await;
    let payment = paid(&app, "pay-1").await;
    // Made at once, answered after the client gave up: its answer is lost.
    fake.delay(Duration::from_secs(2));
    let answer = refund(&app, &payment, "ref-1", &json!({"monto": 50000})).await;
    assert_eq!(answer.status(), 202);
    let body = json(answer).await;
    assert_eq!(body["estado"], "ENVIADO", "{body}");
    assert!(body["gatewayRef"].is_null(), "{body}");
    let id = body["id"].as_str().expect("id").to_owned();
    fake.delay(Duration::ZERO);
    let made = fake.made()[0].clone();

    let mut foreign = another(&made, "re_zzz", "succeeded");
    foreign["charge"] = json!("ch_someone_else");
    assert_eq!(
        deliver_event(&app, "evt_zzz", "refund.updated", 1, foreign).await,
        "revision_manual"
    );
    reads_in_review(
        &app,
        &payment,
        &id,
        Value::Null,
        &["reembolso.revision_manual"],
        &[
            "re_zzz",
            "ch_someone_else",
            made["charge"].as_str().expect("charge"),
        ],
    )
    .await;
}

/// The refund's own provider refund still settles it, whatever another provider refund
/// carrying its reference reported: a pending one with a higher sequence first (before,
/// the sequence was kept per pagos refund, and the own refund's `succeeded` was
/// `obsoleto`: the refund stayed `ENVIADO`), and a failed one after (no money moved: the
/// refund stays `COMPLETADO`; before, it went to review as contradicting it).
async fn the_refunds_own_report_settles_it_whatever_another_provider_refund_reported(
    backend: Backend,
) {
    use crate::compensation::deliver_event;
    let (app, _fake, payment, id, made) = sent_refund(backend).await;
    assert_eq!(
        deliver_event(
            &app,
            "evt_other_1",
            "refund.updated",
            7,
            another(&made, "re_other", "pending")
        )
        .await,
        "sin_cambios"
    );
    let mut own = made.clone();
    own["status"] = json!("succeeded");
    assert_eq!(
        deliver_event(&app, "evt_own", "refund.updated", 2, own).await,
        "aplicado"
    );
    let read = json(app.get_as(API_KEY, &format!("/v1/reembolsos/{id}")).await).await;
    assert_eq!(read["estado"], "COMPLETADO", "{read}");
    assert_eq!(read["gatewayRef"], "re_fake_1", "{read}");

    assert_eq!(
        deliver_event(
            &app,
            "evt_other_2",
            "refund.updated",
            8,
            another(&made, "re_other", "failed")
        )
        .await,
        "sin_cambios"
    );
    let read = json(app.get_as(API_KEY, &format!("/v1/reembolsos/{id}")).await).await;
    assert_eq!(read["estado"], "COMPLETADO", "{read}");
    let pago = json(app.get_as(API_KEY, &format!("/v1/pagos/{payment}")).await).await;
    assert_eq!(pago["montoReembolsado"], 50000, "{pago}");
    assert_eq!(
        crate::refund_resolution::refund_events(&app).await,
        ["reembolso.completado"]
    );
}
