//! The processes a run drives: `pagos` (serve, migrate, merchants add, reconcile), wrk and
//! pgbench, and PostgreSQL's own counters.

use anyhow::{Context, bail};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, Statement};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The repository root: script paths are relative to it.
pub fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// `pagos` with the given arguments and nothing from the caller's `PAGOS_*` environment.
pub fn pagos(bin: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(bin);
    command.args(args).stdin(Stdio::null());
    for (name, _) in std::env::vars() {
        if name.starts_with("PAGOS_") {
            command.env_remove(name);
        }
    }
    command
}

/// Runs `pagos` to completion; its stdout on success.
pub fn pagos_output(bin: &Path, args: &[&str]) -> anyhow::Result<String> {
    let out = pagos(bin, args)
        .output()
        .with_context(|| format!("running {}", bin.display()))?;
    if !out.status.success() {
        bail!(
            "pagos {} failed: {}",
            args.first().copied().unwrap_or_default(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A child process ended however the run ends: SIGKILL and reap on drop.
pub struct Running {
    child: Option<Child>,
}

impl Running {
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(Child::id).unwrap_or(0)
    }

    /// SIGTERM, then wait (at most `patience`, then SIGKILL).
    pub fn stop(mut self, patience: Duration) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let deadline = Instant::now() + patience;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    /// CPU time the process has used so far, user and system (`/proc/<pid>/stat`).
    pub fn cpu_time(&self) -> Option<Duration> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).ok()?;
        // The fields after the command name, which is in parentheses and may hold spaces:
        // utime and stime are the 14th and 15th fields of the line.
        let after = stat.rsplit_once(')')?.1;
        let fields: Vec<&str> = after.split_whitespace().collect();
        let ticks: u64 =
            fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
        // USER_HZ is 100 on Linux (`getconf CLK_TCK`).
        Some(Duration::from_millis(ticks * 10))
    }

    /// Peak resident set size so far (VmHWM), in KiB.
    pub fn peak_rss_kib(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).ok()?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

pub fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// `pagos serve` on a free port, logging to `log` (its default level), until stopped;
/// returned once it has read its gauges a first time.
pub async fn serve(
    bin: &Path,
    database_url: &str,
    extra: &[&str],
    log: &Path,
) -> anyhow::Result<(Running, String)> {
    let port = free_port()?;
    let bind = format!("127.0.0.1:{port}");
    let mut args = vec!["serve", "--database-url", database_url, "--bind", &bind];
    args.extend_from_slice(extra);
    let child = pagos(bin, &args)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log)?)
        .spawn()
        .context("starting pagos serve")?;
    let running = Running { child: Some(child) };
    let url = format!("http://{bind}");
    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        // Up, and done with its first refresh of the gauges: on a large database that
        // refresh counts every payment once (src/metrics.rs), start-up work a
        // long-running process does not repeat for minutes.
        let metrics = match http
            .get(format!("{url}/metrics"))
            .timeout(Duration::from_millis(500))
            .send()
            .await
        {
            Ok(answer) if answer.status().is_success() => answer.text().await.unwrap_or_default(),
            _ => String::new(),
        };
        if metrics.contains("pagos_payments{") {
            return Ok((running, url));
        }
        if Instant::now() > deadline {
            bail!(
                "pagos serve did not come up: {}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What wrk's Lua `done()` printed.
#[derive(Clone, Debug, Default)]
pub struct WrkResult {
    pub requests: u64,
    pub seconds: f64,
    pub non_2xx: u64,
    pub socket_errors: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
}

impl WrkResult {
    pub fn rate(&self) -> f64 {
        self.requests as f64 / self.seconds
    }
}

fn key_values(text: &str) -> HashMap<&str, &str> {
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim(), v.trim()))
        .collect()
}

pub struct Load {
    pub connections: u32,
    pub threads: u32,
    pub duration: Duration,
}

/// wrk with one of `benches/wrk/*.lua` against `url`.
pub fn wrk(
    script: &str,
    url: &str,
    load: &Load,
    env: &[(&str, &str)],
) -> anyhow::Result<WrkResult> {
    let script: PathBuf = repo().join("benches/wrk").join(script);
    let out = Command::new("wrk")
        .arg(format!("-t{}", load.threads))
        .arg(format!("-c{}", load.connections))
        .arg(format!("-d{}s", load.duration.as_secs().max(1)))
        .args(["--timeout", "10s", "-s"])
        .arg(&script)
        .arg(url)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .context("running wrk (benches/run.sh installs it)")?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!("wrk failed: {text}{}", String::from_utf8_lossy(&out.stderr));
    }
    let kv = key_values(&text);
    let num = |k: &str| -> anyhow::Result<f64> {
        kv.get(k)
            .and_then(|v| v.parse::<f64>().ok())
            .with_context(|| format!("wrk printed no {k}: {text}"))
    };
    Ok(WrkResult {
        requests: num("requests")? as u64,
        seconds: num("duration_us")? / 1e6,
        non_2xx: num("non_2xx")? as u64,
        socket_errors: num("socket_errors")? as u64,
        p50_ms: num("p50_us")? / 1e3,
        p99_ms: num("p99_us")? / 1e3,
    })
}

#[derive(Clone, Debug, Default)]
pub struct PgbenchResult {
    pub transactions: u64,
    pub failed: u64,
    pub tps: f64,
    pub latency_ms: f64,
}

/// pgbench with one of `benches/pgbench/*.sql`, prepared statements, `load`'s clients.
pub fn pgbench(
    script: &str,
    database_url: &str,
    load: &Load,
    vars: &[(&str, &str)],
) -> anyhow::Result<PgbenchResult> {
    let script: PathBuf = repo().join("benches/pgbench").join(script);
    let mut command = Command::new("pgbench");
    command
        .args(["-n", "-M", "prepared"])
        .arg(format!("-c{}", load.connections))
        .arg(format!("-j{}", load.threads))
        .arg(format!("-T{}", load.duration.as_secs().max(1)))
        .arg("-f")
        .arg(&script);
    for (name, value) in vars {
        command.arg("-D").arg(format!("{name}={value}"));
    }
    let out = command
        .arg(database_url)
        .stdin(Stdio::null())
        .output()
        .context("running pgbench (benches/run.sh installs it)")?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        bail!(
            "pgbench failed: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let after = |prefix: &str| -> Option<f64> {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(prefix))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
    };
    Ok(PgbenchResult {
        transactions: after("number of transactions actually processed:")
            .context("pgbench printed no transaction count")? as u64,
        failed: after("number of failed transactions:").unwrap_or(0.0) as u64,
        tps: after("tps =").context("pgbench printed no tps")?,
        latency_ms: after("latency average =").unwrap_or(0.0),
    })
}

/// `pg_stat_database` for one database.
#[derive(Clone, Copy, Debug, Default)]
pub struct DbStats {
    pub commits: i64,
    pub rollbacks: i64,
}

impl DbStats {
    pub fn since(self, earlier: DbStats) -> DbStats {
        DbStats {
            commits: self.commits - earlier.commits,
            rollbacks: self.rollbacks - earlier.rollbacks,
        }
    }
}

/// Read from another database's connection, so reading them adds nothing to them.
pub async fn db_stats(admin: &DatabaseConnection, name: &str) -> anyhow::Result<DbStats> {
    let row = admin
        .query_one_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            "SELECT xact_commit, xact_rollback FROM pg_stat_database WHERE datname = $1",
            [name.into()],
        ))
        .await?
        .context("no pg_stat_database row")?;
    Ok(DbStats {
        commits: row.try_get_by_index(0)?,
        rollbacks: row.try_get_by_index(1)?,
    })
}

pub async fn count(db: &DatabaseConnection, sql: &str) -> anyhow::Result<i64> {
    let row = db
        .query_one_raw(Statement::from_string(DbBackend::Postgres, sql))
        .await?
        .context("count returned no row")?;
    Ok(row.try_get_by_index(0)?)
}
