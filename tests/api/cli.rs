//! The command line as an operator meets it: settings that fail at start, merchants,
//! the standalone sandbox gateway.

use crate::process::{BIN, free_port};
use serde_json::{Value, json};
use std::process::Command;
use std::time::Duration;

fn pagos(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut command = Command::new(BIN);
    command.args(args).env_remove("PAGOS_DATABASE_URL");
    for (k, v) in env {
        command.env(k, v);
    }
    command.output().expect("pagos runs")
}

fn assert_refused(output: &std::process::Output, names: &str) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "exit 2: {stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
    assert!(stderr.contains(names), "names {names}: {stderr}");
}

#[test]
fn a_bad_setting_stops_serve_with_one_line_naming_it_and_exit_2() {
    let dir = tempfile::tempdir().expect("dir");
    let db = format!("sqlite://{}?mode=rwc", dir.path().join("x.db").display());
    assert_refused(
        &pagos(
            &["serve", "--database-url", &db, "--gateway-timeout", "soon"],
            &[],
        ),
        "PAGOS_GATEWAY_TIMEOUT",
    );
    assert_refused(
        &pagos(
            &["serve", "--database-url", &db],
            &[("PAGOS_GATEWAY_RETRIES", "-1")],
        ),
        "PAGOS_GATEWAY_RETRIES",
    );
    assert_refused(
        &pagos(&["serve", "--database-url", &db], &[("PAGOS_LEASE", "5s")]),
        "PAGOS_LEASE",
    );
    assert_refused(
        &pagos(&["serve", "--database-url", &db, "--gateway", "http"], &[]),
        "PAGOS_GATEWAY_URL",
    );
    assert_refused(
        &pagos(
            &["serve", "--database-url", &db, "--gateway", "paypal"],
            &[],
        ),
        "PAGOS_GATEWAY",
    );
    assert_refused(
        &pagos(&["serve", "--database-url", "mysql://x"], &[]),
        "PAGOS_DATABASE_URL",
    );
    assert_refused(
        &pagos(
            &["serve", "--database-url", &db],
            &[("PAGOS_KEY_RETENTION", "1h")],
        ),
        "PAGOS_KEY_RETENTION",
    );
    assert_refused(
        &pagos(
            &["serve", "--database-url", &db],
            &[("PAGOS_MAX_MONTO", "9007199254740992")],
        ),
        "PAGOS_MAX_MONTO",
    );
    assert_refused(
        &pagos(
            &["serve", "--database-url", &db],
            &[("PAGOS_MESSAGE_RETENTION", "1m")],
        ),
        "PAGOS_MESSAGE_RETENTION",
    );
    assert!(
        !dir.path().join("x.db").exists(),
        "nothing was created before refusing"
    );
}

#[test]
fn a_malformed_door_setting_stops_serve_with_one_line_naming_it() {
    let dir = tempfile::tempdir().expect("dir");
    let db = format!("sqlite://{}?mode=rwc", dir.path().join("x.db").display());
    for (env, value) in [
        ("PAGOS_HEADER_TIMEOUT", "soon"),
        ("PAGOS_HEADER_TIMEOUT", "0s"),
        ("PAGOS_HEADER_TIMEOUT", "1000years"),
        ("PAGOS_REQUEST_TIMEOUT", "later"),
        ("PAGOS_REQUEST_TIMEOUT", "0s"),
        ("PAGOS_MAX_IN_FLIGHT", "0"),
        ("PAGOS_MAX_IN_FLIGHT", "many"),
        ("PAGOS_ADMIN_BIND", "localhost"),
        ("PAGOS_ADMIN_BIND", "127.0.0.1:8080"),
        ("PAGOS_METRICS_REFRESH", "often"),
    ] {
        assert_refused(
            &pagos(&["serve", "--database-url", &db], &[(env, value)]),
            env,
        );
    }
    assert_refused(
        &pagos(
            &["serve", "--database-url", &db, "--header-timeout", "soon"],
            &[],
        ),
        "--header-timeout",
    );
    assert!(
        !dir.path().join("x.db").exists(),
        "nothing was created before refusing"
    );
}

#[test]
fn help_names_every_setting_with_its_env_var() {
    let output = pagos(&["serve", "--help"], &[]);
    let help = String::from_utf8_lossy(&output.stdout);
    for env in [
        "PAGOS_DATABASE_URL",
        "PAGOS_BIND",
        "PAGOS_GATEWAY",
        "PAGOS_GATEWAY_URL",
        "PAGOS_GATEWAY_SECRET",
        "PAGOS_GATEWAY_TIMEOUT",
        "PAGOS_GATEWAY_RETRIES",
        "PAGOS_ADMIN_TOKEN",
        "PAGOS_WEBHOOK_SECRET",
        "PAGOS_RECONCILE_EVERY",
        "PAGOS_STALE_AFTER",
        "PAGOS_KEY_RETENTION",
        "PAGOS_LEASE",
        "PAGOS_GIVE_UP_AFTER",
        "PAGOS_RECONCILE_CONCURRENCY",
        "PAGOS_GATEWAY_KEY_WINDOW",
        "PAGOS_MAX_MONTO",
        "PAGOS_MESSAGE_RETENTION",
        "PAGOS_HEADER_TIMEOUT",
        "PAGOS_REQUEST_TIMEOUT",
        "PAGOS_MAX_IN_FLIGHT",
        "PAGOS_ADMIN_BIND",
        "PAGOS_METRICS_REFRESH",
    ] {
        assert!(help.contains(env), "--help names {env}");
    }
}

#[tokio::test]
async fn merchants_add_prints_a_key_and_stores_only_its_hash() {
    let dir = tempfile::tempdir().expect("dir");
    let db = format!("sqlite://{}?mode=rwc", dir.path().join("m.db").display());
    let output = pagos(&["merchants", "add", "acme", "--database-url", &db], &[]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let key = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    assert!(key.starts_with("sk_") && key.len() > 20, "{key}");
    let given = pagos(
        &[
            "merchants",
            "add",
            "globex",
            "--api-key",
            "sk_given_1",
            "--database-url",
            &db,
        ],
        &[],
    );
    assert_eq!(String::from_utf8_lossy(&given.stdout).trim(), "sk_given_1");

    let conn = sea_orm::Database::connect(db.as_str()).await.expect("open");
    use sea_orm::EntityTrait;
    let merchants = pagos::entities::merchant::Entity::find()
        .all(&conn)
        .await
        .expect("query");
    assert_eq!(merchants.len(), 2);
    for m in &merchants {
        assert_eq!(m.api_key_hash.len(), 64);
        assert!(!m.api_key_hash.contains(&key) && !m.api_key_hash.contains("sk_given_1"));
    }
    let again = pagos(
        &[
            "merchants",
            "add",
            "dup",
            "--api-key",
            "sk_given_1",
            "--database-url",
            &db,
        ],
        &[],
    );
    assert_eq!(
        again.status.code(),
        Some(1),
        "a key already taken is refused"
    );
}

/// Kills the child when dropped.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `pagos sandbox-gateway` with `--latency`, answering; the process and its base URL.
async fn sandbox_gateway(latency: &str) -> (Child, String) {
    let port = free_port();
    let sandbox = Child(
        Command::new(BIN)
            .args([
                "sandbox-gateway",
                "--bind",
                &format!("127.0.0.1:{port}"),
                "--latency",
                latency,
            ])
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("sandbox starts"),
    );
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    for _ in 0..100 {
        if http
            .get(format!("{base}/sandbox/stats"))
            .send()
            .await
            .is_ok()
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (sandbox, base)
}

#[tokio::test]
async fn the_standalone_sandbox_gateway_follows_the_reference_protocol() {
    let (_sandbox, base) = sandbox_gateway("300ms").await;
    let http = reqwest::Client::new();
    let charge = |key: &'static str, amount: i64| {
        let http = http.clone();
        let url = format!("{base}/v1/charges");
        async move {
            http.post(url)
                .header("Idempotency-Key", key)
                .json(&json!({"amount": amount, "currency": "COP", "reference": "ref-1"}))
                .send()
                .await
                .expect("sent")
        }
    };
    // A duplicate while the first is in flight: 409.
    let (first, second) = tokio::join!(charge("gk-1", 100), async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        charge("gk-1", 100).await
    });
    assert_eq!(first.status(), 201);
    assert_eq!(second.status(), 409);
    let first: Value = first.json().await.expect("JSON");
    assert_eq!(first["status"], "succeeded");

    let replay: Value = charge("gk-1", 100).await.json().await.expect("JSON");
    assert_eq!(replay, first, "same key and body: the same charge");
    assert_eq!(
        charge("gk-1", 999).await.status(),
        422,
        "same key, another body"
    );

    let found: Value = http
        .get(format!("{base}/v1/charges?reference=ref-1"))
        .send()
        .await
        .expect("sent")
        .json()
        .await
        .expect("JSON");
    assert_eq!(found["data"].as_array().map(Vec::len), Some(1));
    let none: Value = http
        .get(format!("{base}/v1/charges?reference=nope"))
        .send()
        .await
        .expect("sent")
        .json()
        .await
        .expect("JSON");
    assert_eq!(none["data"], json!([]));
    let stats: Value = http
        .get(format!("{base}/sandbox/stats"))
        .send()
        .await
        .expect("sent")
        .json()
        .await
        .expect("JSON");
    assert_eq!(stats["charges"], 1);
    assert_eq!(stats["duplicatedReferences"], 0);
}

#[test]
fn a_database_used_with_one_gateway_refuses_another() {
    let dir = tempfile::tempdir().expect("dir");
    let db = format!("sqlite://{}?mode=rwc", dir.path().join("p.db").display());
    let with_http = pagos(
        &[
            "reconcile",
            "--once",
            "--database-url",
            &db,
            "--gateway",
            "http",
            "--gateway-url",
            "http://127.0.0.1:9",
        ],
        &[],
    );
    assert!(
        with_http.status.success(),
        "{}",
        String::from_utf8_lossy(&with_http.stderr)
    );
    let report: Value = serde_json::from_slice(&with_http.stdout).expect("JSON report");
    assert_eq!(report["examinados"], 0);
    // The sandbox on a database whose payments went through a real gateway would settle
    // them without asking it.
    assert_refused(
        &pagos(&["reconcile", "--once", "--database-url", &db], &[]),
        "PAGOS_GATEWAY",
    );
    assert_refused(
        &pagos(&["serve", "--database-url", &db], &[]),
        "PAGOS_GATEWAY",
    );
}

#[tokio::test]
async fn the_sandbox_finishes_a_charge_whose_caller_hung_up() {
    let (_sandbox, base) = sandbox_gateway("500ms").await;
    let http = reqwest::Client::new();
    let body = json!({"amount": 100, "currency": "COP", "reference": "ref-hangup"});
    let impatient = http
        .post(format!("{base}/v1/charges"))
        .header("Idempotency-Key", "gk-hangup")
        .json(&body)
        .timeout(Duration::from_millis(100))
        .send()
        .await;
    assert!(impatient.is_err(), "the caller hung up");
    tokio::time::sleep(Duration::from_millis(700)).await;
    let again = http
        .post(format!("{base}/v1/charges"))
        .header("Idempotency-Key", "gk-hangup")
        .json(&body)
        .send()
        .await
        .expect("sent");
    assert_eq!(
        again.status(),
        201,
        "the charge was made and is replayed, not stuck in flight"
    );
    let stats: Value = http
        .get(format!("{base}/sandbox/stats"))
        .send()
        .await
        .expect("sent")
        .json()
        .await
        .expect("JSON");
    assert_eq!(stats["charges"], 1);
}
