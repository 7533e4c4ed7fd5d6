//! The seed's test table: one payment per key, whatever the client repeats.

use crate::helpers::{Backend, Charge, Spawn, json, payment_body};
use crate::on_both_databases;
use serde_json::json;
use std::time::Duration;
use wiremock::ResponseTemplate;

on_both_databases!(
    same_request_twice_charges_once_and_replays_the_answer_byte_for_byte,
    twenty_simultaneous_requests_with_one_key_make_one_charge,
    same_key_with_another_amount_is_rejected_with_422_and_no_second_charge,
    key_order_and_white_space_do_not_make_another_request,
    the_quoted_key_form_is_the_same_key,
    a_payment_can_be_read_back_by_its_location,
    a_client_that_hangs_up_does_not_stop_the_payment,
);

async fn same_request_twice_charges_once_and_replays_the_answer_byte_for_byte(backend: Backend) {
    let app = crate::helpers::charging(backend, Charge::succeeded()).await;

    let first = app.pay("k-1", &payment_body()).await;
    assert_eq!(first.status(), 201);
    assert!(first.headers().get("idempotent-replayed").is_none());
    let location = crate::helpers::location_of(&first);
    let first_body = first.bytes().await.expect("body");

    let second = app.pay("k-1", &payment_body()).await;
    assert_eq!(second.status(), 201);
    assert_eq!(second.headers()["idempotent-replayed"], "true");
    assert_eq!(
        second.headers()["location"].to_str().ok(),
        Some(location.as_str())
    );
    assert_eq!(second.bytes().await.expect("body"), first_body);

    let payment: serde_json::Value = serde_json::from_slice(&first_body).expect("JSON");
    assert_eq!(payment["estado"], "COMPLETADA");
    assert_eq!(
        location,
        format!("/v1/pagos/{}", payment["id"].as_str().expect("id"))
    );
    assert_eq!(app.charges_seen().await.len(), 1);
}

async fn twenty_simultaneous_requests_with_one_key_make_one_charge(backend: Backend) {
    // Waiting for the gateway long enough that its slow answer is never a timeout (and a
    // retry) on a loaded machine.
    let app = Spawn::new(backend)
        .flags(&["--gateway-timeout", "5s"])
        .start()
        .await;
    // A slow gateway, so the duplicates really overlap the first request.
    app.answer_charges(SlowCharge(Duration::from_millis(300)))
        .await;

    let body = payment_body();
    let requests = (0..20).map(|_| app.pay("same-key", &body));
    let answers = futures::future::join_all(requests).await;
    let mut bodies = Vec::new();
    let (mut created, mut conflicts) = (0, 0);
    for answer in answers {
        match answer.status().as_u16() {
            201 => {
                created += 1;
                bodies.push(answer.bytes().await.expect("body"));
            }
            409 => {
                conflicts += 1;
                assert!(answer.headers().contains_key("retry-after"));
                assert_eq!(answer.headers()["content-type"], "application/problem+json");
            }
            other => panic!("unexpected status {other}"),
        }
    }
    assert_eq!(created + conflicts, 20);
    assert!(created >= 1, "the first request completes");
    assert!(
        bodies.windows(2).all(|w| w[0] == w[1]),
        "every 201 is the identical answer"
    );
    assert_eq!(
        app.charges_seen().await.len(),
        1,
        "exactly one gateway charge"
    );
    assert_eq!(app.count_rows().await, (1, 1), "one key, one payment");
}

struct SlowCharge(Duration);

impl wiremock::Respond for SlowCharge {
    fn respond(&self, request: &wiremock::Request) -> ResponseTemplate {
        Charge::succeeded().respond(request).set_delay(self.0)
    }
}

async fn same_key_with_another_amount_is_rejected_with_422_and_no_second_charge(backend: Backend) {
    let app = crate::helpers::charging(backend, Charge::succeeded()).await;

    assert_eq!(app.pay("k-2", &payment_body()).await.status(), 201);
    let other = json!({"creditoId": "42", "monto": 999, "moneda": "COP"});
    let answer = app.pay("k-2", &other).await;
    assert_eq!(answer.status(), 422);
    assert_eq!(answer.headers()["content-type"], "application/problem+json");
    let problem = json(answer).await;
    assert_eq!(problem["type"], "/problems/idempotency-key-reused");
    assert_eq!(app.charges_seen().await.len(), 1);
    assert_eq!(app.count_rows().await, (1, 1));
}

async fn key_order_and_white_space_do_not_make_another_request(backend: Backend) {
    let app = crate::helpers::charging(backend, Charge::succeeded()).await;
    assert_eq!(app.pay("k-3", &payment_body()).await.status(), 201);

    let reordered = app
        .post_raw(
            crate::helpers::API_KEY,
            "/v1/pagos",
            &[
                ("Idempotency-Key", "k-3"),
                ("Content-Type", "application/json"),
            ],
            "{ \"moneda\": \"COP\",\n \"monto\": 250000, \"creditoId\": \"42\" }",
        )
        .await;
    assert_eq!(reordered.status(), 201);
    assert_eq!(reordered.headers()["idempotent-replayed"], "true");
    assert_eq!(app.charges_seen().await.len(), 1);
}

async fn the_quoted_key_form_is_the_same_key(backend: Backend) {
    let app = crate::helpers::charging(backend, Charge::succeeded()).await;
    assert_eq!(app.pay("abc", &payment_body()).await.status(), 201);
    let quoted = app.pay("\"abc\"", &payment_body()).await;
    assert_eq!(quoted.headers()["idempotent-replayed"], "true");
    assert_eq!(app.charges_seen().await.len(), 1);
}

async fn a_payment_can_be_read_back_by_its_location(backend: Backend) {
    let app = crate::helpers::charging(backend, Charge::succeeded()).await;
    let body = json!({"creditoId": "7", "monto": 1500, "moneda": "USD", "descripcion": "cuota 1"});
    let created = app.pay("k-4", &body).await;
    let location = crate::helpers::location_of(&created);
    let created = json(created).await;

    let read = app.get_as(crate::helpers::API_KEY, &location).await;
    assert_eq!(read.status(), 200);
    let read = json(read).await;
    assert_eq!(read, created);
    assert_eq!(read["descripcion"], "cuota 1");
    assert_eq!(read["moneda"], "USD");
    assert!(
        read["gatewayRef"]
            .as_str()
            .is_some_and(|r| r.starts_with("ch_"))
    );
}

async fn a_client_that_hangs_up_does_not_stop_the_payment(backend: Backend) {
    let app = crate::helpers::started(backend, &["--gateway-timeout", "5s"]).await;
    app.answer_charges(SlowCharge(Duration::from_secs(2))).await;

    // The client hangs up once the gateway holds its charge request (so the saga is
    // certainly mid-call, however slow the machine).
    let first = app.pay_in_background("k-hangup");
    for _ in 0..200 {
        if !app.charges_seen().await.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        app.charges_seen().await.len(),
        1,
        "the gateway has the charge request"
    );
    first.abort();
    assert!(
        first.await.is_err(),
        "the client hung up before the gateway answered"
    );

    // The retry finds the request in flight (409) until the saga, still running, ends.
    let mut answer = app.pay("k-hangup", &payment_body()).await;
    for _ in 0..150 {
        if answer.status() != 409 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        answer = app.pay("k-hangup", &payment_body()).await;
    }
    assert_eq!(answer.status(), 201);
    assert_eq!(answer.headers()["idempotent-replayed"], "true");
    assert_eq!(json(answer).await["estado"], "COMPLETADA");
    assert_eq!(app.charges_seen().await.len(), 1);
}

/// PostgreSQL: a registration that meets a key another request is registering at that
/// moment waits for it. When that transaction commits, the waiting statement inserts
/// nothing, and its snapshot (taken before the commit) does not show the key's row: the
/// request must then read the row with a statement of its own and answer from it (here
/// 422: the other request had another body), never register a second payment for the key,
/// never charge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_committed_while_its_registration_waits_is_answered_from_its_row() {
    use pagos::entities::{idempotency_key as keys, payment};
    use sea_orm::{ActiveModelTrait, ColumnTrait, EntityTrait, QueryFilter, TransactionTrait};
    let Some(backend) = Backend::postgres() else {
        return;
    };
    let app = crate::helpers::charging(backend, Charge::succeeded()).await;
    let merchant = crate::helpers::acme(&app.db).await;
    let at = pagos::db::now();
    let lease = at + chrono::TimeDelta::seconds(60);
    let other = payment::Model {
        id: uuid::Uuid::new_v4(),
        merchant_id: merchant,
        idempotency_key: "k-race".into(),
        credit_id: "7".into(),
        amount: 999,
        currency: "USD".into(),
        description: None,
        payment_method: None,
        state: payment::PaymentState::EnProceso,
        version: 0,
        attempts: 0,
        gateway_key: "pagos-other-request".into(),
        gateway_ref: None,
        decline_code: None,
        next_attempt_at: lease,
        created_at: at,
        updated_at: at,
        generation: 0,
        claimed_until: Some(lease),
        last_error: None,
        last_error_at: None,
    };
    // The other request's registration, written and not yet committed.
    let registering = app.db.begin().await.expect("transaction");
    payment::ActiveModel::from(other.clone())
        .insert(&registering)
        .await
        .expect("the other payment");
    keys::ActiveModel::from(keys::Model {
        merchant_id: merchant,
        key: "k-race".into(),
        fingerprint: "0".repeat(64),
        payment_id: other.id,
        status: keys::KeyStatus::InProgress,
        response_code: None,
        response_body: None,
        lease_until: Some(lease),
        created_at: at,
        updated_at: at,
    })
    .insert(&registering)
    .await
    .expect("the other key");

    let answer = tokio::spawn({
        let request = app
            .http
            .post(app.url("/v1/pagos"))
            .bearer_auth(crate::helpers::API_KEY)
            .header("Idempotency-Key", "k-race")
            .json(&payment_body());
        request.send()
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !answer.is_finished(),
        "the registration waits for the other request's transaction"
    );
    registering.commit().await.expect("commit");

    let answer = answer.await.expect("task").expect("answer");
    let problem =
        crate::helpers::problem(answer, 422, "the other request's key, another body").await;
    assert!(
        problem["type"]
            .as_str()
            .is_some_and(|t| t.ends_with("idempotency-key-reused")),
        "{problem}"
    );
    let payments = payment::Entity::find()
        .filter(payment::Column::IdempotencyKey.eq("k-race"))
        .all(&app.db)
        .await
        .expect("payments");
    assert_eq!(payments.len(), 1, "only the other request's payment");
    assert_eq!(payments[0].id, other.id);
    assert!(app.charges_seen().await.is_empty(), "nothing charged");
}
