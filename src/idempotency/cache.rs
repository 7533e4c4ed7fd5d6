//! Frozen answers kept in memory, so that a replay costs no database round trip.
//!
//! Only what can never change is kept: the answer of a key whose status is `completed`
//! (pagos freezes an answer once and never rewrites it) and the fingerprint it was
//! frozen for. Several processes can therefore each keep their own copy without ever
//! disagreeing with the database or with each other.
//!
//! An entry never outlives the key: the reaper deletes a key only once it was created
//! more than `PAGOS_KEY_RETENTION` ago (and its payment last changed more than that ago),
//! so an entry expires a margin before `created_at + retention`, and a key that close to
//! its end is not cached at all. A key reused after its purge is therefore always looked
//! up in the database, by every process. Memory is bounded by `PAGOS_REPLAY_CACHE_MIB`,
//! weighed by the bytes each entry holds.
//!
//! An entry also keeps the body, as its bytes were sent, of the request whose fingerprint
//! matched when it was filled. A replay that sends those same bytes (a client retrying
//! what it sent) is answered without parsing, canonicalizing or hashing its body: equal
//! bytes are one JSON value, so one fingerprint. Any other body (another key order, other
//! white space, another value) is parsed and fingerprinted as usual.

use super::fingerprint::Fingerprinted;
use crate::entities::idempotency_key::{self as keys, FrozenAnswer, KeyStatus};
use chrono::{DateTime, Utc};
use moka::sync::Cache;
use std::sync::Arc;
use std::time::{Duration, Instant};
use uuid::Uuid;

/// How long before the reaper could delete a key its cached answer is dropped: room for
/// clocks of several hosts that disagree a little.
pub const MARGIN: Duration = Duration::from_secs(60);

/// What a replay needs: the request it answers and the answer.
#[derive(Debug)]
pub struct Frozen {
    pub fingerprint: String,
    pub payment_id: Uuid,
    pub answer: FrozenAnswer,
    /// A body known to have `fingerprint`, as sent: the request that filled the entry.
    request: Option<Box<str>>,
    /// When this entry stops being served (a margin before the key may be purged).
    until: Instant,
}

impl Frozen {
    /// Whether `request` is the request this answer was frozen for: the same bytes as
    /// the body kept, or else the same fingerprint.
    pub fn answers(&self, request: &Fingerprinted<'_>) -> bool {
        self.sent_as(request.sent()) || self.fingerprint == request.fingerprint()
    }

    /// Whether `body` is, byte for byte, the body kept with this answer: the request it
    /// was frozen for, known without parsing `body`.
    pub fn sent_as(&self, body: &str) -> bool {
        self.request.as_deref() == Some(body)
    }

    /// Bytes this entry holds, for `PAGOS_REPLAY_CACHE_MIB` (weighed once, when it goes in).
    fn weight(&self) -> usize {
        self.fingerprint.len()
            + self.answer.body.len()
            + self.request.as_ref().map_or(0, |sent| sent.len())
            + std::mem::size_of::<Frozen>()
            + 64
    }
}

#[derive(Clone, Hash, PartialEq, Eq)]
struct Slot {
    merchant: Uuid,
    key: Arc<str>,
}

struct UntilExpiry;

impl moka::Expiry<Slot, Arc<Frozen>> for UntilExpiry {
    fn expire_after_create(
        &self,
        _slot: &Slot,
        frozen: &Arc<Frozen>,
        created_at: Instant,
    ) -> Option<Duration> {
        Some(frozen.until.saturating_duration_since(created_at))
    }
}

/// The replay cache of one process; cheap to clone. With a capacity of 0 it keeps
/// nothing and every replay reads the database.
#[derive(Clone)]
pub struct ReplayCache {
    entries: Option<Cache<Slot, Arc<Frozen>>>,
    retention: Duration,
}

impl ReplayCache {
    /// A cache of at most `capacity_bytes` of keys, fingerprints and answers, for keys kept
    /// `retention` (`PAGOS_KEY_RETENTION`).
    pub fn new(capacity_bytes: u64, retention: Duration) -> Self {
        let entries = (capacity_bytes > 0).then(|| {
            Cache::builder()
                .max_capacity(capacity_bytes)
                .weigher(|slot: &Slot, frozen: &Arc<Frozen>| {
                    u32::try_from(slot.key.len() + frozen.weight()).unwrap_or(u32::MAX)
                })
                .expire_after(UntilExpiry)
                .build()
        });
        ReplayCache { entries, retention }
    }

    /// The frozen answer of this merchant's key, if this process holds it.
    pub fn get(&self, merchant: Uuid, key: &str) -> Option<Arc<Frozen>> {
        let entries = self.entries.as_ref()?;
        let slot = Slot {
            merchant,
            key: Arc::from(key),
        };
        entries
            .get(&slot)
            .filter(|frozen| frozen.until > Instant::now())
    }

    /// Keeps the answer of a key row read from the database, if it is frozen and far
    /// enough from its purge; anything else is ignored. `request`: a body, as sent, whose
    /// fingerprint is the row's (the caller checked), kept to recognise its replays.
    pub fn keep(&self, row: &keys::Model, now: DateTime<Utc>, request: Option<&str>) {
        let Some(entries) = &self.entries else {
            return;
        };
        if row.status != KeyStatus::Completed {
            return;
        }
        let (Some(code), Some(body)) = (row.response_code, &row.response_body) else {
            return;
        };
        let Some(left) = self.time_left(row.created_at, now) else {
            return;
        };
        let frozen = Frozen {
            fingerprint: row.fingerprint.clone(),
            payment_id: row.payment_id,
            answer: FrozenAnswer {
                status: u16::try_from(code).unwrap_or(500),
                body: body.clone(),
            },
            request: request.map(Box::from),
            until: Instant::now() + left,
        };
        entries.insert(
            Slot {
                merchant: row.merchant_id,
                key: Arc::from(row.key.as_str()),
            },
            Arc::new(frozen),
        );
    }

    /// How long a key created at `created_at` may still be served from memory: until a
    /// margin before the reaper could delete it; `None` when that is already past.
    fn time_left(&self, created_at: DateTime<Utc>, now: DateTime<Utc>) -> Option<Duration> {
        let age = (now - created_at).to_std().unwrap_or_default();
        let left = self.retention.checked_sub(age)?.checked_sub(MARGIN)?;
        (!left.is_zero()).then_some(left)
    }

    /// Entries held and their weight in bytes (for the metrics).
    pub fn size(&self) -> (u64, u64) {
        match &self.entries {
            Some(entries) => {
                entries.run_pending_tasks();
                (entries.entry_count(), entries.weighted_size())
            }
            None => (0, 0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(key: &str, status: KeyStatus, created_at: DateTime<Utc>) -> keys::Model {
        keys::Model {
            merchant_id: Uuid::nil(),
            key: key.into(),
            fingerprint: "fp".into(),
            payment_id: Uuid::from_u128(7),
            status,
            response_code: (status == KeyStatus::Completed).then_some(201),
            response_body: (status == KeyStatus::Completed).then(|| "{\"estado\":1}".into()),
            lease_until: None,
            created_at,
            updated_at: created_at,
        }
    }

    #[test]
    fn a_frozen_answer_is_served_from_memory_with_its_fingerprint() {
        let cache = ReplayCache::new(1 << 20, Duration::from_secs(86_400));
        let now = Utc::now();
        cache.keep(&row("k", KeyStatus::Completed, now), now, None);
        let frozen = cache.get(Uuid::nil(), "k").expect("kept");
        assert_eq!(frozen.fingerprint, "fp");
        assert_eq!(frozen.payment_id, Uuid::from_u128(7));
        assert_eq!(frozen.answer.status, 201);
        assert!(
            cache.get(Uuid::from_u128(1), "k").is_none(),
            "another merchant's key"
        );
    }

    #[test]
    fn answers_not_frozen_are_never_kept() {
        let cache = ReplayCache::new(1 << 20, Duration::from_secs(86_400));
        let now = Utc::now();
        cache.keep(&row("k", KeyStatus::InProgress, now), now, None);
        assert!(cache.get(Uuid::nil(), "k").is_none());
    }

    #[test]
    fn a_key_near_its_purge_is_not_kept_and_an_entry_ends_before_the_purge() {
        let retention = Duration::from_secs(3_600);
        let cache = ReplayCache::new(1 << 20, retention);
        let now = Utc::now();
        // Created 59 min 30 s ago: the reaper may delete it in 30 s, inside the margin.
        let old = now - chrono::Duration::seconds(3_570);
        cache.keep(&row("old", KeyStatus::Completed, old), now, None);
        assert!(cache.get(Uuid::nil(), "old").is_none());
        // Created 30 min ago: kept, for at most the 30 min it has left, minus the margin.
        let half = now - chrono::Duration::seconds(1_800);
        let left = cache.time_left(half, now).expect("time left");
        assert!(left <= Duration::from_secs(1_800) - MARGIN);
        assert!(left > Duration::from_secs(1_700) - MARGIN);
    }

    #[test]
    fn an_entry_past_its_end_is_not_served() {
        let cache = ReplayCache::new(1 << 20, Duration::from_secs(61));
        let now = Utc::now();
        // One second left before the margin: served now, gone after it.
        cache.keep(&row("k", KeyStatus::Completed, now), now, None);
        assert!(cache.get(Uuid::nil(), "k").is_some());
        std::thread::sleep(Duration::from_millis(1_100));
        assert!(cache.get(Uuid::nil(), "k").is_none());
    }

    #[test]
    fn memory_is_bounded_by_the_capacity() {
        let cache = ReplayCache::new(64 * 1024, Duration::from_secs(86_400));
        let now = Utc::now();
        for i in 0..10_000 {
            cache.keep(
                &row(&format!("key-{i}"), KeyStatus::Completed, now),
                now,
                None,
            );
        }
        let (_, bytes) = cache.size();
        assert!(bytes <= 64 * 1024, "{bytes} bytes held");
    }

    #[test]
    fn a_cache_of_size_zero_keeps_nothing() {
        let cache = ReplayCache::new(0, Duration::from_secs(86_400));
        let now = Utc::now();
        cache.keep(&row("k", KeyStatus::Completed, now), now, None);
        assert!(cache.get(Uuid::nil(), "k").is_none());
        assert_eq!(cache.size(), (0, 0));
    }

    /// An entry kept with the body of the request it answers, as sent, its fingerprint
    /// real.
    fn kept_with(cache: &ReplayCache, sent: &str) -> Arc<Frozen> {
        let now = Utc::now();
        let mut r = row("k", KeyStatus::Completed, now);
        let body: serde_json::Value = serde_json::from_str(sent).expect("test JSON");
        r.fingerprint = crate::idempotency::fingerprint("POST", "/v1/pagos", &body);
        cache.keep(&r, now, Some(sent));
        cache.get(Uuid::nil(), "k").expect("kept")
    }

    #[test]
    fn a_replay_is_recognised_by_its_bytes_or_else_by_its_fingerprint() {
        let cache = ReplayCache::new(1 << 20, Duration::from_secs(86_400));
        let first = r#"{"creditoId":"42","monto":250000,"moneda":"COP"}"#;
        let frozen = kept_with(&cache, first);
        let same = |text: &str| {
            let body: serde_json::Value = serde_json::from_str(text).expect("test JSON");
            let request = Fingerprinted::new("POST", "/v1/pagos", &body, text);
            let answered = frozen.answers(&request);
            (answered, request.fingerprint().to_owned())
        };
        // The same bytes: recognised without parsing them.
        assert!(frozen.sent_as(first));
        assert!(same(first).0);
        // Another key order and spacing: other bytes, so not by them; the same value,
        // so the same request through its fingerprint.
        let reordered = r#"{ "moneda":"COP", "monto":250000, "creditoId":"42" }"#;
        assert!(!frozen.sent_as(reordered));
        let (answered, fingerprint) = same(reordered);
        assert!(answered);
        assert_eq!(fingerprint, frozen.fingerprint);
        // Another value: never the same request, whichever way it is compared.
        for other in [
            r#"{"creditoId":"42","monto":250001,"moneda":"COP"}"#,
            r#"{"creditoId":"42","monto":250000,"moneda":"COP","descripcion":"x"}"#,
        ] {
            assert!(!frozen.sent_as(other), "{other}");
            let (answered, fingerprint) = same(other);
            assert!(!answered, "{other}");
            assert_ne!(fingerprint, frozen.fingerprint);
        }
        // 250000.0 is another JSON value but the same canonical body (RFC 8785 writes
        // both as 250000): recognised through the fingerprint.
        let (answered, fingerprint) = same(r#"{"creditoId":"42","monto":250000.0,"moneda":"COP"}"#);
        assert!(answered);
        assert_eq!(fingerprint, frozen.fingerprint);
    }

    #[test]
    fn an_entry_kept_without_a_body_is_recognised_only_by_its_fingerprint() {
        let cache = ReplayCache::new(1 << 20, Duration::from_secs(86_400));
        let now = Utc::now();
        cache.keep(&row("k", KeyStatus::Completed, now), now, None);
        let frozen = cache.get(Uuid::nil(), "k").expect("kept");
        assert!(!frozen.sent_as(""));
        assert!(!frozen.sent_as("{}"));
    }

    #[test]
    fn a_kept_body_counts_against_the_capacity() {
        let cache = ReplayCache::new(1 << 20, Duration::from_secs(86_400));
        let now = Utc::now();
        cache.keep(&row("k", KeyStatus::Completed, now), now, None);
        let (_, without) = cache.size();
        let big = serde_json::json!({"creditoId": "42", "descripcion": "x".repeat(10_000)});
        kept_with(&cache, &big.to_string());
        let (_, with) = cache.size();
        assert!(with >= without + 10_000, "{without} then {with} bytes");
    }
}
