//! A PostgreSQL wire-protocol relay that counts what its clients ask the server to do.
//!
//! `pg_stat_statements` needs `shared_preload_libraries`, that is a server restart; this
//! needs nothing from the server. It forwards bytes untouched both ways and reads the
//! frontend's messages as they pass: `Execute` (one run of a prepared statement), `Parse`
//! (a statement prepared: a miss of sqlx's per-connection cache), `Sync` (the end of an
//! extended-protocol exchange: one round trip) and simple `Query` messages (how sqlx sends
//! `BEGIN`, `COMMIT` and `ROLLBACK`). The connection must not use TLS (`sslmode=disable`).

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
        }
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
        }
    }

    fn count(&self, kind: u8, body: &[u8]) {
        let counter = match kind {
            b'E' => &self.execute,
            b'P' => &self.parse,
            b'S' => &self.sync,
            b'Q' => {
                let text = String::from_utf8_lossy(body);
                let word = text
                    .trim_start()
                    .split(|c: char| !c.is_ascii_alphabetic())
                    .next()
                    .unwrap_or("")
                    .to_ascii_uppercase();
                match word.as_str() {
                    "BEGIN" | "START" => &self.begin,
                    "COMMIT" | "END" => &self.commit,
                    "ROLLBACK" | "ABORT" => &self.rollback,
                    _ => &self.other_query,
                }
            }
            _ => return,
        };
        counter.fetch_add(1, Ordering::SeqCst);
    }
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

/// Splits the frontend's byte stream into messages.
#[derive(Default)]
struct Frontend {
    started: bool,
    pending: Vec<u8>,
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
            counters.count(rest[0], &rest[5..len]);
            at += len.max(5);
        }
        self.pending.drain(..at);
    }
}
