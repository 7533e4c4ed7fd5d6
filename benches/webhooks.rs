//! Webhooks to merchants, measured: what the outbox and the delivery worker cost the
//! create path, and how many events per second one `pagos serve` delivers to a local
//! receiver. It prints; it never asserts.
//!
//! ```sh
//! cargo bench --bench webhooks                              # a short smoke on SQLite
//! cargo bench --bench webhooks -- --postgres-url postgres://postgres@127.0.0.1:5432/postgres \
//!     --duration 20s --events 5000 --baseline target/bench/pagos-without-outbox
//! ```
//!
//! 1. **create**: clients post fresh payments to `pagos serve` (in-process sandbox gateway)
//!    for `--duration`: with no endpoint (every final payment still writes its event), then
//!    with an endpoint that a local receiver answers (the worker delivering as payments
//!    come). With `--baseline`, the same with a binary built without the outbox
//!    (`cargo build --release --features bench-without-outbox`: the same code, but no
//!    transition writes an event): the target is create with the outbox ≥ 0.9 × without.
//! 2. **delivery**: `--events` events wait for an endpoint (it was deactivated while they
//!    were written); a reactivation with redelivery makes them all due at once, and the
//!    time until the receiver has them all gives events per second.
//!
//! Use a quiet machine and a release build (`cargo bench` builds one) for figures worth
//! writing down.

#![allow(clippy::print_stdout)] // the figures on stdout are this program's output

use anyhow::{Context, bail};
use axum::http::StatusCode;
use clap::Parser;
use sea_orm::ConnectionTrait;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

const API_KEY: &str = "sk_bench_webhooks";
const BODY: &str = r#"{"creditoId":"42","monto":250000,"moneda":"COP"}"#;

#[derive(Debug, Parser)]
#[command(about = "The outbox's cost on the create path and the delivery worker's events/s")]
struct Args {
    /// PostgreSQL allowed to create databases; unset: SQLite files in a temporary directory
    #[arg(long, env = "PAGOS_BENCH_POSTGRES_URL")]
    postgres_url: Option<String>,
    /// The pagos binary (default: the one `cargo bench` built)
    #[arg(long)]
    pagos: Option<PathBuf>,
    /// A pagos binary without the outbox, to compare the create path with
    #[arg(long)]
    baseline: Option<PathBuf>,
    /// Length of each create run
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Concurrent clients
    #[arg(long, default_value_t = 8)]
    clients: usize,
    /// Events delivered in the delivery run
    #[arg(long, default_value_t = 300)]
    events: usize,
    /// With --baseline: create runs of each binary, alternated (the median ratio is the figure)
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// `cargo bench` passes it; ignored
    #[arg(long, hide = true)]
    bench: bool,
}

/// A receiver that answers 200 (after a first `410` when asked), counting deliveries.
struct Receiver {
    addr: std::net::SocketAddr,
    received: Arc<AtomicU64>,
    gone_first: Arc<AtomicBool>,
}

async fn receiver() -> anyhow::Result<Receiver> {
    let received = Arc::new(AtomicU64::new(0));
    let gone_first = Arc::new(AtomicBool::new(false));
    let (count, gone) = (received.clone(), gone_first.clone());
    let app = axum::Router::new().fallback(move || {
        let (count, gone) = (count.clone(), gone.clone());
        async move {
            if gone.swap(false, Ordering::SeqCst) {
                return StatusCode::GONE;
            }
            count.fetch_add(1, Ordering::SeqCst);
            StatusCode::OK
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(Receiver {
        addr,
        received,
        gone_first,
    })
}

/// One `pagos serve` over a fresh database; killed on drop, its database dropped by
/// `close`.
struct Serve {
    child: Child,
    url: String,
    /// PostgreSQL: the admin URL and the database's name.
    database: Option<(String, String)>,
    _dir: tempfile::TempDir,
}

impl Serve {
    /// Stops `pagos serve` and drops its PostgreSQL database.
    async fn close(mut self) -> anyhow::Result<()> {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some((admin, name)) = self.database.take() {
            let db = sea_orm::Database::connect(admin.as_str()).await?;
            db.execute_unprepared(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                .await?;
        }
        Ok(())
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn fresh_database(
    args: &Args,
    dir: &Path,
) -> anyhow::Result<(String, Option<(String, String)>)> {
    Ok(match &args.postgres_url {
        None => (
            format!("sqlite://{}?mode=rwc", dir.join("pagos.db").display()),
            None,
        ),
        Some(admin) => {
            let name = format!("pagos_bench_webhooks_{}", uuid::Uuid::new_v4().simple());
            let db = sea_orm::Database::connect(admin.as_str()).await?;
            db.execute_unprepared(&format!("CREATE DATABASE {name}"))
                .await?;
            // Every run starts after a checkpoint, so none of them pays for the WAL the
            // previous runs left (a superuser's right; without it, runs start as they are).
            let _ = db.execute_unprepared("CHECKPOINT").await;
            let mut url = url::Url::parse(admin)?;
            url.set_path(&name);
            (url.to_string(), Some((admin.clone(), name)))
        }
    })
}

async fn serve(bin: &Path, args: &Args) -> anyhow::Result<Serve> {
    let dir = tempfile::tempdir()?;
    let (database, dropped_by_close) = fresh_database(args, dir.path()).await?;
    let run = |sub: &[&str]| -> anyhow::Result<()> {
        let out = Command::new(bin)
            .args(sub)
            .args(["--database-url", &database])
            .env("PAGOS_GATEWAY", "sandbox")
            .output()?;
        if !out.status.success() {
            bail!("pagos {sub:?}: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(())
    };
    run(&["migrate"])?;
    let add = Command::new(bin)
        .args(["merchants", "add", "bench", "--api-key", API_KEY])
        .args(["--database-url", &database])
        .env("PAGOS_GATEWAY", "sandbox")
        .output()?;
    if !add.status.success() {
        bail!(
            "pagos merchants add: {}",
            String::from_utf8_lossy(&add.stderr)
        );
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let child = Command::new(bin)
        .arg("serve")
        .args([
            "--database-url",
            &database,
            "--bind",
            &format!("127.0.0.1:{port}"),
        ])
        .env("PAGOS_GATEWAY", "sandbox")
        .env("PAGOS_WEBHOOKS_ALLOW_PRIVATE", "true")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting pagos serve")?;
    let serve = Serve {
        child,
        url: format!("http://127.0.0.1:{port}"),
        database: dropped_by_close,
        _dir: dir,
    };
    let http = reqwest::Client::new();
    for _ in 0..200 {
        if http
            .get(format!("{}/healthz", serve.url))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
        {
            return Ok(serve);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!("pagos serve did not come up")
}

async fn post(
    http: &reqwest::Client,
    base: &str,
    path: &str,
    body: &Value,
) -> anyhow::Result<Value> {
    let answer = http
        .post(format!("{base}{path}"))
        .bearer_auth(API_KEY)
        .json(body)
        .send()
        .await?;
    Ok(answer.json().await?)
}

/// Payments created per second by `clients` posting fresh keys for `duration`.
async fn creates_per_second(base: &str, clients: usize, duration: Duration) -> anyhow::Result<f64> {
    let http = reqwest::Client::new();
    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (http, base, done) = (http.clone(), base.to_owned(), done.clone());
        tasks.push(tokio::spawn(async move {
            while started.elapsed() < duration {
                let sent = http
                    .post(format!("{base}/v1/pagos"))
                    .bearer_auth(API_KEY)
                    .header("Idempotency-Key", uuid::Uuid::new_v4().to_string())
                    .header("Content-Type", "application/json")
                    .body(BODY)
                    .send()
                    .await;
                if sent.is_ok_and(|r| r.status() == 201) {
                    done.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for task in tasks {
        task.await?;
    }
    Ok(done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64())
}

async fn create(bin: &Path, args: &Args, deliver: bool) -> anyhow::Result<f64> {
    let serve = serve(bin, args).await?;
    let receiver = receiver().await?;
    if deliver {
        post(
            &reqwest::Client::new(),
            &serve.url,
            "/v1/webhook-endpoints",
            &json!({"url": format!("http://{}/", receiver.addr)}),
        )
        .await?;
    }
    // Warm up, then measure.
    creates_per_second(&serve.url, args.clients, Duration::from_millis(500)).await?;
    let rate = creates_per_second(&serve.url, args.clients, args.duration).await?;
    serve.close().await?;
    Ok(rate)
}

async fn delivery(bin: &Path, args: &Args) -> anyhow::Result<f64> {
    let serve = serve(bin, args).await?;
    let receiver = receiver().await?;
    let http = reqwest::Client::new();
    receiver.gone_first.store(true, Ordering::SeqCst);
    let since = chrono::Utc::now() - chrono::TimeDelta::seconds(1);
    let made = post(
        &http,
        &serve.url,
        "/v1/webhook-endpoints",
        &json!({"url": format!("http://{}/", receiver.addr)}),
    )
    .await?;
    let id = made["id"].as_str().context("endpoint id")?.to_owned();
    // The first event is answered 410: the endpoint goes down, and the rest wait for it.
    let mut written = 0;
    while written < args.events {
        let n = (args.events - written).min(args.clients * 8);
        let sends = (0..n).map(|_| {
            http.post(format!("{}/v1/pagos", serve.url))
                .bearer_auth(API_KEY)
                .header("Idempotency-Key", uuid::Uuid::new_v4().to_string())
                .header("Content-Type", "application/json")
                .body(BODY)
                .send()
        });
        for sent in futures::future::join_all(sends).await {
            if sent?.status() != 201 {
                bail!("a payment was not created");
            }
        }
        written += n;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started = Instant::now();
    post(
        &http,
        &serve.url,
        &format!("/v1/webhook-endpoints/{id}/reactivar"),
        &json!({"reenviarDesde": since.to_rfc3339()}),
    )
    .await?;
    let wanted = args.events as u64;
    while receiver.received.load(Ordering::SeqCst) < wanted {
        if started.elapsed() > Duration::from_secs(600) {
            bail!("deliveries did not finish within 10 minutes");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let rate = args.events as f64 / started.elapsed().as_secs_f64();
    serve.close().await?;
    Ok(rate)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let bin = args
        .pagos
        .clone()
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_pagos")));
    let database = if args.postgres_url.is_some() {
        "PostgreSQL"
    } else {
        "SQLite"
    };
    println!(
        "webhooks on {database}, {} clients, {:?} per create run, {} events delivered",
        args.clients, args.duration, args.events
    );
    let quiet = create(&bin, &args, false).await?;
    let delivering = create(&bin, &args, true).await?;
    println!("create, outbox on, no endpoint            {quiet:>10.0} payments/s");
    println!(
        "create, outbox on, worker delivering      {delivering:>10.0} payments/s  ({:.2} ×)",
        delivering / quiet
    );
    match &args.baseline {
        Some(baseline) => {
            // Alternated, so that both binaries meet the same machine, and in turn first
            // (with, without; without, with; …) so that neither always follows the
            // other: the first round reuses the run above.
            let mut ratios = Vec::new();
            for round in 0..args.rounds.max(1) {
                let (with, without) = if round == 0 {
                    (quiet, create(baseline, &args, false).await?)
                } else if round % 2 == 1 {
                    let without = create(baseline, &args, false).await?;
                    (create(&bin, &args, false).await?, without)
                } else {
                    let with = create(&bin, &args, false).await?;
                    (with, create(baseline, &args, false).await?)
                };
                println!(
                    "round {:>2}: outbox on {with:>6.0}/s, without (--baseline) {without:>6.0}/s  ({:.2} ×)",
                    round + 1,
                    with / without
                );
                ratios.push(with / without);
            }
            ratios.sort_by(f64::total_cmp);
            let middle = ratios.len() / 2;
            let ratio = if ratios.len() % 2 == 0 {
                (ratios[middle - 1] + ratios[middle]) / 2.0
            } else {
                ratios[middle]
            };
            println!(
                "outbox on / without, median of {}       {ratio:>10.2} ×  (target ≥ 0.90: {})",
                ratios.len(),
                if ratio >= 0.9 { "met" } else { "NOT met" }
            );
        }
        None => {
            println!("create without the outbox: pass --baseline <a pagos binary built without it>")
        }
    }
    let rate = delivery(&bin, &args).await?;
    println!("delivery to a local receiver              {rate:>10.0} events/s");
    Ok(())
}
