//! Crashes at every step of the refund saga, with real processes, as `crash.rs` does for
//! payments: pagos aborts at a refund failpoint (as a SIGKILL would), `pagos reconcile
//! --once` settles what it left, and the gateway holds exactly one refund; the client's
//! retry gets the final answer.

use crate::helpers::{API_KEY, Backend, json, payment_body};
use crate::on_both_databases;
use crate::refunds::FakeRefunds;
use pagos::entities::refund;
use sea_orm::EntityTrait;
use serde_json::json;
use std::time::Duration;

on_both_databases!(
    a_crash_after_registering_a_refund_is_sent_once_by_the_reconciler,
    a_crash_after_marking_a_refund_sent_is_resent_with_the_same_key_once,
    a_crash_after_the_gateway_refunded_is_settled_from_the_provider_without_a_second_refund,
    a_server_killed_while_the_gateway_holds_the_refund_settles_with_one_refund,
);

type World = crate::process::World<FakeRefunds>;

impl World {
    async fn new(backend: Backend) -> World {
        let world = World::unmounted(backend, FakeRefunds::default()).await;
        world.fake.mount(&world.gateway).await;
        world
    }

    async fn only_refund(&self) -> refund::Model {
        let all = refund::Entity::find().all(&self.db).await.expect("query");
        assert_eq!(all.len(), 1, "one refund registered");
        all.into_iter().next().expect("one")
    }

    /// A COMPLETADA payment made through a server that does not crash; its id.
    async fn paid(&self) -> String {
        let server = self.serve(&[]).await;
        let answer = reqwest::Client::new()
            .post(format!("{}/v1/pagos", server.url))
            .bearer_auth(API_KEY)
            .header("Idempotency-Key", "pay-1")
            .json(&payment_body())
            .send()
            .await
            .expect("answered");
        assert_eq!(answer.status(), 201);
        json(answer).await["id"].as_str().expect("id").to_owned()
    }
}

async fn ask_refund(
    url: &str,
    payment: &str,
    key: &str,
) -> Result<reqwest::Response, reqwest::Error> {
    reqwest::Client::new()
        .post(format!("{url}/v1/pagos/{payment}/reembolsos"))
        .bearer_auth(API_KEY)
        .header("Idempotency-Key", key)
        .json(&json!({"monto": 100000, "motivo": "devolución"}))
        .timeout(Duration::from_secs(10))
        .send()
        .await
}

/// Asks for a refund of `payment` against a server that aborts at `failpoint`; the
/// refund as the crash left it.
async fn crash_at(world: &World, payment: &str, failpoint: &str) -> refund::Model {
    let mut doomed = world.serve(&[("PAGOS_CRASH_AT", failpoint)]).await;
    let answer = ask_refund(&doomed.url, payment, "ref-crash").await;
    doomed.aborted_at(failpoint, &answer).await;
    world.only_refund().await
}

async fn settles_with_one_refund_and_the_retry_gets_the_final_answer(
    world: &World,
    payment: &str,
    left: &refund::Model,
) {
    // Nobody holds it any more first: the request's lease on the refund (1 s) or, once
    // it was marked sent, its send's hold (the longest send + 5 s from the mark), which a
    // crash leaves in place: nobody can tell that the dead process's send is over.
    crate::process::until_unheld(world.only_refund().await.claimed_until).await;
    let report = world.reconcile().await;
    assert_eq!(report["reembolsos"]["examinados"], 1, "{report}");
    assert_eq!(report["reembolsos"]["completados"], 1, "{report}");
    let settled = world.only_refund().await;
    assert_eq!(settled.state.as_str(), "COMPLETADO");
    let made = world.fake.made();
    assert_eq!(made.len(), 1, "exactly one refund at the gateway");
    assert_eq!(made[0]["reference"], left.id.to_string());

    let server = world.serve(&[]).await;
    let retry = ask_refund(&server.url, payment, "ref-crash")
        .await
        .expect("answered");
    assert_eq!(retry.status(), 201);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(json(retry).await["id"], left.id.to_string());
    assert_eq!(world.fake.made().len(), 1);
}

/// The `Idempotency-Key` of each refund the gateway was asked for, in order.
async fn refund_keys_sent(world: &World) -> Vec<String> {
    crate::helpers::keys_sent(&world.gateway, "POST", |p| p == "/v1/refunds").await
}

/// A refund asked of a server that aborts at `failpoint`, left in `state` with `made`
/// refunds at the gateway (`why`), then settled with one refund; the world, and the
/// refund as the crash left it.
async fn crashed_then_settled(
    backend: Backend,
    failpoint: &str,
    state: &str,
    made: usize,
    why: &str,
) -> (World, refund::Model) {
    let world = World::new(backend).await;
    let payment = world.paid().await;
    let left = crash_at(&world, &payment, failpoint).await;
    assert_eq!(left.state.as_str(), state);
    assert_eq!(world.fake.made().len(), made, "{why}");
    settles_with_one_refund_and_the_retry_gets_the_final_answer(&world, &payment, &left).await;
    (world, left)
}

async fn a_crash_after_registering_a_refund_is_sent_once_by_the_reconciler(backend: Backend) {
    crashed_then_settled(
        backend,
        "refund_after_register",
        "EN_PROCESO",
        0,
        "never sent",
    )
    .await;
}

async fn a_crash_after_marking_a_refund_sent_is_resent_with_the_same_key_once(backend: Backend) {
    let (world, left) = crashed_then_settled(
        backend,
        "refund_after_mark_sent",
        "ENVIADO",
        0,
        "died before the call",
    )
    .await;
    assert_eq!(
        refund_keys_sent(&world).await,
        vec![left.gateway_key.clone()],
        "one send, with the refund's gateway key"
    );
}

async fn a_crash_after_the_gateway_refunded_is_settled_from_the_provider_without_a_second_refund(
    backend: Backend,
) {
    let (world, _) = crashed_then_settled(
        backend,
        "refund_after_gateway_response",
        "ENVIADO",
        1,
        "refunded, then the crash",
    )
    .await;
    assert_eq!(
        refund_keys_sent(&world).await.len(),
        1,
        "found by look-up, never resent"
    );
}

async fn a_server_killed_while_the_gateway_holds_the_refund_settles_with_one_refund(
    backend: Backend,
) {
    let world = World::new(backend).await;
    let payment = world.paid().await;
    // The gateway makes the refund at once and answers late: SIGKILL meanwhile.
    world.fake.delay(Duration::from_secs(5));
    let asked = payment.clone();
    world
        .killed_in_flight(
            async move |url| ask_refund(&url, &asked, "ref-crash").await,
            || !world.fake.made().is_empty(),
            "the refund made at the gateway",
        )
        .await;
    world.fake.delay(Duration::ZERO);
    let left = world.only_refund().await;
    assert_eq!(left.state.as_str(), "ENVIADO");
    settles_with_one_refund_and_the_retry_gets_the_final_answer(&world, &payment, &left).await;
}
