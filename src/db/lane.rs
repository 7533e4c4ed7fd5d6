//! A few PostgreSQL connections kept for the statements every payment makes (a
//! registration, a fenced write), returned without sqlx's ping.
//!
//! sqlx tests every pooled connection on its way back to the pool (`return_to_pool` sends
//! a `Sync` and waits for `ReadyForQuery`, unconditionally): a second round trip after
//! each statement, a wake-up of pagos and of a PostgreSQL backend. A created payment makes
//! three statements, so three of its six round trips were these pings.
//!
//! The ping is there for connections whose statement was abandoned half-way (a dropped
//! future) or that failed: they may hold an unread answer, or be broken. A lane connection
//! comes back only from a statement that completed, its whole answer read (sqlx's
//! `fetch_optional` reads to the end); one whose statement failed or was dropped is closed,
//! never reused. A connection idle for 30 s is pinged before its next statement (as the
//! pool's are: a firewall or a proxy may have dropped it; the ping bounded by the connect
//! timeout), one idle for 10 minutes is closed instead (the pool's idle timeout), one
//! older than 30 minutes is closed on its way back (sqlx's default lifetime), and each
//! starts with the session defaults of the pool's (`session_defaults`). The lane of a
//! closed pool lends nothing and takes nothing back.
//!
//! The lane holds at most `size` connections, carved out of `PAGOS_DATABASE_POOL_SIZE`
//! (`split`): the process never holds more connections than the setting says. When every
//! lane connection stays busy for a few milliseconds (`WAIT`), or a new one cannot be
//! opened, a statement takes one from the pool as before.

use sea_orm::sqlx::postgres::{PgConnectOptions, PgConnection, PgPool};
use sea_orm::sqlx::{self, Connection as _};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// A connection idle this long is pinged before its next statement.
const PING_IF_IDLE_FOR: Duration = Duration::from_secs(30);
/// A connection idle this long is closed instead of lent (the pool's idle timeout).
const IDLE_TIMEOUT: Duration = Duration::from_secs(10 * 60);
/// A connection this old is closed on its way back.
const MAX_LIFETIME: Duration = Duration::from_secs(30 * 60);
/// How long a statement waits for a lane connection when every one is busy, before it
/// takes one from the pool: about a statement's time, so that a busy lane serves most of
/// them, and bounded, so that nothing ever waits on the lane for long (a statement
/// holding a lock another waits for on a lane connection goes through the pool).
const WAIT: Duration = Duration::from_millis(5);
/// How long opening a connection may take (the pool's connect timeout).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// After a connection could not be opened, statements go to the pool this long before
/// the lane tries again: a database that cannot be reached costs each statement the
/// pool's wait, not the lane's as well.
const AFTER_A_FAILED_OPEN: Duration = Duration::from_secs(1);

/// How `pool_size` connections are shared between sqlx's pool and the lane: the lane's
/// size, and the pool's. The lane takes half of them, none of a pool smaller than 4 (a
/// pool that small is a test's or a tool's).
pub fn split(pool_size: u32) -> (u32, u32) {
    let lane = if pool_size >= 4 { pool_size / 2 } else { 0 };
    (lane, pool_size - lane)
}

struct Kept {
    connection: PgConnection,
    opened: Instant,
    idle_since: Instant,
}

pub struct Lane {
    options: PgConnectOptions,
    idle: Mutex<Vec<Kept>>,
    permits: Arc<Semaphore>,
    failed_open: Mutex<Option<Instant>>,
}

/// A lane connection lent to one statement; back to the lane only through `give_back`.
pub struct Lent {
    kept: Option<Kept>,
    _permit: OwnedSemaphorePermit,
}

impl Lent {
    pub fn connection(&mut self) -> &mut PgConnection {
        &mut self.kept.as_mut().expect("lent").connection
    }
}

impl Lane {
    pub fn new(options: PgConnectOptions, size: u32) -> Lane {
        Lane {
            options,
            idle: Mutex::new(Vec::new()),
            permits: Arc::new(Semaphore::new(size as usize)),
            failed_open: Mutex::new(None),
        }
    }

    /// A connection of the lane, or `None` when every one stayed busy for `WAIT` (or the
    /// lane has none).
    pub async fn lend(&self) -> Result<Option<Lent>, sqlx::Error> {
        let permit = match self.permits.clone().try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                match tokio::time::timeout(WAIT, self.permits.clone().acquire_owned()).await {
                    Ok(Ok(permit)) => permit,
                    _ => return Ok(None),
                }
            }
        };
        let kept = self.idle.lock().expect("lane").pop();
        let kept = match kept {
            // Idle as long as the pool keeps one: closed (a firewall may have dropped it
            // silently, and a ping of it would wait for TCP to give up), a new one opened.
            Some(kept) if kept.idle_since.elapsed() >= IDLE_TIMEOUT => {
                drop(kept);
                self.open().await?
            }
            Some(mut kept) if kept.idle_since.elapsed() >= PING_IF_IDLE_FOR => {
                match tokio::time::timeout(CONNECT_TIMEOUT, kept.connection.ping()).await {
                    Ok(Ok(())) => kept,
                    _ => {
                        drop(kept);
                        self.open().await?
                    }
                }
            }
            Some(kept) => kept,
            None => self.open().await?,
        };
        Ok(Some(Lent {
            kept: Some(kept),
            _permit: permit,
        }))
    }

    /// `lent` back to the lane, after a statement that completed.
    pub fn give_back(&self, mut lent: Lent) {
        let Some(mut kept) = lent.kept.take() else {
            return;
        };
        if kept.opened.elapsed() >= MAX_LIFETIME {
            return;
        }
        kept.idle_since = Instant::now();
        self.idle.lock().expect("lane").push(kept);
    }

    async fn open(&self) -> Result<Kept, sqlx::Error> {
        let recently_failed = self
            .failed_open
            .lock()
            .expect("lane")
            .is_some_and(|at| at.elapsed() < AFTER_A_FAILED_OPEN);
        if recently_failed {
            return Err(sqlx::Error::PoolTimedOut);
        }
        let opened = tokio::time::timeout(CONNECT_TIMEOUT, async {
            let mut connection = PgConnection::connect_with(&self.options).await?;
            super::session_defaults(&mut connection).await?;
            Ok::<_, sqlx::Error>(connection)
        })
        .await
        .unwrap_or(Err(sqlx::Error::PoolTimedOut));
        let connection = match opened {
            Ok(connection) => connection,
            Err(err) => {
                *self.failed_open.lock().expect("lane") = Some(Instant::now());
                return Err(err);
            }
        };
        let now = Instant::now();
        Ok(Kept {
            connection,
            opened: now,
            idle_since: now,
        })
    }
}

/// Every lane, beside its pool: a pool is known by its connect options (sqlx keeps them
/// in an `Arc` for the pool's life; the entry holds a clone, so the address is never
/// another pool's). An entry whose pool is gone (the entry holds the options' only other
/// reference) is dropped, with its connections, when the next lane is opened.
static LANES: Mutex<Vec<(Arc<PgConnectOptions>, Arc<Lane>)>> = Mutex::new(Vec::new());

/// Opens a lane of `size` connections beside `pool` (none yet: each opens on first use).
pub fn open_beside(pool: &PgPool, size: u32) {
    let options = pool.connect_options();
    let lane = Arc::new(Lane::new((*options).clone(), size));
    let mut lanes = LANES.lock().expect("lanes");
    lanes.retain(|(options, _)| Arc::strong_count(options) > 1);
    lanes.push((options, lane));
}

/// A lane connection beside `pool`, and its lane; `None` when `pool` has no lane, is
/// closed, every lane connection is busy, or a new one could not be opened (the pool
/// then answers as it would have).
pub async fn lend(pool: &PgPool) -> Option<(Arc<Lane>, Lent)> {
    let options = pool.connect_options();
    if pool.is_closed() {
        // Closed with it: its lane's connections are closed too (dropped).
        LANES
            .lock()
            .expect("lanes")
            .retain(|(kept, _)| !Arc::ptr_eq(kept, &options));
        return None;
    }
    let lane = LANES
        .lock()
        .expect("lanes")
        .iter()
        .find(|(kept, _)| Arc::ptr_eq(kept, &options))
        .map(|(_, lane)| lane.clone())?;
    match lane.lend().await {
        Ok(Some(lent)) => Some((lane, lent)),
        Ok(None) => None,
        Err(err) => {
            tracing::debug!(error = %err, "could not open a connection for the saga's statements; using the pool");
            None
        }
    }
}
