//! Test harness for the client: wiremock standing in for pagos, and the real `pagos`
//! binary (`serve` with a wiremock gateway, and `pay`) for the end-to-end tests.

use pagos::client::{Client, Intent, Journal, PaymentRequest, RetryNotice, RetryPolicy};
use serde_json::{Value, json};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use uuid::Uuid;
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

pub const API_KEY: &str = "sk_test_acme";

/// Quick retries, so a test waits only where it means to (a `Retry-After`).
pub fn fast_policy() -> RetryPolicy {
    RetryPolicy {
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
pub fn client(server: &MockServer, journal: &Journal, policy: RetryPolicy) -> (Client, Notices) {
    let notices = Notices::default();
    let sink = notices.clone();
    let client = Client::new(&server.uri(), API_KEY)
        .expect("client")
        .with_policy(policy)
        .with_journal(journal.clone())
        .on_retry(move |n| sink.0.lock().expect("lock").push(n.clone()));
    (client, notices)
}

// ---------------------------------------------------------------------------------------
// The real binary.

pub fn pagos_bin() -> std::process::Command {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_pagos"));
    command.env_clear();
    if let Some(filter) = std::env::var_os("RUST_LOG") {
        command.env("RUST_LOG", filter);
    }
    command
}

/// A child process killed (and reaped) when the test ends, however it ends.
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// What the wiremock gateway does with a charge.
#[derive(Clone, Copy)]
pub enum Charge {
    Succeeded,
    Declined,
    Pending,
}

struct ChargeResponder {
    charge: Charge,
    delay: Duration,
}

impl Respond for ChargeResponder {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let asked: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
        let (status, decline) = match self.charge {
            Charge::Succeeded => ("succeeded", Value::Null),
            Charge::Declined => ("declined", json!("insufficient_funds")),
            Charge::Pending => ("pending", Value::Null),
        };
        ResponseTemplate::new(201)
            .set_body_json(
                json!({"id": "ch_1", "status": status, "amount": asked["amount"],
                                  "currency": asked["currency"], "reference": asked["reference"],
                                  "declineCode": decline}),
            )
            .set_delay(self.delay)
    }
}

/// `pagos serve` on a free port of 127.0.0.1, over a fresh SQLite file, charging
/// through a wiremock gateway.
pub struct RealPagos {
    pub url: String,
    pub gateway: MockServer,
    pub dir: tempfile::TempDir,
    _server: KillOnDrop,
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr").port()
}

impl RealPagos {
    pub async fn start(charge: Charge, delay: Duration) -> RealPagos {
        let gateway = MockServer::start().await;
        Mock::given(method("POST"))
            .and(path("/v1/charges"))
            .respond_with(ChargeResponder { charge, delay })
            .mount(&gateway)
            .await;
        let dir = tempfile::tempdir().expect("temp dir");
        let database_url = format!(
            "sqlite://{}?mode=rwc",
            dir.path().join("pagos.db").display()
        );
        let added = pagos_bin()
            .args(["merchants", "add", "acme", "--api-key", API_KEY])
            .args(["--database-url", &database_url])
            .output()
            .expect("pagos merchants add");
        assert!(
            added.status.success(),
            "merchants add: {}",
            String::from_utf8_lossy(&added.stderr)
        );
        let port = free_port();
        let log = std::fs::File::create(dir.path().join("serve.log")).expect("log file");
        let server = pagos_bin()
            .args(["serve", "--database-url", &database_url])
            .args(["--bind", &format!("127.0.0.1:{port}")])
            .args(["--gateway", "http", "--gateway-url", &gateway.uri()])
            .args(["--gateway-timeout", "5s", "--gateway-retries", "0"])
            // The lease bounds the Retry-After of a 409: keep waits short.
            .args(["--lease", "6s"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("pagos serve");
        let server = KillOnDrop(server);
        let url = format!("http://127.0.0.1:{port}");
        let pagos = RealPagos {
            url,
            gateway,
            dir,
            _server: server,
        };
        pagos.wait_until_up().await;
        pagos
    }

    async fn wait_until_up(&self) {
        let http = reqwest::Client::new();
        for _ in 0..200 {
            let up = http
                .get(format!("{}/healthz", self.url))
                .timeout(Duration::from_millis(500))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success());
            if up {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let log = std::fs::read_to_string(self.dir.path().join("serve.log")).unwrap_or_default();
        panic!("pagos serve did not come up:\n{log}");
    }

    pub fn journal_path(&self) -> PathBuf {
        self.dir.path().join("client").join("journal.db")
    }

    /// `pagos pay` at this server with quick retries and this test's journal.
    pub fn pay(&self) -> tokio::process::Command {
        let mut command = tokio::process::Command::from(pagos_bin());
        command
            .arg("pay")
            .args(["--url", &self.url, "--api-key", API_KEY])
            .arg("--journal")
            .arg(self.journal_path())
            .args(["--retry-min-delay", "50ms", "--retry-max-delay", "500ms"])
            .kill_on_drop(true);
        command
    }

    /// The charges the gateway received.
    pub async fn charges(&self) -> Vec<Request> {
        self.gateway
            .received_requests()
            .await
            .unwrap_or_default()
            .into_iter()
            .filter(|r| r.method.as_str() == "POST" && r.url.path() == "/v1/charges")
            .collect()
    }

    /// The payments in the server's database.
    pub async fn payments(&self) -> Vec<pagos::entities::payment::Model> {
        use sea_orm::EntityTrait;
        let url = format!(
            "sqlite://{}?mode=rw",
            self.dir.path().join("pagos.db").display()
        );
        let db = sea_orm::Database::connect(url.as_str())
            .await
            .expect("open the server's database");
        let payments = pagos::entities::payment::Entity::find()
            .all(&db)
            .await
            .expect("payments");
        let _ = db.close().await;
        payments
    }

    pub async fn journal(&self) -> Journal {
        Journal::open(self.journal_path()).await.expect("journal")
    }
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}
