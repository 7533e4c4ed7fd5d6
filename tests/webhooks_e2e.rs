//! End to end over the real binaries: `pagos serve` charging through `pagos
//! sandbox-gateway`, which settles half of its charges later and delivers every change
//! as a webhook — duplicated, delayed and reordered (`--chaos`). Every payment must end
//! final, moved there exactly once, with every event recorded exactly once.
//!
//! PostgreSQL when `PAGOS_TEST_POSTGRES_URL` is set (a fresh database), else SQLite.
//! `TEST_LOG=1` shows the children's logs.

#[path = "support/binary.rs"]
mod binary;
#[allow(dead_code)]
#[path = "api/helpers.rs"]
mod helpers;

use futures::StreamExt;
use helpers::{Backend, TestDatabase};
use pagos::entities::{payment, payment_transition, processed_message, webhook_charge};
use sea_orm::{ColumnTrait, DatabaseConnection, EntityTrait, PaginatorTrait, QueryFilter};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::time::{Duration, Instant};

const PAYMENTS: usize = 200;
const SECRET: &str = "whsec_e2e";
const API_KEY: &str = "sk_e2e_acme";

fn pagos(args: &[&str]) -> std::process::Command {
    binary::pagos(args, None)
}

async fn count_final(db: &DatabaseConnection) -> u64 {
    payment::Entity::find()
        .filter(payment::Column::State.is_in(["COMPLETADA", "FALLIDA"]))
        .count(db)
        .await
        .expect("count")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_hundred_payments_settle_once_each_under_chaotic_webhooks() {
    let (backend, backend_name) = match std::env::var("PAGOS_TEST_POSTGRES_URL") {
        Ok(url) if !url.is_empty() => (Backend::Postgres(url), "PostgreSQL"),
        _ => (Backend::Sqlite, "SQLite"),
    };
    let database = TestDatabase::create(&backend).await;
    let db_url = database.url.clone();

    binary::add_merchant(&db_url, "acme", API_KEY);

    let (serve_port, sandbox_port) = (binary::free_port(), binary::free_port());
    let serve_url = format!("http://127.0.0.1:{serve_port}");
    let sandbox_url = format!("http://127.0.0.1:{sandbox_port}");
    let sandbox_bind = format!("127.0.0.1:{sandbox_port}");
    let serve_bind = format!("127.0.0.1:{serve_port}");
    let webhook_url = format!("{serve_url}/v1/webhooks/http");
    let sandbox = pagos(&[
        "sandbox-gateway",
        "--bind",
        &sandbox_bind,
        "--webhook-url",
        &webhook_url,
        "--webhook-secret",
        SECRET,
        "--chaos",
        "--pending-rate",
        "0.5",
        "--decline-rate",
        "0.2",
        "--pending-for",
        "500ms",
        "--seed",
        "20261202",
    ])
    .spawn()
    .expect("sandbox starts");
    let mut children = vec![binary::Running(sandbox)];
    let serve = pagos(&[
        "serve",
        "--database-url",
        &db_url,
        "--bind",
        &serve_bind,
        "--gateway",
        "http",
        "--gateway-url",
        &sandbox_url,
        "--webhook-secret",
        SECRET,
        // Webhooks, not the reconciler, are what settles pending payments here.
        "--stale-after",
        "1h",
    ])
    .spawn()
    .expect("serve starts");
    children.push(binary::Running(serve));

    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client");
    let up = Duration::from_secs(60);
    binary::wait_until_up(&format!("{serve_url}/healthz"), up, String::new).await;
    binary::wait_until_up(&format!("{sandbox_url}/sandbox/stats"), up, String::new).await;

    // 200 payments, 16 at a time.
    let answers: Vec<(u16, Value)> = futures::stream::iter(0..PAYMENTS)
        .map(|i| {
            let http = http.clone();
            let url = format!("{serve_url}/v1/pagos");
            async move {
                let answer = http
                    .post(url)
                    .bearer_auth(API_KEY)
                    .header("Idempotency-Key", format!("e2e-{i}"))
                    .json(
                        &json!({"creditoId": format!("c-{i}"), "monto": 1000 + i, "moneda": "COP"}),
                    )
                    .send()
                    .await
                    .expect("payment sent");
                let status = answer.status().as_u16();
                (status, answer.json().await.expect("JSON answer"))
            }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    let mut by_status: HashMap<u16, usize> = HashMap::new();
    for (status, _) in &answers {
        *by_status.entry(*status).or_default() += 1;
    }
    assert!(
        by_status.keys().all(|s| [201, 202, 402].contains(s)),
        "answers: {by_status:?}"
    );

    let db = pagos::db::connect(&pagos::config::DatabaseArgs {
        url: db_url.clone(),
        pool_size: 2,
    })
    .await
    .expect("database");

    // Until every payment is final and every event acknowledged (bounded).
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut stats = binary::get_json(&http, &format!("{sandbox_url}/sandbox/stats")).await;
    loop {
        let settled = count_final(&db).await as usize == PAYMENTS;
        let webhooks = &stats["webhooks"];
        let delivered = webhooks["inFlight"] == 0
            && webhooks["events"] == webhooks["eventsAcknowledged"]
            && stats["pending"] == 0;
        if settled && delivered {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not settled within 120s: {} final of {PAYMENTS}; sandbox {stats}",
            count_final(&db).await
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        stats = binary::get_json(&http, &format!("{sandbox_url}/sandbox/stats")).await;
    }
    let webhooks = stats["webhooks"].clone();

    // The gateway: one charge per payment, none left pending.
    assert_eq!(stats["charges"], PAYMENTS, "{stats}");
    assert_eq!(stats["duplicatedReferences"], 0, "{stats}");

    // Every payment final, as its charge ended, moved there exactly once.
    let payments = payment::Entity::find().all(&db).await.expect("payments");
    assert_eq!(payments.len(), PAYMENTS);
    let transitions = payment_transition::Entity::find()
        .all(&db)
        .await
        .expect("transitions");
    let mut settled_by: HashMap<String, usize> = HashMap::new();
    for p in &payments {
        let charges = binary::get_json(
            &http,
            &format!("{sandbox_url}/v1/charges?reference={}", p.id),
        )
        .await;
        let charge = &charges["data"][0];
        let expected = match charge["status"].as_str() {
            Some("succeeded") => "COMPLETADA",
            Some("declined") => "FALLIDA",
            other => panic!("charge of {} is {other:?}", p.id),
        };
        assert_eq!(p.state, expected, "payment {}", p.id);
        assert_eq!(p.gateway_ref.as_deref(), charge["id"].as_str());
        let mine: Vec<_> = transitions
            .iter()
            .filter(|t| t.payment_id == p.id)
            .collect();
        let finals: Vec<_> = mine
            .iter()
            .filter(|t| t.to_state == "COMPLETADA" || t.to_state == "FALLIDA")
            .collect();
        assert_eq!(
            finals.len(),
            1,
            "payment {} moved to a final state once: {mine:?}",
            p.id
        );
        assert_eq!(mine.len(), 2, "sent, then settled: {mine:?}");
        assert!(mine.iter().all(|t| t.to_state != "REVISION_MANUAL"));
        *settled_by.entry(finals[0].actor.to_string()).or_default() += 1;
    }

    // Every event recorded once, whatever number of copies arrived.
    let events = webhooks["events"].as_u64().expect("events");
    let recorded = processed_message::Entity::find()
        .count(&db)
        .await
        .expect("count");
    assert_eq!(
        recorded, events,
        "one processed_messages row per distinct event"
    );
    let charge_rows = webhook_charge::Entity::find().all(&db).await.expect("rows");
    assert_eq!(charge_rows.len(), PAYMENTS, "one row per charge");
    assert!(
        charge_rows.iter().all(|c| c.payment_id.is_some()),
        "no orphans"
    );
    let settled_later = charge_rows.iter().filter(|c| c.last_sequence == 2).count();
    assert_eq!(
        events as usize,
        PAYMENTS + settled_later,
        "one event per charge, two for those that were pending"
    );
    assert!(
        webhooks["duplicates"].as_u64().is_some_and(|n| n > 0),
        "chaos duplicated some events: {webhooks}"
    );
    let results = &webhooks["results"];
    assert_eq!(
        results["aplicado"].as_u64().unwrap_or(0)
            + results["sin_cambios"].as_u64().unwrap_or(0)
            + results["obsoleto"].as_u64().unwrap_or(0)
            + results["duplicado"].as_u64().unwrap_or(0),
        webhooks["acknowledged"].as_u64().unwrap_or(0)
            + webhooks["acksDropped"].as_u64().unwrap_or(0),
        "every answer is one of the expected outcomes: {results}"
    );
    assert!(
        results["duplicado"].as_u64().is_some_and(|n| n > 0),
        "duplicates reached pagos: {results}"
    );
    assert_eq!(
        results["aplicado"].as_u64(),
        settled_by.get("webhook").map(|n| *n as u64),
        "each payment a webhook settled was settled by exactly one event: {results}"
    );
    assert!(
        settled_by.get("webhook").is_some_and(|n| *n > 0),
        "webhooks settled the pending payments: {settled_by:?}"
    );

    eprintln!(
        "chaos run ({backend_name}): answers {by_status:?}; final {}; settled by {settled_by:?}; \
         events {events}, processed_messages {recorded}; sandbox webhooks {webhooks}",
        payments
            .iter()
            .fold(HashMap::<&str, usize>::new(), |mut m, p| {
                *m.entry(p.state.as_str()).or_default() += 1;
                m
            })
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" "),
    );
    drop(children);
}
