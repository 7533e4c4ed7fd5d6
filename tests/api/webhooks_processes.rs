//! Webhooks to merchants with real `pagos serve` processes: two processes on one
//! PostgreSQL database share the deliveries without sending one attempt twice; a process
//! killed between a payment's transition and its delivery, or between sending and storing
//! the attempt, loses nothing (the example consumer still applies the event once).

use crate::helpers::{API_KEY, Backend, FakeGateway, TestDatabase, payment_body, send_json};
use crate::on_both_databases;
use crate::process::Serve;
use crate::receiver::Receiver;
use crate::webhooks_out::eventually;
use pagos::entities::webhook_attempt;
use pagos_client::webhooks::Verifier;
use sea_orm::{DatabaseConnection, EntityTrait};
use serde_json::json;
use std::collections::BTreeSet;
use std::time::Duration;
use wiremock::MockServer;

on_both_databases!(
    an_endpoint_deleted_while_its_attempt_is_stored_is_deleted_and_nothing_deadlocks,
    a_process_killed_after_claiming_a_delivery_loses_nothing,
    a_process_killed_after_sending_before_storing_redelivers_and_the_consumer_applies_once,
    a_delivery_claimed_as_the_process_is_told_to_stop_is_not_sent_and_is_given_back,
);

struct World {
    database: TestDatabase,
    db: DatabaseConnection,
    gateway: MockServer,
    http: reqwest::Client,
}

impl World {
    async fn new(backend: Backend) -> World {
        let (database, db) = TestDatabase::with_acme(&backend).await;
        let gateway = MockServer::start().await;
        FakeGateway::charging("succeeded").mount(&gateway).await;
        World {
            database,
            db,
            gateway,
            http: reqwest::Client::new(),
        }
    }

    async fn serve(&self, env: &[(&str, &str)]) -> Serve {
        self.serve_timing_out_after("1s", env).await
    }

    /// A process whose attempts time out after `timeout`.
    async fn serve_timing_out_after(&self, timeout: &str, env: &[(&str, &str)]) -> Serve {
        let uri = self.gateway.uri();
        let args = [
            "--database-url",
            &self.database.url,
            "--gateway",
            "http",
            "--gateway-url",
            &uri,
            "--webhooks-allow-private",
            "true",
            "--webhooks-timeout",
            timeout,
            "--webhooks-schedule",
            "0s,200ms,200ms,200ms,200ms,200ms",
        ];
        Serve::start(&args, env).await
    }

    async fn register(&self, serve: &Serve, url: &str) -> String {
        let made = send_json(
            self.http
                .post(format!("{}/v1/webhook-endpoints", serve.url))
                .bearer_auth(API_KEY)
                .json(&json!({ "url": url })),
        )
        .await;
        made["secreto"].as_str().expect("secret").to_owned()
    }

    async fn pay(&self, serve: &Serve, key: &str) {
        let answer = self
            .http
            .post(format!("{}/v1/pagos", serve.url))
            .bearer_auth(API_KEY)
            .header("Idempotency-Key", key)
            .json(&payment_body())
            .send()
            .await
            .expect("sent");
        assert_eq!(answer.status(), 201);
    }

    /// A process that aborts at `failpoint`, with `receiver` registered (and consuming) and
    /// a payment made through it.
    async fn paid_through_doomed(&self, failpoint: &str, receiver: &Receiver) -> Serve {
        let doomed = self.serve(&[("PAGOS_CRASH_AT", failpoint)]).await;
        let secret = self.register(&doomed, &receiver.url("/")).await;
        receiver.consume(Verifier::new(&secret).expect("verifier"));
        self.pay(&doomed, "k-1").await;
        doomed
    }

    async fn attempts(&self) -> Vec<webhook_attempt::Model> {
        webhook_attempt::Entity::find()
            .all(&self.db)
            .await
            .expect("attempts")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_processes_share_the_deliveries_without_sending_one_attempt_twice() {
    let Some(backend) = Backend::postgres() else {
        return;
    };
    let world = World::new(backend).await;
    let receiver = Receiver::start().await;
    let a = world.serve(&[]).await;
    let b = world.serve(&[]).await;
    let secret = world.register(&a, &receiver.url("/")).await;
    receiver.consume(Verifier::new(&secret).expect("verifier"));
    const PAYMENTS: usize = 40;
    for n in 0..PAYMENTS {
        let serve = if n % 2 == 0 { &a } else { &b };
        world.pay(serve, &format!("k-{n}")).await;
    }
    eventually(Duration::from_secs(30), "every event applied", async || {
        receiver.applied().len() >= PAYMENTS
    })
    .await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    let deliveries = receiver.deliveries();
    let ids: BTreeSet<String> = deliveries
        .iter()
        .map(|d| d.header("webhook-id").to_owned())
        .collect();
    assert_eq!(ids.len(), PAYMENTS);
    assert_eq!(deliveries.len(), PAYMENTS, "no event sent twice");
    let stored = world.attempts().await;
    assert_eq!(stored.len(), PAYMENTS);
    assert!(
        stored
            .iter()
            .all(|a| a.number == 1 && a.outcome == "delivered")
    );
    let sent_by = |serve: &Serve| serve.logs().matches("webhook attempt").count();
    eprintln!("attempts by process: {} and {}", sent_by(&a), sent_by(&b));
    assert_eq!(sent_by(&a) + sent_by(&b), PAYMENTS);
}

/// Two hosts whose clocks are each within what `serve` allows of the database's (2 s), on
/// either side of it: one writes a delivery's claim on its clock, the other reads it on
/// its own, 3.8 s ahead, and sees it run out that much early. The claiming process is slow
/// to begin its attempt (here 4 s after the claim, as a wait for a connection would be),
/// and the receiver is slower than the timeout. The other process must still not send
/// the same attempt while the first is in flight: every request the receiver got is an
/// attempt pagos stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_hosts_with_clocks_apart_never_send_one_attempt_twice() {
    use crate::receiver::Answer;
    use pagos::entities::webhook_delivery;
    let Some(backend) = Backend::postgres() else {
        return;
    };
    let world = World::new(backend).await;
    let behind = world
        .serve_timing_out_after(
            "3s",
            &[
                ("PAGOS_CLOCK_STEP", "-1900:0"),
                ("PAGOS_PAUSE_AT", "delivery_claimed:4000"),
            ],
        )
        .await;
    let receiver = Receiver::start().await;
    receiver.answer_next([Answer::Hang(Duration::from_secs(10))]);
    let secret = world.register(&behind, &receiver.url("/")).await;
    receiver.consume(Verifier::new(&secret).expect("verifier"));
    world.pay(&behind, "k-1").await;
    eventually(
        Duration::from_secs(10),
        "the slow process claims the delivery",
        async || {
            webhook_delivery::Entity::find()
                .all(&world.db)
                .await
                .expect("deliveries")
                .iter()
                .any(|d| d.claimed_until.is_some())
        },
    )
    .await;
    let ahead = world
        .serve_timing_out_after("3s", &[("PAGOS_CLOCK_STEP", "1900:0")])
        .await;

    eventually(Duration::from_secs(40), "the event delivered", async || {
        world
            .attempts()
            .await
            .iter()
            .any(|a| a.outcome == "delivered")
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let stored = world.attempts().await;
    let sent = receiver.deliveries();
    let numbers: BTreeSet<i32> = stored.iter().map(|a| a.number).collect();
    assert_eq!(
        numbers.len(),
        stored.len(),
        "one stored attempt per number: {stored:?}"
    );
    assert_eq!(
        sent.len(),
        stored.len(),
        "every request the receiver got is an attempt pagos stored (one sent twice is not): {} sent, attempts {numbers:?}\nbehind:\n{}\nahead:\n{}",
        sent.len(),
        behind.logs(),
        ahead.logs()
    );
    assert_eq!(receiver.applied().len(), 1);
}

/// A merchant deletes an endpoint while a worker stores an attempt to it. Before, on
/// PostgreSQL, the deletion locked the endpoint and waited for the delivery's row while the
/// worker held that row and waited for the endpoint (its attempt's foreign key): a
/// deadlock, and the merchant's DELETE answered 503, again at every retry while attempts
/// kept finishing. Here the deletion holds the endpoint (`endpoint_locked`) while the
/// receiver answers: the DELETE answers 204 and the endpoint is gone.
async fn an_endpoint_deleted_while_its_attempt_is_stored_is_deleted_and_nothing_deadlocks(
    backend: Backend,
) {
    let world = World::new(backend).await;
    let serve = world
        .serve(&[("PAGOS_PAUSE_AT", "endpoint_locked:3000")])
        .await;
    let receiver = Receiver::start().await;
    receiver.flaky(0.0, 1.0, Duration::from_secs(1), 5);
    let made = send_json(
        world
            .http
            .post(format!("{}/v1/webhook-endpoints", serve.url))
            .bearer_auth(API_KEY)
            .json(&json!({ "url": receiver.url("/") })),
    )
    .await;
    let endpoint = made["id"].as_str().expect("id").to_owned();
    world.pay(&serve, "k-1").await;
    eventually(
        Duration::from_secs(10),
        "the attempt under way",
        async || !receiver.deliveries().is_empty(),
    )
    .await;

    // Holds the endpoint 3 s; the receiver answers after 1 s, and the worker stores.
    let deleted = world
        .http
        .delete(format!("{}/v1/webhook-endpoints/{endpoint}", serve.url))
        .bearer_auth(API_KEY)
        .send()
        .await
        .expect("answered");

    assert_eq!(deleted.status(), 204, "{}", serve.logs());
    let left = send_json(
        world
            .http
            .get(format!("{}/v1/webhook-endpoints", serve.url))
            .bearer_auth(API_KEY),
    )
    .await;
    assert_eq!(left["endpoints"], json!([]), "the endpoint is gone");
    assert!(!serve.logs().contains("deadlock"), "{}", serve.logs());
}

async fn a_process_killed_after_claiming_a_delivery_loses_nothing(backend: Backend) {
    let world = World::new(backend).await;
    let receiver = Receiver::start().await;
    let mut doomed = world
        .paid_through_doomed("delivery_claimed", &receiver)
        .await;
    assert!(
        doomed.ended_by_itself(Duration::from_secs(10)).await,
        "the failpoint aborts the process:\n{}",
        doomed.logs()
    );
    assert!(receiver.deliveries().is_empty());

    let _restarted = world.serve(&[]).await;
    // The dead process's claim runs out (timeout + margin), then the event goes.
    eventually(
        Duration::from_secs(20),
        "delivered after the restart",
        async || receiver.applied().len() == 1,
    )
    .await;
    assert_eq!(receiver.deliveries().len(), 1);
}

async fn a_process_killed_after_sending_before_storing_redelivers_and_the_consumer_applies_once(
    backend: Backend,
) {
    let world = World::new(backend).await;
    let receiver = Receiver::start().await;
    let mut doomed = world.paid_through_doomed("delivery_sent", &receiver).await;
    assert!(doomed.ended_by_itself(Duration::from_secs(10)).await);
    assert_eq!(receiver.deliveries().len(), 1, "sent, never stored");
    assert!(world.attempts().await.is_empty());

    let _restarted = world.serve(&[]).await;
    eventually(Duration::from_secs(20), "sent again", async || {
        receiver.deliveries().len() == 2
    })
    .await;
    let deliveries = receiver.deliveries();
    assert_eq!(
        deliveries[0].header("webhook-id"),
        deliveries[1].header("webhook-id")
    );
    assert_eq!(
        receiver.applied().len(),
        1,
        "the duplicate is not applied again"
    );
    eventually(Duration::from_secs(5), "the attempt stored", async || {
        world.attempts().await.len() == 1
    })
    .await;
}

/// `SIGTERM` arrives while the delivery worker is claiming (here it pauses 3 s after the
/// claim). Before, the claimed attempt was still begun after the signal: with a grace
/// shorter than `PAGOS_WEBHOOKS_TIMEOUT` it was cut, and another process sent it again.
/// Now no attempt begins once the process is told to stop: the receiver gets nothing from
/// it, and the claim is given back at once (due now, held by nobody), so the next process
/// delivers the event without waiting for the claim to run out.
async fn a_delivery_claimed_as_the_process_is_told_to_stop_is_not_sent_and_is_given_back(
    backend: Backend,
) {
    use pagos::entities::webhook_delivery;
    let world = World::new(backend).await;
    let receiver = Receiver::start().await;
    // Attempts of up to 5 s: the claim (13 s) still has time for one after the pause.
    let mut stopping = world
        .serve_timing_out_after(
            "5s",
            &[
                ("PAGOS_PAUSE_AT", "delivery_claimed:3000"),
                ("PAGOS_DRAIN_DELAY", "0s"),
            ],
        )
        .await;
    let secret = world.register(&stopping, &receiver.url("/")).await;
    receiver.consume(Verifier::new(&secret).expect("verifier"));
    world.pay(&stopping, "k-1").await;
    let deliveries = async || {
        webhook_delivery::Entity::find()
            .all(&world.db)
            .await
            .expect("deliveries")
    };
    eventually(
        Duration::from_secs(10),
        "the delivery claimed",
        async || deliveries().await.iter().any(|d| d.claimed_until.is_some()),
    )
    .await;
    stopping.terminate();
    stopping
        .exits_cleanly(Duration::from_secs(20), "told to stop while claiming")
        .await;

    assert!(
        receiver.deliveries().is_empty(),
        "no attempt begun after the signal:\n{}",
        stopping.logs()
    );
    assert!(world.attempts().await.is_empty());
    let now = pagos::db::now();
    let left = deliveries().await;
    assert_eq!(left.len(), 1);
    assert!(
        left[0].claimed_until.is_none() && left[0].next_attempt_at <= now,
        "the claim given back, due now: {:?}",
        left[0]
    );

    let next = world.serve(&[]).await;
    eventually(
        Duration::from_secs(20),
        "the next process delivers",
        async || receiver.applied().len() == 1,
    )
    .await;
    drop(next);
    assert_eq!(receiver.deliveries().len(), 1);
}
