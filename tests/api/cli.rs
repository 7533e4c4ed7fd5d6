//! The command line as an operator meets it: settings that fail at start, merchants,
//! the standalone sandbox gateway.

use crate::process::{BIN, free_port};
use serde_json::{Value, json};
use std::process::Command;
use std::time::Duration;

/// `pagos args` with `env` (and no `PAGOS_DATABASE_URL` of the caller's); its output.
pub fn pagos(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut command = Command::new(BIN);
    command.args(args).env_remove("PAGOS_DATABASE_URL");
    for (k, v) in env {
        command.env(k, v);
    }
    command.output().expect("pagos runs")
}

/// No database was created in `dir` before the settings were refused.
fn assert_nothing_created(dir: &tempfile::TempDir) {
    assert!(
        !dir.path().join("x.db").exists(),
        "nothing was created before refusing"
    );
}

fn assert_refused(output: &std::process::Output, names: &str) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "exit 2: {stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
    assert!(stderr.contains(names), "names {names}: {stderr}");
}

/// Extra flags, environment, and the setting the one line must name.
type BadSetting<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a str);

#[test]
fn a_bad_setting_stops_serve_and_reconcile_with_one_line_naming_it_and_exit_2() {
    let dir = tempfile::tempdir().expect("dir");
    let db = format!("sqlite://{}?mode=rwc", dir.path().join("x.db").display());
    let table: [BadSetting; 33] = [
        (&["--gateway-timeout", "soon"], &[], "PAGOS_GATEWAY_TIMEOUT"),
        // A real gateway's URL or secret, PAGOS_GATEWAY forgotten: not the sandbox.
        (
            &[],
            &[("PAGOS_GATEWAY_URL", "https://gw.example")],
            "invalid setting PAGOS_GATEWAY (--gateway)",
        ),
        (
            &[],
            &[("PAGOS_GATEWAY_SECRET", "sk_live_x")],
            "invalid setting PAGOS_GATEWAY (--gateway)",
        ),
        (
            &["--gateway", "http"],
            &[("PAGOS_GATEWAY_URL", "gateway:8090")],
            "PAGOS_GATEWAY_URL",
        ),
        // A currency Mercado Pago does not charge in, or the setting on another gateway.
        (
            &["--gateway", "mercadopago", "--gateway-secret", "s"],
            &[("PAGOS_MERCADOPAGO_MONEDA", "USD")],
            "PAGOS_MERCADOPAGO_MONEDA",
        ),
        (
            &["--gateway", "http", "--gateway-url", "http://127.0.0.1:9"],
            &[("PAGOS_MERCADOPAGO_MONEDA", "COP")],
            "PAGOS_MERCADOPAGO_MONEDA",
        ),
        // A query or a fragment: every call would go to the gateway's root, whose 404
        // reads as a decline (every payment answered 402).
        (
            &["--gateway", "http"],
            &[("PAGOS_GATEWAY_URL", "https://gw.example/?tenant=1")],
            "PAGOS_GATEWAY_URL",
        ),
        (
            &["--gateway", "stripe", "--gateway-secret", "sk_test_x"],
            &[("PAGOS_GATEWAY_URL", "https://api.stripe.com#live")],
            "PAGOS_GATEWAY_URL",
        ),
        (
            &["--gateway", "http"],
            &[("PAGOS_GATEWAY_URL", "https://pagos:hunter2@gw.example")],
            "PAGOS_GATEWAY_URL",
        ),
        // Stripe's two secrets swapped: every call refused 401, every payment 202.
        (
            &["--gateway", "stripe"],
            &[("PAGOS_GATEWAY_SECRET", "whsec_swapped")],
            "PAGOS_GATEWAY_SECRET",
        ),
        (
            &["--gateway", "stripe", "--gateway-secret", "sk_test_x"],
            &[("PAGOS_STRIPE_WEBHOOK_SECRET", "sk_live_swapped")],
            "PAGOS_STRIPE_WEBHOOK_SECRET",
        ),
        (&[], &[("PAGOS_LEASE", "300000y")], "PAGOS_LEASE"),
        (
            &[],
            &[("PAGOS_GATEWAY_RETRIES", "-1")],
            "PAGOS_GATEWAY_RETRIES",
        ),
        (&[], &[("PAGOS_LEASE", "5s")], "PAGOS_LEASE"),
        (&["--gateway", "http"], &[], "PAGOS_GATEWAY_URL"),
        (&["--gateway", "paypal"], &[], "PAGOS_GATEWAY"),
        (
            &[],
            &[("PAGOS_AUTH_FAILURES_PER_MINUTE", "0")],
            "PAGOS_AUTH_FAILURES_PER_MINUTE",
        ),
        (&[], &[("PAGOS_KEY_RETENTION", "1h")], "PAGOS_KEY_RETENTION"),
        (
            &[],
            &[("PAGOS_MAX_MONTO", "9007199254740992")],
            "PAGOS_MAX_MONTO",
        ),
        (
            &[],
            &[("PAGOS_MESSAGE_RETENTION", "1m")],
            "PAGOS_MESSAGE_RETENTION",
        ),
        (
            &[],
            &[("PAGOS_SHUTDOWN_GRACE", "0s")],
            "PAGOS_SHUTDOWN_GRACE",
        ),
        // A secret file's trailing newline: presented tokens are trimmed, so it could
        // never match.
        (
            &[],
            &[("PAGOS_ADMIN_TOKEN", "a-long-enough-admin-token\n")],
            "PAGOS_ADMIN_TOKEN",
        ),
        (
            &["--admin-token", " a-long-enough-admin-token"],
            &[],
            "PAGOS_ADMIN_TOKEN",
        ),
        (
            &[],
            &[("PAGOS_ADMIN_TOKEN", "a-long-enough\tadmin-token")],
            "PAGOS_ADMIN_TOKEN",
        ),
        (&["--admin-token", "   "], &[], "PAGOS_ADMIN_TOKEN"),
        // The same newline in a gateway secret made every call fail before it was sent
        // (no such Authorization header): every payment answered pending, "connection
        // failed" in the logs. In a webhook secret: every webhook 401.
        (
            &["--gateway", "stripe"],
            &[("PAGOS_GATEWAY_SECRET", "sk_test_4eC39HqLyjWDarjtT1zdp7dc\n")],
            "invalid setting PAGOS_GATEWAY_SECRET (--gateway-secret)",
        ),
        (
            &[],
            &[("PAGOS_WEBHOOK_SECRET", "whsec-of-the-reference-gateway\n")],
            "invalid setting PAGOS_WEBHOOK_SECRET (--webhook-secret)",
        ),
        (
            &[],
            &[("PAGOS_STRIPE_WEBHOOK_SECRET", " whsec_abc")],
            "invalid setting PAGOS_STRIPE_WEBHOOK_SECRET (--stripe-webhook-secret)",
        ),
        (
            &["--gateway", "mercadopago", "--gateway-secret", "s"],
            &[("PAGOS_MERCADOPAGO_WEBHOOK_SECRET", "mp\u{7f}secret")],
            "invalid setting PAGOS_MERCADOPAGO_WEBHOOK_SECRET (--mercadopago-webhook-secret)",
        ),
        // Past the reconciler's longest wait between two looks: it would be cut to it.
        (&[], &[("PAGOS_STALE_AFTER", "2h")], "PAGOS_STALE_AFTER"),
        // On-call paged at the reconciler's first look, with no second look nor resend.
        (
            &[],
            &[("PAGOS_GIVE_UP_AFTER", "20s")],
            "invalid setting PAGOS_GIVE_UP_AFTER (--give-up-after)",
        ),
        // Mercado Pago's hour of key window leaves no room for two looks.
        (
            &["--gateway", "mercadopago", "--gateway-secret", "s"],
            &[("PAGOS_STALE_AFTER", "20m")],
            "invalid setting PAGOS_STALE_AFTER (--stale-after)",
        ),
        (
            &["--gateway", "mercadopago", "--gateway-secret", "s"],
            &[("PAGOS_RECONCILE_EVERY", "30m")],
            "invalid setting PAGOS_RECONCILE_EVERY (--reconcile-every)",
        ),
    ];
    for (flags, env, names) in table {
        for command in [&["serve"][..], &["reconcile", "--once"]] {
            let mut args = command.to_vec();
            args.extend_from_slice(&["--database-url", &db]);
            args.extend_from_slice(flags);
            assert_refused(&pagos(&args, env), names);
        }
    }
    assert_refused(
        &pagos(&["serve", "--database-url", "mysql://x"], &[]),
        "PAGOS_DATABASE_URL",
    );
    for url in [
        "https://pagos:hunter2@gw.example",
        "https://pagos:hunter2@gw.example/?tenant=1",
        "ftp://pagos:hunter2@gw.example",
        // Not even a URL (a port out of range, a space in the host): refused by the
        // parser, whose line clap prints with the value.
        "https://pagos:hunter2@gw.example:99999",
        "https://pagos:hunter2@gw example",
        "https://gw.example/v1?access_token=hunter2",
    ] {
        let with_a_password = pagos(
            &["serve", "--database-url", &db, "--gateway", "http"],
            &[("PAGOS_GATEWAY_URL", url)],
        );
        assert_refused(&with_a_password, "PAGOS_GATEWAY_URL");
        assert!(
            !String::from_utf8_lossy(&with_a_password.stderr).contains("hunter2"),
            "a password or token in the URL is not printed: {url}: {}",
            String::from_utf8_lossy(&with_a_password.stderr)
        );
    }
    assert_nothing_created(&dir);
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
        ("PAGOS_PURGE_BATCH", "0"),
        ("PAGOS_PURGE_BATCH", "1000000"),
        ("PAGOS_PURGE_BATCH", "all"),
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
    assert_nothing_created(&dir);
}

#[test]
fn help_names_every_setting_with_its_env_var() {
    crate::helpers::assert_contains_all(
        &serve_help(),
        &[
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
            "PAGOS_AUTH_FAILURES_PER_MINUTE",
            "PAGOS_PURGE_BATCH",
        ],
    );
}

/// What `pagos serve --help` prints.
pub fn serve_help() -> String {
    String::from_utf8_lossy(&pagos(&["serve", "--help"], &[]).stdout).into_owned()
}

#[tokio::test]
async fn merchants_add_prints_a_key_and_stores_only_its_hash() {
    let dir = tempfile::tempdir().expect("dir");
    let db = sqlite_in(&dir, "m.db");
    let output = pagos_on(&db, &["merchants", "add", "acme"]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let key = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    assert!(key.starts_with("sk_") && key.len() > 20, "{key}");
    let given = pagos_on(
        &db,
        &["merchants", "add", "globex", "--api-key", "sk_given_1"],
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
    let again = pagos_on(&db, &["merchants", "add", "dup", "--api-key", "sk_given_1"]);
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
    sandbox_gateway_with(&["--latency", latency]).await
}

/// `pagos sandbox-gateway` with these flags, answering; the process and its base URL.
async fn sandbox_gateway_with(flags: &[&str]) -> (Child, String) {
    let port = free_port();
    let sandbox = Child(
        Command::new(BIN)
            .args(["sandbox-gateway", "--bind", &format!("127.0.0.1:{port}")])
            .args(flags)
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("sandbox starts"),
    );
    let base = format!("http://127.0.0.1:{port}");
    wait_for_sandbox(&base).await;
    (sandbox, base)
}

/// A refund of `amount` COP of `charge`, asked of the sandbox gateway at `base`.
fn refund_request(
    http: &reqwest::Client,
    base: &str,
    key: &str,
    charge: impl serde::Serialize,
    amount: i64,
    reference: &str,
) -> reqwest::RequestBuilder {
    http.post(format!("{base}/v1/refunds"))
        .header("Idempotency-Key", key)
        .json(
            &json!({"charge": charge, "amount": amount, "currency": "COP",
                      "reference": reference}),
        )
}

/// Waits (up to 30 s) until the sandbox gateway at `base` answers.
async fn wait_for_sandbox(base: &str) {
    let http = reqwest::Client::new();
    for _ in 0..600 {
        if http
            .get(format!("{base}/sandbox/stats"))
            .send()
            .await
            .is_ok()
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the sandbox gateway at {base} never answered");
}

/// `pagos sandbox-gateway` stopped while a charge is held by `--latency`: `SIGTERM` lets
/// the answer finish, a Ctrl-C after it stops the process at once (exit code 130), as
/// `pagos serve` does (before, the second signal was swallowed and the process waited for
/// the held answer).
#[tokio::test]
async fn a_ctrl_c_after_sigterm_stops_the_sandbox_gateway_at_once() {
    let (mut sandbox, base) = sandbox_gateway("30s").await;
    let charge = {
        let base = base.clone();
        move || {
            reqwest::Client::new()
                .post(format!("{base}/v1/charges"))
                .header("Idempotency-Key", "gk-held")
                .json(&json!({"amount": 100, "currency": "COP", "reference": "ref-held"}))
                .send()
        }
    };
    let held = tokio::spawn(charge());
    // Held: the same key again is a 409 while the first is in flight (asked well after
    // the first was sent, as the reference protocol's test does).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let again = tokio::time::timeout(Duration::from_secs(5), charge())
        .await
        .expect("a duplicate is answered at once")
        .expect("answered");
    assert_eq!(again.status(), 409, "the charge is held by --latency");
    let pid = sandbox.0.id().to_string();
    let signal = |name: &str| {
        let sent = Command::new("kill")
            .args([name, &pid])
            .status()
            .expect("kill runs");
        assert!(sent.success(), "{name} sent");
    };
    signal("-TERM");
    // Read: the listener is closed, the held answer still awaited.
    let address = base.trim_start_matches("http://").to_owned();
    for _ in 0..100 {
        if tokio::net::TcpStream::connect(&address).await.is_err() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        tokio::net::TcpStream::connect(&address).await.is_err(),
        "the first signal closed the listener"
    );
    assert!(
        sandbox.0.try_wait().expect("wait").is_none(),
        "the held answer is waited for"
    );
    let asked = std::time::Instant::now();
    signal("-INT");
    let status = loop {
        if let Some(status) = sandbox.0.try_wait().expect("wait") {
            break status;
        }
        assert!(
            asked.elapsed() < Duration::from_secs(5),
            "stopped at once after the Ctrl-C"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(status.code(), Some(130));
    assert!(
        held.await.expect("task").is_err(),
        "the held charge got no answer"
    );
}

#[tokio::test]
async fn the_standalone_sandbox_gateway_follows_the_reference_protocol() {
    let (_sandbox, base) = sandbox_gateway("1s").await;
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
        // Well after the first arrived, well before its 1 s is over.
        tokio::time::sleep(Duration::from_millis(300)).await;
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

    let found = crate::binary::get_json(&http, &format!("{base}/v1/charges?reference=ref-1")).await;
    assert_eq!(found["data"].as_array().map(Vec::len), Some(1));
    let none = crate::binary::get_json(&http, &format!("{base}/v1/charges?reference=nope")).await;
    assert_eq!(none["data"], json!([]));
    let stats = crate::binary::get_json(&http, &format!("{base}/sandbox/stats")).await;
    assert_eq!(stats["charges"], 1);
    assert_eq!(stats["duplicatedReferences"], 0);
}

/// A charge of `amount` COP cents made at the standalone sandbox; its id.
async fn sandbox_charge(
    http: &reqwest::Client,
    base: &str,
    reference: &str,
    amount: i64,
) -> String {
    let made = http
        .post(format!("{base}/v1/charges"))
        .header("Idempotency-Key", format!("charge-{reference}"))
        .json(&json!({"amount": amount, "currency": "COP", "reference": reference}))
        .send()
        .await
        .expect("sent");
    assert_eq!(made.status(), 201);
    let made: Value = made.json().await.expect("JSON");
    made["id"].as_str().unwrap_or_default().to_owned()
}

#[tokio::test]
async fn the_standalone_sandbox_refunds_by_the_reference_protocol() {
    let (_sandbox, base) = sandbox_gateway("1s").await;
    let http = reqwest::Client::new();
    let charge = sandbox_charge(&http, &base, "pay-1", 100_000).await;
    let refund = |key: &'static str, charge: String, amount: i64, reference: &'static str| {
        let http = http.clone();
        let url = format!("{base}/v1/refunds");
        async move {
            http.post(url)
                .header("Idempotency-Key", key)
                .json(
                    &json!({"charge": charge, "amount": amount, "currency": "COP",
                              "reference": reference}),
                )
                .send()
                .await
                .expect("sent")
        }
    };
    // A duplicate while the first is in flight: 409.
    let (first, second) = tokio::join!(refund("rk-1", charge.clone(), 60_000, "ref-r1"), async {
        // Well after the first arrived, well before its 1 s is over.
        tokio::time::sleep(Duration::from_millis(300)).await;
        refund("rk-1", charge.clone(), 60_000, "ref-r1").await
    });
    assert_eq!(first.status(), 201);
    assert_eq!(second.status(), 409);
    let first: Value = first.json().await.expect("JSON");
    assert_eq!(first["status"], "succeeded");
    assert_eq!(first["charge"], charge.as_str());
    assert_eq!(first["failureCode"], Value::Null);

    let replay = refund("rk-1", charge.clone(), 60_000, "ref-r1").await;
    assert_eq!(replay.status(), 201);
    assert_eq!(
        replay.json::<Value>().await.expect("JSON"),
        first,
        "the same refund"
    );
    assert_eq!(
        refund("rk-1", charge.clone(), 1, "ref-r1").await.status(),
        422,
        "same key, another body"
    );

    let over = refund("rk-2", charge.clone(), 40_001, "ref-r2").await;
    assert_eq!(over.status(), 400);
    let over: Value = over.json().await.expect("JSON");
    assert_eq!(over["error"], "amount_exceeds_remaining");
    assert_eq!(over["remaining"], 40_000);
    let stray = refund("rk-3", "ch_000099aaaaaaaaaa".into(), 1, "ref-r3").await;
    assert_eq!(stray.status(), 400);
    assert_eq!(
        stray.json::<Value>().await.expect("JSON")["error"],
        "charge_not_found"
    );

    let found =
        crate::binary::get_json(&http, &format!("{base}/v1/refunds?reference=ref-r1")).await;
    assert_eq!(found["data"], json!([first]));
    let none = crate::binary::get_json(&http, &format!("{base}/v1/refunds?reference=ref-r2")).await;
    assert_eq!(none["data"], json!([]), "a refused refund was never made");

    // The library's reference adapter reads the process's answers the same way.
    let gateway = pagos::gateway::http::HttpGateway::new(&base, "unused", Duration::from_secs(5))
        .expect("client");
    let req = |key: &str, amount: i64, n: u128| pagos::gateway::RefundRequest {
        gateway_key: key.into(),
        charge: charge.clone(),
        amount,
        currency: "COP".into(),
        reference: uuid::Uuid::from_u128(n),
        reason: None,
        whole: false,
    };
    let policy = pagos::gateway::retry::RetryPolicy::new(0);
    let refused =
        pagos::gateway::retry::refund(&gateway, &req("rk-4", 40_001, 4), policy, false).await;
    assert!(
        matches!(
            refused,
            pagos::gateway::retry::RefundOutcome::Rejected {
                reason: pagos::gateway::RejectReason::ExceedsRemaining,
                ..
            }
        ),
        "{refused:?}"
    );
    let rest =
        pagos::gateway::retry::refund(&gateway, &req("rk-5", 40_000, 5), policy, false).await;
    assert!(
        matches!(rest, pagos::gateway::retry::RefundOutcome::Succeeded(_)),
        "{rest:?}"
    );

    let stats = crate::binary::get_json(&http, &format!("{base}/sandbox/stats")).await;
    let refunds = &stats["refunds"];
    assert_eq!(refunds["made"], 2, "{stats}");
    assert_eq!(refunds["succeeded"], 2, "{stats}");
    assert_eq!(refunds["refundedAmount"], 100_000, "{stats}");
    assert_eq!(refunds["refundedCharges"], 1, "{stats}");
    assert_eq!(refunds["overRefundedCharges"], 0, "{stats}");
    assert_eq!(refunds["duplicatedReferences"], 0, "{stats}");
}

#[tokio::test]
async fn the_standalone_sandbox_settles_a_pending_refund_and_delivers_its_signed_events() {
    use wiremock::matchers::{method, path};
    use wiremock::{Mock, MockServer, ResponseTemplate};
    let receiver = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/webhooks/http"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"resultado": "ignorado"})))
        .mount(&receiver)
        .await;
    let hook = format!("{}/v1/webhooks/http", receiver.uri());
    let (_sandbox, base) = sandbox_gateway_with(&[
        "--pending-rate",
        "1",
        "--pending-for",
        "300ms",
        "--webhook-url",
        &hook,
        "--webhook-secret",
        "whsec_sandbox_refunds",
    ])
    .await;
    let http = reqwest::Client::new();
    let charge = sandbox_charge(&http, &base, "pay-pending", 50_000).await;
    let settled = |url: String| {
        let http = http.clone();
        async move {
            for _ in 0..100 {
                let found = crate::binary::get_json(&http, &url).await;
                if found["data"][0]["status"] != "pending" && found["data"][0] != Value::Null {
                    return found["data"][0].clone();
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            panic!("{url} never settled");
        }
    };
    let charged = settled(format!("{base}/v1/charges?reference=pay-pending")).await;
    assert_eq!(charged["status"], "succeeded");

    let made = refund_request(&http, &base, "rk-pending", &charge, 50_000, "ref-pending")
        .send()
        .await
        .expect("sent");
    assert_eq!(made.status(), 201);
    let made: Value = made.json().await.expect("JSON");
    assert_eq!(made["status"], "pending");
    let refunded = settled(format!("{base}/v1/refunds?reference=ref-pending")).await;
    assert_eq!(refunded["status"], "succeeded");
    assert_eq!(refunded["id"], made["id"]);

    let mut events = Vec::new();
    for _ in 0..100 {
        events = receiver
            .received_requests()
            .await
            .unwrap_or_default()
            .into_iter()
            .filter(|r| {
                serde_json::from_slice::<Value>(&r.body)
                    .is_ok_and(|e| e["type"] == "refund.updated")
            })
            .collect();
        if events.len() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut seen: Vec<(u64, String)> = events
        .iter()
        .map(|request| {
            let signature = request.headers["gateway-signature"].as_bytes();
            pagos::webhooks::signature::verify_header(
                std::iter::once(signature),
                b"whsec_sandbox_refunds",
                &request.body,
                chrono::Utc::now().timestamp(),
            )
            .expect("signed with the webhook secret");
            let event: Value = serde_json::from_slice(&request.body).expect("JSON");
            assert_eq!(event["data"]["id"], made["id"]);
            assert_eq!(event["data"]["reference"], "ref-pending");
            (
                event["sequence"].as_u64().unwrap_or_default(),
                event["data"]["status"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            )
        })
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        vec![(1, "pending".to_owned()), (2, "succeeded".to_owned())],
        "one event per change of the refund, in its own sequence"
    );
}

#[tokio::test]
async fn the_standalone_sandbox_refunds_then_drops_the_connection_under_reset_rate() {
    let (_sandbox, base) =
        sandbox_gateway_with(&["--reset-rate", "1", "--refund-failure-rate", "1"]).await;
    let http = reqwest::Client::new();
    // The charge's answer is dropped too: find it by its reference.
    let dropped = http
        .post(format!("{base}/v1/charges"))
        .header("Idempotency-Key", "charge-reset")
        .json(&json!({"amount": 10_000, "currency": "COP", "reference": "pay-reset"}))
        .send()
        .await;
    assert!(
        match dropped {
            Err(_) => true,
            Ok(answer) => answer.bytes().await.is_err(),
        },
        "the answer breaks mid-way"
    );
    let charges =
        crate::binary::get_json(&http, &format!("{base}/v1/charges?reference=pay-reset")).await;
    let charge = charges["data"][0]["id"].clone();
    for _ in 0..2 {
        let answer = refund_request(&http, &base, "rk-reset", &charge, 10_000, "ref-reset")
            .send()
            .await;
        let broken = match answer {
            Err(_) => true,
            Ok(answer) => answer.bytes().await.is_err(),
        };
        assert!(broken, "the refund's answer breaks mid-way");
    }
    let stats = crate::binary::get_json(&http, &format!("{base}/sandbox/stats")).await;
    assert_eq!(
        stats["refunds"]["made"], 1,
        "made once, however often sent: {stats}"
    );
    let found =
        crate::binary::get_json(&http, &format!("{base}/v1/refunds?reference=ref-reset")).await;
    assert_eq!(found["data"][0]["status"], "failed");
    assert_eq!(found["data"][0]["failureCode"], "declined");
}

/// The standalone sandbox delivering events signs them with its own secret
/// (`PAGOS_SANDBOX_WEBHOOK_SECRET`) or, unset, pagos' `PAGOS_WEBHOOK_SECRET`, as an
/// environment set for both processes has it; with neither, one line naming the setting,
/// exit 2 (before: exit 1, and pagos' own secret was not read).
#[tokio::test]
async fn the_sandbox_signs_its_events_with_pagos_webhook_secret_unless_given_its_own() {
    use wiremock::matchers::{method, path};
    use wiremock::{Mock, MockServer, ResponseTemplate};
    let sandbox = |port: u16, hook: &str| {
        let mut command = Command::new(BIN);
        command
            .args(["sandbox-gateway", "--bind", &format!("127.0.0.1:{port}")])
            .args(["--pending-rate", "1", "--pending-for", "200ms"])
            .args(["--webhook-url", hook])
            .env_remove("PAGOS_WEBHOOK_SECRET")
            .env_remove("PAGOS_SANDBOX_WEBHOOK_SECRET");
        command
    };
    let refused = sandbox(free_port(), "http://127.0.0.1:9/v1/webhooks/http")
        .output()
        .expect("runs");
    assert_refused(&refused, "PAGOS_SANDBOX_WEBHOOK_SECRET");
    assert!(String::from_utf8_lossy(&refused.stderr).contains("PAGOS_WEBHOOK_SECRET"));

    let receiver = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/webhooks/http"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"resultado": "aplicado"})))
        .mount(&receiver)
        .await;
    let port = free_port();
    let _sandbox = Child(
        sandbox(port, &format!("{}/v1/webhooks/http", receiver.uri()))
            .env("PAGOS_WEBHOOK_SECRET", "whsec_shared_by_both")
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("sandbox starts"),
    );
    let base = format!("http://127.0.0.1:{port}");
    wait_for_sandbox(&base).await;
    sandbox_charge(&reqwest::Client::new(), &base, "pay-signed", 50_000).await;
    let mut delivered = Vec::new();
    for _ in 0..100 {
        delivered = receiver.received_requests().await.unwrap_or_default();
        if !delivered.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let event = delivered.first().expect("an event delivered");
    let signature = event.headers["gateway-signature"].to_str().expect("text");
    let t: i64 = signature
        .strip_prefix("t=")
        .and_then(|rest| rest.split(',').next())
        .and_then(|t| t.parse().ok())
        .expect("t=<seconds>");
    assert_eq!(
        signature,
        crate::helpers::timestamped_signature("whsec_shared_by_both", t, &event.body),
        "signed with PAGOS_WEBHOOK_SECRET"
    );
}

/// `PAGOS_RECONCILE_ONCE=true` is `--once`: every flag also reads an environment variable.
#[test]
fn reconcile_once_reads_its_environment_variable() {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}?mode=rwc", dir.path().join("p.db").display());
    let migrated = pagos(&["migrate", "--database-url", &url], &[]);
    assert!(
        migrated.status.success(),
        "{}",
        String::from_utf8_lossy(&migrated.stderr)
    );

    let output = pagos(
        &["reconcile", "--database-url", &url],
        &[("PAGOS_RECONCILE_ONCE", "true")],
    );

    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: Value = serde_json::from_slice(&output.stdout).expect("the report as JSON");
    assert!(report.is_object(), "{report}");
    let not_once = pagos(
        &["reconcile", "--database-url", &url],
        &[("PAGOS_RECONCILE_ONCE", "false")],
    );
    assert_refused(&not_once, "PAGOS_RECONCILE_ONCE");
}

#[test]
fn a_refund_failure_rate_outside_0_to_1_stops_the_sandbox_with_one_line_naming_it() {
    let output = pagos(&["sandbox-gateway", "--refund-failure-rate", "2"], &[]);
    assert_refused(&output, "PAGOS_SANDBOX_REFUND_FAILURE_RATE");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--refund-failure-rate"), "{stderr}");
    let help = pagos(&["sandbox-gateway", "--help"], &[]);
    assert!(
        String::from_utf8_lossy(&help.stdout).contains("PAGOS_SANDBOX_REFUND_FAILURE_RATE"),
        "--help names it"
    );
}

/// `pagos merchants add --gateway stripe` on a new database makes a live key and pins no
/// gateway. A `serve` then started without `PAGOS_GATEWAY` (a configuration that did not
/// mount) ran as the sandbox: it pinned the database to it, and the live merchant's every
/// payment was answered 201 COMPLETADA with no money moved. Now it refuses to start (one
/// line naming `PAGOS_GATEWAY`, exit 2) and pins nothing: started with the gateway the key
/// was made for, it runs.
#[tokio::test]
async fn the_sandbox_refuses_a_database_that_holds_live_api_keys() {
    use sea_orm::EntityTrait;
    let dir = tempfile::tempdir().expect("dir");
    let db = sqlite_in(&dir, "live.db");
    let key = on_db(&db, &["merchants", "add", "acme", "--gateway", "stripe"]);
    assert!(key.trim().starts_with("sk_live_"), "{key}");

    let serve = pagos(
        &["serve", "--database-url", &db],
        &[("PAGOS_BIND", "127.0.0.1:0")],
    );
    assert_refused(&serve, "PAGOS_GATEWAY");
    assert!(
        String::from_utf8_lossy(&serve.stderr).contains("live API key"),
        "{}",
        String::from_utf8_lossy(&serve.stderr)
    );
    let conn = sea_orm::Database::connect(db.as_str()).await.expect("open");
    let pinned = pagos::entities::instance_fact::Entity::find_by_id("gateway".to_owned())
        .one(&conn)
        .await
        .expect("read");
    assert!(pinned.is_none(), "nothing pinned: {pinned:?}");
    assert_refused(&pagos_on(&db, &["reconcile", "--once"]), "PAGOS_GATEWAY");
    let reconcile = pagos_on(
        &db,
        &[
            "reconcile",
            "--once",
            "--gateway",
            "http",
            "--gateway-url",
            "http://127.0.0.1:9",
        ],
    );
    assert!(
        reconcile.status.success(),
        "with a real gateway it runs: {}",
        String::from_utf8_lossy(&reconcile.stderr)
    );
}

/// Also before it migrates: a release started with the wrong `PAGOS_GATEWAY` must not
/// upgrade the schema that production's processes run on (before: `serve` applied the
/// pending migrations, then exited 2).
#[tokio::test]
async fn a_database_used_with_one_gateway_refuses_another() {
    use sea_orm::ConnectionTrait;
    let dir = tempfile::tempdir().expect("dir");
    let db = sqlite_in(&dir, "p.db");
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
    assert_refused(&pagos_on(&db, &["reconcile", "--once"]), "PAGOS_GATEWAY");

    // An older release's schema: this binary's last migration not applied yet (it runs
    // again on a schema that has it).
    let last = "m20261213_000027_events_without_merchant_fk";
    let conn = sea_orm::Database::connect(db.as_str()).await.expect("open");
    conn.execute_unprepared(&format!(
        r#"DELETE FROM "seaql_migrations" WHERE "version" = '{last}'"#
    ))
    .await
    .expect("back to the older release");
    let serve = pagos(
        &["serve", "--database-url", &db],
        &[("PAGOS_BIND", "127.0.0.1:0")],
    );
    assert_refused(&serve, "PAGOS_GATEWAY");
    assert!(
        String::from_utf8_lossy(&serve.stderr).contains("go through the \"http\" gateway"),
        "{}",
        String::from_utf8_lossy(&serve.stderr)
    );
    assert_eq!(
        applied(&conn, last).await,
        0,
        "nothing migrated by a refused process"
    );
    // A pin that cannot be read (here bytes that are no text) stops the start as well,
    // migrating nothing: it might name another gateway.
    let set_pin = |value: &str| {
        format!(r#"UPDATE "instance_facts" SET "value" = {value} WHERE "name" = 'gateway'"#)
    };
    conn.execute_unprepared(&set_pin("X'FF'"))
        .await
        .expect("an unreadable pin");
    let serve = pagos(
        &["serve", "--database-url", &db],
        &[("PAGOS_BIND", "127.0.0.1:0")],
    );
    assert!(
        !serve.status.success(),
        "{}",
        String::from_utf8_lossy(&serve.stderr)
    );
    assert_eq!(applied(&conn, last).await, 0, "nothing migrated");
    conn.execute_unprepared(&set_pin("'http'"))
        .await
        .expect("the pin back");
    assert!(pagos_on(&db, &["migrate"]).status.success());
    assert_eq!(applied(&conn, last).await, 1);
}

/// A database whose payments went through one provider account, or mode, refuses a secret
/// of another at start: a payment left in flight would be looked up where it was never
/// made, found nowhere, and sent again there with the same key (a second charge, or a
/// test-mode COMPLETADA for a live payment). A rotated key of the same account starts.
#[test]
fn a_database_used_with_one_provider_account_refuses_a_secret_of_another() {
    let dir = tempfile::tempdir().expect("dir");
    let cases: [(&str, &str, &str, &[&str]); 2] = [
        (
            "stripe",
            "sk_live_FirstKeyOfTheAccount",
            "rk_live_RotatedRestrictedKey",
            &["sk_test_TheSameAccountsTestKey"],
        ),
        (
            "mercadopago",
            "APP_USR-4417-120700-9f1e0a-180054921",
            "APP_USR-5523-120800-7c2b1d-180054921",
            &[
                "APP_USR-4417-120700-9f1e0a-290011734",
                "TEST-4417-120700-9f1e0a-180054921",
            ],
        ),
    ];
    for (kind, first, rotated, others) in cases {
        let db = sqlite_in(&dir, &format!("{kind}.db"));
        let with = |command: &str, secret: &str| {
            let mut args = vec![command];
            if command == "reconcile" {
                args.push("--once");
            }
            args.extend([
                "--database-url",
                &db,
                "--gateway",
                kind,
                "--gateway-url",
                "http://127.0.0.1:9",
                "--gateway-secret",
                secret,
            ]);
            pagos(&args, &[("PAGOS_BIND", "127.0.0.1:0")])
        };
        succeeded(&with("reconcile", first));
        succeeded(&with("reconcile", rotated));
        for other in others {
            for command in ["reconcile", "serve"] {
                let refused = with(command, other);
                assert_refused(&refused, "PAGOS_GATEWAY_SECRET");
                let stderr = String::from_utf8_lossy(&refused.stderr);
                assert!(stderr.contains("Changing accounts"), "{stderr}");
                assert!(
                    !stderr.contains(other),
                    "the secret is not printed: {stderr}"
                );
            }
        }
    }
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
    // Long after its 500 ms were over, however loaded the machine.
    tokio::time::sleep(Duration::from_secs(2)).await;
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
    let stats = crate::binary::get_json(&http, &format!("{base}/sandbox/stats")).await;
    assert_eq!(stats["charges"], 1);
}

/// Whether migration `version` is recorded applied in SQLite database `conn` (1 or 0).
async fn applied(conn: &sea_orm::DatabaseConnection, version: &str) -> i64 {
    use sea_orm::ConnectionTrait;
    conn.query_one_raw(sea_orm::Statement::from_string(
        sea_orm::DbBackend::Sqlite,
        format!(r#"SELECT COUNT(*) AS n FROM "seaql_migrations" WHERE "version" = '{version}'"#),
    ))
    .await
    .expect("query")
    .expect("a row")
    .try_get::<i64>("", "n")
    .expect("a count")
}

/// A fresh SQLite database in `dir`, migrated by `pagos migrate` (the other commands do
/// not migrate).
pub fn sqlite_in(dir: &tempfile::TempDir, file: &str) -> String {
    let db = format!("sqlite://{}?mode=rwc", dir.path().join(file).display());
    succeeded(&pagos(&["migrate", "--database-url", &db], &[]));
    db
}

/// `pagos args --database-url db`.
fn pagos_on(db: &str, args: &[&str]) -> std::process::Output {
    let mut args = args.to_vec();
    args.extend(["--database-url", db]);
    pagos(&args, &[])
}

/// `pagos args --database-url db`, which must succeed; what it printed.
fn on_db(db: &str, args: &[&str]) -> String {
    succeeded(&pagos_on(db, args))
}

fn succeeded(output: &std::process::Output) -> String {
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

#[test]
fn merchants_keys_add_list_and_revoke_through_the_cli() {
    let dir = tempfile::tempdir().expect("dir");
    let db = sqlite_in(&dir, "k.db");
    on_db(&db, &["merchants", "add", "acme"]);
    let expiring = on_db(
        &db,
        &["merchants", "keys", "add", "acme", "--expira", "30d"],
    );
    let lasting = on_db(&db, &["merchants", "keys", "add", "acme"]);
    assert_ne!(expiring, lasting);

    let table = on_db(&db, &["merchants", "keys", "list", "acme"]);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 4, "a header and three keys:\n{table}");
    for column in ["PREFIX", "CREATED", "LAST USED", "EXPIRES", "STATE"] {
        assert!(lines[0].contains(column), "{table}");
    }
    let expiring_prefix = &expiring[..16];
    let row = lines
        .iter()
        .find(|l| l.starts_with(expiring_prefix))
        .expect("the expiring key's row");
    assert!(
        row.contains("never") && row.contains("active") && row.contains("UTC"),
        "{row}"
    );
    assert!(
        !table.contains(&expiring) && !table.contains(&lasting),
        "never a whole key"
    );

    let revoked = pagos_on(
        &db,
        &["merchants", "keys", "revoke", "acme", expiring_prefix],
    );
    succeeded(&revoked);
    assert!(String::from_utf8_lossy(&revoked.stderr).contains("revoked"));
    let again = pagos_on(
        &db,
        &["merchants", "keys", "revoke", "acme", expiring_prefix],
    );
    succeeded(&again);
    assert!(String::from_utf8_lossy(&again.stderr).contains("already revoked"));

    let listed: Value = serde_json::from_str(&on_db(
        &db,
        &["merchants", "keys", "list", "acme", "--json"],
    ))
    .expect("JSON");
    let keys = listed.as_array().expect("an array");
    assert_eq!(keys.len(), 3);
    let expiring_row = keys
        .iter()
        .find(|k| k["prefix"] == expiring_prefix)
        .expect("listed");
    assert_eq!(expiring_row["state"], "revoked");
    assert!(expiring_row["revokedAt"].is_string());
    assert!(expiring_row["expiresAt"].is_string());
    let lasting_row = keys
        .iter()
        .find(|k| k["prefix"] == lasting[..16])
        .expect("listed");
    assert_eq!(lasting_row["state"], "active");
    assert_eq!(lasting_row["expiresAt"], Value::Null);
    assert_eq!(lasting_row["lastUsedAt"], Value::Null);

    assert_refused(
        &pagos_on(
            &db,
            &["merchants", "keys", "revoke", "acme", "sk_live_nothing"],
        ),
        "no key with prefix",
    );
    assert_refused(
        &pagos_on(&db, &["merchants", "keys", "add", "nobody"]),
        "no merchant is named \"nobody\"",
    );
    assert_refused(
        &pagos_on(&db, &["merchants", "keys", "list", "nobody"]),
        "no merchant is named \"nobody\"",
    );
    assert_refused(
        &pagos_on(
            &db,
            &["merchants", "keys", "add", "acme", "--expira", "soon"],
        ),
        "PAGOS_EXPIRA",
    );
}

#[test]
fn generated_keys_are_sk_test_on_a_sandbox_database_and_sk_live_otherwise() {
    let dir = tempfile::tempdir().expect("dir");
    let random_part = |key: &str, scheme: &str| {
        let random = key
            .strip_prefix(scheme)
            .unwrap_or_else(|| panic!("{key} is {scheme}…"));
        assert_eq!(random.len(), 32, "32 base62 characters, 190 bits: {key}");
        assert!(random.chars().all(|c| c.is_ascii_alphanumeric()), "{key}");
        random.to_owned()
    };
    // A database nothing has used yet: the sandbox is the default gateway.
    let sandbox = sqlite_in(&dir, "sandbox.db");
    let first = succeeded(&pagos(
        &["merchants", "add", "a", "--database-url", &sandbox],
        &[],
    ));
    let second = succeeded(&pagos(
        &["merchants", "keys", "add", "a", "--database-url", &sandbox],
        &[],
    ));
    assert_ne!(
        random_part(&first, "sk_test_"),
        random_part(&second, "sk_test_")
    );

    // A database whose payments go through a real gateway: the gateway it is pinned to
    // decides, whatever PAGOS_GATEWAY says.
    let live = sqlite_in(&dir, "live.db");
    succeeded(&pagos(
        &[
            "reconcile",
            "--once",
            "--database-url",
            &live,
            "--gateway",
            "http",
            "--gateway-url",
            "http://127.0.0.1:9",
        ],
        &[],
    ));
    let key = succeeded(&pagos(
        &["merchants", "add", "b", "--database-url", &live],
        &[("PAGOS_GATEWAY", "sandbox")],
    ));
    random_part(&key, "sk_live_");
    let key = succeeded(&pagos(
        &["merchants", "keys", "add", "b", "--database-url", &live],
        &[],
    ));
    random_part(&key, "sk_live_");

    // Before any `pagos serve`, the configured gateway says.
    let fresh = sqlite_in(&dir, "fresh.db");
    let key = succeeded(&pagos(
        &["merchants", "add", "c", "--database-url", &fresh],
        &[("PAGOS_GATEWAY", "stripe")],
    ));
    random_part(&key, "sk_live_");
}

#[test]
fn a_short_hand_chosen_key_is_warned_about_and_never_repeated_on_stderr() {
    let dir = tempfile::tempdir().expect("dir");
    let db = sqlite_in(&dir, "w.db");
    let short = pagos_on(
        &db,
        &["merchants", "add", "acme", "--api-key", "sk_test_acme"],
    );
    assert_eq!(
        succeeded(&short),
        "sk_test_acme",
        "the chosen key keeps working"
    );
    let stderr = String::from_utf8_lossy(&short.stderr);
    assert!(
        stderr.contains("warning") && stderr.contains("12 characters"),
        "{stderr}"
    );
    assert!(!stderr.contains("sk_test_acme"), "{stderr}");

    let strong = "Xk3-9fQ_aZ7mP2vL8wR4tY6uB1nC5dE0";
    let given = pagos(
        &["merchants", "add", "globex", "--database-url", &db],
        &[("PAGOS_MERCHANT_API_KEY", strong)],
    );
    assert_eq!(succeeded(&given), strong);
    let stderr = String::from_utf8_lossy(&given.stderr);
    assert!(!stderr.contains("warning"), "{stderr}");
    assert!(!stderr.contains(strong), "{stderr}");

    let bad = pagos_on(
        &db,
        &["merchants", "add", "initech", "--api-key", "sk with spaces"],
    );
    assert_refused(&bad, "PAGOS_MERCHANT_API_KEY");
    assert!(!String::from_utf8_lossy(&bad.stderr).contains("with spaces"));
}

#[test]
fn merchant_names_are_trimmed_unique_non_blank_and_at_most_64_printable_characters() {
    let dir = tempfile::tempdir().expect("dir");
    let db = sqlite_in(&dir, "n.db");
    on_db(&db, &["merchants", "add", "  acme "]);
    assert_refused(
        &pagos_on(&db, &["merchants", "add", "acme"]),
        "a merchant named \"acme\" already exists",
    );
    assert_refused(
        &pagos_on(&db, &["merchants", "add", " acme\t"]),
        "already exists",
    );
    assert_refused(
        &pagos_on(&db, &["merchants", "add", "acme", "--api-key", "sk_short"]),
        "already exists",
    );
    for (name, says) in [
        ("", "blank"),
        ("   ", "blank"),
        (&*"x".repeat(65), "at most 64"),
        ("ac\u{7}me", "printable"),
        ("acme\u{202E}moc", "printable"),
    ] {
        assert_refused(&pagos_on(&db, &["merchants", "add", name]), says);
    }
    on_db(&db, &["merchants", "add", &"ñ".repeat(64)]);
    let listed: Value =
        serde_json::from_str(&on_db(&db, &["merchants", "list", "--json"])).expect("JSON");
    let names: Vec<&str> = listed
        .as_array()
        .expect("array")
        .iter()
        .filter_map(|m| m["name"].as_str())
        .collect();
    assert_eq!(
        names,
        ["acme", &*"ñ".repeat(64)],
        "nothing else was created"
    );
}

#[test]
fn merchants_list_is_a_table_for_people_and_json_for_scripts() {
    let dir = tempfile::tempdir().expect("dir");
    let db = sqlite_in(&dir, "l.db");
    on_db(&db, &["merchants", "add", "acme"]);
    let extra = on_db(&db, &["merchants", "keys", "add", "acme"]);
    on_db(&db, &["merchants", "add", "Panadería Ñandú"]);
    succeeded(&pagos_on(
        &db,
        &["merchants", "keys", "revoke", "acme", &extra[..16]],
    ));
    let listed: Value =
        serde_json::from_str(&on_db(&db, &["merchants", "list", "--json"])).expect("JSON");
    let merchants = listed.as_array().expect("array");
    assert_eq!(merchants.len(), 2);
    assert_eq!(merchants[0]["name"], "acme", "oldest first");
    assert_eq!(
        merchants[0]["activeKeys"], 1,
        "the revoked key does not count"
    );
    assert_eq!(merchants[1]["name"], "Panadería Ñandú");
    assert_eq!(merchants[1]["activeKeys"], 1);
    for m in merchants {
        assert!(m["id"].as_str().is_some_and(|id| id.len() == 36));
        assert!(m["createdAt"].as_str().is_some_and(|at| at.ends_with('Z')));
    }

    let table = on_db(&db, &["merchants", "list"]);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 3, "{table}");
    let column = |line: &str, word: &str| line.find(word).map(|b| line[..b].chars().count());
    assert!(lines[0].starts_with("NAME"), "{table}");
    let id_column = column(lines[0], "ID");
    assert_eq!(
        id_column,
        column(lines[1], merchants[0]["id"].as_str().unwrap_or("-")),
        "{table}"
    );
    assert_eq!(
        id_column,
        column(lines[2], merchants[1]["id"].as_str().unwrap_or("-")),
        "{table}"
    );
    assert!(
        lines[0].contains("ACTIVE KEYS") && lines[0].contains("CREATED"),
        "{table}"
    );
}

#[tokio::test]
async fn the_sandbox_demo_merchant_and_an_operators_demo_never_collide() {
    let dir = tempfile::tempdir().expect("dir");
    let db = sqlite_in(&dir, "demo.db");
    let serve = crate::process::Serve::start(&["--database-url", &db], &[]).await;
    let answer = reqwest::Client::new()
        .get(format!("{}/v1/pagos/{}", serve.url, uuid::Uuid::nil()))
        .bearer_auth(pagos::app::DEMO_API_KEY)
        .send()
        .await
        .expect("sent");
    assert_eq!(answer.status(), 404, "the README's demo key works");
    assert!(!serve.logs().contains(pagos::app::DEMO_API_KEY));
    drop(serve);
    assert_refused(
        &pagos_on(&db, &["merchants", "add", "demo"]),
        "a merchant named \"demo\" already exists",
    );
    // Started again, the sandbox finds its merchant and creates no other.
    let serve = crate::process::Serve::start(&["--database-url", &db], &[]).await;
    drop(serve);
    let listed: Value =
        serde_json::from_str(&on_db(&db, &["merchants", "list", "--json"])).expect("JSON");
    assert_eq!(listed.as_array().map(Vec::len), Some(1));
}

/// `pagos serve ARGS` on `db` until dropped (killed then), its logs appended to `log`,
/// once it answers; its base URL.
async fn serving(
    db: &str,
    args: &[&str],
    log: &std::path::Path,
) -> (crate::binary::Running, String) {
    let bind = format!("127.0.0.1:{}", free_port());
    let mut all = vec!["serve", "--database-url", db, "--bind", &bind];
    all.extend_from_slice(args);
    let running = crate::binary::Running(
        crate::binary::pagos(&all, Some(log))
            .spawn()
            .expect("pagos serve"),
    );
    let url = format!("http://{bind}");
    crate::binary::wait_until_up(&format!("{url}/healthz"), Duration::from_secs(10), || {
        std::fs::read_to_string(log).unwrap_or_default()
    })
    .await;
    (running, url)
}

/// The status `GET /v1/pagos/<nil>` answers at `url` with the README's demo key.
async fn demo_key_answers(url: &str) -> u16 {
    reqwest::Client::new()
        .get(format!("{url}/v1/pagos/{}", uuid::Uuid::nil()))
        .bearer_auth(pagos::app::DEMO_API_KEY)
        .send()
        .await
        .expect("sent")
        .status()
        .as_u16()
}

/// A database set up by the sandbox (with the demo merchant and its public key), moved to
/// a real gateway as runbooks/gateway-outage.md says: the public key must not take
/// payments there. `serve` revokes it at start, with one WARN line naming it.
#[tokio::test]
async fn the_demo_key_is_revoked_when_its_database_serves_a_real_gateway() {
    use sea_orm::ConnectionTrait;
    let dir = tempfile::tempdir().expect("dir");
    let db = sqlite_in(&dir, "moved.db");
    let log = dir.path().join("serve.log");
    let logs = || std::fs::read_to_string(&log).unwrap_or_default();
    {
        let (_sandbox, url) = serving(&db, &[], &log).await;
        assert_eq!(demo_key_answers(&url).await, 404, "the demo key works");
    }
    let connection = sea_orm::Database::connect(db.as_str())
        .await
        .expect("database");
    connection
        .execute_unprepared(
            "UPDATE instance_facts SET value = 'http' WHERE name = 'gateway' AND value = 'sandbox'",
        )
        .await
        .expect("the runbook's change of gateway");
    connection.close().await.expect("closed");
    assert!(!logs().contains("revoked the README's"), "{}", logs());

    let gateway = wiremock::MockServer::start().await;
    let real = [
        "--gateway",
        "http",
        "--gateway-url",
        &gateway.uri(),
        "--gateway-secret",
        "gw_secret",
    ];
    {
        let (_real, url) = serving(&db, &real, &log).await;
        assert_eq!(demo_key_answers(&url).await, 401, "revoked at start");
    }
    let warned: Vec<String> = logs()
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("revoked the README's public demo API key"))
        .map(str::to_owned)
        .collect();
    assert_eq!(warned.len(), 1, "{}", logs());
    assert!(
        warned[0].contains("demo") && warned[0].contains("sk_sand"),
        "names the merchant and the key's prefix: {}",
        warned[0]
    );
    assert!(!logs().contains(pagos::app::DEMO_API_KEY), "{}", logs());
    let keys = on_db(&db, &["merchants", "keys", "list", "demo"]);
    assert!(keys.contains("revoked"), "{keys}");

    // Started again: nothing more to revoke, nothing more said.
    {
        let (_again, url) = serving(&db, &real, &log).await;
        assert_eq!(demo_key_answers(&url).await, 401);
    }
    let warned = logs()
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("revoked the README's public demo API key"))
        .count();
    assert_eq!(warned, 1, "{}", logs());
}

/// The public demo key is refused as a merchant's key on a database of a real gateway.
#[test]
fn the_public_demo_key_is_refused_for_a_merchant_of_a_real_gateway() {
    let dir = tempfile::tempdir().expect("dir");
    let db = sqlite_in(&dir, "real.db");
    let refused = pagos_on(
        &db,
        &[
            "merchants",
            "add",
            "shop",
            "--gateway",
            "http",
            "--api-key",
            pagos::app::DEMO_API_KEY,
        ],
    );
    assert_refused(&refused, "PAGOS_MERCHANT_API_KEY");
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("demo"),
        "{refused:?}"
    );
    let listed = on_db(&db, &["merchants", "list", "--json"]);
    assert_eq!(listed, "[]", "nothing created");
    // On a sandbox database it is the demo's key, as the README says.
    on_db(
        &db,
        &[
            "merchants",
            "add",
            "demo",
            "--api-key",
            pagos::app::DEMO_API_KEY,
        ],
    );
}

#[tokio::test]
async fn secrets_never_appear_in_the_logs_of_serve_or_the_sandbox_gateway() {
    let secrets = [
        ("PAGOS_GATEWAY_SECRET", "gw-secret-4f7a1c"),
        ("PAGOS_ADMIN_TOKEN", "admin-secret-9b2e5d"),
        ("PAGOS_WEBHOOK_SECRET", "webhook-secret-1d8c3a"),
        ("PAGOS_STRIPE_WEBHOOK_SECRET", "whsec_stripe-secret-7e6f2b"),
        ("PAGOS_MERCADOPAGO_WEBHOOK_SECRET", "mp-secret-3a9d4e"),
    ];
    let dir = tempfile::tempdir().expect("dir");
    let db = sqlite_in(&dir, "s.db");
    let mut env: Vec<(&str, &str)> = secrets.to_vec();
    env.push(("RUST_LOG", "debug"));
    let serve = crate::process::Serve::start(
        &[
            "--database-url",
            &db,
            "--gateway",
            "mercadopago",
            "--gateway-url",
            "http://127.0.0.1:9",
        ],
        &env,
    )
    .await;
    // A request that uses the admin token, so its handling is in the logs too.
    let answer = reqwest::Client::new()
        .get(format!("{}/admin/pagos?estado=ENVIADA&limite=1", serve.url))
        .bearer_auth("admin-secret-9b2e5d")
        .send()
        .await
        .expect("sent");
    assert_eq!(answer.status(), 200);
    let logs = serve.logs();
    assert!(logs.contains("pagos listening"), "{logs}");
    for (env, secret) in secrets {
        assert!(!logs.contains(secret), "{env} appears in the logs:\n{logs}");
    }

    let log_path = dir.path().join("sandbox.log");
    let port = free_port();
    let sandbox = Child(
        Command::new(BIN)
            .args(["sandbox-gateway", "--bind", &format!("127.0.0.1:{port}")])
            .args(["--webhook-url", "http://127.0.0.1:9/v1/webhooks/http"])
            .env("PAGOS_SANDBOX_SECRET", "sandbox-secret-5c1b7f")
            .env(
                "PAGOS_SANDBOX_WEBHOOK_SECRET",
                "sandbox-webhook-secret-2f8e9a",
            )
            .env("RUST_LOG", "debug")
            .stderr(std::fs::File::create(&log_path).expect("log"))
            .spawn()
            .expect("sandbox starts"),
    );
    wait_for_sandbox(&format!("http://127.0.0.1:{port}")).await;
    drop(sandbox);
    let logs = std::fs::read_to_string(&log_path).unwrap_or_default();
    assert!(logs.contains("sandbox gateway listening"), "{logs}");
    for secret in ["sandbox-secret-5c1b7f", "sandbox-webhook-secret-2f8e9a"] {
        assert!(
            !logs.contains(secret),
            "{secret} appears in the logs:\n{logs}"
        );
    }
}

/// A new database is set up by its first use, whichever command it is (`pagos merchants
/// add` before any `serve`, as the contract allows). One a release has migrated is never
/// migrated by a command other than `serve` and `migrate`: a newer CLI on a laptop never
/// migrates production by the way. If it lacks migrations, it is refused with one line
/// and left as it was.
#[tokio::test]
async fn a_new_database_is_set_up_by_any_command_and_an_older_releases_is_migrated_only_by_migrate()
{
    use sea_orm::ConnectionTrait;
    let dir = tempfile::tempdir().expect("dir");
    let new = format!("sqlite://{}?mode=rwc", dir.path().join("new.db").display());
    let added = pagos_on(&new, &["merchants", "add", "acme", "--api-key", "sk_new_1"]);
    assert!(
        added.status.success(),
        "{}",
        String::from_utf8_lossy(&added.stderr)
    );
    assert!(on_db(&new, &["merchants", "list"]).contains("acme"));

    // A database of an older release: this binary's last migration not applied yet.
    let older = format!(
        "sqlite://{}?mode=rwc",
        dir.path().join("older.db").display()
    );
    on_db(&older, &["migrate"]);
    let last = "m20261208_000018_events_in_commit_order";
    let conn = sea_orm::Database::connect(older.as_str())
        .await
        .expect("open");
    for sql in [
        format!(r#"DELETE FROM "seaql_migrations" WHERE "version" = '{last}'"#),
        r#"DROP INDEX "events_merchant_commit_order_idx""#.to_owned(),
        r#"CREATE INDEX "events_merchant_id_idx" ON "events" ("merchant_id", "id")"#.to_owned(),
    ] {
        conn.execute_unprepared(&sql)
            .await
            .expect("back to the older release");
    }
    for command in [
        &["merchants", "list"][..],
        &["merchants", "add", "acme"],
        &["operators", "list"],
        &["reconcile", "--once"],
    ] {
        let output = pagos_on(&older, command);
        assert_refused(&output, "run `pagos migrate` first");
    }
    assert_eq!(
        applied(&conn, last).await,
        0,
        "not migrated by another command"
    );
    on_db(&older, &["migrate"]);
    assert!(!on_db(&older, &["merchants", "list"]).contains("acme"));
}

/// The runbooks' read-only convention (`PGOPTIONS='-c default_transaction_read_only=on'`):
/// the commands that only read work on a database `pagos migrate` migrated.
#[tokio::test]
async fn a_read_only_session_lists_merchants_of_a_migrated_postgres_database() {
    let Some(backend) = crate::helpers::Backend::postgres() else {
        return;
    };
    let database = crate::helpers::TestDatabase::create(&backend).await;
    let db = database.url.as_str();
    on_db(db, &["migrate"]);
    on_db(db, &["merchants", "add", "acme"]);
    let read_only = [("PGOPTIONS", "-c default_transaction_read_only=on")];
    let listed = succeeded(&pagos(
        &["merchants", "list", "--json", "--database-url", db],
        &read_only,
    ));
    assert!(listed.contains("\"acme\""), "{listed}");
    succeeded(&pagos(
        &["merchants", "keys", "list", "acme", "--database-url", db],
        &read_only,
    ));
    // What writes still fails there, as the convention means it to.
    let refused = pagos(
        &["merchants", "add", "globex", "--database-url", db],
        &read_only,
    );
    assert!(
        !refused.status.success(),
        "a write under the read-only session fails"
    );
}
