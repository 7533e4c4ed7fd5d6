//! `pagos pay` (the real binary) against `pagos serve` (the real binary), with a wiremock
//! gateway: exit codes, output, the journal, and a client killed mid-payment.

use crate::helpers::{API_KEY, Charge, PAYMENT, RealPagos, key_of, pagos_bin, text};
use std::process::Stdio;
use std::time::Duration;

#[tokio::test]
async fn a_killed_pagos_pay_resumes_with_the_same_key_and_the_server_charges_once() {
    // The gateway takes 3 s: the payment is in flight when the client dies.
    let pagos = RealPagos::start(Charge::Succeeded, Duration::from_secs(3)).await;
    let mut first = pagos
        .pay()
        .args(PAYMENT)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("pagos pay");
    let mut waited = Duration::ZERO;
    while pagos.charges().await.is_empty() {
        assert!(
            waited < Duration::from_secs(15),
            "the charge never reached the gateway"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
        waited += Duration::from_millis(25);
    }
    first.kill().await.expect("SIGKILL pagos pay");
    let journal = pagos.journal().await;
    let kept = journal.pending().await.expect("journal");
    assert_eq!(
        kept.len(),
        1,
        "the intent was written before the request left"
    );
    assert_eq!(kept[0].attempts, 1);
    let key = kept[0].intent.key().to_string();

    let (stdout, stderr) = pagos.resume_until_paid().await;

    assert!(
        stderr.contains(&format!("resuming intent {key}")),
        "{stderr}"
    );
    assert!(stdout.contains(&key), "{stdout}");
    assert!(stdout.contains("COMPLETADA"), "{stdout}");
    let charges = pagos.charges().await;
    assert_eq!(charges.len(), 1, "one charge at the gateway");
    let payments = pagos.payments().await;
    assert_eq!(payments.len(), 1, "one payment on the server");
    assert_eq!(
        payments[0].idempotency_key, key,
        "paid under the journal's key"
    );
    assert_eq!(payments[0].state, "COMPLETADA");
    assert!(stdout.contains(&payments[0].id.to_string()));
    assert!(journal.pending().await.expect("journal").is_empty());
}

#[tokio::test]
async fn a_paid_payment_is_printed_as_a_table_or_json_exits_0_and_leaves_the_journal() {
    let pagos = RealPagos::start(Charge::Succeeded, Duration::ZERO).await;

    let table = pagos.pay_usual(&["--descripcion", "cuota 3"]).await;
    let json = pagos
        .pay()
        .args([
            "--credito",
            "43",
            "--monto",
            "1000",
            "--moneda",
            "USD",
            "--json",
        ])
        .output()
        .await
        .expect("pagos pay --json");

    let stdout = text(&table.stdout);
    assert_eq!(table.status.code(), Some(0), "{}", text(&table.stderr));
    assert!(stdout.contains("estado          COMPLETADA"), "{stdout}");
    assert!(
        stdout.contains("monto           250000 (2500.00 COP)"),
        "{stdout}"
    );
    assert!(stdout.contains("descripcion     cuota 3"), "{stdout}");
    assert!(stdout.contains("gatewayRef      ch_1"), "{stdout}");
    assert_eq!(json.status.code(), Some(0), "{}", text(&json.stderr));
    let printed: serde_json::Value = serde_json::from_slice(&json.stdout).expect("JSON");
    assert_eq!(printed["estado"], "COMPLETADA");
    assert_eq!(printed["creditoId"], "43");
    assert_eq!(printed["moneda"], "USD");
    let charges = pagos.charges().await;
    assert_eq!(charges.len(), 2);
    assert_ne!(
        key_of(&charges[0]),
        key_of(&charges[1]),
        "two intents, two keys"
    );
    assert!(pagos.journal_pending().await.is_empty());
}

#[tokio::test]
async fn a_declined_payment_exits_3_and_leaves_the_journal() {
    let pagos = RealPagos::start(Charge::Declined, Duration::ZERO).await;

    let out = pagos.pay_usual(&[]).await;

    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("FALLIDA"), "{stdout}");
    assert!(stdout.contains("insufficient_funds"), "{stdout}");
    assert!(pagos.journal_pending().await.is_empty());
}

/// A payment the server sent to `REVISION_MANUAL` is not one "the server settles": the
/// command says its on-call engineers decide, and exits 4 with the intent kept.
#[tokio::test]
async fn a_payment_under_review_exits_4_saying_on_call_decides_it() {
    let pagos = RealPagos::start(Charge::OtherCurrency, Duration::ZERO).await;

    let out = pagos.pay_usual(&["--deadline", "2s"]).await;

    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{stderr}");
    assert!(text(&out.stdout).contains("REVISION_MANUAL"), "{stderr}");
    assert!(stderr.contains("on-call engineers"), "{stderr}");
    assert!(!stderr.contains("the server settles it"), "{stderr}");
    assert_eq!(pagos.journal_pending().await.len(), 1);
}

#[tokio::test]
async fn a_payment_still_pending_at_the_deadline_exits_4_and_stays_in_the_journal() {
    let pagos = RealPagos::start(Charge::Pending, Duration::ZERO).await;

    let out = pagos.pay_usual(&["--deadline", "2s"]).await;

    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{stderr}");
    assert!(text(&out.stdout).contains("ENVIADA"));
    assert!(
        stderr.contains("looking again in"),
        "progress is shown: {stderr}"
    );
    let kept = pagos.journal_pending().await;
    assert_eq!(kept.len(), 1);
    let payments = pagos.payments().await;
    assert_eq!(kept[0].payment_id, Some(payments[0].id));
    assert_eq!(pagos.charges().await.len(), 1);
}

/// A payment `pagos pay` left pending (exit 4) is resumed while the server cannot be
/// reached (down, or its look-ups failing): its state cannot be read, and the command says
/// so and exits 4 again, naming the payment, not 1 ("gave up") after it said pending.
#[tokio::test]
async fn a_pending_payment_resumed_while_the_server_is_down_is_still_pending_exit_4() {
    let mut pagos = RealPagos::start(Charge::Pending, Duration::ZERO).await;
    let first = pagos.pay_usual(&["--deadline", "1s"]).await;
    assert_eq!(first.status.code(), Some(4), "{}", text(&first.stderr));
    let named = pagos.payments().await[0].id;

    pagos.kill();
    let resumed = pagos
        .pay()
        .args(["--resume", "--deadline", "2s"])
        .output()
        .await
        .expect("pagos pay --resume");

    let stderr = text(&resumed.stderr);
    assert_eq!(resumed.status.code(), Some(4), "{stderr}");
    assert!(stderr.contains(&named.to_string()), "{stderr}");
    assert!(stderr.contains("could not be read"), "{stderr}");
    assert!(!stderr.contains("gave up"), "{stderr}");
    assert_eq!(
        pagos.journal_pending().await.len(),
        1,
        "kept for the next --resume"
    );
}

/// The server named the payment (202, pending at the gateway), then its database was
/// restored from before it: a real `pagos serve` killed, its file copied back, started
/// again. `pagos pay --resume` reads pagos' own 404 for the payment it was named, posts
/// the intent again with its key, and the server, deriving the same payment id and gateway
/// key from it, sends the very same charge request: the gateway answers the charge it made
/// (settled since), and the customer is charged once and told so.
#[tokio::test]
async fn a_payment_the_restored_server_forgot_is_sent_again_with_its_key_and_charged_once() {
    let mut pagos = RealPagos::start(Charge::Pending, Duration::ZERO).await;
    let first = pagos.pay_usual(&["--deadline", "1s"]).await;
    assert_eq!(first.status.code(), Some(4), "{}", text(&first.stderr));
    let named = pagos.payments().await[0].id;
    assert_eq!(pagos.journal_pending().await[0].payment_id, Some(named));

    pagos.restart_on_a_restored_database().await;
    assert!(pagos.payments().await.is_empty(), "the database forgot it");
    pagos.gateway_now(Charge::Succeeded).await;

    let (stdout, stderr) = pagos.resume_until_paid().await;

    assert!(
        stderr.contains(&format!("the server has no payment {named}")),
        "why it is sent again is shown: {stderr}"
    );
    assert!(
        stdout.contains(&named.to_string()),
        "the same payment: {stdout}"
    );
    assert!(stdout.contains("COMPLETADA"), "{stdout}");
    let payments = pagos.payments().await;
    assert_eq!(payments.len(), 1);
    assert_eq!(payments[0].id, named, "the same payment, derived again");
    let charges = pagos.charges().await;
    assert_eq!(
        charges.len(),
        2,
        "sent once, then once again after the restore"
    );
    assert_eq!(
        key_of(&charges[0]),
        key_of(&charges[1]),
        "the same gateway key"
    );
    assert_eq!(
        charges[0].body, charges[1].body,
        "the very same request: the gateway replays its charge"
    );
    assert!(pagos.journal_pending().await.is_empty(), "settled");
}

#[tokio::test]
async fn a_bad_flag_value_is_one_line_naming_it_and_exits_2() {
    let out = pagos_bin()
        .args(PAY_NOWHERE)
        .args(["--credito", "42", "--monto", "0", "--moneda", "COP"])
        .output()
        .expect("pagos pay");

    refused_naming(&out, "--monto", "PAGOS_MONTO");
}

/// `pagos pay` to an address where nothing listens (a refusal comes before any request).
const PAY_NOWHERE: &[&str] = &[
    "pay",
    "--url",
    "http://127.0.0.1:9",
    "--api-key",
    "sk_test_acme",
];

/// `out` is a bad setting's refusal: exit 2, one line naming `flag` and `env`.
fn refused_naming(out: &std::process::Output, flag: &str, env: &str) {
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{flag}: {stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(stderr.contains(flag) && stderr.contains(env), "{stderr}");
}

#[tokio::test]
async fn a_server_that_cannot_be_reached_fails_with_1_and_keeps_the_intent_for_resume() {
    let dir = tempfile::tempdir().expect("dir");
    let journal = dir.path().join("journal.db");
    // Nothing listens on a port just freed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();

    let out = pagos_bin()
        .args(["pay", "--url", &format!("http://127.0.0.1:{port}")])
        .args([
            "--api-key",
            "sk_test_acme",
            "--credito",
            "42",
            "--monto",
            "5",
        ])
        .args([
            "--moneda",
            "COP",
            "--deadline",
            "1s",
            "--retry-min-delay",
            "50ms",
        ])
        .arg("--journal")
        .arg(&journal)
        .output()
        .expect("pagos pay");

    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("cannot connect"), "{stderr}");
    assert!(
        stderr.contains("trying again with the same key"),
        "{stderr}"
    );
    assert!(stderr.contains("pagos pay --resume"), "{stderr}");
    assert!(out.stdout.is_empty());
    let kept = pagos_client::Journal::open(&journal)
        .await
        .expect("journal")
        .pending()
        .await
        .expect("pending");
    assert_eq!(kept.len(), 1);
}

#[tokio::test]
async fn pagos_pay_with_a_medio_pago_pays_through_stripe_and_without_one_is_refused() {
    let pagos = RealPagos::start_stripe().await;
    let payment = PAYMENT;

    let refused = pagos.pay().args(payment).output().await.expect("pagos pay");
    assert_eq!(refused.status.code(), Some(1), "{}", text(&refused.stderr));
    assert!(
        text(&refused.stderr).contains("medioPago"),
        "the server names what is missing: {}",
        text(&refused.stderr)
    );
    assert!(pagos.charges().await.is_empty(), "nothing reached Stripe");

    let paid = pagos
        .pay()
        .args(payment)
        .args([
            "--medio-pago",
            r#"{"id":"pm_1Q0PsIJvEtkwdCNYMSaVuRz6","cliente":"cus_NffrFeUfNV2Hib"}"#,
            "--json",
        ])
        .output()
        .await
        .expect("pagos pay");
    assert_eq!(paid.status.code(), Some(0), "{}", text(&paid.stderr));
    let shown: serde_json::Value = serde_json::from_slice(&paid.stdout).expect("one JSON line");
    assert_eq!(shown["estado"], "COMPLETADA");
    assert_eq!(shown["medioPago"]["id"], "pm_1Q0PsIJvEtkwdCNYMSaVuRz6");
    let charges = pagos.charges().await;
    assert_eq!(charges.len(), 1, "one PaymentIntent");
    let form: std::collections::HashMap<String, String> =
        url::form_urlencoded::parse(&charges[0].body)
            .into_owned()
            .collect();
    assert_eq!(form["payment_method"], "pm_1Q0PsIJvEtkwdCNYMSaVuRz6");
    assert_eq!(form["customer"], "cus_NffrFeUfNV2Hib");
    assert_eq!(form["amount"], "250000");
}

#[tokio::test]
async fn a_duration_beyond_any_sane_setting_is_one_line_naming_it_and_exits_2() {
    let dir = tempfile::tempdir().expect("dir");
    for (flag, env) in [
        ("--deadline", "PAGOS_DEADLINE"),
        ("--request-timeout", "PAGOS_REQUEST_TIMEOUT"),
        ("--retry-max-delay", "PAGOS_RETRY_MAX_DELAY"),
    ] {
        let out = pagos_bin()
            .args(PAY_NOWHERE)
            .args(PAYMENT)
            .args([flag, "300000000000y"])
            .arg("--journal")
            .arg(dir.path().join("journal.db"))
            .output()
            .expect("pagos pay");

        refused_naming(&out, flag, env);
    }
}

/// A deadline as long as the server's key retention (less the hundredth the client keeps
/// in hand) promises retries that could only leave after the server let the key go (and
/// so are never sent): refused at start.
#[tokio::test]
async fn a_deadline_not_shorter_than_the_key_retention_is_a_bad_setting_exit_2() {
    let dir = tempfile::tempdir().expect("dir");
    for (deadline, retention) in [
        ("1h", "1h"),
        ("2h", "1h"),
        ("25h", "24h"),
        ("23h50m", "24h"),
    ] {
        let mut pagos = pagos_bin();
        pagos
            .args(PAY_NOWHERE)
            .args(PAYMENT)
            .args(["--deadline", deadline])
            .arg("--journal")
            .arg(dir.path().join("journal.db"));
        if retention != "24h" {
            pagos.env("PAGOS_KEY_RETENTION", retention);
        }
        let out = pagos.output().expect("pagos pay");

        refused_naming(&out, "--deadline", "PAGOS_KEY_RETENTION");
    }
}

#[tokio::test]
async fn a_journal_that_cannot_be_opened_is_a_bad_setting_one_line_exit_2() {
    let dir = tempfile::tempdir().expect("dir");
    // Its parent is a file: no directory can be made there.
    let file = dir.path().join("not-a-directory");
    std::fs::write(&file, b"").expect("file");
    let journal = file.join("journal.db");
    let commands: [&[&str]; 3] = [
        PAY_NOWHERE,
        &["pay", "--resume", "--api-key", "sk_test_acme"],
        &[
            "refund",
            "--url",
            "http://127.0.0.1:9",
            "--api-key",
            "sk_test_acme",
        ],
    ];
    for command in commands {
        let mut pagos = pagos_bin();
        pagos.args(command).arg("--journal").arg(&journal);
        if command.contains(&"refund") {
            pagos.args(["--pago", "0193c4a2-7f1e-7c3a-9b0e-2a4d5f6e7a8b"]);
        } else if !command.contains(&"--resume") {
            pagos.args(PAYMENT);
        }
        let out = pagos.output().expect("pagos");

        refused_naming(&out, "--journal", "PAGOS_JOURNAL");
    }
}

/// `pagos pay` ran out its deadline; the operator runs the same command again. The
/// journal's intent for that payment may have paid: it is resumed with its key, never
/// made again under a new one. `--new` is the one way to a second payment.
#[tokio::test]
async fn pagos_pay_run_again_resumes_the_pending_intent_with_its_key_and_new_makes_another() {
    let pagos = RealPagos::start(Charge::Pending, Duration::ZERO).await;
    let first = pagos.pay_usual(&["--deadline", "1s"]).await;
    assert_eq!(first.status.code(), Some(4), "{}", text(&first.stderr));
    let kept = pagos.journal_pending().await;
    assert_eq!(kept.len(), 1);
    let key = kept[0].intent.key().to_string();

    let again = pagos.pay_usual(&["--deadline", "1s"]).await;

    let stderr = text(&again.stderr);
    assert_eq!(again.status.code(), Some(4), "{stderr}");
    assert!(
        stderr.contains(&format!("resumed with its Idempotency-Key {key}")),
        "{stderr}"
    );
    assert!(text(&again.stdout).contains(&key));
    assert_eq!(pagos.payments().await.len(), 1, "one payment, not two");
    assert_eq!(pagos.charges().await.len(), 1);
    assert_eq!(pagos.journal_pending().await.len(), 1);

    // The same payment, asked of the same server under another spelling of its URL:
    // the journal's intent is not sent from here, and no second one is made.
    let port = pagos.url.rsplit(':').next().expect("port");
    let elsewhere = tokio::process::Command::from(pagos_bin())
        .arg("pay")
        .args(["--url", &format!("http://localhost:{port}")])
        .args(["--api-key", API_KEY])
        .arg("--journal")
        .arg(pagos.journal_path())
        .args(PAYMENT)
        .output()
        .await
        .expect("pagos pay");
    let stderr = text(&elsewhere.stderr);
    assert_eq!(elsewhere.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&key) && stderr.contains("--new"),
        "{stderr}"
    );
    assert_eq!(pagos.payments().await.len(), 1, "nothing was sent");

    let new = pagos.pay_usual(&["--deadline", "1s", "--new"]).await;

    let stderr = text(&new.stderr);
    assert_eq!(new.status.code(), Some(4), "{stderr}");
    assert!(stderr.contains("--new: a new payment"), "{stderr}");
    let payments = pagos.payments().await;
    assert_eq!(payments.len(), 2, "--new makes a second payment");
    assert_ne!(payments[0].idempotency_key, payments[1].idempotency_key);
    assert_eq!(pagos.journal_pending().await.len(), 2);
}

/// Intents made with an API key since rotated away are not this key's to resume (the
/// journal cannot tell whether the two keys are one merchant's): `--resume` leaves them,
/// and says so with a failing exit, never "everything paid".
#[tokio::test]
async fn resume_with_another_api_key_leaves_the_intents_and_exits_1_naming_them() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("journal.db");
    let journal = pagos_client::Journal::open(&path).await.expect("journal");
    let url = pagos_client::base_url("http://127.0.0.1:9").expect("url");
    let request = pagos_client::PaymentRequest::new("42", 250_000, "COP").expect("valid");
    let intent = pagos_client::Intent::new(request);
    journal
        .record(&intent, &url, "sk_test_rotated_away")
        .await
        .expect("recorded");

    let out = tokio::process::Command::from(pagos_bin())
        .args(["pay", "--resume", "--api-key", API_KEY])
        .arg("--journal")
        .arg(&path)
        .output()
        .await
        .expect("pagos pay --resume");

    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("1 intent(s)"), "{stderr}");
    assert!(stderr.contains(intent.key().as_str()), "{stderr}");
    assert!(out.stdout.is_empty());
    assert_eq!(journal.pending().await.expect("pending").len(), 1);
}

/// `pagos refund` gave up with the outcome unknown (its request may have made the refund)
/// and the operator runs it again, with the server's URL spelled another way, or with the
/// merchant's second API key. The kept intent is not sent from there, and no new key goes
/// out: exit 1, naming the kept key. The same URL and key ask it again with its key;
/// `--new` is the one way to a second refund.
#[tokio::test]
async fn pagos_refund_run_again_under_another_url_or_api_key_sends_no_second_refund() {
    use wiremock::matchers::{method, path};
    use wiremock::{Mock, MockServer, ResponseTemplate};
    let server = MockServer::start().await;
    let payment = "0193c4a2-7f1e-7c3a-9b0e-2a4d5f6e7a8b";
    let refunds = format!("/v1/pagos/{payment}/reembolsos");
    Mock::given(method("POST"))
        .and(path(refunds.as_str()))
        .respond_with(ResponseTemplate::new(503).set_body_raw(
            r#"{"type":"/problems/service-unavailable","title":"Unavailable","status":503}"#,
            "application/problem+json",
        ))
        .mount(&server)
        .await;
    let dir = tempfile::tempdir().expect("dir");
    let journal = dir.path().join("journal.db");
    let port = server.address().port();
    let here = format!("http://127.0.0.1:{port}");
    let elsewhere = format!("http://localhost:{port}");
    let refund = |url: &str, api_key: &str, extra: &[&str]| {
        tokio::process::Command::from(pagos_bin())
            .arg("refund")
            .args(["--url", url, "--api-key", api_key])
            .arg("--journal")
            .arg(&journal)
            .args(["--pago", payment, "--monto", "1000"])
            .args(["--deadline", "2s", "--max-attempts", "1"])
            .args(extra)
            .output()
    };
    let keys_sent = || async {
        server
            .received_requests()
            .await
            .unwrap_or_default()
            .iter()
            .filter(|r| r.method.as_str() == "POST" && r.url.path() == refunds)
            .map(key_of)
            .collect::<Vec<_>>()
    };

    let first = refund(&here, API_KEY, &[]).await.expect("pagos refund");
    assert_eq!(first.status.code(), Some(1), "{}", text(&first.stderr));
    let sent = keys_sent().await;
    assert_eq!(sent.len(), 1);
    let key = sent[0].clone();

    for (url, api_key) in [(&elsewhere, API_KEY), (&here, "sk_test_acme_second")] {
        let out = refund(url, api_key, &[]).await.expect("pagos refund");

        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(
            stderr.contains(&key) && stderr.contains("--new"),
            "{stderr}"
        );
        assert_eq!(
            keys_sent().await,
            [key.as_str()],
            "{url}: nothing sent, no second refund: {stderr}"
        );
    }

    let again = refund(&here, API_KEY, &[]).await.expect("pagos refund");
    let stderr = text(&again.stderr);
    assert!(
        stderr.contains(&format!("asking again with its Idempotency-Key {key}")),
        "{stderr}"
    );
    assert_eq!(keys_sent().await, [key.as_str(), key.as_str()]);

    let new = refund(&elsewhere, API_KEY, &["--new"])
        .await
        .expect("pagos refund");
    let stderr = text(&new.stderr);
    assert!(stderr.contains("--new: a new refund"), "{stderr}");
    let sent = keys_sent().await;
    assert_eq!(sent.len(), 3);
    assert_ne!(sent[2], key, "--new sends a new key");
}
