//! The figures as the data grows: a database filled with SQL (not through the API) with
//! millions of finished payments and their keys, next to an empty one, and the key
//! reaper's purge of a day of expired keys while payments are being created.

use crate::tools::{Load, WrkResult, count, serve, wrk};
use crate::{API_KEY, Databases, REPLAY_KEY, post, prepared_database, say};
use anyhow::{Context, bail};
use sea_orm::{ConnectionTrait, DatabaseConnection};
use std::path::Path;
use std::time::{Duration, Instant};

/// Rows written per fill statement: each one is its own transaction and progress line.
const FILL_CHUNK: u64 = 500_000;
/// The payments of a filled database span this many days, evenly: the oldest tenth is
/// one day past a key retention of `RETENTION_DAYS`.
const SPAN_DAYS: u64 = 10;
const RETENTION_DAYS: u64 = SPAN_DAYS - 1;

/// Fills `db` with `n` finished payments and their frozen keys, oldest first, spread
/// evenly over the last `SPAN_DAYS` days, with UUIDv7 ids of their creation time (as
/// pagos makes them). Prints its progress.
///
/// The secondary indexes are dropped first and built again at the end (from their own
/// definitions, read from `pg_indexes`), and each statement runs without foreign-key
/// triggers (`session_replication_role = replica`: the rows are consistent by
/// construction): ten million rows take minutes instead of most of an hour. What the
/// phases measure afterwards is the same schema, indexes and all.
pub async fn fill(db: &DatabaseConnection, merchant: &str, n: u64) -> anyhow::Result<()> {
    let started = Instant::now();
    let indexes: Vec<(String, String)> = db
        .query_all_raw(sea_orm::Statement::from_string(
            sea_orm::DbBackend::Postgres,
            "SELECT indexname::text, indexdef FROM pg_indexes
             WHERE tablename IN ('payments', 'idempotency_keys') AND indexname NOT LIKE '%pkey'",
        ))
        .await?
        .into_iter()
        .map(|row| Ok((row.try_get_by_index(0)?, row.try_get_by_index(1)?)))
        .collect::<Result<_, sea_orm::DbErr>>()?;
    for (name, _) in &indexes {
        db.execute_unprepared(&format!("DROP INDEX {name}")).await?;
    }
    let span_ms = SPAN_DAYS * 86_400_000;
    let mut done = 0;
    while done < n {
        let (lo, hi) = (done + 1, (done + FILL_CHUNK).min(n));
        // Row i was created at start + i × step: the newest is now.
        let sql = format!(
            "SET session_replication_role = replica;
             WITH s AS (
               SELECT i, now() - make_interval(secs => ({span_ms} - i * {span_ms}::float8 / {n}) / 1000) AS ts,
                      md5(i::text) AS h
               FROM generate_series({lo}, {hi}) AS i),
             p AS (
               INSERT INTO payments (id, merchant_id, idempotency_key, credit_id, amount, currency,
                 description, state, version, attempts, gateway_key, gateway_ref, decline_code,
                 next_attempt_at, created_at, updated_at)
               SELECT (lpad(to_hex((extract(epoch FROM ts) * 1000)::bigint), 12, '0') || '7'
                        || substr(h, 1, 3) || '8' || substr(h, 4, 15))::uuid,
                 '{merchant}', 'grown-' || i, '42', 250000, 'COP', NULL, 'COMPLETADA', 2, 1,
                 'pagos-grown-' || h, 'ch_' || substr(h, 1, 16), NULL, ts + interval '60 seconds', ts, ts
               FROM s
               RETURNING id, idempotency_key, gateway_ref, created_at)
             INSERT INTO idempotency_keys (merchant_id, key, fingerprint, payment_id, status,
               response_code, response_body, lease_until, created_at, updated_at)
             SELECT '{merchant}', idempotency_key, md5(idempotency_key) || md5(id::text), id,
               'COMPLETADA', 201,
               '{{\"id\":\"' || id || '\",\"creditoId\":\"42\",\"monto\":250000,\"moneda\":\"COP\",\"estado\":\"COMPLETADA\",\"gatewayRef\":\"'
                 || gateway_ref || '\",\"creadoEn\":\"' || to_char(created_at, 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')
                 || '\",\"actualizadoEn\":\"' || to_char(created_at, 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"') || '\"}}',
               NULL, created_at, created_at
             FROM p;
             RESET session_replication_role"
        );
        db.execute_unprepared(&sql)
            .await
            .with_context(|| format!("filling rows {lo}..{hi}"))?;
        done = hi;
        let secs = started.elapsed().as_secs_f64();
        say(&format!(
            "grown: {done} of {n} payments and keys written ({secs:.0} s, {:.0} rows/s)",
            done as f64 / secs
        ));
    }
    for (name, definition) in &indexes {
        say(&format!("grown: building {name} again"));
        db.execute_unprepared(definition).await?;
    }
    say("grown: VACUUM ANALYZE and CHECKPOINT");
    for table in ["payments", "idempotency_keys"] {
        db.execute_unprepared(&format!("VACUUM ANALYZE {table}"))
            .await?;
    }
    db.execute_unprepared("CHECKPOINT").await?;
    Ok(())
}

/// One database's create and replay runs.
#[derive(Clone, Debug, Default)]
pub struct Runs {
    pub create: Vec<WrkResult>,
    pub replay: Vec<WrkResult>,
}

pub struct Grown {
    pub payments: u64,
    pub fill: Duration,
    pub empty: Runs,
    pub grown: Runs,
}

pub struct Purge {
    pub expired: i64,
    pub deleted: i64,
    pub purge_took: Option<Duration>,
    pub window: Duration,
    pub without: Vec<WrkResult>,
    pub during: WrkResult,
}

/// Median of `xs` (the mean of the two middle values for an even count).
pub fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => xs[n / 2],
        _ => (xs[n / 2 - 1] + xs[n / 2]) / 2.0,
    }
}

/// A key retention that keeps every key of a filled database.
fn keep_every_key() -> String {
    format!("{}d", SPAN_DAYS * 10)
}

/// Creates, then replays one key, on `url`'s pagos; the reaper deletes nothing.
async fn create_then_replay(
    bin: &Path,
    url: &str,
    db: &DatabaseConnection,
    load: &Load,
    round: usize,
    which: &str,
    logs: &Path,
) -> anyhow::Result<(WrkResult, WrkResult)> {
    db.execute_unprepared("CHECKPOINT").await?;
    let retention = keep_every_key();
    let (server, base) = serve(
        bin,
        url,
        &["--key-retention", &retention],
        &logs.join(format!("serve-{which}-{round}.log")),
    )
    .await?;
    let run = format!("{which}-{round}");
    let create = wrk(
        "create.lua",
        &base,
        load,
        &[("PAGOS_BENCH_API_KEY", API_KEY), ("PAGOS_BENCH_RUN", &run)],
    )?;
    let key = format!("{REPLAY_KEY}-{run}");
    let http = reqwest::Client::new();
    let first = post(&http, &base, &key).await?;
    if first != 201 {
        bail!("the payment to replay was answered {first}, not 201");
    }
    let replay = wrk(
        "replay.lua",
        &base,
        load,
        &[
            ("PAGOS_BENCH_API_KEY", API_KEY),
            ("PAGOS_BENCH_REPLAY_KEY", &key),
        ],
    )?;
    server.stop(Duration::from_secs(30));
    Ok((create, replay))
}

/// An empty database and one filled with `n` payments, measured in alternating order,
/// `rounds` times each. Returns the figures and the filled database (for the purge).
pub async fn grown(
    bin: &Path,
    n: u64,
    rounds: usize,
    load: &Load,
    databases: &mut Databases,
    admin: &DatabaseConnection,
    logs: &Path,
) -> anyhow::Result<(Grown, String, DatabaseConnection)> {
    let (_, empty_url, empty_db, _) = prepared_database(bin, databases, admin).await?;
    let (_, grown_url, grown_db, merchant) = prepared_database(bin, databases, admin).await?;
    say(&format!(
        "grown: filling a database with {n} payments and their keys (SQL, {FILL_CHUNK} rows a statement)"
    ));
    let started = Instant::now();
    fill(&grown_db, &merchant, n).await?;
    let fill_took = started.elapsed();
    let mut figures = Grown {
        payments: n,
        fill: fill_took,
        empty: Runs::default(),
        grown: Runs::default(),
    };
    for round in 0..rounds {
        // Alternate which goes first, so neither always runs on a warmer machine.
        let order = if round % 2 == 0 {
            ["empty", "grown"]
        } else {
            ["grown", "empty"]
        };
        for which in order {
            say(&format!(
                "grown: round {} of {rounds}, {which} database: create then replay, {:?} each",
                round + 1,
                load.duration
            ));
            let (url, db, runs) = match which {
                "empty" => (&empty_url, &empty_db, &mut figures.empty),
                _ => (&grown_url, &grown_db, &mut figures.grown),
            };
            let (create, replay) =
                create_then_replay(bin, url, db, load, round, which, logs).await?;
            runs.create.push(create);
            runs.replay.push(replay);
        }
    }
    let _ = empty_db.close().await;
    Ok((figures, grown_url, grown_db))
}

/// The reaper's purge of the filled database's oldest day of keys (past a retention of
/// `RETENTION_DAYS`) while wrk creates payments, next to the same creates with nothing to
/// purge before and after.
pub async fn purge(
    bin: &Path,
    url: &str,
    db: &DatabaseConnection,
    load: &Load,
    batch: u64,
    logs: &Path,
) -> anyhow::Result<Purge> {
    // Fixed when the phase starts: the reaper's own cutoff, taken later, is past it.
    let cutoff = db
        .query_one_raw(sea_orm::Statement::from_string(
            sea_orm::DbBackend::Postgres,
            format!("SELECT (now() - interval '{RETENTION_DAYS} days')::text"),
        ))
        .await?
        .context("no cutoff")?
        .try_get_by_index::<String>(0)?;
    let older_than = format!("'{cutoff}'::timestamptz");
    let expired = count(
        db,
        &format!("SELECT count(*) FROM idempotency_keys WHERE created_at < {older_than}"),
    )
    .await?;
    let retention = format!("{RETENTION_DAYS}d");
    let batch = batch.to_string();
    let mut without = Vec::new();
    let mut during = None;
    let mut purge_took = None;
    for (i, step) in ["without", "during", "without"].into_iter().enumerate() {
        db.execute_unprepared("CHECKPOINT").await?;
        let keep = keep_every_key();
        // A reaper purges keys only once every process had time to read its retention,
        // two and a half periods of recording it after its start: one second here, so the
        // purge starts with the window (a minute's period would leave it out).
        let flags: Vec<&str> = match step {
            "during" => vec![
                "--key-retention",
                &retention,
                "--purge-batch",
                &batch,
                "--retention-refresh",
                "1s",
            ],
            _ => vec!["--key-retention", &keep, "--retention-refresh", "1s"],
        };
        say(&format!(
            "purge: creates {step} the reaper's purge of {expired} expired keys (batch {batch}), {:?}",
            load.duration
        ));
        let started = Instant::now();
        let (server, base) =
            serve(bin, url, &flags, &logs.join(format!("serve-purge-{i}.log"))).await?;
        // The reaper starts with `serve` (its keys 2.5 s in); it logs one line when it is done.
        let log = logs.join(format!("serve-purge-{i}.log"));
        let watcher = (step == "during").then(|| {
            tokio::spawn(async move {
                loop {
                    let text = std::fs::read_to_string(&log).unwrap_or_default();
                    if text.contains("idempotency keys past retention deleted") {
                        return started.elapsed();
                    }
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
            })
        });
        let run = format!("purge-{i}");
        let result = wrk(
            "create.lua",
            &base,
            load,
            &[("PAGOS_BENCH_API_KEY", API_KEY), ("PAGOS_BENCH_RUN", &run)],
        )?;
        if let Some(watcher) = watcher {
            // Waits for the purge to end, however long past the window it takes.
            purge_took = Some(watcher.await?);
            during = Some(result);
        } else {
            without.push(result);
        }
        server.stop(Duration::from_secs(30));
    }
    let left = count(
        db,
        &format!("SELECT count(*) FROM idempotency_keys WHERE created_at < {older_than}"),
    )
    .await?;
    Ok(Purge {
        expired,
        deleted: expired - left,
        purge_took,
        window: load.duration,
        without,
        during: during.context("no run during the purge")?,
    })
}
