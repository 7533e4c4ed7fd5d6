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
