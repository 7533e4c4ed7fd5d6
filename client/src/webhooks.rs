//! Receiving pagos' webhooks, on the merchant's side: check a delivery ([`Verifier`]:
//! the Standard Webhooks signature with the endpoint's secret, or any secret it holds during
//! a rotation, and a `webhook-timestamp` within 5 minutes of the clock), then apply each
//! event once ([`Inbox`]). A secret is what pagos makes, `whsec_` and the base64 of a 24-
//! to 64-byte key; anything else (an empty one, with which anyone could sign) is refused
//! when the verifier is built.
//!
//! Deliveries are at least once and in any order, so the inbox uses two rules, in the
//! same SQLite transaction as the merchant's own effect:
//! - **dedupe by id**: the `webhook-id` is recorded with the effect; a second delivery of
//!   it finds it there and changes nothing ([`Applied::Duplicate`]);
//! - **sequence**: `secuencia` grows per payment (or refund); an event at or below the last
//!   one applied for its payment is old news ([`Applied::Stale`]).
//!
//! If the effect fails, nothing is recorded: answer non-2xx and pagos delivers it again.

use http::HeaderMap;
use pagos_types::Evento;
use rusqlite::{Connection, OptionalExtension, Transaction, params};
use std::path::Path;
use std::sync::{Mutex, PoisonError};

/// Why a delivery is refused (answer 400 or 401: pagos retries it).
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    /// The secret given to [`Verifier::new`] or [`Verifier::also`] is not one pagos makes.
    #[error("not a webhook secret: whsec_ followed by the standard base64 of a 24- to 64-byte key")]
    Secret,
    #[error("the signature or timestamp does not verify: {0}")]
    Signature(String),
    #[error("the body is not a pagos event: {0}")]
    Body(String),
}

impl VerifyError {
    /// The status to answer: 401 for a signature, 400 for a body.
    pub fn status(&self) -> u16 {
        match self {
            VerifyError::Body(_) => 400,
            _ => 401,
        }
    }
}

/// Checks deliveries against the endpoint's secret (and the others it holds during a
/// rotation: pagos signs with every secret replaced in the last 24 h, up to three
/// signatures, and any one verifying is enough), with the Standard Webhooks reference
/// implementation.
pub struct Verifier {
    secrets: Vec<standardwebhooks::Webhook>,
}

/// The key lengths the Standard Webhooks specification allows, and pagos makes (32).
const KEY_BYTES: std::ops::RangeInclusive<usize> = 24..=64;

/// The verifier of one secret, as pagos makes them: `whsec_` and the standard base64 of a
/// 24- to 64-byte key. Anything else is refused: the reference implementation would take
/// `""` or `"whsec_"` as an empty HMAC key, with which anyone can sign.
fn webhook(secret: &str) -> Result<standardwebhooks::Webhook, VerifyError> {
    use base64::Engine;
    let encoded = secret.strip_prefix("whsec_").ok_or(VerifyError::Secret)?;
    let key = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .map_err(|_| VerifyError::Secret)?;
    if !KEY_BYTES.contains(&key.len()) {
        return Err(VerifyError::Secret);
    }
    standardwebhooks::Webhook::from_bytes(key).map_err(|_| VerifyError::Secret)
}

impl Verifier {
    /// Checks deliveries against `secret`, the endpoint's `whsec_…` secret as pagos showed
    /// it. A secret that is not `whsec_` and the standard base64 of a 24- to 64-byte key
    /// (an empty one, an unset variable read as `""`) is refused: [`VerifyError::Secret`].
    pub fn new(secret: &str) -> Result<Verifier, VerifyError> {
        Ok(Verifier {
            secrets: vec![webhook(secret)?],
        })
    }

    /// Also accepts deliveries signed with `secret` (an older one of a rotation), checked
    /// as [`Verifier::new`] checks it.
    pub fn also(mut self, secret: &str) -> Result<Verifier, VerifyError> {
        self.secrets.push(webhook(secret)?);
        Ok(self)
    }

    /// Verifies the raw body as received (never a re-serialized one) and reads its event.
    /// A `webhook-timestamp` that is not a number, or is more than a day from the clock,
    /// is refused before the signature is looked at (the tolerance is 5 minutes anyway).
    pub fn verify(&self, headers: &HeaderMap, body: &[u8]) -> Result<Evento, VerifyError> {
        within_reach(headers)?;
        let mut last = None;
        for secret in &self.secrets {
            match secret.verify(body, headers) {
                Ok(()) => {
                    last = None;
                    break;
                }
                Err(e) => last = Some(e.to_string()),
            }
        }
        if let Some(error) = last {
            return Err(VerifyError::Signature(error));
        }
        let event: Evento =
            serde_json::from_slice(body).map_err(|e| VerifyError::Body(e.to_string()))?;
        let id = headers
            .get("webhook-id")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        if id != event.id {
            return Err(VerifyError::Body(
                "webhook-id is not the event's id".to_owned(),
            ));
        }
        Ok(event)
    }
}

/// How far from the clock a `webhook-timestamp` may be and still reach the reference
/// implementation, which refuses anything beyond 5 minutes itself: a day, far beyond it.
const REACH_SECONDS: i128 = 24 * 60 * 60;

/// Refuses a `webhook-timestamp` that does not parse or is far from the clock, with the
/// reference implementation's own errors, before it reads it: its `now - timestamp`
/// overflows for a timestamp near `i64::MIN` (a panic in a debug build, a wrapped "fresh"
/// timestamp in a release one). A missing or non-text header is left to it.
fn within_reach(headers: &HeaderMap) -> Result<(), VerifyError> {
    use standardwebhooks::WebhookError;
    let Some(text) = headers
        .get(standardwebhooks::HEADER_WEBHOOK_TIMESTAMP)
        .and_then(|v| v.to_str().ok())
    else {
        return Ok(());
    };
    let refused = |e: WebhookError| Err(VerifyError::Signature(e.to_string()));
    let Ok(timestamp) = text.parse::<i64>() else {
        return refused(WebhookError::InvalidTimestamp);
    };
    let age = i128::from(chrono::Utc::now().timestamp()) - i128::from(timestamp);
    if age > REACH_SECONDS {
        refused(WebhookError::TimestampTooOldError)
    } else if age < -REACH_SECONDS {
        refused(WebhookError::FutureTimestampError)
    } else {
        Ok(())
    }
}

/// What an event came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Applied {
    /// Its effect ran, now.
    Applied,
    /// This `webhook-id` was applied before: nothing done.
    Duplicate,
    /// An event of its payment with this `secuencia` or a later one was applied: nothing
    /// done (its id is recorded, so a redelivery is a duplicate).
    Stale,
}

/// Why an event could not be applied (answer 5xx: pagos delivers it again).
#[derive(Debug, thiserror::Error)]
pub enum InboxError<E> {
    #[error(transparent)]
    Db(#[from] rusqlite::Error),
    #[error("the effect failed")]
    Effect(E),
}

/// The merchant's record of what it applied: a SQLite database (the merchant's own in
/// real life, where the effect's tables live too).
pub struct Inbox {
    connection: Mutex<Connection>,
}

/// What `secuencia` counts in: the kind (`pago`, `reembolso`) and the object's id.
pub fn subject(event: &Evento) -> String {
    let kind = event.tipo.as_str().split('.').next().unwrap_or_default();
    let id = event
        .datos
        .get("id")
        .and_then(serde_json::Value::as_str)
        .unwrap_or_default();
    format!("{kind}:{id}")
}

impl Inbox {
    /// Opens (or creates) the inbox's tables in the SQLite file at `path`. `":memory:"`
    /// (SQLite's own name) is a private inbox in memory, gone when it is dropped: for tests,
    /// never for a service, which must remember across restarts what it applied.
    pub fn open(path: impl AsRef<Path>) -> rusqlite::Result<Inbox> {
        let connection = Connection::open(path)?;
        connection.execute_batch(
            "PRAGMA journal_mode = WAL;
             CREATE TABLE IF NOT EXISTS pagos_webhooks_applied (
                 webhook_id TEXT PRIMARY KEY, received_at TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP);
             CREATE TABLE IF NOT EXISTS pagos_webhooks_sequence (
                 subject TEXT PRIMARY KEY, secuencia INTEGER NOT NULL);",
        )?;
        Ok(Inbox {
            connection: Mutex::new(connection),
        })
    }

    /// Applies `event` once: `effect` runs in the same transaction that records its id
    /// and sequence, only for an event neither seen nor older than one applied.
    pub fn apply<E>(
        &self,
        event: &Evento,
        effect: impl FnOnce(&Transaction<'_>, &Evento) -> Result<(), E>,
    ) -> Result<Applied, InboxError<E>> {
        let mut connection = self
            .connection
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let tx = connection.transaction()?;
        let new = tx.execute(
            "INSERT INTO pagos_webhooks_applied (webhook_id) VALUES (?1) ON CONFLICT DO NOTHING",
            params![event.id],
        )?;
        if new == 0 {
            return Ok(Applied::Duplicate);
        }
        let subject = subject(event);
        let last: Option<i64> = tx
            .query_row(
                "SELECT secuencia FROM pagos_webhooks_sequence WHERE subject = ?1",
                params![subject],
                |row| row.get(0),
            )
            .optional()?;
        let secuencia = i64::try_from(event.secuencia).unwrap_or(i64::MAX);
        if last.is_some_and(|last| secuencia <= last) {
            tx.commit()?;
            return Ok(Applied::Stale);
        }
        effect(&tx, event).map_err(InboxError::Effect)?;
        tx.execute(
            "INSERT INTO pagos_webhooks_sequence (subject, secuencia) VALUES (?1, ?2)
             ON CONFLICT (subject) DO UPDATE SET secuencia = excluded.secuencia",
            params![subject, secuencia],
        )?;
        tx.commit()?;
        Ok(Applied::Applied)
    }
}
