//! Gateway webhooks: signed, delivered at least once and in any order, applied exactly
//! once. Payments are made pending through `POST /v1/pagos` (wiremock answers `pending`),
//! then settled by signed events sent over real HTTP.

use crate::helpers::{Backend, Charge, Spawn, TestApp, json, payment_body};
use crate::on_both_databases;
use pagos::entities::{payment_transition, webhook_charge};
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, QueryOrder};
use serde_json::{Value, json};

on_both_databases!(
    one_event_delivered_ten_times_in_a_row_moves_the_payment_once,
    one_event_delivered_twenty_times_at_once_moves_the_payment_once,
    sequence_3_delivered_before_sequence_2_stands,
    twenty_events_of_one_charge_at_once_leave_the_highest_sequence_standing,
    a_pending_payment_settled_by_a_webhook_replays_its_frozen_201,
    a_webhook_that_settles_a_payment_while_its_request_waits_on_the_gateway_is_what_the_request_answers,
    a_declined_event_fails_a_pending_payment_and_freezes_its_402,
    bad_signatures_are_refused_with_401_and_nothing_recorded,
    a_signed_body_that_is_not_an_event_is_refused_with_400_and_nothing_recorded,
    webhooks_answer_401_while_no_secret_is_set,
    events_of_a_provider_the_payments_do_not_go_through_are_refused_whatever_their_signature,
    a_contradicting_event_sends_a_final_payment_to_manual_review,
    a_payment_under_manual_review_is_left_to_on_call,
    a_charge_for_an_unknown_reference_is_acknowledged_and_listed_as_orphan,
    other_event_types_are_acknowledged_and_ignored,
    processed_messages_older_than_the_retention_are_purged,
    the_reaper_purges_old_webhook_reports_of_settled_payments_and_refunds_and_keeps_those_still_needed,
    the_openapi_document_describes_the_webhook_and_the_orphan_list,
    a_signed_event_over_64_kib_is_refused_with_413_and_nothing_recorded,
    reports_stored_with_lower_case_currency_codes_read_upper_case_after_the_migration,
);

const SECRET: &str = "whsec_test";
pub const ADMIN: &str = "adm_test_token_0001";
/// The charge id of the pending fixture: the payment's `gateway_ref`.
const CHARGE_ID: &str = "ch_3Pq8sTQ2xY7wZ3";

async fn spawn(backend: Backend) -> TestApp {
    spawn_with(backend, &[]).await
}

/// pagos with the webhook secret `SECRET`, the admin token `ADMIN`, and `extra` flags.
pub async fn spawn_with(backend: Backend, extra: &[&str]) -> TestApp {
    let mut flags = vec!["--webhook-secret", SECRET, "--admin-token", ADMIN];
    flags.extend_from_slice(extra);
    crate::helpers::started(backend, &flags).await
}

/// A payment left ENVIADA by a gateway answering `pending`; returns its id.
async fn pending_payment(app: &TestApp, key: &str) -> String {
    app.answer_charges(Charge::pending()).await;
    let answer = app.pay(key, &payment_body()).await;
    assert_eq!(answer.status(), 202);
    let body = json(answer).await;
    assert_eq!(body["estado"], "ENVIADA");
    body["id"].as_str().expect("id").to_owned()
}

fn charge(reference: &str, status: &str) -> Value {
    json!({
        "id": CHARGE_ID,
        "status": status,
        "amount": 250000,
        "currency": "COP",
        "reference": reference,
        "declineCode": (status == "declined").then_some("insufficient_funds"),
    })
}

fn event(id: &str, sequence: i64, data: Value) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "id": id, "type": "charge.updated", "sequence": sequence, "data": data,
    }))
    .expect("JSON")
}

/// The header a gateway sends, computed here independently of pagos' own code.
fn signature(secret: &str, t: i64, body: &[u8]) -> String {
    crate::helpers::timestamped_signature(secret, t, body)
}

fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

async fn deliver_signed(app: &TestApp, body: &[u8], signature: &str) -> reqwest::Response {
    crate::helpers::post_webhook(
        app,
        "/v1/webhooks/http",
        &[("Gateway-Signature", signature)],
        body,
    )
    .await
}

async fn deliver(app: &TestApp, body: &[u8]) -> reqwest::Response {
    deliver_signed(app, body, &signature(SECRET, now(), body)).await
}

async fn outcome(answer: reqwest::Response) -> String {
    crate::helpers::resultado(answer).await
}

/// (from, to, actor, reason) of the payment's audit trail, oldest first.
async fn trail(app: &TestApp, id: &str) -> Vec<(Option<String>, String, String, String)> {
    let id = uuid::Uuid::parse_str(id).expect("uuid");
    payment_transition::Entity::find()
        .filter(payment_transition::Column::PaymentId.eq(id))
        .order_by_asc(payment_transition::Column::CreatedAt)
        .order_by_asc(payment_transition::Column::Id)
        .all(&app.db)
        .await
        .expect("query")
        .into_iter()
        .map(|t| {
            (
                t.from_state.map(|s| s.to_string()),
                t.to_state.to_string(),
                t.actor.to_string(),
                t.reason,
            )
        })
        .collect()
}

async fn webhook_moves(app: &TestApp, id: &str) -> Vec<(Option<String>, String, String, String)> {
    trail(app, id)
        .await
        .into_iter()
        .filter(|t| t.2 == "webhook")
        .collect()
}

/// (processed messages, charge rows): what a refused request must leave untouched.
async fn one_event_delivered_ten_times_in_a_row_moves_the_payment_once(backend: Backend) {
    let app = spawn(backend).await;
    let id = pending_payment(&app, "k-wh-10").await;
    let body = event("evt_ten", 2, charge(&id, "succeeded"));

    let mut outcomes = Vec::new();
    for _ in 0..10 {
        // A fresh signature each time, as a gateway's retry carries.
        outcomes.push(outcome(deliver(&app, &body).await).await);
    }
    assert_eq!(outcomes[0], "aplicado");
    assert!(
        outcomes[1..].iter().all(|o| o == "duplicado"),
        "{outcomes:?}"
    );
    assert_eq!(app.payment(&id).await.state, "COMPLETADA");
    let moves = webhook_moves(&app, &id).await;
    assert_eq!(moves.len(), 1, "one transition: {moves:?}");
    assert_eq!(moves[0].0.as_deref(), Some("ENVIADA"));
    assert_eq!(moves[0].1, "COMPLETADA");
    assert_eq!(trail(&app, &id).await.len(), 2, "sent, then settled once");
    assert_eq!(app.recorded().await, (1, 1));
}

async fn one_event_delivered_twenty_times_at_once_moves_the_payment_once(backend: Backend) {
    let app = spawn(backend).await;
    let id = pending_payment(&app, "k-wh-20").await;
    let body = event("evt_twenty", 2, charge(&id, "succeeded"));
    let header = signature(SECRET, now(), &body);

    let deliveries = (0..20).map(|_| deliver_signed(&app, &body, &header));
    let answers = futures::future::join_all(deliveries).await;
    let mut outcomes = Vec::new();
    for answer in answers {
        outcomes.push(outcome(answer).await);
    }
    assert_eq!(
        outcomes.iter().filter(|o| *o == "aplicado").count(),
        1,
        "{outcomes:?}"
    );
    assert_eq!(
        outcomes.iter().filter(|o| *o == "duplicado").count(),
        19,
        "{outcomes:?}"
    );
    assert_eq!(app.payment(&id).await.state, "COMPLETADA");
    assert_eq!(webhook_moves(&app, &id).await.len(), 1);
    assert_eq!(trail(&app, &id).await.len(), 2);
    assert_eq!(app.recorded().await, (1, 1));
}

async fn sequence_3_delivered_before_sequence_2_stands(backend: Backend) {
    let app = spawn(backend).await;
    let id = pending_payment(&app, "k-wh-seq").await;

    let third = event("evt_seq_3", 3, charge(&id, "declined"));
    assert_eq!(outcome(deliver(&app, &third).await).await, "aplicado");
    // Had it been applied, this older event would contradict FALLIDA.
    let second = event("evt_seq_2", 2, charge(&id, "succeeded"));
    assert_eq!(outcome(deliver(&app, &second).await).await, "obsoleto");
    let first = event("evt_seq_1", 1, charge(&id, "pending"));
    assert_eq!(outcome(deliver(&app, &first).await).await, "obsoleto");
    // The same sequence again under another id is no newer either.
    let again = event("evt_seq_3b", 3, charge(&id, "succeeded"));
    assert_eq!(outcome(deliver(&app, &again).await).await, "obsoleto");

    let payment = app.payment(&id).await;
    assert_eq!(payment.state, "FALLIDA");
    assert_eq!(payment.decline_code.as_deref(), Some("insufficient_funds"));
    assert_eq!(webhook_moves(&app, &id).await.len(), 1);
    let row = webhook_charge::Entity::find_by_id(("http".to_owned(), CHARGE_ID.to_owned()))
        .one(&app.db)
        .await
        .expect("query")
        .expect("charge row");
    assert_eq!(row.last_sequence, 3);
    assert_eq!(row.last_event_id, "evt_seq_3");
    assert_eq!(row.status, "declined");
    assert_eq!(app.recorded().await, (4, 1), "each id recorded once");
}

async fn twenty_events_of_one_charge_at_once_leave_the_highest_sequence_standing(backend: Backend) {
    let app = spawn(backend).await;
    let id = pending_payment(&app, "k-wh-race").await;
    // Sequences 1–19 say pending, 20 says succeeded; sent all at once, highest first.
    let bodies: Vec<Vec<u8>> = (1..=20)
        .rev()
        .map(|seq| {
            let status = if seq == 20 { "succeeded" } else { "pending" };
            event(&format!("evt_race_{seq}"), seq, charge(&id, status))
        })
        .collect();
    let answers = futures::future::join_all(bodies.iter().map(|b| deliver(&app, b))).await;
    for answer in answers {
        let got = outcome(answer).await;
        assert!(
            ["aplicado", "sin_cambios", "obsoleto"].contains(&got.as_str()),
            "{got}"
        );
    }
    assert_eq!(app.payment(&id).await.state, "COMPLETADA");
    assert_eq!(webhook_moves(&app, &id).await.len(), 1);
    let row = webhook_charge::Entity::find_by_id(("http".to_owned(), CHARGE_ID.to_owned()))
        .one(&app.db)
        .await
        .expect("query")
        .expect("row");
    assert_eq!((row.status.as_str(), row.last_sequence), ("succeeded", 20));
    assert_eq!(app.recorded().await, (20, 1));
}

async fn a_pending_payment_settled_by_a_webhook_replays_its_frozen_201(backend: Backend) {
    let app = spawn(backend).await;
    let id = pending_payment(&app, "k-wh-201").await;
    let retry = app.pay("k-wh-201", &payment_body()).await;
    assert_eq!(retry.status(), 202, "still pending before the event");

    let pending = event("evt_p_1", 1, charge(&id, "pending"));
    assert_eq!(outcome(deliver(&app, &pending).await).await, "sin_cambios");
    let settled = event("evt_p_2", 2, charge(&id, "succeeded"));
    assert_eq!(outcome(deliver(&app, &settled).await).await, "aplicado");

    let replay = app.pay("k-wh-201", &payment_body()).await;
    assert_eq!(replay.status(), 201);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(
        replay.headers()["location"].to_str().ok(),
        Some(format!("/v1/pagos/{id}").as_str())
    );
    let first_bytes = replay.bytes().await.expect("body");
    let replay: Value = serde_json::from_slice(&first_bytes).expect("JSON");
    assert_eq!(replay["estado"], "COMPLETADA");
    assert_eq!(replay["gatewayRef"], CHARGE_ID);
    let again = app.pay("k-wh-201", &payment_body()).await;
    assert_eq!(again.bytes().await.expect("body"), first_bytes, "frozen");

    let moves = webhook_moves(&app, &id).await;
    assert_eq!(moves.len(), 1);
    assert_eq!(
        moves[0].3,
        format!("webhook evt_p_2: charge {CHARGE_ID} succeeded")
    );
    assert_eq!(app.charges_seen().await.len(), 1, "never charged again");
}

/// The gateway's charge answer, sent after a delay: the request is still waiting on it.
struct SlowCharge(std::time::Duration);

impl wiremock::Respond for SlowCharge {
    fn respond(&self, request: &wiremock::Request) -> wiremock::ResponseTemplate {
        Charge::succeeded().respond(request).set_delay(self.0)
    }
}

async fn a_webhook_that_settles_a_payment_while_its_request_waits_on_the_gateway_is_what_the_request_answers(
    backend: Backend,
) {
    // The gateway answers within the timeout: one call, and the request writes its own
    // settlement, which the webhook's has fenced.
    let app = spawn_with(backend, &["--gateway-timeout", "10s"]).await;
    app.answer_charges(SlowCharge(std::time::Duration::from_secs(4)))
        .await;
    let request = app.pay_in_background("k-wh-race");
    // The request has marked its payment sent and is at the gateway.
    let mut sent = None;
    for _ in 0..750 {
        sent = pagos::entities::payment::Entity::find()
            .filter(pagos::entities::payment::Column::IdempotencyKey.eq("k-wh-race"))
            .one(&app.db)
            .await
            .expect("read")
            .filter(|p| p.state.as_str() == "ENVIADA");
        if sent.is_some() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let id = sent.expect("the payment marked ENVIADA").id.to_string();
    let settled = event("evt_race_1", 1, charge(&id, "succeeded"));
    assert_eq!(outcome(deliver(&app, &settled).await).await, "aplicado");

    // The request's own settling write is fenced by the webhook's: it answers with the
    // payment as the webhook left it, never with the ENVIADA it held.
    let answer = request.await.expect("joined").expect("answered");
    assert_eq!(answer.status(), 201);
    let body = json(answer).await;
    assert_eq!(body["id"], id.as_str());
    assert_eq!(body["estado"], "COMPLETADA");
    assert_eq!(
        body["gatewayRef"], CHARGE_ID,
        "the webhook's decision stands"
    );

    let completed: Vec<_> = trail(&app, &id)
        .await
        .into_iter()
        .filter(|t| t.1 == "COMPLETADA")
        .collect();
    assert_eq!(completed.len(), 1, "one move to COMPLETADA: {completed:?}");
    assert_eq!(completed[0].2, "webhook");
    let replay = app.pay("k-wh-race", &payment_body()).await;
    assert_eq!(replay.status(), 201);
    assert_eq!(json(replay).await["estado"], "COMPLETADA");
    assert_eq!(app.charges_seen().await.len(), 1, "one charge");
}

async fn a_declined_event_fails_a_pending_payment_and_freezes_its_402(backend: Backend) {
    let app = spawn(backend).await;
    let id = pending_payment(&app, "k-wh-402").await;
    let declined = event("evt_d_2", 2, charge(&id, "declined"));
    assert_eq!(outcome(deliver(&app, &declined).await).await, "aplicado");

    let replay = app.pay("k-wh-402", &payment_body()).await;
    assert_eq!(replay.status(), 402);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    let problem = json(replay).await;
    assert_eq!(problem["declineCode"], "insufficient_funds");
    assert_eq!(problem["pago"]["estado"], "FALLIDA");
}

async fn bad_signatures_are_refused_with_401_and_nothing_recorded(backend: Backend) {
    let app = spawn(backend).await;
    let id = pending_payment(&app, "k-wh-401").await;
    let body = event("evt_forged", 2, charge(&id, "succeeded"));
    let good = signature(SECRET, now(), &body);
    let v1 = good.split_once(",v1=").expect("v1").1.to_owned();
    let mut flipped = v1.clone().into_bytes();
    flipped[0] = if flipped[0] == b'0' { b'1' } else { b'0' };
    let flipped = String::from_utf8(flipped).expect("hex");
    let altered = event("evt_forged", 2, charge(&id, "declined"));

    let cases: Vec<(&str, Vec<u8>, Option<String>)> = vec![
        ("no signature", body.clone(), None),
        (
            "a wrong v1",
            body.clone(),
            Some(format!("t={},v1={flipped}", now())),
        ),
        (
            "another secret",
            body.clone(),
            Some(signature("whsec_other", now(), &body)),
        ),
        (
            "a timestamp 10 minutes old",
            body.clone(),
            Some(signature(SECRET, now() - 600, &body)),
        ),
        (
            "a timestamp 10 minutes ahead",
            body.clone(),
            Some(signature(SECRET, now() + 600, &body)),
        ),
        (
            "the body altered after signing",
            altered,
            Some(good.clone()),
        ),
        ("a malformed header", body.clone(), Some(format!("v1={v1}"))),
        ("garbage", body.clone(), Some("sha256=abc".into())),
    ];
    for (case, body, header) in cases {
        let mut request = app
            .http
            .post(app.url("/v1/webhooks/http"))
            .header("Content-Type", "application/json")
            .body(body);
        if let Some(header) = header {
            request = request.header("Gateway-Signature", header);
        }
        let answer = request.send().await.expect("sent");
        assert_eq!(answer.status(), 401, "{case}");
        assert_eq!(
            answer.headers()["content-type"],
            "application/problem+json",
            "{case}"
        );
        assert_eq!(
            json(answer).await["type"],
            "/problems/unauthorized",
            "{case}"
        );
    }
    // Two headers, one of them good, are refused too.
    let answer = app
        .http
        .post(app.url("/v1/webhooks/http"))
        .header("Gateway-Signature", good.as_str())
        .header("Gateway-Signature", "t=1,v1=00")
        .body(body.clone())
        .send()
        .await
        .expect("sent");
    assert_eq!(answer.status(), 401);

    assert_eq!(app.recorded().await, (0, 0), "nothing recorded");
    assert_eq!(app.payment(&id).await.state, "ENVIADA");
    assert!(webhook_moves(&app, &id).await.is_empty());
    // The genuine event still applies afterwards.
    assert_eq!(outcome(deliver(&app, &body).await).await, "aplicado");
}

async fn a_signed_body_that_is_not_an_event_is_refused_with_400_and_nothing_recorded(
    backend: Backend,
) {
    let app = spawn(backend).await;
    let id = pending_payment(&app, "k-wh-400").await;
    let mut not_a_charge = charge(&id, "succeeded");
    not_a_charge["status"] = json!("refunded");
    let bodies: Vec<Vec<u8>> = vec![
        b"{\"id\":\"evt_1\",\"type\":\"charge.updated\",".to_vec(),
        b"not json at all".to_vec(),
        Vec::new(),
        serde_json::to_vec(&json!({"type":"charge.updated","sequence":1,"data":charge(&id, "succeeded")}))
            .expect("JSON"),
        event("evt_bad", 2, not_a_charge),
        serde_json::to_vec(&json!({"id":"evt_x","type":"charge.updated","sequence":-1,"data":charge(&id, "succeeded")}))
            .expect("JSON"),
    ];
    for body in bodies {
        let answer = deliver(&app, &body).await;
        assert_eq!(answer.status(), 400, "{}", String::from_utf8_lossy(&body));
        assert_eq!(answer.headers()["content-type"], "application/problem+json");
    }
    assert_eq!(app.recorded().await, (0, 0));
    assert_eq!(app.payment(&id).await.state, "ENVIADA");
}

/// A Stripe deployment with a reference-protocol secret still set (left from a reference
/// or sandbox setup). Before, an event signed with it was taken: a payment sent to Stripe
/// and unanswered could be settled `COMPLETADA` with a charge Stripe never made, and no
/// Stripe event corrected it (its reports are kept under another source). Now it is
/// refused, 401 naming `PAGOS_GATEWAY`, counted with the refused signatures, and nothing
/// is recorded.
async fn events_of_a_provider_the_payments_do_not_go_through_are_refused_whatever_their_signature(
    backend: Backend,
) {
    let app = Spawn::new(backend)
        .provider("stripe")
        .flags(&[
            "--stripe-webhook-secret",
            "whsec_stripe",
            "--webhook-secret",
            SECRET,
        ])
        .start()
        .await;
    let reference = uuid::Uuid::now_v7().to_string();
    let body = event("evt_not_stripe", 1, charge(&reference, "succeeded"));
    let answer = deliver(&app, &body).await;
    assert_eq!(answer.status(), 401);
    let problem = json(answer).await;
    assert!(
        crate::helpers::text_has(&problem, "detail", "PAGOS_GATEWAY"),
        "{problem}"
    );
    assert_eq!(app.recorded().await, (0, 0), "nothing recorded");
    let metrics = app.metrics().await;
    assert!(
        metrics
            .lines()
            .any(|l| l == "pagos_webhook_events_total{outcome=\"refused_signature\"} 1"),
        "{metrics}"
    );
}

/// A deployment that lost its webhook secret refuses every event, and on-call's alert
/// (`PagosWebhookSignaturesRefused`) sees it: each refusal is counted as `secret_unset`,
/// on every provider's endpoint.
async fn webhooks_answer_401_while_no_secret_is_set(backend: Backend) {
    let app = Spawn::new(backend).start().await;
    let body = event("evt_nosecret", 1, charge("anything", "succeeded"));
    let answer = deliver(&app, &body).await;
    assert_eq!(answer.status(), 401);
    let problem = json(answer).await;
    assert!(
        crate::helpers::text_has(&problem, "detail", "PAGOS_WEBHOOK_SECRET"),
        "{problem}"
    );
    for (path, setting) in [
        ("/v1/webhooks/stripe", "PAGOS_STRIPE_WEBHOOK_SECRET"),
        (
            "/v1/webhooks/mercadopago",
            "PAGOS_MERCADOPAGO_WEBHOOK_SECRET",
        ),
    ] {
        let answer = crate::helpers::post_webhook(&app, path, &[], &body).await;
        assert_eq!(answer.status(), 401, "{path}");
        let problem = json(answer).await;
        assert!(
            crate::helpers::text_has(&problem, "detail", setting),
            "{problem}"
        );
    }
    assert_eq!(app.recorded().await, (0, 0));
    let metrics = app.metrics().await;
    assert!(
        metrics
            .lines()
            .any(|l| l == "pagos_webhook_events_total{outcome=\"secret_unset\"} 3"),
        "every refusal for want of a secret is counted:\n{metrics}"
    );
}

async fn a_contradicting_event_sends_a_final_payment_to_manual_review(backend: Backend) {
    let app = spawn(backend).await;
    let id = pending_payment(&app, "k-wh-contra").await;
    let charged = event("evt_c_2", 2, charge(&id, "succeeded"));
    assert_eq!(outcome(deliver(&app, &charged).await).await, "aplicado");
    let declined = event("evt_c_3", 3, charge(&id, "declined"));
    assert_eq!(
        outcome(deliver(&app, &declined).await).await,
        "revision_manual"
    );

    assert_eq!(app.payment(&id).await.state, "REVISION_MANUAL");
    let moves = webhook_moves(&app, &id).await;
    assert_eq!(moves.len(), 2, "{moves:?}");
    let (from, to, _, reason) = &moves[1];
    assert_eq!(from.as_deref(), Some("COMPLETADA"));
    assert_eq!(to, "REVISION_MANUAL");
    assert!(reason.contains("evt_c_3"), "{reason}");
    assert!(reason.contains("declined"), "{reason}");
    assert!(reason.contains("COMPLETADA"), "{reason}");

    // What the client was told stays what its retries are told.
    let replay = app.pay("k-wh-contra", &payment_body()).await;
    assert_eq!(replay.status(), 201);
    assert_eq!(json(replay).await["estado"], "COMPLETADA");
}

async fn a_payment_under_manual_review_is_left_to_on_call(backend: Backend) {
    // A charge succeeding after FALLIDA sends the payment to review only when orphan
    // charges are reviewed rather than refunded (tests/api/compensation.rs has the other).
    let app = spawn_with(backend, &["--orphan-charges", "review"]).await;
    let id = pending_payment(&app, "k-wh-review").await;
    for (evt, seq, status, expected) in [
        ("evt_r_2", 2, "declined", "aplicado"),
        ("evt_r_3", 3, "succeeded", "revision_manual"),
        ("evt_r_4", 4, "declined", "sin_cambios"),
        ("evt_r_5", 5, "succeeded", "sin_cambios"),
    ] {
        let body = event(evt, seq, charge(&id, status));
        assert_eq!(outcome(deliver(&app, &body).await).await, expected, "{evt}");
    }
    assert_eq!(app.payment(&id).await.state, "REVISION_MANUAL");
    assert_eq!(webhook_moves(&app, &id).await.len(), 2);
    // The gateway's latest word is kept for on-call.
    let row = webhook_charge::Entity::find_by_id(("http".to_owned(), CHARGE_ID.to_owned()))
        .one(&app.db)
        .await
        .expect("query")
        .expect("row");
    assert_eq!((row.status.as_str(), row.last_sequence), ("succeeded", 5));
}

async fn a_charge_for_an_unknown_reference_is_acknowledged_and_listed_as_orphan(backend: Backend) {
    let app = spawn(backend).await;
    let unknown = uuid::Uuid::now_v7().to_string();
    let mut first = charge(&unknown, "pending");
    first["id"] = json!("ch_orphan_1");
    assert_eq!(
        outcome(deliver(&app, &event("evt_o_1", 1, first)).await).await,
        "huerfano"
    );
    let mut settled = charge(&unknown, "succeeded");
    settled["id"] = json!("ch_orphan_1");
    assert_eq!(
        outcome(deliver(&app, &event("evt_o_2", 2, settled)).await).await,
        "huerfano"
    );
    let mut not_a_uuid = charge("order-77", "succeeded");
    not_a_uuid["id"] = json!("ch_orphan_2");
    assert_eq!(
        outcome(deliver(&app, &event("evt_o_3", 1, not_a_uuid.clone())).await).await,
        "huerfano"
    );
    assert_eq!(
        outcome(deliver(&app, &event("evt_o_3", 1, not_a_uuid)).await).await,
        "duplicado"
    );
    // A reference with a NUL, which PostgreSQL's text refuses (before: a 503 at every
    // delivery, the charge never listed): kept as U+FFFD, listed for on-call.
    let mut nul = charge("order\u{0}78", "succeeded");
    nul["id"] = json!("ch_orphan_3");
    assert_eq!(
        outcome(deliver(&app, &event("evt_o_4", 1, nul)).await).await,
        "huerfano"
    );

    let list = |token: Option<&'static str>, query: &'static str| {
        let mut request = app
            .http
            .get(app.url(&format!("/admin/cargos-huerfanos{query}")));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        request.send()
    };
    assert_eq!(list(None, "").await.expect("sent").status(), 401);
    assert_eq!(list(Some("wrong"), "").await.expect("sent").status(), 401);
    for bad in ["?limite=0", "?limite=1001", "?limite=x"] {
        assert_eq!(
            list(Some(ADMIN), bad).await.expect("sent").status(),
            422,
            "{bad}"
        );
    }
    let answer = list(Some(ADMIN), "").await.expect("sent");
    assert_eq!(answer.status(), 200);
    let orphans = json(answer).await;
    let orphans = orphans.as_array().expect("a list");
    assert_eq!(orphans.len(), 3, "one row per charge: {orphans:?}");
    assert_eq!(orphans[0]["referencia"], "order\u{FFFD}78", "newest first");
    assert_eq!(orphans[2]["cargoId"], "ch_orphan_1");
    assert_eq!(orphans[2]["referencia"], unknown.as_str());
    assert_eq!(orphans[2]["estado"], "succeeded", "its latest state");
    assert_eq!(orphans[2]["ultimaSecuencia"], 2);
    assert_eq!(orphans[2]["monto"], 250000);
    assert_eq!(orphans[2]["moneda"], "COP");
    assert_eq!(orphans[2]["fuente"], "http");
    assert_eq!(orphans[1]["referencia"], "order-77");
    // A short page still shows the one on-call has not seen: the newest.
    let limited = json(list(Some(ADMIN), "?limite=1").await.expect("sent")).await;
    assert_eq!(limited.as_array().map(Vec::len), Some(1));
    assert_eq!(limited[0]["cargoId"], "ch_orphan_3");

    // A known payment's charge is not an orphan.
    let id = pending_payment(&app, "k-wh-known").await;
    let known = event("evt_known", 2, charge(&id, "succeeded"));
    assert_eq!(outcome(deliver(&app, &known).await).await, "aplicado");
    let orphans = json(list(Some(ADMIN), "").await.expect("sent")).await;
    assert_eq!(orphans.as_array().map(Vec::len), Some(3));
}

async fn other_event_types_are_acknowledged_and_ignored(backend: Backend) {
    let app = spawn(backend).await;
    let body = serde_json::to_vec(
        &json!({"id":"evt_payout","type":"payout.paid","sequence":1,"data":{"amount":5}}),
    )
    .expect("JSON");
    assert_eq!(outcome(deliver(&app, &body).await).await, "ignorado");
    assert_eq!(app.recorded().await, (0, 0));
}

async fn processed_messages_older_than_the_retention_are_purged(backend: Backend) {
    let app = spawn(backend).await;
    let id = pending_payment(&app, "k-wh-purge").await;
    let body = event("evt_purge", 2, charge(&id, "succeeded"));
    assert_eq!(outcome(deliver(&app, &body).await).await, "aplicado");

    let week_ago = chrono::Utc::now() - chrono::TimeDelta::days(7);
    let kept = pagos::webhooks::purge_processed_messages(&app.db, week_ago, 1000)
        .await
        .expect("purge");
    assert_eq!(kept, 0, "a fresh id is kept");
    assert_eq!(app.recorded().await.0, 1);

    let later = chrono::Utc::now() + chrono::TimeDelta::seconds(1);
    let purged = pagos::webhooks::purge_processed_messages(&app.db, later, 1000)
        .await
        .expect("purge");
    assert_eq!(purged, 1);
    assert_eq!(app.recorded().await, (0, 1), "charge rows are kept");

    // Redelivered after its id is gone: the charge's sequence still stops it.
    assert_eq!(outcome(deliver(&app, &body).await).await, "obsoleto");
    assert_eq!(webhook_moves(&app, &id).await.len(), 1);
}

async fn the_openapi_document_describes_the_webhook_and_the_orphan_list(backend: Backend) {
    let app = Spawn::new(backend).sandbox().start().await;
    let doc = app.openapi().await;
    let webhook = &doc["paths"]["/v1/webhooks/http"]["post"];
    crate::helpers::header_parameter(webhook, "Gateway-Signature", "the webhook");
    crate::helpers::assert_responses(webhook, &["200", "400", "401", "503"], "the webhook");
    let orphans = &doc["paths"]["/admin/cargos-huerfanos"]["get"];
    assert!(orphans["responses"]["200"].is_object());
    assert!(orphans["security"].is_array(), "admin token required");
}

async fn a_signed_event_over_64_kib_is_refused_with_413_and_nothing_recorded(backend: Backend) {
    let app = spawn(backend).await;
    let id = pending_payment(&app, "k-wh-413").await;
    let mut large = charge(&id, "succeeded");
    large["description"] = json!("x".repeat(70_000));
    let body = event("evt_large", 1, large);
    let answer = deliver(&app, &body).await;
    assert_eq!(answer.status(), 413);
    assert_eq!(answer.headers()["content-type"], "application/problem+json");
    assert_eq!(json(answer).await["type"], "/problems/body-too-large");
    assert_eq!(app.recorded().await, (0, 0));
    assert_eq!(app.payment(&id).await.state, "ENVIADA");
}

/// Reports a gateway sent as `cop` before answers were read in upper case are written as
/// `COP` by migration m26: what on-call's resolution and a refund's settlement compare
/// with the payment's own code. Codes already upper case are left as they are.
async fn reports_stored_with_lower_case_currency_codes_read_upper_case_after_the_migration(
    backend: Backend,
) {
    use migration::{Migrator, MigratorTrait};
    use pagos::entities::webhook_refund;
    let database = crate::helpers::TestDatabase::create(&backend).await;
    let db = sea_orm::Database::connect(database.url.as_str())
        .await
        .expect("open");
    let before = Migrator::migrations()
        .iter()
        .position(|m| m.name() == "m20261212_000026_reported_currency_upper")
        .expect("the migration");
    Migrator::up(&db, Some(u32::try_from(before).expect("count")))
        .await
        .expect("the schema before it");
    let at = pagos::db::now();
    let charges = [
        ("ch_lower", "cop"),
        ("ch_mixed", "Usd"),
        ("ch_upper", "COP"),
    ];
    for (id, currency) in charges {
        let mut row = charge_report(id, None, webhook_charge::ReportedStatus::Succeeded, at);
        row.currency = sea_orm::ActiveValue::Set(currency.into());
        webhook_charge::Entity::insert(row)
            .exec_without_returning(&db)
            .await
            .expect("a charge report");
    }
    webhook_refund::Entity::insert(webhook_refund::ActiveModel::from(webhook_refund::Model {
        source: "http".into(),
        provider_refund_id: "re_lower".into(),
        reference: "not-ours".into(),
        refund_id: None,
        payment_id: None,
        charge_id: "ch_lower".into(),
        status: webhook_refund::ReportedRefundStatus::Succeeded,
        amount: 1000,
        currency: "cop".into(),
        failure_code: None,
        last_sequence: 1,
        last_event_id: "evt_re_lower".into(),
        first_seen_at: at,
        updated_at: at,
    }))
    .exec_without_returning(&db)
    .await
    .expect("a refund report");
    db.close().await.expect("closed");

    let db = database.migrated().await;
    let mut stored: Vec<(String, String)> = webhook_charge::Entity::find()
        .order_by_asc(webhook_charge::Column::ChargeId)
        .all(&db)
        .await
        .expect("read")
        .into_iter()
        .map(|c| (c.charge_id, c.currency))
        .collect();
    stored.extend(
        webhook_refund::Entity::find()
            .all(&db)
            .await
            .expect("read")
            .into_iter()
            .map(|r| (r.provider_refund_id, r.currency)),
    );
    let expected = [
        ("ch_lower", "COP"),
        ("ch_mixed", "USD"),
        ("ch_upper", "COP"),
        ("re_lower", "COP"),
    ]
    .map(|(id, currency)| (id.to_owned(), currency.to_owned()));
    assert_eq!(stored, expected);
}

/// What the reaper test seeds: a charge report of `payment` (None: an orphan), last
/// updated `at`.
fn charge_report(
    id: &str,
    payment: Option<uuid::Uuid>,
    status: webhook_charge::ReportedStatus,
    at: chrono::DateTime<chrono::Utc>,
) -> webhook_charge::ActiveModel {
    webhook_charge::ActiveModel::from(webhook_charge::Model {
        source: "http".into(),
        charge_id: id.into(),
        reference: payment.map_or_else(|| format!("not-ours-{id}"), |p| p.to_string()),
        payment_id: payment,
        status,
        amount: 250_000,
        currency: "COP".into(),
        decline_code: None,
        last_sequence: 1,
        last_event_id: format!("evt_{id}"),
        first_seen_at: at,
        updated_at: at,
    })
}

/// A refund of `payment` in `state`, created and last moved `at`.
fn refund_row(
    payment: &pagos::entities::payment::Model,
    key: &str,
    state: pagos::entities::refund::RefundState,
    at: chrono::DateTime<chrono::Utc>,
) -> pagos::entities::refund::Model {
    use pagos::entities::refund::{KeyScope, KeyStatus, Model};
    Model {
        id: uuid::Uuid::now_v7(),
        payment_id: payment.id,
        merchant_id: payment.merchant_id,
        key_scope: KeyScope::Merchant,
        idempotency_key: key.into(),
        fingerprint: "0".repeat(64),
        key_status: KeyStatus::Completed,
        response_code: Some(201),
        response_body: Some("{}".into()),
        lease_until: None,
        charge_ref: format!("ch_{key}"),
        amount: 1000,
        currency: "COP".into(),
        reason: None,
        requested_by: Some("merchant".into()),
        state,
        version: 1,
        attempts: 1,
        gateway_key: format!("gk-{key}"),
        gateway_ref: Some(format!("re_{key}")),
        failure_code: None,
        next_attempt_at: at,
        claimed_until: None,
        created_at: at,
        updated_at: at,
        last_event_sequence: Some(1),
        last_error: None,
        last_error_at: None,
    }
}

/// A refund report of `refund` (None: a refund none of ours), last updated `at`.
fn refund_report(
    id: &str,
    refund: Option<&pagos::entities::refund::Model>,
    at: chrono::DateTime<chrono::Utc>,
) -> pagos::entities::webhook_refund::ActiveModel {
    use pagos::entities::webhook_refund::{Model, ReportedRefundStatus};
    pagos::entities::webhook_refund::ActiveModel::from(Model {
        source: "http".into(),
        provider_refund_id: id.into(),
        reference: refund.map_or_else(|| format!("not-ours-{id}"), |r| r.id.to_string()),
        refund_id: refund.map(|r| r.id),
        payment_id: refund.map(|r| r.payment_id),
        charge_id: format!("ch_{id}"),
        status: ReportedRefundStatus::Succeeded,
        amount: 1000,
        currency: "COP".into(),
        failure_code: None,
        last_sequence: 1,
        last_event_id: format!("evt_{id}"),
        first_seen_at: at,
        updated_at: at,
    })
}

/// The reaper deletes, batch after batch, what the gateways' webhooks reported about
/// charges and refunds once nothing needs it: reports older than the retention (the key
/// retention, and never less than the event ids' `PAGOS_MESSAGE_RETENTION`) of payments
/// and refunds settled that long, and of charges or refunds none of ours that moved no
/// money. It keeps the reports of a payment under review or with a refund in flight, of a
/// refund in flight, of a payment resolved recently, an orphan charge that succeeded, a
/// succeeded charge of a payment answered FALLIDA, and every report younger than the
/// retention.
async fn the_reaper_purges_old_webhook_reports_of_settled_payments_and_refunds_and_keeps_those_still_needed(
    backend: Backend,
) {
    use pagos::entities::payment::{self, PaymentState};
    use pagos::entities::refund::{self, RefundState};
    use pagos::entities::webhook_charge::ReportedStatus;
    use pagos::entities::webhook_refund;
    let (_database, db) = crate::helpers::TestDatabase::with_acme(&backend).await;
    let merchant = crate::helpers::acme(&db).await;
    let now = pagos::db::now();
    let (month_ago, three_days_ago) = (
        now - chrono::TimeDelta::days(30),
        now - chrono::TimeDelta::days(3),
    );
    let payment_in = |key: &str, state: PaymentState, at| {
        crate::helpers::left_payment(merchant, key, state, 1, format!("gk-{key}"), at)
    };
    let settled = payment_in("settled", PaymentState::Completada, month_ago);
    let declined = payment_in("declined", PaymentState::Fallida, month_ago);
    let review = payment_in("review", PaymentState::RevisionManual, month_ago);
    let refunding = payment_in("refunding", PaymentState::Completada, month_ago);
    let resolved_lately = payment_in("resolved", PaymentState::Completada, now);
    for p in [&settled, &declined, &review, &refunding, &resolved_lately] {
        payment::Entity::insert(payment::ActiveModel::from(p.clone()))
            .exec_without_returning(&db)
            .await
            .expect("seed");
    }
    let refund_done = refund_row(&settled, "done", RefundState::Completado, month_ago);
    let refund_open = refund_row(&refunding, "open", RefundState::Enviado, month_ago);
    for r in [&refund_done, &refund_open] {
        refund::Entity::insert(refund::ActiveModel::from(r.clone()))
            .exec_without_returning(&db)
            .await
            .expect("seed");
    }
    let charges = [
        (
            "ch_settled",
            Some(settled.id),
            ReportedStatus::Succeeded,
            month_ago,
        ),
        (
            "ch_declined",
            Some(declined.id),
            ReportedStatus::Declined,
            month_ago,
        ),
        // Money on-call or pagos gave back, or on-call kept, for a payment answered
        // FALLIDA: what makes a later report of it change nothing.
        (
            "ch_failed_but_known",
            Some(declined.id),
            ReportedStatus::Succeeded,
            month_ago,
        ),
        (
            "ch_settled_3d",
            Some(settled.id),
            ReportedStatus::Pending,
            three_days_ago,
        ),
        (
            "ch_review",
            Some(review.id),
            ReportedStatus::Succeeded,
            month_ago,
        ),
        (
            "ch_refunding",
            Some(refunding.id),
            ReportedStatus::Succeeded,
            month_ago,
        ),
        (
            "ch_resolved",
            Some(resolved_lately.id),
            ReportedStatus::Succeeded,
            month_ago,
        ),
        ("ch_fresh", Some(settled.id), ReportedStatus::Succeeded, now),
        ("ch_orphan_paid", None, ReportedStatus::Succeeded, month_ago),
        (
            "ch_orphan_declined",
            None,
            ReportedStatus::Declined,
            month_ago,
        ),
    ];
    for (id, payment, status, at) in charges {
        webhook_charge::Entity::insert(charge_report(id, payment, status, at))
            .exec_without_returning(&db)
            .await
            .expect("seed");
    }
    let refunds = [
        ("re_done", Some(&refund_done), month_ago),
        ("re_open", Some(&refund_open), month_ago),
        ("re_done_fresh", Some(&refund_done), now),
        ("re_not_ours", None, month_ago),
    ];
    for (id, refund, at) in refunds {
        webhook_refund::Entity::insert(refund_report(id, refund, at))
            .exec_without_returning(&db)
            .await
            .expect("seed");
    }

    // Two event ids, one past the ids' week of retention.
    for (id, at) in [("evt_old", month_ago), ("evt_new", now)] {
        use pagos::entities::processed_message;
        processed_message::Entity::insert(processed_message::ActiveModel {
            source: sea_orm::ActiveValue::Set("http".to_owned()),
            message_id: sea_orm::ActiveValue::Set(id.to_owned()),
            received_at: sea_orm::ActiveValue::Set(at),
        })
        .exec_without_returning(&db)
        .await
        .expect("seed");
    }

    let metrics = std::sync::Arc::new(pagos::metrics::Metrics::new());
    let reaper = pagos::reaper::Reaper {
        db: db.clone(),
        metrics: metrics.clone(),
        key_retention: std::time::Duration::from_secs(86_400),
        message_retention: std::time::Duration::from_secs(7 * 86_400),
        // One row per statement: the purge goes batch after batch.
        batch: 1,
        // Never refreshed: no key is purged (none is seeded); reports and ids are, once
        // the run has waited four refreshes (40 ms here) for a first record.
        cache: pagos::idempotency::cache::ReplayCache::refreshed_every(
            0,
            std::time::Duration::from_secs(86_400),
            std::time::Duration::from_millis(10),
        ),
        clock: pagos::reaper::SteadyClock::start(),
    };
    let (_stopping, stop) = tokio::sync::watch::channel(false);
    pagos::reaper::run(&reaper, &stop)
        .await
        .expect("a reaper pass");
    // What it deleted is counted, by kind: on-call sees the reaper at work in /metrics.
    let counted = metrics.render();
    for line in [
        "pagos_webhook_records_purged_total{kind=\"charge_reports\"} 3",
        "pagos_webhook_records_purged_total{kind=\"refund_reports\"} 2",
        "pagos_webhook_records_purged_total{kind=\"event_ids\"} 1",
    ] {
        assert!(counted.lines().any(|l| l == line), "{line} in:\n{counted}");
    }

    let mut charges_left: Vec<String> = webhook_charge::Entity::find()
        .all(&db)
        .await
        .expect("read")
        .into_iter()
        .map(|r| r.charge_id)
        .collect();
    charges_left.sort();
    assert_eq!(
        charges_left,
        [
            "ch_failed_but_known",
            "ch_fresh",
            "ch_orphan_paid",
            "ch_refunding",
            "ch_resolved",
            "ch_review",
            "ch_settled_3d",
        ]
    );
    let mut refunds_left: Vec<String> = webhook_refund::Entity::find()
        .all(&db)
        .await
        .expect("read")
        .into_iter()
        .map(|r| r.provider_refund_id)
        .collect();
    refunds_left.sort();
    assert_eq!(refunds_left, ["re_done_fresh", "re_open"]);
    // Only reports: payments and refunds are never deleted.
    assert_eq!(
        payment::Entity::find().all(&db).await.expect("read").len(),
        5
    );
    assert_eq!(
        refund::Entity::find().all(&db).await.expect("read").len(),
        2
    );
    let _ = db.close().await;
}
