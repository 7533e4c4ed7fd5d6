//! The doors (contract section 9): the header timeout against half-sent request heads,
//! the request timeout, load shedding past `PAGOS_MAX_IN_FLIGHT`, the admin door of
//! `PAGOS_ADMIN_BIND`, and `/metrics` that never queries the database.

use crate::helpers::{API_KEY, Backend, FakeGateway, TestApp, has_line, json, payment_body};
use crate::on_both_databases;
use crate::process::{Serve, free_port};
use serde_json::Value;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

on_both_databases!(
    a_request_longer_than_the_request_timeout_is_answered_503_and_its_payment_still_settles,
    past_max_in_flight_a_request_is_refused_at_once_and_stores_nothing,
    webhooks_sent_slowly_never_take_the_slots_payments_need,
    a_scrape_reads_memory_only_and_keeps_the_last_gauges_when_the_database_is_gone,
    the_gauges_follow_the_database_at_each_refresh,
);

const PROBLEM_JSON: &str = "application/problem+json";

fn sqlite_url(dir: &tempfile::TempDir) -> String {
    format!(
        "sqlite://{}?mode=rwc",
        dir.path().join("pagos.db").display()
    )
}

/// A client that opens a connection per request, so no pooled keep-alive connection is
/// reused after the server closed it.
fn fresh_connections() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(10))
        .build()
        .expect("client")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn half_sent_request_heads_are_closed_at_the_header_timeout_while_healthz_answers() {
    const CONNECTIONS: usize = 1_000;
    let header_timeout = Duration::from_secs(2);
    let dir = tempfile::tempdir().expect("dir");
    let serve = Serve::start(
        &["--database-url", &sqlite_url(&dir)],
        &[("PAGOS_HEADER_TIMEOUT", "2s")],
    )
    .await;
    let addr = serve.url.trim_start_matches("http://").to_owned();

    let mut loris = Vec::with_capacity(CONNECTIONS);
    for _ in 0..CONNECTIONS {
        let mut stream = tokio::net::TcpStream::connect(&addr)
            .await
            .expect("connected");
        stream
            .write_all(
                b"POST /v1/pagos HTTP/1.1\r\nHost: pagos\r\nContent-Type: application/json\r\n",
            )
            .await
            .expect("half a head sent");
        loris.push((stream, Instant::now()));
    }

    let all_closed = AtomicBool::new(false);
    let closing = async {
        let closed = futures::future::join_all(loris.into_iter().map(|(mut stream, sent)| {
            async move {
                let deadline =
                    tokio::time::Instant::from_std(sent + header_timeout + Duration::from_secs(1));
                let mut buf = [0u8; 512];
                loop {
                    match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
                        // Closed (a 408 may come first).
                        Ok(Ok(0) | Err(_)) => return true,
                        Ok(Ok(_)) => continue,
                        Err(_) => return false,
                    }
                }
            }
        }))
        .await;
        all_closed.store(true, Ordering::SeqCst);
        closed
    };
    let probing = async {
        let http = fresh_connections();
        let mut answered = 0;
        while !all_closed.load(Ordering::SeqCst) {
            let answer = http
                .get(format!("{}/healthz", serve.url))
                .send()
                .await
                .unwrap_or_else(|e| panic!("/healthz did not answer: {e}\n{}", serve.logs()));
            assert_eq!(answer.status(), 200, "/healthz while the connections hang");
            answered += 1;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        answered
    };
    let (closed, answered) = tokio::join!(closing, probing);
    let still_open = closed.iter().filter(|c| !**c).count();
    assert_eq!(
        still_open, 0,
        "connections still open past PAGOS_HEADER_TIMEOUT + 1 s"
    );
    assert!(answered > 0, "/healthz was probed while they hung");
}

/// pagos cutting requests at 1 s (`PAGOS_REQUEST_TIMEOUT`), with a gateway allowed 10 s
/// per call and no retry: a slow gateway outlasts the request.
async fn cut_after_a_second(backend: Backend) -> TestApp {
    crate::helpers::started(
        backend,
        &[
            "--request-timeout",
            "1s",
            "--gateway-timeout",
            "10s",
            "--gateway-retries",
            "0",
        ],
    )
    .await
}

async fn a_request_longer_than_the_request_timeout_is_answered_503_and_its_payment_still_settles(
    backend: Backend,
) {
    let app = cut_after_a_second(backend).await;
    let gateway_delay = Duration::from_secs(4);
    let fake = app
        .with_fake(FakeGateway::charging("succeeded").with_delay(gateway_delay))
        .await;

    let started = Instant::now();
    let answer = app.pay("k-slow", &payment_body()).await;
    assert!(
        started.elapsed() < gateway_delay,
        "answered before the gateway did"
    );
    assert_eq!(answer.status(), 503);
    assert_eq!(answer.headers()["content-type"], PROBLEM_JSON);
    assert!(answer.headers().contains_key("retry-after"));
    let problem = json(answer).await;
    assert_eq!(problem["type"], "/problems/request-timeout");
    assert!(
        crate::helpers::text_has(&problem, "detail", "same Idempotency-Key"),
        "{problem}"
    );

    // The saga goes on without the request: retries of the key wait for it (409), then
    // get the stored answer.
    let settled = retry_until_final(&app, "k-slow").await;
    assert_eq!(settled.0, 201);
    assert_eq!(settled.1.as_deref(), Some("true"), "the stored answer");
    assert_eq!(settled.2["estado"], "COMPLETADA");
    assert_eq!(fake.total_charges(), 1, "charged once");
    let id = settled.2["id"].as_str().expect("id");
    assert_eq!(app.payment(id).await.state, "COMPLETADA");
}

/// Retries `key` (honouring `Retry-After`) until it gets a final answer: status,
/// `Idempotent-Replayed`, body.
async fn retry_until_final(app: &TestApp, key: &str) -> (u16, Option<String>, Value) {
    for _ in 0..60 {
        let answer = app.pay(key, &payment_body()).await;
        let status = answer.status().as_u16();
        if status == 409 || status == 503 {
            let wait = answer
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(1);
            tokio::time::sleep(Duration::from_secs(wait)).await;
            continue;
        }
        let replayed = answer
            .headers()
            .get("idempotent-replayed")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        return (status, replayed, json(answer).await);
    }
    panic!("{key} never got a final answer");
}

async fn past_max_in_flight_a_request_is_refused_at_once_and_stores_nothing(backend: Backend) {
    let app = crate::helpers::started(
        backend,
        &[
            "--max-in-flight",
            "2",
            "--gateway-timeout",
            "10s",
            "--gateway-retries",
            "0",
        ],
    )
    .await;
    let gateway_delay = Duration::from_secs(3);
    let fake = app
        .with_fake(FakeGateway::charging("succeeded").with_delay(gateway_delay))
        .await;

    let body = payment_body();
    let in_flight = async { tokio::join!(app.pay("k-1", &body), app.pay("k-2", &body)) };
    let third = async {
        for _ in 0..500 {
            if fake.total_charges() == 2 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(
            fake.total_charges(),
            2,
            "both first payments at the gateway"
        );
        let started = Instant::now();
        let refused = app.pay("k-3", &payment_body()).await;
        let waited = started.elapsed();
        let healthz = app.get("/healthz").await;
        let metrics = app.get("/metrics").await;
        let stored = app.count_rows().await;
        (refused, waited, healthz, metrics, stored)
    };
    let ((first, second), (refused, waited, healthz, metrics, stored)) =
        tokio::join!(in_flight, third);

    assert!(waited < gateway_delay, "refused at once, not queued");
    assert_eq!(refused.status(), 503);
    assert_eq!(refused.headers()["content-type"], PROBLEM_JSON);
    assert!(refused.headers().contains_key("retry-after"));
    assert_eq!(json(refused).await["type"], "/problems/overloaded");
    assert_eq!(stored, (2, 2), "the refused request stored nothing");
    assert_eq!(healthz.status(), 200, "liveness is never shed");
    assert_eq!(metrics.status(), 200, "metrics are never shed");
    let metrics = metrics.text().await.expect("text");
    assert!(
        has_line(&metrics, "pagos_http_requests_in_flight 2"),
        "{metrics}"
    );
    assert!(
        has_line(
            &metrics,
            "pagos_http_limited_total{limit=\"max_in_flight\"} 1"
        ),
        "{metrics}"
    );
    assert_eq!(first.status(), 201);
    assert_eq!(second.status(), 201);

    let again = app.pay("k-3", &payment_body()).await;
    assert_eq!(again.status(), 201, "the same key works once there is room");
    assert!(again.headers().get("idempotent-replayed").is_none());
    assert_eq!(fake.total_charges(), 3);
}

/// Anyone can POST a webhook (its signature is over the body) or the console's login
/// form: before, a body sent a byte at a time held a `PAGOS_MAX_IN_FLIGHT` slot until
/// `PAGOS_REQUEST_TIMEOUT`, and as many slow clients as slots stopped every payment
/// (`503 overloaded`). Now such bodies are read first, in slots of their own (a quarter of
/// the limit: here one), and within `PAGOS_HEADER_TIMEOUT` (408 past it): payments go on.
async fn webhooks_sent_slowly_never_take_the_slots_payments_need(backend: Backend) {
    let app = crate::helpers::started(
        backend,
        &[
            "--max-in-flight",
            "4",
            "--header-timeout",
            "2s",
            "--webhook-secret",
            "whsec_x",
        ],
    )
    .await;
    let _fake = app.with_fake(FakeGateway::charging("succeeded")).await;
    let addr = app.url("").trim_start_matches("http://").to_owned();
    let mut slow = Vec::new();
    for path in ["/v1/webhooks/http"; 3]
        .into_iter()
        .chain(["/consola/login"; 3])
    {
        let mut stream = tokio::net::TcpStream::connect(&addr)
            .await
            .expect("connected");
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: pagos\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{\"id\":"
        );
        stream
            .write_all(head.as_bytes())
            .await
            .expect("head and a few bytes sent");
        slow.push(stream);
    }
    // Time for every head to be read and routed.
    tokio::time::sleep(Duration::from_millis(300)).await;

    let paid = app.pay("k-beside-slow-webhooks", &payment_body()).await;
    assert_eq!(paid.status(), 201, "payments go on beside slow bodies");

    // One was being read, its slot taken; the others were refused at once. The one read
    // is answered 408 at the header timeout, not held to the request timeout.
    let mut answers = Vec::new();
    for mut stream in slow {
        let mut buf = Vec::new();
        let status_line = async {
            let mut chunk = [0u8; 1024];
            while !buf.windows(2).any(|w| w == b"\r\n") {
                match stream.read(&mut chunk).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(10), status_line).await;
        let text = String::from_utf8_lossy(&buf).into_owned();
        answers.push(text.lines().next().unwrap_or_default().to_owned());
    }
    let timed_out = answers.iter().filter(|a| a.contains(" 408 ")).count();
    let shed = answers.iter().filter(|a| a.contains(" 503 ")).count();
    assert_eq!((timed_out, shed), (1, 5), "{answers:?}");
    let metrics = app.get("/metrics").await.text().await.expect("text");
    assert!(
        has_line(
            &metrics,
            "pagos_http_limited_total{limit=\"unauthenticated\"} 5"
        ),
        "{metrics}"
    );
    assert!(
        has_line(
            &metrics,
            "pagos_http_limited_total{limit=\"body_timeout\"} 1"
        ),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_an_admin_bind_admin_paths_and_metrics_answer_only_on_the_admin_address() {
    let dir = tempfile::tempdir().expect("dir");
    let admin_addr = format!("127.0.0.1:{}", free_port());
    let serve = Serve::start(
        &["--database-url", &sqlite_url(&dir)],
        &[
            ("PAGOS_ADMIN_BIND", admin_addr.as_str()),
            ("PAGOS_ADMIN_TOKEN", "t0ken-of-the-admin-door"),
        ],
    )
    .await;
    let public = serve.url.clone();
    let admin = format!("http://{admin_addr}");
    let http = fresh_connections();
    let get = |url: String| {
        let http = http.clone();
        async move {
            http.get(url)
                .bearer_auth("t0ken-of-the-admin-door")
                .send()
                .await
                .expect("sent")
        }
    };
    let pay = |base: &str| {
        http.post(format!("{base}/v1/pagos"))
            .bearer_auth(pagos::app::DEMO_API_KEY)
            .header("Idempotency-Key", "k-doors")
            .json(&payment_body())
            .send()
    };

    let paid = pay(&public).await.expect("sent");
    assert_eq!(paid.status(), 201, "payments on the public door");
    let id = json(paid).await["id"].as_str().expect("id").to_owned();
    let elsewhere = pay(&admin).await.expect("sent");
    assert_eq!(elsewhere.status(), 404, "no payments on the admin door");
    assert_eq!(elsewhere.headers()["content-type"], PROBLEM_JSON);

    let on_admin = get(format!("{admin}/admin/pagos?estado=COMPLETADA")).await;
    assert_eq!(on_admin.status(), 200);
    assert!(json(on_admin).await.to_string().contains(&id));
    let scraped = get(format!("{admin}/metrics")).await;
    assert_eq!(scraped.status(), 200);
    assert!(
        scraped
            .text()
            .await
            .expect("text")
            .contains("pagos_payments{")
    );

    for path in [
        "/admin/pagos?estado=COMPLETADA",
        "/admin/cargos-huerfanos",
        "/metrics",
        "/consola/pagos",
    ] {
        let answer = get(format!("{public}{path}")).await;
        assert_eq!(answer.status(), 404, "{path} on the public door");
        assert_eq!(answer.headers()["content-type"], PROBLEM_JSON, "{path}");
    }
    for base in [&public, &admin] {
        assert_eq!(get(format!("{base}/healthz")).await.status(), 200, "{base}");
    }
}

async fn a_scrape_reads_memory_only_and_keeps_the_last_gauges_when_the_database_is_gone(
    backend: Backend,
) {
    let app = crate::helpers::started_sandbox(backend, &["--metrics-refresh", "1h"]).await;
    let before = app
        .scrape_until("the refresh at start", |m| {
            has_line(m, "pagos_database_up 1")
        })
        .await;
    assert!(has_line(&before, "pagos_payments{estado=\"COMPLETADA\"} 0"));
    let paid = app.pay_as(API_KEY, "k-1", &payment_body()).await;
    assert_eq!(paid.status(), 201);

    let after = app.scrape_until("a scrape", |_| true).await;
    assert!(
        has_line(&after, "pagos_payments{estado=\"COMPLETADA\"} 0"),
        "a scrape shows the last refresh, it does not read the database:\n{after}"
    );
    app.db.clone().close().await.expect("close pool");
    let gone = app.scrape_until("a scrape", |_| true).await;
    assert!(has_line(&gone, "pagos_database_up 1"), "{gone}");
    assert!(
        has_line(&gone, "pagos_payments{estado=\"COMPLETADA\"} 0"),
        "{gone}"
    );
    assert!(gone.contains("(read from the database every 1h, not at scrape time)"));
}

async fn the_gauges_follow_the_database_at_each_refresh(backend: Backend) {
    let app = crate::helpers::started_sandbox(backend, &["--metrics-refresh", "100ms"]).await;
    assert_eq!(app.pay("k-1", &payment_body()).await.status(), 201);
    app.scrape_until("the new payment", |m| {
        has_line(m, "pagos_payments{estado=\"COMPLETADA\"} 1") && has_line(m, "pagos_database_up 1")
    })
    .await;
    app.db.clone().close().await.expect("close pool");
    app.scrape_until("the database down and no stale gauges", |m| {
        has_line(m, "pagos_database_up 0") && !m.contains("pagos_payments{")
    })
    .await;
}

on_both_databases!(an_on_call_request_cut_at_the_request_timeout_says_its_work_goes_on);

/// On-call asks for a pass that outlasts `PAGOS_REQUEST_TIMEOUT` (a slow provider): the
/// answer is the 503 `request-timeout` problem, and it says what is true for on-call —
/// the pass goes on and its work is not lost, read the payment before asking again — not
/// a merchant's "retry with the same Idempotency-Key". The pass does go on: the payment
/// is settled after the answer.
async fn an_on_call_request_cut_at_the_request_timeout_says_its_work_goes_on(backend: Backend) {
    let app = cut_after_a_second(backend).await;
    let fake = app
        .with_fake(FakeGateway::charging("pending").with_lookup_delay(Duration::from_secs(3)))
        .await;
    let answer = app.pay("k-pending", &payment_body()).await;
    assert_eq!(answer.status(), 202);
    let id = json(answer).await["id"].as_str().expect("id").to_owned();
    fake.settle_all("succeeded");

    let cut = app
        .post_as(
            crate::helpers::ADMIN_TOKEN,
            "/admin/reconciliaciones",
            &serde_json::json!({ "pagoId": id }),
        )
        .await;
    assert_eq!(cut.status(), 503);
    let problem = json(cut).await;
    assert_eq!(problem["type"], "/problems/request-timeout");
    let detail = problem["detail"].as_str().unwrap_or_default();
    assert!(detail.contains("goes on"), "{problem}");
    assert!(detail.contains("GET /admin/pagos"), "{problem}");
    assert!(!detail.contains("Idempotency-Key"), "{problem}");

    let mut settled = app.payment(&id).await;
    for _ in 0..100 {
        if settled.state != "ENVIADA" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        settled = app.payment(&id).await;
    }
    assert_eq!(
        settled.state, "COMPLETADA",
        "the pass went on after the answer"
    );
}
