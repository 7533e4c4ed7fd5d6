//! When the database forgets: a payment reaches the gateway, then the database is restored
//! from a snapshot taken before it (a failover to a lagging replica, a restore from
//! backup). The client's retry must reach the gateway with the very same key and the very
//! same request, so that the gateway replays the charge it made, and pagos must answer
//! what really happened — never a second charge, never "no money was taken".
//!
//! The snapshot is real: a copy of the SQLite file, or `CREATE DATABASE … TEMPLATE` on
//! PostgreSQL. The reference protocol runs through the standalone sandbox gateway (a real
//! `pagos sandbox-gateway` process); Stripe and Mercado Pago through their wiremock fakes.

use crate::helpers::{Backend, TestDatabase, json};
use crate::on_both_databases;
use crate::process::{BIN, free_port};
use crate::providers::{FakeProvider, Provider};
use sea_orm::DatabaseConnection;
use serde_json::Value;
use std::time::Duration;

on_both_databases!(
    a_retry_after_the_database_forgot_a_payment_gets_the_original_charge,
    a_retry_with_another_body_after_the_database_forgot_goes_to_review_never_to_a_decline,
    a_charge_reported_while_its_payment_was_forgotten_is_listed_with_the_payment_registered_since,
);

const WEBHOOK_SECRET: &str = "whsec_restore_test";

/// pagos on a database URL of the test's choosing, in this process, over real HTTP.
struct Running {
    url: String,
    http: reqwest::Client,
    db: DatabaseConnection,
    server: tokio::task::JoinHandle<()>,
}

impl Running {
    async fn start(database_url: &str, gateway: &Gateway) -> Running {
        let mut flags = vec![
            "--gateway",
            gateway.provider.gateway(),
            "--gateway-url",
            &gateway.url,
            "--gateway-secret",
            crate::helpers::gateway_secret(gateway.provider.gateway()),
            "--gateway-timeout",
            "2s",
        ];
        flags.extend_from_slice(&["--admin-token", crate::helpers::ADMIN_TOKEN]);
        flags.extend_from_slice(&["--webhook-secret", WEBHOOK_SECRET]);
        let settings = crate::helpers::settings(database_url, &flags);
        settings.validate().expect("valid settings");
        let db = pagos::app::open_and_migrate(&settings.database)
            .await
            .expect("database");
        let gw = pagos::app::gateway_from(&settings).expect("gateway");
        let state = pagos::app::build(db.clone(), settings, gw);
        let (addr, server) = crate::helpers::serve_in_background(state).await;
        Running {
            url: format!("http://{addr}"),
            http: reqwest::Client::new(),
            db,
            server,
        }
    }

    async fn pay(&self, key: &str, body: &Value) -> (u16, Value) {
        crate::helpers::keyed_read(&self.http, &format!("{}/v1/pagos", self.url), key, body).await
    }

    async fn orphans(&self) -> Value {
        let answer = self
            .http
            .get(format!("{}/admin/cargos-huerfanos", self.url))
            .bearer_auth(crate::helpers::ADMIN_TOKEN)
            .send()
            .await
            .expect("answered");
        json(answer).await
    }

    async fn reconcile(&self, id: &str) -> Value {
        let answer = self
            .http
            .post(format!("{}/admin/reconciliaciones", self.url))
            .bearer_auth(crate::helpers::ADMIN_TOKEN)
            .json(&serde_json::json!({ "pagoId": id }))
            .send()
            .await
            .expect("answered");
        json(answer).await
    }

    /// Stops serving and lets go of the database, as a process that dies would.
    async fn stop(self) {
        self.server.abort();
        let _ = self.server.await;
        let _ = self.db.close().await;
    }
}

/// The gateway of one scenario: the standalone sandbox process, or a provider's fake.
struct Gateway {
    provider: Provider,
    url: String,
    fake: Option<FakeProvider>,
    _mock: Option<wiremock::MockServer>,
    _process: Option<KillOnDrop>,
}

struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Gateway {
    async fn start(provider: Provider) -> Gateway {
        if provider == Provider::Reference {
            let port = free_port();
            let process = std::process::Command::new(BIN)
                .args(["sandbox-gateway", "--bind", &format!("127.0.0.1:{port}")])
                .stderr(std::process::Stdio::null())
                .spawn()
                .expect("the sandbox gateway starts");
            let url = format!("http://127.0.0.1:{port}");
            let gateway = Gateway {
                provider,
                url,
                fake: None,
                _mock: None,
                _process: Some(KillOnDrop(process)),
            };
            for _ in 0..100 {
                if gateway.stats().await.is_some() {
                    return gateway;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            panic!("the sandbox gateway did not come up");
        }
        let mock = wiremock::MockServer::start().await;
        let fake = FakeProvider::new(provider);
        fake.mount(&mock).await;
        Gateway {
            provider,
            url: mock.uri(),
            fake: Some(fake),
            _mock: Some(mock),
            _process: None,
        }
    }

    async fn stats(&self) -> Option<Value> {
        reqwest::get(format!("{}/sandbox/stats", self.url))
            .await
            .ok()?
            .json()
            .await
            .ok()
    }

    /// Charges the gateway made (replays not counted).
    async fn charges(&self) -> u64 {
        match &self.fake {
            Some(fake) => fake.charges() as u64,
            None => self
                .stats()
                .await
                .and_then(|s| s["charges"].as_u64())
                .expect("sandbox stats"),
        }
    }
}

/// A database that can be snapshotted and restored.
struct Snapshots {
    backend: Backend,
    database: TestDatabase,
    copies: Vec<String>,
}

impl Snapshots {
    async fn new(backend: Backend) -> Snapshots {
        let (database, db) = TestDatabase::with_acme(&backend).await;
        db.close().await.expect("closed");
        Snapshots {
            backend,
            database,
            copies: Vec::new(),
        }
    }

    fn sqlite_file(&self) -> std::path::PathBuf {
        let path = self
            .database
            .url
            .trim_start_matches("sqlite://")
            .split('?')
            .next()
            .expect("path");
        std::path::PathBuf::from(path)
    }

    /// Takes a snapshot (nobody may be connected); returns its name.
    async fn take(&mut self) -> String {
        match &self.backend {
            Backend::Sqlite => {
                let file = self.sqlite_file();
                let copy = file.with_extension(format!("snap{}", self.copies.len()));
                std::fs::copy(&file, &copy).expect("copy the database file");
                let copy = copy.display().to_string();
                self.copies.push(copy.clone());
                copy
            }
            Backend::Postgres(admin) => {
                let source = self
                    .database
                    .url
                    .rsplit('/')
                    .next()
                    .expect("name")
                    .to_owned();
                let name = format!("{source}_snap{}", self.copies.len());
                crate::helpers::on_postgres_admin(
                    admin,
                    &format!("CREATE DATABASE {name} TEMPLATE {source}"),
                )
                .await;
                self.copies.push(name.clone());
                name
            }
        }
    }

    /// The database as the snapshot left it, at the URL pagos uses next: on SQLite the file
    /// copied back over the database; on PostgreSQL the snapshot itself (a replica that
    /// was promoted).
    fn restore(&self, snapshot: &str) -> String {
        match &self.backend {
            Backend::Sqlite => {
                let file = self.sqlite_file();
                for suffix in ["-wal", "-shm"] {
                    let _ = std::fs::remove_file(format!("{}{suffix}", file.display()));
                }
                std::fs::copy(snapshot, &file).expect("restore the file");
                self.database.url.clone()
            }
            Backend::Postgres(_) => {
                let mut url = url::Url::parse(&self.database.url).expect("url");
                url.set_path(snapshot);
                url.to_string()
            }
        }
    }
}

impl Drop for Snapshots {
    fn drop(&mut self) {
        if let Backend::Postgres(admin) = &self.backend {
            crate::helpers::drop_postgres_databases(
                admin.clone(),
                std::mem::take(&mut self.copies),
            );
        }
    }
}

/// Pays once, restores the database to before that payment, and hands the retry's pagos
/// over: (the gateway, the first answer, pagos on the restored database).
async fn pay_then_forget(
    backend: &Backend,
    provider: Provider,
) -> (Gateway, Value, Running, Snapshots) {
    let gateway = Gateway::start(provider).await;
    let mut snapshots = Snapshots::new(backend.clone()).await;
    let before = snapshots.take().await;
    let first = Running::start(&snapshots.database.url, &gateway).await;
    let (status, paid) = first.pay("k-forgotten", &provider.payment(250_000)).await;
    assert_eq!(status, 201, "{provider:?}: {paid}");
    first.stop().await;
    assert_eq!(gateway.charges().await, 1);

    let url = snapshots.restore(&before);
    let restored = Running::start(&url, &gateway).await;
    (gateway, paid, restored, snapshots)
}

async fn a_retry_after_the_database_forgot_a_payment_gets_the_original_charge(backend: Backend) {
    for provider in crate::providers::ALL {
        let (gateway, paid, restored, _snapshots) = pay_then_forget(&backend, provider).await;
        let (status, retried) = restored
            .pay("k-forgotten", &provider.payment(250_000))
            .await;
        assert_eq!(
            status, 201,
            "{provider:?}: the customer was charged once; the retry must say so: {retried}"
        );
        assert_eq!(retried["estado"], "COMPLETADA");
        assert_eq!(
            retried["id"], paid["id"],
            "{provider:?}: the same payment, derived again"
        );
        assert_eq!(retried["gatewayRef"], paid["gatewayRef"], "{provider:?}");
        assert_eq!(gateway.charges().await, 1, "{provider:?}: one charge");
        if let Some(fake) = &gateway.fake {
            let sent = fake.creates();
            assert_eq!(sent.len(), 2, "{provider:?}");
            assert_eq!(
                sent[0].key, sent[1].key,
                "{provider:?}: the same gateway key"
            );
            assert_eq!(
                sent[0].body, sent[1].body,
                "{provider:?}: an identical request, so the gateway replays it"
            );
        }
        restored.stop().await;
    }
}

async fn a_retry_with_another_body_after_the_database_forgot_goes_to_review_never_to_a_decline(
    backend: Backend,
) {
    for provider in crate::providers::ALL {
        let (gateway, paid, restored, _snapshots) = pay_then_forget(&backend, provider).await;
        // The client retries the same key with another amount: the gateway holds a charge
        // under that key for another request.
        let (status, retried) = restored
            .pay("k-forgotten", &provider.payment(990_000))
            .await;
        assert_eq!(
            status, 202,
            "{provider:?}: the gateway's \"same key, other request\" is not a decline: {retried}"
        );
        assert_eq!(retried["id"], paid["id"]);
        let id = retried["id"].as_str().expect("id");
        let report = restored.reconcile(id).await;
        assert_eq!(
            report["revisionManual"], 1,
            "{provider:?}: the charge found is for another amount: on-call decides: {report}"
        );
        assert_eq!(
            gateway.charges().await,
            1,
            "{provider:?}: never a second charge"
        );
        restored.stop().await;
    }
}

/// The gateway's event for the charge arrives while the restored database has no payment
/// for it: an orphan charge, on-call's list says "money may have been taken without a
/// payment". Then the client's retry registers the payment again (same key, same id).
/// Before, the charge stayed listed as an orphan for ever, and the runbook's "nobody owns
/// it: refund it" could refund a customer's settled payment; now the entry names the
/// payment registered since, and the runbook says not to refund it.
async fn a_charge_reported_while_its_payment_was_forgotten_is_listed_with_the_payment_registered_since(
    backend: Backend,
) {
    let provider = Provider::Reference;
    let (_gateway, paid, restored, _snapshots) = pay_then_forget(&backend, provider).await;
    let event = serde_json::json!({
        "id": "evt_after_restore", "type": "charge.updated", "sequence": 2,
        "data": {"id": paid["gatewayRef"], "status": "succeeded", "amount": 250000,
                 "currency": "COP", "reference": paid["id"], "declineCode": null},
    });
    let body = serde_json::to_vec(&event).expect("json");
    let t = chrono::Utc::now().timestamp();
    let delivered = restored
        .http
        .post(format!("{}/v1/webhooks/http", restored.url))
        .header("Content-Type", "application/json")
        .header(
            "Gateway-Signature",
            crate::helpers::timestamped_signature(WEBHOOK_SECRET, t, &body),
        )
        .body(body)
        .send()
        .await
        .expect("answered");
    assert_eq!(delivered.status(), 200);
    let orphans = restored.orphans().await;
    assert_eq!(orphans[0]["cargoId"], paid["gatewayRef"], "{orphans}");
    assert_eq!(
        orphans[0]["pagoId"],
        Value::Null,
        "no payment yet: {orphans}"
    );

    let (status, retried) = restored
        .pay("k-forgotten", &provider.payment(250_000))
        .await;
    assert_eq!(status, 201, "{retried}");

    let orphans = restored.orphans().await;
    assert_eq!(
        orphans[0]["pagoId"], paid["id"],
        "a payment of ours stands for the charge now: {orphans}"
    );
    restored.stop().await;
}
