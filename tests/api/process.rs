//! Real `pagos` processes for crash tests: started, killed with SIGKILL, restarted.

use serde_json::Value;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;
use tokio::process::{Child, Command};

pub const BIN: &str = env!("CARGO_BIN_EXE_pagos");

/// A port free right now on the loopback interface.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
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
        let mut command = Command::new(BIN);
        command
            .arg("serve")
            .args(args)
            .args(["--bind", &bind])
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .kill_on_drop(true);
        for (key, value) in env {
            command.env(key, value);
        }
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
        let http = reqwest::Client::new();
        for _ in 0..200 {
            if let Ok(answer) = http.get(format!("{}/healthz", self.url)).send().await
                && answer.status() == 200
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("pagos serve did not come up:\n{}", self.logs());
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
        let pid = self.child.id().expect("still running");
        let sent = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .expect("kill runs");
        assert!(sent.success(), "SIGTERM sent");
    }

    /// Waits up to `within` for the process to exit; its exit status if it did.
    pub async fn exited(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        tokio::time::timeout(within, self.child.wait())
            .await
            .ok()
            .map(|status| status.expect("wait"))
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
    let output = Command::new(BIN)
        .args(["reconcile", "--once"])
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .await
        .expect("pagos reconcile runs");
    assert!(
        output.status.success(),
        "pagos reconcile failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("the report is JSON")
}
