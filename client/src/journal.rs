//! The journal: pending payment intents in a small local SQLite file, so that a client
//! that dies and starts again pays them with the same key.
//!
//! It must never let an intent go before the server gave a terminal answer about it (or
//! provably never saw it), and never hold an API key: only its SHA-256, to tell at resume
//! time which intents a key may resume. Writes are durable before they return
//! (`synchronous=FULL`): an intent is on disk before its first request leaves.
//!
//! SQLite's calls block, so each runs on Tokio's blocking pool; one connection per
//! `Journal` (its clones share it), and several journals on one file, in this process or
//! another, wait for each other's writes (WAL, busy timeout).

use super::intent::{Intent, IntentKey, PaymentRequest};
use chrono::{DateTime, SecondsFormat, Utc};
use rusqlite::{Connection, OptionalExtension, params};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use url::Url;
use uuid::Uuid;

const CREATE_TABLE: &str = "CREATE TABLE IF NOT EXISTS pending_intents (
    idempotency_key TEXT NOT NULL PRIMARY KEY,
    base_url TEXT NOT NULL,
    api_key_sha256 TEXT NOT NULL,
    body TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    payment_id TEXT,
    blocked TEXT,
    last_error TEXT,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
)";

/// Refund intents, kept like payment intents: the key from before the first request
/// until a terminal answer. (payment, body) finds an intent again, whatever its server or
/// API key; `attempts` counts the `POST`s sent for it, across processes.
///
/// `attempts` defaults to 1, not 0: a row written without it (by a client from before the
/// column, into an older file or this one) was written just before its first request and
/// is still kept, so that request may have left and registered a refund. Taking it as
/// sent once errs on the safe side: a refusal of a later request keeps the intent (and
/// its key) instead of letting a new key make a second refund. This client writes 0
/// itself when it records an intent, and counts each request.
const CREATE_REFUNDS_TABLE: &str = "CREATE TABLE IF NOT EXISTS pending_refunds (
    idempotency_key TEXT NOT NULL PRIMARY KEY,
    base_url TEXT NOT NULL,
    api_key_sha256 TEXT NOT NULL,
    payment_id TEXT NOT NULL,
    body TEXT NOT NULL,
    created_at TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 1
)";

/// The column a journal written before refunds were counted lacks (see
/// [`CREATE_REFUNDS_TABLE`] for its default).
const ADD_REFUND_ATTEMPTS: &str =
    "ALTER TABLE pending_refunds ADD COLUMN attempts INTEGER NOT NULL DEFAULT 1";

const COLUMNS: &str = "idempotency_key, base_url, api_key_sha256, body, attempts, payment_id, \
                       blocked, last_error, created_at, updated_at";

#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error("cannot open the journal {path}: {source}")]
    Open {
        path: PathBuf,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("journal: {0}")]
    Db(#[from] rusqlite::Error),
    #[error("journal entry {key} is unreadable: {why}")]
    Corrupt { key: String, why: String },
    /// The intent is no longer kept: while this process was paying it, another one (a
    /// second run of the same payment, a resume beside it) got its terminal answer and let
    /// it go, or a human forgot it (`pagos pay --forget`). Not damage: its key still asks
    /// the server, which answers what that key made.
    #[error(
        "intent {0} left the journal while being paid: another process settled it, or it was forgotten"
    )]
    Gone(IntentKey),
    #[error(
        "the journal already holds key {0} for another payment; an intent's key must be its own"
    )]
    KeyTaken(IntentKey),
}

/// An intent kept in the journal, with what is known about it so far.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PendingIntent {
    pub intent: Intent,
    /// The server it is paid at.
    pub base_url: Url,
    /// SHA-256 (hex) of the API key it was made with.
    pub api_key_sha256: String,
    /// Requests sent for it so far, across processes.
    pub attempts: u32,
    /// The payment, once the server named it.
    pub payment_id: Option<Uuid>,
    /// Set when it must not be retried without a human (its key was used for another
    /// request).
    pub blocked: Option<String>,
    pub last_error: Option<String>,
    pub created_at: chrono::DateTime<chrono::Utc>,
    pub updated_at: chrono::DateTime<chrono::Utc>,
}

impl PendingIntent {
    /// Was it made with this API key?
    pub fn made_with(&self, api_key: &str) -> bool {
        self.api_key_sha256 == api_key_sha256(api_key)
    }
}

/// A refund intent kept in the journal, with where and how it was made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PendingRefund {
    pub intent: crate::refund::RefundIntent,
    /// The server it was asked of.
    pub base_url: Url,
    /// SHA-256 (hex) of the API key it was made with.
    pub api_key_sha256: String,
    /// Requests sent for it so far, across processes (a row from before they were
    /// counted reads 1: it may have been sent).
    pub attempts: u32,
    pub created_at: chrono::DateTime<chrono::Utc>,
}

impl PendingRefund {
    /// Was it made with this API key?
    pub fn made_with(&self, api_key: &str) -> bool {
        self.api_key_sha256 == api_key_sha256(api_key)
    }
}

/// What the journal keeps of an intent, payment or refund, as `intent_for` and
/// `refund_intent_for` weigh it: where and with which API key it was made.
pub(crate) trait KeptIntent: Sized {
    type Intent;
    fn base_url(&self) -> &Url;
    fn api_key_sha256(&self) -> &str;
    fn key(&self) -> &IntentKey;
    fn into_intent(self) -> Self::Intent;
}

/// The same for a payment's and a refund's kept intent: their fields are alike.
macro_rules! kept_intent {
    ($pending:ty, $intent:ty) => {
        impl KeptIntent for $pending {
            type Intent = $intent;
            fn base_url(&self) -> &Url {
                &self.base_url
            }
            fn api_key_sha256(&self) -> &str {
                &self.api_key_sha256
            }
            fn key(&self) -> &IntentKey {
                self.intent.key()
            }
            fn into_intent(self) -> $intent {
                self.intent
            }
        }
    };
}

kept_intent!(PendingIntent, Intent);
kept_intent!(PendingRefund, crate::refund::RefundIntent);

/// SHA-256 of an API key, hex: how the journal names a merchant without holding its key.
pub fn api_key_sha256(api_key: &str) -> String {
    hex::encode(Sha256::digest(api_key.as_bytes()))
}

/// A journal file of pending intents. Cheap to clone; safe to share between tasks and
/// between processes (SQLite in WAL mode, with a busy timeout).
#[derive(Clone, Debug)]
pub struct Journal {
    db: Arc<Mutex<Connection>>,
    path: PathBuf,
}

/// Now, to the millisecond, as every timestamp of the journal.
fn now() -> DateTime<Utc> {
    use chrono::DurationRound;
    let now = Utc::now();
    now.duration_trunc(chrono::TimeDelta::milliseconds(1))
        .unwrap_or(now)
}

/// How a time is written: RFC 3339 with the offset spelled out
/// (`2026-01-01T00:00:00.123+00:00`), what journals have always held, so older files read
/// alike and `ORDER BY created_at` is the order of creation.
fn stamp(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::AutoSi, false)
}

fn read_stamp(text: &str) -> Result<DateTime<Utc>, String> {
    DateTime::parse_from_rfc3339(text)
        .map(|at| at.with_timezone(&Utc))
        .or_else(|_| {
            chrono::NaiveDateTime::parse_from_str(text, "%Y-%m-%d %H:%M:%S%.f")
                .map(|at| at.and_utc())
        })
        .map_err(|e| format!("unreadable time {text:?}: {e}"))
}

/// One row, as stored.
struct Row {
    idempotency_key: String,
    base_url: String,
    api_key_sha256: String,
    body: String,
    attempts: i64,
    payment_id: Option<String>,
    blocked: Option<String>,
    last_error: Option<String>,
    created_at: String,
    updated_at: String,
}

fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Row> {
    Ok(Row {
        idempotency_key: r.get(0)?,
        base_url: r.get(1)?,
        api_key_sha256: r.get(2)?,
        body: r.get(3)?,
        attempts: r.get(4)?,
        payment_id: r.get(5)?,
        blocked: r.get(6)?,
        last_error: r.get(7)?,
        created_at: r.get(8)?,
        updated_at: r.get(9)?,
    })
}

fn gone(key: &IntentKey) -> JournalError {
    JournalError::Gone(key.clone())
}

impl Journal {
    /// Where the journal lives unless told otherwise: `pagos/journal.db` in the user's
    /// data directory (`$XDG_DATA_HOME` or `~/.local/share` on Linux,
    /// `~/Library/Application Support` on macOS, `%APPDATA%` on Windows).
    pub fn default_path() -> Option<PathBuf> {
        dirs::data_dir().map(|dir| dir.join("pagos").join("journal.db"))
    }

    /// Opens (creating if needed) the journal at `path`, and its parent directories.
    pub async fn open(path: impl Into<PathBuf>) -> Result<Journal, JournalError> {
        let path = path.into();
        let opened = path.clone();
        let db = tokio::task::spawn_blocking(move || connect(&opened))
            .await
            .map_err(|e| JournalError::Open {
                path: path.clone(),
                source: e.into(),
            })?
            .map_err(|source| JournalError::Open {
                path: path.clone(),
                source,
            })?;
        Ok(Journal {
            db: Arc::new(Mutex::new(db)),
            path,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `work` on the connection, on the blocking pool.
    async fn with<T: Send + 'static>(
        &self,
        work: impl FnOnce(&Connection) -> Result<T, JournalError> + Send + 'static,
    ) -> Result<T, JournalError> {
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || {
            // Nothing panics while holding the lock; a poisoned one still holds the
            // connection.
            let db = db.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            work(&db)
        })
        .await
        .map_err(|e| JournalError::Corrupt {
            key: String::new(),
            why: format!("a journal call did not finish: {e}"),
        })?
    }

    /// Writes the intent down before anything is sent. Recording it again is a no-op that
    /// answers what is kept; another request under the same key is refused. An intent the
    /// caller says was sent before ([`Intent::first_sent_at`]) is written as made then,
    /// with one request sent: a later resume knows its age and that it may have paid.
    pub async fn record(
        &self,
        intent: &Intent,
        base_url: &Url,
        api_key: &str,
    ) -> Result<PendingIntent, JournalError> {
        let key = intent.key().to_string();
        let body = intent.request().to_json().to_string();
        let base_url = base_url.to_string();
        let hash = api_key_sha256(api_key);
        let now = now();
        let (made, attempts) = made_and_sent(intent, now);
        let (made, at) = (stamp(made), stamp(now));
        // One statement: another task or process that recorded it first keeps its row.
        self.with(move |db| insert_intent(db, [key, base_url, hash, body, made, at], attempts))
            .await?;
        match self.get(intent.key()).await? {
            Some(kept) if kept.intent == *intent => Ok(kept),
            _ => Err(JournalError::KeyTaken(intent.key().clone())),
        }
    }

    /// One intent, if kept.
    pub async fn get(&self, key: &IntentKey) -> Result<Option<PendingIntent>, JournalError> {
        let key = key.to_string();
        self.with(move |db| {
            db.query_row(
                &format!("SELECT {COLUMNS} FROM pending_intents WHERE idempotency_key = ?1"),
                params![key],
                row,
            )
            .optional()?
            .map(pending)
            .transpose()
        })
        .await
    }

    /// Every kept intent, oldest first.
    pub async fn pending(&self) -> Result<Vec<PendingIntent>, JournalError> {
        self.with(kept_intents).await
    }

    /// The intents kept for `fresh`'s very request (any server, any API key), oldest
    /// first, or else `fresh` written down as [`record`](Journal::record) does: one
    /// transaction holding the journal's write lock, so two processes asking for the same
    /// payment at once (a form sent twice, a command run twice) never both find none and
    /// pay it under two keys. With [`Beside::Others`], `fresh` is also written down when
    /// the only ones kept were made at another server or with another API key.
    pub async fn kept_or_record(
        &self,
        fresh: &Intent,
        base_url: &Url,
        api_key: &str,
        beside: Beside,
    ) -> Result<Kept<PendingIntent>, JournalError> {
        let request = fresh.request().clone();
        let now = now();
        let (made, attempts) = made_and_sent(fresh, now);
        let values = [
            fresh.key().to_string(),
            base_url.to_string(),
            api_key_sha256(api_key),
            request.to_json().to_string(),
            stamp(made),
            stamp(now),
        ];
        self.with(move |db| {
            immediate(db, |db| {
                let kept: Vec<_> = kept_intents(db)?
                    .into_iter()
                    .filter(|k| *k.intent.request() == request)
                    .collect();
                let here = kept
                    .iter()
                    .any(|k| k.base_url.as_str() == values[1] && k.api_key_sha256 == values[2]);
                if here || (!kept.is_empty() && beside == Beside::Nothing) {
                    return Ok(Kept::Found(kept));
                }
                insert_intent(db, values, attempts)?;
                Ok(Kept::Recorded)
            })
        })
        .await
    }

    /// Every kept intent asking exactly `request`, whatever its server or API key, oldest
    /// first: a payment asked again while one of them is pending may already be paid.
    pub async fn find(&self, request: &PaymentRequest) -> Result<Vec<PendingIntent>, JournalError> {
        // Compared as requests, not as stored text: a body written by an older client
        // (another key order) is the same request.
        let kept = self.pending().await?;
        Ok(kept
            .into_iter()
            .filter(|k| k.intent.request() == request)
            .collect())
    }

    /// Counts a request about to be sent; answers how many were sent before it. One
    /// statement, so two processes resuming the same intent never both see "none before".
    /// [`JournalError::Gone`] when the intent is no longer kept (another process settled
    /// it, or it was forgotten): nothing is written, and nothing is written back.
    pub async fn count_attempt(&self, key: &IntentKey) -> Result<u32, JournalError> {
        let id = key.clone();
        let after: Option<i64> = self
            .with(move |db| {
                Ok(db
                    .query_row(
                        "UPDATE pending_intents SET attempts = attempts + 1, updated_at = ?1 \
                         WHERE idempotency_key = ?2 RETURNING attempts",
                        params![stamp(now()), id.to_string()],
                        |r| r.get(0),
                    )
                    .optional()?)
            })
            .await?;
        let after = after.ok_or_else(|| gone(key))?;
        Ok(u32::try_from(after.saturating_sub(1)).unwrap_or(0))
    }

    /// The server named the payment: from now on it is looked up, not posted.
    /// [`JournalError::Gone`] when the intent is no longer kept, as for
    /// [`note`](Journal::note) and [`block`](Journal::block).
    pub async fn payment_known(&self, key: &IntentKey, id: Uuid) -> Result<(), JournalError> {
        self.update(key, "payment_id = ?1", id.to_string()).await
    }

    /// Notes why the last try did not settle the intent.
    pub async fn note(&self, key: &IntentKey, error: &str) -> Result<(), JournalError> {
        self.update(key, "last_error = ?1", error.to_owned()).await
    }

    /// Keeps the intent but out of automatic retries, until a human forgets it.
    pub async fn block(&self, key: &IntentKey, why: &str) -> Result<(), JournalError> {
        self.update(key, "blocked = ?1, last_error = ?1", why.to_owned())
            .await
    }

    /// Lets the intent go. Answers whether it was kept.
    pub async fn remove(&self, key: &IntentKey) -> Result<bool, JournalError> {
        let key = key.to_string();
        self.with(move |db| {
            let removed = db.execute(
                "DELETE FROM pending_intents WHERE idempotency_key = ?1",
                params![key],
            )?;
            Ok(removed > 0)
        })
        .await
    }

    /// Writes a refund intent down before anything is sent; recording it again is a no-op.
    /// Another refund under the same key is refused.
    pub async fn record_refund(
        &self,
        intent: &crate::refund::RefundIntent,
        base_url: &Url,
        api_key: &str,
    ) -> Result<(), JournalError> {
        let key = intent.key().to_string();
        let payment = intent.request().payment().to_string();
        let body = intent.request().to_json().to_string();
        let (base_url, hash, at) = (base_url.to_string(), api_key_sha256(api_key), stamp(now()));
        let (k, p, b) = (key.clone(), payment.clone(), body.clone());
        let kept: Option<(String, String)> = self
            .with(move |db| {
                insert_refund(db, [k.clone(), base_url, hash, p, b, at])?;
                Ok(db
                    .query_row(
                        "SELECT payment_id, body FROM pending_refunds WHERE idempotency_key = ?1",
                        params![k],
                        |r| Ok((r.get(0)?, r.get(1)?)),
                    )
                    .optional()?)
            })
            .await?;
        match kept {
            Some((p, b)) if p == payment && b == body => Ok(()),
            _ => Err(JournalError::KeyTaken(intent.key().clone())),
        }
    }

    /// Every kept refund intent asking exactly `request` (the same payment, the same
    /// body), whatever its server or API key, oldest first: a refund asked again while one
    /// of them is kept may already have been made.
    pub async fn find_refunds(
        &self,
        request: &crate::refund::RefundRequest,
    ) -> Result<Vec<PendingRefund>, JournalError> {
        let payment = request.payment().to_string();
        let body = request.to_json().to_string();
        let rows = self
            .with(move |db| refund_rows(db, &payment, &body))
            .await?;
        pending_refunds(request, rows)
    }

    /// The refund intents kept for `fresh`'s very request (any server, any API key),
    /// oldest first, or else `fresh` written down as
    /// [`record_refund`](Journal::record_refund) does, in one transaction holding the
    /// journal's write lock: the same refund asked twice at once is never made under two
    /// keys. With [`Beside::Others`], `fresh` is also written down when the only ones kept
    /// were made at another server or with another API key.
    pub async fn kept_refunds_or_record(
        &self,
        fresh: &crate::refund::RefundIntent,
        base_url: &Url,
        api_key: &str,
        beside: Beside,
    ) -> Result<Kept<PendingRefund>, JournalError> {
        let request = fresh.request().clone();
        let payment = request.payment().to_string();
        let body = request.to_json().to_string();
        let values = [
            fresh.key().to_string(),
            base_url.to_string(),
            api_key_sha256(api_key),
            payment.clone(),
            body.clone(),
            stamp(now()),
        ];
        let rows = self
            .with(move |db| {
                immediate(db, |db| {
                    let rows = refund_rows(db, &payment, &body)?;
                    let here = rows
                        .iter()
                        .any(|(_, url, hash, _, _)| *url == values[1] && *hash == values[2]);
                    if here || (!rows.is_empty() && beside == Beside::Nothing) {
                        return Ok(Some(rows));
                    }
                    insert_refund(db, values)?;
                    Ok(None)
                })
            })
            .await?;
        match rows {
            Some(rows) => Ok(Kept::Found(pending_refunds(&request, rows)?)),
            None => Ok(Kept::Recorded),
        }
    }
}

/// A kept refund's row as [`refund_rows`] reads it: key, server, API key hash, attempts,
/// when made.
type RefundRow = (String, String, String, i64, String);

/// The rows of refund intents asking `body` of `payment`, oldest first.
fn refund_rows(db: &Connection, payment: &str, body: &str) -> Result<Vec<RefundRow>, JournalError> {
    let mut statement = db.prepare(
        "SELECT idempotency_key, base_url, api_key_sha256, attempts, created_at \
         FROM pending_refunds WHERE payment_id = ?1 AND body = ?2 \
         ORDER BY created_at",
    )?;
    let rows = statement.query_map(params![payment, body], |r| {
        Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
    })?;
    Ok(rows.collect::<Result<_, _>>()?)
}

fn pending_refunds(
    request: &crate::refund::RefundRequest,
    rows: Vec<RefundRow>,
) -> Result<Vec<PendingRefund>, JournalError> {
    rows.into_iter()
        .map(|(key, base_url, hash, attempts, created_at)| {
            let corrupt = |why: String| JournalError::Corrupt {
                key: key.clone(),
                why,
            };
            let parsed = IntentKey::parse(&key).map_err(|e| corrupt(e.to_string()))?;
            Ok(PendingRefund {
                intent: crate::refund::RefundIntent::with_key(parsed, request.clone()),
                base_url: Url::parse(&base_url).map_err(|e| corrupt(e.to_string()))?,
                api_key_sha256: hash,
                attempts: u32::try_from(attempts).unwrap_or(0),
                created_at: read_stamp(&created_at).map_err(corrupt)?,
            })
        })
        .collect()
}

impl Journal {
    /// The kept refund intent asking exactly `request` of this server with this API key
    /// (the oldest, if several).
    pub async fn find_refund(
        &self,
        request: &crate::refund::RefundRequest,
        base_url: &Url,
        api_key: &str,
    ) -> Result<Option<crate::refund::RefundIntent>, JournalError> {
        Ok(self
            .find_refunds(request)
            .await?
            .into_iter()
            .find(|k| k.base_url == *base_url && k.made_with(api_key))
            .map(|k| k.intent))
    }

    /// Counts a refund request about to be sent; answers how many were sent before it.
    /// One statement, so two processes asking the same refund never both see "none
    /// before". [`JournalError::Gone`] when the refund intent is no longer kept.
    pub async fn count_refund_attempt(&self, key: &IntentKey) -> Result<u32, JournalError> {
        let id = key.to_string();
        let after: Option<i64> = self
            .with(move |db| {
                Ok(db
                    .query_row(
                        "UPDATE pending_refunds SET attempts = attempts + 1 \
                         WHERE idempotency_key = ?1 RETURNING attempts",
                        params![id],
                        |r| r.get(0),
                    )
                    .optional()?)
            })
            .await?;
        let after = after.ok_or_else(|| gone(key))?;
        Ok(u32::try_from(after.saturating_sub(1)).unwrap_or(0))
    }

    /// Lets a refund intent go. Answers whether it was kept.
    pub async fn remove_refund(&self, key: &IntentKey) -> Result<bool, JournalError> {
        let key = key.to_string();
        self.with(move |db| {
            Ok(db.execute(
                "DELETE FROM pending_refunds WHERE idempotency_key = ?1",
                params![key],
            )? > 0)
        })
        .await
    }

    /// Sets `assignments` (with `?1` bound to `value`) on a kept intent.
    async fn update(
        &self,
        key: &IntentKey,
        assignments: &'static str,
        value: String,
    ) -> Result<(), JournalError> {
        let id = key.to_string();
        let changed = self
            .with(move |db| {
                Ok(db.execute(
                    &format!(
                        "UPDATE pending_intents SET {assignments}, updated_at = ?2 \
                         WHERE idempotency_key = ?3"
                    ),
                    params![value, stamp(now()), id],
                )?)
            })
            .await?;
        if changed == 0 {
            return Err(gone(key));
        }
        Ok(())
    }
}

/// What [`Journal::kept_or_record`] and [`Journal::kept_refunds_or_record`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kept<T> {
    /// Intents kept for this same request, whatever their server or API key, oldest
    /// first; nothing was written.
    Found(Vec<T>),
    /// None was kept: the fresh intent is written down now.
    Recorded,
}

/// Whether [`Journal::kept_or_record`] writes a fresh intent down beside kept ones made at
/// another server or with another API key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Beside {
    /// No: those are answered ([`Kept::Found`]), nothing written (`pagos pay` refuses to
    /// make a second payment beside one that may have paid).
    Nothing,
    /// Yes: only one kept at this server with this API key is answered.
    Others,
}

/// Runs `work` in a transaction that takes the journal's write lock first (`BEGIN
/// IMMEDIATE`): what it read still holds when it writes, whatever other processes do.
fn immediate<T>(
    db: &Connection,
    work: impl FnOnce(&Connection) -> Result<T, JournalError>,
) -> Result<T, JournalError> {
    db.execute_batch("BEGIN IMMEDIATE")?;
    let done = work(db).and_then(|done| Ok(db.execute_batch("COMMIT").map(|()| done)?));
    if done.is_err() {
        // Never left open, holding the write lock for every later call and process (a
        // failed COMMIT, on a full disk, leaves the transaction open). The error is what
        // went wrong; a failed rollback leaves it to SQLite.
        let _ = db.execute_batch("ROLLBACK");
    }
    done
}

/// When an intent counts as made, and the requests counted for it: one, made then, for
/// an intent the caller says was sent before; none, made `now`, otherwise.
fn made_and_sent(
    intent: &Intent,
    now: chrono::DateTime<chrono::Utc>,
) -> (chrono::DateTime<chrono::Utc>, i64) {
    match intent.first_sent() {
        Some(sent) => (sent.min(now), 1),
        None => (now, 0),
    }
}

/// Writes an intent's row (`values`: key, server, API key hash, body, made, updated)
/// unless its key is kept already.
fn insert_intent(db: &Connection, values: [String; 6], attempts: i64) -> Result<(), JournalError> {
    let [key, base_url, hash, body, made, at] = values;
    db.execute(
        "INSERT INTO pending_intents (idempotency_key, base_url, api_key_sha256, body, \
         attempts, created_at, updated_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) \
         ON CONFLICT (idempotency_key) DO NOTHING",
        params![key, base_url, hash, body, attempts, made, at],
    )?;
    Ok(())
}

/// Writes a refund intent's row (`values`: key, server, API key hash, payment, body,
/// made), not sent yet, unless its key is kept already.
fn insert_refund(db: &Connection, values: [String; 6]) -> Result<(), JournalError> {
    let [key, base_url, hash, payment, body, at] = values;
    db.execute(
        "INSERT INTO pending_refunds (idempotency_key, base_url, api_key_sha256, \
         payment_id, body, created_at, attempts) VALUES (?1, ?2, ?3, ?4, ?5, ?6, 0) \
         ON CONFLICT (idempotency_key) DO NOTHING",
        params![key, base_url, hash, payment, body, at],
    )?;
    Ok(())
}

/// Every kept payment intent, oldest first.
fn kept_intents(db: &Connection) -> Result<Vec<PendingIntent>, JournalError> {
    let mut statement = db.prepare(&format!(
        "SELECT {COLUMNS} FROM pending_intents ORDER BY created_at"
    ))?;
    let rows = statement.query_map([], row)?;
    rows.map(|r| pending(r?)).collect()
}

/// Opens the file (owner-only), in WAL mode with full sync and a busy timeout, and makes
/// sure the table is there.
fn connect(path: &Path) -> Result<Connection, Box<dyn std::error::Error + Send + Sync>> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)?;
    }
    create_private(path)?;
    let mut db = Connection::open(path)?;
    db.busy_timeout(Duration::from_secs(10))?;
    db.pragma_update(None, "journal_mode", "WAL")?;
    // FULL: a committed intent survives a power cut, not only a crash.
    db.pragma_update(None, "synchronous", "FULL")?;
    db.execute_batch(CREATE_TABLE)?;
    db.execute_batch(CREATE_REFUNDS_TABLE)?;
    count_refunds(&mut db)?;
    Ok(db)
}

/// Gives a journal written before refund requests were counted its `attempts` column.
/// Looked at again and added in one write transaction: two processes opening the same
/// older file add it once.
fn count_refunds(db: &mut Connection) -> rusqlite::Result<()> {
    fn counted(db: &Connection) -> rusqlite::Result<bool> {
        db.query_row(
            "SELECT COUNT(*) > 0 FROM pragma_table_info('pending_refunds') \
             WHERE name = 'attempts'",
            [],
            |r| r.get(0),
        )
    }
    if counted(db)? {
        return Ok(());
    }
    let tx = db.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    if !counted(&tx)? {
        tx.execute_batch(ADD_REFUND_ATTEMPTS)?;
    }
    tx.commit()
}

fn pending(model: Row) -> Result<PendingIntent, JournalError> {
    let corrupt = |why: String| JournalError::Corrupt {
        key: model.idempotency_key.clone(),
        why,
    };
    let key = IntentKey::parse(&model.idempotency_key).map_err(|e| corrupt(e.to_string()))?;
    let body: serde_json::Value =
        serde_json::from_str(&model.body).map_err(|e| corrupt(e.to_string()))?;
    let request = PaymentRequest::from_json(&body).map_err(|e| corrupt(e.to_string()))?;
    let base_url = Url::parse(&model.base_url).map_err(|e| corrupt(e.to_string()))?;
    let payment_id = model
        .payment_id
        .as_deref()
        .map(Uuid::parse_str)
        .transpose()
        .map_err(|e| corrupt(e.to_string()))?;
    let created_at = read_stamp(&model.created_at).map_err(corrupt)?;
    let updated_at = read_stamp(&model.updated_at).map_err(corrupt)?;
    let attempts = u32::try_from(model.attempts).unwrap_or(0);
    // An intent sent before carries when: paid from this copy after its row left the
    // journal (another process settled or forgot it meanwhile), it is still held to the
    // server's key retention, never re-recorded as never sent.
    let intent = match attempts {
        0 => Intent::with_key(key, request),
        _ => Intent::with_key(key, request).first_sent_at(created_at),
    };
    Ok(PendingIntent {
        intent,
        base_url,
        api_key_sha256: model.api_key_sha256,
        attempts,
        payment_id,
        blocked: model.blocked,
        last_error: model.last_error,
        created_at,
        updated_at,
    })
}

/// Creates the file readable by its owner only: it names payments and merchants.
fn create_private(path: &Path) -> std::io::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.create(true).append(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    options.open(path).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn intent() -> Intent {
        Intent::new(PaymentRequest::new("42", 250_000, "COP").expect("valid"))
    }

    fn url() -> Url {
        Url::parse("http://127.0.0.1:8080/").expect("url")
    }

    async fn journal(dir: &tempfile::TempDir) -> Journal {
        Journal::open(dir.path().join("nested").join("journal.db"))
            .await
            .expect("journal")
    }

    #[tokio::test]
    async fn a_recorded_intent_is_there_after_the_journal_is_opened_again() {
        let dir = tempfile::tempdir().expect("dir");
        let intent = intent();
        {
            let journal = journal(&dir).await;
            journal
                .record(&intent, &url(), "sk_test_acme")
                .await
                .expect("recorded");
            assert_eq!(journal.count_attempt(intent.key()).await.expect("ok"), 0);
            assert_eq!(journal.count_attempt(intent.key()).await.expect("ok"), 1);
        }
        let reopened = journal(&dir).await;
        let kept = reopened.pending().await.expect("pending");
        assert_eq!(kept.len(), 1);
        assert_eq!(kept[0].intent, intent);
        assert_eq!(kept[0].attempts, 2);
        assert_eq!(kept[0].base_url, url());
        assert!(kept[0].made_with("sk_test_acme"));
        assert!(!kept[0].made_with("sk_test_globex"));
    }

    #[tokio::test]
    async fn recording_twice_keeps_one_entry_and_another_body_under_the_key_is_refused() {
        let dir = tempfile::tempdir().expect("dir");
        let journal = journal(&dir).await;
        let intent = intent();
        journal.record(&intent, &url(), "k").await.expect("first");
        journal.record(&intent, &url(), "k").await.expect("again");
        assert_eq!(journal.pending().await.expect("pending").len(), 1);
        let other = Intent::with_key(
            intent.key().clone(),
            PaymentRequest::new("42", 1, "COP").expect("valid"),
        );
        assert!(matches!(
            journal.record(&other, &url(), "k").await,
            Err(JournalError::KeyTaken(_))
        ));
    }

    #[tokio::test]
    async fn a_request_is_found_again_whatever_its_server_or_api_key_oldest_first() {
        let dir = tempfile::tempdir().expect("dir");
        let journal = journal(&dir).await;
        let first = intent();
        let elsewhere = intent();
        let other_body = Intent::new(PaymentRequest::new("42", 1, "COP").expect("valid"));
        journal.record(&first, &url(), "k").await.expect("ok");
        let other_url = Url::parse("https://pagos.example/").expect("url");
        journal
            .record(&elsewhere, &other_url, "k2")
            .await
            .expect("ok");
        journal.record(&other_body, &url(), "k").await.expect("ok");

        let found = journal.find(first.request()).await.expect("find");

        let keys: Vec<_> = found.iter().map(|k| k.intent.key()).collect();
        assert_eq!(keys, [first.key(), elsewhere.key()]);
        assert!(found[0].made_with("k") && found[1].made_with("k2"));
    }

    #[tokio::test]
    async fn an_intent_sent_before_is_written_as_made_then_with_one_request_sent() {
        let dir = tempfile::tempdir().expect("dir");
        let journal = journal(&dir).await;
        let sent = now() - chrono::TimeDelta::hours(30);
        let intent = intent().first_sent_at(sent);

        let kept = journal
            .record(&intent, &url(), "k")
            .await
            .expect("recorded");

        assert_eq!(kept.created_at, sent);
        assert_eq!(kept.attempts, 1);
        assert_eq!(kept.intent, intent);
    }

    #[tokio::test]
    async fn the_api_key_is_never_written_in_clear() {
        let dir = tempfile::tempdir().expect("dir");
        let journal = journal(&dir).await;
        let secret = "sk_live_do_not_store_me_4711";
        journal.record(&intent(), &url(), secret).await.expect("ok");
        drop(journal);
        for name in ["journal.db", "journal.db-wal"] {
            let path = dir.path().join("nested").join(name);
            if let Ok(bytes) = std::fs::read(&path) {
                let found = bytes.windows(secret.len()).any(|w| w == secret.as_bytes());
                assert!(!found, "{name} holds the API key");
            }
        }
    }

    #[tokio::test]
    async fn a_removed_intent_is_gone_and_the_payment_id_and_block_are_kept_until_then() {
        let dir = tempfile::tempdir().expect("dir");
        let journal = journal(&dir).await;
        let intent = intent();
        journal.record(&intent, &url(), "k").await.expect("ok");
        let id = Uuid::new_v4();
        journal.payment_known(intent.key(), id).await.expect("ok");
        journal.block(intent.key(), "key reused").await.expect("ok");
        let kept = journal.get(intent.key()).await.expect("ok").expect("kept");
        assert_eq!(kept.payment_id, Some(id));
        assert_eq!(kept.blocked.as_deref(), Some("key reused"));
        assert!(journal.remove(intent.key()).await.expect("ok"));
        assert!(!journal.remove(intent.key()).await.expect("ok"));
        assert!(journal.pending().await.expect("ok").is_empty());
    }

    #[tokio::test]
    async fn concurrent_requests_of_one_intent_are_counted_once_each() {
        let dir = tempfile::tempdir().expect("dir");
        let first = journal(&dir).await;
        let second = journal(&dir).await;
        let intent = intent();
        first.record(&intent, &url(), "k").await.expect("ok");
        let counts = (0..10).map(|i| {
            let journal = if i % 2 == 0 { &first } else { &second };
            journal.count_attempt(intent.key())
        });
        let mut before: Vec<u32> = futures::future::try_join_all(counts).await.expect("ok");
        before.sort_unstable();
        assert_eq!(before, (0..10).collect::<Vec<u32>>());
    }

    #[tokio::test]
    async fn a_journal_written_by_an_earlier_client_is_read_as_it_was_written() {
        // The row exactly as the client wrote it before it had a crate of its own
        // (sea-orm over sqlx: times as RFC 3339 with a spelled-out offset).
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("journal.db");
        {
            let db = Connection::open(&path).expect("db");
            db.execute_batch(CREATE_TABLE).expect("table");
            db.execute(
                "INSERT INTO pending_intents VALUES ('k-older', 'http://127.0.0.1:8080/', ?1, \
                 '{\"creditoId\":\"42\",\"moneda\":\"COP\",\"monto\":250000}', 3, NULL, NULL, \
                 '502 Bad Gateway', '2026-01-01T00:00:00.123+00:00', '2026-01-01T00:00:05+00:00')",
                params![api_key_sha256("sk_test_acme")],
            )
            .expect("row");
        }
        let journal = Journal::open(&path).await.expect("journal");
        let newer = intent();
        journal.record(&newer, &url(), "k").await.expect("recorded");
        let kept = journal.pending().await.expect("pending");
        assert_eq!(kept.len(), 2);
        let older = &kept[0];
        assert_eq!(older.intent.key().as_str(), "k-older", "oldest first");
        assert_eq!(older.intent.request(), intent().request());
        assert_eq!(older.attempts, 3);
        assert!(older.made_with("sk_test_acme"));
        assert_eq!(older.last_error.as_deref(), Some("502 Bad Gateway"));
        assert_eq!(
            older
                .created_at
                .to_rfc3339_opts(SecondsFormat::Millis, true),
            "2026-01-01T00:00:00.123Z"
        );
        assert_eq!(kept[1].intent, newer);
    }

    fn refund() -> crate::refund::RefundRequest {
        crate::refund::RefundRequest::new(Uuid::new_v4(), Some(1_000), Some("duplicado"))
            .expect("valid")
    }

    #[tokio::test]
    async fn a_refund_is_found_again_whatever_its_server_or_api_key_and_each_request_counted() {
        let dir = tempfile::tempdir().expect("dir");
        let journal = journal(&dir).await;
        let request = refund();
        let first = crate::refund::RefundIntent::new(request.clone());
        let elsewhere = crate::refund::RefundIntent::new(request.clone());
        let other_url = Url::parse("http://localhost:8080/").expect("url");
        journal
            .record_refund(&first, &url(), "k")
            .await
            .expect("ok");
        journal
            .record_refund(&elsewhere, &other_url, "k2")
            .await
            .expect("ok");
        let other = crate::refund::RefundIntent::new(refund());
        journal
            .record_refund(&other, &url(), "k")
            .await
            .expect("ok");
        assert_eq!(
            journal.count_refund_attempt(first.key()).await.expect("ok"),
            0
        );
        assert_eq!(
            journal.count_refund_attempt(first.key()).await.expect("ok"),
            1
        );

        let found = journal.find_refunds(&request).await.expect("find");

        let keys: Vec<_> = found.iter().map(|k| k.intent.key()).collect();
        assert_eq!(keys, [first.key(), elsewhere.key()]);
        assert_eq!((found[0].attempts, found[1].attempts), (2, 0));
        assert!(found[0].made_with("k") && found[1].made_with("k2"));
        assert_eq!(found[1].base_url, other_url);
        let here = journal
            .find_refund(&request, &url(), "k")
            .await
            .expect("ok");
        assert_eq!(here, Some(first.clone()));
        let there = journal
            .find_refund(&request, &url(), "k2")
            .await
            .expect("ok");
        assert_eq!(there, None);
    }

    /// A journal from before refund requests were counted: its table gets the column, and
    /// a refund kept there reads as sent once (it may have been), while one recorded now
    /// reads as never sent.
    #[tokio::test]
    async fn a_refund_kept_by_an_earlier_client_reads_as_sent_once() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("journal.db");
        let request = refund();
        {
            let db = Connection::open(&path).expect("db");
            db.execute_batch(
                "CREATE TABLE pending_refunds (
                    idempotency_key TEXT NOT NULL PRIMARY KEY,
                    base_url TEXT NOT NULL,
                    api_key_sha256 TEXT NOT NULL,
                    payment_id TEXT NOT NULL,
                    body TEXT NOT NULL,
                    created_at TEXT NOT NULL
                )",
            )
            .expect("table");
            db.execute(
                "INSERT INTO pending_refunds VALUES ('r-older', 'http://127.0.0.1:8080/', ?1, \
                 ?2, ?3, '2026-01-01T00:00:00.123+00:00')",
                params![
                    api_key_sha256("k"),
                    request.payment().to_string(),
                    request.to_json().to_string()
                ],
            )
            .expect("row");
        }
        let journal = Journal::open(&path).await.expect("journal");
        // Opened again (as a second process would): the column is added once.
        let again = Journal::open(&path).await.expect("journal");
        let newer = crate::refund::RefundIntent::new(request.clone());
        again
            .record_refund(&newer, &url(), "k")
            .await
            .expect("recorded");

        let found = journal.find_refunds(&request).await.expect("find");

        assert_eq!(found.len(), 2);
        assert_eq!(found[0].intent.key().as_str(), "r-older");
        assert_eq!(found[0].attempts, 1, "it may have been sent");
        assert_eq!(found[1].intent, newer);
        assert_eq!(found[1].attempts, 0);
        let older = found[0].intent.key();
        assert_eq!(journal.count_refund_attempt(older).await.expect("ok"), 1);
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn the_journal_file_is_readable_by_its_owner_only() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("dir");
        let journal = journal(&dir).await;
        let mode = std::fs::metadata(journal.path())
            .expect("file")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}
