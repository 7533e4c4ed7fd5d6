//! Replays served from memory: a frozen answer never changes, so after the first replay
//! read from the database, the process answers the key's retries from its replay cache,
//! byte for byte, without the database (neither for the key nor for the API key).

use crate::helpers::{Backend, FakeGateway, Spawn, TestApp, payment_body};
use crate::on_both_databases;
use sea_orm::ConnectionTrait;
use serde_json::json;

on_both_databases!(
    replays_after_the_first_are_served_from_memory_byte_for_byte,
    a_replay_from_memory_reaches_no_database,
    with_no_replay_cache_every_replay_reads_the_database,
    the_same_request_written_otherwise_is_replayed_from_memory,
    without_the_cache_a_taken_key_gets_every_answer_from_its_stored_row,
    a_key_purged_by_a_process_of_shorter_retention_is_never_replayed_from_memory,
    a_pagos_serve_just_started_purges_expired_keys_at_its_reapers_first_run,
);

async fn answer(
    app: &TestApp,
    key: &str,
    body: &serde_json::Value,
) -> (u16, Option<String>, String) {
    let response = app.pay(key, body).await;
    let status = response.status().as_u16();
    let replayed = response
        .headers()
        .get("idempotent-replayed")
        .map(|v| v.to_str().expect("ascii").to_owned());
    (status, replayed, response.text().await.expect("body"))
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in\n{text}"))
}

/// `pagos_replays_total` of payments answered from `source` (`database`, `memory`).
fn payment_replays(text: &str, source: &str) -> f64 {
    metric(
        text,
        &format!("pagos_replays_total{{operation=\"payment\",source=\"{source}\"}}"),
    )
}

async fn scrape(app: &TestApp) -> String {
    app.http
        .get(app.url("/metrics"))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text")
}

async fn replays_after_the_first_are_served_from_memory_byte_for_byte(backend: Backend) {
    let app = Spawn::new(backend).start().await;
    app.with_fake(FakeGateway::charging("succeeded")).await;
    let (status, replayed, first) = answer(&app, "k-cache", &payment_body()).await;
    assert_eq!((status, replayed), (201, None));
    for _ in 0..3 {
        let (status, replayed, again) = answer(&app, "k-cache", &payment_body()).await;
        assert_eq!(status, 201);
        assert_eq!(replayed.as_deref(), Some("true"));
        assert_eq!(again, first, "the frozen answer, byte for byte");
    }
    // The key with another body is refused from memory as well.
    let other = json!({"creditoId": "1", "monto": 5, "moneda": "USD"});
    let (status, _, problem) = answer(&app, "k-cache", &other).await;
    assert_eq!(status, 422, "{problem}");
    assert!(problem.contains("idempotency-key-reused"), "{problem}");

    let text = scrape(&app).await;
    assert_eq!(payment_replays(&text, "database"), 1.0);
    assert_eq!(payment_replays(&text, "memory"), 2.0);
    let ratio = metric(&text, "pagos_replay_cache_hit_ratio");
    assert!((ratio - 2.0 / 3.0).abs() < 1e-9, "hit ratio {ratio}");
    assert_eq!(metric(&text, "pagos_replay_cache_entries"), 1.0);
    assert!(metric(&text, "pagos_replay_cache_bytes") > 0.0);
    assert_eq!(app.charges_seen().await.len(), 1, "one charge");
}

/// Memory keeps the body of the first replay, as sent, beside its answer and recognises
/// the same bytes without parsing them; the same request written otherwise (another key
/// order and spacing, escaped characters) is still the same request, from memory, through
/// its fingerprint.
async fn the_same_request_written_otherwise_is_replayed_from_memory(backend: Backend) {
    let app = Spawn::new(backend).start().await;
    app.with_fake(FakeGateway::charging("succeeded")).await;
    let (_, _, first) = answer(&app, "k-forms", &payment_body()).await;
    // Read from the database, then kept in memory with this body.
    assert_eq!(answer(&app, "k-forms", &payment_body()).await.2, first);
    for text in [
        r#"{ "moneda": "COP",  "monto": 250000, "creditoId": "42" }"#,
        r#"{"creditoId":"\u0034\u0032","monto":250000,"moneda":"\u0043OP"}"#,
    ] {
        let response = app
            .post_raw(
                crate::helpers::API_KEY,
                "/v1/pagos",
                &[
                    ("Idempotency-Key", "k-forms"),
                    ("Content-Type", "application/json"),
                ],
                text,
            )
            .await;
        assert_eq!(response.status(), 201, "{text}");
        assert_eq!(response.headers()["idempotent-replayed"], "true");
        assert_eq!(response.text().await.expect("body"), first, "{text}");
    }
    let other = json!({"creditoId": "42", "monto": 250001, "moneda": "COP"});
    let (status, _, problem) = answer(&app, "k-forms", &other).await;
    assert_eq!(status, 422, "{problem}");
    let text = scrape(&app).await;
    assert_eq!(payment_replays(&text, "memory"), 2.0);
    assert_eq!(app.charges_seen().await.len(), 1, "one charge");
}

/// Both tables a replay could read are renamed away: the cached replay still answers,
/// while anything that needs the database fails — proof that the replay did not touch it.
async fn break_the_tables(app: &TestApp) {
    for (from, to) in [
        ("idempotency_keys", "keys_away"),
        ("api_keys", "api_keys_away"),
    ] {
        app.db
            .execute_unprepared(&format!("ALTER TABLE {from} RENAME TO {to}"))
            .await
            .expect("rename");
    }
}

async fn a_replay_from_memory_reaches_no_database(backend: Backend) {
    let app = Spawn::new(backend).start().await;
    app.with_fake(FakeGateway::charging("succeeded")).await;
    let (_, _, first) = answer(&app, "k-away", &payment_body()).await;
    let (status, _, _) = answer(&app, "k-away", &payment_body()).await;
    assert_eq!(
        status, 201,
        "the first replay, read from the database, is kept"
    );
    break_the_tables(&app).await;

    let (status, replayed, again) = answer(&app, "k-away", &payment_body()).await;
    assert_eq!(
        (status, replayed.as_deref()),
        (201, Some("true")),
        "{again}"
    );
    assert_eq!(again, first);
    let (status, _, _) = answer(&app, "k-new", &payment_body()).await;
    assert!(status >= 500, "a new key needs the database: {status}");
}

async fn with_no_replay_cache_every_replay_reads_the_database(backend: Backend) {
    let app = crate::helpers::started(backend, &["--replay-cache-mib", "0"]).await;
    app.with_fake(FakeGateway::charging("succeeded")).await;
    answer(&app, "k-nocache", &payment_body()).await;
    answer(&app, "k-nocache", &payment_body()).await;
    break_the_tables(&app).await;
    let (status, _, _) = answer(&app, "k-nocache", &payment_body()).await;
    assert!(
        status >= 500,
        "without the cache a replay reads the database: {status}"
    );
    let text = scrape(&app).await;
    assert_eq!(payment_replays(&text, "database"), 1.0);
    assert_eq!(metric(&text, "pagos_replay_cache_entries"), 0.0);
}

/// Without the cache every retry reaches the database. On PostgreSQL a retry's
/// registration finds the key taken, writes nothing, and answers with the key's row in the
/// same statement: every answer the contract promises a retry comes from that row.
async fn without_the_cache_a_taken_key_gets_every_answer_from_its_stored_row(backend: Backend) {
    let app = crate::helpers::started(
        backend,
        &["--replay-cache-mib", "0", "--gateway-timeout", "10s"],
    )
    .await;
    let fake = app
        .with_fake(FakeGateway::charging("succeeded").with_delay(std::time::Duration::from_secs(3)))
        .await;
    // The retry comes while the gateway holds the first request's charge.
    let first = app.pay_in_background("k-taken");
    for _ in 0..200 {
        if !app.charges_seen().await.is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let (status, _, in_flight) = answer(&app, "k-taken", &payment_body()).await;
    assert_eq!(status, 409, "the first request holds the key: {in_flight}");
    let first = first.await.expect("task").expect("first request");
    assert_eq!(first.status(), 201);
    let first = first.text().await.expect("body");

    let (status, replayed, again) = answer(&app, "k-taken", &payment_body()).await;
    assert_eq!((status, replayed.as_deref()), (201, Some("true")));
    assert_eq!(again, first, "the frozen answer, byte for byte");
    let other = json!({"creditoId": "1", "monto": 5, "moneda": "USD"});
    let (status, _, reused) = answer(&app, "k-taken", &other).await;
    assert_eq!(status, 422, "{reused}");
    assert!(reused.contains("idempotency-key-reused"), "{reused}");

    assert_eq!(app.count_rows().await, (1, 1), "one key, one payment");
    assert_eq!(fake.total_charges(), 1, "charged once");
    let text = scrape(&app).await;
    assert_eq!(payment_replays(&text, "database"), 1.0);
}

/// A rolling deploy lowers `PAGOS_KEY_RETENTION`: process A (24 h) holds a key's answer in
/// memory when process B (here 1 s) starts beside it on the same database and its reaper
/// purges the key. The merchant reuses the key for a new payment through A: A must make
/// it (201, a new id), never replay the purged key's old payment from memory.
async fn a_key_purged_by_a_process_of_shorter_retention_is_never_replayed_from_memory(
    backend: Backend,
) {
    use pagos::entities::idempotency_key as keys;
    use sea_orm::{ColumnTrait, EntityTrait, PaginatorTrait, QueryFilter};
    let a = crate::helpers::started(backend, &["--retention-refresh", "200ms"]).await;
    a.with_fake(FakeGateway::charging("succeeded")).await;
    let (status, replayed, first) = answer(&a, "k-lowered", &payment_body()).await;
    assert_eq!((status, replayed), (201, None), "{first}");
    let first: serde_json::Value = serde_json::from_str(&first).expect("json");
    // Read from the database once, then from A's memory.
    for _ in 0..2 {
        let (status, replayed, _) = answer(&a, "k-lowered", &payment_body()).await;
        assert_eq!((status, replayed.as_deref()), (201, Some("true")));
    }
    assert_eq!(payment_replays(&scrape(&a).await, "memory"), 1.0);

    // B: 1 s of retention, serving (so recording it) and reaping beside A.
    let settings = crate::helpers::settings(
        a.database_url(),
        &[
            "--admin-token",
            crate::helpers::ADMIN_TOKEN,
            "--key-retention",
            "1s",
            "--retention-refresh",
            "200ms",
        ],
    );
    let gateway = pagos::app::gateway_from(&settings).expect("gateway");
    let b = pagos::app::build(a.db.clone(), settings, gateway);
    let (_addr, b_server) = crate::helpers::serve_in_background(b.clone()).await;
    let reaper = pagos::reaper::Reaper {
        db: b.db.clone(),
        metrics: b.metrics.clone(),
        key_retention: std::time::Duration::from_secs(1),
        message_retention: std::time::Duration::from_secs(7 * 86_400),
        batch: 100,
        cache: b.replay_cache.clone(),
        clock: pagos::reaper::SteadyClock::start(),
    };
    let (_stopping, stop) = tokio::sync::watch::channel(false);
    let key_left = || async {
        keys::Entity::find()
            .filter(keys::Column::Key.eq("k-lowered"))
            .count(&a.db)
            .await
            .expect("count")
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while key_left().await > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "B's reaper never purged the key"
        );
        pagos::reaper::run(&reaper, &stop).await.expect("reaper");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }

    // The key reused, for a new payment, through A.
    let other = json!({"creditoId": "43", "monto": 120000, "moneda": "COP"});
    let (status, replayed, again) = answer(&a, "k-lowered", &other).await;
    assert_eq!(
        (status, replayed.as_deref()),
        (201, None),
        "a new payment, not the purged key's: {again}"
    );
    let again: serde_json::Value = serde_json::from_str(&again).expect("json");
    assert_ne!(again["id"], first["id"], "a new payment");
    assert_eq!(payment_replays(&scrape(&a).await, "memory"), 1.0);
    assert_eq!(a.charges_seen().await.len(), 2, "two charges");
    b_server.abort();
}

/// A `pagos serve` just started purges the keys past their retention at its reaper's
/// first run, once the other processes had time to read its retention (two and a half
/// refreshes: half a second here), not at the next run (an hour on here: the reaper runs
/// beside the reconciler's hourly passes). The workers start beside the process's first
/// record of its retention, so the first run waits for that record too.
async fn a_pagos_serve_just_started_purges_expired_keys_at_its_reapers_first_run(backend: Backend) {
    use sea_orm::{EntityTrait, PaginatorTrait};
    let world = crate::process::World::new(backend, FakeGateway::charging("succeeded")).await;
    let mut args = world.crash_args();
    args.extend(["--retention-refresh", "200ms"].map(str::to_owned));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let keys = || pagos::entities::idempotency_key::Entity::find().count(&world.db);

    let mut first = crate::process::Serve::start(&args, &[]).await;
    let paid = reqwest::Client::new()
        .post(format!("{}/v1/pagos", first.url))
        .bearer_auth(crate::helpers::API_KEY)
        .header("Idempotency-Key", "k-purged-at-start")
        .json(&payment_body())
        .send()
        .await
        .expect("sent");
    assert_eq!(paid.status(), 201);
    first.terminate();
    first
        .exits_cleanly(std::time::Duration::from_secs(10), "after the payment")
        .await;
    assert_eq!(keys().await.expect("count"), 1);
    // Past the key's retention (24 h), and its payment's last move past it too.
    let then = pagos::db::now() - chrono::TimeDelta::days(3);
    use pagos::entities::{idempotency_key as key, payment};
    use sea_orm::{QueryFilter, sea_query::Expr};
    key::Entity::update_many()
        .col_expr(key::Column::CreatedAt, Expr::value(then))
        .filter(sea_orm::ColumnTrait::eq(
            &key::Column::Key,
            "k-purged-at-start",
        ))
        .exec(&world.db)
        .await
        .expect("key backdated");
    payment::Entity::update_many()
        .col_expr(payment::Column::CreatedAt, Expr::value(then))
        .col_expr(payment::Column::UpdatedAt, Expr::value(then))
        .exec(&world.db)
        .await
        .expect("payment backdated");

    let second = crate::process::Serve::start(&args, &[]).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while keys().await.expect("count") > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the expired key is still there 10 s after the start: {}",
            second.logs()
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(
        second
            .logs()
            .contains("idempotency keys past retention deleted"),
        "{}",
        second.logs()
    );
}

/// The host's clock steps forward by three days while pagos serves (NTP correcting a host
/// that booted behind, a clock set by hand): every key stamped before looks three days old.
/// Purged then, a key inside its retention (24 h) was forgotten, and the client's retry
/// with it made a second payment, charged again. The reaper ages rows on the time elapsed
/// since the process started: the key stays, the retry is replayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clock_stepped_forward_does_not_make_the_reaper_forget_keys_inside_their_retention() {
    use pagos::entities::idempotency_key as keys;
    use sea_orm::EntityTrait;
    let world =
        crate::process::World::new(Backend::Sqlite, FakeGateway::charging("succeeded")).await;
    let mut args = world.crash_args();
    // The reaper's first run waits two and a half refreshes (10 s): after the step.
    args.extend(["--retention-refresh", "4s"].map(str::to_owned));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let server =
        crate::process::Serve::start(&args, &[("PAGOS_CLOCK_STEP", "259200000:3000")]).await;
    let pay = || {
        reqwest::Client::new()
            .post(format!("{}/v1/pagos", server.url))
            .bearer_auth(crate::helpers::API_KEY)
            .header("Idempotency-Key", "k-before-the-step")
            .json(&payment_body())
            .send()
    };
    let paid = pay().await.expect("sent");
    assert_eq!(paid.status(), 201);
    let first: serde_json::Value = paid.json().await.expect("json");
    let stamped = keys::Entity::find()
        .one(&world.db)
        .await
        .expect("read")
        .expect("the key")
        .created_at;
    assert!(
        stamped < pagos::db::now() + chrono::TimeDelta::days(1),
        "paid before the step: {stamped}"
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(25);
    while !server.logs().contains("has gone ahead of the time elapsed") {
        assert!(
            std::time::Instant::now() < deadline,
            "no reaper run after the step: {}",
            server.logs()
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let again = pay().await.expect("sent");
    assert_eq!(again.status(), 201);
    assert_eq!(
        again
            .headers()
            .get("idempotent-replayed")
            .map(|v| v.as_bytes()),
        Some(&b"true"[..]),
        "replayed, not paid again: {}",
        server.logs()
    );
    let again: serde_json::Value = again.json().await.expect("json");
    assert_eq!(again["id"], first["id"]);
    assert_eq!(world.fake.total_charges(), 1, "one charge");
}
