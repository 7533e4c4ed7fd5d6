//! Test harness: a fresh database per test (SQLite file or a new PostgreSQL database),
//! pagos bound to port 0 and spoken to over real HTTP, wiremock as the gateway.

use clap::Parser;
use pagos::config::{Cli, Command, Settings};
use pagos::gateway::Gateway;
use sea_orm::{
    ColumnTrait, ConnectionTrait, DatabaseConnection, EntityTrait, PaginatorTrait, QueryFilter,
};
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
    /// A new database, migrated, with the merchant `acme` (`API_KEY`).
    pub async fn with_acme(backend: &Backend) -> (TestDatabase, DatabaseConnection) {
        let database = TestDatabase::create(backend).await;
        let db = database.migrated().await;
        pagos::app::add_merchant(&db, "acme", Some(API_KEY.into()))
            .await
            .expect("merchant");
        (database, db)
    }

    /// This database, migrated.
    pub async fn migrated(&self) -> DatabaseConnection {
        pagos::app::open_and_migrate(&settings(&self.url, &[]).database)
            .await
            .expect("database")
    }

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
                on_postgres_admin(admin_url, &format!("CREATE DATABASE {name}")).await;
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
            drop_postgres_databases(admin_url, vec![name]);
        }
    }
}

/// Runs `sql` on the PostgreSQL server of `admin_url`, which must accept it.
pub async fn on_postgres_admin(admin_url: &str, sql: &str) {
    let admin = sea_orm::Database::connect(admin_url)
        .await
        .expect("connect to PAGOS_TEST_POSTGRES_URL");
    admin.execute_unprepared(sql).await.expect(sql);
    let _ = admin.close().await;
}

/// Drops the databases `names` of the PostgreSQL server of `admin_url`, as far as it can.
/// For `Drop`, which runs outside async: a short-lived runtime on its own thread.
pub fn drop_postgres_databases(admin_url: String, names: Vec<String>) {
    let _ = std::thread::spawn(move || {
        let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return;
        };
        rt.block_on(async {
            if let Ok(admin) = sea_orm::Database::connect(admin_url.as_str()).await {
                for name in names {
                    let _ = admin
                        .execute_unprepared(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                        .await;
                }
                let _ = admin.close().await;
            }
        });
    })
    .join();
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
    /// Session defaults a DBA set on the PostgreSQL database (`ALTER DATABASE … SET`)
    /// before pagos first connects; ignored on SQLite.
    pub postgres_defaults: Vec<(&'a str, &'a str)>,
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
            postgres_defaults: vec![],
        }
    }

    /// `ALTER DATABASE … SET name = 'value'` on the test's PostgreSQL database before
    /// pagos first connects to it, as a DBA may have set it.
    pub fn postgres_default(mut self, name: &'a str, value: &'a str) -> Self {
        self.postgres_defaults.push((name, value));
        self
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
        if let Some((admin_url, name)) = &database.drop_pg {
            for (setting, value) in &self.postgres_defaults {
                on_postgres_admin(
                    admin_url,
                    &format!("ALTER DATABASE {name} SET {setting} = '{value}'"),
                )
                .await;
            }
        }
        let gateway = if self.sandbox || self.gateway_url.is_some() {
            None
        } else {
            Some(MockServer::start().await)
        };
        // Mercado Pago says which currency the account charges in (a Colombian one, COP),
        // unless a test mounts its own answer first (priority 1 wins).
        if let Some(server) = gateway.as_ref().filter(|_| self.provider == "mercadopago") {
            Mock::given(wiremock::matchers::method("GET"))
                .and(wiremock::matchers::path("/users/me"))
                .respond_with(
                    ResponseTemplate::new(200).set_body_json(fixture("mercadopago", "users_me")),
                )
                .with_priority(10)
                .mount(server)
                .await;
        }
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
                gateway_secret(self.provider),
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
        let (addr, server) = serve_in_background(state).await;
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

/// `state` served on a port of its own of 127.0.0.1 until the task is dropped or aborted.
pub async fn serve_in_background(
    state: pagos::http::AppState,
) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let server = tokio::spawn(async move {
        let _ = pagos::app::serve_on(listener, state, std::future::pending()).await;
    });
    (addr, server)
}

pub fn payment_body() -> Value {
    json!({"creditoId": "42", "monto": 250000, "moneda": "COP"})
}

/// Another pagos on a test app's database, with settings of its own: a second process of
/// the deployment (its own replay cache, its own limits). Stopped when dropped.
pub struct OtherProcess {
    pub addr: SocketAddr,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for OtherProcess {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl TestApp {
    /// Another pagos on this app's database, with the sandbox gateway and `flags`.
    pub async fn other_process(&self, flags: &[&str]) -> OtherProcess {
        let mut all = vec!["--admin-token", ADMIN_TOKEN];
        all.extend_from_slice(flags);
        let settings = settings(self.database_url(), &all);
        settings.validate().expect("valid test settings");
        let gw: Arc<dyn Gateway> = pagos::app::gateway_from(&settings).expect("gateway");
        let state = pagos::app::build(self.db.clone(), settings, gw);
        let (addr, server) = serve_in_background(state).await;
        OtherProcess { addr, server }
    }

    /// `POST /v1/pagos` as acme to `other`: the status, `Idempotent-Replayed`, the body.
    pub async fn pay_at(
        &self,
        other: &OtherProcess,
        key: &str,
        body: &Value,
    ) -> (u16, Option<String>, String) {
        let answer = self
            .http
            .post(format!("http://{}/v1/pagos", other.addr))
            .bearer_auth(API_KEY)
            .header("Idempotency-Key", key)
            .json(body)
            .send()
            .await
            .expect("request sent");
        let status = answer.status().as_u16();
        let replayed = answer
            .headers()
            .get("idempotent-replayed")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        (status, replayed, answer.text().await.expect("body"))
    }
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
        self.post_keyed(api_key, "/v1/pagos", key, body).await
    }

    /// `POST path` as merchant `api_key`, with `body` and the `Idempotency-Key` `key`.
    pub async fn post_keyed(
        &self,
        api_key: &str,
        path: &str,
        key: &str,
        body: &Value,
    ) -> reqwest::Response {
        keyed(&self.http, &self.url(path), api_key, key, body).await
    }

    /// `POST /v1/pagos` as acme with `payment_body()`, in a task of its own: a request
    /// still running while the test looks.
    pub fn pay_in_background(
        &self,
        key: &str,
    ) -> tokio::task::JoinHandle<Result<reqwest::Response, reqwest::Error>> {
        let request = self
            .http
            .post(self.url("/v1/pagos"))
            .bearer_auth(API_KEY)
            .header("Idempotency-Key", key)
            .json(&payment_body());
        tokio::spawn(request.send())
    }

    /// `GET /metrics`, as text.
    pub async fn metrics(&self) -> String {
        self.get("/metrics").await.text().await.expect("text")
    }

    /// `POST /v1/pagos` as acme; the status and the JSON body.
    pub async fn pay_read(&self, key: &str, body: &Value) -> (u16, Value) {
        let answer = self.pay(key, body).await;
        let status = answer.status().as_u16();
        (status, json(answer).await)
    }

    pub async fn pay(&self, key: &str, body: &Value) -> reqwest::Response {
        self.pay_as(API_KEY, key, body).await
    }

    /// Charges the gateway received (POST /v1/charges).
    pub async fn charges_seen(&self) -> Vec<Request> {
        received(self.gateway(), "POST", |p| p == "/v1/charges").await
    }

    /// The rows of the table of entity `E`.
    pub async fn rows_of<E: EntityTrait>(&self) -> u64
    where
        E::Model: Sync,
    {
        E::find().count(&self.db).await.expect("count")
    }

    /// (idempotency keys stored, payments stored).
    pub async fn count_rows(&self) -> (u64, u64) {
        (
            self.rows_of::<pagos::entities::idempotency_key::Entity>()
                .await,
            self.rows_of::<pagos::entities::payment::Entity>().await,
        )
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

/// Sends `request`, which must reach the server.
pub async fn send(request: reqwest::RequestBuilder) -> reqwest::Response {
    request.send().await.expect("sent")
}

/// Sends `request`; the JSON body of the answer.
pub async fn send_json(request: reqwest::RequestBuilder) -> Value {
    json(send(request).await).await
}

/// HMAC-SHA256 under `secret` of `parts` one after the other, in hex: how gateways sign
/// their webhooks.
pub fn hmac_hex(secret: &str, parts: &[&[u8]]) -> String {
    use hmac::Mac;
    let mut mac =
        hmac::Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()).expect("any key length");
    for part in parts {
        mac.update(part);
    }
    hex::encode(mac.finalize().into_bytes())
}

/// `t=…,v1=…`: `body` signed at `t` as the reference protocol does (Stripe's `v1` too).
pub fn timestamped_signature(secret: &str, t: i64, body: &[u8]) -> String {
    format!(
        "t={t},v1={}",
        hmac_hex(secret, &[format!("{t}.").as_bytes(), body])
    )
}

/// A webhook: `body` POSTed as JSON to `path` with the signature `headers`.
pub async fn post_webhook(
    app: &TestApp,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> reqwest::Response {
    let mut request = app
        .http
        .post(app.url(path))
        .header("Content-Type", "application/json");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request.body(body.to_vec()).send().await.expect("delivered")
}

/// The `resultado` of a webhook's answer, which must be a 200.
pub async fn resultado(answer: reqwest::Response) -> String {
    assert_eq!(answer.status(), 200);
    json(answer).await["resultado"]
        .as_str()
        .expect("resultado")
        .to_owned()
}

/// pagos over a wiremock gateway that answers every charge with `answer`.
pub async fn charging(backend: Backend, answer: impl Respond + 'static) -> TestApp {
    let app = Spawn::new(backend).start().await;
    app.answer_charges(answer).await;
    app
}

/// The answer's `Retry-After`, in seconds (it must have one).
pub fn retry_after_secs(answer: &reqwest::Response) -> u64 {
    answer
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|s| s.parse().ok())
        .expect("Retry-After in seconds")
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
    lookup_delay: Duration,
    /// When each look-up arrived.
    lookups: Vec<std::time::Instant>,
}

use std::sync::Mutex;

/// The most requests in flight at once, each in flight from its arrival (`arrivals`) for
/// `answered_after`.
pub fn most_at_once(arrivals: &[std::time::Instant], answered_after: Duration) -> usize {
    arrivals
        .iter()
        .map(|&t| {
            arrivals
                .iter()
                .filter(|&&u| u <= t && t < u + answered_after)
                .count()
        })
        .max()
        .unwrap_or(0)
}

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

    /// Every look-up is answered after `delay`.
    pub fn with_lookup_delay(self, delay: Duration) -> Self {
        self.lock().lookup_delay = delay;
        self
    }

    /// How many look-ups have arrived.
    pub fn lookups_made(&self) -> usize {
        self.lock().lookups.len()
    }

    /// The most look-ups that were in flight at once: each is in flight from its arrival
    /// for the look-up delay.
    pub fn most_lookups_at_once(&self) -> usize {
        let state = self.lock();
        most_at_once(&state.lookups, state.lookup_delay)
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
        self.preload_for(reference, status, 250_000);
    }

    /// A charge of `amount` COP the provider already holds for `reference`; its id.
    pub fn preload_for(&self, reference: &str, status: &'static str, amount: i64) -> String {
        let mut state = self.lock();
        state.next += 1;
        let id = format!("ch_pre_{}", state.next);
        let charge = json!({
            "id": id,
            "status": status,
            "amount": amount,
            "currency": "COP",
            "reference": reference,
            "declineCode": null,
        });
        state
            .by_reference
            .entry(reference.to_owned())
            .or_default()
            .push(charge);
        id
    }

    /// The charges the provider holds for `reference` now have `status` (one payment's
    /// pending charge settling).
    pub fn settle(&self, reference: &str, status: &'static str) {
        let mut state = self.lock();
        let mut ids = Vec::new();
        for charge in state.by_reference.get_mut(reference).into_iter().flatten() {
            charge["status"] = Value::from(status);
            ids.push(charge["id"].clone());
        }
        for charge in state.by_key.values_mut() {
            if ids.contains(&charge["id"]) {
                charge["status"] = Value::from(status);
            }
        }
    }

    /// The ids of the charges the provider holds for `reference`, oldest first.
    pub fn charge_ids(&self, reference: &str) -> Vec<String> {
        self.lock()
            .by_reference
            .get(reference)
            .into_iter()
            .flatten()
            .filter_map(|c| c["id"].as_str().map(str::to_owned))
            .collect()
    }

    /// Charges made for a payment id.
    pub fn charges_for(&self, reference: &str) -> usize {
        self.lock().by_reference.get(reference).map_or(0, Vec::len)
    }

    pub async fn mount(&self, server: &MockServer) {
        mount_route(server, "POST", "/v1/charges", FakeCharge(self.clone())).await;
        mount_route(server, "GET", "/v1/charges", FakeLookup(self.clone())).await;
    }
}

struct FakeCharge(FakeGateway);

impl Respond for FakeCharge {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let state = &mut *self.0.lock();
        create_once(request, &mut state.by_key, state.charge_delay, |body| {
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
            state
                .by_reference
                .entry(reference)
                .or_default()
                .push(charge.clone());
            charge
        })
    }
}

struct FakeLookup(FakeGateway);

impl Respond for FakeLookup {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let mut state = self.0.lock();
        state.lookups.push(std::time::Instant::now());
        if state.lookups_fail {
            return ResponseTemplate::new(503).set_body_json(json!({"error": "unavailable"}));
        }
        let reference = query_param(request, "reference");
        let data = state
            .by_reference
            .get(&reference)
            .cloned()
            .unwrap_or_default();
        ResponseTemplate::new(200)
            .set_body_json(json!({ "data": data }))
            .set_delay(state.lookup_delay)
    }
}

/// Answers `method` requests to `path` of `server` with `answer`.
pub async fn mount_route(
    server: &MockServer,
    method: &str,
    path: &str,
    answer: impl Respond + 'static,
) {
    Mock::given(wiremock::matchers::method(method))
        .and(wiremock::matchers::path(path))
        .respond_with(answer)
        .mount(server)
        .await;
}

/// The `Idempotency-Key` header of `request` (empty when absent).
pub fn idempotency_key(request: &Request) -> String {
    request
        .headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned()
}

/// Answers a creation sent with an `Idempotency-Key` as a provider does: what the key
/// made before, or else what `make` makes of the JSON body, kept under the key; a `201`
/// after `delay`.
pub fn create_once(
    request: &Request,
    by_key: &mut std::collections::HashMap<String, Value>,
    delay: Duration,
    make: impl FnOnce(&Value) -> Value,
) -> ResponseTemplate {
    let key = idempotency_key(request);
    let made = match by_key.get(&key) {
        Some(existing) => existing.clone(),
        None => {
            let body: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
            let made = make(&body);
            by_key.insert(key, made.clone());
            made
        }
    };
    created_after(made, delay)
}

/// A `201 Created` with `body`, sent after `delay`.
pub fn created_after(body: Value, delay: Duration) -> ResponseTemplate {
    ResponseTemplate::new(201)
        .set_body_json(body)
        .set_delay(delay)
}

/// `Authorization` value of the admin token the test apps use.
pub const ADMIN_TOKEN: &str = "admin_test_token";

impl TestApp {
    /// `GET path` without credentials.
    pub async fn get(&self, path: &str) -> reqwest::Response {
        send(self.http.get(self.url(path))).await
    }

    /// The OpenAPI document the app serves.
    pub async fn openapi(&self) -> Value {
        json(self.get("/openapi.json").await).await
    }

    /// `GET path` with the bearer `token`.
    pub async fn get_as(&self, token: &str, path: &str) -> reqwest::Response {
        send(self.http.get(self.url(path)).bearer_auth(token)).await
    }

    /// `POST path` with the bearer `token` and `body` as JSON.
    pub async fn post_as(
        &self,
        token: &str,
        path: &str,
        body: &(impl serde::Serialize + ?Sized),
    ) -> reqwest::Response {
        send(self.http.post(self.url(path)).bearer_auth(token).json(body)).await
    }

    /// `POST path` with the bearer `token`, `headers` and `body` as it is.
    pub async fn post_raw(
        &self,
        token: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &'static str,
    ) -> reqwest::Response {
        let mut request = self.http.post(self.url(path)).bearer_auth(token);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        send(request.body(body)).await
    }

    /// `DELETE path` with the bearer `token`.
    pub async fn delete_as(&self, token: &str, path: &str) -> reqwest::Response {
        send(self.http.delete(self.url(path)).bearer_auth(token)).await
    }

    /// POST an admin endpoint with the admin token.
    pub async fn admin_post(&self, path: &str, body: &Value) -> reqwest::Response {
        self.post_as(ADMIN_TOKEN, path, body).await
    }

    pub async fn admin_get(&self, path: &str) -> reqwest::Response {
        self.get_as(ADMIN_TOKEN, path).await
    }

    /// On-call's resolution `body` of payment `id`, as the bearer `token`, accepted; the
    /// payment's detail.
    pub async fn resolved_as(&self, token: &str, id: &str, body: &Value) -> Value {
        let answer = self.resolve_as(token, id, body).await;
        assert_eq!(answer.status(), 200);
        json(answer).await
    }

    /// On-call's resolution `body` of payment `id`, as the bearer `token`.
    pub async fn resolve_as(&self, token: &str, id: &str, body: &Value) -> reqwest::Response {
        self.post_as(token, &format!("/admin/pagos/{id}/resolucion"), body)
            .await
    }

    /// Payment `id` is `ENVIADA` and waits on the provider, not on an error (the provider
    /// answered): on-call's detail shows no `ultimoError`, and its row keeps none.
    pub async fn waits_on_the_provider(&self, id: &str) {
        let detail = json(self.admin_get(&format!("/admin/pagos/{id}")).await).await;
        let pago = &detail["pago"];
        assert_eq!(pago["estado"], "ENVIADA", "{pago}");
        assert!(
            pago.get("ultimoError").is_none(),
            "the provider answered: {pago}"
        );
        let row = self.payment(id).await;
        assert_eq!((row.last_error, row.last_error_at), (None, None));
    }

    /// `fake` as this app's gateway; `fake`, for the test to drive.
    pub async fn with_fake(&self, fake: FakeGateway) -> FakeGateway {
        fake.mount(self.gateway()).await;
        fake
    }

    /// The requests the wiremock gateway received on `path`, whatever their method.
    pub async fn gateway_requests_to(&self, path: &str) -> Vec<Request> {
        self.gateway()
            .received_requests()
            .await
            .unwrap_or_default()
            .into_iter()
            .filter(|r| r.url.path() == path)
            .collect()
    }

    /// The wiremock gateway answers every charge with `answer`.
    pub async fn answer_charges(&self, answer: impl Respond + 'static) {
        charges().respond_with(answer).mount(self.gateway()).await;
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
            text = self.metrics().await;
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

/// The value of the query parameter `name` of `request` (empty when absent).
pub fn query_param(request: &Request, name: &str) -> String {
    request
        .url
        .query_pairs()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default()
}

/// A provider's recorded request or answer: `fixtures/<provider>/<name>.json`.
pub fn fixture(provider: &str, name: &str) -> Value {
    let path = format!(
        "{}/fixtures/{provider}/{name}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("no fixture {path}: {e}"));
    serde_json::from_str(&text).expect("fixture is JSON")
}

/// The requests `server` received with `method` on a path `path` accepts, in order.
pub async fn received(
    server: &MockServer,
    method: &str,
    path: impl Fn(&str) -> bool,
) -> Vec<Request> {
    server
        .received_requests()
        .await
        .unwrap_or_default()
        .into_iter()
        .filter(|r| r.method.as_str() == method && path(r.url.path()))
        .collect()
}

/// The `Idempotency-Key` of each request `server` received with `method` on a path
/// `path` accepts, in order (each must have one).
pub async fn keys_sent(
    server: &MockServer,
    method: &str,
    path: impl Fn(&str) -> bool,
) -> Vec<String> {
    received(server, method, path)
        .await
        .iter()
        .map(|r| {
            r.headers["idempotency-key"]
                .to_str()
                .unwrap_or("")
                .to_owned()
        })
        .collect()
}

/// The id of the merchant `acme`.
pub async fn acme(db: &DatabaseConnection) -> uuid::Uuid {
    merchant_id(db, "acme").await
}

/// The id of the merchant called `name`.
pub async fn merchant_id(db: &DatabaseConnection, name: &str) -> uuid::Uuid {
    pagos::entities::merchant::Entity::find()
        .filter(pagos::entities::merchant::Column::Name.eq(name))
        .one(db)
        .await
        .expect("query")
        .expect("the merchant")
        .id
}

/// A payment of acme's as a crash or an older version leaves it: `state`, sent `attempts`
/// times with `gateway_key`, created and due at `at`, nobody holding it.
pub fn left_payment(
    merchant: uuid::Uuid,
    client_key: &str,
    state: pagos::entities::payment::PaymentState,
    attempts: i32,
    gateway_key: String,
    at: chrono::DateTime<chrono::Utc>,
) -> pagos::entities::payment::Model {
    pagos::entities::payment::Model {
        id: uuid::Uuid::now_v7(),
        merchant_id: merchant,
        idempotency_key: client_key.to_owned(),
        credit_id: "42".into(),
        amount: 250_000,
        currency: "COP".into(),
        description: None,
        payment_method: None,
        state,
        version: i64::from(attempts),
        attempts,
        gateway_key,
        gateway_ref: None,
        decline_code: None,
        next_attempt_at: at,
        created_at: at,
        updated_at: at,
        generation: 0,
        claimed_until: None,
        last_error: None,
        last_error_at: None,
    }
}

/// pagos speaking `provider`'s API (`stripe`, `mercadopago`) to the wiremock gateway, with
/// `--<provider>-webhook-secret secret` and `flags`.
/// The gateway secret the test apps start with: Stripe's must look like a secret key.
pub fn gateway_secret(provider: &str) -> &'static str {
    if provider == "stripe" {
        "sk_test_gw_secret"
    } else {
        "gw_secret"
    }
}

pub async fn provider_app(
    backend: Backend,
    provider: &str,
    secret: &str,
    flags: &[&str],
) -> TestApp {
    let secret_flag = format!("--{provider}-webhook-secret");
    Spawn::new(backend)
        .provider(provider)
        .flags(&[&secret_flag, secret])
        .flags(flags)
        .start()
        .await
}

/// A row of a provider's status mapping: the scenario (`<http status> <fixture>`, the
/// payment's description), the status pagos answers, the state, and the decline code.
pub type Mapping<'a> = (&'a str, u16, &'a str, Option<&'a str>);

/// Pays once for each row of `table`, with the body `body` makes of its scenario, and
/// asserts the answer the row names.
/// Polls `done` every 20 ms until it holds, for up to 15 s (a loaded machine), else
/// panics naming `what`.
pub async fn until(what: &str, done: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while !done() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub async fn assert_mapping(app: &TestApp, table: &[Mapping<'_>], body: impl Fn(&str) -> Value) {
    for &(scenario, status, estado, decline) in table {
        let key = format!("k-map-{}", scenario.replace(' ', "-"));
        let (got, answer) = app.pay_read(&key, &body(scenario)).await;
        assert_eq!(got, status, "{scenario}: {answer}");
        let pago = if got == 402 { &answer["pago"] } else { &answer };
        assert_eq!(pago["estado"], estado, "{scenario}");
        if let Some(code) = decline {
            assert_eq!(answer["declineCode"], code, "{scenario}");
        }
    }
}

impl TestApp {
    /// (webhook messages processed, webhook charges recorded).
    pub async fn recorded(&self) -> (u64, u64) {
        (
            self.rows_of::<pagos::entities::processed_message::Entity>()
                .await,
            self.rows_of::<pagos::entities::webhook_charge::Entity>()
                .await,
        )
    }
}

/// pagos with `flags` over a wiremock gateway.
pub async fn started(backend: Backend, flags: &[&str]) -> TestApp {
    Spawn::new(backend).flags(flags).start().await
}

/// pagos with `flags` over the in-process sandbox.
pub async fn started_sandbox(backend: Backend, flags: &[&str]) -> TestApp {
    Spawn::new(backend).sandbox().flags(flags).start().await
}

/// `answer`, a problem (`application/problem+json`) with `status` (`what`, in the
/// failure message); its body.
pub async fn problem(answer: reqwest::Response, status: u16, what: &str) -> Value {
    assert_eq!(answer.status(), status, "{what}");
    assert_eq!(answer.headers()["content-type"], "application/problem+json");
    json(answer).await
}

/// `answer` to the request `body` is a `503 service-unavailable` with `Retry-After` whose
/// detail says nothing was changed (the provider could not be asked); the problem.
pub async fn unavailable(answer: reqwest::Response, body: &Value) -> Value {
    assert!(answer.headers().get("retry-after").is_some(), "{body}");
    let problem = problem(answer, 503, &body.to_string()).await;
    assert_eq!(problem["type"], "/problems/service-unavailable");
    assert!(
        text_has(&problem, "detail", "nothing was changed"),
        "{problem}"
    );
    problem
}

/// The header parameter `name` of an OpenAPI `operation`, which must document it
/// (`what`, in the failure message).
pub fn header_parameter(operation: &Value, name: &str, what: &str) -> Value {
    let parameter = operation["parameters"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["name"] == name))
        .cloned()
        .unwrap_or_else(|| panic!("{what}: {name} is documented"));
    assert_eq!(parameter["in"], "header", "{what}");
    parameter
}

/// Asserts that an OpenAPI `operation` documents each of `statuses` (`what`, in the
/// failure message).
pub fn assert_responses(operation: &Value, statuses: &[&str], what: &str) {
    for status in statuses {
        assert!(
            operation["responses"][status].is_object(),
            "{what} {status} documented"
        );
    }
}

/// The `Location` header of `answer`.
pub fn location_of(answer: &reqwest::Response) -> String {
    answer.headers()["location"]
        .to_str()
        .expect("ascii")
        .to_owned()
}

/// Asserts that `text` contains every one of `needles`.
pub fn assert_contains_all(text: &str, needles: &[&str]) {
    for needle in needles {
        assert!(text.contains(needle), "{needle} in:\n{text}");
    }
}

/// The items of `items` whose `field` is `wanted`.
pub fn matching<'a>(
    items: impl IntoIterator<Item = &'a Value>,
    field: &str,
    wanted: &str,
) -> Vec<Value> {
    items
        .into_iter()
        .filter(|item| item[field] == wanted)
        .cloned()
        .collect()
}

/// The last row of a detail's audit trail (`transiciones`).
pub fn last_transition(detail: &Value) -> Value {
    detail["transiciones"]
        .as_array()
        .and_then(|t| t.last())
        .cloned()
        .expect("audit rows")
}

/// A `validation-failed` problem lists `campo` among its `errores`.
pub fn lists_field(problem: &Value, campo: &str) -> bool {
    problem["errores"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|e| e["campo"] == campo)
}

/// `value[field]` is a string that contains `needle`.
pub fn text_has(value: &Value, field: &str, needle: &str) -> bool {
    value[field]
        .as_str()
        .is_some_and(|text| text.contains(needle))
}

/// On-call resolves an item under review as `estado`, naming the provider's `named` as
/// its `gatewayRef` ("found it"), and `refused` (the caller's check that a resolution is
/// refused and changes nothing) refuses it; the refusal's detail names `named`. The problem.
pub async fn naming_refused(
    estado: &str,
    named: &str,
    refused: impl AsyncFnOnce(&Value) -> Value,
) -> Value {
    let body = serde_json::json!({"estado": estado, "motivo": "found it", "gatewayRef": named});
    let problem = refused(&body).await;
    assert!(
        text_has(&problem, "detail", named),
        "the refusal names {named}: {problem}"
    );
    problem
}

/// The `field` of every item of `value[array]`, in order.
pub fn listed<'a>(value: &'a Value, array: &str, field: &str) -> Vec<&'a str> {
    value[array]
        .as_array()
        .map(|items| items.iter().filter_map(|i| i[field].as_str()).collect())
        .unwrap_or_default()
}

/// Makes the database refuse (an error, "claims refused") every write that claims a
/// payment — one that sets it a new `claimed_until`; a settling write sets none — while
/// `only_if` (SQL over the database, any time when None) holds. `allow_claims` undoes it.
pub async fn refuse_claims(db: &DatabaseConnection, only_if: Option<&str>) {
    let only_if = only_if.unwrap_or("1 = 1");
    let statements = match db.get_database_backend() {
        sea_orm::DbBackend::Sqlite => vec![format!(
            "CREATE TRIGGER refuse_claims BEFORE UPDATE ON payments FOR EACH ROW \
             WHEN NEW.claimed_until IS NOT NULL AND NEW.claimed_until IS NOT OLD.claimed_until \
             AND ({only_if}) \
             BEGIN SELECT RAISE(ABORT, 'claims refused'); END"
        )],
        // A trigger's WHEN takes no subquery on PostgreSQL: `only_if` is the function's.
        _ => vec![
            format!(
                "CREATE FUNCTION refuse_claims() RETURNS trigger LANGUAGE plpgsql AS \
                 $$ BEGIN IF ({only_if}) THEN RAISE EXCEPTION 'claims refused'; END IF; \
                 RETURN NEW; END $$"
            ),
            "CREATE TRIGGER refuse_claims BEFORE UPDATE ON payments FOR EACH ROW \
             WHEN (NEW.claimed_until IS NOT NULL AND NEW.claimed_until IS DISTINCT FROM OLD.claimed_until) \
             EXECUTE FUNCTION refuse_claims()"
                .to_owned(),
        ],
    };
    for sql in statements {
        db.execute_unprepared(&sql).await.expect(&sql);
    }
}

/// Undoes `refuse_claims`.
pub async fn allow_claims(db: &DatabaseConnection) {
    let allow = match db.get_database_backend() {
        sea_orm::DbBackend::Sqlite => "DROP TRIGGER refuse_claims",
        _ => "DROP TRIGGER refuse_claims ON payments",
    };
    db.execute_unprepared(allow).await.expect("dropped");
}

/// `POST url` as merchant `api_key`, with `body` and the `Idempotency-Key` `key` (a
/// process of its own, or this test's app).
pub async fn keyed(
    http: &reqwest::Client,
    url: &str,
    api_key: &str,
    key: &str,
    body: &Value,
) -> reqwest::Response {
    http.post(url)
        .bearer_auth(api_key)
        .header("Idempotency-Key", key)
        .json(body)
        .send()
        .await
        .expect("request sent")
}

/// `keyed` as acme: the answer's status and body.
pub async fn keyed_read(
    http: &reqwest::Client,
    url: &str,
    key: &str,
    body: &Value,
) -> (u16, Value) {
    let answer = keyed(http, url, API_KEY, key, body).await;
    (answer.status().as_u16(), json(answer).await)
}
