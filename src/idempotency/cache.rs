//! Frozen answers kept in memory, so that a replay costs no database round trip.
//!
//! Only what can never change is kept: the answer of a key whose status is `completed`
//! (pagos freezes an answer once and never rewrites it) and the fingerprint it was
//! frozen for. Several processes can therefore each keep their own copy without ever
//! disagreeing with the database or with each other.
//!
//! An entry never outlives the key, in any process. The reaper of a process deletes a key
//! once it was created more than *that process's* `PAGOS_KEY_RETENTION` ago (and its
//! payment last changed more than that ago), and processes of one deployment may run with
//! different retentions (a rolling deploy that lowers it). So an entry is served only
//! while its key is younger than the **bound** less a margin (`MARGIN`), the bound being
//! the smallest retention of the processes alive, this one's included; it is read each
//! time an entry is used, not only when it goes in. A key that close to its end is not
//! cached at all. A key reused after its purge is therefore always looked up in the
//! database, by every process. Memory is bounded by `PAGOS_REPLAY_CACHE_MIB`, weighed by
//! the bytes each entry holds.
//!
//! How the processes agree (`reaper::Retentions` does the database's part): every
//! `serve` process records its retention in `instance_facts` (`key_retention/<uuid>`)
//! before it serves and again every `REFRESH`, and each of these refreshes reads the
//! retentions recorded within `LIVE` and lowers the bound to the smallest
//! (`ReplayCache::agreed`). Then:
//!
//! - the cache answers only while its last successful refresh *began* less than
//!   `2 × REFRESH` ago (`in step`; a refresh that takes a whole `REFRESH` has failed);
//!   otherwise every replay reads the database;
//! - a reaper purges keys only while its own process is in step, and only once its
//!   process has been in step (refreshes each less than `2 × REFRESH` after the last) for
//!   `2 × REFRESH + REFRESH / 2` since its first record of that run was written
//!   (`ReplayCache::may_purge`).
//!
//! Why that is enough. Say process B, in step since it wrote its record at `w`, purges key
//! K at `p ≥ w + 2.5 × REFRESH`, and process A serves K from memory at `t ≥ p`. A is in
//! step at `t`, so its refreshes, each less than `2 × REFRESH` after the last, go back to
//! a refresh that began after `t − 2 × REFRESH ≥ p − 2 × REFRESH ≥ w + REFRESH / 2` —
//! after B's record — and, unless the run began after `p` (below), one of them began in
//! `(p − 2 × REFRESH, p]`, while B was in step: B's row had been written less than
//! `2 × REFRESH` before, well within `LIVE`. That refresh read B's retention, and A's bound
//! never goes back up while A lives: B purged K because it was older than B's retention,
//! so A does not serve it. A run of refreshes that begins after a gap (a database A could
//! not reach) empties the cache first, since A may have missed a process's record
//! meanwhile; an answer read from the database before that is not kept after it
//! (`ReplayCache::epoch`). The bound never rises back, even when the process of the
//! smallest retention stops (its row deleted, or gone from `LIVE`): the keys it purged
//! would still be in this cache. A process whose retention is above the bound keeps its
//! cache short until it restarts: fewer replays from memory, never a wrong one.
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
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use uuid::Uuid;

/// How long before the reaper could delete a key its cached answer is dropped: room for
/// clocks of several hosts that disagree a little.
pub const MARGIN: Duration = Duration::from_secs(60);

/// How often a `serve` process records its retention and reads the others'.
pub const REFRESH: Duration = Duration::from_secs(60);

/// A retention recorded less than this long ago is a live process's: it bounds the cache.
/// Five refreshes (`ReplayCache::live`: five of a shorter period in tests): a process whose
/// refreshes fail for a while still counts.
pub const LIVE: Duration = Duration::from_secs(5 * REFRESH.as_secs());

/// What a replay needs: the request it answers and the answer.
#[derive(Debug)]
pub struct Frozen {
    pub fingerprint: String,
    pub payment_id: Uuid,
    pub answer: FrozenAnswer,
    /// A body known to have `fingerprint`, as sent: the request that filled the entry.
    request: Option<Box<str>>,
    /// When this entry stops being served (a margin before the key may be purged by this
    /// process; `ReplayCache::get` also holds it to the bound of every process).
    until: Instant,
    /// When the key was registered.
    created_at: DateTime<Utc>,
    /// The run of refreshes it was read in (`ReplayCache::epoch`).
    epoch: u64,
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

/// The replay cache of one process; cheap to clone (clones share their entries and their
/// bound). With a capacity of 0 it keeps nothing and every replay reads the database.
/// It answers nothing until its first refresh (`agreed`).
#[derive(Clone)]
pub struct ReplayCache {
    entries: Option<Cache<Slot, Arc<Frozen>>>,
    retention: Duration,
    agreement: Arc<Agreement>,
}

/// What the refreshes of this process learnt (module docs).
struct Agreement {
    /// `REFRESH`, shorter in tests.
    every: Duration,
    /// The process's id, which names its retention's row.
    instance: Uuid,
    /// What the `Instant`s below count from.
    origin: Instant,
    /// The smallest retention seen, in milliseconds: this process's and every live
    /// process's. Only ever lowered.
    bound_ms: AtomicU64,
    /// When the last successful refresh began, in milliseconds after `origin`, plus one
    /// (0: never).
    refreshed_ms: AtomicU64,
    /// When the first record of the current run of refreshes was written, likewise.
    in_step_since_ms: AtomicU64,
    /// Bumped when a run of refreshes begins (the entries then dropped).
    epoch: AtomicU64,
    /// Whether it said it stopped answering, and not yet that it answers again.
    warned: AtomicBool,
}

impl Agreement {
    fn at(&self, ms: u64) -> Option<Instant> {
        ms.checked_sub(1)
            .map(|ms| self.origin + Duration::from_millis(ms))
    }

    fn ms(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.origin).as_millis()).unwrap_or(u64::MAX - 1)
            + 1
    }

    /// Whether the last successful refresh began less than `2 × every` before `now`.
    fn in_step(&self, now: Instant) -> bool {
        self.at(self.refreshed_ms.load(Ordering::Acquire))
            .is_some_and(|at| now.saturating_duration_since(at) < self.every * 2)
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl ReplayCache {
    /// A cache of at most `capacity_bytes` of keys, fingerprints and answers, for keys kept
    /// `retention` (`PAGOS_KEY_RETENTION`), refreshed every `REFRESH`.
    pub fn new(capacity_bytes: u64, retention: Duration) -> Self {
        Self::refreshed_every(capacity_bytes, retention, REFRESH)
    }

    /// `new`, for refreshes every `every` (shorter than `REFRESH` only in tests).
    pub fn refreshed_every(capacity_bytes: u64, retention: Duration, every: Duration) -> Self {
        let entries = (capacity_bytes > 0).then(|| {
            Cache::builder()
                .max_capacity(capacity_bytes)
                .weigher(|slot: &Slot, frozen: &Arc<Frozen>| {
                    u32::try_from(slot.key.len() + frozen.weight()).unwrap_or(u32::MAX)
                })
                .expire_after(UntilExpiry)
                .build()
        });
        let agreement = Agreement {
            every,
            instance: Uuid::new_v4(),
            origin: Instant::now(),
            bound_ms: AtomicU64::new(millis(retention)),
            refreshed_ms: AtomicU64::new(0),
            in_step_since_ms: AtomicU64::new(0),
            epoch: AtomicU64::new(0),
            warned: AtomicBool::new(false),
        };
        ReplayCache {
            entries,
            retention,
            agreement: Arc::new(agreement),
        }
    }

    /// The frozen answer of this merchant's key, if this process holds it and may serve
    /// it: the process is in step, and the key is younger than the bound less `MARGIN`.
    pub fn get(&self, merchant: Uuid, key: &str) -> Option<Arc<Frozen>> {
        let entries = self.entries.as_ref()?;
        if !self.answers(Instant::now()) {
            return None;
        }
        let slot = Slot {
            merchant,
            key: Arc::from(key),
        };
        let frozen = entries.get(&slot)?;
        let epoch = self.agreement.epoch.load(Ordering::Acquire);
        if frozen.until > Instant::now()
            && frozen.epoch == epoch
            && self.time_left(frozen.created_at, Utc::now()).is_some()
        {
            return Some(frozen);
        }
        entries.invalidate(&slot);
        None
    }

    /// Whether the cache answers from memory at `now` (`in step`); says once in the log
    /// that it stopped (`agreed` says when it answers again).
    pub fn answers(&self, now: Instant) -> bool {
        let agreement = &self.agreement;
        if agreement.in_step(now) {
            return true;
        }
        if agreement.epoch.load(Ordering::Acquire) > 0
            && !agreement.warned.swap(true, Ordering::AcqRel)
        {
            tracing::warn!(
                every = %humantime::format_duration(agreement.every),
                "the retentions of the other processes could not be read for two refreshes: replays are read from the database until they are"
            );
        }
        false
    }

    /// The run of refreshes the cache is in: read it before reading a key's row, and give
    /// it to `keep`, so that a row read before the cache was emptied is not kept after.
    pub fn epoch(&self) -> u64 {
        self.agreement.epoch.load(Ordering::Acquire)
    }

    /// A refresh that began at `began` succeeded: this process's record was written (by
    /// `recorded`), and `others` are the retentions recorded by the live processes. Lowers
    /// the bound to the smallest (it never rises); a refresh that begins a new run (the
    /// first, or one after a gap of `2 × REFRESH` or more) empties the cache first.
    pub fn agreed(
        &self,
        began: Instant,
        recorded: Instant,
        others: impl IntoIterator<Item = Duration>,
    ) {
        let agreement = &self.agreement;
        let smallest = others.into_iter().fold(self.retention, std::cmp::Ord::min);
        agreement
            .bound_ms
            .fetch_min(millis(smallest), Ordering::AcqRel);
        if !agreement.in_step(began) {
            agreement.epoch.fetch_add(1, Ordering::AcqRel);
            if agreement.warned.swap(false, Ordering::AcqRel) {
                tracing::info!(
                    "the retentions of the processes are read again: replays are served from memory again"
                );
            }
            if let Some(entries) = &self.entries {
                entries.invalidate_all();
            }
            agreement
                .in_step_since_ms
                .store(agreement.ms(recorded), Ordering::Release);
        }
        let began = agreement.ms(began);
        agreement.refreshed_ms.fetch_max(began, Ordering::AcqRel);
    }

    /// Stops answering from memory and purging (a process about to stop: its record is
    /// deleted next).
    pub fn leave(&self) {
        // Said already: not worth a WARN.
        self.agreement.warned.store(true, Ordering::Release);
        self.agreement.refreshed_ms.store(0, Ordering::Release);
    }

    /// Whether this process's reaper may purge keys at `now`: the process is in step, and
    /// has been long enough for every process that serves from memory to have read its
    /// retention (module docs).
    pub fn may_purge(&self, now: Instant) -> bool {
        self.purge_wait(now).is_some_and(|wait| wait.is_zero())
    }

    /// How long from `now` this process's reaper must still wait before it may purge keys
    /// (zero: it may now); `None` while the process is not in step.
    pub fn purge_wait(&self, now: Instant) -> Option<Duration> {
        let agreement = &self.agreement;
        let every = agreement.every;
        if !agreement.in_step(now) {
            return None;
        }
        let since = agreement.at(agreement.in_step_since_ms.load(Ordering::Acquire))?;
        Some((every * 2 + every / 2).saturating_sub(now.saturating_duration_since(since)))
    }

    /// How long the first run of this process's reaper waits at `now` before it purges
    /// keys: `purge_wait` once the process has recorded its retention; before that (the
    /// process is starting: `serve` starts its workers beside its first record), a quarter
    /// of a refresh at a time, for at most four refreshes after the cache was made; zero
    /// otherwise (out of step: each batch is refused anyway, `may_purge`).
    pub fn first_purge_wait(&self, now: Instant) -> Duration {
        let agreement = &self.agreement;
        let every = agreement.every;
        match self.purge_wait(now) {
            Some(wait) => wait,
            None if agreement.epoch.load(Ordering::Acquire) == 0
                && now.saturating_duration_since(agreement.origin) < every * 4 =>
            {
                every / 4
            }
            None => Duration::ZERO,
        }
    }

    /// The id of the process this cache belongs to (its retention's row is named after it).
    pub fn instance(&self) -> Uuid {
        self.agreement.instance
    }

    /// How often the process refreshes its bound (`REFRESH`).
    pub fn refresh_every(&self) -> Duration {
        self.agreement.every
    }

    /// How recently a retention must have been recorded to count (`LIVE`, or five of a
    /// shorter period).
    pub fn live(&self) -> Duration {
        self.agreement.every * 5
    }

    /// The smallest retention this process has seen (its own included).
    pub fn bound(&self) -> Duration {
        Duration::from_millis(self.agreement.bound_ms.load(Ordering::Acquire))
    }

    /// Keeps the answer of a key row read from the database, if it is frozen and far
    /// enough from its purge; anything else is ignored. `request`: a body, as sent, whose
    /// fingerprint is the row's (the caller checked), kept to recognise its replays.
    /// `epoch`: `ReplayCache::epoch` before the row was read.
    pub fn keep(&self, row: &keys::Model, now: DateTime<Utc>, request: Option<&str>, epoch: u64) {
        let Some(entries) = &self.entries else {
            return;
        };
        if epoch != self.epoch() {
            return;
        }
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
            created_at: row.created_at,
            epoch,
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
    /// margin before the reaper of any process could delete it (the bound); `None` when
    /// that is already past.
    fn time_left(&self, created_at: DateTime<Utc>, now: DateTime<Utc>) -> Option<Duration> {
        let age = (now - created_at).to_std().unwrap_or_default();
        let left = self.bound().checked_sub(age)?.checked_sub(MARGIN)?;
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

    /// `cache`, after a first refresh that found no other process.
    fn in_step(cache: ReplayCache) -> ReplayCache {
        let now = Instant::now();
        cache.agreed(now, now, []);
        cache
    }

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
        let cache = in_step(ReplayCache::new(1 << 20, Duration::from_secs(86_400)));
        let now = Utc::now();
        keep_frozen(&cache, "k", now, now);
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
        let cache = in_step(ReplayCache::new(1 << 20, Duration::from_secs(86_400)));
        let now = Utc::now();
        cache.keep(
            &row("k", KeyStatus::InProgress, now),
            now,
            None,
            cache.epoch(),
        );
        assert!(cache.get(Uuid::nil(), "k").is_none());
    }

    #[test]
    fn a_key_near_its_purge_is_not_kept_and_an_entry_ends_before_the_purge() {
        let retention = Duration::from_secs(3_600);
        let cache = in_step(ReplayCache::new(1 << 20, retention));
        let now = Utc::now();
        // Created 59 min 30 s ago: the reaper may delete it in 30 s, inside the margin.
        let old = now - chrono::Duration::seconds(3_570);
        keep_frozen(&cache, "old", old, now);
        assert!(cache.get(Uuid::nil(), "old").is_none());
        // Created 30 min ago: kept, for at most the 30 min it has left, minus the margin.
        let half = now - chrono::Duration::seconds(1_800);
        let left = cache.time_left(half, now).expect("time left");
        assert!(left <= Duration::from_secs(1_800) - MARGIN);
        assert!(left > Duration::from_secs(1_700) - MARGIN);
    }

    #[test]
    fn an_entry_past_its_end_is_not_served() {
        let cache = in_step(ReplayCache::new(1 << 20, Duration::from_secs(61)));
        let now = Utc::now();
        // One second left before the margin: served now, gone after it.
        keep_frozen(&cache, "k", now, now);
        assert!(cache.get(Uuid::nil(), "k").is_some());
        std::thread::sleep(Duration::from_millis(1_100));
        assert!(cache.get(Uuid::nil(), "k").is_none());
    }

    #[test]
    fn memory_is_bounded_by_the_capacity() {
        let cache = in_step(ReplayCache::new(64 * 1024, Duration::from_secs(86_400)));
        let now = Utc::now();
        for i in 0..10_000 {
            cache.keep(
                &row(&format!("key-{i}"), KeyStatus::Completed, now),
                now,
                None,
                cache.epoch(),
            );
        }
        let (_, bytes) = cache.size();
        assert!(bytes <= 64 * 1024, "{bytes} bytes held");
    }

    #[test]
    fn a_cache_of_size_zero_keeps_nothing() {
        let cache = in_step(ReplayCache::new(0, Duration::from_secs(86_400)));
        let now = Utc::now();
        keep_frozen(&cache, "k", now, now);
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
        cache.keep(&r, now, Some(sent), cache.epoch());
        cache.get(Uuid::nil(), "k").expect("kept")
    }

    #[test]
    fn a_replay_is_recognised_by_its_bytes_or_else_by_its_fingerprint() {
        let cache = in_step(ReplayCache::new(1 << 20, Duration::from_secs(86_400)));
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
        let cache = in_step(ReplayCache::new(1 << 20, Duration::from_secs(86_400)));
        let now = Utc::now();
        keep_frozen(&cache, "k", now, now);
        let frozen = cache.get(Uuid::nil(), "k").expect("kept");
        assert!(!frozen.sent_as(""));
        assert!(!frozen.sent_as("{}"));
    }

    /// `cache` keeps the frozen answer of key `key`, registered `created`, read at `now`.
    fn keep_frozen(cache: &ReplayCache, key: &str, created: DateTime<Utc>, now: DateTime<Utc>) {
        cache.keep(
            &row(key, KeyStatus::Completed, created),
            now,
            None,
            cache.epoch(),
        );
    }

    #[test]
    fn a_kept_body_counts_against_the_capacity() {
        let cache = in_step(ReplayCache::new(1 << 20, Duration::from_secs(86_400)));
        let now = Utc::now();
        keep_frozen(&cache, "k", now, now);
        let (_, without) = cache.size();
        let big = serde_json::json!({"creditoId": "42", "descripcion": "x".repeat(10_000)});
        kept_with(&cache, &big.to_string());
        let (_, with) = cache.size();
        assert!(with >= without + 10_000, "{without} then {with} bytes");
    }

    #[test]
    fn an_entry_is_held_to_the_smallest_retention_of_the_live_processes_which_never_rises() {
        let hour = Duration::from_secs(3_600);
        let cache = in_step(ReplayCache::new(1 << 20, 72 * hour));
        let now = Utc::now();
        let day_old = now - chrono::Duration::hours(30);
        keep_frozen(&cache, "k", day_old, now);
        assert!(cache.get(Uuid::nil(), "k").is_some(), "72 h of retention");
        // Another process records 24 h: the key, 30 h old, is one its reaper may delete.
        let refresh = Instant::now();
        cache.agreed(refresh, refresh, [24 * hour, 72 * hour]);
        assert_eq!(cache.bound(), 24 * hour);
        assert!(cache.get(Uuid::nil(), "k").is_none(), "read when used");
        // That process stops (its row gone): what it purged may still be in memory, so the
        // bound stays.
        cache.agreed(Instant::now(), Instant::now(), []);
        assert_eq!(cache.bound(), 24 * hour);
        keep_frozen(&cache, "k", day_old, now);
        assert!(cache.get(Uuid::nil(), "k").is_none(), "not kept either");
        let recent = now - chrono::Duration::hours(1);
        keep_frozen(&cache, "r", recent, now);
        assert!(
            cache.get(Uuid::nil(), "r").is_some(),
            "younger than every retention"
        );
    }

    #[test]
    fn out_of_step_the_cache_answers_nothing_and_a_new_run_of_refreshes_empties_it() {
        let every = Duration::from_millis(100);
        let cache = ReplayCache::refreshed_every(1 << 20, Duration::from_secs(86_400), every);
        let now = Utc::now();
        keep_frozen(&cache, "k", now, now);
        assert!(
            cache.get(Uuid::nil(), "k").is_none(),
            "nothing before a refresh"
        );
        let cache = in_step(cache);
        let before = cache.epoch();
        cache.keep(&row("k", KeyStatus::Completed, now), now, None, before);
        assert!(cache.get(Uuid::nil(), "k").is_some());
        // No refresh for two periods: the database answers.
        std::thread::sleep(every * 2 + Duration::from_millis(20));
        assert!(!cache.answers(Instant::now()));
        assert!(cache.get(Uuid::nil(), "k").is_none());
        // A refresh again: a new run, which may follow a purge it did not see; what was
        // kept, or read, before it is not served.
        let cache = in_step(cache);
        assert!(cache.get(Uuid::nil(), "k").is_none(), "emptied");
        cache.keep(&row("k", KeyStatus::Completed, now), now, None, before);
        assert!(
            cache.get(Uuid::nil(), "k").is_none(),
            "read before the new run"
        );
    }

    #[test]
    fn a_process_purges_only_once_in_step_for_two_and_a_half_refreshes() {
        let every = Duration::from_secs(60);
        let cache = ReplayCache::refreshed_every(0, Duration::from_secs(86_400), every);
        let t0 = Instant::now();
        assert!(!cache.may_purge(t0), "never refreshed");
        let at = |secs| t0 + Duration::from_secs(secs);
        // Starting: the reaper's first run waits for the first record, a quarter of a
        // refresh at a time, four refreshes at most.
        assert_eq!(cache.first_purge_wait(t0), every / 4);
        assert_eq!(cache.first_purge_wait(at(241)), Duration::ZERO);
        let recorded = t0 + Duration::from_secs(1);
        cache.agreed(t0, recorded, []);
        assert!(!cache.may_purge(at(100)));
        // What the first run of its reaper waits for: until 150 s after the record.
        // (Kept in milliseconds: within one of 51 s.)
        let wait = cache.purge_wait(at(100)).expect("in step");
        assert!(
            wait.abs_diff(Duration::from_secs(51)) < Duration::from_millis(2),
            "{wait:?}"
        );
        cache.agreed(at(60), at(61), []);
        cache.agreed(at(120), at(121), []);
        assert!(
            !cache.may_purge(at(150)),
            "150 s after its first record was written"
        );
        assert!(cache.may_purge(at(152)));
        assert_eq!(cache.purge_wait(at(152)), Some(Duration::ZERO));
        // Its refreshes fail: it stops purging while the others still count its row...
        assert!(!cache.may_purge(at(240)));
        assert_eq!(
            cache.purge_wait(at(240)),
            None,
            "nothing to wait for: not in step"
        );
        assert_eq!(
            cache.first_purge_wait(at(240)),
            Duration::ZERO,
            "recorded before: not starting"
        );
        // ...and starts over when they work again.
        cache.agreed(at(300), at(301), []);
        assert!(!cache.may_purge(at(400)));
        cache.agreed(at(360), at(361), []);
        cache.agreed(at(420), at(421), []);
        assert!(cache.may_purge(at(452)));
        cache.leave();
        assert!(!cache.may_purge(at(453)), "a process stopping");
    }
}
