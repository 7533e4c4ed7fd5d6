//! Test harness for the client: wiremock standing in for pagos.

use pagos_client::{Client, Intent, Journal, PayPolicy, PaymentRequest, RetryNotice};
use serde_json::{Value, json};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use uuid::Uuid;
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, Request, ResponseTemplate};

pub const API_KEY: &str = "sk_test_acme";

/// Quick retries, so a test waits only where it means to (a `Retry-After`).
pub fn fast_policy() -> PayPolicy {
    PayPolicy {
        max_attempts: 10,
        deadline: Duration::from_secs(10),
        request_timeout: Duration::from_secs(2),
        min_delay: Duration::from_millis(5),
        max_delay: Duration::from_millis(40),
        seed: Some(7),
    }
}

pub fn intent() -> Intent {
    Intent::new(PaymentRequest::new("42", 250_000, "COP").expect("valid"))
}

/// The payment of `intent()` as pagos shows it.
pub fn pago(id: Uuid, estado: &str) -> Value {
    json!({"id": id, "creditoId": "42", "monto": 250000, "moneda": "COP", "estado": estado,
           "gatewayRef": "ch_1", "creadoEn": "2026-01-01T00:00:00.000Z",
           "actualizadoEn": "2026-01-01T00:00:01.000Z"})
}

pub fn problem(status: u16, slug: &str, title: &str) -> Value {
    json!({"type": format!("/problems/{slug}"), "title": title, "status": status,
           "detail": format!("{title}, as the test asked.")})
}

pub fn answer(status: u16, body: Value) -> ResponseTemplate {
    let content_type = if status >= 400 {
        "application/problem+json"
    } else {
        "application/json"
    };
    ResponseTemplate::new(status).set_body_raw(body.to_string(), content_type)
}

pub fn posts() -> wiremock::MockBuilder {
    Mock::given(method("POST")).and(path("/v1/pagos"))
}

pub fn look_ups(id: Uuid) -> wiremock::MockBuilder {
    Mock::given(method("GET")).and(path(format!("/v1/pagos/{id}")))
}

/// The `POST /v1/pagos` requests a server received.
pub async fn posts_seen(server: &MockServer) -> Vec<Request> {
    server
        .received_requests()
        .await
        .unwrap_or_default()
        .into_iter()
        .filter(|r| r.method.as_str() == "POST" && r.url.path() == "/v1/pagos")
        .collect()
}

/// Whether the server got no request at all.
pub async fn nothing_sent(server: &MockServer) -> bool {
    server
        .received_requests()
        .await
        .unwrap_or_default()
        .is_empty()
}

pub fn key_of(request: &Request) -> String {
    request
        .headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}

/// A journal in its own temporary directory.
pub struct TestJournal {
    pub journal: Journal,
    pub path: PathBuf,
    _dir: tempfile::TempDir,
}

impl TestJournal {
    pub async fn new() -> TestJournal {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("journal.db");
        let journal = Journal::open(&path).await.expect("journal");
        TestJournal {
            journal,
            path,
            _dir: dir,
        }
    }
}

/// The notices a client gave before each wait.
#[derive(Clone, Default)]
pub struct Notices(Arc<Mutex<Vec<RetryNotice>>>);

impl Notices {
    pub fn all(&self) -> Vec<RetryNotice> {
        self.0.lock().expect("lock").clone()
    }
}

/// A client of `server` with quick retries, a journal, and its notices recorded.
pub fn client(server: &MockServer, journal: &Journal, policy: PayPolicy) -> (Client, Notices) {
    let notices = Notices::default();
    let sink = notices.clone();
    let client = Client::new(&server.uri(), API_KEY)
        .expect("client")
        .with_policy(policy)
        .with_journal(journal.clone())
        .on_retry(move |n| sink.0.lock().expect("lock").push(n.clone()));
    (client, notices)
}

impl TestJournal {
    /// The intents the journal still holds.
    pub async fn pending(&self) -> Vec<pagos_client::PendingIntent> {
        self.journal.pending().await.expect("journal")
    }

    /// `intent`, written down for `url` by a process that then sent it once and died.
    pub async fn record_sent_once(&self, intent: &Intent, url: &url::Url) {
        self.journal
            .record(intent, url, API_KEY)
            .await
            .expect("recorded");
        self.journal
            .count_attempt(intent.key())
            .await
            .expect("counted");
    }
}

/// A journal of its own, and a client of `server` with `policy` and that journal.
pub async fn journal_and_client(
    server: &MockServer,
    policy: PayPolicy,
) -> (TestJournal, Client, Notices) {
    let journal = TestJournal::new().await;
    let (client, notices) = client(server, &journal.journal, policy);
    (journal, client, notices)
}

/// `fast_policy()` with a `deadline` of its own and waits of at least `min_delay`.
pub fn until(deadline: Duration, min_delay: Duration) -> PayPolicy {
    PayPolicy {
        deadline,
        min_delay,
        ..fast_policy()
    }
}

/// `mock` answers the first request only, before any other.
pub async fn first(mock: Mock, server: &MockServer) {
    mock.up_to_n_times(1).with_priority(1).mount(server).await;
}

/// `mock` answers what the one mounted with `first` leaves.
pub async fn then(mock: Mock, server: &MockServer) {
    mock.with_priority(2).mount(server).await;
}

/// `POST /v1/pagos` is answered `answer`, exactly `times` times.
pub async fn posts_answer(server: &MockServer, answer: ResponseTemplate, times: u64) {
    posts()
        .respond_with(answer)
        .expect(times)
        .mount(server)
        .await;
}

/// `201`, the payment `id` paid.
pub fn paid(id: Uuid) -> ResponseTemplate {
    answer(201, pago(id, "COMPLETADA"))
}

/// `201`, the payment `id` paid, as the replay of an earlier request.
pub fn paid_replay(id: Uuid) -> ResponseTemplate {
    paid(id).insert_header("Idempotent-Replayed", "true")
}

/// A problem answer `status` (`service-unavailable`) titled `title`.
pub fn unavailable(status: u16, title: &str) -> ResponseTemplate {
    answer(status, problem(status, "service-unavailable", title))
}

/// The connection reset before an answer (`why`, in the error).
pub fn reset(why: &'static str) -> impl Fn(&Request) -> std::io::Error {
    move |_| std::io::Error::new(std::io::ErrorKind::ConnectionReset, why)
}

/// The `Idempotency-Key` of every `POST /v1/pagos` a server received, in order.
pub async fn keys_sent(server: &MockServer) -> Vec<String> {
    posts_seen(server).await.iter().map(key_of).collect()
}

/// `POST /v1/pagos/{payment}/reembolsos`.
pub fn refunds(payment: Uuid) -> wiremock::MockBuilder {
    Mock::given(method("POST")).and(path(format!("/v1/pagos/{payment}/reembolsos")))
}

/// A refund of 1000 of `payment` as pagos shows it.
pub fn reembolso(id: Uuid, payment: Uuid, estado: &str) -> Value {
    json!({"id": id, "pagoId": payment, "monto": 1000, "moneda": "COP", "estado": estado,
           "gatewayRef": "re_1", "creadoEn": "2026-01-01T00:00:00.000Z",
           "actualizadoEn": "2026-01-01T00:00:01.000Z"})
}

/// 409 `request-in-flight`, `Retry-After: 1`: the first request with this key still runs.
pub fn in_flight() -> ResponseTemplate {
    answer(
        409,
        problem(
            409,
            "request-in-flight",
            "A request with this Idempotency-Key is in progress",
        ),
    )
    .insert_header("Retry-After", "1")
}

/// Answers `answer`, and tells the receiver [`tell`] gave that a request came, the moment
/// it comes (before any delay of `answer`).
pub struct Tell {
    arrived: futures::channel::mpsc::UnboundedSender<()>,
    answer: ResponseTemplate,
}

/// `answer`, told as it is asked: the responder, and what hears of each request.
pub fn tell(answer: ResponseTemplate) -> (Tell, futures::channel::mpsc::UnboundedReceiver<()>) {
    let (arrived, heard) = futures::channel::mpsc::unbounded();
    (Tell { arrived, answer }, heard)
}

impl wiremock::Respond for Tell {
    fn respond(&self, _: &Request) -> ResponseTemplate {
        // Nobody listening any more is no reason to fail the answer.
        let _ = self.arrived.unbounded_send(());
        self.answer.clone()
    }
}

/// `pagos pay` as a merchant runs it, at `server`, with `journal` and the test's API key,
/// and `flags`: its exit code.
pub async fn pagos_pay(
    server: &MockServer,
    journal: &std::path::Path,
    flags: &[&str],
) -> std::process::ExitCode {
    #[derive(clap::Parser)]
    struct Pay {
        #[command(flatten)]
        args: pagos_client::cli::PayArgs,
    }
    let args = <Pay as clap::Parser>::try_parse_from(command("pay", server, journal, flags))
        .expect("flags")
        .args;
    pagos_client::cli::run(args).await.expect("ran")
}

/// `pagos refund` as a merchant runs it, as [`pagos_pay`] runs `pagos pay`.
pub async fn pagos_refund(
    server: &MockServer,
    journal: &std::path::Path,
    flags: &[&str],
) -> std::process::ExitCode {
    #[derive(clap::Parser)]
    struct Refund {
        #[command(flatten)]
        args: pagos_client::refund_cli::RefundArgs,
    }
    let args = <Refund as clap::Parser>::try_parse_from(command("refund", server, journal, flags))
        .expect("flags")
        .args;
    pagos_client::refund_cli::run(args).await.expect("ran")
}

fn command(
    name: &str,
    server: &MockServer,
    journal: &std::path::Path,
    flags: &[&str],
) -> Vec<String> {
    let journal = journal.to_str().expect("a UTF-8 path");
    [
        name,
        "--url",
        &server.uri(),
        "--api-key",
        API_KEY,
        "--journal",
        journal,
    ]
    .into_iter()
    .chain(flags.iter().copied())
    .map(str::to_owned)
    .collect()
}
