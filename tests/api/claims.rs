//! Two `pagos serve` processes never work on one payment at once, whatever the gateway
//! does: a payment claimed ahead by one pass that waited for a free slot, then was taken
//! up, must not be claimed and sent by another process while its send is in flight — even
//! through a gateway (like Mercado Pago) that does not answer 409 to a second request with
//! a key still in flight.

use crate::helpers::{Backend, TestDatabase};
use crate::process::{Serve, serving, serving_with_lease};
use pagos::entities::payment;
use sea_orm::{
    ColumnTrait, ConnectionTrait, DatabaseConnection, EntityTrait, QueryFilter, TransactionTrait,
};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

/// A reference-protocol gateway that holds every charge for `hold` (just under pagos'
/// timeout) and records, per gateway key, when each request was in flight. Charges are
/// idempotent by key, as the protocol says; the overlap is what the test watches.
#[derive(Clone)]
struct Recording {
    hold: Duration,
    state: Arc<Mutex<Recorded>>,
}

#[derive(Default)]
struct Recorded {
    /// gateway key → the intervals its requests were in flight.
    in_flight: HashMap<String, Vec<(Instant, Instant)>>,
    /// gateway key → the charge made for it.
    charges: HashMap<String, Value>,
    /// references, in the order their first request arrived.
    arrivals: Vec<String>,
}

impl Recording {
    /// A gateway that records every charge, holding each for `hold`, and whose search
    /// lags (it finds nothing): what makes a second send under a key in flight possible.
    async fn mounted(hold: Duration) -> (MockServer, Recording) {
        let gateway = MockServer::start().await;
        let recording = Recording {
            hold,
            state: Arc::default(),
        };
        Mock::given(method("POST"))
            .and(path("/v1/charges"))
            .respond_with(recording.clone())
            .mount(&gateway)
            .await;
        Mock::given(method("GET"))
            .and(path("/v1/charges"))
            .respond_with(ResponseTemplate::new(200).set_body_json(json!({"data": []})))
            .mount(&gateway)
            .await;
        (gateway, recording)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Recorded> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn arrivals(&self) -> Vec<String> {
        self.lock().arrivals.clone()
    }

    /// Keys that ever had two requests in flight at once.
    fn overlapping(&self) -> Vec<String> {
        let state = self.lock();
        state
            .in_flight
            .iter()
            .filter(|(_, spans)| {
                spans
                    .iter()
                    .enumerate()
                    .any(|(i, (a0, a1))| spans[i + 1..].iter().any(|(b0, b1)| a0 < b1 && b0 < a1))
            })
            .map(|(key, _)| key.clone())
            .collect()
    }
}

impl Respond for Recording {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let key = request.headers["idempotency-key"]
            .to_str()
            .unwrap_or_default()
            .to_owned();
        let body: Value = serde_json::from_slice(&request.body).unwrap_or_default();
        let reference = body["reference"].as_str().unwrap_or_default().to_owned();
        let now = Instant::now();
        let mut state = self.lock();
        state
            .in_flight
            .entry(key.clone())
            .or_default()
            .push((now, now + self.hold));
        if !state.arrivals.contains(&reference) {
            state.arrivals.push(reference.clone());
        }
        let n = state.charges.len() + 1;
        let charge = state
            .charges
            .entry(key)
            .or_insert_with(|| {
                json!({"id": format!("ch_{n}"), "status": "succeeded", "amount": body["amount"],
                       "currency": body["currency"], "reference": reference, "declineCode": null})
            })
            .clone();
        ResponseTemplate::new(201)
            .set_body_json(charge)
            .set_delay(self.hold)
    }
}

/// Payments registered and never sent (EN_PROCESO), due now: what a crash between
/// registering and sending leaves.
async fn due_never_sent(db: &DatabaseConnection, n: usize) -> Vec<uuid::Uuid> {
    let merchant = crate::helpers::acme(db).await;
    let at = pagos::db::now() - chrono::TimeDelta::minutes(1);
    let mut ids = Vec::new();
    for i in 0..n {
        let mut row = crate::helpers::left_payment(
            merchant,
            &format!("k-{i}"),
            pagos::entities::payment::PaymentState::EnProceso,
            0,
            format!("gk-claims-{i}"),
            at,
        );
        // The older one first: the pass takes it first, and claims the other ahead.
        row.next_attempt_at = at + chrono::TimeDelta::seconds(i as i64);
        ids.push(row.id);
        payment::Entity::insert(payment::ActiveModel::from(row))
            .exec_without_returning(db)
            .await
            .expect("seed");
    }
    ids
}

/// A gateway holding every charge for `hold` (`Recording::mounted`), and the flags of a
/// `pagos serve` on `database` charging it: waiting `timeout` for its answer, with a lease
/// of `lease`, and a reconciler that looks every 200 ms for payments stale after 1 s (what
/// races a send); then `more`.
async fn racing(
    database: &str,
    hold: Duration,
    timeout: &str,
    lease: &str,
    more: &[&str],
) -> (MockServer, Recording, Vec<String>) {
    let (gateway, recording) = Recording::mounted(hold).await;
    let uri = gateway.uri();
    let racing = ["--stale-after", "1s", "--reconcile-every", "200ms"];
    let args = serving_with_lease(database, &uri, timeout, lease, &racing)
        .into_iter()
        .chain(more.iter().copied())
        .map(str::to_owned)
        .collect();
    (gateway, recording, args)
}

/// Until `n` payments are COMPLETADA, then as long again as a charge is held (`hold`) and a
/// second: whatever else a process might send, it has had time to.
async fn settled_and_quiet(db: &DatabaseConnection, n: usize, hold: Duration) {
    wait_for("the payments settled", async || {
        payment::Entity::find()
            .filter(payment::Column::State.eq("COMPLETADA"))
            .all(db)
            .await
            .is_ok_and(|all| all.len() == n)
    })
    .await;
    tokio::time::sleep(hold + Duration::from_secs(1)).await;
}

/// Polls `done` every 20 ms for up to 30 s: ample on a loaded machine, where two
/// processes, the database and the gateway share its cores.
async fn wait_for(what: &str, mut done: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if done().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for {what}");
}

/// A pass takes the first payment and claims the second ahead; the second waits for the
/// slot. Here the wait is real: the database holds the first payment's row locked (a slow
/// database, a long lock), so the first payment's work cannot end, until the second's
/// claim has only a second and a half left. Then the second is taken up and sent, and its
/// claim runs out in the middle of its send — unless taking a payment up renews a claim
/// that is running short, or marking it sent holds it for the whole send (pagos does
/// both; the test fails only without either). A second process, polling every 200 ms,
/// must never send it at the same time.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_payment_claimed_ahead_is_never_sent_by_two_processes_at_once() {
    let Some(backend) = Backend::postgres() else {
        return;
    };
    let (database, db) = TestDatabase::with_acme(&backend).await;
    let ids = due_never_sent(&db, 2).await;

    // Held well inside the gateway timeout, so that a loaded machine's slow answer is
    // still an answer, and longer than the 1.5 s left on the claim below.
    let hold = Duration::from_millis(2500);
    let (_gateway, recording, args) = racing(
        &database.url,
        hold,
        "4s",
        "5s",
        &["--reconcile-concurrency", "1"],
    )
    .await;
    let args: Vec<&str> = args.iter().map(String::as_str).collect();

    let first = Serve::start(&args, &[]).await;
    wait_for("the first payment's send", async || {
        recording.arrivals().len() == 1
    })
    .await;
    // The pass claims both, one after the other, and the slot goes to whichever row's
    // work asks for it first: the older one, as a rule, but the runtime may start the
    // other's first. The one sent is "the first payment", the other is claimed ahead.
    let sent = recording.arrivals()[0].clone();
    let (sent, ahead) = if sent == ids[0].to_string() {
        (ids[0], ids[1])
    } else {
        assert_eq!(sent, ids[1].to_string(), "one of the two payments was sent");
        (ids[1], ids[0])
    };
    // The first payment's row stays locked: its work cannot end, the slot stays taken.
    let lock = db.begin().await.expect("transaction");
    lock.execute_raw(sea_orm::Statement::from_sql_and_values(
        sea_orm::DbBackend::Postgres,
        r#"SELECT 1 FROM "payments" WHERE "id" = $1 FOR UPDATE"#,
        [sent.into()],
    ))
    .await
    .expect("lock the first payment");
    let second = Serve::start(&args, &[]).await;
    // The second payment is claimed ahead, waiting for the slot.
    let mut claim_ends = None;
    wait_for("the second payment claimed ahead", async || {
        claim_ends = payment::Entity::find_by_id(ahead)
            .one(&db)
            .await
            .ok()
            .flatten()
            .and_then(|p| p.claimed_until);
        claim_ends.is_some()
    })
    .await;
    let claim_ends = claim_ends.expect("claimed");
    let left = (claim_ends - pagos::db::now() - chrono::TimeDelta::milliseconds(1500))
        .to_std()
        .expect("a claim lasts a whole work (13 s here): most of it is left");
    tokio::time::sleep(left).await;
    lock.rollback().await.expect("release the lock");

    settled_and_quiet(&db, 2, hold).await;
    assert!(
        recording.overlapping().is_empty(),
        "a gateway key had two requests in flight at once: {:?}\nfirst:\n{}\nsecond:\n{}",
        recording.overlapping(),
        first.logs(),
        second.logs()
    );
    assert_eq!(recording.lock().charges.len(), 2, "one charge per payment");
    drop((first, second));
}

/// A payment's send and on-call's pass now (`POST /admin/reconciliaciones`) run in tasks
/// of their own (a caller that hangs up must not cut them), and a pass runs each payment's
/// work in a task of its own. Their log lines still carry the request that started them
/// (with the requests' spans logged), so on-call can tell the decisions of their pass from
/// those of the periodic one, and a payment's gateway answer from another's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requests_saga_and_an_on_demand_pass_log_under_the_request() {
    let backend = Backend::Sqlite;
    let (database, db) = TestDatabase::with_acme(&backend).await;
    let gateway = MockServer::start().await;
    let fake = crate::helpers::FakeGateway::charging("succeeded");
    fake.mount(&gateway).await;
    let uri = gateway.uri();
    let args = serving(
        &database.url,
        &uri,
        &[
            "--admin-token",
            crate::helpers::ADMIN_TOKEN,
            // The periodic pass runs once at start, then not again during the test.
            "--reconcile-every",
            "1h",
        ],
    );
    // The request's span (tower-http's, at DEBUG) is logged.
    let serve = Serve::start(&args, &[("RUST_LOG", "info,tower_http=debug")]).await;
    let paid = reqwest::Client::new()
        .post(format!("{}/v1/pagos", serve.url))
        .bearer_auth(crate::helpers::API_KEY)
        .header("Idempotency-Key", "span-1")
        .json(&json!({"creditoId": "42", "monto": 250000, "moneda": "COP"}))
        .send()
        .await
        .expect("pagos answers");
    assert_eq!(paid.status(), 201);
    let paid: Value = paid.json().await.expect("a payment");
    let paid_id = paid["id"].as_str().expect("an id").to_owned();
    let ids = due_never_sent(&db, 3).await;
    let report: Value = reqwest::Client::new()
        .post(format!("{}/admin/reconciliaciones", serve.url))
        .bearer_auth(crate::helpers::ADMIN_TOKEN)
        .json(&json!({}))
        .send()
        .await
        .expect("admin answers")
        .json()
        .await
        .expect("a report");
    assert_eq!(report["examinados"], 3, "{report}");
    assert_eq!(report["completados"], 3, "{report}");
    let logs = serve.logs();
    for id in ids {
        let decision = logs
            .lines()
            .find(|line| line.contains("reconciler decision") && line.contains(&id.to_string()))
            .unwrap_or_else(|| panic!("no decision logged for {id}:\n{logs}"));
        assert!(
            decision.contains("uri=/admin/reconciliaciones"),
            "the decision's line names the request that ran the pass: {decision}\n{logs}"
        );
    }
    let answered = logs
        .lines()
        .find(|line| line.contains("gateway answered") && line.contains(&paid_id))
        .unwrap_or_else(|| panic!("no gateway answer logged for {paid_id}:\n{logs}"));
    assert!(
        answered.contains("uri=/v1/pagos"),
        "the send's line names the request that made the payment: {answered}\n{logs}"
    );
    drop(serve);
}

/// A request's lease is counted from before its registration, which may wait for a
/// connection or a lock: here the database stalls (a table lock held longer than the
/// lease) while the request registers its payment. Its send then starts with the lease
/// already run out. The write that marks it sent must hold it for the whole send, counted
/// from that write, as a worker's does: otherwise the process's own reconciler (polling
/// every 200 ms) finds it due and unheld, asks the provider (whose search lags: nothing
/// yet) and sends the same key again while the request's send is in flight — two requests
/// at once under one key, which Mercado Pago does not refuse.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_request_whose_registration_stalled_still_holds_its_payment_for_its_send() {
    let Some(backend) = Backend::postgres() else {
        return;
    };
    let (database, db) = TestDatabase::with_acme(&backend).await;
    // The gateway answers well inside its timeout (a loaded machine's slow answer is
    // still an answer); the lease is shorter than the stall below.
    let hold = Duration::from_millis(1500);
    let (_gateway, recording, args) = racing(&database.url, hold, "4s", "5s", &[]).await;
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let serve = Serve::start(&args, &[]).await;

    let stall = db.begin().await.expect("transaction");
    stall
        .execute_raw(sea_orm::Statement::from_string(
            sea_orm::DbBackend::Postgres,
            r#"LOCK TABLE "payments" IN SHARE MODE"#,
        ))
        .await
        .expect("the payments table locked");
    let url = format!("{}/v1/pagos", serve.url);
    let paying = tokio::spawn(async move {
        reqwest::Client::new()
            .post(url)
            .bearer_auth(crate::helpers::API_KEY)
            .header("Idempotency-Key", "k-stalled")
            .json(&json!({"creditoId": "42", "monto": 250000, "moneda": "COP"}))
            .send()
            .await
    });
    // Longer than the lease: the registration waits for the lock all that time.
    tokio::time::sleep(Duration::from_millis(5500)).await;
    stall.rollback().await.expect("the lock released");

    let answer = paying.await.expect("task").expect("answered");
    // 201, or 202 when the reconciler took the payment between its registration and its
    // mark (the lease had run out, so it was due): then the reconciler sends it, and the
    // request's mark is fenced. Either way, one send at a time.
    assert!(
        [201, 202].contains(&answer.status().as_u16()),
        "{}",
        serve.logs()
    );
    settled_and_quiet(&db, 1, hold).await;
    assert!(
        recording.overlapping().is_empty(),
        "a gateway key had two requests in flight at once: {:?}\n{}",
        recording.overlapping(),
        serve.logs()
    );
    let sent: usize = recording.lock().in_flight.values().map(Vec::len).sum();
    assert_eq!(sent, 1, "sent once: {}", serve.logs());
    drop(serve);
}

/// The write that marks a payment sent came back late (here 10 s after its hold was
/// counted, as a stalled pool or a lock would make it): a send begun then could outlast
/// the hold, and another process, seeing the hold run out, send the same charge again
/// (Mercado Pago documents no `409` for a key still in flight). Before, the request sent it
/// anyway. Now it is not sent by that request: the merchant is told 202, and the
/// reconciler looks it up, finds nothing and sends it: one charge, `COMPLETADA`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payment_whose_mark_sent_write_came_back_late_is_sent_by_the_reconciler_once() {
    let world = crate::process::World::new(
        Backend::Sqlite,
        crate::helpers::FakeGateway::charging("succeeded"),
    )
    .await;
    let uri = world.gateway.uri();
    let args = serving(
        &world.database.url,
        &uri,
        &["--reconcile-every", "1s", "--stale-after", "1s"],
    );
    let server = Serve::start(&args, &[("PAGOS_PAUSE_AT", "before_mark_sent:10000")]).await;
    let answer = reqwest::Client::new()
        .post(format!("{}/v1/pagos", server.url))
        .bearer_auth(crate::helpers::API_KEY)
        .header("Idempotency-Key", "k-late-mark")
        .json(&crate::helpers::payment_body())
        .send()
        .await
        .expect("answered");
    assert_eq!(answer.status(), 202, "{}", server.logs());
    assert_eq!(world.fake.total_charges(), 0, "not sent by the request");
    assert!(
        server
            .logs()
            .contains("not sent: the write that marked it sent came back with"),
        "{}",
        server.logs()
    );
    wait_for("the reconciler settles it", async || {
        let all = payment::Entity::find()
            .all(&world.db)
            .await
            .expect("payments");
        all.len() == 1 && all[0].state == payment::PaymentState::Completada
    })
    .await;
    assert_eq!(world.fake.total_charges(), 1, "one charge");
    drop(server);
}

crate::on_both_databases!(a_retry_while_a_late_marked_send_is_in_flight_is_told_409);

/// A request whose mark-sent write came back late, with enough of its hold left to send:
/// its hold outlasts its lease on the key. A retry after the key's lease and before the
/// send's answer is told 409 (the first request still in flight), as the contract says;
/// before, it was answered the payment's state, 202 `ENVIADA`, as if nobody were sending
/// it. Then the first request's answer, and the retry replays it.
async fn a_retry_while_a_late_marked_send_is_in_flight_is_told_409(backend: Backend) {
    let world = crate::process::World::new(
        backend,
        crate::helpers::FakeGateway::charging("succeeded").with_delay(Duration::from_millis(4500)),
    )
    .await;
    let uri = world.gateway.uri();
    let args = serving_with_lease(&world.database.url, &uri, "5s", "6s", &[]);
    let server = Serve::start(&args, &[("PAGOS_PAUSE_AT", "before_mark_sent:4000")]).await;
    let pay = || {
        reqwest::Client::new()
            .post(format!("{}/v1/pagos", server.url))
            .bearer_auth(crate::helpers::API_KEY)
            .header("Idempotency-Key", "k-late-mark-retry")
            .json(&crate::helpers::payment_body())
            .send()
    };
    let started = Instant::now();
    let first = tokio::spawn(pay());
    // Past the key's lease (6 s from the registration), inside the send (4 s to 8.5 s).
    tokio::time::sleep(Duration::from_secs(7).saturating_sub(started.elapsed())).await;
    let retry = pay().await.expect("answered");
    let status = retry.status();
    let retry_after = retry.headers().get("retry-after").cloned();
    let body: Value = retry.json().await.expect("JSON");
    assert_eq!(status, 409, "{body}\n{}", server.logs());
    assert_eq!(body["type"], "/problems/request-in-flight", "{body}");
    assert!(retry_after.is_some(), "{body}");

    let first = first.await.expect("task").expect("answered");
    assert_eq!(first.status(), 201, "{}", server.logs());
    let again = pay().await.expect("answered");
    assert_eq!(again.status(), 201);
    assert_eq!(
        again
            .headers()
            .get("idempotent-replayed")
            .and_then(|v| v.to_str().ok()),
        Some("true")
    );
    assert_eq!(world.fake.total_charges(), 1, "one charge");
    drop(server);
}

crate::on_both_databases!(a_retry_of_a_refund_while_its_late_marked_send_is_in_flight_is_told_409);

/// The same for a refund: its request's mark-sent write came back late, the send goes on
/// past the request's lease, and a retry meanwhile is told 409, not 202 `ENVIADO`.
async fn a_retry_of_a_refund_while_its_late_marked_send_is_in_flight_is_told_409(backend: Backend) {
    let fake = crate::refunds::FakeRefunds::default();
    let world = crate::process::World::unmounted(backend, fake.clone()).await;
    fake.mount(&world.gateway).await;
    let uri = world.gateway.uri();
    let args = serving_with_lease(&world.database.url, &uri, "5s", "6s", &[]);
    let server = Serve::start(&args, &[("PAGOS_PAUSE_AT", "before_mark_sent:4000")]).await;
    let client = reqwest::Client::new();
    let paid = client
        .post(format!("{}/v1/pagos", server.url))
        .bearer_auth(crate::helpers::API_KEY)
        .header("Idempotency-Key", "k-to-refund")
        .json(&crate::helpers::payment_body())
        .send()
        .await
        .expect("answered");
    assert_eq!(paid.status(), 201, "{}", server.logs());
    let payment: Value = paid.json().await.expect("JSON");
    let refunds = format!(
        "{}/v1/pagos/{}/reembolsos",
        server.url,
        payment["id"].as_str().expect("id")
    );
    fake.delay(Duration::from_millis(4500));
    let refund = || {
        client
            .post(&refunds)
            .bearer_auth(crate::helpers::API_KEY)
            .header("Idempotency-Key", "r-late-mark-retry")
            .json(&json!({"monto": 50000}))
            .send()
    };
    let started = Instant::now();
    let first = tokio::spawn(refund());
    tokio::time::sleep(Duration::from_secs(7).saturating_sub(started.elapsed())).await;
    let retry = refund().await.expect("answered");
    let status = retry.status();
    let body: Value = retry.json().await.expect("JSON");
    assert_eq!(status, 409, "{body}\n{}", server.logs());
    assert_eq!(body["type"], "/problems/request-in-flight", "{body}");

    let first = first.await.expect("task").expect("answered");
    assert_eq!(first.status(), 201, "{}", server.logs());
    let again = refund().await.expect("answered");
    assert_eq!(again.status(), 201);
    assert_eq!(fake.made().len(), 1, "one refund");
    drop(server);
}
