//! The one way the integration tests start the real `pagos` binary: `tests/api`,
//! `tests/soak`, `tests/webhooks_e2e` and `tests/client` include this file
//! (`#[path = "../support/binary.rs"] mod binary;`), so a process is started, logged,
//! waited for and killed the same way everywhere.
//!
//! A child gets the test's settings only: no `PAGOS_…` variable of the test's own
//! environment reaches it. Its logs (`RUST_LOG=info,sqlx=warn`) go to a file the test
//! can read, or, with `TEST_LOG` set, to the test's stderr.

#![allow(dead_code)]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The `pagos` binary `cargo test` built for this test.
pub const BIN: &str = env!("CARGO_BIN_EXE_pagos");

/// A port free right now on the loopback interface.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// `pagos ARGS`, with the test's settings only; logs appended to `log` (discarded when
/// `None`), or on the test's stderr with `TEST_LOG` set.
pub fn pagos(args: &[&str], log: Option<&Path>) -> Command {
    let mut command = Command::new(BIN);
    command
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .env("RUST_LOG", "info,sqlx=warn");
    for (name, _) in std::env::vars() {
        if name.starts_with("PAGOS_") {
            command.env_remove(name);
        }
    }
    if std::env::var_os("TEST_LOG").is_none() {
        let sink = log.and_then(|path| {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .ok()
        });
        command.stderr(sink.map_or_else(Stdio::null, Stdio::from));
    }
    command
}

/// A child killed (SIGKILL) and reaped when dropped, however the test ends.
pub struct Running(pub Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits until `url` answers 2xx; false if it did not within `within`.
pub async fn answers(url: &str, within: Duration) -> bool {
    let http = reqwest::Client::new();
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        let up = http
            .get(url)
            .timeout(Duration::from_secs(2))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success());
        if up {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// Waits until `url` answers 2xx, or panics after `within` with `logs`.
pub async fn wait_until_up(url: &str, within: Duration, logs: impl FnOnce() -> String) {
    if !answers(url, within).await {
        panic!("{url} did not come up within {within:?}:\n{}", logs());
    }
}

/// `pagos migrate`, then `pagos merchants add NAME --api-key KEY`, on `database_url`;
/// panics with its stderr if either fails.
pub fn add_merchant(database_url: &str, name: &str, api_key: &str) {
    // As an operator does on a new database: only `serve` and `migrate` migrate it.
    printed(
        pagos(&["migrate", "--database-url", database_url], None),
        "migrate",
    );
    let mut command = pagos(&["merchants", "add", name, "--api-key", api_key], None);
    command.args(["--database-url", database_url]);
    printed(command, "merchants add");
}

/// Runs `command` to its end; what it printed, trimmed. Panics with its stderr, naming
/// it `what`, if it failed.
pub fn printed(mut command: Command, what: &str) -> String {
    let output = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .unwrap_or_else(|e| panic!("{what} does not run: {e}"));
    assert!(
        output.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

/// `GET url`, read as JSON.
pub async fn get_json(http: &reqwest::Client, url: &str) -> serde_json::Value {
    http.get(url)
        .send()
        .await
        .expect("sent")
        .json()
        .await
        .expect("JSON")
}
