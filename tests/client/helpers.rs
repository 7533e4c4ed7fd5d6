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
        let database_url = format!(
            "sqlite://{}?mode=rwc",
            dir.path().join("pagos.db").display()
        );
        let log = dir.path().join("serve.log");
        crate::binary::add_merchant(&database_url, "acme", API_KEY);
        let port = crate::binary::free_port();
        let server = crate::binary::pagos(&["serve", "--database-url", &database_url], Some(&log))
            .args(["--bind", &format!("127.0.0.1:{port}")])
            .args(gateway_flags)
            .args(["--gateway-url", &gateway.uri()])
            .args(["--gateway-timeout", "5s", "--gateway-retries", "0"])
            // The lease bounds the Retry-After of a 409: keep waits short.
            .args(["--lease", "6s"])
            .spawn()
            .expect("pagos serve");
        let server = crate::binary::Running(server);
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

    /// The payments the journal still holds, to be asked about again.
    pub async fn journal_pending(&self) -> Vec<pagos_client::PendingIntent> {
        self.journal().await.pending().await.expect("journal")
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

/// The flags of acme's usual payment: 250000 COP of credit 42.
pub const PAYMENT: [&str; 6] = ["--credito", "42", "--monto", "250000", "--moneda", "COP"];

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}
