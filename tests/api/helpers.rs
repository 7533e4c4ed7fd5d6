//! Test harness: a fresh database per test (SQLite file or a new PostgreSQL database),
//! pagos bound to port 0 and spoken to over real HTTP, wiremock as the gateway.

use clap::Parser;
use pagos::config::{Cli, Command, Settings};
use pagos::gateway::Gateway;
use sea_orm::{ConnectionTrait, DatabaseConnection, EntityTrait, PaginatorTrait};
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::sync::{Arc, Once};
use std::time::Duration;
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

pub const API_KEY: &str = "sk_test_acme";
pub const OTHER_API_KEY: &str = "sk_test_globex";

static TRACING: Once = Once::new();

fn init_logs() {
    TRACING.call_once(|| {
        if std::env::var_os("TEST_LOG").is_some() {
            let _ = tracing_subscriber::fmt()
                .with_env_filter("info,sqlx=warn")
                .with_test_writer()
                .try_init();
        }
    });
}

/// Which database a test runs on.
#[derive(Clone, Debug)]
pub enum Backend {
    Sqlite,
    Postgres(String),
}

impl Backend {
    /// PostgreSQL from `PAGOS_TEST_POSTGRES_URL`. Unset: the test says so and does not run,
    /// unless `CI=true`, where that is a failure.
    pub fn postgres() -> Option<Backend> {
        match std::env::var("PAGOS_TEST_POSTGRES_URL") {
            Ok(url) if !url.is_empty() => Some(Backend::Postgres(url)),
            _ if std::env::var("CI").is_ok_and(|v| v == "true") => {
                panic!(
                    "PAGOS_TEST_POSTGRES_URL must be set when CI=true: the PostgreSQL tests must run"
                )
            }
            _ => {
                eprintln!(
                    "skipped: PAGOS_TEST_POSTGRES_URL is not set, this PostgreSQL test did not run"
                );
                None
            }
        }
    }
}

/// Generates a `sqlite` and a `postgres` test for each named async fn taking a `Backend`.
#[macro_export]
macro_rules! on_both_databases {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn sqlite() {
                    super::$name($crate::helpers::Backend::Sqlite).await
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn postgres() {
                    if let Some(backend) = $crate::helpers::Backend::postgres() {
                        super::$name(backend).await
                    }
                }
            }
        )*
    };
}

/// A database made for one test, dropped after it.
pub struct TestDatabase {
    pub url: String,
    _dir: Option<tempfile::TempDir>,
    drop_pg: Option<(String, String)>,
}

impl TestDatabase {
    pub async fn create(backend: &Backend) -> TestDatabase {
        match backend {
            Backend::Sqlite => {
                let dir = tempfile::tempdir().expect("temp dir");
                let url = format!(
                    "sqlite://{}?mode=rwc",
                    dir.path().join("pagos.db").display()
                );
                TestDatabase {
                    url,
                    _dir: Some(dir),
                    drop_pg: None,
                }
            }
            Backend::Postgres(admin_url) => {
                let name = format!("pagos_test_{}", uuid::Uuid::new_v4().simple());
                let admin = sea_orm::Database::connect(admin_url.as_str())
                    .await
                    .expect("connect to PAGOS_TEST_POSTGRES_URL");
                admin
                    .execute_unprepared(&format!("CREATE DATABASE {name}"))
                    .await
                    .expect("create test database");
                let _ = admin.close().await;
                let mut url = url::Url::parse(admin_url).expect("PAGOS_TEST_POSTGRES_URL is a URL");
                url.set_path(&name);
                TestDatabase {
                    url: url.to_string(),
                    _dir: None,
                    drop_pg: Some((admin_url.clone(), name)),
                }
            }
        }
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        if let Some((admin_url, name)) = self.drop_pg.take() {
            // Drop runs outside async: a short-lived runtime on its own thread.
            let _ = std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build();
                if let Ok(rt) = rt {
                    rt.block_on(async {
                        if let Ok(admin) = sea_orm::Database::connect(admin_url.as_str()).await {
                            let _ = admin
                                .execute_unprepared(&format!(
                                    "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
                                ))
                                .await;
                            let _ = admin.close().await;
                        }
                    });
                }
            })
            .join();
        }
    }
}

/// `pagos serve` settings as the CLI would parse them, plus `extra` flags.
pub fn settings(database_url: &str, extra: &[&str]) -> Settings {
    let mut args = vec![
        "pagos",
        "serve",
        "--database-url",
        database_url,
        "--bind",
        "127.0.0.1:0",
    ];
    args.extend_from_slice(extra);
    match Cli::try_parse_from(args).map(|cli| cli.command) {
        Ok(Command::Serve(settings)) => *settings,
        other => panic!("bad test settings: {other:?}"),
    }
}

pub struct TestApp {
    pub addr: SocketAddr,
    pub http: reqwest::Client,
    pub db: DatabaseConnection,
    pub gateway: Option<MockServer>,
    _database: TestDatabase,
    _server: tokio::task::JoinHandle<()>,
    /// Stops the delivery worker (if any) when the app is dropped.
    _stop_delivering: tokio::sync::watch::Sender<bool>,
}

pub struct Spawn<'a> {
    pub backend: Backend,
    /// Flags for `pagos serve`; a wiremock gateway is added unless `sandbox` is set.
    pub flags: Vec<&'a str>,
    pub sandbox: bool,
    /// A gateway of the test's own instead of wiremock.
    pub gateway_url: Option<String>,
    /// Check the settings as `pagos serve` does (off only to build states the checks
    /// exist to prevent).
    pub validate: bool,
    /// `PAGOS_GATEWAY` when the gateway is wiremock or the test's own: `http` (the
    /// reference protocol), `stripe` or `mercadopago`.
    pub provider: &'a str,
    /// Run the webhook delivery worker beside the server, as `pagos serve` does.
    pub delivering: bool,
}

impl<'a> Spawn<'a> {
    pub fn new(backend: Backend) -> Self {
        Spawn {
            backend,
            flags: vec![],
            sandbox: false,
            gateway_url: None,
            validate: true,
            provider: "http",
            delivering: false,
        }
    }

    /// With the webhook delivery worker.
    pub fn delivering(mut self) -> Self {
        self.delivering = true;
        self
    }

    /// Speak `provider`'s API (`stripe`, `mercadopago`) to the wiremock gateway.
    pub fn provider(mut self, provider: &'a str) -> Self {
        self.provider = provider;
        self
    }

    pub fn flags(mut self, flags: &[&'a str]) -> Self {
        self.flags.extend_from_slice(flags);
        self
    }

    pub fn sandbox(mut self) -> Self {
        self.sandbox = true;
        self
    }

    pub fn unvalidated(mut self) -> Self {
        self.validate = false;
        self
    }

    pub fn gateway_url(mut self, url: String) -> Self {
        self.gateway_url = Some(url);
        self
    }

    pub async fn start(self) -> TestApp {
        init_logs();
        let database = TestDatabase::create(&self.backend).await;
        let gateway = if self.sandbox || self.gateway_url.is_some() {
            None
        } else {
            Some(MockServer::start().await)
        };
        let uri = gateway
            .as_ref()
            .map(|g| g.uri())
            .or(self.gateway_url.clone());
        let mut flags = Vec::new();
        for (flag, value) in [
            ("--gateway-timeout", "500ms"),
            ("--gateway-retries", "3"),
            ("--admin-token", ADMIN_TOKEN),
        ] {
            if !self.flags.contains(&flag) {
                flags.extend_from_slice(&[flag, value]);
            }
        }
        if let Some(uri) = uri.as_deref() {
            flags.extend_from_slice(&[
                "--gateway",
                self.provider,
                "--gateway-url",
                uri,
                "--gateway-secret",
                "gw_secret",
            ]);
        }
        flags.extend_from_slice(&self.flags);
        let settings = settings(&database.url, &flags);
        if self.validate {
            settings.validate().expect("valid test settings");
        }
        let db = pagos::app::open_and_migrate(&settings.database)
            .await
            .expect("database");
        pagos::app::add_merchant(&db, "acme", Some(API_KEY.into()))
            .await
            .expect("merchant");
        pagos::app::add_merchant(&db, "globex", Some(OTHER_API_KEY.into()))
            .await
            .expect("merchant");
        let gw: Arc<dyn Gateway> = pagos::app::gateway_from(&settings).expect("gateway");
        let state = pagos::app::build(db.clone(), settings, gw);
        let (stop_delivering, stopped) = tokio::sync::watch::channel(false);
        if self.delivering {
            tokio::spawn(pagos::dispatcher::run_periodically(
                pagos::app::dispatcher_of(&state),
                stopped,
            ));
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let server = tokio::spawn(async move {
            let _ = pagos::app::serve_on(listener, state, std::future::pending()).await;
        });
        TestApp {
            addr,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .build()
                .expect("client"),
            db,
            gateway,
            _database: database,
            _server: server,
            _stop_delivering: stop_delivering,
        }
    }
}

pub fn payment_body() -> Value {
    json!({"creditoId": "42", "monto": 250000, "moneda": "COP"})
}

impl TestApp {
    /// The database this app runs on, for a `pagos` command run beside it.
    pub fn database_url(&self) -> &str {
        &self._database.url
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    pub fn gateway(&self) -> &MockServer {
        self.gateway
            .as_ref()
            .expect("this test has a wiremock gateway")
    }

    /// `POST /v1/pagos` as merchant `api_key`.
    pub async fn pay_as(&self, api_key: &str, key: &str, body: &Value) -> reqwest::Response {
        self.http
            .post(self.url("/v1/pagos"))
            .bearer_auth(api_key)
            .header("Idempotency-Key", key)
            .json(body)
            .send()
            .await
            .expect("request sent")
    }

    pub async fn pay(&self, key: &str, body: &Value) -> reqwest::Response {
        self.pay_as(API_KEY, key, body).await
    }

    /// Charges the gateway received (POST /v1/charges).
    pub async fn charges_seen(&self) -> Vec<Request> {
        self.gateway()
            .received_requests()
            .await
            .unwrap_or_default()
            .into_iter()
            .filter(|r| r.method.as_str() == "POST" && r.url.path() == "/v1/charges")
            .collect()
    }

    pub async fn count_rows(&self) -> (u64, u64) {
        let keys = pagos::entities::idempotency_key::Entity::find()
            .count(&self.db)
            .await
            .expect("count");
        let payments = pagos::entities::payment::Entity::find()
            .count(&self.db)
            .await
            .expect("count");
        (keys, payments)
    }

    pub async fn payment(&self, id: &str) -> pagos::entities::payment::Model {
        let id = uuid::Uuid::parse_str(id).expect("uuid");
        pagos::entities::payment::Entity::find_by_id(id)
            .one(&self.db)
            .await
            .expect("query")
            .expect("payment exists")
    }
}

/// A wiremock responder speaking the reference protocol: a fixture charge about the
/// payment that asked (reference, amount and currency from the request).
pub struct Charge {
    fixture: &'static str,
}

impl Charge {
    pub fn succeeded() -> Self {
        Charge {
            fixture: include_str!("../../fixtures/reference-gateway/charge_succeeded.json"),
        }
    }
    pub fn declined() -> Self {
        Charge {
            fixture: include_str!("../../fixtures/reference-gateway/charge_declined.json"),
        }
    }
    pub fn pending() -> Self {
        Charge {
            fixture: include_str!("../../fixtures/reference-gateway/charge_pending.json"),
        }
    }

    pub fn about(&self, request: &Value) -> Value {
        let mut charge: Value = serde_json::from_str(self.fixture).expect("fixture is JSON");
        for field in ["reference", "amount", "currency"] {
            charge[field] = request[field].clone();
        }
        charge
    }
}

impl Respond for Charge {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let body: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
        ResponseTemplate::new(201).set_body_json(self.about(&body))
    }
}

pub fn charges() -> wiremock::MockBuilder {
    Mock::given(wiremock::matchers::method("POST")).and(wiremock::matchers::path("/v1/charges"))
}

pub async fn json(response: reqwest::Response) -> Value {
    response.json().await.expect("JSON body")
}

/// A stateful reference gateway on wiremock: charges are kept by key and by reference, so
/// lookups (`GET /v1/charges?reference=`) tell the truth about what was charged. Tests can
/// settle pending charges and break lookups.
#[derive(Clone, Default)]
pub struct FakeGateway {
    state: Arc<Mutex<FakeState>>,
}

#[derive(Default)]
struct FakeState {
    by_key: std::collections::HashMap<String, Value>,
    by_reference: std::collections::HashMap<String, Vec<Value>>,
    new_status: Option<&'static str>,
    charge_delay: Duration,
    lookups_fail: bool,
    next: u64,
}

use std::sync::Mutex;

impl FakeGateway {
    /// New charges get `status` (succeeded, declined or pending).
    pub fn charging(status: &'static str) -> Self {
        let fake = FakeGateway::default();
        fake.lock().new_status = Some(status);
        fake
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, FakeState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every new charge is answered after `delay` (it is recorded at once).
    pub fn with_delay(self, delay: Duration) -> Self {
        self.lock().charge_delay = delay;
        self
    }

    pub fn set_new_status(&self, status: &'static str) {
        self.lock().new_status = Some(status);
    }

    /// Every stored charge now has `status` (a pending charge settling).
    pub fn settle_all(&self, status: &'static str) {
        let mut state = self.lock();
        for charges in state.by_reference.values_mut() {
            for charge in charges {
                charge["status"] = Value::from(status);
            }
        }
        for charge in state.by_key.values_mut() {
            charge["status"] = Value::from(status);
        }
    }

    pub fn fail_lookups(&self, fail: bool) {
        self.lock().lookups_fail = fail;
    }

    pub fn clear_delay(&self) {
        self.lock().charge_delay = Duration::ZERO;
    }

    /// Charges made, all references together.
    pub fn total_charges(&self) -> usize {
        self.lock().by_reference.values().map(Vec::len).sum()
    }

    /// A charge the provider already holds for `reference` (made before the test looks).
    pub fn preload(&self, reference: &str, status: &'static str) {
        let mut state = self.lock();
        state.next += 1;
        let charge = json!({
            "id": format!("ch_pre_{}", state.next),
            "status": status,
            "amount": 250000,
            "currency": "COP",
            "reference": reference,
            "declineCode": null,
        });
        state
            .by_reference
            .entry(reference.to_owned())
            .or_default()
            .push(charge);
    }

    /// Charges made for a payment id.
    pub fn charges_for(&self, reference: &str) -> usize {
        self.lock().by_reference.get(reference).map_or(0, Vec::len)
    }

    pub async fn mount(&self, server: &MockServer) {
        Mock::given(wiremock::matchers::method("POST"))
            .and(wiremock::matchers::path("/v1/charges"))
            .respond_with(FakeCharge(self.clone()))
            .mount(server)
            .await;
        Mock::given(wiremock::matchers::method("GET"))
            .and(wiremock::matchers::path("/v1/charges"))
            .respond_with(FakeLookup(self.clone()))
            .mount(server)
            .await;
    }
}

struct FakeCharge(FakeGateway);

impl Respond for FakeCharge {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let key = request
            .headers
            .get("idempotency-key")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        let body: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
        let mut state = self.0.lock();
        let delay = state.charge_delay;
        if let Some(existing) = state.by_key.get(&key) {
            return ResponseTemplate::new(201)
                .set_body_json(existing.clone())
                .set_delay(delay);
        }
        state.next += 1;
        let status = state.new_status.unwrap_or("succeeded");
        let reference = body["reference"].as_str().unwrap_or("").to_owned();
        let charge = json!({
            "id": format!("ch_fake_{}", state.next),
            "status": status,
            "amount": body["amount"],
            "currency": body["currency"],
            "reference": reference,
            "declineCode": if status == "declined" { Value::from("card_declined") } else { Value::Null },
        });
        state.by_key.insert(key, charge.clone());
        state
            .by_reference
            .entry(reference)
            .or_default()
            .push(charge.clone());
        ResponseTemplate::new(201)
            .set_body_json(charge)
            .set_delay(delay)
    }
}

struct FakeLookup(FakeGateway);

impl Respond for FakeLookup {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let state = self.0.lock();
        if state.lookups_fail {
            return ResponseTemplate::new(503).set_body_json(json!({"error": "unavailable"}));
        }
        let reference = request
            .url
            .query_pairs()
            .find(|(k, _)| k == "reference")
            .map(|(_, v)| v.into_owned())
            .unwrap_or_default();
        let data = state
            .by_reference
            .get(&reference)
            .cloned()
            .unwrap_or_default();
        ResponseTemplate::new(200).set_body_json(json!({ "data": data }))
    }
}

/// `Authorization` value of the admin token the test apps use.
pub const ADMIN_TOKEN: &str = "admin_test_token";

impl TestApp {
    /// POST an admin endpoint with the admin token.
    pub async fn admin_post(&self, path: &str, body: &Value) -> reqwest::Response {
        self.http
            .post(self.url(path))
            .bearer_auth(ADMIN_TOKEN)
            .json(body)
            .send()
            .await
            .expect("sent")
    }

    pub async fn admin_get(&self, path: &str) -> reqwest::Response {
        self.http
            .get(self.url(path))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .expect("sent")
    }

    /// Runs the reconciler for one payment through the admin API; returns the report.
    pub async fn reconcile(&self, payment_id: &str) -> Value {
        let answer = self
            .admin_post("/admin/reconciliaciones", &json!({ "pagoId": payment_id }))
            .await;
        assert_eq!(answer.status(), 200);
        json(answer).await
    }
}

impl TestApp {
    /// Scrapes `/metrics` until `wanted` holds of the text (the gauges of stored state
    /// change only at a background refresh); the text that satisfied it.
    pub async fn scrape_until(&self, what: &str, wanted: impl Fn(&str) -> bool) -> String {
        let mut text = String::new();
        for _ in 0..200 {
            text = self
                .http
                .get(self.url("/metrics"))
                .send()
                .await
                .expect("sent")
                .text()
                .await
                .expect("text");
            if wanted(&text) {
                return text;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("metrics never showed {what}:\n{text}");
    }
}

/// `text` (OpenMetrics) has exactly this line.
pub fn has_line(text: &str, line: &str) -> bool {
    text.lines().any(|l| l == line)
}
