//! Chaos soak over the real binaries: `pagos serve` on PostgreSQL charging through
//! `pagos sandbox-gateway` that times out after charging (10%), resets the connection after
//! charging (10%), answers 503 without charging (5%), declines (5%) and leaves charges
//! pending (10%) to settle later through duplicated, delayed and reordered webhooks
//! (`--chaos`). Sixteen clients of `pagos_client` (one key per intent, a journal each,
//! retries) pay N payments while the server is SIGKILLed and restarted; then the journals
//! are resumed, the system is left to settle, and one reconciliation pass runs.
//!
//! It checks the invariants: no reference charged twice at the gateway; no payment left
//! in flight (REVISION_MANUAL ones are listed); every intent's key, replayed once more,
//! answers the same final answer; gateway charges = COMPLETADA + declined payments. Then
//! every fourth COMPLETADA payment is refunded by half through the same faults (and 5 %
//! of refunds failing at the gateway), and: refunds at the gateway = refunds COMPLETADO,
//! none made twice, no charge nor payment refunded beyond its amount, none left in flight.
//!
//! Size: `PAGOS_SOAK_PAYMENTS` (300), `PAGOS_SOAK_KILLS` (1), `PAGOS_SOAK_CLIENTS` (16),
//! `PAGOS_SOAK_SEED` (random, printed). The full soak (docs/benchmarks.md):
//! `PAGOS_SOAK_PAYMENTS=5000 PAGOS_SOAK_KILLS=2 cargo test --release --test soak -- --nocapture`.
//! PostgreSQL from `PAGOS_TEST_POSTGRES_URL` (a fresh database); unset, it says so and does
//! not run, unless `CI=true`. `TEST_LOG=1` shows the children's logs.

#[path = "../support/binary.rs"]
mod binary;
#[allow(dead_code)]
#[path = "../api/helpers.rs"]
mod helpers;

use futures::StreamExt;
use helpers::{Backend, TestDatabase};
use pagos::entities::{idempotency_key, payment, payment_transition, refund};
use pagos_client::{
    Client, Intent, Journal, Outcome, Pago, PayError, PayPolicy, PaymentRequest, RefundIntent,
    RefundOutcome, RefundRequest, Waiting,
};
use sea_orm::{
    ColumnTrait, DatabaseConnection, EntityTrait, PaginatorTrait, QueryFilter, QueryOrder,
};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const API_KEY: &str = "sk_soak_acme";
const WEBHOOK_SECRET: &str = "whsec_soak";

fn setting(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) if !v.is_empty() => v
            .parse()
            .unwrap_or_else(|_| panic!("{name} must be a whole number, not {v:?}")),
        _ => default,
    }
}

fn pagos(args: &[&str], log: &Path) -> Command {
    binary::pagos(args, Some(log))
}

use binary::free_port;

/// The children, SIGKILLed and reaped however the soak ends.
#[derive(Default)]
struct Children {
    sandbox: Option<Child>,
    serve: Option<Child>,
}

impl Drop for Children {
    fn drop(&mut self) {
        for child in [self.serve.take(), self.sandbox.take()]
            .into_iter()
            .flatten()
        {
            let mut child = child;
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Everything needed to (re)start `pagos serve` the same way.
struct Serve {
    args: Vec<String>,
    log: PathBuf,
}

impl Serve {
    fn spawn(&self) -> Child {
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        pagos(&args, &self.log).spawn().expect("pagos serve starts")
    }
}

async fn wait_until_up(url: &str) {
    binary::wait_until_up(url, Duration::from_secs(60), String::new).await;
}

async fn sandbox_stats(http: &reqwest::Client, base: &str) -> Value {
    for _ in 0..50 {
        let answer = http
            .get(format!("{base}/sandbox/stats"))
            .timeout(Duration::from_secs(5))
            .send()
            .await;
        if let Ok(answer) = answer
            && let Ok(stats) = answer.json::<Value>().await
        {
            return stats;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the sandbox gateway's stats could not be read");
}

/// What one intent's client saw last.
#[derive(Clone, Debug)]
enum Seen {
    /// A final answer: the payment, and 201 (paid) or 402 (declined).
    Final(Box<Pago>, u16),
    /// Pending at the deadline, or gave up with the outcome unknown: still in its journal.
    Unsettled(String),
    /// Anything else: never expected.
    Error(String),
}

fn seen(result: &Result<Outcome, PayError>) -> Seen {
    match result {
        Ok(Outcome::Paid(p)) => Seen::Final(Box::new(p.clone()), 201),
        Ok(Outcome::Declined { payment, .. }) => Seen::Final(Box::new(payment.clone()), 402),
        Ok(Outcome::Pending(p)) => Seen::Unsettled(format!("pending ({})", p.state)),
        Err(err @ PayError::GaveUp { .. }) => Seen::Unsettled(err.to_string()),
        Err(err) => Seen::Error(err.to_string()),
    }
}

/// The clients' retry budget: long enough to outlast a killed server's leases.
fn policy() -> PayPolicy {
    PayPolicy {
        max_attempts: 40,
        deadline: Duration::from_secs(60),
        request_timeout: Duration::from_secs(15),
        min_delay: Duration::from_millis(100),
        max_delay: Duration::from_secs(2),
        seed: None,
    }
}

#[derive(Default)]
struct Retries {
    failed: AtomicU64,
    pending: AtomicU64,
}

fn client(url: &str, journal: Journal, retries: Arc<Retries>) -> Client {
    Client::new(url, API_KEY)
        .expect("client")
        .with_policy(policy())
        .with_journal(journal)
        .on_retry(move |notice| {
            let counter = match notice.waiting {
                Waiting::Failed { .. } => &retries.failed,
                Waiting::Pending { .. } => &retries.pending,
            };
            counter.fetch_add(1, Ordering::Relaxed);
        })
}

fn count_by<'a>(items: impl Iterator<Item = &'a str>) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for item in items {
        *counts.entry(item.to_owned()).or_default() += 1;
    }
    counts
}

async fn count_states(db: &DatabaseConnection, states: &[&str]) -> u64 {
    payment::Entity::find()
        .filter(payment::Column::State.is_in(states.iter().copied()))
        .count(db)
        .await
        .expect("count")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn payments_under_gateway_chaos_and_server_kills_are_charged_once_and_all_settle() {
    let Some(backend) = Backend::postgres() else {
        return;
    };
    let payments = setting("PAGOS_SOAK_PAYMENTS", 300) as usize;
    let kills = setting("PAGOS_SOAK_KILLS", 1) as usize;
    let clients = setting("PAGOS_SOAK_CLIENTS", 16).max(1) as usize;
    let seed = setting("PAGOS_SOAK_SEED", rand::random::<u32>().into());
    // Bounded: generous for this machine, short enough to notice a hang.
    let budget = Duration::from_secs(150) + Duration::from_millis(100) * payments as u32;
    let started = Instant::now();
    eprintln!(
        "soak: {payments} payments, {clients} clients, {kills} kill(s) of pagos serve, seed {seed}, at most {}s",
        budget.as_secs()
    );
    let outcome = tokio::time::timeout(budget, soak(backend, payments, kills, clients, seed)).await;
    match outcome {
        Ok(()) => eprintln!("soak: passed in {:.0}s", started.elapsed().as_secs_f64()),
        Err(_) => panic!(
            "soak did not finish within {}s (seed {seed})",
            budget.as_secs()
        ),
    }
}

async fn soak(backend: Backend, payments: usize, kills: usize, clients: usize, seed: u64) {
    let started = Instant::now();
    let database = TestDatabase::create(&backend).await;
    let db_url = database.url.clone();
    let dir = tempfile::tempdir().expect("temp dir");
    let log = dir.path().join("children.log");
    binary::add_merchant(&db_url, "acme", API_KEY);

    let (serve_port, sandbox_port) = (free_port(), free_port());
    let serve_url = format!("http://127.0.0.1:{serve_port}");
    let sandbox_url = format!("http://127.0.0.1:{sandbox_port}");
    let seed_text = seed.to_string();
    let webhook_url = format!("{serve_url}/v1/webhooks/http");
    let sandbox_bind = format!("127.0.0.1:{sandbox_port}");
    let sandbox = pagos(
        &[
            "sandbox-gateway",
            "--bind",
            &sandbox_bind,
            "--timeout-rate",
            "0.1",
            "--reset-rate",
            "0.1",
            "--error-rate",
            "0.05",
            "--pending-rate",
            "0.1",
            "--decline-rate",
            "0.05",
            "--refund-failure-rate",
            "0.05",
            "--pending-for",
            "1s",
            "--webhook-url",
            &webhook_url,
            "--webhook-secret",
            WEBHOOK_SECRET,
            "--chaos",
            "--seed",
            &seed_text,
        ],
        &log,
    )
    .spawn()
    .expect("sandbox starts");
    // The server's gateway settings, for serve and for the final pass alike: a short
    // gateway timeout (the sandbox hangs for an hour), a lease just above the longest
    // gateway call, a reconciler that looks often.
    let gateway_flags = [
        "--gateway",
        "http",
        "--gateway-url",
        &sandbox_url,
        "--gateway-timeout",
        "500ms",
        "--gateway-retries",
        "2",
        "--lease",
        "10s",
        "--stale-after",
        "2s",
    ]
    .map(str::to_owned);
    let mut serve_args: Vec<String> = ["serve", "--database-url", &db_url, "--bind"]
        .map(str::to_owned)
        .to_vec();
    serve_args.push(format!("127.0.0.1:{serve_port}"));
    serve_args.extend(gateway_flags.iter().cloned());
    serve_args.extend(
        [
            "--reconcile-every",
            "1s",
            "--webhook-secret",
            WEBHOOK_SECRET,
        ]
        .map(str::to_owned),
    );
    let serve = Serve {
        args: serve_args,
        log: log.clone(),
    };
    let children = Arc::new(Mutex::new(Children {
        sandbox: Some(sandbox),
        serve: Some(serve.spawn()),
    }));

    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client");
    wait_until_up(&format!("{serve_url}/healthz")).await;
    wait_until_up(&format!("{sandbox_url}/sandbox/stats")).await;

    // The intents, made up front: one key each, for good.
    let intents: Arc<Vec<Intent>> = Arc::new(
        (0..payments)
            .map(|i| {
                let request = PaymentRequest::new(format!("soak-{i}"), 1_000 + i as i64, "COP")
                    .expect("a valid request");
                Intent::new(request)
            })
            .collect(),
    );
    let results: Arc<Mutex<Vec<Option<Seen>>>> = Arc::new(Mutex::new(vec![None; payments]));
    let next = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let retries = Arc::new(Retries::default());
    let mut journals = Vec::new();
    for c in 0..clients {
        journals.push(
            Journal::open(dir.path().join(format!("journal-{c}.db")))
                .await
                .expect("journal"),
        );
    }

    // The killer: SIGKILL pagos serve at evenly spaced points of the run, restart it at once.
    let killer = {
        let (children, done) = (children.clone(), done.clone());
        tokio::spawn(async move {
            let mut killed_at = Vec::new();
            for k in 1..=kills {
                let at = payments * k / (kills + 1);
                while done.load(Ordering::SeqCst) < at {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                let mut guard = children.lock().expect("lock");
                if let Some(mut old) = guard.serve.take() {
                    let _ = old.kill();
                    let _ = old.wait();
                }
                guard.serve = Some(serve.spawn());
                drop(guard);
                let now = done.load(Ordering::SeqCst);
                eprintln!("soak: SIGKILLed pagos serve after {now} payments settled; restarted it");
                killed_at.push(now);
            }
            killed_at
        })
    };

    // The clients.
    let progress = {
        let done = done.clone();
        tokio::spawn(async move {
            let step = (payments / 10).max(1);
            let mut shown = 0;
            loop {
                tokio::time::sleep(Duration::from_millis(200)).await;
                let now = done.load(Ordering::SeqCst);
                if now >= shown + step || now == payments {
                    eprintln!(
                        "soak: {now}/{payments} intents answered ({:.0}s)",
                        started.elapsed().as_secs_f64()
                    );
                    shown = now;
                }
                if now == payments {
                    break;
                }
            }
        })
    };
    let workers: Vec<_> = journals
        .iter()
        .map(|journal| {
            let client = client(&serve_url, journal.clone(), retries.clone());
            let (intents, results, next, done) =
                (intents.clone(), results.clone(), next.clone(), done.clone());
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    let Some(intent) = intents.get(i) else {
                        break;
                    };
                    let result = client.pay(intent).await;
                    results.lock().expect("lock")[i] = Some(seen(&result));
                    done.fetch_add(1, Ordering::SeqCst);
                }
            })
        })
        .collect();
    for worker in workers {
        worker.await.expect("client task");
    }
    let _ = progress.await;
    let killed_at = killer.await.expect("killer");
    let first_pass: Vec<Seen> = results
        .lock()
        .expect("lock")
        .iter()
        .map(|s| s.clone().expect("every intent was paid"))
        .collect();
    let unsettled_first = first_pass
        .iter()
        .filter(|s| matches!(s, Seen::Unsettled(_)))
        .count();
    eprintln!(
        "soak: clients done in {:.0}s; {unsettled_first} intent(s) left in the journals; resuming them",
        started.elapsed().as_secs_f64()
    );

    // Resume every journal: each unsettled intent paid again with its own key.
    let index: HashMap<String, usize> = intents
        .iter()
        .enumerate()
        .map(|(i, intent)| (intent.key().to_string(), i))
        .collect();
    let resumed: Vec<_> = futures::future::join_all(journals.iter().map(|journal| {
        let client = client(&serve_url, journal.clone(), retries.clone());
        async move { client.resume().await.expect("resume") }
    }))
    .await;
    let mut last: Vec<Seen> = first_pass.clone();
    let mut resumed_count = 0;
    for r in resumed.into_iter().flatten() {
        let i = index[&r.pending.intent.key().to_string()];
        last[i] = seen(&r.result);
        resumed_count += 1;
    }
    assert_eq!(
        resumed_count, unsettled_first,
        "the journals held exactly the intents without a final answer"
    );
    for (i, s) in last.iter().enumerate() {
        if let Seen::Unsettled(why) = s {
            eprintln!("soak: intent {i} still without a final answer after resuming: {why}");
        }
    }

    // Let the system settle: no charge pending at the gateway, every webhook delivered,
    // every unsettled payment due for the reconciler.
    let db = pagos::db::connect(&pagos::config::DatabaseArgs {
        url: db_url.clone(),
        pool_size: 4,
    })
    .await
    .expect("database");
    let quiet_by = Instant::now() + Duration::from_secs(120);
    loop {
        let stats = sandbox_stats(&http, &sandbox_url).await;
        let not_due = payment::Entity::find()
            .filter(payment::Column::State.is_in(["EN_PROCESO", "ENVIADA"]))
            .filter(payment::Column::NextAttemptAt.gt(pagos::db::now()))
            .count(&db)
            .await
            .expect("count");
        let quiet = stats["pending"] == 0 && stats["webhooks"]["inFlight"] == 0 && not_due == 0;
        if quiet || Instant::now() > quiet_by {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    // Refunds of a share of the payments, through the same faults: every fourth
    // COMPLETADA payment is refunded by half, by a client with a journal of its own (one
    // key per refund intent), 16 at a time; then the refunds are left to settle.
    let completed = payment::Entity::find()
        .filter(payment::Column::State.eq("COMPLETADA"))
        .order_by_asc(payment::Column::CreatedAt)
        .all(&db)
        .await
        .expect("payments");
    let to_refund: Vec<(uuid::Uuid, i64)> = completed
        .iter()
        .step_by(4)
        .map(|p| (p.id, p.amount / 2))
        .collect();
    let refund_client = Client::new(&serve_url, API_KEY)
        .expect("client")
        .with_journal(
            Journal::open(dir.path().join("journal-refunds.db"))
                .await
                .expect("journal"),
        )
        .with_policy(PayPolicy {
            deadline: Duration::from_secs(60),
            ..PayPolicy::default()
        });
    let refund_answers: Vec<Result<RefundOutcome, PayError>> =
        futures::stream::iter(to_refund.clone())
            .map(|(id, amount)| {
                let client = refund_client.clone();
                async move {
                    let request =
                        RefundRequest::new(id, Some(amount), Some("soak")).expect("a valid refund");
                    client.refund(&RefundIntent::new(request)).await
                }
            })
            .buffer_unordered(16)
            .collect()
            .await;
    let refund_client_errors: Vec<String> = refund_answers
        .iter()
        .filter_map(|a| match a {
            Err(PayError::GaveUp { .. }) | Ok(_) => None,
            Err(e) => Some(e.to_string()),
        })
        .collect();
    let refunds_quiet_by = Instant::now() + Duration::from_secs(120);
    loop {
        let stats = sandbox_stats(&http, &sandbox_url).await;
        let not_due = refund::Entity::find()
            .filter(refund::Column::State.is_in(["EN_PROCESO", "ENVIADO"]))
            .filter(refund::Column::NextAttemptAt.gt(pagos::db::now()))
            .count(&db)
            .await
            .expect("count");
        let quiet =
            stats["refunds"]["pending"] == 0 && stats["webhooks"]["inFlight"] == 0 && not_due == 0;
        if quiet || Instant::now() > refunds_quiet_by {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    // One reconciliation pass.
    let mut reconcile_args = vec!["reconcile", "--once", "--database-url", &db_url];
    reconcile_args.extend(gateway_flags.iter().map(String::as_str));
    let pass = pagos(&reconcile_args, &log)
        .stdout(Stdio::piped())
        .output()
        .expect("pagos reconcile runs");
    assert!(
        pass.status.success(),
        "pagos reconcile --once: {}",
        pass.status
    );
    let report = String::from_utf8_lossy(&pass.stdout).trim().to_owned();

    // The checks.
    let stats = sandbox_stats(&http, &sandbox_url).await;
    let rows = payment::Entity::find()
        .order_by_asc(payment::Column::CreatedAt)
        .all(&db)
        .await
        .expect("payments");
    let keys: HashMap<String, idempotency_key::Model> = idempotency_key::Entity::find()
        .all(&db)
        .await
        .expect("keys")
        .into_iter()
        .map(|k| (k.key.clone(), k))
        .collect();
    let states = count_by(rows.iter().map(|p| p.state.as_str()));
    let state = |s: &str| states.get(s).copied().unwrap_or(0);
    let in_flight: Vec<&payment::Model> = rows
        .iter()
        .filter(|p| p.state == "EN_PROCESO" || p.state == "ENVIADA")
        .collect();
    let review: Vec<&payment::Model> = rows
        .iter()
        .filter(|p| p.state == "REVISION_MANUAL")
        .collect();
    let declined = rows
        .iter()
        .filter(|p| p.state == "FALLIDA" && p.gateway_ref.is_some())
        .count();
    let refused = state("FALLIDA") - declined;

    // Every intent's key once more: the same final answer, byte for byte what was frozen.
    let replays: Vec<(usize, Result<(), String>)> = futures::stream::iter(0..payments)
        .map(|i| {
            let (http, url, intent) = (http.clone(), serve_url.clone(), &intents[i]);
            let key_row = keys.get(intent.key().as_str());
            let under_review = key_row
                .and_then(|k| rows.iter().find(|p| p.id == k.payment_id))
                .is_some_and(|p| p.state == "REVISION_MANUAL");
            let earlier = &last[i];
            async move {
                (
                    i,
                    replay(&http, &url, intent, key_row, under_review, earlier).await,
                )
            }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    let mismatches: Vec<String> = replays
        .into_iter()
        .filter_map(|(i, r)| {
            r.err()
                .map(|e| format!("intent {i} ({}): {e}", intents[i].key()))
        })
        .collect();

    // What the clients saw.
    let client_errors: Vec<String> = last
        .iter()
        .enumerate()
        .filter_map(|(i, s)| match s {
            Seen::Error(e) => Some(format!("intent {i}: {e}")),
            _ => None,
        })
        .collect();
    let final_first = first_pass
        .iter()
        .filter(|s| matches!(s, Seen::Final(..)))
        .count();
    let final_last = last.iter().filter(|s| matches!(s, Seen::Final(..))).count();

    let charges = stats["charges"].as_u64().unwrap_or(u64::MAX) as usize;
    let duplicated = stats["duplicatedReferences"].as_u64().unwrap_or(u64::MAX);
    let mut review_charges = 0;
    let mut review_list = Vec::new();
    for p in &review {
        let found = http
            .get(format!("{sandbox_url}/v1/charges?reference={}", p.id))
            .send()
            .await
            .ok();
        let n = match found {
            Some(r) => r
                .json::<Value>()
                .await
                .ok()
                .and_then(|v| v["data"].as_array().map(Vec::len)),
            None => None,
        };
        review_charges += n.unwrap_or(0);
        let why = payment_transition::Entity::find()
            .filter(payment_transition::Column::PaymentId.eq(p.id))
            .order_by_desc(payment_transition::Column::CreatedAt)
            .one(&db)
            .await
            .ok()
            .flatten()
            .map(|t| t.reason)
            .unwrap_or_default();
        review_list.push(format!(
            "{} ({} charge(s) at the gateway): {why}",
            p.id,
            n.unwrap_or(0)
        ));
    }
    let refund_rows = refund::Entity::find().all(&db).await.expect("refunds");
    let refund_states = count_by(refund_rows.iter().map(|r| r.state.as_str()));
    let refund_state = |s: &str| refund_states.get(s).copied().unwrap_or(0);
    let refunds_in_flight = refund_state("EN_PROCESO") + refund_state("ENVIADO");
    let refunds_succeeded = stats["refunds"]["succeeded"].as_u64().unwrap_or(u64::MAX) as usize;
    let refunds_duplicated = stats["refunds"]["duplicatedReferences"]
        .as_u64()
        .unwrap_or(u64::MAX);
    let over_refunded = stats["refunds"]["overRefundedCharges"]
        .as_u64()
        .unwrap_or(u64::MAX);
    let over_refunded_here = rows
        .iter()
        .filter(|p| {
            let counted: i64 = refund_rows
                .iter()
                .filter(|r| r.payment_id == p.id && r.state.as_str() != "FALLIDO")
                .map(|r| r.amount)
                .sum();
            counted > p.amount
        })
        .count();
    let webhooks = &stats["webhooks"];
    let elapsed = started.elapsed();

    let check = |ok: bool| if ok { "ok" } else { "FAILED" };
    let lines = [
        format!("soak summary (seed {seed}, {:.0}s)", elapsed.as_secs_f64()),
        format!(
            "  intents                      {payments}, {clients} clients, pagos serve SIGKILLed after {killed_at:?} answered"
        ),
        format!(
            "  first answers                {final_first} final, {unsettled_first} left in journals; after resume {final_last} final"
        ),
        format!(
            "  client retries               {} after failures, {} look-ups of pending payments",
            retries.failed.load(Ordering::Relaxed),
            retries.pending.load(Ordering::Relaxed)
        ),
        format!("  payments                     {} {:?}", rows.len(), states),
        format!("  final reconciliation pass    {report}"),
        format!(
            "  gateway                      {charges} charges ({} succeeded, {} declined, {} pending); webhooks: {} events, {} copies delivered, {} duplicates, results {}",
            stats["succeeded"],
            stats["declined"],
            stats["pending"],
            webhooks["events"],
            webhooks["acknowledged"],
            webhooks["duplicates"],
            webhooks["results"]
        ),
        format!(
            "  duplicate charges            {duplicated}  {}",
            check(duplicated == 0)
        ),
        format!(
            "  not terminal after the pass  {} in flight, {} in REVISION_MANUAL  {}",
            in_flight.len(),
            review.len(),
            check(in_flight.is_empty())
        ),
        format!(
            "  replayed once more           {} of {payments} same final answer  {}",
            payments - mismatches.len(),
            check(mismatches.is_empty())
        ),
        format!(
            "  charges = paid + declined    {charges} = {} COMPLETADA + {declined} declined{}  {}",
            state("COMPLETADA"),
            if review_charges > 0 {
                format!(" + {review_charges} under review")
            } else {
                String::new()
            },
            check(charges == state("COMPLETADA") + declined + review_charges)
        ),
        format!(
            "  one payment per intent       {} payments, {} keys  {}",
            rows.len(),
            keys.len(),
            check(
                rows.len() == payments
                    && intents.iter().all(|i| keys.contains_key(i.key().as_str()))
            )
        ),
        format!(
            "  refunds                      {} asked, {} {:?}; gateway {}",
            to_refund.len(),
            refund_rows.len(),
            refund_states,
            stats["refunds"]
        ),
        format!(
            "  refunds at the gateway       {refunds_succeeded} succeeded = {} COMPLETADO, {refunds_duplicated} twice, {over_refunded} charges over-refunded, {over_refunded_here} payments over  {}",
            refund_state("COMPLETADO"),
            check(
                (refunds_succeeded == refund_state("COMPLETADO")
                    || refund_state("REVISION_MANUAL") > 0)
                    && refunds_duplicated == 0
                    && over_refunded == 0
                    && over_refunded_here == 0
                    && refunds_in_flight == 0
            )
        ),
    ];
    for line in &lines {
        eprintln!("{line}");
    }
    for line in &review_list {
        eprintln!("  REVISION_MANUAL: {line}");
    }

    assert!(
        client_errors.is_empty(),
        "clients got answers outside the protocol: {client_errors:#?}"
    );
    assert_eq!(duplicated, 0, "a reference was charged twice: {stats}");
    assert!(
        refund_client_errors.is_empty(),
        "refund clients got answers outside the protocol: {refund_client_errors:#?}"
    );
    assert_eq!(refunds_duplicated, 0, "a refund was made twice: {stats}");
    assert_eq!(over_refunded, 0, "a charge was refunded beyond it: {stats}");
    assert_eq!(over_refunded_here, 0, "refunds over a payment's amount");
    assert_eq!(
        refunds_in_flight, 0,
        "refunds still in flight after the final pass"
    );
    assert_eq!(
        refund_rows.len(),
        to_refund.len(),
        "one refund per refund intent"
    );
    if refund_state("REVISION_MANUAL") == 0 {
        assert_eq!(
            refunds_succeeded,
            refund_state("COMPLETADO"),
            "refunds at the gateway must equal COMPLETADO refunds: {stats}"
        );
    }
    assert!(
        in_flight.is_empty(),
        "payments still in flight after the final pass: {:#?}",
        in_flight
            .iter()
            .map(|p| (p.id, &p.state, p.next_attempt_at))
            .collect::<Vec<_>>()
    );
    assert!(
        mismatches.is_empty(),
        "replays that differ: {mismatches:#?}"
    );
    assert_eq!(
        refused, 0,
        "no payment should have been refused by the gateway"
    );
    assert_eq!(
        charges,
        state("COMPLETADA") + declined + review_charges,
        "gateway charges must equal COMPLETADA + declined payments: {stats}"
    );
    if review.is_empty() {
        assert_eq!(
            stats["succeeded"].as_u64(),
            Some(state("COMPLETADA") as u64),
            "{stats}"
        );
        assert_eq!(stats["declined"].as_u64(), Some(declined as u64), "{stats}");
    }
    assert_eq!(
        rows.len(),
        payments,
        "one payment per intent, none lost, none extra"
    );
    assert_eq!(
        count_states(&db, &["COMPLETADA", "FALLIDA", "REVISION_MANUAL"]).await as usize,
        payments
    );
    drop(children);
}

/// The intent's key once more: a replay (`Idempotent-Replayed: true`) of the frozen answer,
/// byte for byte, about this intent's payment, and what its client was told (a payment
/// under review answers its current state, 202).
async fn replay(
    http: &reqwest::Client,
    base: &str,
    intent: &Intent,
    key_row: Option<&idempotency_key::Model>,
    under_review: bool,
    earlier: &Seen,
) -> Result<(), String> {
    let key_row = key_row.ok_or("no idempotency key row")?;
    let mut last_error = String::new();
    for _ in 0..5 {
        let sent = http
            .post(format!("{base}/v1/pagos"))
            .bearer_auth(API_KEY)
            .header("Idempotency-Key", intent.key().as_str())
            .json(&intent.request().to_json())
            .send()
            .await;
        let answer = match sent {
            Ok(a) => a,
            Err(e) => {
                last_error = e.to_string();
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        let status = answer.status().as_u16();
        let replayed = answer
            .headers()
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true");
        let body = answer.text().await.map_err(|e| e.to_string())?;
        if !replayed {
            return Err(format!("{status} without Idempotent-Replayed: {body}"));
        }
        if under_review {
            // On-call decides: the answer is the payment's current state until then.
            return if status == 202 && body.contains("REVISION_MANUAL") {
                Ok(())
            } else {
                Err(format!("a payment under review answered {status} {body}"))
            };
        }
        if key_row.status != "COMPLETADA" {
            return Err(format!(
                "the key's answer is not frozen ({}); replay {status}",
                key_row.status
            ));
        }
        if Some(i32::from(status)) != key_row.response_code
            || Some(&body) != key_row.response_body.as_ref()
        {
            return Err(format!(
                "replay {status} {body} differs from the frozen {:?} {:?}",
                key_row.response_code, key_row.response_body
            ));
        }
        let json: Value = serde_json::from_str(&body).map_err(|e| e.to_string())?;
        let pago = if status == 402 {
            json["pago"].clone()
        } else {
            json
        };
        let payment: Pago = serde_json::from_value(pago).map_err(|e| e.to_string())?;
        if payment.id != key_row.payment_id {
            return Err(format!(
                "replay names payment {}, the key {}",
                payment.id, key_row.payment_id
            ));
        }
        if let Seen::Final(told, told_status) = earlier
            && (**told != payment || *told_status != status)
        {
            return Err(format!(
                "the client was told {told_status} {told:?}, the replay says {status} {payment:?}"
            ));
        }
        return Ok(());
    }
    Err(format!("no answer: {last_error}"))
}
