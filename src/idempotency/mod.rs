//! Idempotency keys: the fingerprint, the key itself, the derivation of payment ids and
//! gateway keys, and the decision of what a request with a key gets — new work, a stored
//! answer, 409, or 422.
//!
//! Pure: no I/O, no clock of its own. The registry that reads and writes key rows and
//! asks `decide` is the saga's (`saga::registry`).

pub mod cache;
pub mod derive;
pub mod fingerprint;
pub mod key;

pub use fingerprint::fingerprint;
pub use key::{IdempotencyKey, KeyError};

use crate::entities::idempotency_key::{self as keys, FrozenAnswer, KeyStatus};
use crate::entities::payment;
use chrono::{DateTime, Utc};
use sha2::{Digest, Sha256};
use std::time::Duration;
use uuid::Uuid;

/// What the registry decided for a request.
#[derive(Debug)]
pub enum Begin {
    /// First request with this key: the payment is registered and this request owns it.
    Started(Box<payment::Model>),
    /// The answer was frozen: send it again, byte for byte.
    Replay {
        payment_id: Uuid,
        answer: FrozenAnswer,
        /// Served by this process's replay cache, without the database.
        from_memory: bool,
    },
    /// Same request, not finished, and no request holds the key's lease: answer the
    /// current state (and settle it first if it is due).
    Unsettled { payment_id: Uuid },
    /// Another request holds the key's lease.
    InFlight { retry_after: Duration },
    /// The key was used with a different request.
    Mismatch,
}

impl Begin {
    /// The decision's name in `pagos_idempotency_requests_total{outcome}`, the same for
    /// payments and refunds.
    pub fn outcome(&self) -> &'static str {
        match self {
            Begin::Started(_) => "new",
            Begin::Replay { .. } => "replayed",
            Begin::Unsettled { .. } => "unsettled",
            Begin::InFlight { .. } => "in_flight",
            Begin::Mismatch => "mismatch",
        }
    }
}

/// The decision for a key row that already exists. Pure.
pub fn decide(existing: &keys::Model, fingerprint: &str, now: DateTime<Utc>) -> Begin {
    if existing.fingerprint != fingerprint {
        return Begin::Mismatch;
    }
    if existing.status == KeyStatus::Completed
        && let (Some(code), Some(body)) = (existing.response_code, &existing.response_body)
    {
        return Begin::Replay {
            payment_id: existing.payment_id,
            answer: FrozenAnswer {
                status: u16::try_from(code).unwrap_or(500),
                body: body.clone(),
            },
            from_memory: false,
        };
    }
    match existing.lease_until {
        Some(until) if until > now => Begin::InFlight {
            retry_after: (until - now).to_std().unwrap_or_default(),
        },
        _ => Begin::Unsettled {
            payment_id: existing.payment_id,
        },
    }
}

/// A short, stable hash of a client key, for logs (keys may carry merchant data).
pub fn key_hash(key: &IdempotencyKey) -> KeyHash<'_> {
    KeyHash(key)
}

/// A key's hash for logs, computed only if a log line that shows it is written.
#[derive(Clone, Copy)]
pub struct KeyHash<'a>(&'a IdempotencyKey);

impl std::fmt::Display for KeyHash<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&hex::encode(
            &Sha256::digest(self.0.as_str().as_bytes())[..6],
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(
        fingerprint: &str,
        status: KeyStatus,
        lease_until: Option<DateTime<Utc>>,
    ) -> keys::Model {
        let at = Utc::now();
        keys::Model {
            merchant_id: Uuid::nil(),
            key: "k".into(),
            fingerprint: fingerprint.into(),
            payment_id: Uuid::nil(),
            status,
            response_code: (status == KeyStatus::Completed).then_some(201),
            response_body: (status == KeyStatus::Completed).then(|| "{}".into()),
            lease_until,
            created_at: at,
            updated_at: at,
        }
    }

    #[test]
    fn another_body_is_a_mismatch_whatever_the_state() {
        let now = Utc::now();
        for status in [KeyStatus::InProgress, KeyStatus::Completed] {
            assert!(matches!(
                decide(&row("a", status, None), "b", now),
                Begin::Mismatch
            ));
        }
    }

    #[test]
    fn a_frozen_answer_is_replayed() {
        let decided = decide(&row("a", KeyStatus::Completed, None), "a", Utc::now());
        assert!(matches!(
            decided,
            Begin::Replay {
                answer: FrozenAnswer { status: 201, .. },
                ..
            }
        ));
    }

    #[test]
    fn a_live_lease_means_in_flight_with_the_time_left() {
        let now = Utc::now();
        let decided = decide(
            &row(
                "a",
                KeyStatus::InProgress,
                Some(now + chrono::TimeDelta::seconds(30)),
            ),
            "a",
            now,
        );
        match decided {
            Begin::InFlight { retry_after } => assert_eq!(retry_after.as_secs(), 30),
            other => panic!("expected InFlight, got {other:?}"),
        }
    }

    #[test]
    fn a_released_or_expired_lease_is_unsettled() {
        let now = Utc::now();
        assert!(matches!(
            decide(&row("a", KeyStatus::InProgress, None), "a", now),
            Begin::Unsettled { .. }
        ));
        assert!(matches!(
            decide(
                &row(
                    "a",
                    KeyStatus::InProgress,
                    Some(now - chrono::TimeDelta::seconds(1))
                ),
                "a",
                now
            ),
            Begin::Unsettled { .. }
        ));
    }
}
