//! A PostgreSQL wire-protocol relay that counts what its clients ask the server to do.
//!
//! `pg_stat_statements` needs `shared_preload_libraries`, that is a server restart; this
//! needs nothing from the server. It forwards bytes untouched both ways and reads the
//! frontend's messages as they pass: `Execute` (one run of a prepared statement), `Parse`
//! (a statement prepared: a miss of sqlx's per-connection cache), `Sync` (the end of an
//! extended-protocol exchange: one round trip) and simple `Query` messages (how sqlx sends
//! `BEGIN`, `COMMIT` and `ROLLBACK`). The connection must not use TLS (`sslmode=disable`).
//!
//! Commits: an explicit `COMMIT`, or a statement that writes run outside `BEGIN` …
//! `COMMIT` (it commits on its own). A statement writes when its SQL (seen in its `Parse`)
//! is an `INSERT`, `UPDATE` or `DELETE`, or a `WITH` holding one.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Startup-phase request codes after which another untyped message follows.
const SSL_REQUEST: u32 = 80_877_103;
const GSSENC_REQUEST: u32 = 80_877_104;

#[derive(Default)]
pub struct Counters {
    execute: AtomicU64,
    parse: AtomicU64,
    sync: AtomicU64,
    begin: AtomicU64,
    commit: AtomicU64,
    rollback: AtomicU64,
    other_query: AtomicU64,
    autocommit_writes: AtomicU64,
}

/// The counters at one moment; subtract two to count what happened in between.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub execute: u64,
    pub parse: u64,
    pub sync: u64,
    pub begin: u64,
    pub commit: u64,
    pub rollback: u64,
    pub other_query: u64,
    /// Statements that wrote outside `BEGIN` … `COMMIT`: each committed on its own.
    pub autocommit_writes: u64,
}

impl Counts {
    pub fn since(self, earlier: Counts) -> Counts {
        Counts {
            execute: self.execute - earlier.execute,
            parse: self.parse - earlier.parse,
            sync: self.sync - earlier.sync,
            begin: self.begin - earlier.begin,
            commit: self.commit - earlier.commit,
            rollback: self.rollback - earlier.rollback,
            other_query: self.other_query - earlier.other_query,
            autocommit_writes: self.autocommit_writes - earlier.autocommit_writes,
        }
    }

    /// These counts less `idle`'s (what the process does on its own in as long a time:
    /// the delivery worker's polls), never below zero.
    pub fn less(self, idle: Counts) -> Counts {
        Counts {
            execute: self.execute.saturating_sub(idle.execute),
            parse: self.parse.saturating_sub(idle.parse),
            sync: self.sync.saturating_sub(idle.sync),
            begin: self.begin.saturating_sub(idle.begin),
            commit: self.commit.saturating_sub(idle.commit),
            rollback: self.rollback.saturating_sub(idle.rollback),
            other_query: self.other_query.saturating_sub(idle.other_query),
            autocommit_writes: self
                .autocommit_writes
                .saturating_sub(idle.autocommit_writes),
        }
    }

    /// Durable commits: explicit ones and writing statements that committed on their own.
    pub fn commits(&self) -> u64 {
        self.commit + self.autocommit_writes
    }

    /// Statements that read or write data: prepared-statement runs and simple queries
    /// other than transaction control.
    pub fn statements(&self) -> u64 {
        self.execute + self.other_query
    }

    /// Round trips: each extended-protocol exchange ends with one Sync, each simple query
    /// is one exchange.
    pub fn round_trips(&self) -> u64 {
        self.sync + self.begin + self.commit + self.rollback + self.other_query
    }
}

impl Counters {
    pub fn snapshot(&self) -> Counts {
        let get = |n: &AtomicU64| n.load(Ordering::SeqCst);
        Counts {
            execute: get(&self.execute),
            parse: get(&self.parse),
            sync: get(&self.sync),
            begin: get(&self.begin),
            commit: get(&self.commit),
            rollback: get(&self.rollback),
            other_query: get(&self.other_query),
            autocommit_writes: get(&self.autocommit_writes),
        }
    }

    fn bump(&self, counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::SeqCst);
    }
}

/// The first word of a statement, upper-cased.
fn verb(sql: &str) -> String {
    sql.trim_start()
        .split(|c: char| !c.is_ascii_alphabetic())
        .next()
        .unwrap_or("")
        .to_ascii_uppercase()
}

fn writes(sql: &str) -> bool {
    match verb(sql).as_str() {
        "INSERT" | "UPDATE" | "DELETE" => true,
        "WITH" => {
            let upper = sql.to_ascii_uppercase();
            ["INSERT INTO", "UPDATE ", "DELETE FROM"]
                .iter()
                .any(|w| upper.contains(w))
        }
        _ => false,
    }
}

/// Zero-terminated strings at the start of a message body.
fn c_strings(body: &[u8]) -> impl Iterator<Item = String> + '_ {
    body.split(|b| *b == 0)
        .map(|s| String::from_utf8_lossy(s).into_owned())
}

/// Listens on a free port of 127.0.0.1 and relays every connection to `upstream`.
pub async fn start(upstream: SocketAddr) -> anyhow::Result<(SocketAddr, Arc<Counters>)> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let counters = Arc::new(Counters::default());
    let shared = counters.clone();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let counters = shared.clone();
            tokio::spawn(async move {
                let _ = relay(client, upstream, counters).await;
            });
        }
    });
    Ok((addr, counters))
}

async fn relay(
    client: TcpStream,
    upstream: SocketAddr,
    counters: Arc<Counters>,
) -> std::io::Result<()> {
    let server = TcpStream::connect(upstream).await?;
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    let (mut from_client, mut to_client) = client.into_split();
    let (mut from_server, mut to_server) = server.into_split();
    let down = tokio::spawn(async move { tokio::io::copy(&mut from_server, &mut to_client).await });
    let mut reader = Frontend::default();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = from_client.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        reader.feed(&buf[..n], &counters);
        to_server.write_all(&buf[..n]).await?;
    }
    let _ = to_server.shutdown().await;
    let _ = down.await;
    Ok(())
}

/// Splits the frontend's byte stream into messages, and follows the connection's
/// prepared statements and transaction.
#[derive(Default)]
struct Frontend {
    started: bool,
    pending: Vec<u8>,
    /// Prepared statement name → does it write.
    statements: std::collections::HashMap<String, bool>,
    /// The statement of the portal last bound.
    bound_writes: bool,
    in_transaction: bool,
}

fn be32(bytes: &[u8]) -> usize {
    u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) as usize
}

impl Frontend {
    fn feed(&mut self, bytes: &[u8], counters: &Counters) {
        self.pending.extend_from_slice(bytes);
        let mut at = 0;
        loop {
            let rest = &self.pending[at..];
            if !self.started {
                // Untyped: length (itself included), then a code.
                if rest.len() < 8 || rest.len() < be32(rest) {
                    break;
                }
                let code = be32(&rest[4..]) as u32;
                if code != SSL_REQUEST && code != GSSENC_REQUEST {
                    self.started = true;
                }
                at += be32(rest).max(8);
                continue;
            }
            if rest.len() < 5 {
                break;
            }
            let len = 1 + be32(&rest[1..]);
            if rest.len() < len {
                break;
            }
            let (kind, body) = (rest[0], rest[5..len].to_vec());
            self.message(kind, &body, counters);
            at += len.max(5);
        }
        self.pending.drain(..at);
    }

    fn message(&mut self, kind: u8, body: &[u8], counters: &Counters) {
        match kind {
            b'P' => {
                counters.bump(&counters.parse);
                let mut strings = c_strings(body);
                let name = strings.next().unwrap_or_default();
                let sql = strings.next().unwrap_or_default();
                self.statements.insert(name, writes(&sql));
            }
            b'B' => {
                let statement = c_strings(body).nth(1).unwrap_or_default();
                self.bound_writes = self.statements.get(&statement).copied().unwrap_or(false);
            }
            b'E' => {
                counters.bump(&counters.execute);
                if self.bound_writes && !self.in_transaction {
                    counters.bump(&counters.autocommit_writes);
                }
            }
            b'S' => counters.bump(&counters.sync),
            b'Q' => {
                let sql = c_strings(body).next().unwrap_or_default();
                match verb(&sql).as_str() {
                    "BEGIN" | "START" => {
                        counters.bump(&counters.begin);
                        self.in_transaction = true;
                    }
                    "COMMIT" | "END" => {
                        counters.bump(&counters.commit);
                        self.in_transaction = false;
                    }
                    "ROLLBACK" | "ABORT" => {
                        counters.bump(&counters.rollback);
                        self.in_transaction = false;
                    }
                    _ => {
                        counters.bump(&counters.other_query);
                        if writes(&sql) && !self.in_transaction {
                            counters.bump(&counters.autocommit_writes);
                        }
                    }
                }
            }
            _ => {}
        }
    }
}
