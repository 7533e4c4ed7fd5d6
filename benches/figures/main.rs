//! The figures of `benches/run.sh`: pagos measured next to what PostgreSQL itself does on
//! the same machine, each figure printed next to its target. It prints; it never asserts.
//!
//! One run, in this order, over fresh databases dropped at the end:
//! 1. create: pgbench runs the textbook saga's SQL (`benches/pgbench/seed.sql`, a fixed
//!    yardstick), then the create path's SQL (`benches/pgbench/create.sql`), then wrk
//!    posts a fresh key per request to `pagos serve` (in-process sandbox, zero latency);
//!    `pg_stat_database` is read around each, and pagos' peak RSS after;
//! 2. replay: pgbench's point select of one completed key row, then wrk replaying it;
//!    both phases in rounds (`--throughput-rounds`), each with its own `pagos serve`, the
//!    ratios the medians of the rounds';
//! 3. database work: another `pagos serve` reaches PostgreSQL through a counting relay
//!    (`relay.rs`): statements, commits and round trips per payment and per replay;
//! 4. reconciler: a backlog of 100,000 ENVIADA payments (as an outage leaves them)
//!    settled by one `pagos reconcile --once` against a provider whose look-ups take
//!    20 ms (`lookup.rs`), then the same backlog by two processes side by side; three
//!    rounds of both, each figure the median (the machine drifts from minute to minute);
//! 5. grown: an empty database and one filled by SQL with 10 million finished payments and
//!    their keys (`grown.rs`), create and replay measured on each in alternating rounds;
//! 6. purge: creates on the filled database while the key reaper deletes its oldest day
//!    of keys (a million), next to the same creates with nothing to purge.
//!
//! `docs/benchmarks.md` says what each figure means.

#![allow(clippy::print_stdout)] // the table on stdout is this program's output

mod grown;
mod lookup;
mod relay;
mod tools;

use anyhow::{Context, bail};
use clap::Parser;
use futures::StreamExt;
use sea_orm::{ConnectionTrait, Database, DatabaseConnection};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};
use tools::{Load, count, db_stats, pagos_output, pgbench, serve, wrk};

const API_KEY: &str = "sk_bench";
const BODY: &str = r#"{"creditoId":"42","monto":250000,"moneda":"COP"}"#;
const REPLAY_KEY: &str = "bench-replay";
/// An idle backend flushes its statistics to `pg_stat_database` within 10 s.
const STATS_SETTLE: Duration = Duration::from_secs(11);

#[derive(Debug, Parser)]
#[command(about = "pagos against the physical limit: prints the figures of docs/benchmarks.md")]
struct Args {
    /// A PostgreSQL URL allowed to create and drop databases
    #[arg(
        long,
        env = "PAGOS_BENCH_POSTGRES_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/postgres"
    )]
    postgres_url: String,
    /// The pagos binary to measure (benches/run.sh passes the plain release build)
    #[arg(long, env = "PAGOS_BENCH_BIN")]
    pagos: Option<PathBuf>,
    /// Length of each measured wrk and pgbench run
    #[arg(long, default_value = "20s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Length of the warm-up runs
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    warmup: Duration,
    /// wrk connections and pgbench clients
    #[arg(long, default_value_t = 16)]
    connections: u32,
    /// wrk and pgbench threads
    #[arg(long, default_value_t = 2)]
    threads: u32,
    /// Payments created (and replays made) through the counting relay
    #[arg(long, default_value_t = 2000)]
    counted: usize,
    /// ENVIADA payments the reconciler settles
    #[arg(long, default_value_t = 100_000)]
    reconcile_payments: u32,
    /// Latency of one provider look-up
    #[arg(long, default_value = "20ms", value_parser = humantime::parse_duration)]
    lookup_latency: Duration,
    /// The reconciler's look-up concurrency (PAGOS_RECONCILE_CONCURRENCY)
    #[arg(long, default_value_t = 64)]
    reconcile_concurrency: u32,
    /// Payments (and keys) of the filled database of the grown and purge phases
    #[arg(long, default_value_t = 10_000_000)]
    grown_payments: u64,
    /// Rounds of the throughput phase: each runs the textbook saga's SQL, the mirror
    /// script and wrk's creates, then the point select and wrk's replays; the ratios are
    /// the medians of the rounds' ratios
    #[arg(long, default_value_t = 3)]
    throughput_rounds: usize,
    /// Rounds of the grown phase (each measures both databases)
    #[arg(long, default_value_t = 3)]
    grown_rounds: usize,
    /// The reaper's batch in the purge phase (PAGOS_PURGE_BATCH)
    #[arg(long, default_value_t = 1000)]
    purge_batch: u64,
    /// Rounds of the reconciler phase (one process, then two, each round); the figures are
    /// the medians
    #[arg(long, default_value_t = 3)]
    reconcile_rounds: usize,
    /// Extra flags for `pagos reconcile --once` (e.g. "--database-pool-size 32")
    #[arg(long, allow_hyphen_values = true, default_value = "")]
    reconcile_flags: String,
    /// Keep the reconcile pass's log (RUST_LOG=info) in this file
    #[arg(long)]
    reconcile_log: Option<PathBuf>,
    /// Run only these phases (comma-separated: throughput, work, reconciler, grown,
    /// purge; purge needs grown)
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "throughput,work,reconciler,grown,purge"
    )]
    only: Vec<String>,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("benchmark failed: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn say(what: &str) {
    eprintln!("==> {what}");
}

/// Databases made for this run, dropped when it ends however it ends.
struct Databases {
    admin_url: String,
    names: Vec<String>,
}

impl Databases {
    async fn create(&mut self, admin: &DatabaseConnection) -> anyhow::Result<(String, String)> {
        let name = format!(
            "pagos_bench_{}",
            &uuid::Uuid::new_v4().simple().to_string()[..12]
        );
        admin
            .execute_unprepared(&format!("CREATE DATABASE {name}"))
            .await
            .context("creating the benchmark database")?;
        self.names.push(name.clone());
        let mut url = url::Url::parse(&self.admin_url)?;
        url.set_path(&name);
        Ok((name, url.to_string()))
    }
}

impl Drop for Databases {
    fn drop(&mut self) {
        let (admin_url, names) = (self.admin_url.clone(), std::mem::take(&mut self.names));
        let _ = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async {
                if let Ok(admin) = Database::connect(admin_url.as_str()).await {
                    for name in names {
                        let _ = admin
                            .execute_unprepared(&format!(
                                "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
                            ))
                            .await;
                    }
                    let _ = admin.close().await;
                }
            });
        })
        .join();
    }
}

/// A database with pagos' schema and the benchmark merchant.
async fn prepared_database(
    bin: &Path,
    databases: &mut Databases,
    admin: &DatabaseConnection,
) -> anyhow::Result<(String, String, DatabaseConnection, String)> {
    let (name, url) = databases.create(admin).await?;
    pagos_output(bin, &["migrate", "--database-url", &url])?;
    pagos_output(
        bin,
        &[
            "merchants",
            "add",
            "bench",
            "--api-key",
            API_KEY,
            "--database-url",
            &url,
        ],
    )?;
    let db = Database::connect(url.as_str()).await?;
    let merchant = db
        .query_one_raw(sea_orm::Statement::from_string(
            sea_orm::DbBackend::Postgres,
            "SELECT id::text FROM merchants",
        ))
        .await?
        .context("no merchant")?
        .try_get_by_index::<String>(0)?;
    Ok((name, url, db, merchant))
}

/// One round of the throughput phase: each rate measured right after its yardstick.
struct Round {
    /// pagos' creates/s, the mirror script's and the textbook saga's transactions/s.
    create: f64,
    mirror: f64,
    seed: f64,
    /// pagos' replays/s and pgbench's point selects/s.
    replay: f64,
    select: f64,
    /// pagos' own CPU time (user and system) per create and per replay, in µs.
    cpu_per_create_us: f64,
    cpu_per_replay_us: f64,
    /// wrk's non-2xx answers and socket errors, pgbench's failed transactions.
    errors: u64,
    failed: u64,
}

#[derive(Default)]
struct Figures {
    /// Each round's rates; the table's ratios are the medians of theirs.
    rounds: Vec<Round>,
    pg_create: tools::PgbenchResult,
    /// The textbook saga's SQL (`benches/pgbench/seed.sql`): the fixed yardstick.
    pg_seed: tools::PgbenchResult,
    create: tools::WrkResult,
    pg_create_commits: f64,
    create_commits_stat: f64,
    created: i64,
    peak_rss_kib: u64,
    pg_replay: tools::PgbenchResult,
    replay: tools::WrkResult,
    replay_commits_stat: f64,
    per_create: Option<relay::Counts>,
    per_replay: Option<relay::Counts>,
    counted: usize,
    /// Each round's run of one process and of two.
    reconcile: Vec<(Reconciled, Reconciled)>,
    grown: Option<grown::Grown>,
    purge: Option<grown::Purge>,
}

struct Reconciled {
    processes: u32,
    payments: u32,
    elapsed: Duration,
    ideal: Duration,
    settled: i64,
    max_in_flight: u64,
    reports: Vec<String>,
}

impl Reconciled {
    fn all_settled(&self) -> bool {
        self.settled == i64::from(self.payments)
    }

    /// What the run did, for the table.
    fn detail(&self) -> String {
        format!(
            "{} process(es): {} of {} settled in {:.2} s; ideal {:.2} s; {} look-ups in flight at most",
            self.processes,
            self.settled,
            self.payments,
            self.elapsed.as_secs_f64(),
            self.ideal.as_secs_f64(),
            self.max_in_flight
        )
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    let bin = args
        .pagos
        .clone()
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_pagos")));
    if !bin.exists() {
        bail!("no pagos binary at {}", bin.display());
    }
    let admin = Database::connect(args.postgres_url.as_str())
        .await
        .context("connecting to PAGOS_BENCH_POSTGRES_URL")?;
    let mut databases = Databases {
        admin_url: args.postgres_url.clone(),
        names: vec![],
    };
    let logs = tempfile::tempdir()?;
    let measured = Load {
        connections: args.connections,
        threads: args.threads,
        duration: args.duration,
    };
    let warmup = Load {
        duration: args.warmup,
        ..measured
    };
    let mut figures = Figures {
        counted: args.counted,
        ..Figures::default()
    };

    let phase = |name: &str| args.only.iter().any(|p| p == name);
    let (name, url, db, merchant) = prepared_database(&bin, &mut databases, &admin).await?;
    if phase("throughput") {
        create_and_replay(
            &bin,
            &args,
            &admin,
            &name,
            &url,
            &db,
            &merchant,
            &measured,
            &warmup,
            logs.path(),
            &mut figures,
        )
        .await?;
    }
    if phase("work") {
        database_work(&bin, &args, &url, logs.path(), &mut figures).await?;
    }
    let _ = db.close().await;
    if phase("reconciler") {
        for round in 1..=args.reconcile_rounds.max(1) {
            say(&format!(
                "reconciler: round {round} of {}",
                args.reconcile_rounds.max(1)
            ));
            let one = reconciler(&bin, &args, &mut databases, &admin, 1).await?;
            let two = reconciler(&bin, &args, &mut databases, &admin, 2).await?;
            figures.reconcile.push((one, two));
        }
    }
    if phase("grown") {
        let (g, grown_url, grown_db) = grown::grown(
            &bin,
            args.grown_payments,
            args.grown_rounds,
            &measured,
            &mut databases,
            &admin,
            logs.path(),
        )
        .await?;
        figures.grown = Some(g);
        if phase("purge") {
            figures.purge = Some(
                grown::purge(
                    &bin,
                    &grown_url,
                    &grown_db,
                    &measured,
                    args.purge_batch,
                    logs.path(),
                )
                .await?,
            );
        }
        let _ = grown_db.close().await;
    }
    print_table(&args, &figures);
    Ok(())
}

#[allow(clippy::too_many_arguments)]
async fn create_and_replay(
    bin: &Path,
    args: &Args,
    admin: &DatabaseConnection,
    name: &str,
    url: &str,
    db: &DatabaseConnection,
    merchant: &str,
    measured: &Load,
    warmup: &Load,
    logs: &Path,
    figures: &mut Figures,
) -> anyhow::Result<()> {
    // pgbench warmed up once; each round starts its own `pagos serve` for creates, then
    // another for replays (one at a time, as a deployment runs), each warmed up.
    pgbench(
        "create.sql",
        url,
        warmup,
        &[("merchant", merchant), ("run", "1"), ("i", "0")],
    )?;
    db.execute_unprepared(include_str!("../pgbench/seed-schema.sql"))
        .await
        .context("creating the textbook saga's tables")?;
    pgbench("seed.sql", url, warmup, &[("run", "1"), ("i", "0")])?;
    pgbench(
        "replay.sql",
        url,
        warmup,
        &[("merchant", merchant), ("key", REPLAY_KEY)],
    )?;
    let rounds = args.throughput_rounds.max(1);
    for round in 1..=rounds {
        say(&format!("throughput: round {round} of {rounds}"));
        let run = (round + 1).to_string();
        let (server, base) = serve(bin, url, &[], &logs.join("serve-create.log")).await?;
        say(&format!("warming up ({:?})", args.warmup));
        wrk(
            "create.lua",
            &base,
            warmup,
            &[
                ("PAGOS_BENCH_API_KEY", API_KEY),
                ("PAGOS_BENCH_RUN", &format!("warmup-{round}")),
            ],
        )?;
        tokio::time::sleep(STATS_SETTLE).await;

        // The fixed yardstick first, then the mirror of pagos' SQL right before wrk.
        say(&format!(
            "pgbench: the textbook saga's SQL, {} clients, {:?}",
            measured.connections, measured.duration
        ));
        figures.pg_seed = pgbench("seed.sql", url, measured, &[("run", &run), ("i", "0")])?;
        say(&format!(
            "pgbench: the create path's SQL, {} clients, {:?}",
            measured.connections, measured.duration
        ));
        let before = db_stats(admin, name).await?;
        figures.pg_create = pgbench(
            "create.sql",
            url,
            measured,
            &[("merchant", merchant), ("run", &run), ("i", "0")],
        )?;
        let between = db_stats(admin, name).await?;
        figures.pg_create_commits =
            between.since(before).commits as f64 / figures.pg_create.transactions as f64;

        say(&format!(
            "wrk: POST /v1/pagos, a fresh key each, {} connections, {:?}",
            measured.connections, measured.duration
        ));
        let payments_before = count(db, "SELECT count(*) FROM payments").await?;
        let cpu_before = server.cpu_time();
        figures.create = wrk(
            "create.lua",
            &base,
            measured,
            &[
                ("PAGOS_BENCH_API_KEY", API_KEY),
                ("PAGOS_BENCH_RUN", &format!("measured-{round}")),
            ],
        )?;
        let cpu_per_create_us =
            per_request_us(cpu_before, server.cpu_time(), figures.create.requests);
        figures.peak_rss_kib = server.peak_rss_kib().unwrap_or(0);
        // Stopping pagos closes its connections: their backends flush their statistics.
        server.stop(Duration::from_secs(30));
        tokio::time::sleep(Duration::from_millis(500)).await;
        let after = db_stats(admin, name).await?;
        figures.created = count(db, "SELECT count(*) FROM payments").await? - payments_before;
        figures.create_commits_stat = after.since(between).commits as f64 / figures.created as f64;

        // Replay: one completed key.
        let (server, base) = serve(bin, url, &[], &logs.join("serve-replay.log")).await?;
        let http = reqwest::Client::new();
        let first = post(&http, &base, REPLAY_KEY).await?;
        if first != 201 {
            bail!("the payment to replay was answered {first}, not 201");
        }
        wrk(
            "replay.lua",
            &base,
            warmup,
            &[
                ("PAGOS_BENCH_API_KEY", API_KEY),
                ("PAGOS_BENCH_REPLAY_KEY", REPLAY_KEY),
            ],
        )?;
        tokio::time::sleep(STATS_SETTLE).await;

        say(&format!(
            "pgbench: point select of the key row, {} clients, {:?}",
            measured.connections, measured.duration
        ));
        figures.pg_replay = pgbench(
            "replay.sql",
            url,
            measured,
            &[("merchant", merchant), ("key", REPLAY_KEY)],
        )?;
        let between = db_stats(admin, name).await?;
        say(&format!(
            "wrk: POST /v1/pagos replaying one key, {} connections, {:?}",
            measured.connections, measured.duration
        ));
        let cpu_before = server.cpu_time();
        figures.replay = wrk(
            "replay.lua",
            &base,
            measured,
            &[
                ("PAGOS_BENCH_API_KEY", API_KEY),
                ("PAGOS_BENCH_REPLAY_KEY", REPLAY_KEY),
            ],
        )?;
        let cpu_per_replay_us =
            per_request_us(cpu_before, server.cpu_time(), figures.replay.requests);
        server.stop(Duration::from_secs(30));
        tokio::time::sleep(Duration::from_millis(500)).await;
        let after = db_stats(admin, name).await?;
        figures.replay_commits_stat =
            after.since(between).commits as f64 / figures.replay.requests as f64;
        let measured_round = Round {
            create: figures.create.rate(),
            mirror: figures.pg_create.tps,
            seed: figures.pg_seed.tps,
            replay: figures.replay.rate(),
            select: figures.pg_replay.tps,
            cpu_per_create_us,
            cpu_per_replay_us,
            errors: figures.create.non_2xx
                + figures.create.socket_errors
                + figures.replay.non_2xx
                + figures.replay.socket_errors,
            failed: figures.pg_create.failed + figures.pg_seed.failed + figures.pg_replay.failed,
        };
        say(&format!(
            "round {round}: create ÷ mirror {:.2}, replay ÷ point select {:.2}",
            measured_round.create / measured_round.mirror,
            measured_round.replay / measured_round.select
        ));
        figures.rounds.push(measured_round);
    }
    Ok(())
}

/// CPU time spent between two readings, per request, in µs (0 when unreadable).
fn per_request_us(before: Option<Duration>, after: Option<Duration>, requests: u64) -> f64 {
    match (before, after) {
        (Some(before), Some(after)) if requests > 0 => {
            after.saturating_sub(before).as_secs_f64() * 1e6 / requests as f64
        }
        _ => 0.0,
    }
}

async fn post(http: &reqwest::Client, base: &str, key: &str) -> anyhow::Result<u16> {
    let answer = http
        .post(format!("{base}/v1/pagos"))
        .bearer_auth(API_KEY)
        .header("Idempotency-Key", key)
        .header("Content-Type", "application/json")
        .body(BODY)
        .send()
        .await?;
    let status = answer.status().as_u16();
    let _ = answer.bytes().await?;
    Ok(status)
}

/// `n` requests, 16 at a time; the statuses other than 201.
async fn posts(
    http: &reqwest::Client,
    base: &str,
    keys: impl Iterator<Item = String>,
) -> anyhow::Result<usize> {
    let statuses: Vec<anyhow::Result<u16>> = futures::stream::iter(keys)
        .map(|key| async move { post(http, base, &key).await })
        .buffer_unordered(16)
        .collect()
        .await;
    let mut other = 0;
    for status in statuses {
        if status? != 201 {
            other += 1;
        }
    }
    Ok(other)
}

async fn database_work(
    bin: &Path,
    args: &Args,
    url: &str,
    logs: &Path,
    figures: &mut Figures,
) -> anyhow::Result<()> {
    say(&format!(
        "database work: {} creates and {} replays through a counting relay",
        args.counted, args.counted
    ));
    let mut upstream_url = url::Url::parse(url)?;
    let host = upstream_url.host_str().unwrap_or("127.0.0.1").to_owned();
    let port = upstream_url.port().unwrap_or(5432);
    let upstream = tokio::net::lookup_host((host.as_str(), port))
        .await?
        .next()
        .context("resolving the PostgreSQL host")?;
    let (addr, counters) = relay::start(upstream).await?;
    upstream_url.set_host(Some(&addr.ip().to_string()))?;
    upstream_url
        .set_port(Some(addr.port()))
        .map_err(|()| anyhow::anyhow!("cannot set the relay's port"))?;
    upstream_url
        .query_pairs_mut()
        .append_pair("sslmode", "disable");
    // No periodic reconciler pass in the middle of the count: it is not per-payment work.
    let (server, base) = serve(
        bin,
        upstream_url.as_str(),
        &["--reconcile-every", "1h"],
        &logs.join("serve-relay.log"),
    )
    .await?;
    let http = reqwest::Client::new();
    // Warm: every pooled connection has prepared its statements.
    posts(&http, &base, (0..200).map(|i| format!("relay-warm-{i}"))).await?;
    post(&http, &base, "relay-replay").await?;
    let start = counters.snapshot();
    let creating = Instant::now();
    let bad = posts(
        &http,
        &base,
        (0..args.counted).map(|i| format!("relay-{i}")),
    )
    .await?;
    let created = counters.snapshot();
    let create_took = creating.elapsed();
    let replaying = Instant::now();
    let bad_replays = posts(
        &http,
        &base,
        (0..args.counted).map(|_| "relay-replay".to_owned()),
    )
    .await?;
    let replayed = counters.snapshot();
    let replay_took = replaying.elapsed();
    // What the idle process does in as long a time (the delivery worker polls twice a
    // second, a transaction each): not the payments' work, subtracted from theirs.
    tokio::time::sleep(create_took).await;
    let idle_create = counters.snapshot().since(replayed);
    let before_idle_replay = counters.snapshot();
    tokio::time::sleep(replay_took).await;
    let idle_replay = counters.snapshot().since(before_idle_replay);
    server.stop(Duration::from_secs(30));
    if bad + bad_replays > 0 {
        bail!("{bad} creates and {bad_replays} replays were not answered 201");
    }
    figures.per_create = Some(created.since(start).less(idle_create));
    figures.per_replay = Some(replayed.since(created).less(idle_replay));
    Ok(())
}

async fn reconciler(
    bin: &Path,
    args: &Args,
    databases: &mut Databases,
    admin: &DatabaseConnection,
    processes: u32,
) -> anyhow::Result<Reconciled> {
    let n = args.reconcile_payments;
    say(&format!("reconciler: seeding {n} ENVIADA payments"));
    let (_, url, db, merchant) = prepared_database(bin, databases, admin).await?;
    // As a request leaves a payment whose gateway call timed out: ENVIADA, lease released,
    // due now, its key not yet answered.
    db.execute_unprepared(&format!(
        "WITH p AS (
           INSERT INTO payments (id, merchant_id, idempotency_key, credit_id, amount, currency,
             description, state, version, attempts, gateway_key, gateway_ref, decline_code,
             next_attempt_at, created_at, updated_at)
           SELECT gen_random_uuid(), '{merchant}', 'recon-' || i, '42', 250000, 'COP', NULL,
             'ENVIADA', 1, 1, 'pagos-bench-recon-' || i, NULL, NULL,
             now() - interval '1 minute', now() - interval '2 minutes', now() - interval '2 minutes'
           FROM generate_series(1, {n}) AS i
           RETURNING id, idempotency_key)
         INSERT INTO idempotency_keys (merchant_id, key, fingerprint, payment_id, status,
           response_code, response_body, lease_until, created_at, updated_at)
         SELECT '{merchant}', idempotency_key, repeat('0', 64), id, 'EN_PROCESO', NULL, NULL,
           NULL, now() - interval '2 minutes', now() - interval '2 minutes' FROM p"
    ))
    .await?;
    for table in ["payments", "idempotency_keys"] {
        db.execute_unprepared(&format!("VACUUM ANALYZE {table}"))
            .await?;
    }
    let (addr, lookups) = lookup::start(args.lookup_latency).await?;
    let gateway = format!("http://{addr}");
    let concurrency = args.reconcile_concurrency.to_string();
    let mut flags = vec![
        "reconcile",
        "--once",
        "--database-url",
        &url,
        "--gateway",
        "http",
        "--gateway-url",
        &gateway,
        "--reconcile-concurrency",
        &concurrency,
    ];
    flags.extend(args.reconcile_flags.split_whitespace());
    say(&format!(
        "reconciler: {processes} × pagos reconcile --once, look-ups {:?}, concurrency {}",
        args.lookup_latency, args.reconcile_concurrency
    ));
    let started = Instant::now();
    let mut children = Vec::new();
    for i in 0..processes {
        let mut command = tools::pagos(bin, &flags);
        match &args.reconcile_log {
            Some(path) => command
                .env("RUST_LOG", "info")
                .stderr(std::fs::File::create(
                    path.with_extension(format!("{processes}-{i}.log")),
                )?),
            None => command.env("RUST_LOG", "warn"),
        };
        command.stdout(std::process::Stdio::piped());
        if args.reconcile_log.is_none() {
            command.stderr(std::process::Stdio::piped());
        }
        children.push(command.spawn().context("running pagos reconcile --once")?);
    }
    let mut reports = Vec::new();
    for child in children {
        // Waited for off the runtime's worker threads.
        let out = tokio::task::spawn_blocking(move || child.wait_with_output()).await??;
        if !out.status.success() {
            bail!(
                "pagos reconcile failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        reports.push(String::from_utf8_lossy(&out.stdout).trim().to_owned());
    }
    let elapsed = started.elapsed();
    let settled = count(
        &db,
        "SELECT count(*) FROM payments WHERE state = 'COMPLETADA'",
    )
    .await?;
    let _ = db.close().await;
    let ideal = args
        .lookup_latency
        .mul_f64(f64::from(n) / f64::from(args.reconcile_concurrency * processes));
    Ok(Reconciled {
        processes,
        payments: n,
        elapsed,
        ideal,
        settled,
        max_in_flight: lookups
            .max_in_flight
            .load(std::sync::atomic::Ordering::SeqCst),
        reports,
    })
}

fn verdict(met: bool) -> &'static str {
    if met { "met" } else { "MISSED" }
}

fn print_table(args: &Args, f: &Figures) {
    let mut rows: Vec<[String; 4]> = Vec::new();
    // Phases left out with --only print no rows.
    let throughput = !f.rounds.is_empty();
    // Each ratio is the median of the rounds' ratios, every round's beside it.
    let ratios = |of: fn(&Round) -> f64| -> (f64, String) {
        let each: Vec<f64> = f.rounds.iter().map(of).collect();
        let listed: Vec<String> = each.iter().map(|r| format!("{r:.2}")).collect();
        (grown::median(each), listed.join(", "))
    };
    let medians = |of: fn(&Round) -> f64| grown::median(f.rounds.iter().map(of).collect());
    let rounds = f.rounds.len();
    if throughput {
        let (create_ratio, each) = ratios(|r| r.create / r.mirror);
        rows.push([
            "create throughput ratio".into(),
            format!(
                "{create_ratio:.2}  (median of {rounds} rounds: {each}; pagos {:.0}/s ÷ pgbench {:.0}/s, medians)",
                medians(|r| r.create),
                medians(|r| r.mirror)
            ),
            "≥ 0.8".into(),
            verdict(create_ratio >= 0.8).into(),
        ]);
        let (seed_ratio, each) = ratios(|r| r.create / r.seed);
        rows.push([
            "create ÷ textbook saga SQL".into(),
            format!(
                "{seed_ratio:.2}  (median of {rounds} rounds: {each}; pgbench {:.0}/s running benches/pgbench/seed.sql; pagos' own SQL ÷ it {:.2})",
                medians(|r| r.seed),
                ratios(|r| r.mirror / r.seed).0
            ),
            "printed".into(),
            String::new(),
        ]);
        let (replay_ratio, each) = ratios(|r| r.replay / r.select);
        rows.push([
            "replay throughput ratio".into(),
            format!(
                "{replay_ratio:.2}  (median of {rounds} rounds: {each}; pagos {:.0}/s ÷ pgbench {:.0}/s, medians)",
                medians(|r| r.replay),
                medians(|r| r.select)
            ),
            "≥ 1.5".into(),
            verdict(replay_ratio >= 1.5).into(),
        ]);
        let (create_cpu, each) = ratios(|r| r.cpu_per_create_us);
        rows.push([
            "pagos CPU per create".into(),
            format!(
                "{create_cpu:.0} µs  (median of {rounds} rounds: {each}; user and system time of pagos serve over the wrk run)"
            ),
            "printed".into(),
            String::new(),
        ]);
        let (replay_cpu, each) = ratios(|r| r.cpu_per_replay_us);
        rows.push([
            "pagos CPU per replay".into(),
            format!("{replay_cpu:.1} µs  (median of {rounds} rounds: {each})"),
            "printed".into(),
            String::new(),
        ]);
    }
    if let (Some(c), Some(r)) = (f.per_create, f.per_replay) {
        let n = f.counted as f64;
        let commits = c.commits() as f64 / n;
        rows.push([
            "commits per created payment".into(),
            format!(
                "{commits:.2}  (less the idle delivery worker's; xact_commit in pg_stat_database: pagos {:.2}, pgbench {:.2})",
                f.create_commits_stat, f.pg_create_commits
            ),
            "≤ 3".into(),
            // Judged as printed: what is left of the idle worker's commits after the
            // subtraction (a few thousandths) is noise, not a fourth commit.
            verdict(format!("{commits:.2}").parse::<f64>().unwrap_or(commits) <= 3.0).into(),
        ]);
        let statements = c.statements() as f64 / n;
        rows.push([
            "statements per created payment".into(),
            format!(
                "{statements:.2}  ({:.2} BEGIN; {:.2} round trips; {:.2} statements prepared)",
                c.begin as f64 / n,
                c.round_trips() as f64 / n,
                c.parse as f64 / n
            ),
            "≤ 8".into(),
            verdict(statements <= 8.0).into(),
        ]);
        let replay_statements = r.statements() as f64 / n;
        rows.push([
            "statements per replay".into(),
            format!(
                "{replay_statements:.2}  ({:.2} round trips; pg_stat_database: {:.2} commits)",
                r.round_trips() as f64 / n,
                f.replay_commits_stat
            ),
            "1".into(),
            verdict(replay_statements <= 1.0).into(),
        ]);
    }
    if !f.reconcile.is_empty() {
        let rounds = f.reconcile.len();
        let all_settled = f
            .reconcile
            .iter()
            .all(|(one, two)| one.all_settled() && two.all_settled());
        // Each round's two processes are divided by the same round's one.
        let one: Vec<f64> = f
            .reconcile
            .iter()
            .map(|(one, _)| one.elapsed.as_secs_f64() / one.ideal.as_secs_f64())
            .collect();
        let two: Vec<f64> = f
            .reconcile
            .iter()
            .map(|(one, two)| two.elapsed.as_secs_f64() / one.elapsed.as_secs_f64())
            .collect();
        let listed = |xs: &[f64]| {
            xs.iter()
                .map(|x| format!("{x:.2}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let (median_one, median_two) = (grown::median(one.clone()), grown::median(two.clone()));
        rows.push([
            "reconciler backlog, one process".into(),
            format!(
                "{median_one:.2} × ideal  (median of {rounds} rounds: {})",
                listed(&one)
            ),
            "≤ 1.2".into(),
            verdict(median_one <= 1.2 && all_settled).into(),
        ]);
        rows.push([
            "reconciler backlog, two processes".into(),
            format!(
                "{median_two:.2} × one's time  (median of {rounds} rounds: {})",
                listed(&two)
            ),
            "≤ 0.6".into(),
            verdict(median_two <= 0.6 && all_settled).into(),
        ]);
    }
    if let Some(g) = &f.grown {
        let rates = |runs: &[tools::WrkResult]| runs.iter().map(|r| r.rate()).collect::<Vec<_>>();
        let p99s = |runs: &[tools::WrkResult]| runs.iter().map(|r| r.p99_ms).collect::<Vec<_>>();
        for (what, empty, grown) in [
            ("create", &g.empty.create, &g.grown.create),
            ("replay", &g.empty.replay, &g.grown.replay),
        ] {
            let (e, n) = (grown::median(rates(empty)), grown::median(rates(grown)));
            let ratio = n / e;
            rows.push([
                format!("{what}, {}M payments ÷ empty", g.payments / 1_000_000),
                format!(
                    "{ratio:.2}  (median of {} rounds: {n:.0}/s vs {e:.0}/s; p99 {:.1} vs {:.1} ms)",
                    grown.len(),
                    grown::median(p99s(grown)),
                    grown::median(p99s(empty)),
                ),
                "≥ 0.9".into(),
                verdict(ratio >= 0.9).into(),
            ]);
        }
    }
    if let Some(p) = &f.purge {
        let without = grown::median(p.without.iter().map(|r| r.p99_ms).collect());
        let ratio = p.during.p99_ms / without;
        let took = p
            .purge_took
            .map(|t| format!("{:.0} s", t.as_secs_f64()))
            .unwrap_or_else(|| "-".into());
        rows.push([
            "create p99 during the key purge".into(),
            format!(
                "{ratio:.2} × without  ({:.1} ms vs {without:.1} ms; {} of {} expired keys deleted in {took}, window {:.0} s; {:.0} vs {:.0} creates/s)",
                p.during.p99_ms,
                p.deleted,
                p.expired,
                p.window.as_secs_f64(),
                p.during.rate(),
                grown::median(p.without.iter().map(|r| r.rate()).collect()),
            ),
            "≤ 1.5".into(),
            verdict(ratio <= 1.5 && p.deleted == p.expired).into(),
        ]);
    }
    let mib = f.peak_rss_kib as f64 / 1024.0;
    if throughput {
        rows.push([
            "memory".into(),
            format!(
                "{mib:.1} MiB peak RSS of pagos serve, last round ({} payments created)",
                f.created
            ),
            "≤ 64 MiB".into(),
            verdict(mib <= 64.0).into(),
        ]);
        rows.push([
            "create latency".into(),
            format!(
                "p50 {:.1} ms, p99 {:.1} ms, last round  (pgbench mean {:.1} ms)",
                f.create.p50_ms, f.create.p99_ms, f.pg_create.latency_ms
            ),
            "printed".into(),
            String::new(),
        ]);
        rows.push([
            "replay latency".into(),
            format!(
                "p50 {:.2} ms, p99 {:.2} ms, last round  (pgbench mean {:.2} ms)",
                f.replay.p50_ms, f.replay.p99_ms, f.pg_replay.latency_ms
            ),
            "printed".into(),
            String::new(),
        ]);
    }

    let width = |i: usize| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0);
    let (w0, w1, w2) = (width(0).max(6), width(1).max(8), width(2).max(6));
    println!();
    println!(
        "pagos benchmarks — {} connections/clients, {} threads, {:?} runs, {} CPUs",
        args.connections,
        args.threads,
        args.duration,
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0)
    );
    println!(
        "{:<w0$}  {:<w1$}  {:<w2$}  result",
        "figure", "measured", "target"
    );
    println!("{}", "-".repeat(w0 + w1 + w2 + 14));
    for [a, b, c, d] in &rows {
        println!("{a:<w0$}  {b:<w1$}  {c:<w2$}  {d}");
    }
    if throughput {
        let errors: u64 = f.rounds.iter().map(|r| r.errors).sum();
        let failed: u64 = f.rounds.iter().map(|r| r.failed).sum();
        println!();
        println!(
            "throughput rounds: {errors} non-2xx answers or socket errors of wrk, {failed} failed pgbench transactions, in all {rounds} rounds"
        );
        println!(
            "last round: wrk {} creates; pgbench {} + {} + {} transactions",
            f.create.requests,
            f.pg_seed.transactions,
            f.pg_create.transactions,
            f.pg_replay.transactions
        );
    }
    for (round, pair) in f.reconcile.iter().enumerate() {
        for rec in [&pair.0, &pair.1] {
            println!("reconciler, round {}: {}", round + 1, rec.detail());
            for report in &rec.reports {
                println!("  report of one of {} process(es): {report}", rec.processes);
            }
        }
    }
    if let Some(g) = &f.grown {
        println!(
            "grown: {} payments and keys written by SQL in {:.0} s",
            g.payments,
            g.fill.as_secs_f64()
        );
        for r in g
            .empty
            .create
            .iter()
            .chain(&g.grown.create)
            .chain(&g.empty.replay)
            .chain(&g.grown.replay)
        {
            if r.non_2xx + r.socket_errors > 0 {
                println!(
                    "grown: a run had {} non-2xx answers and {} socket errors",
                    r.non_2xx, r.socket_errors
                );
            }
        }
    }
}
