//! Real `pagos` processes for crash and shutdown tests: started, killed with SIGKILL or
//! stopped with SIGTERM, restarted. Started as every test starts the binary
//! (`tests/support/binary.rs`).

use serde_json::Value;
use std::path::PathBuf;
use std::time::Duration;
use tokio::process::{Child, Command};

pub use crate::binary::{BIN, free_port};
use crate::helpers::{Backend, FakeGateway, TestDatabase};
use pagos::entities::payment;
use sea_orm::{DatabaseConnection, EntityTrait};
use wiremock::MockServer;

/// What a test of processes works on: a database with the merchant `acme`, and a fake
/// gateway the processes charge through (`FakeGateway`, or the test's own `F`).
pub struct World<F = FakeGateway> {
    pub database: TestDatabase,
    pub db: DatabaseConnection,
    pub gateway: MockServer,
    pub fake: F,
}

impl<F> World<F> {
    /// The database and an empty gateway: the caller mounts `fake` on it.
    pub async fn unmounted(backend: Backend, fake: F) -> World<F> {
        let (database, db) = TestDatabase::with_acme(&backend).await;
        World {
            database,
            db,
            gateway: MockServer::start().await,
            fake,
        }
    }

    /// The flags of the crash tests' processes: a lease short enough to wait out in a
    /// test, no gateway retries, the reconciler only when a test runs it.
    pub fn crash_args(&self) -> Vec<String> {
        self.crash_args_waiting("300ms", "1s")
    }

    /// `crash_args` with the gateway timeout `timeout` and the lease `lease`.
    fn crash_args_waiting(&self, timeout: &str, lease: &str) -> Vec<String> {
        let url = self.gateway.uri();
        serving_with_lease(
            &self.database.url,
            &url,
            timeout,
            lease,
            &["--stale-after", "200ms", "--reconcile-every", "1h"],
        )
        .into_iter()
        .map(str::to_owned)
        .collect()
    }

    /// `pagos serve` with `crash_args` and `env`.
    pub async fn serve(&self, env: &[(&str, &str)]) -> Serve {
        let args = self.crash_args();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Serve::start(&args, env).await
    }

    /// `pagos serve` (as `serve`, but waiting 5 s for the gateway: its answer is still
    /// awaited at the kill, however loaded the machine) is asked by `ask` (given its URL, in
    /// a task of its own) for what the gateway makes at once and answers late; once `made`
    /// holds (polled every 20 ms, up to 15 s: it must), the server is SIGKILLed, and the
    /// client gets no answer.
    pub async fn killed_in_flight<Fut>(
        &self,
        ask: impl FnOnce(String) -> Fut,
        made: impl Fn() -> bool,
        what: &str,
    ) where
        Fut: Future<Output = Result<reqwest::Response, reqwest::Error>> + Send + 'static,
    {
        let args = self.crash_args_waiting("5s", "6s");
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut server = Serve::start(&args, &[]).await;
        let in_flight = tokio::spawn(ask(server.url.clone()));
        for _ in 0..750 {
            if made() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(made(), "{what} before the kill");
        server.kill().await;
        assert!(
            in_flight.await.expect("joined").is_err(),
            "the client saw the crash: no answer from a killed server"
        );
    }

    /// `pagos reconcile --once` with `crash_args`; its report.
    pub async fn reconcile(&self) -> Value {
        let args = self.crash_args();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        reconcile_once(&args).await
    }
}

impl World {
    pub async fn new(backend: Backend, fake: FakeGateway) -> World {
        let world = World::unmounted(backend, fake).await;
        world.fake.mount(&world.gateway).await;
        world
    }

    /// The one payment of the test.
    pub async fn only_payment(&self) -> payment::Model {
        let all = payment::Entity::find().all(&self.db).await.expect("query");
        assert_eq!(all.len(), 1, "one payment registered");
        all.into_iter().next().expect("one")
    }
}

/// The flags of a `pagos serve` on `database` charging the reference protocol at
/// `gateway`, then `more`.
pub fn serving<'a>(database: &'a str, gateway: &'a str, more: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "--database-url",
        database,
        "--gateway",
        "http",
        "--gateway-url",
        gateway,
    ];
    args.extend_from_slice(more);
    args
}

/// The same, waiting `timeout` for the gateway's answer, with no retries and a lease of
/// `lease`: a process whose sends a test can time, then `more`.
pub fn serving_with_lease<'a>(
    database: &'a str,
    gateway: &'a str,
    timeout: &'a str,
    lease: &'a str,
    more: &[&'a str],
) -> Vec<&'a str> {
    let mut args = serving(
        database,
        gateway,
        &[
            "--gateway-timeout",
            timeout,
            "--gateway-retries",
            "0",
            "--lease",
            lease,
        ],
    );
    args.extend_from_slice(more);
    args
}

/// Until a hold that ends at `claimed_until` (if any) has run out, and 100 ms more: nobody
/// holds the row any more.
pub async fn until_unheld(claimed_until: Option<chrono::DateTime<chrono::Utc>>) {
    if let Some(until) = claimed_until {
        let wait = (until - pagos::db::now()).to_std().unwrap_or_default();
        tokio::time::sleep(wait + Duration::from_millis(100)).await;
    }
}

/// One `pagos serve` process. Killed when dropped.
pub struct Serve {
    child: Child,
    pub url: String,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Serve {
    /// Starts `pagos serve` with `args` (plus `--bind`) and `env`, and waits until it
    /// answers `/healthz` (or, with `expect_ready = false`, only until it is started).
    pub async fn start(args: &[&str], env: &[(&str, &str)]) -> Serve {
        let dir = tempfile::tempdir().expect("temp dir");
        let log = dir.path().join("serve.log");
        let port = free_port();
        let bind = format!("127.0.0.1:{port}");
        let mut command = crate::binary::pagos(&["serve"], None);
        command
            .args(args)
            .args(["--bind", &bind])
            .stderr(std::fs::File::create(&log).expect("log file"));
        for (key, value) in env {
            command.env(key, value);
        }
        let mut command = Command::from(command);
        command.kill_on_drop(true);
        let child = command.spawn().expect("pagos serve starts");
        let serve = Serve {
            child,
            url: format!("http://{bind}"),
            log,
            _dir: dir,
        };
        serve.wait_ready().await;
        serve
    }

    async fn wait_ready(&self) {
        crate::binary::wait_until_up(
            &format!("{}/healthz", self.url),
            Duration::from_secs(10),
            || self.logs(),
        )
        .await;
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGKILL, as a crash would.
    pub async fn kill(&mut self) {
        let _ = self.child.start_kill();
        let _ = self.child.wait().await;
    }

    /// SIGTERM, as an orchestrator stopping the process would.
    pub fn terminate(&self) {
        self.signal("TERM");
    }

    /// SIGINT, as Ctrl-C at a terminal would.
    pub fn interrupt(&self) {
        self.signal("INT");
    }

    fn signal(&self, name: &str) {
        let pid = self.child.id().expect("still running");
        let sent = std::process::Command::new("kill")
            .args([&format!("-{name}"), &pid.to_string()])
            .status()
            .expect("kill runs");
        assert!(sent.success(), "SIG{name} sent");
    }

    /// Waits up to `within` for the process to exit, and asserts it exited cleanly (exit
    /// code 0) `after` what the test names.
    pub async fn exits_cleanly(&mut self, within: Duration, after: &str) {
        let status = self
            .exited(within)
            .await
            .unwrap_or_else(|| panic!("pagos exited {after}:\n{}", self.logs()));
        assert!(status.success(), "a clean exit: {status}\n{}", self.logs());
    }

    /// Waits up to `within` for the process to exit; its exit status if it did.
    pub async fn exited(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        tokio::time::timeout(within, self.child.wait())
            .await
            .ok()
            .map(|status| status.expect("wait"))
    }

    /// Asserts that this process, started to abort at `failpoint`, gave no `answer` and
    /// ended by itself.
    pub async fn aborted_at<T: std::fmt::Debug, E: std::fmt::Debug>(
        &mut self,
        failpoint: &str,
        answer: &Result<T, E>,
    ) {
        assert!(
            answer.is_err(),
            "the server died before answering: {answer:?}"
        );
        assert!(
            self.ended_by_itself(Duration::from_secs(5)).await,
            "pagos aborted at {failpoint}:\n{}",
            self.logs()
        );
    }

    /// Waits for the process to end by itself (a failpoint abort); true if it did.
    pub async fn ended_by_itself(&mut self, within: Duration) -> bool {
        match tokio::time::timeout(within, self.child.wait()).await {
            Ok(Ok(status)) => !status.success(),
            _ => false,
        }
    }
}

/// `pagos reconcile --once` with `args`; its JSON report.
pub async fn reconcile_once(args: &[&str]) -> Value {
    reconcile_once_with(args, &[]).await
}

/// `pagos reconcile --once` with `args` and `env`; its report.
pub async fn reconcile_once_with(args: &[&str], env: &[(&str, &str)]) -> Value {
    let output = reconcile_once_output(args, env).await;
    assert!(
        output.status.success(),
        "pagos reconcile failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("the report is JSON")
}

/// `pagos reconcile --once` with `args` and `env` (logging only warnings); what it printed
/// and how it ended.
pub async fn reconcile_once_output(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    Command::new(BIN)
        .args(["reconcile", "--once"])
        .args(args)
        .env("RUST_LOG", "warn")
        .envs(env.iter().copied())
        .output()
        .await
        .expect("pagos reconcile runs")
}
