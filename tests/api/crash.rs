//! Crashes at every step of the saga, with real processes: the seed's row "Fallo tras
//! registrar la clave y antes de completar: el reintento no duplica".
//!
//! pagos is started, made to abort at a failpoint (or SIGKILLed), restarted, and
//! reconciled; the payment must end final with at most one charge at the gateway, and a
//! retry of the client's key must get the final answer.

use crate::helpers::{API_KEY, Backend, FakeGateway, json, payment_body};
use crate::on_both_databases;
use crate::process::{Serve, World};
use pagos::entities::payment;
use sea_orm::EntityTrait;
use std::time::Duration;

on_both_databases!(
    a_crash_after_registering_is_sent_once_by_the_reconciler,
    a_crash_after_marking_sent_is_resent_with_the_same_key_once,
    a_crash_after_the_gateway_charged_is_settled_from_the_provider_without_a_second_charge,
    a_server_killed_while_the_gateway_holds_the_answer_settles_with_one_charge,
    a_client_retry_after_a_crash_settles_the_payment_at_once,
    a_reconciler_killed_mid_pass_leaves_every_payment_to_the_next_with_one_charge_each,
    a_payment_whose_work_panics_stays_claimed_untouched_and_a_later_pass_settles_it,
    a_pass_the_database_cuts_short_still_prints_what_it_did_and_exits_1,
);

/// Until nobody holds the one payment any more: the request's lease (`World::crash_args`:
/// 1 s from its registration) or, once it was marked sent, its send's hold (the longest
/// send + 5 s from the mark: 5.3 s, or 10 s for `World::killed_in_flight`'s server), which
/// a crash leaves in place: nobody can tell that the dead process's send is over.
async fn until_unheld(world: &World) {
    crate::process::until_unheld(world.only_payment().await.claimed_until).await;
}

impl World {
    /// `n` payments left ENVIADA and due by crashes, `charged(i)` of them charged at the
    /// gateway before the crash.
    async fn due_enviada(&self, n: usize, charged: impl Fn(usize) -> bool) {
        let merchant = crate::helpers::acme(&self.db).await;
        let at = pagos::db::now() - chrono::TimeDelta::minutes(5);
        let mut rows = Vec::new();
        for i in 0..n {
            let row = crate::helpers::left_payment(
                merchant,
                &format!("k-{i}"),
                pagos::entities::payment::PaymentState::Enviada,
                1,
                format!("pagos-test-{i}"),
                at,
            );
            if charged(i) {
                self.fake.preload(&row.id.to_string(), "succeeded");
            }
            rows.push(payment::ActiveModel::from(row));
        }
        for chunk in rows.chunks(100) {
            payment::Entity::insert_many(chunk.to_vec())
                .exec_without_returning(&self.db)
                .await
                .expect("seed");
        }
    }

    /// `crash_args` for processes that reconcile every 100 ms themselves, with
    /// `--gateway-timeout gateway_timeout`, `--lease lease` and
    /// `--reconcile-concurrency concurrency`.
    fn reconciling_args(
        &self,
        gateway_timeout: &str,
        lease: &str,
        concurrency: &str,
    ) -> Vec<String> {
        let mut args = self.crash_args();
        for arg in &mut args {
            match arg.as_str() {
                "1h" => *arg = "100ms".into(), // --reconcile-every
                "300ms" => *arg = gateway_timeout.into(),
                "1s" => *arg = lease.into(),
                _ => {}
            }
        }
        args.extend(["--reconcile-concurrency".into(), concurrency.into()]);
        args
    }

    /// Payments still in flight once none are, or after `tries` looks 100 ms apart.
    async fn open_after(&self, tries: usize) -> u64 {
        let mut open = u64::MAX;
        for _ in 0..tries {
            open = self.open().await;
            if open == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        open
    }

    /// Payments still in flight (EN_PROCESO or ENVIADA).
    async fn open(&self) -> u64 {
        use sea_orm::{ColumnTrait, PaginatorTrait, QueryFilter};
        payment::Entity::find()
            .filter(payment::Column::State.is_in(["EN_PROCESO", "ENVIADA"]))
            .count(&self.db)
            .await
            .expect("count")
    }
}

async fn pay(url: &str, key: &str) -> Result<reqwest::Response, reqwest::Error> {
    reqwest::Client::new()
        .post(format!("{url}/v1/pagos"))
        .bearer_auth(API_KEY)
        .header("Idempotency-Key", key)
        .json(&payment_body())
        .timeout(Duration::from_secs(10))
        .send()
        .await
}

/// Makes a payment against a server that aborts at `failpoint`; returns the payment as
/// the crash left it.
async fn crash_at(world: &World, failpoint: &str) -> payment::Model {
    let mut doomed = world.serve(&[("PAGOS_CRASH_AT", failpoint)]).await;
    let answer = pay(&doomed.url, "k-crash").await;
    doomed.aborted_at(failpoint, &answer).await;
    world.only_payment().await
}

async fn settles_with_one_charge_and_the_retry_gets_the_final_answer(
    world: &World,
    id: uuid::Uuid,
) {
    until_unheld(world).await;
    let report = world.reconcile().await;
    assert_eq!(report["examinados"], 1, "{report}");
    assert_eq!(report["completados"], 1, "{report}");
    let settled = world.only_payment().await;
    assert_eq!(settled.state, "COMPLETADA");
    assert_eq!(
        world.fake.charges_for(&id.to_string()),
        1,
        "exactly one charge at the gateway"
    );

    let server = world.serve(&[]).await;
    let retry = pay(&server.url, "k-crash").await.expect("answered");
    assert_eq!(retry.status(), 201);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(json(retry).await["id"], id.to_string());
    assert_eq!(world.fake.charges_for(&id.to_string()), 1);
}

/// A payment to a server that aborts at `failpoint`, left in `state` with `charged`
/// charges at the gateway (`why`), then settled with one charge; the world, and the
/// payment as the crash left it.
async fn crashed_then_settled(
    backend: Backend,
    failpoint: &str,
    state: &str,
    charged: usize,
    why: &str,
) -> (World, payment::Model) {
    let world = World::new(backend, FakeGateway::charging("succeeded")).await;
    let left = crash_at(&world, failpoint).await;
    assert_eq!(left.state, state);
    assert_eq!(
        world.fake.charges_for(&left.id.to_string()),
        charged,
        "{why}"
    );
    settles_with_one_charge_and_the_retry_gets_the_final_answer(&world, left.id).await;
    (world, left)
}

async fn a_crash_after_registering_is_sent_once_by_the_reconciler(backend: Backend) {
    crashed_then_settled(backend, "after_register", "EN_PROCESO", 0, "never sent").await;
}

async fn a_crash_after_marking_sent_is_resent_with_the_same_key_once(backend: Backend) {
    let (world, left) = crashed_then_settled(
        backend,
        "after_mark_sent",
        "ENVIADA",
        0,
        "died before the call",
    )
    .await;
    let keys = crate::helpers::keys_sent(&world.gateway, "POST", |_| true).await;
    assert_eq!(
        keys,
        vec![left.gateway_key.clone()],
        "one send, with the payment's gateway key"
    );
}

async fn a_crash_after_the_gateway_charged_is_settled_from_the_provider_without_a_second_charge(
    backend: Backend,
) {
    let (world, _) = crashed_then_settled(
        backend,
        "after_gateway_response",
        "ENVIADA",
        1,
        "charged, then the crash",
    )
    .await;
    let posts = crate::helpers::received(&world.gateway, "POST", |_| true)
        .await
        .len();
    assert_eq!(posts, 1, "settled from the lookup, never sent again");
}

async fn a_server_killed_while_the_gateway_holds_the_answer_settles_with_one_charge(
    backend: Backend,
) {
    let fake = FakeGateway::charging("succeeded").with_delay(Duration::from_secs(3));
    let world = World::new(backend, fake).await;
    // The charge is made at the gateway; its answer is held back; the server dies.
    world
        .killed_in_flight(
            async |url| pay(&url, "k-crash").await,
            || world.fake.total_charges() == 1,
            "the charge made at the gateway",
        )
        .await;
    let left = world.only_payment().await;
    assert_eq!(left.state, "ENVIADA");
    world.fake.clear_delay();
    settles_with_one_charge_and_the_retry_gets_the_final_answer(&world, left.id).await;
}

async fn a_client_retry_after_a_crash_settles_the_payment_at_once(backend: Backend) {
    let world = World::new(backend, FakeGateway::charging("succeeded")).await;
    let left = crash_at(&world, "after_mark_sent").await;
    let server = world.serve(&[]).await;
    until_unheld(&world).await;
    // No reconciliation pass runs (period 1h): the retry itself finds the hold ended.
    let retry = pay(&server.url, "k-crash").await.expect("answered");
    assert_eq!(retry.status(), 201, "{}", server.logs());
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    let body = json(retry).await;
    assert_eq!(body["estado"], "COMPLETADA");
    assert_eq!(body["id"], left.id.to_string());
    assert_eq!(world.fake.charges_for(&left.id.to_string()), 1);
}

/// Three `pagos serve` processes on one PostgreSQL share 500 due payments: each is looked
/// up exactly once, resent at most once, and ends final.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_processes_decide_every_due_payment_exactly_once() {
    let Some(backend) = Backend::postgres() else {
        return;
    };
    let world = World::new(backend, FakeGateway::charging("succeeded")).await;
    // 500 payments left ENVIADA by crashes: half were charged before the crash, half never
    // reached the gateway.
    world.due_enviada(500, |n| n % 2 == 0).await;

    // Patient timeouts: a send that timed out on a busy machine would rightly be looked
    // up again, and this test counts look-ups.
    let args = world.reconciling_args("5s", "30s", "8");
    let extra: Vec<&str> = args.iter().map(String::as_str).collect();
    let servers = [
        Serve::start(&extra, &[]).await,
        Serve::start(&extra, &[]).await,
        Serve::start(&extra, &[]).await,
    ];

    let open = world.open_after(600).await;
    assert_eq!(open, 0, "every payment final; logs:\n{}", servers[0].logs());
    drop(servers);

    let all = payment::Entity::find().all(&world.db).await.expect("query");
    assert!(all.iter().all(|p| p.state == "COMPLETADA"));
    let requests = world.gateway.received_requests().await.unwrap_or_default();
    let mut lookups = std::collections::HashMap::<String, usize>::new();
    let mut sends = std::collections::HashMap::<String, usize>::new();
    for request in &requests {
        match request.method.as_str() {
            "GET" => {
                let reference = crate::helpers::query_param(request, "reference");
                *lookups.entry(reference).or_default() += 1;
            }
            _ => {
                let body: serde_json::Value =
                    serde_json::from_slice(&request.body).unwrap_or_default();
                *sends
                    .entry(body["reference"].as_str().unwrap_or("").to_owned())
                    .or_default() += 1;
            }
        }
    }
    assert_eq!(lookups.len(), 500);
    let twice: Vec<_> = lookups.iter().filter(|(_, n)| **n != 1).collect();
    assert!(
        twice.is_empty(),
        "each payment looked up exactly once: {twice:?}"
    );
    assert_eq!(sends.len(), 250, "only the never-charged half was resent");
    assert!(sends.values().all(|n| *n == 1), "each resent exactly once");
    for p in &all {
        assert_eq!(
            world.fake.charges_for(&p.id.to_string()),
            1,
            "one charge per payment"
        );
    }
}

/// A pass claims ahead of its look-ups: a process SIGKILLed mid-pass leaves payments it
/// was sending and payments it had claimed but not touched. Once their claims run out,
/// another process settles every one, each charged exactly once.
async fn a_reconciler_killed_mid_pass_leaves_every_payment_to_the_next_with_one_charge_each(
    backend: Backend,
) {
    // Sends take 1 s at the gateway, inside a 2 s timeout: a claim lasts 2 + 2 + 5 = 9 s.
    let fake = FakeGateway::charging("succeeded").with_delay(Duration::from_secs(1));
    let world = World::new(backend, fake).await;
    world.due_enviada(12, |_| false).await;
    // The lease is longer than a gateway call.
    let args = world.reconciling_args("2s", "3s", "2");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();

    let mut first = Serve::start(&args, &[]).await;
    for _ in 0..200 {
        if world.fake.total_charges() >= 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(world.fake.total_charges() >= 1, "{}", first.logs());
    first.kill().await;
    let charged_by_the_first = world.fake.total_charges();
    assert!(
        world.open().await > 0,
        "the first process died with payments in hand"
    );

    world.fake.clear_delay();
    let second = Serve::start(&args, &[]).await;
    let open = world.open_after(300).await;
    assert_eq!(open, 0, "every payment final; logs:\n{}", second.logs());
    let all = payment::Entity::find().all(&world.db).await.expect("query");
    assert_eq!(all.len(), 12);
    for p in &all {
        assert_eq!(p.state, "COMPLETADA");
        assert_eq!(
            world.fake.charges_for(&p.id.to_string()),
            1,
            "one charge for {} (the first process had charged {charged_by_the_first})",
            p.id
        );
    }
}

/// A bug that panics in a payment's work (here right after its look-up) ends that
/// payment's task, not the pass nor the process: the pass counts it in `errores` and
/// writes nothing for it, and the payment stays claimed, so a pass started meanwhile
/// leaves it alone. Once the claim runs out, the next pass settles it from the provider,
/// with the one charge the gateway holds.
async fn a_payment_whose_work_panics_stays_claimed_untouched_and_a_later_pass_settles_it(
    backend: Backend,
) {
    let world = World::new(backend, FakeGateway::charging("succeeded")).await;
    world.due_enviada(4, |_| true).await;
    let args = world.crash_args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();

    let panicked =
        crate::process::reconcile_once_with(&args, &[("PAGOS_PANIC_AT", "reconcile_after_lookup")])
            .await;
    assert_eq!(panicked["examinados"], 4, "{panicked}");
    assert_eq!(panicked["errores"], 4, "{panicked}");
    let rows = payment::Entity::find().all(&world.db).await.expect("query");
    for p in &rows {
        assert_eq!(p.state, "ENVIADA", "nothing written for {}", p.id);
    }
    let held_until = rows
        .iter()
        .map(|p| p.claimed_until.expect("still claimed"))
        .max()
        .expect("rows");

    let meanwhile = world.reconcile().await;
    assert_eq!(
        meanwhile["examinados"], 0,
        "claimed payments are left alone: {meanwhile}"
    );

    let left = (held_until - pagos::db::now()).to_std().unwrap_or_default();
    tokio::time::sleep(left + Duration::from_millis(200)).await;
    let settled = world.reconcile().await;
    assert_eq!(settled["completados"], 4, "{settled}");
    for p in payment::Entity::find().all(&world.db).await.expect("query") {
        assert_eq!(p.state, "COMPLETADA");
        assert_eq!(world.fake.charges_for(&p.id.to_string()), 1, "{}", p.id);
    }
}

/// `pagos reconcile --once` whose pass the database cuts short (a claim fails after some
/// payments were settled) prints the report of what it did as JSON, then the error as one
/// line, and exits 1: on-call sees what was done, which is what the database holds. Its
/// audit row records the error and what was done until then.
async fn a_pass_the_database_cuts_short_still_prints_what_it_did_and_exits_1(backend: Backend) {
    let world = World::new(backend, FakeGateway::charging("succeeded")).await;
    world.due_enviada(10, |_| true).await;
    // A claim after the first settlement fails; the payments' own writes still work, so
    // the payments the pass had in hand are finished.
    crate::helpers::refuse_claims(
        &world.db,
        Some(r#"EXISTS (SELECT 1 FROM "payments" WHERE "state" = 'COMPLETADA')"#),
    )
    .await;
    let mut args = world.crash_args();
    args.extend(["--reconcile-concurrency".to_owned(), "1".to_owned()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();

    let output = crate::process::reconcile_once_output(&args, &[]).await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "exit 1: {stderr}");
    let report: serde_json::Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("the report is JSON ({e}): {stderr}"));
    let cut: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("pagos: "))
        .collect();
    assert_eq!(cut.len(), 1, "one line: {stderr}");
    assert!(
        cut[0].contains("cut short") && cut[0].contains("claims refused"),
        "{stderr}"
    );

    let rows = payment::Entity::find().all(&world.db).await.expect("query");
    let settled = rows.iter().filter(|p| p.state == "COMPLETADA").count();
    assert!(settled >= 1, "some were settled before the claim failed");
    assert!(settled < rows.len(), "the pass was cut short");
    assert_eq!(report["completados"], settled, "{report}");
    let examined = report["examinados"].as_u64().expect("examinados");
    let errors = report["errores"].as_u64().expect("errores");
    assert_eq!(
        examined,
        settled as u64 + errors,
        "each examined one settled or left for later: {report}"
    );

    // Its audit row says the pass failed, why, and what it did until then.
    let passes = pagos::operators::actions::list(
        &world.db,
        &pagos::operators::actions::Filter::default(),
        10,
    )
    .await
    .expect("read");
    assert_eq!(passes.len(), 1, "{passes:?}");
    let row = &passes[0];
    assert!(row.finished_at.is_some(), "finished: {row:?}");
    assert!(
        row.detail.contains("— failed: ")
            && row.detail.contains("claims refused")
            && row.detail.contains(&format!("completados {settled}")),
        "{row:?}"
    );
}
