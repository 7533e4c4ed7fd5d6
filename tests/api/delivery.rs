//! Deliveries to a merchant's endpoint over real HTTP, to a local receiver: what one
//! attempt sends and what each kind of answer (or none) means, the address guard with the
//! real resolver and with a name that answers differently each time, the example consumer
//! applying each event once behind a flaky endpoint, and the settings through the binary.
//! No database: the outbox and the worker build on this.

use crate::cli::pagos;
use crate::receiver::{Answer, Receiver};
use chrono::{DateTime, TimeDelta, Utc};
use futures::future::BoxFuture;
use pagos::delivery::guard::{Resolve, SystemResolver};
use pagos::delivery::schedule::{Failure, Next, Retries, Schedule};
use pagos::delivery::signing::Keys;
use pagos::delivery::{AddressPolicy, Attempt, Deliverer, Message, Outcome, Refusal, Secret};
use pagos_client::webhooks::{Applied, Verifier};
use serde_json::json;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use url::Url;

const TIMEOUT: Duration = Duration::from_secs(10);

fn deliverer(policy: AddressPolicy, timeout: Duration) -> Deliverer {
    Deliverer::with_resolver(policy, timeout, Arc::new(SystemResolver))
}

/// For local receivers: http and loopback allowed.
fn local() -> Deliverer {
    deliverer(AddressPolicy::AllowPrivate, TIMEOUT)
}

fn event(id: &str, payment: &str, secuencia: u64) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "id": id,
        "tipo": "pago.completado",
        "creadoEn": "2026-03-01T12:00:00Z",
        "secuencia": secuencia,
        "datos": {"id": payment, "estado": "COMPLETADA", "monto": 1500, "moneda": "CLP"},
    }))
    .expect("json")
}

fn url(text: &str) -> Url {
    Url::parse(text).expect("a URL")
}

async fn send(d: &Deliverer, to: &str, id: &str, body: &[u8], keys: &Keys) -> Attempt {
    d.deliver(&url(to), Message { id, body }, keys).await
}

fn failed() -> Outcome {
    Outcome::Failed { not_before: None }
}

#[tokio::test]
async fn a_2xx_is_delivered_signed_as_the_standard_webhooks_specification_says() {
    let receiver = Receiver::start().await;
    let secret = Secret::generate();
    let body = event("evt_01", "pay_1", 1);
    let attempt = send(
        &local(),
        &receiver.url("/hooks/pagos?src=x"),
        "evt_01",
        &body,
        &Keys::new(secret.clone()),
    )
    .await;

    assert_eq!(attempt.outcome, Outcome::Delivered);
    assert_eq!(attempt.status, Some(200));
    assert_eq!(attempt.answer, "ok");
    assert_eq!(attempt.error, None);
    assert_eq!(attempt.remote, Some(receiver.addr()));
    let seen = receiver.deliveries();
    assert_eq!(seen.len(), 1);
    let got = &seen[0];
    assert_eq!(got.path, "/hooks/pagos");
    assert_eq!(got.body.as_ref(), body.as_slice(), "the very bytes signed");
    assert_eq!(got.header("content-type"), "application/json");
    assert!(got.header("user-agent").starts_with("pagos-webhooks/"));
    assert_eq!(got.header("webhook-id"), "evt_01");
    assert_eq!(
        got.header("webhook-timestamp"),
        attempt.at.timestamp().to_string()
    );
    assert!(got.header("webhook-signature").starts_with("v1,"));
    standardwebhooks::Webhook::new(secret.expose())
        .expect("secret")
        .verify(&got.body, &got.headers)
        .expect("the reference verifier accepts what arrived");
}

#[tokio::test]
async fn every_attempt_of_an_event_carries_its_id_and_its_own_timestamp() {
    let receiver = Receiver::start().await;
    receiver.answer_next([Answer::Status(500, "oops".into())]);
    let keys = Keys::new(Secret::generate());
    let body = event("evt_02", "pay_2", 1);
    let d = local();
    let first = send(&d, &receiver.url("/"), "evt_02", &body, &keys).await;
    let second = send(&d, &receiver.url("/"), "evt_02", &body, &keys).await;
    assert_eq!(first.outcome, failed());
    assert_eq!(first.status, Some(500));
    assert_eq!(first.answer, "oops");
    assert_eq!(second.outcome, Outcome::Delivered);
    let seen = receiver.deliveries();
    assert_eq!(seen.len(), 2);
    for (got, attempt) in seen.iter().zip([&first, &second]) {
        assert_eq!(got.header("webhook-id"), "evt_02");
        assert_eq!(
            got.header("webhook-timestamp"),
            attempt.at.timestamp().to_string()
        );
    }
}

#[tokio::test]
async fn during_a_rotation_a_consumer_still_holding_the_old_secret_applies_the_delivery() {
    let receiver = Receiver::start().await;
    let (old, new) = (Secret::generate(), Secret::generate());
    receiver.consume(Verifier::new(old.expose()).expect("verifier"));
    let body = event("evt_03", "pay_3", 1);
    let d = local();
    let rotating = Keys::rotating(new.clone(), old.clone());
    let attempt = send(&d, &receiver.url("/"), "evt_03", &body, &rotating).await;
    assert_eq!(attempt.outcome, Outcome::Delivered);
    assert_eq!(receiver.applied().len(), 1);

    // After the overlap only the new secret signs: a consumer that never took it refuses.
    let body = event("evt_04", "pay_3", 2);
    let after = send(&d, &receiver.url("/"), "evt_04", &body, &Keys::new(new)).await;
    assert_eq!(after.outcome, failed());
    assert_eq!(after.status, Some(401));
    assert_eq!(receiver.applied().len(), 1);
}

#[tokio::test]
async fn after_two_rotations_a_consumer_still_holding_the_first_secret_applies_the_delivery() {
    let (a, b, c) = (Secret::generate(), Secret::generate(), Secret::generate());
    let d = local();
    for (n, held) in [&a, &b, &c].into_iter().enumerate() {
        let receiver = Receiver::start().await;
        receiver.consume(Verifier::new(held.expose()).expect("verifier"));
        let id = format!("evt_1{n}");
        let body = event(&id, "pay_9", 1);
        let keys = Keys::new(c.clone()).also(b.clone()).also(a.clone());
        let attempt = send(&d, &receiver.url("/"), &id, &body, &keys).await;
        assert_eq!(attempt.outcome, Outcome::Delivered, "secret {n}");
        assert_eq!(receiver.applied().len(), 1, "secret {n}");
        let seen = receiver.deliveries();
        assert_eq!(seen[0].header("webhook-signature").split(' ').count(), 3);
    }
}

#[tokio::test]
async fn a_redirect_is_never_followed_and_is_a_failed_attempt() {
    let receiver = Receiver::start().await;
    let elsewhere = Receiver::start().await;
    let d = local();
    let keys = Keys::new(Secret::generate());
    for code in [301, 302, 303, 307, 308] {
        receiver.answer_next([Answer::Redirect(code, elsewhere.url("/stolen"))]);
        let attempt = send(
            &d,
            &receiver.url("/"),
            "evt_05",
            &event("evt_05", "p", 1),
            &keys,
        )
        .await;
        assert_eq!(attempt.outcome, failed(), "{code}");
        assert_eq!(attempt.status, Some(code), "{code}");
    }
    assert_eq!(receiver.deliveries().len(), 5);
    assert!(
        elsewhere.deliveries().is_empty(),
        "the Location was never visited"
    );
}

#[tokio::test]
async fn a_410_gone_deactivates_the_endpoint_at_once() {
    let receiver = Receiver::start().await;
    receiver.answer_next([Answer::Status(410, "no such hook".into())]);
    let attempt = send(
        &local(),
        &receiver.url("/"),
        "evt_06",
        &event("evt_06", "p", 1),
        &Keys::new(Secret::generate()),
    )
    .await;
    assert_eq!(attempt.outcome, Outcome::Gone);
    assert_eq!(attempt.status, Some(410));
    assert_eq!(attempt.answer, "no such hook");
}

#[tokio::test]
async fn a_429_or_503_with_retry_after_is_honoured_by_the_schedule() {
    let receiver = Receiver::start().await;
    let retries = Retries {
        schedule: Schedule::parse(Schedule::DEFAULT).expect("schedule"),
        disable_after: Duration::from_secs(5 * 24 * 3600),
    };
    let d = local();
    let keys = Keys::new(Secret::generate());
    let body = event("evt_07", "p", 1);

    receiver.answer_next([Answer::RetryAfter(429, "120".into())]);
    let attempt = send(&d, &receiver.url("/"), "evt_07", &body, &keys).await;
    let expected = attempt.at + TimeDelta::seconds(120);
    assert_eq!(
        attempt.outcome,
        Outcome::Failed {
            not_before: Some(expected)
        }
    );
    let Outcome::Failed { not_before } = attempt.outcome else {
        unreachable!()
    };
    let after_first = Failure {
        attempt: 1,
        at: attempt.at,
        not_before,
    };
    // The schedule alone would try again after 4 to 6 seconds.
    assert_eq!(retries.after_failure(&after_first, 1.0), Next::At(expected));

    let date: DateTime<Utc> =
        DateTime::from_timestamp(Utc::now().timestamp() + 3600, 0).expect("a time");
    let http_date = httpdate::fmt_http_date(date.into());
    receiver.answer_next([Answer::RetryAfter(503, http_date)]);
    let attempt = send(&d, &receiver.url("/"), "evt_07", &body, &keys).await;
    assert_eq!(attempt.status, Some(503));
    assert_eq!(
        attempt.outcome,
        Outcome::Failed {
            not_before: Some(date)
        }
    );
    let after_second = Failure {
        attempt: 2,
        at: attempt.at,
        not_before: Some(date),
    };
    assert_eq!(retries.after_failure(&after_second, 0.5), Next::At(date));
}

#[tokio::test]
async fn an_endpoint_that_does_not_answer_within_the_timeout_is_a_failed_attempt() {
    let receiver = Receiver::start().await;
    receiver.answer_next([Answer::Hang(Duration::from_secs(60))]);
    // Long enough for the request to reach the receiver on a busy machine.
    let d = deliverer(AddressPolicy::AllowPrivate, Duration::from_secs(2));
    let attempt = send(
        &d,
        &receiver.url("/"),
        "evt_08",
        &event("evt_08", "p", 1),
        &Keys::new(Secret::generate()),
    )
    .await;
    assert_eq!(attempt.outcome, failed());
    assert_eq!(attempt.status, None);
    assert_eq!(attempt.error.as_deref(), Some("no answer within 2s"));
    assert_eq!(
        receiver.deliveries().len(),
        1,
        "it was sent, and not answered"
    );
}

#[tokio::test]
async fn a_refused_connection_is_a_failed_attempt_that_says_so() {
    let port = crate::process::free_port();
    let attempt = send(
        &local(),
        &format!("http://127.0.0.1:{port}/hook"),
        "evt_09",
        &event("evt_09", "p", 1),
        &Keys::new(Secret::generate()),
    )
    .await;
    assert_eq!(attempt.outcome, failed());
    assert_eq!(attempt.status, None);
    assert_eq!(attempt.error.as_deref(), Some("connection refused"));
}

#[tokio::test]
async fn a_connection_reset_before_the_answer_is_a_failed_attempt() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let resetter = tokio::spawn(async move {
        use tokio::io::AsyncReadExt;
        let (mut stream, _) = listener.accept().await.expect("accept");
        let mut buf = [0u8; 4096];
        let _ = stream.read(&mut buf).await;
        stream.set_zero_linger().expect("linger");
        drop(stream); // RST, no answer
    });
    let attempt = send(
        &local(),
        &format!("http://{addr}/hook?token=s3cr3t"),
        "evt_10",
        &event("evt_10", "p", 1),
        &Keys::new(Secret::generate()),
    )
    .await;
    resetter.await.expect("the resetter ran");
    assert_eq!(attempt.outcome, failed());
    assert_eq!(attempt.status, None);
    let error = attempt.error.expect("an error text");
    assert!(
        error.contains("reset") || error.contains("closed"),
        "{error}"
    );
    assert!(!error.contains("s3cr3t"), "never the URL: {error}");
}

#[tokio::test]
async fn the_answer_kept_is_its_first_kib_cut_on_a_character() {
    let receiver = Receiver::start().await;
    receiver.answer_next([Answer::Status(200, format!("x{}", "é".repeat(2000)))]);
    let attempt = send(
        &local(),
        &receiver.url("/"),
        "evt_11",
        &event("evt_11", "p", 1),
        &Keys::new(Secret::generate()),
    )
    .await;
    assert_eq!(attempt.outcome, Outcome::Delivered);
    assert_eq!(attempt.answer, format!("x{}", "é".repeat(511)));
    assert!(attempt.answer.len() <= 1024);
}

/// A resolver that answers `first` once, then `then`; counts its look-ups.
struct Rebinding {
    first: IpAddr,
    then: IpAddr,
    calls: AtomicUsize,
}

impl Resolve for Rebinding {
    fn resolve<'a>(
        &'a self,
        _host: &'a str,
        port: u16,
    ) -> BoxFuture<'a, std::io::Result<Vec<SocketAddr>>> {
        let ip = if self.calls.fetch_add(1, Ordering::SeqCst) == 0 {
            self.first
        } else {
            self.then
        };
        Box::pin(async move { Ok(vec![SocketAddr::new(ip, port)]) })
    }
}

#[tokio::test]
async fn loopback_urls_in_any_spelling_are_refused_and_nothing_is_sent() {
    let receiver = Receiver::start().await;
    let port = receiver.addr().port();
    let d = deliverer(AddressPolicy::PublicOnly, TIMEOUT);
    let keys = Keys::new(Secret::generate());
    for to in [
        format!("https://127.0.0.1:{port}/"),
        format!("https://localhost:{port}/"),
        format!("https://2130706433:{port}/"),
        format!("https://[::ffff:127.0.0.1]:{port}/"),
        format!("https://[::1]:{port}/"),
    ] {
        let attempt = send(&d, &to, "evt_12", &event("evt_12", "p", 1), &keys).await;
        assert_eq!(attempt.outcome, Outcome::Refused, "{to}");
        assert_eq!(attempt.status, None);
        let error = attempt.error.expect("why");
        // A name's refusal, which the merchant reads, names no address.
        let told = if to.contains("localhost") {
            error.starts_with("not sent: localhost does not resolve to a public address")
                && !error.contains("127.0.0.1")
        } else {
            error.starts_with("not sent: ") && error.contains("loopback")
        };
        assert!(told, "{to}: {error}");
    }
    let plain = send(
        &d,
        &receiver.url("/"),
        "evt_12",
        &event("evt_12", "p", 1),
        &keys,
    )
    .await;
    assert_eq!(
        plain.outcome,
        Outcome::Refused,
        "http:// only with private addresses allowed"
    );
    assert!(receiver.deliveries().is_empty());
}

#[tokio::test]
async fn registration_refuses_private_link_local_and_metadata_addresses_with_a_clear_reason() {
    let d = deliverer(AddressPolicy::PublicOnly, TIMEOUT);
    for (to, kind) in [
        (
            "https://169.254.169.254/latest/meta-data/",
            "link-local, cloud metadata",
        ),
        ("https://169.254.10.10/", "link-local"),
        ("https://10.0.0.1/hook", "private"),
        ("https://172.20.1.1/hook", "private"),
        ("https://192.168.0.10/hook", "private"),
        ("https://100.64.1.1/hook", "shared, carrier-grade NAT"),
        ("https://[fe80::1]/hook", "link-local"),
        ("https://[fd00::1]/hook", "unique-local, private"),
        ("https://[::ffff:10.0.0.1]/hook", "private"),
        ("https://0.0.0.0/hook", "unspecified"),
    ] {
        match d.check(&url(to)).await {
            Err(Refusal::Forbidden { kind: k, .. }) => assert_eq!(k, kind, "{to}"),
            other => panic!("{to}: {other:?}"),
        }
    }
    let refusal = d
        .check(&url("https://localhost/hook"))
        .await
        .expect_err("refused");
    let text = refusal.to_string();
    assert!(
        text.starts_with("localhost resolves to ")
            && text.contains("not a public address (loopback)"),
        "{text}"
    );
    let literal = d
        .check(&url("https://[::ffff:a9fe:a9fe]/"))
        .await
        .expect_err("refused");
    assert_eq!(
        literal.to_string(),
        "::ffff:169.254.169.254 is not a public address (link-local, cloud metadata): webhooks are delivered only to public addresses"
    );
}

#[tokio::test]
async fn a_public_looking_name_that_resolves_to_loopback_is_refused_unless_private_is_allowed() {
    let receiver = Receiver::start().await;
    let to = format!("http://hooks.merchant.test:{}/in", receiver.addr().port());
    let keys = Keys::new(Secret::generate());
    let body = event("evt_13", "p", 1);
    let to_loopback = || {
        Arc::new(Rebinding {
            first: receiver.ip(),
            then: receiver.ip(),
            calls: AtomicUsize::new(0),
        })
    };
    let guarded = Deliverer::with_resolver(AddressPolicy::PublicOnly, TIMEOUT, to_loopback());
    let https = to.replace("http://", "https://");
    let attempt = send(&guarded, &https, "evt_13", &body, &keys).await;
    assert_eq!(attempt.outcome, Outcome::Refused);
    assert!(
        attempt.error.as_deref().is_some_and(|e| e
            .contains("hooks.merchant.test does not resolve to a public address")
            && !e.contains("127.0.0.1")),
        "the stored attempt, which the merchant reads, names no address: {:?}",
        attempt.error
    );
    assert!(receiver.deliveries().is_empty());

    let open = Deliverer::with_resolver(AddressPolicy::AllowPrivate, TIMEOUT, to_loopback());
    let attempt = send(&open, &to, "evt_13", &body, &keys).await;
    assert_eq!(attempt.outcome, Outcome::Delivered);
    assert_eq!(receiver.deliveries().len(), 1);
}

#[tokio::test]
async fn the_connection_goes_to_the_address_checked_not_to_a_later_answer_of_the_name() {
    // Two receivers on one port, on two loopback addresses: the name answers the first
    // for the check, and the second for any later look-up (a rebinding).
    let checked = Receiver::start().await;
    let port = checked.addr().port();
    let rebound = Receiver::start_on(SocketAddr::from(([127, 0, 0, 2], port))).await;
    let resolver = Arc::new(Rebinding {
        first: checked.ip(),
        then: rebound.ip(),
        calls: AtomicUsize::new(0),
    });
    let d = Deliverer::with_resolver(AddressPolicy::AllowPrivate, TIMEOUT, resolver.clone());
    let to = format!("http://hooks.merchant.test:{port}/in");
    let keys = Keys::new(Secret::generate());

    let attempt = send(&d, &to, "evt_14", &event("evt_14", "p", 1), &keys).await;
    assert_eq!(attempt.outcome, Outcome::Delivered);
    assert_eq!(attempt.remote, Some(checked.addr()));
    assert_eq!(
        resolver.calls.load(Ordering::SeqCst),
        1,
        "one look-up: the guard's"
    );
    assert_eq!(checked.deliveries().len(), 1);
    assert!(rebound.deliveries().is_empty());

    // The next delivery checks again, and connects where that check said.
    let attempt = send(&d, &to, "evt_15", &event("evt_15", "p", 2), &keys).await;
    assert_eq!(attempt.remote, Some(rebound.addr()));
    assert_eq!(rebound.deliveries().len(), 1);
    assert_eq!(checked.deliveries().len(), 1);
}

#[tokio::test]
async fn behind_a_flaky_endpoint_every_event_arrives_and_the_consumer_applies_each_once() {
    let receiver = Receiver::start().await;
    let secret = Secret::generate();
    receiver.consume(Verifier::new(secret.expose()).expect("verifier"));
    // 30 % answered 500 without applying; 10 % applied, then no answer in time.
    receiver.flaky(0.3, 0.1, Duration::from_secs(30), 2024);
    let d = deliverer(AddressPolicy::AllowPrivate, Duration::from_secs(1));
    let keys = Keys::new(secret);
    let events: Vec<(String, Vec<u8>)> = (0..40)
        .map(|n| {
            let id = format!("evt_soak_{n:02}");
            let body = event(&id, &format!("pay_{}", n % 8), n / 8 + 1);
            (id, body)
        })
        .collect();

    let mut attempts = 0;
    for (id, body) in &events {
        // The schedule's waits are the worker's; here each retry follows at once.
        let mut delivered = false;
        for _ in 0..30 {
            attempts += 1;
            let attempt = send(&d, &receiver.url("/in"), id, body, &keys).await;
            if attempt.outcome == Outcome::Delivered {
                delivered = true;
                break;
            }
            assert_eq!(attempt.outcome, failed());
        }
        assert!(delivered, "{id} was delivered");
    }

    let applied = receiver.applied();
    let mut ids: Vec<&str> = applied.iter().map(|e| e.id.as_str()).collect();
    ids.sort_unstable();
    let expected: Vec<&str> = events.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(ids, expected, "every event applied exactly once");
    let seen = receiver.deliveries();
    // On a busy machine an attempt may time out before the receiver has seen it.
    assert!(
        seen.len() <= attempts && seen.len() > events.len(),
        "{} of {attempts}",
        seen.len()
    );
    let hung: Vec<_> = seen
        .iter()
        .filter(|r| matches!(r.answer, Answer::Hang(_)))
        .collect();
    let failed_500 = seen
        .iter()
        .filter(|r| matches!(r.answer, Answer::Status(500, _)))
        .count();
    assert!(!hung.is_empty() && failed_500 > 0, "the receiver was flaky");
    for h in hung {
        let id = h.header("webhook-id");
        assert!(
            seen.iter().any(
                |r| r.header("webhook-id") == id && r.decision == Some(Ok(Applied::Duplicate))
            ),
            "{id} was applied while its sender timed out, and its redelivery was a duplicate"
        );
    }
}

#[test]
fn a_bad_webhooks_setting_stops_serve_with_one_line_naming_it_and_exit_2() {
    let dir = tempfile::tempdir().expect("dir");
    let db = format!("sqlite://{}?mode=rwc", dir.path().join("x.db").display());
    let serve = [
        "serve",
        "--database-url",
        db.as_str(),
        "--bind",
        "127.0.0.1:0",
    ];
    for (env, value, flag) in [
        (
            "PAGOS_WEBHOOKS_SCHEDULE",
            "0s,5s,soon",
            "--webhooks-schedule",
        ),
        ("PAGOS_WEBHOOKS_SCHEDULE", "", "--webhooks-schedule"),
        ("PAGOS_WEBHOOKS_TIMEOUT", "0s", "--webhooks-timeout"),
        ("PAGOS_WEBHOOKS_TIMEOUT", "fast", "--webhooks-timeout"),
        (
            "PAGOS_WEBHOOKS_DISABLE_AFTER",
            "forever",
            "--webhooks-disable-after",
        ),
        (
            "PAGOS_WEBHOOKS_ALLOW_PRIVATE",
            "maybe",
            "--webhooks-allow-private",
        ),
    ] {
        let output = pagos(&serve, &[(env, value)]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{env}={value:?}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
        assert!(
            stderr.contains(env) && stderr.contains(flag),
            "names {env} and {flag}: {stderr}"
        );
        assert!(
            !dir.path().join("x.db").exists(),
            "refused before the database is opened"
        );
    }
}

#[test]
fn serve_help_documents_every_webhooks_setting() {
    crate::helpers::assert_contains_all(
        &crate::cli::serve_help(),
        &[
            "PAGOS_WEBHOOKS_TIMEOUT",
            "PAGOS_WEBHOOKS_SCHEDULE",
            "PAGOS_WEBHOOKS_DISABLE_AFTER",
            "PAGOS_WEBHOOKS_ALLOW_PRIVATE",
            "0s,5s,5m,30m,2h,5h,10h,10h",
        ],
    );
}
