//! `SIGTERM` with payments in flight: `pagos serve` goes on serving for
//! `PAGOS_DRAIN_DELAY` while `/readyz` says 503, waits for their sagas up to
//! `PAGOS_SHUTDOWN_GRACE`, stops at once on a Ctrl-C after the signal, and what it cannot
//! wait for is left to the reconciler, never half-written and never charged twice.

use crate::helpers::{API_KEY, Backend, FakeGateway, payment_body};
use crate::on_both_databases;
use crate::process::{Serve, World, serving_with_lease};
use std::time::Duration;

on_both_databases!(
    on_sigterm_a_payment_in_flight_finishes_and_its_client_gets_the_answer,
    past_the_grace_a_saga_in_flight_is_left_to_the_reconciler_and_charged_once,
    on_sigterm_a_reconciliation_pass_claims_nothing_more_and_leaves_the_rest_due,
    on_sigterm_a_refund_whose_client_hung_up_is_waited_for_and_settled,
    on_sigterm_a_pass_on_call_started_claims_nothing_more,
    during_the_drain_delay_readyz_says_503_and_payments_are_still_served,
    ctrl_c_after_sigterm_stops_at_once_and_leaves_the_saga_to_the_reconciler,
    a_clock_set_back_while_serving_stops_the_process_naming_the_clock,
    a_clock_set_back_while_draining_stops_the_process_without_the_rest_of_the_drain_delay,
);

/// The host's clock is set back 10 s while pagos serves: on PostgreSQL it is then off the
/// database server's, on SQLite it stepped back on the clock everything is written on.
/// Claims, send holds and a payment's age against the gateway's key window are read on it
/// (a payment looking younger than it is could be sent again past the key window); before,
/// only the start-up checked it, and the process went on. Now it stops as at SIGTERM and
/// exits 1, its last line naming the clock.
async fn a_clock_set_back_while_serving_stops_the_process_naming_the_clock(backend: Backend) {
    let world = World::new(backend, FakeGateway::charging("succeeded")).await;
    let uri = world.gateway.uri();
    let args = crate::process::serving(&world.database.url, &uri, &["--reconcile-every", "1h"]);
    let mut server = Serve::start(&args, &[("PAGOS_CLOCK_STEP", "-10000:6000")]).await;
    let paid = reqwest::Client::new()
        .post(format!("{}/v1/pagos", server.url))
        .bearer_auth(API_KEY)
        .header("Idempotency-Key", "k-before-the-step")
        .json(&payment_body())
        .send()
        .await
        .expect("answered");
    assert_eq!(paid.status(), 201, "it serves until the clock goes wrong");

    let status = server
        .exited(Duration::from_secs(30))
        .await
        .unwrap_or_else(|| panic!("still serving on a clock set back:\n{}", server.logs()));

    assert_eq!(status.code(), Some(1), "{}", server.logs());
    let logs = server.logs();
    let last = logs.trim_end().lines().last().unwrap_or_default();
    assert!(last.contains("this host's clock"), "{logs}");
}

/// The same clock step while a SIGTERM's `PAGOS_DRAIN_DELAY` (here 10 minutes) is being
/// served: before, the rest of the delay was still served on the wrong clock (the
/// delay was read when the signal came); now the process stops there, exit 1 naming the
/// clock.
async fn a_clock_set_back_while_draining_stops_the_process_without_the_rest_of_the_drain_delay(
    backend: Backend,
) {
    let world = World::new(backend, FakeGateway::charging("succeeded")).await;
    let uri = world.gateway.uri();
    let args = crate::process::serving(
        &world.database.url,
        &uri,
        &["--reconcile-every", "1h", "--drain-delay", "10m"],
    );
    let mut server = Serve::start(&args, &[("PAGOS_CLOCK_STEP", "-10000:3000")]).await;
    server.terminate();

    let status = server
        .exited(Duration::from_secs(60))
        .await
        .unwrap_or_else(|| panic!("still draining on a clock set back:\n{}", server.logs()));

    assert_eq!(status.code(), Some(1), "{}", server.logs());
    let logs = server.logs();
    let last = logs.trim_end().lines().last().unwrap_or_default();
    assert!(last.contains("this host's clock"), "{logs}");
}

impl World {
    /// `pagos serve` over a gateway that may answer slowly (in under 2s), with `grace`,
    /// its reconciler only when a test runs it.
    async fn serve_with_grace(&self, grace: &str) -> Serve {
        self.serve_reconciling(grace, &["--reconcile-every", "1h"])
            .await
    }

    /// The same, with the reconciler's settings `reconciling`.
    async fn serve_reconciling(&self, grace: &str, reconciling: &[&str]) -> Serve {
        let url = self.gateway.uri();
        // A gateway timeout with room beyond the fakes' 1.5 s holds, so that a loaded
        // machine's slow answer is still an answer.
        let mut args = serving_with_lease(
            &self.database.url,
            &url,
            "5s",
            "6s",
            &["--shutdown-grace", grace],
        );
        args.extend_from_slice(reconciling);
        Serve::start(&args, &[]).await
    }

    /// `pagos serve` as `serve_with_grace` does, going on serving for `delay` after the
    /// first signal.
    async fn serve_draining(&self, delay: &str) -> Serve {
        self.serve_reconciling("15s", &["--reconcile-every", "1h", "--drain-delay", delay])
            .await
    }

    /// Waits until the gateway has received the charge: the saga is in flight.
    async fn charge_reached_the_gateway(&self) {
        for _ in 0..200 {
            if self.fake.total_charges() == 1 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("the charge never reached the gateway");
    }
}

type Answer = tokio::task::JoinHandle<Result<reqwest::Response, reqwest::Error>>;

/// `pagos serve` with `grace`, over a gateway that answers in 1.5 s, once the charge of
/// one payment has reached the gateway: the client's answer to come.
async fn paying_slowly(grace: &str, backend: Backend) -> (World, Serve, Answer) {
    let world = World::new(
        backend,
        FakeGateway::charging("succeeded").with_delay(Duration::from_millis(1500)),
    )
    .await;
    let server = world.serve_with_grace(grace).await;
    let answer = pay(&server.url);
    world.charge_reached_the_gateway().await;
    (world, server, answer)
}

fn pay(url: &str) -> Answer {
    let url = format!("{url}/v1/pagos");
    tokio::spawn(async move {
        reqwest::Client::new()
            .post(url)
            .bearer_auth(API_KEY)
            .header("Idempotency-Key", "k-shutdown")
            .json(&payment_body())
            .timeout(Duration::from_secs(30))
            .send()
            .await
    })
}

async fn on_sigterm_a_payment_in_flight_finishes_and_its_client_gets_the_answer(backend: Backend) {
    let (world, mut server, answer) = paying_slowly("15s", backend).await;
    // It recorded its key retention before serving (idempotency::cache).
    assert_eq!(
        retention_rows(&world).await,
        vec!["86400".to_owned()],
        "one row: this process's 24 h"
    );

    server.terminate();
    // An orchestrator that sends SIGTERM again (its runtime restarted) still gets the
    // drain it asked for.
    logged(&server, "shutting down: finishing requests in flight").await;
    server.terminate();
    logged(&server, "SIGTERM again: still shutting down").await;
    let answer = answer.await.expect("task").expect("answered before exit");
    assert_eq!(answer.status(), 201, "the saga finished during the grace");
    server
        .exits_cleanly(Duration::from_secs(10), "after the saga")
        .await;
    assert!(
        retention_rows(&world).await.is_empty(),
        "a graceful stop deletes its retention's row"
    );

    let settled = world.only_payment().await;
    assert_eq!(settled.state, "COMPLETADA");
    assert_eq!(world.fake.total_charges(), 1);
    let logs = server.logs();
    assert!(logs.contains("waiting for the sagas in flight"), "{logs}");
    assert!(!logs.contains("left to the reconciler"), "{logs}");
}

async fn past_the_grace_a_saga_in_flight_is_left_to_the_reconciler_and_charged_once(
    backend: Backend,
) {
    let (world, mut server, answer) = paying_slowly("200ms", backend).await;

    let asked_to_stop = std::time::Instant::now();
    server.terminate();
    server
        .exits_cleanly(Duration::from_secs(8), "at the grace")
        .await;
    left_in_flight(
        asked_to_stop,
        Duration::from_secs(5),
        answer,
        &server,
        "1 saga(s) still in flight are left to the reconciler",
    )
    .await;

    settled_by_the_next_process(&world).await;
}

/// A process stopped, asked at `asked`, within `within`, without waiting for the slow
/// gateway: the client got no answer (its retry with the same key gets one), and the log
/// says the saga was left (`line`).
async fn left_in_flight(
    asked: std::time::Instant,
    within: Duration,
    answer: Answer,
    server: &Serve,
    line: &str,
) {
    assert!(
        asked.elapsed() < within,
        "it did not wait for the slow gateway: {:?}",
        asked.elapsed()
    );
    assert!(
        answer.await.expect("task").is_err(),
        "the client got no answer: its retry with the same key gets one"
    );
    let logs = server.logs();
    assert!(logs.contains(line), "{logs}");
}

/// The payment a stopped process left `ENVIADA` in the gateway's hands: maybe sent, so
/// the reconciler asks the provider before anything else. Held as long as a send could
/// last, so that nobody sends it again meanwhile; then the next process's reconciler
/// settles it: the charge the gateway made is found, not made again.
async fn settled_by_the_next_process(world: &World) {
    let left = world.only_payment().await;
    assert_eq!(left.state, "ENVIADA");
    let held_until = left.claimed_until.expect("held for its send");
    let wait = (held_until - pagos::db::now()).to_std().unwrap_or_default();
    tokio::time::sleep(wait + Duration::from_millis(200)).await;
    let server = world.serve_with_grace("15s").await;
    let mut settled = world.only_payment().await;
    for _ in 0..100 {
        if settled.state != "ENVIADA" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        settled = world.only_payment().await;
    }
    assert_eq!(settled.state, "COMPLETADA", "{}", server.logs());
    assert_eq!(world.fake.total_charges(), 1, "exactly one charge");
}

/// A request still registering its payment when SIGTERM arrives starts its saga after the
/// drain began, and its client gives up while the gateway is charging. Before, the drain's
/// wait for the sagas had already ended (nothing was tracked when it began), so the
/// process exited as soon as the connection closed: the saga cut mid-call with 14 s of
/// grace left, `ENVIADA`, and nothing in the log. Now the sagas are waited for once the
/// requests that start them are done. (PostgreSQL: a lock on `payments` stalls the
/// registration across the signal.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_sigterm_a_saga_its_request_starts_after_the_signal_is_waited_for() {
    use sea_orm::{ConnectionTrait, TransactionTrait};
    let Some(backend) = Backend::postgres() else {
        return;
    };
    let world = World::new(
        backend,
        FakeGateway::charging("succeeded").with_delay(Duration::from_millis(1500)),
    )
    .await;
    let mut server = world.serve_with_grace("15s").await;
    let stall = world.db.begin().await.expect("transaction");
    stall
        .execute_unprepared(r#"LOCK TABLE "payments" IN SHARE MODE"#)
        .await
        .expect("the payments table locked");
    let url = format!("{}/v1/pagos", server.url);
    let paying = tokio::spawn(async move {
        reqwest::Client::new()
            .post(url)
            .bearer_auth(API_KEY)
            .header("Idempotency-Key", "k-late-saga")
            .json(&payment_body())
            .timeout(Duration::from_millis(1500))
            .send()
            .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.terminate();
    tokio::time::sleep(Duration::from_millis(300)).await;
    stall.rollback().await.expect("the lock let go");
    world.charge_reached_the_gateway().await;
    assert!(
        paying.await.expect("task").is_err(),
        "the client gave up before the gateway answered"
    );

    server
        .exits_cleanly(Duration::from_secs(10), "after the saga")
        .await;
    let settled = world.only_payment().await;
    assert_eq!(settled.state, "COMPLETADA", "{}", server.logs());
    assert_eq!(world.fake.total_charges(), 1);
    let logs = server.logs();
    assert!(logs.contains("waiting for the sagas in flight"), "{logs}");
    assert!(!logs.contains("left to the reconciler"), "{logs}");
}

#[test]
fn a_bad_shutdown_grace_or_drain_delay_stops_serve_with_one_line_naming_it() {
    let dir = tempfile::tempdir().expect("dir");
    let db = format!("sqlite://{}?mode=rwc", dir.path().join("x.db").display());
    let bad = [
        ("PAGOS_SHUTDOWN_GRACE", "soon"),
        ("PAGOS_SHUTDOWN_GRACE", "0s"),
        ("PAGOS_SHUTDOWN_GRACE", "-1s"),
        ("PAGOS_DRAIN_DELAY", "soon"),
        ("PAGOS_DRAIN_DELAY", "-1s"),
        ("PAGOS_DRAIN_DELAY", "30"),
    ];
    for (setting, value) in bad {
        let output = std::process::Command::new(crate::process::BIN)
            .args(["serve", "--database-url", &db])
            .env(setting, value)
            .output()
            .expect("pagos runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(
            output.status.code(),
            Some(2),
            "{setting}={value}: exit 2: {stderr}"
        );
        assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
        assert!(stderr.contains(setting), "names it: {stderr}");
    }
    assert!(
        !dir.path().join("x.db").exists(),
        "nothing was created before refusing"
    );
    let help = std::process::Command::new(crate::process::BIN)
        .args(["serve", "--help"])
        .output()
        .expect("pagos runs");
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("PAGOS_SHUTDOWN_GRACE"), "{help}");
    assert!(help.contains("PAGOS_DRAIN_DELAY"), "{help}");
}

/// `GET /readyz` of `url`: its status and body.
async fn readiness(url: &str) -> (u16, serde_json::Value) {
    let answer = reqwest::get(format!("{url}/readyz"))
        .await
        .expect("answered");
    let status = answer.status().as_u16();
    (status, answer.json().await.unwrap_or_default())
}

/// Until `/readyz` of a process told to stop answers 503; its body.
async fn not_ready(server: &Serve) -> serde_json::Value {
    for _ in 0..100 {
        let (status, body) = readiness(&server.url).await;
        if status == 503 {
            return body;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("/readyz never said 503:\n{}", server.logs());
}

/// Until the process's log has `line`.
async fn logged(server: &Serve, line: &str) {
    for _ in 0..100 {
        if server.logs().contains(line) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("never logged {line:?}:\n{}", server.logs());
}

/// A rolling deploy behind a load balancer: on `SIGTERM` the process goes on serving for
/// `PAGOS_DRAIN_DELAY` while `/readyz` tells the balancer to send new requests elsewhere
/// (before, the listener closed at once: a request the balancer sent meanwhile was
/// refused). SIGTERM sent again (an orchestrator does, on a runtime's restart) does not cut
/// it short. Then it drains and exits cleanly, and its port is closed.
async fn during_the_drain_delay_readyz_says_503_and_payments_are_still_served(backend: Backend) {
    let world = World::new(backend, FakeGateway::charging("succeeded")).await;
    let mut server = world.serve_draining("8s").await;
    let before = reqwest::get(format!("{}/readyz", server.url))
        .await
        .expect("answered");
    assert_eq!(before.status(), 200, "ready before the signal");
    assert!(
        before.headers().get("connection").is_none(),
        "connections kept before the signal: {:?}",
        before.headers()
    );

    let asked_to_stop = std::time::Instant::now();
    server.terminate();
    let body = not_ready(&server).await;
    assert_eq!(body["type"], "/problems/service-unavailable", "{body}");
    server.terminate();
    logged(&server, "SIGTERM again: still shutting down").await;

    let paid = pay(&server.url).await.expect("task").expect("served");
    assert_eq!(paid.status(), 201, "still served during the delay");
    assert_eq!(
        paid.headers().get("connection").map(|v| v.as_bytes()),
        Some(&b"close"[..]),
        "a kept connection is closed after its answer: the next one goes elsewhere"
    );
    let address = server.url.trim_start_matches("http://").to_owned();
    let closed = tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(address).expect("connects");
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout set");
        stream
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: pagos\r\n\r\n")
            .expect("sent");
        let mut answer = String::new();
        // To the end: pagos closes the connection after its answer (kept alive, this
        // read would wait out the 5 s timeout and fail).
        stream.read_to_string(&mut answer).map(|_| answer)
    })
    .await
    .expect("task");
    let closed = closed.expect("the connection closed after the answer");
    assert!(closed.starts_with("HTTP/1.1 200"), "{closed}");
    assert!(
        asked_to_stop.elapsed() < Duration::from_secs(8),
        "the payment was made inside the delay: {:?}",
        asked_to_stop.elapsed()
    );
    assert!(
        server.exited(Duration::from_millis(200)).await.is_none(),
        "still running during the delay"
    );
    server
        .exits_cleanly(Duration::from_secs(20), "after the delay")
        .await;
    assert!(
        asked_to_stop.elapsed() >= Duration::from_secs(8),
        "it waited the delay out: {:?}",
        asked_to_stop.elapsed()
    );
    assert!(
        reqwest::get(format!("{}/healthz", server.url))
            .await
            .is_err(),
        "the port is closed once it has stopped"
    );
    assert_eq!(world.only_payment().await.state, "COMPLETADA");
    assert_eq!(world.fake.total_charges(), 1);
    let logs = server.logs();
    assert!(
        logs.contains("PAGOS_DRAIN_DELAY"),
        "says why it goes on: {logs}"
    );
}

/// An operator who pressed Ctrl-C twice: the process stops at once (exit code 130) instead
/// of waiting out the grace for a slow gateway (before, the second signal was ignored),
/// says how many sagas it leaves, and the next process's reconciler settles the payment,
/// charged once. A SIGTERM sent again meanwhile does not.
async fn ctrl_c_after_sigterm_stops_at_once_and_leaves_the_saga_to_the_reconciler(
    backend: Backend,
) {
    let world = World::new(
        backend,
        FakeGateway::charging("succeeded").with_delay(Duration::from_millis(4000)),
    )
    .await;
    let mut server = world.serve_with_grace("15s").await;
    let answer = pay(&server.url);
    world.charge_reached_the_gateway().await;

    server.terminate();
    logged(&server, "shutting down: finishing requests in flight").await;
    server.terminate();
    logged(&server, "SIGTERM again: still shutting down").await;
    let asked_again = std::time::Instant::now();
    server.interrupt();
    let status = server
        .exited(Duration::from_secs(3))
        .await
        .unwrap_or_else(|| panic!("stopped at once:\n{}", server.logs()));
    assert_eq!(status.code(), Some(130), "{}", server.logs());
    left_in_flight(
        asked_again,
        Duration::from_secs(3),
        answer,
        &server,
        "Ctrl-C after the first signal: stopping at once; 1 saga(s) or on-call pass(es) in flight",
    )
    .await;
    settled_by_the_next_process(&world).await;
}

/// Ctrl-C during `PAGOS_DRAIN_DELAY` ends the wait too: nothing in flight, so nothing is
/// left.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ctrl_c_during_the_drain_delay_stops_at_once() {
    let world = World::new(Backend::Sqlite, FakeGateway::charging("succeeded")).await;
    let mut server = world.serve_draining("60s").await;
    server.terminate();
    not_ready(&server).await;
    assert!(
        server.exited(Duration::from_millis(300)).await.is_none(),
        "the first signal starts the delay"
    );
    server.interrupt();
    let status = server
        .exited(Duration::from_secs(5))
        .await
        .unwrap_or_else(|| panic!("stopped at once:\n{}", server.logs()));
    assert_eq!(status.code(), Some(130), "{}", server.logs());
    let logs = server.logs();
    assert!(logs.contains("0 saga(s)"), "{logs}");
}

/// How long the backlog's look-ups take: long beside the time a loaded machine takes
/// between the test's count of look-ups and the signal's arrival.
const LOOK_UP: Duration = Duration::from_millis(1500);

/// A backlog after an outage: 40 payments due, look-ups answered after 1.5 s, two at a
/// time (a pass of thirty seconds). On `SIGTERM` the pass claims nothing more: the
/// look-ups in its work finish and are settled, the rest stay `ENVIADA` for the next
/// process, and the process exits without waiting for the whole backlog.
async fn on_sigterm_a_reconciliation_pass_claims_nothing_more_and_leaves_the_rest_due(
    backend: Backend,
) {
    const BACKLOG: usize = 40;
    let world = World::new(
        backend,
        FakeGateway::charging("succeeded").with_lookup_delay(LOOK_UP),
    )
    .await;
    seed_backlog(&world, BACKLOG).await;
    let mut server = world
        .serve_reconciling(
            "15s",
            &["--reconcile-every", "1s", "--reconcile-concurrency", "2"],
        )
        .await;
    for _ in 0..200 {
        if world.fake.lookups_made() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let before = world.fake.lookups_made();
    assert!(before >= 2, "the pass is under way");

    server.terminate();
    server
        .exits_cleanly(Duration::from_secs(30), "with the backlog left")
        .await;
    left_to_the_next_process(&world, before, BACKLOG).await;
}

/// `BACKLOG` payments `ENVIADA`, due a minute ago, each charged at the provider.
async fn seed_backlog(world: &World, backlog: usize) {
    use pagos::entities::payment::{self, PaymentState};
    use sea_orm::EntityTrait;
    let merchant = crate::helpers::acme(&world.db).await;
    let due = pagos::db::now() - chrono::TimeDelta::minutes(1);
    for n in 0..backlog {
        let row = crate::helpers::left_payment(
            merchant,
            &format!("k-backlog-{n}"),
            PaymentState::Enviada,
            1,
            format!("pagos-backlog-{n}"),
            due,
        );
        world.fake.preload(&row.id.to_string(), "succeeded");
        payment::Entity::insert(payment::ActiveModel::from(row))
            .exec_without_returning(&world.db)
            .await
            .expect("seed");
    }
}

/// After the process exited: no more look-ups than the work in hand when it was told to
/// stop (`before` look-ups then), nothing half-written, the rest `ENVIADA` for the next
/// process, nothing charged.
async fn left_to_the_next_process(world: &World, before: usize, backlog: usize) {
    use pagos::entities::payment::{self, PaymentState};
    use sea_orm::EntityTrait;
    let after = world.fake.lookups_made();
    // The rows in the work waiting for a slot at the signal are not taken up either (no
    // new call to the provider once told to stop; before: they were, `before` + 2). One
    // more is tolerated: a look-up that began between the count and the signal.
    assert!(
        after <= before + 1,
        "no new look-up after SIGTERM: {before} look-ups then, {after} in all"
    );
    let all = payment::Entity::find().all(&world.db).await.expect("query");
    let settled = all
        .iter()
        .filter(|p| p.state == PaymentState::Completada)
        .count();
    let left = all
        .iter()
        .filter(|p| p.state == PaymentState::Enviada)
        .count();
    assert_eq!(settled + left, backlog, "nothing half-written");
    assert!(
        left >= backlog - after,
        "the rest left due for the next process"
    );
    // Due at once, not held by claims the stopped process never took up: before, each
    // waited for its claim to run out (about a minute) before another process took it.
    let now = pagos::db::now();
    let held: Vec<_> = all
        .iter()
        .filter(|p| p.state == PaymentState::Enviada)
        .filter(|p| p.claimed_until.is_some_and(|until| until > now) || p.next_attempt_at > now)
        .map(|p| (p.id, p.claimed_until))
        .collect();
    assert!(
        held.is_empty(),
        "the rest given back, due now: {} of {left} still held {held:?}",
        held.len()
    );
    assert_eq!(
        world.fake.total_charges(),
        backlog,
        "nothing charged by the pass"
    );
}

/// The same backlog, taken by a pass on-call started (`POST /admin/reconciliaciones`, what
/// the console's button asks) rather than the periodic one. On `SIGTERM` it claims nothing
/// more either. Before, it went on claiming for the whole grace: the process took the
/// backlog's ten seconds to stop, and a longer backlog was cut at the end of the grace
/// with every payment it had claimed held until its claim ran out.
async fn on_sigterm_a_pass_on_call_started_claims_nothing_more(backend: Backend) {
    const BACKLOG: usize = 40;
    let world = World::new(
        backend,
        FakeGateway::charging("succeeded").with_lookup_delay(LOOK_UP),
    )
    .await;
    // The periodic pass runs once at start, on an empty database; the backlog comes after.
    let mut server = world
        .serve_reconciling(
            "15s",
            &[
                "--reconcile-every",
                "1h",
                "--reconcile-concurrency",
                "2",
                "--admin-token",
                crate::helpers::ADMIN_TOKEN,
            ],
        )
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    seed_backlog(&world, BACKLOG).await;
    let asked = {
        let url = format!("{}/admin/reconciliaciones", server.url);
        tokio::spawn(async move {
            reqwest::Client::new()
                .post(url)
                .bearer_auth(crate::helpers::ADMIN_TOKEN)
                .json(&serde_json::json!({}))
                .timeout(Duration::from_secs(30))
                .send()
                .await
        })
    };
    for _ in 0..200 {
        if world.fake.lookups_made() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let before = world.fake.lookups_made();
    assert!(before >= 2, "on-call's pass is under way");

    server.terminate();
    server
        .exits_cleanly(Duration::from_secs(30), "with the backlog left")
        .await;
    left_to_the_next_process(&world, before, BACKLOG).await;
    // On-call was answered what the pass did before it stopped, or the connection closed
    // with the process: never a pass that claimed the whole backlog.
    if let Ok(Ok(answer)) = asked.await {
        let report: serde_json::Value = answer.json().await.unwrap_or_default();
        let examined = report["examinados"].as_u64().unwrap_or(0);
        assert!(examined < BACKLOG as u64, "{report}");
    }
}

/// A refund's saga runs in its own task, as a payment's does: its client hanging up does
/// not stop it. On SIGTERM `serve` waits for it too (within the grace), so the refund the
/// gateway is making is settled `COMPLETADO` before the process exits, not left `ENVIADO`
/// for the reconciler of another process.
async fn on_sigterm_a_refund_whose_client_hung_up_is_waited_for_and_settled(backend: Backend) {
    use pagos::entities::refund;
    use sea_orm::EntityTrait;
    let world = World::new(backend, FakeGateway::charging("succeeded")).await;
    let refunds = crate::refunds::FakeRefunds::default();
    refunds.delay(Duration::from_millis(1500));
    refunds.mount_refunds(&world.gateway).await;
    let mut server = world.serve_with_grace("15s").await;
    let paid = pay(&server.url).await.expect("task").expect("paid");
    assert_eq!(paid.status(), 201);
    let payment = world.only_payment().await;

    // The client gives up before the gateway answers.
    let hung_up = reqwest::Client::new()
        .post(format!("{}/v1/pagos/{}/reembolsos", server.url, payment.id))
        .bearer_auth(API_KEY)
        .header("Idempotency-Key", "r-shutdown")
        .json(&serde_json::json!({"monto": 5000}))
        .timeout(Duration::from_millis(700))
        .send()
        .await;
    assert!(hung_up.is_err(), "the client hung up");
    assert_eq!(refunds.made().len(), 1, "the refund reached the gateway");

    server.terminate();
    server
        .exits_cleanly(Duration::from_secs(10), "after the refund's saga")
        .await;
    let logs = server.logs();
    assert!(logs.contains("waiting for the sagas in flight"), "{logs}");
    let stored = refund::Entity::find()
        .all(&world.db)
        .await
        .expect("refunds");
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].state.to_string(), "COMPLETADO", "{logs}");
    assert_eq!(refunds.made().len(), 1, "refunded once");
}

/// The key retentions the processes recorded (`key_retention/<process id>` rows).
async fn retention_rows(world: &World) -> Vec<String> {
    use pagos::entities::instance_fact as facts;
    use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
    facts::Entity::find()
        .filter(facts::Column::Name.starts_with(pagos::reaper::RETENTION_FACT))
        .all(&world.db)
        .await
        .expect("facts")
        .into_iter()
        .map(|fact| fact.value)
        .collect()
}
