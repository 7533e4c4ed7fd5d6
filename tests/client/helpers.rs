//! Test harness for the client against the real `pagos` binary (`serve` with a wiremock
//! gateway, and `pay`). The client's tests that need only a scripted server live in the
//! `pagos-client` crate.

use pagos_client::Journal;
use serde_json::{Value, json};
use std::path::PathBuf;

use std::time::Duration;
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

pub const API_KEY: &str = "sk_test_acme";

pub fn key_of(request: &Request) -> String {
    request
        .headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}

pub fn pagos_bin() -> std::process::Command {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_pagos"));
    command.env_clear();
    if let Some(filter) = std::env::var_os("RUST_LOG") {
        command.env("RUST_LOG", filter);
    }
    command
}

/// What the wiremock gateway does with a charge.
#[derive(Clone, Copy)]
pub enum Charge {
    Succeeded,
    Declined,
    Pending,
    /// Succeeded, in another currency than asked: the payment goes to `REVISION_MANUAL`.
    OtherCurrency,
}

struct ChargeResponder {
    charge: Charge,
    delay: Duration,
}

impl Respond for ChargeResponder {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let asked: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
        let (status, decline) = match self.charge {
            Charge::Succeeded | Charge::OtherCurrency => ("succeeded", Value::Null),
            Charge::Declined => ("declined", json!("insufficient_funds")),
            Charge::Pending => ("pending", Value::Null),
        };
        let currency = match self.charge {
            Charge::OtherCurrency => json!("XAF"),
            _ => asked["currency"].clone(),
        };
        ResponseTemplate::new(201)
            .set_body_json(
                json!({"id": "ch_1", "status": status, "amount": asked["amount"],
                                  "currency": currency, "reference": asked["reference"],
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
    port: u16,
    gateway_flags: Vec<String>,
    _server: crate::binary::Running,
}

impl RealPagos {
    pub async fn start(charge: Charge, delay: Duration) -> RealPagos {
        let gateway = MockServer::start().await;
        Mock::given(method("POST"))
            .and(path("/v1/charges"))
            .respond_with(ChargeResponder { charge, delay })
            .mount(&gateway)
            .await;
        RealPagos::serve(gateway, &["--gateway", "http"]).await
    }

    /// `pagos serve --gateway stripe`, with a Stripe that charges every PaymentIntent.
    pub async fn start_stripe() -> RealPagos {
        let gateway = MockServer::start().await;
        Mock::given(method("POST"))
            .and(path("/v1/payment_intents"))
            .respond_with(crate::stripe::StripeSucceeds)
            .mount(&gateway)
            .await;
        RealPagos::serve(
            gateway,
            &["--gateway", "stripe", "--gateway-secret", "sk_test_x"],
        )
        .await
    }

    async fn serve(gateway: MockServer, gateway_flags: &[&str]) -> RealPagos {
        let dir = tempfile::tempdir().expect("temp dir");
        crate::binary::add_merchant(&database_url(&dir), "acme", API_KEY);
        // The database as it was before any payment, for `restart_on_a_restored_database`:
        // its file and, where the merchant's process left one, its write-ahead log.
        for suffix in ["", "-wal", "-shm"] {
            let file = dir.path().join(format!("pagos.db{suffix}"));
            if file.exists() {
                std::fs::copy(&file, dir.path().join(format!("before.db{suffix}")))
                    .expect("a copy of the database");
            }
        }
        let port = crate::binary::free_port();
        let gateway_flags: Vec<String> = gateway_flags.iter().map(|f| f.to_string()).collect();
        let server = RealPagos::spawn(&dir, port, &gateway, &gateway_flags);
        let pagos = RealPagos {
            url: format!("http://127.0.0.1:{port}"),
            gateway,
            dir,
            port,
            gateway_flags,
            _server: server,
        };
        pagos.wait_until_up().await;
        pagos
    }

    fn spawn(
        dir: &tempfile::TempDir,
        port: u16,
        gateway: &MockServer,
        gateway_flags: &[String],
    ) -> crate::binary::Running {
        let log = dir.path().join("serve.log");
        let server =
            crate::binary::pagos(&["serve", "--database-url", &database_url(dir)], Some(&log))
                .args(["--bind", &format!("127.0.0.1:{port}")])
                .args(gateway_flags)
                .args(["--gateway-url", &gateway.uri()])
                .args(["--gateway-timeout", "5s", "--gateway-retries", "0"])
                // The lease bounds the Retry-After of a 409: keep waits short.
                .args(["--lease", "6s"])
                .spawn()
                .expect("pagos serve");
        crate::binary::Running(server)
    }

    /// The server killed (SIGKILL), its database restored from the copy taken before any
    /// payment (a restore from backup, a failover to a replica behind), and started again
    /// at the same address.
    pub async fn restart_on_a_restored_database(&mut self) {
        self._server.0.kill().expect("SIGKILL pagos serve");
        self._server.0.wait().expect("reaped");
        for suffix in ["", "-wal", "-shm"] {
            let file = self.dir.path().join(format!("pagos.db{suffix}"));
            let _ = std::fs::remove_file(&file);
            let copy = self.dir.path().join(format!("before.db{suffix}"));
            if copy.exists() {
                std::fs::copy(&copy, &file).expect("restore the database");
            }
        }
        self._server = RealPagos::spawn(&self.dir, self.port, &self.gateway, &self.gateway_flags);
        self.wait_until_up().await;
    }

    /// The server killed (SIGKILL) and not started again: nothing answers at its address.
    pub fn kill(&mut self) {
        self._server.0.kill().expect("SIGKILL pagos serve");
        self._server.0.wait().expect("reaped");
    }

    /// From now on the gateway answers charges this way (a pending charge that settled).
    pub async fn gateway_now(&self, charge: Charge) {
        Mock::given(method("POST"))
            .and(path("/v1/charges"))
            .respond_with(ChargeResponder {
                charge,
                delay: Duration::ZERO,
            })
            .with_priority(1)
            .mount(&self.gateway)
            .await;
    }

    async fn wait_until_up(&self) {
        let log = self.dir.path().join("serve.log");
        crate::binary::wait_until_up(
            &format!("{}/healthz", self.url),
            Duration::from_secs(10),
            || std::fs::read_to_string(log).unwrap_or_default(),
        )
        .await;
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
            .filter(|r| {
                r.method.as_str() == "POST"
                    && matches!(r.url.path(), "/v1/charges" | "/v1/payment_intents")
            })
            .collect()
    }

    /// The payments in the server's database.
    pub async fn payments(&self) -> Vec<pagos::entities::payment::Model> {
        use sea_orm::EntityTrait;
        let db = sea_orm::Database::connect(database_url(&self.dir).as_str())
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

    /// The payments the journal still holds, to be asked about again.
    pub async fn journal_pending(&self) -> Vec<pagos_client::PendingIntent> {
        self.journal().await.pending().await.expect("journal")
    }

    /// `pagos pay --resume` with 30 s to finish, which must end paid (exit 0): its
    /// stdout and stderr.
    pub async fn resume_until_paid(&self) -> (String, String) {
        let resumed = self
            .pay()
            .args(["--resume", "--deadline", "30s"])
            .output()
            .await
            .expect("pagos pay --resume");
        let (stdout, stderr) = (text(&resumed.stdout), text(&resumed.stderr));
        assert_eq!(
            resumed.status.code(),
            Some(0),
            "stdout:\n{stdout}\nstderr:\n{stderr}"
        );
        (stdout, stderr)
    }

    /// `pagos pay` of acme's usual payment: 250000 COP of credit 42.
    pub async fn pay_usual(&self, extra: &[&str]) -> std::process::Output {
        self.pay()
            .args(PAYMENT)
            .args(extra)
            .output()
            .await
            .expect("pagos pay")
    }
}

fn database_url(dir: &tempfile::TempDir) -> String {
    format!(
        "sqlite://{}?mode=rwc",
        dir.path().join("pagos.db").display()
    )
}

/// The flags of acme's usual payment: 250000 COP of credit 42.
pub const PAYMENT: [&str; 6] = ["--credito", "42", "--monto", "250000", "--moneda", "COP"];

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}
