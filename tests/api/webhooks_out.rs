//! Webhooks to merchants end to end: pagos with its delivery worker, a real local
//! receiver (`receiver.rs`), both databases. Delivered and signed; a receiver that fails
//! 30 % and hangs 10 % gets every event at least once and the example consumer applies
//! each once; rotation; 410; reactivation with redelivery; deactivation after failing
//! too long.

use crate::helpers::{
    API_KEY, Backend, FakeGateway, OTHER_API_KEY, Spawn, TestApp, json, payment_body,
};
use crate::on_both_databases;
use crate::receiver::{Answer, Receiver};
use chrono::{DateTime, TimeDelta, Utc};
use pagos::delivery::schedule::{Retries, Schedule};
use pagos::delivery::{Attempt, Outcome};
use pagos::dispatcher::decide;
use pagos::entities::webhook_delivery::DeliveryState;
use pagos::entities::{event, webhook_attempt, webhook_delivery, webhook_endpoint};
use pagos::outbox::deliveries::Recorded;
use pagos_client::webhooks::Verifier;
use pagos_types::EventType;
use sea_orm::sea_query::Expr;
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, QuerySelect, TransactionTrait};
use serde_json::{Value, json};
use std::collections::{BTreeSet, HashMap};
use std::time::Duration;
use uuid::Uuid;

on_both_databases!(
    a_payment_is_delivered_signed_to_its_merchants_endpoint,
    a_flaky_receiver_gets_every_event_and_the_consumer_applies_each_once,
    during_a_rotation_both_secrets_sign_and_after_it_only_the_new,
    after_two_rotations_within_a_day_each_of_the_three_secrets_verifies_until_its_own_day_ends,
    two_rotations_at_once_each_hand_out_a_secret_that_signs,
    a_410_deactivates_the_endpoint_and_reactivation_redelivers,
    a_delivery_in_flight_when_its_endpoint_is_reactivated_is_sent_once,
    a_410_to_an_attempt_begun_before_a_reactivation_leaves_the_endpoint_active,
    an_attempt_in_flight_that_fails_after_a_reactivation_is_retried_in_the_new_round,
    an_endpoint_failing_past_the_horizon_is_deactivated_and_counted,
    a_delivery_given_up_is_counted_once_and_leaves_the_age_of_what_is_still_tried,
    redelivery_sends_events_already_delivered_again_with_the_same_id_and_bytes,
    a_dead_endpoint_does_not_slow_payments,
    a_refund_is_delivered_as_a_payment_is,
    a_full_fan_out_round_to_many_endpoints_makes_every_delivery,
    a_failure_stored_after_a_success_of_the_same_batch_does_not_deactivate_the_endpoint,
    one_passing_error_after_a_quiet_stretch_does_not_deactivate_an_endpoint_but_its_failed_retry_does,
    a_claim_holds_its_delivery_until_its_attempt_is_stored_whatever_reschedules_it,
    reactivating_with_redelivery_makes_exactly_the_wanted_events_since_then_pending_again,
    an_endpoint_that_hangs_holds_up_no_other_endpoints_deliveries,
    another_merchants_webhook_is_not_held_up_behind_one_endpoints_backlog,
    the_oldest_undelivered_age_leaves_out_deactivated_endpoints,
    pending_events_are_exactly_those_not_delivered_everywhere_in_commit_order_page_by_page,
);

/// Flags of a delivering app that may reach the local receiver, with a quick schedule.
pub const FLAGS: [&str; 6] = [
    "--webhooks-allow-private",
    "true",
    "--webhooks-timeout",
    "1s",
    "--webhooks-schedule",
    "0s,100ms,200ms,200ms,200ms,200ms,200ms,200ms,200ms,200ms,200ms,200ms,200ms,200ms,200ms,200ms,200ms,200ms,200ms,200ms,200ms,200ms,200ms,200ms,200ms",
];

/// A delivering app (`FLAGS`, then `extra`) whose payments succeed at the gateway.
pub async fn delivering(backend: Backend, extra: &[&'static str]) -> (TestApp, FakeGateway) {
    let mut flags = FLAGS.to_vec();
    flags.extend_from_slice(extra);
    let app = Spawn::new(backend).flags(&flags).delivering().start().await;
    let fake = app.with_fake(FakeGateway::charging("succeeded")).await;
    (app, fake)
}

/// A delivering app whose payments succeed, with `flags` and a local receiver allowed,
/// and a local receiver registered as the first merchant's endpoint: the app, its
/// gateway, the receiver and the endpoint as registered.
pub async fn delivering_to_a_receiver(
    backend: Backend,
    flags: &[&'static str],
) -> (TestApp, FakeGateway, Receiver, Value) {
    let mut all = vec!["--webhooks-allow-private", "true"];
    all.extend_from_slice(flags);
    let app = Spawn::new(backend).flags(&all).delivering().start().await;
    let fake = app.with_fake(FakeGateway::charging("succeeded")).await;
    let receiver = Receiver::start().await;
    let endpoint = app.register_endpoint(&receiver.url("/")).await;
    (app, fake, receiver, endpoint)
}

/// Waits until `done` holds, up to `within`.
pub async fn eventually(within: Duration, what: &str, mut done: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + within;
    while tokio::time::Instant::now() < deadline {
        if done().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("never happened: {what}");
}

pub async fn pay(app: &TestApp, key: &str) -> String {
    let answer = app.pay(key, &payment_body()).await;
    assert_eq!(answer.status(), 201);
    json(answer).await["id"].as_str().expect("id").to_owned()
}

pub async fn event_of(app: &TestApp, payment: &str) -> event::Model {
    let id = uuid::Uuid::parse_str(payment).expect("uuid");
    event::Entity::find()
        .filter(event::Column::SubjectId.eq(id))
        .one(&app.db)
        .await
        .expect("query")
        .expect("an event")
}

async fn pending_events(app: &TestApp) -> Vec<Value> {
    let page = json(
        app.get_as(API_KEY, "/v1/eventos?pendientes=true&limite=500")
            .await,
    )
    .await;
    page["eventos"].as_array().expect("events").clone()
}

async fn a_payment_is_delivered_signed_to_its_merchants_endpoint(backend: Backend) {
    let (app, _fake) = delivering(backend, &[]).await;
    let receiver = Receiver::start().await;
    let other = Receiver::start().await;
    let made = app.register_endpoint(&receiver.url("/hooks/pagos")).await;
    let secret = made["secreto"].as_str().expect("secret").to_owned();
    app.register_endpoint_as(OTHER_API_KEY, &json!({"url": other.url("/")}))
        .await;

    let paid = pay(&app, "k-1").await;
    eventually(Duration::from_secs(10), "the delivery", async || {
        receiver.deliveries().len() == 1
    })
    .await;
    let e = event_of(&app, &paid).await;
    let got = &receiver.deliveries()[0];
    assert_eq!(got.path, "/hooks/pagos");
    assert_eq!(got.header("webhook-id"), e.id);
    assert_eq!(got.body.as_ref(), e.body.as_bytes(), "the stored bytes");
    standardwebhooks::Webhook::new(&secret)
        .expect("secret")
        .verify(&got.body, &got.headers)
        .expect("the reference verifier accepts the delivery");
    let body: Value = serde_json::from_slice(&got.body).expect("json");
    assert_eq!(body["tipo"], "pago.completado");
    assert_eq!(body["datos"]["id"], paid.as_str());
    assert_eq!(body["datos"]["estado"], "COMPLETADA");

    let detail = json(app.get_as(API_KEY, &format!("/v1/eventos/{}", e.id)).await).await;
    eventually(Duration::from_secs(5), "the attempt stored", async || {
        let detail = json(app.get_as(API_KEY, &format!("/v1/eventos/{}", e.id)).await).await;
        detail["entregas"][0]["estado"] == "ENTREGADA"
    })
    .await;
    assert_eq!(detail["id"], e.id.as_str());
    let detail = json(app.get_as(API_KEY, &format!("/v1/eventos/{}", e.id)).await).await;
    assert_eq!(detail["entregas"][0]["intentos"], 1);
    assert_eq!(detail["intentos"][0]["numero"], 1);
    assert_eq!(detail["intentos"][0]["estadoHttp"], 200);
    assert_eq!(detail["intentos"][0]["respuesta"], "ok");
    assert_eq!(detail["intentos"][0]["resultado"], "delivered");
    assert!(pending_events(&app).await.is_empty());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        other.deliveries().is_empty(),
        "another merchant's endpoint gets nothing"
    );
}

async fn a_flaky_receiver_gets_every_event_and_the_consumer_applies_each_once(backend: Backend) {
    let (app, _fake) = delivering(backend, &[]).await;
    let receiver = Receiver::start().await;
    receiver.flaky(0.3, 0.1, Duration::from_secs(3), 7);
    let made = app.register_endpoint(&receiver.url("/")).await;
    receiver.consume(Verifier::new(made["secreto"].as_str().expect("secret")).expect("verifier"));

    const PAYMENTS: usize = 30;
    let mut paid = Vec::new();
    for n in 0..PAYMENTS {
        paid.push(pay(&app, &format!("k-{n}")).await);
    }
    let mut expected = BTreeSet::new();
    for p in &paid {
        expected.insert(event_of(&app, p).await.id);
    }
    eventually(Duration::from_secs(60), "every event applied", async || {
        receiver.applied().len() >= PAYMENTS
    })
    .await;
    eventually(Duration::from_secs(30), "nothing pending", async || {
        pending_events(&app).await.is_empty()
    })
    .await;
    let applied: Vec<String> = receiver.applied().iter().map(|e| e.id.clone()).collect();
    let unique: BTreeSet<String> = applied.iter().cloned().collect();
    assert_eq!(applied.len(), unique.len(), "each webhook-id applied once");
    assert_eq!(unique, expected, "every event, none lost");
    let deliveries = receiver.deliveries();
    assert!(
        deliveries.len() > PAYMENTS,
        "failures were retried: {}",
        deliveries.len()
    );
    let mut per_id: HashMap<String, usize> = HashMap::new();
    for d in &deliveries {
        *per_id.entry(d.header("webhook-id").to_owned()).or_default() += 1;
    }
    assert!(per_id.values().any(|&n| n > 1));
    let stored = webhook_attempt::Entity::find()
        .all(&app.db)
        .await
        .expect("attempts");
    assert_eq!(stored.len(), deliveries.len(), "every attempt stored");
}

async fn during_a_rotation_both_secrets_sign_and_after_it_only_the_new(backend: Backend) {
    let (app, _fake) = delivering(backend, &[]).await;
    let receiver = Receiver::start().await;
    let made = app.register_endpoint(&receiver.url("/")).await;
    let id = made["id"].as_str().expect("id");
    let old = made["secreto"].as_str().expect("secret").to_owned();
    let rotated = app.rotate_secret(id).await;
    let new = rotated["secreto"].as_str().expect("secret").to_owned();

    let during = &paid_and_delivered(&app, &receiver, "k-r1", 1, "the delivery").await;
    assert_eq!(during.header("webhook-signature").split(' ').count(), 2);
    for secret in [&old, &new] {
        standardwebhooks::Webhook::new(secret)
            .expect("secret")
            .verify(&during.body, &during.headers)
            .expect("both secrets verify during the overlap");
    }

    // The overlap ends.
    pagos::entities::webhook_endpoint::Entity::update_many()
        .col_expr(
            pagos::entities::webhook_endpoint::Column::PreviousSecretUntil,
            sea_orm::sea_query::Expr::value(Some(pagos::db::now() - chrono::TimeDelta::seconds(1))),
        )
        .exec(&app.db)
        .await
        .expect("updated");
    let after = &paid_and_delivered(&app, &receiver, "k-r2", 2, "the second delivery").await;
    assert_eq!(after.header("webhook-signature").split(' ').count(), 1);
    standardwebhooks::Webhook::new(&new)
        .expect("secret")
        .verify(&after.body, &after.headers)
        .expect("the new secret verifies");
    assert!(
        standardwebhooks::Webhook::new(&old)
            .expect("secret")
            .verify(&after.body, &after.headers)
            .is_err(),
        "the old secret no longer signs"
    );
}

/// A merchant that rotated, lost the answer and rotated again still holds the first secret:
/// it keeps verifying for 24 h after it was replaced, whatever rotations followed.
async fn after_two_rotations_within_a_day_each_of_the_three_secrets_verifies_until_its_own_day_ends(
    backend: Backend,
) {
    let (app, _fake) = delivering(backend, &[]).await;
    let receiver = Receiver::start().await;
    let made = app.register_endpoint(&receiver.url("/")).await;
    let id = made["id"].as_str().expect("id");
    let a = made["secreto"].as_str().expect("secret").to_owned();
    let mut rotated = Vec::new();
    for _ in 0..2 {
        let answer = app.rotate_secret(id).await;
        rotated.push(answer["secreto"].as_str().expect("secret").to_owned());
    }
    let (b, c) = (rotated[0].clone(), rotated[1].clone());
    let verifies = |secret: &str, delivery: &crate::receiver::Recorded| {
        standardwebhooks::Webhook::new(secret)
            .expect("secret")
            .verify(&delivery.body, &delivery.headers)
            .is_ok()
    };

    let during = &paid_and_delivered(&app, &receiver, "k-rr1", 1, "the delivery").await;
    for (name, secret) in [("A", &a), ("B", &b), ("C", &c)] {
        assert!(verifies(secret, during), "{name} alone verifies");
    }
    assert_eq!(during.header("webhook-signature").split(' ').count(), 3);

    // Each replaced secret has its own end: A's comes first (it was replaced first).
    let stored = webhook_endpoint::Entity::find()
        .one(&app.db)
        .await
        .expect("read")
        .expect("the endpoint");
    let (a_until, b_until) = (
        stored.older_secret_until.expect("A's end"),
        stored.previous_secret_until.expect("B's end"),
    );
    assert!(a_until <= b_until, "{a_until} {b_until}");
    assert!(a_until > pagos::db::now() + TimeDelta::hours(23));

    // A's 24 h end; B's go on.
    webhook_endpoint::Entity::update_many()
        .col_expr(
            webhook_endpoint::Column::OlderSecretUntil,
            Expr::value(Some(pagos::db::now() - TimeDelta::seconds(1))),
        )
        .exec(&app.db)
        .await
        .expect("updated");
    let after = &paid_and_delivered(&app, &receiver, "k-rr2", 2, "the second delivery").await;
    assert!(!verifies(&a, after), "A no longer signs");
    for (name, secret) in [("B", &b), ("C", &c)] {
        assert!(verifies(secret, after), "{name} alone still verifies");
    }
    assert_eq!(after.header("webhook-signature").split(' ').count(), 2);
}

/// Two rotations of one endpoint at once (a double click, a client that retries while its
/// first request still waits) each answer 200 with a secret of their own: each must sign
/// as it does when they come one after the other. On PostgreSQL both used to read the
/// endpoint before either wrote it, and the second wrote over the first: the secret the
/// first answer handed out never signed anything, and a merchant that kept it refused
/// every delivery.
async fn two_rotations_at_once_each_hand_out_a_secret_that_signs(backend: Backend) {
    let postgres = matches!(backend, Backend::Postgres(_));
    let (app, _fake) = delivering(backend, &[]).await;
    let receiver = Receiver::start().await;
    let made = app.register_endpoint(&receiver.url("/")).await;
    let id = made["id"].as_str().expect("id").to_owned();
    let a = made["secreto"].as_str().expect("secret").to_owned();
    // On PostgreSQL the endpoint's row is held while both rotations start, and let go once
    // both wait: what two requests arriving together can do, every time. (SQLite's
    // writers take turns.)
    let held = if postgres {
        let tx = app.db.begin().await.expect("begin");
        webhook_endpoint::Entity::find_by_id(Uuid::parse_str(&id).expect("uuid"))
            .lock_exclusive()
            .one(&tx)
            .await
            .expect("locked")
            .expect("the endpoint");
        Some(tx)
    } else {
        None
    };
    let let_go = async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        if let Some(tx) = held {
            tx.commit().await.expect("let go");
        }
    };
    let (first, second, ()) = tokio::join!(app.rotate_secret(&id), app.rotate_secret(&id), let_go);
    let b = first["secreto"].as_str().expect("secret").to_owned();
    let c = second["secreto"].as_str().expect("secret").to_owned();
    assert_ne!(b, c);

    let delivered = &paid_and_delivered(&app, &receiver, "k-rot2", 1, "the delivery").await;
    for (name, secret) in [
        ("the first", &a),
        ("one rotation's", &b),
        ("the other's", &c),
    ] {
        assert!(
            standardwebhooks::Webhook::new(secret)
                .expect("secret")
                .verify(&delivered.body, &delivered.headers)
                .is_ok(),
            "{name} secret verifies the delivery (signature header: {})",
            delivered.header("webhook-signature")
        );
    }
}

/// Pays with `key` and waits (up to 10 s) for the `n`th delivery; the delivery.
async fn paid_and_delivered(
    app: &TestApp,
    receiver: &Receiver,
    key: &str,
    n: usize,
    what: &str,
) -> crate::receiver::Recorded {
    pay(app, key).await;
    sent(receiver, n, what).await;
    receiver.deliveries()[n - 1].clone()
}

/// Waits (up to 10 s) until the receiver has got `n` deliveries (`what`).
async fn sent(receiver: &Receiver, n: usize, what: &str) {
    eventually(Duration::from_secs(10), what, async || {
        receiver.deliveries().len() == n
    })
    .await;
}

/// Waits up to `within` for the first endpoint to be deactivated; its reason names `why`.
async fn deactivated_within(app: &TestApp, within: Duration, why: &str) {
    eventually(within, "deactivated", async || {
        app.endpoints_of(API_KEY).await[0]["estado"] == "DESACTIVADO"
    })
    .await;
    assert!(
        app.endpoints_of(API_KEY).await[0]["motivoDesactivacion"]
            .as_str()
            .is_some_and(|m| m.contains(why))
    );
}

/// How many delivery rows there are, of every merchant and endpoint.
async fn delivery_rows(app: &TestApp) -> usize {
    webhook_delivery::Entity::find()
        .all(&app.db)
        .await
        .expect("deliveries")
        .len()
}

/// Reactivates endpoint `id`, redelivering what was written `since`.
async fn reactivate(
    app: &TestApp,
    id: &str,
    since: chrono::DateTime<chrono::Utc>,
) -> reqwest::Response {
    app.post_as(
        API_KEY,
        &format!("/v1/webhook-endpoints/{id}/reactivar"),
        &json!({"reenviarDesde": since.to_rfc3339()}),
    )
    .await
}

async fn a_410_deactivates_the_endpoint_and_reactivation_redelivers(backend: Backend) {
    let (app, _fake) = delivering(backend, &[]).await;
    let receiver = Receiver::start().await;
    receiver.answer_next([Answer::Status(410, "gone".into())]);
    let made = app.register_endpoint(&receiver.url("/")).await;
    let id = made["id"].as_str().expect("id").to_owned();
    let since = chrono::Utc::now() - chrono::TimeDelta::seconds(1);

    let first = pay(&app, "k-g1").await;
    deactivated_within(&app, Duration::from_secs(10), "410").await;
    let second = pay(&app, "k-g2").await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(
        receiver.deliveries().len(),
        1,
        "nothing sent to a deactivated endpoint"
    );
    // The second was written while the endpoint was down: never sent there, so it is
    // pending too (given up at once, no attempt), not missing from the list.
    let second_event = event_of(&app, &second).await.id;
    eventually(
        Duration::from_secs(5),
        "the second fanned out",
        async || deliveries_of(&app, &second_event).await.len() == 1,
    )
    .await;
    let given_up = &deliveries_of(&app, &second_event).await[0];
    assert_eq!(given_up["estado"], "ABANDONADA", "{given_up}");
    assert_eq!(given_up["intentos"], 0, "{given_up}");
    let pending: BTreeSet<String> = pending_events(&app)
        .await
        .iter()
        .map(|e| e["id"].as_str().expect("id").to_owned())
        .collect();
    assert_eq!(
        pending,
        [event_of(&app, &first).await.id, second_event.clone()].into(),
        "both are pending: the first still on its schedule, the second never sent"
    );

    let reactivated = reactivate(&app, &id, since).await;
    assert_eq!(reactivated.status(), 200);
    assert_eq!(json(reactivated).await["estado"], "ACTIVO");
    eventually(Duration::from_secs(10), "both redelivered", async || {
        receiver.deliveries().len() >= 3
    })
    .await;
    let ids: BTreeSet<String> = receiver.deliveries()[1..]
        .iter()
        .map(|d| d.header("webhook-id").to_owned())
        .collect();
    let expected: BTreeSet<String> = [
        event_of(&app, &first).await.id,
        event_of(&app, &second).await.id,
    ]
    .into();
    assert_eq!(ids, expected);
    eventually(Duration::from_secs(5), "nothing pending", async || {
        pending_events(&app).await.is_empty()
    })
    .await;
}

/// A delivering app whose endpoint (its id returned) is a receiver answering `answers`
/// first, with this attempt timeout and schedule: for tests that reactivate it while an
/// attempt is in flight.
async fn reactivated_later<const N: usize>(
    backend: Backend,
    timeout: &'static str,
    schedule: &'static str,
    answers: [Answer; N],
) -> (TestApp, FakeGateway, Receiver, String) {
    let app = Spawn::new(backend)
        .flags(&[
            "--webhooks-allow-private",
            "true",
            "--webhooks-timeout",
            timeout,
            "--webhooks-schedule",
            schedule,
        ])
        .delivering()
        .start()
        .await;
    let fake = app.with_fake(FakeGateway::charging("succeeded")).await;
    let receiver = Receiver::start().await;
    receiver.answer_next(answers);
    let made = app.register_endpoint(&receiver.url("/")).await;
    let id = made["id"].as_str().expect("id").to_owned();
    (app, fake, receiver, id)
}

/// Reactivates endpoint `id` without redelivery (`reactivate` redelivers), answered 200.
async fn reactivate_only(app: &TestApp, id: &str) {
    app.endpoint_action(id, "reactivar").await;
}

/// Reactivates endpoint `id` (`reactivate_only`) while the delivery of `event` is in
/// flight (`what`): it is still `PENDIENTE`, with `intentos` attempts stored.
async fn reactivated_in_flight(app: &TestApp, id: &str, event: &str, intentos: u64, what: &str) {
    reactivate_only(app, id).await;
    let at_reactivation = &deliveries_of(app, event).await[0];
    assert_eq!(
        (&at_reactivation["estado"], &at_reactivation["intentos"]),
        (&json!("PENDIENTE"), &json!(intentos)),
        "{what} was still in flight when the endpoint was reactivated"
    );
}

/// One delivery's attempt held in flight by the receiver (answered `held` later) while
/// another delivery to the same endpoint gets `410` and deactivates it; the endpoint is
/// reactivated before the held answer comes, and both are delivered in the end. The app,
/// the receiver, and the held and the gone events' ids.
async fn held_through_a_reactivation(
    backend: Backend,
    held: Answer,
) -> (TestApp, Receiver, String, String) {
    let (app, _fake, receiver, id) = reactivated_later(
        backend,
        "10s",
        FLAGS[5],
        [held, Answer::Status(410, "gone".into())],
    )
    .await;
    let held = event_of(&app, &pay(&app, "k-held").await).await.id;
    sent(&receiver, 1, "the held delivery sent").await;
    let gone = event_of(&app, &pay(&app, "k-gone").await).await.id;
    deactivated_within(&app, Duration::from_secs(10), "410").await;

    reactivated_in_flight(&app, &id, &held, 0, "the held delivery").await;

    eventually(Duration::from_secs(20), "both delivered", async || {
        deliveries_of(&app, &held).await[0]["estado"] == "ENTREGADA"
            && deliveries_of(&app, &gone).await[0]["estado"] == "ENTREGADA"
    })
    .await;
    (app, receiver, held, gone)
}

/// The receiver holds one delivery's answer (it is in flight) while another delivery to
/// the same endpoint gets `410`, and the endpoint is reactivated before the held answer
/// comes: the held event is received once and its attempt stored once; the one that got
/// the `410` is sent again at once. (Reactivating a `DESACTIVADO` endpoint made every
/// pending delivery due now, the one in flight included, and a worker sent that attempt a
/// second time.)
async fn a_delivery_in_flight_when_its_endpoint_is_reactivated_is_sent_once(backend: Backend) {
    let (app, receiver, held, gone) =
        held_through_a_reactivation(backend, Answer::Hang(Duration::from_secs(6))).await;
    let mut received: HashMap<String, usize> = HashMap::new();
    for d in receiver.deliveries() {
        *received
            .entry(d.header("webhook-id").to_owned())
            .or_default() += 1;
    }
    assert_eq!(
        received,
        HashMap::from([(held.clone(), 1), (gone.clone(), 2)]),
        "the held event once; the one that got the 410 again after the reactivation"
    );
    let detail = json(app.get_as(API_KEY, &format!("/v1/eventos/{held}")).await).await;
    assert_eq!(detail["entregas"][0]["intentos"], 1, "{detail}");
    let attempts = detail["intentos"].as_array().expect("attempts");
    assert_eq!(attempts.len(), 1, "{detail}");
    assert_eq!(attempts[0]["estadoHttp"], 200, "{detail}");
}

/// An attempt begun before the endpoint was reactivated is answered `410 Gone` after it:
/// the merchant, told `ACTIVO`, fixed what was gone; the old answer does not deactivate the
/// endpoint again (it did, and the deliveries the reactivation made due were not sent
/// until someone reactivated it once more). The attempt is tried again in the new round.
async fn a_410_to_an_attempt_begun_before_a_reactivation_leaves_the_endpoint_active(
    backend: Backend,
) {
    let (app, _receiver, held, _gone) =
        held_through_a_reactivation(backend, Answer::Late(Duration::from_secs(4), 410)).await;
    let endpoint = &app.endpoints_of(API_KEY).await[0];
    assert_eq!(endpoint["estado"], "ACTIVO", "{endpoint}");
    let detail = json(app.get_as(API_KEY, &format!("/v1/eventos/{held}")).await).await;
    let attempts = detail["intentos"].as_array().expect("attempts");
    assert_eq!(attempts.len(), 2, "the 410, then the new round's: {detail}");
    assert_eq!(attempts[0]["estadoHttp"], 410, "{detail}");
}

/// The endpoint is reactivated while the last attempt its schedule allows is in flight;
/// that attempt then fails. The reactivation started a new round, so the failure is the
/// new round's first: the delivery is tried again (and delivered), not given up.
async fn an_attempt_in_flight_that_fails_after_a_reactivation_is_retried_in_the_new_round(
    backend: Backend,
) {
    // The first attempt fails at once; the second, the round's last, outlasts the
    // timeout; the third (a new round's) is answered.
    let (app, _fake, receiver, id) = reactivated_later(
        backend,
        "3s",
        "0s,1s",
        [
            Answer::Status(500, "try later".into()),
            Answer::Hang(Duration::from_secs(6)),
        ],
    )
    .await;

    let event = event_of(&app, &pay(&app, "k-last").await).await.id;
    sent(&receiver, 2, "the second attempt sent").await;
    reactivated_in_flight(&app, &id, &event, 1, "the second attempt").await;

    eventually(Duration::from_secs(20), "delivered", async || {
        deliveries_of(&app, &event).await[0]["estado"] != "PENDIENTE"
    })
    .await;
    let detail = json(app.get_as(API_KEY, &format!("/v1/eventos/{event}")).await).await;
    assert_eq!(detail["entregas"][0]["estado"], "ENTREGADA", "{detail}");
    assert_eq!(detail["entregas"][0]["intentos"], 3, "{detail}");
    assert_eq!(receiver.deliveries().len(), 3, "each attempt sent once");
}

/// A delivery whose schedule ran out is sent no more: it is counted once, given up, and
/// no longer held in the age of what pagos still delivers (the alert on that age would
/// stand until the merchant asked for the event again, with nothing on-call could do).
async fn a_delivery_given_up_is_counted_once_and_leaves_the_age_of_what_is_still_tried(
    backend: Backend,
) {
    let (app, _fake, receiver, _) = delivering_to_a_receiver(
        backend,
        &[
            "--webhooks-timeout",
            "1s",
            "--webhooks-schedule",
            "0s,100ms",
            "--metrics-refresh",
            "100ms",
        ],
    )
    .await;
    receiver.flaky(1.0, 0.0, Duration::ZERO, 1);
    let pago = pay(&app, "k-given-up").await;
    let event = crate::outbox::events_of(&app, &pago).await[0].id.clone();
    eventually(
        Duration::from_secs(15),
        "the delivery given up",
        async || {
            deliveries_of(&app, &event)
                .await
                .first()
                .is_some_and(|d| d["estado"] == "ABANDONADA")
        },
    )
    .await;
    assert_eq!(
        receiver.deliveries().len(),
        2,
        "both attempts of the schedule"
    );
    app.scrape_until("one given up, nothing still tried", |text| {
        crate::helpers::has_line(text, "pagos_webhook_deliveries_given_up_total 1")
            && crate::helpers::has_line(text, "pagos_oldest_undelivered_event_age_seconds 0.0")
            && crate::helpers::has_line(text, "pagos_webhook_endpoints_disabled 0")
    })
    .await;
}

async fn an_endpoint_failing_past_the_horizon_is_deactivated_and_counted(backend: Backend) {
    let (app, _fake) = delivering(
        backend,
        &[
            "--webhooks-disable-after",
            "1s",
            "--metrics-refresh",
            "100ms",
        ],
    )
    .await;
    let receiver = Receiver::start().await;
    receiver.flaky(1.0, 0.0, Duration::ZERO, 1);
    app.register_endpoint(&receiver.url("/")).await;
    pay(&app, "k-d").await;
    deactivated_within(
        &app,
        Duration::from_secs(15),
        "PAGOS_WEBHOOKS_DISABLE_AFTER",
    )
    .await;
    assert!(receiver.deliveries().len() >= 2);
    // Its undelivered event is counted with the disabled endpoint, not in the age of
    // what active endpoints have not got.
    app.scrape_until("one endpoint disabled", |text| {
        crate::helpers::has_line(text, "pagos_webhook_endpoints_disabled 1")
            && text.contains("pagos_webhook_deliveries_total{outcome=\"failed\"}")
            && crate::helpers::has_line(text, "pagos_oldest_undelivered_event_age_seconds 0.0")
    })
    .await;
}

async fn redelivery_sends_events_already_delivered_again_with_the_same_id_and_bytes(
    backend: Backend,
) {
    let (app, _fake) = delivering(backend, &[]).await;
    let receiver = Receiver::start().await;
    let made = app.register_endpoint(&receiver.url("/")).await;
    let id = made["id"].as_str().expect("id").to_owned();
    receiver.consume(Verifier::new(made["secreto"].as_str().expect("secret")).expect("verifier"));
    let since = chrono::Utc::now() - chrono::TimeDelta::seconds(1);
    pay(&app, "k-a").await;
    eventually(Duration::from_secs(10), "delivered", async || {
        pending_events(&app).await.is_empty() && receiver.deliveries().len() == 1
    })
    .await;
    let again = reactivate(&app, &id, since).await;
    assert_eq!(again.status(), 200);
    eventually(Duration::from_secs(10), "delivered again", async || {
        receiver.deliveries().len() == 2
    })
    .await;
    let d = receiver.deliveries();
    assert_eq!(d[0].header("webhook-id"), d[1].header("webhook-id"));
    assert_eq!(d[0].body, d[1].body);
    assert_eq!(receiver.applied().len(), 1, "the consumer applies it once");
    eventually(Duration::from_secs(5), "both attempts stored", async || {
        webhook_attempt::Entity::find()
            .all(&app.db)
            .await
            .expect("attempts")
            .iter()
            .map(|a| a.number)
            .collect::<Vec<_>>()
            .len()
            == 2
    })
    .await;
}

/// Deliveries run off the payment path: while an endpoint holds its deliveries open (no
/// answer, no timeout yet), every payment is still answered, each with its event queued
/// behind the one that hangs.
async fn a_dead_endpoint_does_not_slow_payments(backend: Backend) {
    let (app, _fake, receiver, _) =
        delivering_to_a_receiver(backend, &["--webhooks-timeout", "60s"]).await;
    receiver.flaky(0.0, 1.0, Duration::from_secs(120), 3);
    pay(&app, "k-slow-0").await;
    eventually(
        Duration::from_secs(10),
        "the first delivery under way",
        async || !receiver.deliveries().is_empty(),
    )
    .await;
    for n in 1..10 {
        pay(&app, &format!("k-slow-{n}")).await;
    }
    let ended = webhook_attempt::Entity::find()
        .all(&app.db)
        .await
        .expect("attempts");
    assert!(
        ended.is_empty(),
        "every payment was answered while the first delivery still hung: {} attempts ended",
        ended.len()
    );
    assert_eq!(
        event::Entity::find()
            .all(&app.db)
            .await
            .expect("events")
            .len(),
        10,
        "each payment's event recorded"
    );
}

async fn a_refund_is_delivered_as_a_payment_is(backend: Backend) {
    let app = Spawn::new(backend).flags(&FLAGS).delivering().start().await;
    let fake = crate::refunds::FakeRefunds::default();
    fake.mount(app.gateway()).await;
    let receiver = Receiver::start().await;
    let made = app.register_endpoint(&receiver.url("/")).await;
    let secret = made["secreto"].as_str().expect("secret").to_owned();

    let payment = crate::refunds::paid(&app, "pay-1").await;
    let refunded = crate::refunds::refund(&app, &payment, "ref-1", &json!({"monto": 2000})).await;
    assert_eq!(refunded.status(), 201);
    let refunded = json(refunded).await;

    eventually(
        Duration::from_secs(10),
        "the payment's and the refund's events",
        async || receiver.deliveries().len() == 2,
    )
    .await;
    let got = receiver.deliveries();
    let told = got
        .iter()
        .find(|d| {
            serde_json::from_slice::<Value>(&d.body).expect("json")["tipo"]
                == "reembolso.completado"
        })
        .expect("the refund's event was delivered");
    standardwebhooks::Webhook::new(&secret)
        .expect("secret")
        .verify(&told.body, &told.headers)
        .expect("signed as every delivery is");
    let body: Value = serde_json::from_slice(&told.body).expect("json");
    assert_eq!(body["datos"], refunded, "the refund as it was answered");
}

/// Writes `n` events of acme's of type `tipo` created at `at`, queued for the fan-out, in
/// one transaction; their ids, oldest first.
async fn write_events(app: &TestApp, n: usize, tipo: EventType, at: DateTime<Utc>) -> Vec<String> {
    let merchant = crate::helpers::acme(&app.db).await;
    let tx = app.db.begin().await.expect("begin");
    let mut ids = Vec::new();
    for _ in 0..n {
        let e = pagos::outbox::event(merchant, tipo, Uuid::now_v7(), 1, "{}", at);
        pagos::outbox::record(&tx, &e).await.expect("recorded");
        ids.push(e.id);
    }
    tx.commit().await.expect("commit");
    ids
}

/// A `PagoCompletado` event of the other merchant (`globex`), written at `at`.
async fn write_theirs(app: &TestApp, at: DateTime<Utc>) -> event::Model {
    let globex = crate::helpers::merchant_id(&app.db, "globex").await;
    let theirs = pagos::outbox::event(
        globex,
        EventType::PagoCompletado,
        Uuid::now_v7(),
        1,
        "{}",
        at,
    );
    pagos::outbox::record(&app.db, &theirs)
        .await
        .expect("recorded");
    theirs
}

async fn deliveries_of(app: &TestApp, event: &str) -> Vec<Value> {
    let detail = json(app.get_as(API_KEY, &format!("/v1/eventos/{event}")).await).await;
    detail["entregas"].as_array().expect("deliveries").clone()
}

/// A round fans out up to 500 events; to 14 endpoints that is 7,000 delivery rows of 11
/// values each, more than one statement may bind on either database (65,535 on
/// PostgreSQL, 32,766 on SQLite). The round must still make them all, or no event of
/// anybody's ever reaches an endpoint again.
async fn a_full_fan_out_round_to_many_endpoints_makes_every_delivery(backend: Backend) {
    const ENDPOINTS: usize = 14;
    const EVENTS: u64 = 500;
    let app = Spawn::new(backend).start().await;
    for n in 0..ENDPOINTS {
        app.register_endpoint(&format!("https://93.184.215.14/hooks/{n}"))
            .await;
    }
    let ids = write_events(
        &app,
        usize::try_from(EVENTS).expect("small"),
        EventType::PagoCompletado,
        pagos::db::now(),
    )
    .await;

    let fanned = pagos::outbox::deliveries::fan_out(&app.db, EVENTS, |t| t)
        .await
        .expect("the round's fan-out is stored");
    assert_eq!(fanned, ids.len());
    for id in [&ids[0], &ids[ids.len() / 2], &ids[ids.len() - 1]] {
        let entregas = deliveries_of(&app, id).await;
        assert_eq!(entregas.len(), ENDPOINTS, "{id}: one per endpoint");
        assert!(entregas.iter().all(|e| e["estado"] == "PENDIENTE"));
    }
    assert_eq!(delivery_rows(&app).await, ids.len() * ENDPOINTS);
    assert_eq!(
        pagos::outbox::deliveries::fan_out(&app.db, EVENTS, |t| t)
            .await
            .expect("the next round"),
        0,
        "nothing is left to fan out"
    );
}

fn attempt(status: u16, outcome: Outcome) -> Attempt {
    Attempt {
        at: pagos::db::now(),
        status: Some(status),
        latency: Duration::from_millis(5),
        answer: String::new(),
        error: None,
        remote: None,
        outcome,
    }
}

/// An endpoint failing since two hours ago (a one-hour horizon) answers one delivery of a
/// batch with a 2xx and fails another; the failure is stored after the success. The
/// endpoint that just answered stays `ACTIVO`, failing since that failure only.
async fn a_failure_stored_after_a_success_of_the_same_batch_does_not_deactivate_the_endpoint(
    backend: Backend,
) {
    let app = Spawn::new(backend).start().await;
    let made = app.register_endpoint("https://93.184.215.14/hooks").await;
    let id = Uuid::parse_str(made["id"].as_str().expect("id")).expect("uuid");
    write_events(&app, 2, EventType::PagoCompletado, pagos::db::now()).await;
    pagos::outbox::deliveries::fan_out(&app.db, 500, |t| t)
        .await
        .expect("fanned out");
    let long_ago = pagos::db::now() - TimeDelta::hours(2);
    webhook_endpoint::Entity::update_many()
        .col_expr(
            webhook_endpoint::Column::FailingSince,
            Expr::value(Some(long_ago)),
        )
        .filter(webhook_endpoint::Column::Id.eq(id))
        .exec(&app.db)
        .await
        .expect("failing since long ago");
    let now = pagos::db::now();
    let batch = pagos::outbox::deliveries::claim_due(
        &app.db,
        now,
        32,
        TimeDelta::seconds(20),
        pagos::dispatcher::PER_ENDPOINT,
        &HashMap::new(),
    )
    .await
    .expect("claimed");
    assert_eq!(batch.len(), 2);
    let retries = Retries {
        schedule: Schedule::parse("0s,5s,5m").expect("schedule"),
        disable_after: Duration::from_secs(3600),
    };

    let ok = attempt(200, Outcome::Delivered);
    let (after, endpoint) = decide(&retries, &batch[0], &ok, 0.5);
    let _ = pagos::outbox::deliveries::record(&app.db, &batch[0], &ok, after, endpoint)
        .await
        .expect("the success stored");
    let failed = attempt(500, Outcome::Failed { not_before: None });
    let (after, endpoint) = decide(&retries, &batch[1], &failed, 0.5);
    let _ = pagos::outbox::deliveries::record(&app.db, &batch[1], &failed, after, endpoint)
        .await
        .expect("the failure stored");

    let listed = &app.endpoints_of(API_KEY).await[0];
    assert_eq!(listed["estado"], "ACTIVO", "{listed}");
    assert!(listed["motivoDesactivacion"].is_null());
    let row = webhook_endpoint::Entity::find_by_id(id)
        .one(&app.db)
        .await
        .expect("query")
        .expect("the endpoint");
    assert!(
        row.failing_since.is_some_and(|t| t >= ok.at),
        "failing since the failure after the success, not since before it: {:?}",
        row.failing_since
    );
    for d in &batch {
        assert_eq!(
            deliveries_of(&app, &d.event.id).await[0]["intentos"],
            1,
            "both attempts stored"
        );
    }
}

/// An endpoint's deliveries failed two hours ago and were given up (a one-hour horizon,
/// a one-attempt schedule): nothing was tried since, and it still counts as failing since
/// then. Its next event's first attempt fails once: a passing error after a quiet
/// stretch, so the endpoint stays `ACTIVO`. That delivery's retry failing too is the
/// endpoint down for the horizon: `DESACTIVADO`, however few events it gets.
async fn one_passing_error_after_a_quiet_stretch_does_not_deactivate_an_endpoint_but_its_failed_retry_does(
    backend: Backend,
) {
    let app = Spawn::new(backend).start().await;
    let made = app.register_endpoint("https://93.184.215.14/hooks").await;
    let id = Uuid::parse_str(made["id"].as_str().expect("id")).expect("uuid");
    let once = Retries {
        schedule: Schedule::parse("0s").expect("schedule"),
        disable_after: Duration::from_secs(3600),
    };
    let keeps_trying = Retries {
        schedule: Schedule::parse("0s,1h,1h").expect("schedule"),
        ..once.clone()
    };
    let claim = async || {
        pagos::outbox::deliveries::fan_out(&app.db, 500, |t| t)
            .await
            .expect("fanned out");
        pagos::outbox::deliveries::claim_due(
            &app.db,
            pagos::db::now(),
            32,
            TimeDelta::seconds(20),
            pagos::dispatcher::PER_ENDPOINT,
            &HashMap::new(),
        )
        .await
        .expect("claimed")
    };
    let fail_at =
        async |due: &pagos::outbox::deliveries::Due, at: DateTime<Utc>, retries: &Retries| {
            let failed = Attempt {
                at,
                ..attempt(502, Outcome::Failed { not_before: None })
            };
            let (after, endpoint) = decide(retries, due, &failed, 0.5);
            let _ = pagos::outbox::deliveries::record(&app.db, due, &failed, after, endpoint)
                .await
                .expect("the failure stored");
        };
    let estado = async || app.endpoints_of(API_KEY).await[0]["estado"].clone();
    let two_hours_ago = pagos::db::now() - TimeDelta::hours(2);

    write_events(&app, 2, EventType::PagoCompletado, two_hours_ago).await;
    let batch = claim().await;
    assert_eq!(batch.len(), 2);
    for due in &batch {
        fail_at(due, two_hours_ago, &once).await;
    }
    for due in &batch {
        assert_eq!(
            deliveries_of(&app, &due.event.id).await[0]["estado"],
            "ABANDONADA"
        );
    }

    // The one delivery due fails now; the endpoint's state after it.
    let fail_the_one_due = async || {
        let batch = claim().await;
        assert_eq!(batch.len(), 1);
        fail_at(&batch[0], pagos::db::now(), &keeps_trying).await;
        estado().await
    };

    // Its next event, two hours later: the first attempt fails.
    write_events(&app, 1, EventType::PagoCompletado, pagos::db::now()).await;
    assert_eq!(
        fail_the_one_due().await,
        "ACTIVO",
        "one passing error after a quiet stretch"
    );

    // Its retry fails too.
    webhook_delivery::Entity::update_many()
        .col_expr(
            webhook_delivery::Column::NextAttemptAt,
            Expr::value(pagos::db::now() - TimeDelta::seconds(1)),
        )
        .filter(webhook_delivery::Column::State.eq(DeliveryState::Pending))
        .exec(&app.db)
        .await
        .expect("the retry due now");
    assert_eq!(
        fail_the_one_due().await,
        "DESACTIVADO",
        "failing for two hours, retried"
    );
    let row = webhook_endpoint::Entity::find_by_id(id)
        .one(&app.db)
        .await
        .expect("query")
        .expect("the endpoint");
    assert!(
        row.disabled_reason
            .is_some_and(|r| r.contains("PAGOS_WEBHOOKS_DISABLE_AFTER"))
    );
}

/// Two workers and one delivery: A's claim runs out before A stores its attempt, B claims
/// the delivery and sends the same attempt. A's store (first) makes the delivery due again
/// at once, yet no other claim takes it while B holds it; B's store (second) is refused,
/// the attempt stored once. And a worker's stored attempt ends its claim: the retry is
/// claimed when it is due, not when the claim would have run out.
async fn a_claim_holds_its_delivery_until_its_attempt_is_stored_whatever_reschedules_it(
    backend: Backend,
) {
    let app = Spawn::new(backend).start().await;
    app.register_endpoint("https://93.184.215.14/hooks").await;
    let fan_out = async || {
        pagos::outbox::deliveries::fan_out(&app.db, 500, |t| t)
            .await
            .expect("fanned out")
    };
    let held = write_events(&app, 1, EventType::PagoCompletado, pagos::db::now()).await;
    fan_out().await;
    let retries = Retries {
        schedule: Schedule::parse("0s,1s,1m").expect("schedule"),
        disable_after: Duration::from_secs(3600),
    };
    let claim = async |at: DateTime<Utc>, hold: i64| {
        pagos::outbox::deliveries::claim_due(
            &app.db,
            at,
            1,
            TimeDelta::seconds(hold),
            pagos::dispatcher::PER_ENDPOINT,
            &HashMap::new(),
        )
        .await
        .expect("claimed")
    };
    let failed = || attempt(500, Outcome::Failed { not_before: None });
    let store = async |due: &pagos::outbox::deliveries::Due| {
        let attempt = failed();
        let (after, endpoint) = decide(&retries, due, &attempt, 0.5);
        assert!(matches!(
            after,
            pagos::outbox::deliveries::After::RetryAt(_)
        ));
        pagos::outbox::deliveries::record(&app.db, due, &attempt, after, endpoint)
            .await
            .expect("stored")
    };
    let now = pagos::db::now();

    let a = claim(now, 20).await;
    assert_eq!(a.len(), 1);
    let b = claim(now + TimeDelta::seconds(25), 60).await;
    assert_eq!(b.len(), 1, "A's claim ran out: B takes the delivery");
    assert_eq!(
        (&a[0].delivery.event_id, &b[0].delivery.event_id),
        (&held[0], &held[0])
    );
    assert_eq!(store(&a[0]).await, Recorded::Stored, "A's attempt");
    assert!(
        claim(now + TimeDelta::seconds(25), 20).await.is_empty(),
        "due again after A's store, but B holds it"
    );
    assert_eq!(
        store(&b[0]).await,
        Recorded::Raced,
        "the same attempt again"
    );
    let detail = json(
        app.get_as(API_KEY, &format!("/v1/eventos/{}", held[0]))
            .await,
    )
    .await;
    assert_eq!(detail["entregas"][0]["intentos"], 1, "{detail}");
    assert_eq!(
        detail["intentos"].as_array().expect("attempts").len(),
        1,
        "{detail}"
    );

    let next = write_events(&app, 1, EventType::PagoCompletado, pagos::db::now()).await;
    fan_out().await;
    let now = pagos::db::now();
    let other = claim(now, 20).await;
    assert_eq!(other.len(), 1);
    assert_eq!(other[0].delivery.event_id, next[0]);
    assert_eq!(store(&other[0]).await, Recorded::Stored);
    let retried = claim(now + TimeDelta::seconds(10), 20).await;
    assert_eq!(
        retried
            .iter()
            .map(|d| d.delivery.event_id.clone())
            .collect::<Vec<_>>(),
        next,
        "its retry is due 1 s after its attempt, its claim ended with the attempt stored"
    );
}

/// A delivery row of `event` to `endpoint` in `state`, after `attempts` attempts, its next
/// attempt due at `next`.
async fn delivery_row(
    app: &TestApp,
    event: &str,
    endpoint: Uuid,
    state: DeliveryState,
    attempts: i32,
    next: DateTime<Utc>,
) {
    let merchant = crate::helpers::acme(&app.db).await;
    let at = pagos::db::now() - TimeDelta::hours(1);
    webhook_delivery::Entity::insert(webhook_delivery::ActiveModel::from(
        webhook_delivery::Model {
            event_id: event.to_owned(),
            endpoint_id: endpoint,
            merchant_id: merchant,
            state,
            attempts,
            round_start: 0,
            next_attempt_at: next,
            claimed_until: None,
            delivered_at: (state == DeliveryState::Delivered).then_some(at),
            created_at: at,
            updated_at: at,
        },
    ))
    .exec_without_returning(&app.db)
    .await
    .expect("a delivery row");
}

async fn delivery_of(
    app: &TestApp,
    event: &str,
    endpoint: Uuid,
) -> Option<webhook_delivery::Model> {
    webhook_delivery::Entity::find_by_id((event.to_owned(), endpoint))
        .one(&app.db)
        .await
        .expect("query")
}

/// What `reenviarDesde` makes pending again, and what it leaves alone: every event of the
/// merchant since then of a type the endpoint wants, delivered before or given up (its
/// schedule starting over, its attempts kept) or never fanned out to it (a new delivery);
/// one already pending is sent now (its round starts over, its attempts kept: the
/// endpoint works again, says on-call) but not made twice; never older events, other
/// types or another merchant's events.
async fn reactivating_with_redelivery_makes_exactly_the_wanted_events_since_then_pending_again(
    backend: Backend,
) {
    let app = Spawn::new(backend).start().await;
    let made = app
        .register_endpoint_as(
            API_KEY,
            &json!({"url": "https://93.184.215.14/hooks", "eventos": ["pago.completado", "pago.fallido"]}),
        )
        .await;
    let endpoint = Uuid::parse_str(made["id"].as_str().expect("id")).expect("uuid");
    let now = pagos::db::now();
    let since = now - TimeDelta::minutes(90);
    let later = now + TimeDelta::hours(3);

    let old = write_events(
        &app,
        1,
        EventType::PagoCompletado,
        now - TimeDelta::hours(2),
    )
    .await;
    let recent = write_events(&app, 4, EventType::PagoFallido, now - TimeDelta::hours(1)).await;
    let unwanted = write_events(
        &app,
        1,
        EventType::ReembolsoCompletado,
        now - TimeDelta::hours(1),
    )
    .await;
    let theirs = write_theirs(&app, now - TimeDelta::hours(1)).await;
    // Nothing fanned out by the worker: the rows are the test's own.
    pagos::entities::event_to_fan_out::Entity::delete_many()
        .exec(&app.db)
        .await
        .expect("queue emptied");
    let (delivered, given_up, pending, never) = (&recent[0], &recent[1], &recent[2], &recent[3]);
    delivery_row(&app, &old[0], endpoint, DeliveryState::Delivered, 1, since).await;
    delivery_row(
        &app,
        delivered,
        endpoint,
        DeliveryState::Delivered,
        2,
        since,
    )
    .await;
    delivery_row(&app, given_up, endpoint, DeliveryState::GivenUp, 3, since).await;
    delivery_row(&app, pending, endpoint, DeliveryState::Pending, 1, later).await;

    let answer = app
        .post_as(
            API_KEY,
            &format!("/v1/webhook-endpoints/{endpoint}/reactivar"),
            &json!({"reenviarDesde": since.to_rfc3339()}),
        )
        .await;
    assert_eq!(answer.status(), 200);
    let after = pagos::db::now();

    let old_row = delivery_of(&app, &old[0], endpoint).await.expect("kept");
    assert_eq!(
        (old_row.state, old_row.attempts, old_row.round_start),
        (DeliveryState::Delivered, 1, 0),
        "before reenviarDesde: left delivered"
    );
    for (event, attempts) in [(delivered, 2), (given_up, 3)] {
        let row = delivery_of(&app, event, endpoint).await.expect("kept");
        assert_eq!(row.state, DeliveryState::Pending, "{event}");
        assert_eq!(row.attempts, attempts, "its attempts are kept");
        assert_eq!(row.round_start, attempts, "its schedule starts over");
        assert!(row.next_attempt_at >= now && row.next_attempt_at <= after);
    }
    assert!(
        delivery_of(&app, delivered, endpoint)
            .await
            .is_some_and(|d| d.delivered_at.is_some()),
        "when it was delivered is kept"
    );
    // But the merchant is not told it delivered while its new round has not.
    let detail = json(
        app.get_as(API_KEY, &format!("/v1/eventos/{delivered}"))
            .await,
    )
    .await;
    assert_eq!(detail["entregas"][0]["estado"], "PENDIENTE", "{detail}");
    assert!(
        detail["entregas"][0]["entregadaEn"].is_null(),
        "not delivered in this round: {detail}"
    );
    let on_its_way = delivery_of(&app, pending, endpoint).await.expect("kept");
    assert_eq!(
        (
            on_its_way.state,
            on_its_way.attempts,
            on_its_way.round_start
        ),
        (DeliveryState::Pending, 1, 1),
        "a pending delivery of an active endpoint starts a new round, its attempts kept"
    );
    assert!(
        on_its_way.next_attempt_at >= now && on_its_way.next_attempt_at <= after,
        "and is due now, not at {later}: {}",
        on_its_way.next_attempt_at
    );
    let new = delivery_of(&app, never, endpoint).await.expect("made");
    assert_eq!(new.state, DeliveryState::Pending);
    assert_eq!((new.attempts, new.round_start), (0, 0));
    assert_eq!(new.delivered_at, None);
    assert!(new.next_attempt_at >= now && new.next_attempt_at <= after);
    assert_eq!(new.merchant_id, crate::helpers::acme(&app.db).await);
    assert!(delivery_of(&app, &unwanted[0], endpoint).await.is_none());
    assert!(delivery_of(&app, &theirs.id, endpoint).await.is_none());
    let entregas = deliveries_of(&app, never).await;
    assert_eq!(entregas.len(), 1);
    assert_eq!(entregas[0]["estado"], "PENDIENTE");
    assert_eq!(entregas[0]["intentos"], 0);
    assert_eq!(delivery_rows(&app).await, 5);
}

/// One merchant endpoint that never answers (each attempt waits out a 20 s timeout) and
/// one that answers at once, both wanting the same 40 events: the healthy one gets all
/// of them while the hanging one's first attempts are still waiting, and the hanging one
/// holds no more attempts than `PER_ENDPOINT`. (Rounds that waited for their slowest
/// attempt gave the healthy endpoint 16 events per timeout.)
async fn an_endpoint_that_hangs_holds_up_no_other_endpoints_deliveries(backend: Backend) {
    let app = Spawn::new(backend)
        .flags(&[
            "--webhooks-allow-private",
            "true",
            "--webhooks-timeout",
            "20s",
        ])
        .delivering()
        .start()
        .await;
    let hanging = Receiver::start().await;
    hanging.flaky(0.0, 1.0, Duration::from_secs(60), 7);
    let healthy = Receiver::start().await;
    app.register_endpoint(&hanging.url("/")).await;
    app.register_endpoint(&healthy.url("/")).await;

    let events = write_events(&app, 40, EventType::PagoCompletado, pagos::db::now()).await;
    eventually(
        Duration::from_secs(15),
        "every event at the healthy endpoint",
        async || {
            healthy
                .deliveries()
                .iter()
                .map(|d| d.header("webhook-id").to_owned())
                .collect::<BTreeSet<_>>()
                .len()
                == events.len()
        },
    )
    .await;
    let stored = webhook_attempt::Entity::find()
        .all(&app.db)
        .await
        .expect("attempts");
    let healthy_endpoint = stored
        .iter()
        .filter(|a| a.status == Some(200))
        .map(|a| a.endpoint_id)
        .collect::<BTreeSet<_>>();
    assert_eq!(healthy_endpoint.len(), 1, "the healthy endpoint's attempts");
    assert!(
        stored.iter().all(|a| a.status == Some(200)),
        "no attempt of the hanging endpoint has ended yet: {} stored",
        stored.len()
    );
    assert!(
        hanging.deliveries().len() <= pagos::dispatcher::PER_ENDPOINT,
        "the hanging endpoint holds {} attempts",
        hanging.deliveries().len()
    );
}

/// A backlog of one merchant's due deliveries to a fast endpoint (what a reactivation with
/// `reenviarDesde` far back makes) does not hold up another merchant's webhook: it is
/// claimed beside the backlog's first attempts, not after the whole backlog. (Claims took
/// the oldest due rows and then kept `PER_ENDPOINT` of them: every claim was the backlog's.)
async fn another_merchants_webhook_is_not_held_up_behind_one_endpoints_backlog(backend: Backend) {
    const BACKLOG: usize = 400;
    let (app, _fake) = delivering(backend, &[]).await;
    let busy = Receiver::start().await;
    let other = Receiver::start().await;
    app.register_endpoint(&busy.url("/")).await;
    app.register_endpoint_as(OTHER_API_KEY, &json!({"url": other.url("/")}))
        .await;

    write_events(
        &app,
        BACKLOG,
        EventType::PagoCompletado,
        pagos::db::now() - TimeDelta::hours(1),
    )
    .await;
    let answer = app.pay_as(OTHER_API_KEY, "k-other", &payment_body()).await;
    assert_eq!(answer.status(), 201);
    eventually(
        Duration::from_secs(60),
        "the other merchant's webhook",
        async || !other.deliveries().is_empty(),
    )
    .await;
    let arrived = other.deliveries()[0].at;
    let before = busy.deliveries().iter().filter(|d| d.at <= arrived).count();
    assert!(
        before < BACKLOG / 4,
        "the other merchant's webhook came after {before} of the backlog's {BACKLOG}"
    );
    eventually(
        Duration::from_secs(60),
        "the backlog delivered",
        async || busy.deliveries().len() >= BACKLOG,
    )
    .await;
}

/// `pagos_oldest_undelivered_event_age_seconds` (and the alert on it) is about endpoints
/// that are `ACTIVO`: an event left undelivered to an endpoint that went `DESACTIVADO`
/// does not keep it up forever; that endpoint is counted in
/// `pagos_webhook_endpoints_disabled` instead.
async fn the_oldest_undelivered_age_leaves_out_deactivated_endpoints(backend: Backend) {
    let (app, _fake) = delivering(backend, &["--metrics-refresh", "100ms"]).await;
    let receiver = Receiver::start().await;
    receiver.flaky(1.0, 0.0, Duration::ZERO, 1);
    app.register_endpoint(&receiver.url("/")).await;
    pay(&app, "k-u").await;
    let undelivered = |text: &str| {
        text.lines()
            .find(|l| l.starts_with("pagos_oldest_undelivered_event_age_seconds "))
            .map(str::to_owned)
    };
    app.scrape_until("an event undelivered to an active endpoint", |text| {
        undelivered(text).is_some_and(|l| !l.ends_with(" 0.0"))
    })
    .await;
    receiver.answer_next([Answer::Status(410, "gone".into())]);
    deactivated_within(&app, Duration::from_secs(10), "410").await;
    let text = app
        .scrape_until("nothing undelivered to an active endpoint", |text| {
            crate::helpers::has_line(text, "pagos_oldest_undelivered_event_age_seconds 0.0")
        })
        .await;
    assert!(
        crate::helpers::has_line(&text, "pagos_webhook_endpoints_disabled 1"),
        "{text}"
    );
    assert_eq!(
        pending_events(&app).await.len(),
        1,
        "still listed as pending"
    );
}

/// `pendientes=true` lists exactly the merchant's events not yet delivered to every
/// endpoint — not fanned out yet, or with a delivery `PENDIENTE` or `ABANDONADA` — in the
/// order of the whole list, page by page with its cursor; never another merchant's.
async fn pending_events_are_exactly_those_not_delivered_everywhere_in_commit_order_page_by_page(
    backend: Backend,
) {
    let app = Spawn::new(backend).start().await;
    let made = app.register_endpoint("https://93.184.215.14/hooks").await;
    let endpoint = Uuid::parse_str(made["id"].as_str().expect("id")).expect("uuid");
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.extend(write_events(&app, 2, EventType::PagoCompletado, pagos::db::now()).await);
    }
    write_theirs(&app, pagos::db::now()).await;
    // Fanned out by hand but the last of acme's (still queued) and globex's.
    pagos::entities::event_to_fan_out::Entity::delete_many()
        .filter(pagos::entities::event_to_fan_out::Column::EventId.is_in(ids[..5].to_vec()))
        .exec(&app.db)
        .await
        .expect("fanned out");
    let later = pagos::db::now() + TimeDelta::hours(1);
    for (id, state) in [
        (&ids[0], DeliveryState::Delivered),
        (&ids[1], DeliveryState::Pending),
        (&ids[2], DeliveryState::Delivered),
        (&ids[3], DeliveryState::GivenUp),
        (&ids[4], DeliveryState::Delivered),
    ] {
        delivery_row(&app, id, endpoint, state, 1, later).await;
    }
    let pending: BTreeSet<&String> = [&ids[1], &ids[3], &ids[5]].into();

    let listed = |query: String| {
        let app = &app;
        async move {
            let mut seen = Vec::new();
            let mut cursor: Option<String> = None;
            loop {
                let path = match &cursor {
                    Some(c) => format!("/v1/eventos?limite=1&{query}&desde={c}"),
                    None => format!("/v1/eventos?limite=1&{query}"),
                };
                let page = json(app.get_as(API_KEY, &path).await).await;
                for e in page["eventos"].as_array().expect("events") {
                    seen.push(e["id"].as_str().expect("id").to_owned());
                }
                match page["siguiente"].as_str() {
                    Some(next) => cursor = Some(next.to_owned()),
                    None => return seen,
                }
            }
        }
    };
    let all = listed("pendientes=false".into()).await;
    assert_eq!(all.len(), ids.len(), "{all:?}");
    let expected: Vec<String> = all.into_iter().filter(|id| pending.contains(id)).collect();
    assert_eq!(listed("pendientes=true".into()).await, expected);
    // Resuming after a delivered event passes over nothing pending behind it.
    let after_first = json(
        app.get_as(
            API_KEY,
            &format!("/v1/eventos?pendientes=true&desde={}", ids[0]),
        )
        .await,
    )
    .await;
    let resumed: Vec<&str> = after_first["eventos"]
        .as_array()
        .expect("events")
        .iter()
        .map(|e| e["id"].as_str().expect("id"))
        .collect();
    assert_eq!(
        resumed,
        expected.iter().map(String::as_str).collect::<Vec<_>>()
    );
}
