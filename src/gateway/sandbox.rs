//! The sandbox gateway: an in-memory implementation of the reference protocol's rules.
//!
//! `SandboxCore` holds the rules (same key + same body replays, same key + other body is
//! refused, a key in flight answers "in flight", pending charges and refunds settle later,
//! a refund never takes more than what is left of a succeeded charge); the in-process
//! `SandboxGateway` and the standalone server (`sandbox_server`) share it. Every change of
//! a charge or a refund (made, then settled if it was pending) bumps its own sequence and,
//! when someone listens, is reported as a `Change`: the standalone server turns those into
//! webhooks.
//! Nothing here is durable: it is for demos and tests, never for money.

use super::classify::{AmountSaid, KeySaid, refund_refusal};
use super::{
    Charge, ChargeBody, ChargeRequest, ChargeStatus, Gateway, GatewayError, Refund, RefundBody,
    RefundLookup, RefundRequest, RefundStatus,
};
use async_trait::async_trait;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reqwest::StatusCode;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::sync::mpsc::UnboundedSender;
use uuid::Uuid;

/// How charges and refunds turn out.
#[derive(Clone, Copy, Debug)]
pub struct Outcomes {
    pub decline_rate: f64,
    /// Share of refunds that fail (at once, or when they settle if left pending).
    pub refund_failure_rate: f64,
    /// Share of charges, and of refunds, left pending.
    pub pending_rate: f64,
    /// How long a pending charge or refund stays pending before it settles.
    pub pending_for: Duration,
    pub seed: Option<u64>,
}

impl Default for Outcomes {
    fn default() -> Self {
        Outcomes {
            decline_rate: 0.0,
            refund_failure_rate: 0.0,
            pending_rate: 0.0,
            pending_for: Duration::from_secs(2),
            seed: None,
        }
    }
}

/// What the core says about a request (a charge's, a refund's) before any work is done.
#[derive(Debug)]
pub enum Begin<T> {
    /// First request with this key: now marked in flight; call `complete…` or `abandon`.
    New,
    /// The key was used with the same body: here is what it made.
    Replay(T),
    /// The first request with this key is still being processed.
    InFlight,
    /// The key was used with another body (or for another kind of request).
    Mismatch,
}

/// Why the sandbox refused a refund (answered 400 `{"error": code}`, as a real gateway
/// refuses one): nothing was refunded and the key is free again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RefundRefused {
    /// No charge has this id.
    UnknownCharge,
    /// The charge did not succeed (declined, or still pending): there is nothing to return.
    ChargeNotSucceeded,
    /// The refund's currency is not the charge's.
    CurrencyMismatch,
    /// The amount is not positive.
    NotPositive,
    /// The amount is over what is left of the charge (its amount minus the refunds that
    /// succeeded or are pending).
    ExceedsRemaining { remaining: i64 },
}

impl RefundRefused {
    /// The `error` of the 400 answer.
    pub fn code(&self) -> &'static str {
        match self {
            RefundRefused::UnknownCharge => "charge_not_found",
            RefundRefused::ChargeNotSucceeded => "charge_not_refundable",
            RefundRefused::CurrencyMismatch => "currency_mismatch",
            RefundRefused::NotPositive => "invalid_amount",
            RefundRefused::ExceedsRemaining { .. } => super::http::AMOUNT_EXCEEDS_REMAINING,
        }
    }

    /// The 400 answer's body.
    pub fn body(&self) -> serde_json::Value {
        let message = match self {
            RefundRefused::UnknownCharge => "no charge has this id".to_owned(),
            RefundRefused::ChargeNotSucceeded => {
                "only a succeeded charge can be refunded".to_owned()
            }
            RefundRefused::CurrencyMismatch => "the currency is not the charge's".to_owned(),
            RefundRefused::NotPositive => "amount must be a positive integer".to_owned(),
            RefundRefused::ExceedsRemaining { remaining } => {
                format!("the amount is over what is left of the charge ({remaining})")
            }
        };
        let mut body = serde_json::json!({"error": self.code(), "message": message});
        if let RefundRefused::ExceedsRemaining { remaining } = self {
            body["remaining"] = serde_json::Value::from(*remaining);
        }
        body
    }
}

/// The first 16 bytes of a SHA-256: what the ledger keeps of a gateway key (about 100
/// bytes) and of a request body. A sandbox behind a long benchmark holds hundreds of
/// thousands of charges: every byte per charge counts.
type Digest16 = [u8; 16];

fn digest16(bytes: &[u8]) -> Digest16 {
    let full = Sha256::digest(bytes);
    let mut short = [0; 16];
    short.copy_from_slice(&full[..16]);
    short
}

/// One map for every key, as a provider has: a key used for a charge and then for a
/// refund (other body) is a mismatch.
enum KeyEntry {
    InFlight { body_hash: Digest16 },
    Done { body_hash: Digest16, charge: u32 },
    RefundDone { body_hash: Digest16, refund: u32 },
}

/// A charge as the ledger keeps it; `Charge` is made from it when asked for.
struct StoredCharge {
    /// The random part of the id (`ch_{number:06}{suffix:010x}`, number = index + 1).
    suffix: u64,
    amount: i64,
    currency: Box<str>,
    reference: Box<str>,
    /// A declined charge carries the decline code `card_declined`.
    status: ChargeStatus,
    /// For a pending charge: when it settles, and how.
    settles: Option<(Instant, ChargeStatus)>,
    /// 1 when made, bumped by each change after.
    sequence: u32,
}

const DECLINE_CODE: &str = "card_declined";

/// What a failed sandbox refund says.
const REFUND_FAILURE_CODE: &str = "declined";

impl StoredCharge {
    fn id(&self, index: usize) -> String {
        format!("ch_{:06}{:010x}", index + 1, self.suffix)
    }

    fn charge(&self, index: usize) -> Charge {
        Charge {
            id: self.id(index),
            status: self.status,
            amount: self.amount,
            currency: self.currency.to_string(),
            reference: self.reference.to_string(),
            decline_code: (self.status == ChargeStatus::Declined).then(|| DECLINE_CODE.into()),
            charged_back: false,
        }
    }
}

/// A refund as the ledger keeps it: its currency is its charge's, and `Refund` is made
/// from it (and its charge) when asked for.
struct StoredRefund {
    /// The random part of the id (`re_{number:06}{suffix:010x}`, number = index + 1).
    suffix: u64,
    /// The index of the charge refunded.
    charge: u32,
    /// 1 when made, bumped by each change after.
    sequence: u32,
    amount: i64,
    reference: Box<str>,
    status: RefundStatus,
    /// For a pending refund: when it settles, and how.
    settles: Option<(Instant, RefundStatus)>,
}

impl StoredRefund {
    fn refund(&self, index: usize, charges: &[StoredCharge]) -> Refund {
        let charge = charges.get(self.charge as usize);
        Refund {
            id: format!("re_{:06}{:010x}", index + 1, self.suffix),
            status: self.status,
            charge: charge
                .map(|c| c.id(self.charge as usize))
                .unwrap_or_default(),
            amount: self.amount,
            currency: charge.map(|c| c.currency.to_string()).unwrap_or_default(),
            reference: self.reference.to_string(),
            failure_code: (self.status == RefundStatus::Failed).then(|| REFUND_FAILURE_CODE.into()),
        }
    }

    /// Whether it takes part of its charge: succeeded, or pending (it may yet succeed).
    fn holds(&self) -> bool {
        self.status != RefundStatus::Failed
    }
}

/// The index `id` names (`{prefix}{number:06}{suffix:010x}`), if `suffix_of` the index is
/// the id's suffix. Only the id as the sandbox wrote it: another spelling of it (upper-case
/// hex, more leading zeros, a sign) names nothing, as a provider's id is matched by its
/// bytes everywhere in pagos (a resolution's check of whose charge it is, the reports).
fn index_of(prefix: &str, id: &str, suffix_of: impl Fn(usize) -> Option<u64>) -> Option<usize> {
    let rest = id.strip_prefix(prefix)?;
    let split = rest.len().checked_sub(10)?;
    let (number, suffix) = (rest.get(..split)?, rest.get(split..)?);
    let index = number.parse::<usize>().ok()?.checked_sub(1)?;
    let suffix = u64::from_str_radix(suffix, 16).ok()?;
    let written = format!("{prefix}{:06}{suffix:010x}", index + 1);
    (suffix_of(index)? == suffix && written == id).then_some(index)
}

/// The charges (or refunds) made for one reference, or the refunds of one charge: nearly
/// always one.
enum Refs {
    One(u32),
    Many(Vec<u32>),
}

impl Refs {
    fn indexes(&self) -> &[u32] {
        match self {
            Refs::One(one) => std::slice::from_ref(one),
            Refs::Many(many) => many,
        }
    }

    fn add<K: std::hash::Hash + Eq>(map: &mut HashMap<K, Refs>, key: K, index: u32) {
        map.entry(key)
            .and_modify(|refs| match refs {
                Refs::One(one) => *refs = Refs::Many(vec![*one, index]),
                Refs::Many(many) => many.push(index),
            })
            .or_insert(Refs::One(index));
    }
}

fn reference_hash(reference: &str) -> u64 {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let mut hasher = DefaultHasher::new();
    reference.hash(&mut hasher);
    hasher.finish()
}

/// A charge as it stands after a change, with the charge's sequence number.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChargeChange {
    pub charge: Charge,
    pub sequence: u64,
}

/// A refund as it stands after a change, with the refund's sequence number.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RefundChange {
    pub refund: Refund,
    pub sequence: u64,
}

/// A change of a charge or of a refund, in the order they happen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    Charge(ChargeChange),
    Refund(RefundChange),
}

/// What the sandbox's refunds add up to, for soak tests and demos.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RefundTotals {
    pub made: usize,
    pub succeeded: usize,
    pub failed: usize,
    pub pending: usize,
    /// Sum of the succeeded refunds' amounts.
    pub refunded_amount: i64,
    /// Charges with at least one succeeded refund.
    pub refunded_charges: usize,
    /// Charges whose succeeded refunds add up to more than the charge (never, unless the
    /// sandbox is wrong).
    pub over_refunded_charges: usize,
    /// Refund references refunded more than once.
    pub duplicated_references: usize,
}

struct State {
    rng: StdRng,
    keys: HashMap<Digest16, KeyEntry>,
    charges: Vec<StoredCharge>,
    /// Charge indexes by a hash of their reference (two references may share a hash:
    /// readers compare the reference itself).
    by_reference: HashMap<u64, Refs>,
    refunds: Vec<StoredRefund>,
    /// Refund indexes by a hash of their reference (as `by_reference`).
    refunds_by_reference: HashMap<u64, Refs>,
    /// Refund indexes by the index of their charge.
    refunds_by_charge: HashMap<u32, Refs>,
}

pub struct SandboxCore {
    outcomes: Outcomes,
    state: Mutex<State>,
    /// Where changes are reported, in the order they happen (sent under the lock).
    changes: Option<UnboundedSender<Change>>,
}

/// The digest of a request body (`ChargeBody`, `RefundBody`: structs of scalars). A body
/// is compared as the struct it was read into, so the order of its members on the wire
/// never matters: serialized in the struct's own order, the same fields give the same
/// bytes: canonical JSON would only sort them again, twice for every charge.
fn body_hash(body: &impl serde::Serialize) -> Digest16 {
    let written = serde_json::to_vec(body).unwrap_or_default();
    digest16(&written)
}

impl SandboxCore {
    pub fn new(outcomes: Outcomes) -> Self {
        Self::build(outcomes, None)
    }

    /// A core that reports every change of a charge or refund on `changes`.
    pub fn reporting(outcomes: Outcomes, changes: UnboundedSender<Change>) -> Self {
        Self::build(outcomes, Some(changes))
    }

    fn build(outcomes: Outcomes, changes: Option<UnboundedSender<Change>>) -> Self {
        let rng = match outcomes.seed {
            Some(seed) => StdRng::seed_from_u64(seed),
            None => StdRng::from_os_rng(),
        };
        SandboxCore {
            outcomes,
            state: Mutex::new(State {
                rng,
                keys: HashMap::new(),
                charges: Vec::new(),
                by_reference: HashMap::new(),
                refunds: Vec::new(),
                refunds_by_reference: HashMap::new(),
                refunds_by_charge: HashMap::new(),
            }),
            changes,
        }
    }

    pub fn outcomes(&self) -> Outcomes {
        self.outcomes
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock leaves consistent maps (every update is one
        // insert), so a poisoned lock is still safe to use.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Draws a number in [0, 1) from the sandbox's (possibly seeded) generator.
    pub fn roll(&self) -> f64 {
        self.lock().rng.random::<f64>()
    }

    pub fn begin(&self, key: &str, body: &ChargeBody) -> Begin<Charge> {
        let hash = body_hash(body);
        let key = digest16(key.as_bytes());
        let mut state = self.lock();
        let state = &mut *state;
        match state.keys.get(&key) {
            None => {
                state
                    .keys
                    .insert(key, KeyEntry::InFlight { body_hash: hash });
                Begin::New
            }
            Some(KeyEntry::InFlight { body_hash }) if *body_hash == hash => Begin::InFlight,
            Some(KeyEntry::Done { body_hash, charge }) if *body_hash == hash => {
                let index = *charge as usize;
                match state.charges.get_mut(index) {
                    Some(stored) => Begin::Replay(settle(stored, index, &self.changes)),
                    None => Begin::InFlight,
                }
            }
            Some(_) => Begin::Mismatch,
        }
    }

    /// As `begin`, for a refund.
    pub fn begin_refund(&self, key: &str, body: &RefundBody) -> Begin<Refund> {
        let hash = body_hash(body);
        let key = digest16(key.as_bytes());
        let mut state = self.lock();
        let state = &mut *state;
        let index = match state.keys.get(&key) {
            None => {
                state
                    .keys
                    .insert(key, KeyEntry::InFlight { body_hash: hash });
                return Begin::New;
            }
            Some(KeyEntry::InFlight { body_hash }) if *body_hash == hash => {
                return Begin::InFlight;
            }
            Some(KeyEntry::RefundDone { body_hash, refund }) if *body_hash == hash => {
                *refund as usize
            }
            Some(_) => return Begin::Mismatch,
        };
        match settle_refund(state, index, &self.changes) {
            Some(refund) => Begin::Replay(refund),
            None => Begin::InFlight,
        }
    }

    /// Forgets an in-flight key whose request failed before making anything (a 503).
    pub fn abandon(&self, key: &str) {
        let key = digest16(key.as_bytes());
        forget_in_flight(&mut self.lock(), &key);
    }

    /// The dice of a new charge or refund, drawn in this order: its id's random suffix,
    /// whether it is pending, whether it fails (at `failure_rate`). Returns the suffix, the
    /// status it is made in, and for a pending one when it settles and to what.
    fn dice<S: Made>(&self, rng: &mut StdRng, failure_rate: f64) -> (u64, S, Option<(Instant, S)>) {
        let suffix: u64 = rng.random::<u64>() & 0xff_ffff_ffff;
        let roll: f64 = rng.random();
        let fail: f64 = rng.random();
        let final_status = if fail < failure_rate {
            S::FAILED
        } else {
            S::SUCCEEDED
        };
        if roll < self.outcomes.pending_rate {
            let at = Instant::now() + self.outcomes.pending_for;
            (suffix, S::PENDING, Some((at, final_status)))
        } else {
            (suffix, final_status, None)
        }
    }

    /// Makes the charge for a key that `begin` answered `New` for.
    pub fn complete(&self, key: &str, body: &ChargeBody) -> Charge {
        let (key, hash) = (digest16(key.as_bytes()), body_hash(body));
        let mut state = self.lock();
        let state = &mut *state;
        let index = state.charges.len();
        let number = u32::try_from(index).unwrap_or(u32::MAX);
        let (suffix, status, settles) = self.dice(&mut state.rng, self.outcomes.decline_rate);
        let stored = StoredCharge {
            suffix,
            amount: body.amount,
            currency: body.currency.as_str().into(),
            reference: body.reference.as_str().into(),
            status,
            settles,
            sequence: 1,
        };
        let charge = stored.charge(index);
        state.charges.push(stored);
        report(
            &self.changes,
            Change::Charge(ChargeChange {
                charge: charge.clone(),
                sequence: 1,
            }),
        );
        Refs::add(
            &mut state.by_reference,
            reference_hash(&body.reference),
            number,
        );
        state.keys.insert(
            key,
            KeyEntry::Done {
                body_hash: hash,
                charge: number,
            },
        );
        charge
    }

    /// Makes the refund for a key that `begin_refund` answered `New` for, unless it must
    /// be refused (then the key is forgotten: nothing was made under it). The check of
    /// what is left of the charge and the refund's making are one step under the lock, so
    /// refunds racing with different keys never together exceed their charge.
    pub fn complete_refund(&self, key: &str, body: &RefundBody) -> Result<Refund, RefundRefused> {
        let (key, hash) = (digest16(key.as_bytes()), body_hash(body));
        let mut state = self.lock();
        let state = &mut *state;
        let made = self.refundable(state, body).map(|charge| {
            let index = state.refunds.len();
            let number = u32::try_from(index).unwrap_or(u32::MAX);
            let (suffix, status, settles) =
                self.dice(&mut state.rng, self.outcomes.refund_failure_rate);
            let stored = StoredRefund {
                suffix,
                charge,
                sequence: 1,
                amount: body.amount,
                reference: body.reference.as_str().into(),
                status,
                settles,
            };
            let refund = stored.refund(index, &state.charges);
            state.refunds.push(stored);
            Refs::add(
                &mut state.refunds_by_reference,
                reference_hash(&body.reference),
                number,
            );
            Refs::add(&mut state.refunds_by_charge, charge, number);
            state.keys.insert(
                key,
                KeyEntry::RefundDone {
                    body_hash: hash,
                    refund: number,
                },
            );
            report(
                &self.changes,
                Change::Refund(RefundChange {
                    refund: refund.clone(),
                    sequence: 1,
                }),
            );
            refund
        });
        if made.is_err() {
            forget_in_flight(state, &key);
        }
        made
    }

    /// The index of the charge `body` may refund, or why not. Settles what is due first:
    /// a charge pending until now, refunds of it that failed meanwhile.
    fn refundable(&self, state: &mut State, body: &RefundBody) -> Result<u32, RefundRefused> {
        let index = index_of("ch_", &body.charge, |i| {
            state.charges.get(i).map(|c| c.suffix)
        })
        .ok_or(RefundRefused::UnknownCharge)?;
        let number = u32::try_from(index).map_err(|_| RefundRefused::UnknownCharge)?;
        let charge = match state.charges.get_mut(index) {
            Some(stored) => settle(stored, index, &self.changes),
            None => return Err(RefundRefused::UnknownCharge),
        };
        if charge.status != ChargeStatus::Succeeded {
            return Err(RefundRefused::ChargeNotSucceeded);
        }
        if body.currency != charge.currency {
            return Err(RefundRefused::CurrencyMismatch);
        }
        if body.amount <= 0 {
            return Err(RefundRefused::NotPositive);
        }
        let others: Vec<u32> = state
            .refunds_by_charge
            .get(&number)
            .map(|refs| refs.indexes().to_vec())
            .unwrap_or_default();
        let mut held = 0i64;
        for other in others {
            settle_refund(state, other as usize, &self.changes);
            if let Some(stored) = state.refunds.get(other as usize)
                && stored.holds()
            {
                held = held.saturating_add(stored.amount);
            }
        }
        let remaining = charge.amount.saturating_sub(held);
        if body.amount > remaining {
            return Err(RefundRefused::ExceedsRemaining { remaining });
        }
        Ok(number)
    }

    /// Every charge for a reference, pending ones settled if their time has come.
    pub fn charges_for(&self, reference: &str) -> Vec<Charge> {
        let mut state = self.lock();
        let state = &mut *state;
        let Some(refs) = state.by_reference.get(&reference_hash(reference)) else {
            return Vec::new();
        };
        let mut found = Vec::new();
        for &index in refs.indexes() {
            let index = index as usize;
            if let Some(stored) = state.charges.get_mut(index)
                && &*stored.reference == reference
            {
                found.push(settle(stored, index, &self.changes));
            }
        }
        found
    }

    /// Every refund for a reference, pending ones settled if their time has come.
    pub fn refunds_for(&self, reference: &str) -> Vec<Refund> {
        let mut state = self.lock();
        let state = &mut *state;
        let indexes: Vec<u32> = match state.refunds_by_reference.get(&reference_hash(reference)) {
            Some(refs) => refs.indexes().to_vec(),
            None => return Vec::new(),
        };
        let mut found = Vec::new();
        for index in indexes {
            let index = index as usize;
            if state
                .refunds
                .get(index)
                .is_some_and(|r| &*r.reference == reference)
            {
                found.extend(settle_refund(state, index, &self.changes));
            }
        }
        found
    }

    /// Settles one pending charge if its time has come; the charge as it stands.
    pub fn settle_due(&self, charge_id: &str) -> Option<Charge> {
        let mut state = self.lock();
        let index = index_of("ch_", charge_id, |i| state.charges.get(i).map(|c| c.suffix))?;
        let stored = state.charges.get_mut(index)?;
        Some(settle(stored, index, &self.changes))
    }

    /// Settles one pending refund if its time has come; the refund as it stands.
    pub fn settle_refund_due(&self, refund_id: &str) -> Option<Refund> {
        let mut state = self.lock();
        let index = index_of("re_", refund_id, |i| state.refunds.get(i).map(|r| r.suffix))?;
        settle_refund(&mut state, index, &self.changes)
    }

    /// (charges made, references charged more than once).
    pub fn totals(&self) -> (usize, usize) {
        let state = self.lock();
        let mut duplicated = 0;
        for refs in state.by_reference.values() {
            if let Refs::Many(indexes) = refs {
                let mut per_reference: HashMap<&str, usize> = HashMap::new();
                for &index in indexes {
                    if let Some(stored) = state.charges.get(index as usize) {
                        *per_reference.entry(&stored.reference).or_default() += 1;
                    }
                }
                duplicated += per_reference.values().filter(|&&n| n > 1).count();
            }
        }
        (state.charges.len(), duplicated)
    }

    /// What the refunds add up to, pending ones settled where due.
    pub fn refund_totals(&self) -> RefundTotals {
        let mut state = self.lock();
        let state = &mut *state;
        for index in 0..state.refunds.len() {
            settle_refund(state, index, &self.changes);
        }
        let mut totals = RefundTotals {
            made: state.refunds.len(),
            ..RefundTotals::default()
        };
        let mut per_charge: HashMap<u32, i64> = HashMap::new();
        for refund in &state.refunds {
            match refund.status {
                RefundStatus::Succeeded => {
                    totals.succeeded += 1;
                    totals.refunded_amount = totals.refunded_amount.saturating_add(refund.amount);
                    *per_charge.entry(refund.charge).or_default() += refund.amount;
                }
                RefundStatus::Failed => totals.failed += 1,
                RefundStatus::Pending => totals.pending += 1,
            }
        }
        totals.refunded_charges = per_charge.len();
        totals.over_refunded_charges = per_charge
            .iter()
            .filter(|(charge, refunded)| {
                state
                    .charges
                    .get(**charge as usize)
                    .is_none_or(|c| **refunded > c.amount)
            })
            .count();
        for refs in state.refunds_by_reference.values() {
            if let Refs::Many(indexes) = refs {
                let mut per_reference: HashMap<&str, usize> = HashMap::new();
                for &index in indexes {
                    if let Some(stored) = state.refunds.get(index as usize) {
                        *per_reference.entry(&stored.reference).or_default() += 1;
                    }
                }
                totals.duplicated_references += per_reference.values().filter(|&&n| n > 1).count();
            }
        }
        totals
    }

    /// Every charge made, settled where due: for the standalone server's counts.
    pub fn all_charges(&self) -> Vec<Charge> {
        let mut state = self.lock();
        state
            .charges
            .iter_mut()
            .enumerate()
            .map(|(index, stored)| settle(stored, index, &self.changes))
            .collect()
    }
}

fn forget_in_flight(state: &mut State, key: &Digest16) {
    if matches!(state.keys.get(key), Some(KeyEntry::InFlight { .. })) {
        state.keys.remove(key);
    }
}

fn report(changes: &Option<UnboundedSender<Change>>, change: Change) {
    if let Some(changes) = changes {
        // Nobody listening any more (shutting down) is not an error.
        let _ = changes.send(change);
    }
}

/// A stored charge or refund as it settles: when (and to what) it settles if it is
/// pending, its status, its sequence.
trait Settling {
    type Status: Copy;
    fn settling(&mut self) -> SettlingParts<'_, Self::Status>;
}

type SettlingParts<'a, S> = (&'a mut Option<(Instant, S)>, &'a mut S, &'a mut u32);

impl Settling for StoredCharge {
    type Status = ChargeStatus;
    fn settling(&mut self) -> SettlingParts<'_, ChargeStatus> {
        (&mut self.settles, &mut self.status, &mut self.sequence)
    }
}

impl Settling for StoredRefund {
    type Status = RefundStatus;
    fn settling(&mut self) -> SettlingParts<'_, RefundStatus> {
        (&mut self.settles, &mut self.status, &mut self.sequence)
    }
}

/// A pending charge's or refund's settling, once its time has come: its status becomes
/// the one it settles to, and its sequence goes one up. True when it settled (a change).
fn settle_if_due(stored: &mut impl Settling) -> bool {
    let (settles, status, sequence) = stored.settling();
    let Some((at, to)) = *settles else {
        return false;
    };
    if Instant::now() < at {
        return false;
    }
    *status = to;
    *settles = None;
    *sequence += 1;
    true
}

/// The charge at `index` as it stands, settled first if it was pending and its time has
/// come (a change, reported).
fn settle(
    stored: &mut StoredCharge,
    index: usize,
    changes: &Option<UnboundedSender<Change>>,
) -> Charge {
    if settle_if_due(stored) {
        report(
            changes,
            Change::Charge(ChargeChange {
                charge: stored.charge(index),
                sequence: u64::from(stored.sequence),
            }),
        );
    }
    stored.charge(index)
}

/// The refund at `index` as it stands, settled first if it was pending and its time has
/// come (a change, reported).
fn settle_refund(
    state: &mut State,
    index: usize,
    changes: &Option<UnboundedSender<Change>>,
) -> Option<Refund> {
    let State {
        refunds, charges, ..
    } = state;
    let stored = refunds.get_mut(index)?;
    if settle_if_due(stored) {
        report(
            changes,
            Change::Refund(RefundChange {
                refund: stored.refund(index, charges),
                sequence: u64::from(stored.sequence),
            }),
        );
    }
    Some(stored.refund(index, charges))
}

/// The statuses the sandbox makes a charge or a refund in.
trait Made: Copy {
    const SUCCEEDED: Self;
    const FAILED: Self;
    const PENDING: Self;
}

impl Made for ChargeStatus {
    const SUCCEEDED: Self = ChargeStatus::Succeeded;
    const FAILED: Self = ChargeStatus::Declined;
    const PENDING: Self = ChargeStatus::Pending;
}

impl Made for RefundStatus {
    const SUCCEEDED: Self = RefundStatus::Succeeded;
    const FAILED: Self = RefundStatus::Failed;
    const PENDING: Self = RefundStatus::Pending;
}

/// The in-process sandbox: answers at once, no network.
pub struct SandboxGateway {
    core: SandboxCore,
}

impl SandboxGateway {
    pub fn new(outcomes: Outcomes) -> Self {
        SandboxGateway {
            core: SandboxCore::new(outcomes),
        }
    }

    pub fn core(&self) -> &SandboxCore {
        &self.core
    }
}

/// What the standalone sandbox answers 409 (in flight) and 422 (same key, other body) for,
/// read the way every adapter's answers are read.
fn in_flight_or_mismatch<T>(begun: &Begin<T>) -> GatewayError {
    let (status, said, detail) = match begun {
        Begin::Mismatch => (
            StatusCode::UNPROCESSABLE_ENTITY,
            KeySaid::UsedWithAnotherRequest,
            "this key was used with another body",
        ),
        _ => (
            StatusCode::CONFLICT,
            KeySaid::Nothing,
            "a request with this key is in flight",
        ),
    };
    super::classify::refusal("the sandbox", status, said, detail)
}

#[async_trait]
impl Gateway for SandboxGateway {
    async fn charge(&self, req: &ChargeRequest) -> Result<Charge, GatewayError> {
        let body = ChargeBody::from(req);
        match self.core.begin(&req.gateway_key, &body) {
            Begin::New => Ok(self.core.complete(&req.gateway_key, &body)),
            Begin::Replay(charge) => Ok(charge),
            other => Err(in_flight_or_mismatch(&other)),
        }
    }

    async fn lookup(&self, reference: Uuid) -> Result<Vec<Charge>, GatewayError> {
        Ok(self.core.charges_for(&reference.to_string()))
    }

    async fn refund(&self, req: &RefundRequest) -> Result<Refund, GatewayError> {
        let body = RefundBody::from(req);
        match self.core.begin_refund(&req.gateway_key, &body) {
            Begin::New => self
                .core
                .complete_refund(&req.gateway_key, &body)
                .map_err(|refused| {
                    // What the standalone sandbox answers 400 for, read as every adapter
                    // reads it.
                    let amount = match refused {
                        RefundRefused::ExceedsRemaining { .. } => AmountSaid::ExceedsRemaining,
                        _ => AmountSaid::Nothing,
                    };
                    refund_refusal(
                        "the sandbox",
                        StatusCode::BAD_REQUEST,
                        KeySaid::Nothing,
                        amount,
                        &refused.body().to_string(),
                    )
                }),
            Begin::Replay(refund) => Ok(refund),
            other => Err(in_flight_or_mismatch(&other)),
        }
    }

    async fn lookup_refunds(&self, refund: &RefundLookup) -> Result<Vec<Refund>, GatewayError> {
        Ok(self.core.refunds_for(&refund.reference.to_string()))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_id_names_a_charge_only_as_the_sandbox_wrote_it() {
        let suffix = |i: usize| (i == 0).then_some(0x0036_271a_4871_u64);
        assert_eq!(
            super::index_of("ch_", "ch_00000136271a4871", suffix),
            Some(0)
        );
        for other in [
            "ch_00000136271A4871",
            "ch_000000136271a4871",
            "ch_+00001",
            "ch_+0000136271a4871",
            "CH_00000136271a4871",
        ] {
            assert_eq!(super::index_of("ch_", other, suffix), None, "{other}");
        }
    }

    use super::*;

    /// A sandbox with `outcomes` and the receiver of the changes it reports.
    fn reporting(
        outcomes: Outcomes,
    ) -> (SandboxCore, tokio::sync::mpsc::UnboundedReceiver<Change>) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        (SandboxCore::reporting(outcomes, tx), rx)
    }

    /// Outcomes that leave every charge and refund pending for `time`.
    fn pending_for(time: Duration) -> Outcomes {
        Outcomes {
            pending_rate: 1.0,
            pending_for: time,
            ..Outcomes::default()
        }
    }

    /// A new charge of `amount` under the key "k", made on `core`, with its body.
    fn charge_made(core: &SandboxCore, amount: i64) -> (ChargeBody, Charge) {
        let body = ChargeBody::from(&request("k", amount));
        assert!(matches!(core.begin("k", &body), Begin::New));
        let charge = core.complete("k", &body);
        (body, charge)
    }

    fn request(key: &str, amount: i64) -> ChargeRequest {
        ChargeRequest {
            gateway_key: key.into(),
            amount,
            currency: "COP".into(),
            reference: Uuid::nil(),
            description: None,
            payment_method: None,
        }
    }

    #[tokio::test]
    async fn one_key_makes_one_charge_however_often_it_is_sent() {
        let sandbox = SandboxGateway::new(Outcomes::default());
        let first = sandbox.charge(&request("k", 10)).await.expect("charged");
        let again = sandbox.charge(&request("k", 10)).await.expect("replayed");
        assert_eq!(first, again);
        assert_eq!(sandbox.core().totals(), (1, 0));
        assert_eq!(first.status, ChargeStatus::Succeeded);
    }

    #[tokio::test]
    async fn one_key_with_another_body_leaves_the_outcome_unknown() {
        let sandbox = SandboxGateway::new(Outcomes::default());
        sandbox.charge(&request("k", 10)).await.expect("charged");
        let err = sandbox
            .charge(&request("k", 11))
            .await
            .expect_err("refused");
        // A charge exists under the key: never read as a refusal of the payment.
        assert!(matches!(err, GatewayError::Unknown(_)), "{err:?}");
    }

    #[tokio::test]
    async fn every_change_of_a_charge_is_reported_once_with_a_higher_sequence() {
        let (core, mut rx) = reporting(pending_for(Duration::from_millis(20)));
        let (body, charge) = charge_made(&core, 10);
        assert!(matches!(core.begin("k", &body), Begin::Replay(_)));
        let Ok(Change::Charge(made)) = rx.try_recv() else {
            panic!("a charge change reported");
        };
        assert_eq!(
            (made.sequence, made.charge.status),
            (1, ChargeStatus::Pending)
        );
        assert!(rx.try_recv().is_err(), "a replay is not a change");

        tokio::time::sleep(Duration::from_millis(30)).await;
        let settled = core.settle_due(&charge.id).expect("known");
        assert_eq!(settled.status, ChargeStatus::Succeeded);
        let change = rx.try_recv().expect("reported");
        assert_eq!(
            change,
            Change::Charge(ChargeChange {
                sequence: 2,
                charge: settled
            })
        );
        assert_eq!(core.charges_for(&Uuid::nil().to_string()).len(), 1);
        assert!(rx.try_recv().is_err(), "settled once, reported once");
    }

    #[test]
    fn two_keys_for_one_reference_are_two_charges_and_one_duplicate() {
        let core = SandboxCore::new(Outcomes::default());
        let body = ChargeBody::from(&request("k1", 10));
        let mut made = Vec::new();
        for key in ["k1", "k2"] {
            assert!(matches!(core.begin(key, &body), Begin::New));
            made.push(core.complete(key, &body));
        }
        let other = ChargeBody {
            reference: "another".into(),
            ..body.clone()
        };
        assert!(matches!(core.begin("k3", &other), Begin::New));
        made.push(core.complete("k3", &other));

        assert_eq!(core.totals(), (3, 1));
        assert_eq!(core.charges_for(&body.reference), made[..2].to_vec());
        assert_eq!(core.charges_for("another"), made[2..].to_vec());
        assert!(core.charges_for("nobody").is_empty());
        assert_eq!(core.all_charges(), made);
        // Each id names its own charge, and nothing else names one.
        for charge in &made {
            assert_eq!(core.settle_due(&charge.id).as_ref(), Some(charge));
        }
        let forged = format!("{}0", &made[0].id[..made[0].id.len() - 1]);
        for id in [
            forged.as_str(),
            "ch_",
            "ch_000001",
            "x",
            "ch_000009aaaaaaaaaa",
        ] {
            if id != made[0].id {
                assert_eq!(core.settle_due(id), None, "{id}");
            }
        }
    }

    #[tokio::test]
    async fn pending_charges_settle_after_their_time() {
        let sandbox = SandboxGateway::new(pending_for(Duration::from_millis(30)));
        let charge = sandbox.charge(&request("k", 10)).await.expect("accepted");
        assert_eq!(charge.status, ChargeStatus::Pending);
        tokio::time::sleep(Duration::from_millis(40)).await;
        let found = sandbox.lookup(Uuid::nil()).await.expect("lookup");
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].status, ChargeStatus::Succeeded);
    }

    fn refund_request(key: &str, charge: &Charge, amount: i64, reference: Uuid) -> RefundRequest {
        RefundRequest {
            gateway_key: key.into(),
            charge: charge.id.clone(),
            amount,
            currency: charge.currency.clone(),
            reference,
            reason: None,
            whole: false,
        }
    }

    fn refund_ref(n: u128) -> Uuid {
        Uuid::from_u128(n)
    }

    /// A sandbox with a charge of 100 under the key "k", of which `amount` was refunded
    /// under `key` (the refund reference `refund_ref(1)`).
    async fn refunded_once(key: &str, amount: i64) -> (SandboxGateway, Charge) {
        let sandbox = SandboxGateway::new(Outcomes::default());
        let charge = sandbox.charge(&request("k", 100)).await.expect("charged");
        sandbox
            .refund(&refund_request(key, &charge, amount, refund_ref(1)))
            .await
            .expect("refunded");
        (sandbox, charge)
    }

    #[tokio::test]
    async fn one_refund_key_makes_one_refund_however_often_it_is_sent() {
        let sandbox = SandboxGateway::new(Outcomes::default());
        let charge = sandbox.charge(&request("k", 100)).await.expect("charged");
        let req = refund_request("rk", &charge, 40, refund_ref(1));
        let first = sandbox.refund(&req).await.expect("refunded");
        let again = sandbox.refund(&req).await.expect("replayed");
        assert_eq!(first, again);
        assert_eq!(first.status, RefundStatus::Succeeded);
        assert_eq!(first.charge, charge.id);
        assert_eq!(first.currency, "COP");
        assert!(first.id.starts_with("re_"), "{}", first.id);
        let totals = sandbox.core().refund_totals();
        assert_eq!((totals.made, totals.refunded_amount), (1, 40));
        let found = sandbox
            .lookup_refunds(&req.lookup(None))
            .await
            .expect("lookup");
        assert_eq!(found, vec![first]);
        assert!(
            sandbox
                .lookup_refunds(&refund_request("x", &charge, 1, refund_ref(9)).lookup(None))
                .await
                .expect("lookup")
                .is_empty()
        );
    }

    #[tokio::test]
    async fn a_refund_over_what_is_left_is_refused_as_such_and_frees_its_key() {
        let (sandbox, charge) = refunded_once("r1", 70).await;
        let over = refund_request("r2", &charge, 31, refund_ref(2));
        let err = sandbox.refund(&over).await.expect_err("refused");
        assert!(
            matches!(
                &err,
                GatewayError::Rejected {
                    status: 400,
                    reason: crate::gateway::RejectReason::ExceedsRemaining,
                    detail,
                } if detail.contains("amount_exceeds_remaining") && detail.contains("30")
            ),
            "{err:?}"
        );
        // The same key again is judged afresh, not stuck in flight.
        let err = sandbox.refund(&over).await.expect_err("still refused");
        assert!(matches!(err, GatewayError::Rejected { .. }), "{err:?}");
        let exact = sandbox
            .refund(&refund_request("r3", &charge, 30, refund_ref(3)))
            .await
            .expect("what is left can be refunded");
        assert_eq!(exact.amount, 30);
        let totals = sandbox.core().refund_totals();
        assert_eq!(totals.refunded_amount, 100);
        assert_eq!(totals.over_refunded_charges, 0);
        assert_eq!(totals.refunded_charges, 1);
    }

    #[tokio::test]
    async fn refunds_of_unknown_declined_or_pending_charges_are_refused_plainly() {
        let sandbox = SandboxGateway::new(Outcomes {
            decline_rate: 1.0,
            ..Outcomes::default()
        });
        let declined = sandbox.charge(&request("k", 100)).await.expect("answered");
        assert_eq!(declined.status, ChargeStatus::Declined);
        let mut forged = declined.clone();
        forged.id = "ch_000099aaaaaaaaaa".into();
        let pending = SandboxGateway::new(pending_for(Duration::from_secs(3600)));
        let waiting = pending.charge(&request("k", 100)).await.expect("answered");
        for (sandbox, charge, code) in [
            (&sandbox, &declined, "charge_not_refundable"),
            (&sandbox, &forged, "charge_not_found"),
            (&pending, &waiting, "charge_not_refundable"),
        ] {
            let err = sandbox
                .refund(&refund_request("r", charge, 10, refund_ref(1)))
                .await
                .expect_err("refused");
            assert!(
                matches!(
                    &err,
                    GatewayError::Rejected {
                        status: 400,
                        reason: crate::gateway::RejectReason::Other,
                        detail,
                    } if detail.contains(code)
                ),
                "{code}: {err:?}"
            );
        }
        let ok = SandboxGateway::new(Outcomes::default());
        let charge = ok.charge(&request("k", 100)).await.expect("charged");
        let mut usd = refund_request("r", &charge, 10, refund_ref(1));
        usd.currency = "USD".into();
        let zero = refund_request("z", &charge, 0, refund_ref(2));
        for (req, code) in [(usd, "currency_mismatch"), (zero, "invalid_amount")] {
            let err = ok.refund(&req).await.expect_err("refused");
            assert!(err.to_string().contains(code), "{err}");
        }
        assert_eq!(ok.core().refund_totals().made, 0);
    }

    #[tokio::test]
    async fn a_refund_key_with_another_body_or_a_charge_key_leaves_the_outcome_unknown() {
        let (sandbox, charge) = refunded_once("rk", 10).await;
        for req in [
            refund_request("rk", &charge, 11, refund_ref(1)),
            refund_request("k", &charge, 10, refund_ref(2)),
        ] {
            let err = sandbox.refund(&req).await.expect_err("mismatch");
            assert!(matches!(err, GatewayError::Unknown(_)), "{err:?}");
        }
        let core = sandbox.core();
        let body = RefundBody::from(&refund_request("fresh", &charge, 5, refund_ref(3)));
        assert!(matches!(core.begin_refund("fresh", &body), Begin::New));
        assert!(matches!(core.begin_refund("fresh", &body), Begin::InFlight));
    }

    #[test]
    fn a_failed_refund_holds_nothing_of_its_charge() {
        let (core, mut rx) = reporting(Outcomes {
            refund_failure_rate: 1.0,
            ..Outcomes::default()
        });
        let (_, charge) = charge_made(&core, 100);
        assert!(matches!(rx.try_recv(), Ok(Change::Charge(_))));
        let mut made = Vec::new();
        for (key, n) in [("r0", 7), ("r1", 8)] {
            let body = RefundBody::from(&refund_request(key, &charge, 100, refund_ref(n)));
            assert!(matches!(core.begin_refund(key, &body), Begin::New));
            made.push(core.complete_refund(key, &body).expect("made"));
        }
        for refund in &made {
            assert_eq!(
                (refund.status, refund.failure_code.as_deref()),
                (RefundStatus::Failed, Some("declined"))
            );
        }
        let reported: Vec<Change> = std::iter::from_fn(|| rx.try_recv().ok()).collect();
        assert_eq!(reported.len(), 2, "{reported:?}");
        let totals = core.refund_totals();
        assert_eq!((totals.failed, totals.refunded_amount), (2, 0));
    }

    #[tokio::test]
    async fn a_pending_refund_settles_after_its_time_with_a_higher_sequence() {
        let (core, mut rx) = reporting(pending_for(Duration::from_millis(30)));
        let (_, charge) = charge_made(&core, 100);
        tokio::time::sleep(Duration::from_millis(40)).await;
        assert_eq!(
            core.settle_due(&charge.id).map(|c| c.status),
            Some(ChargeStatus::Succeeded)
        );
        let charge = core.settle_due(&charge.id).expect("known");
        let _changes: Vec<Change> = std::iter::from_fn(|| rx.try_recv().ok()).collect();

        let body = RefundBody::from(&refund_request("r", &charge, 60, refund_ref(1)));
        assert!(matches!(core.begin_refund("r", &body), Begin::New));
        let refund = core.complete_refund("r", &body).expect("made");
        assert_eq!(refund.status, RefundStatus::Pending);
        let Ok(Change::Refund(made)) = rx.try_recv() else {
            panic!("the refund's making is reported");
        };
        assert_eq!((made.sequence, made.refund.clone()), (1, refund.clone()));
        // Pending, it holds its amount: 41 is over what is left.
        let over = RefundBody::from(&refund_request("r2", &charge, 41, refund_ref(2)));
        assert!(matches!(core.begin_refund("r2", &over), Begin::New));
        assert_eq!(
            core.complete_refund("r2", &over),
            Err(RefundRefused::ExceedsRemaining { remaining: 40 })
        );
        assert!(rx.try_recv().is_err(), "a refusal is no change");
        assert_eq!(core.refund_totals().pending, 1);

        tokio::time::sleep(Duration::from_millis(40)).await;
        let settled = core.settle_refund_due(&refund.id).expect("known");
        assert_eq!(settled.status, RefundStatus::Succeeded);
        let Ok(Change::Refund(change)) = rx.try_recv() else {
            panic!("the settling is reported");
        };
        assert_eq!((change.sequence, change.refund), (2, settled.clone()));
        assert_eq!(core.refunds_for(&refund_ref(1).to_string()), vec![settled]);
        assert!(rx.try_recv().is_err(), "settled once, reported once");
        let totals = core.refund_totals();
        assert_eq!(
            (totals.succeeded, totals.pending, totals.refunded_amount),
            (1, 0, 60)
        );
        assert_eq!(core.settle_refund_due("re_000009aaaaaaaaaa"), None);
    }

    #[tokio::test]
    async fn two_keys_for_one_refund_reference_are_counted_as_a_duplicate() {
        let sandbox = SandboxGateway::new(Outcomes::default());
        let charge = sandbox.charge(&request("k", 100)).await.expect("charged");
        for key in ["r1", "r2"] {
            sandbox
                .refund(&refund_request(key, &charge, 10, refund_ref(1)))
                .await
                .expect("refunded");
        }
        sandbox
            .refund(&refund_request("r3", &charge, 10, refund_ref(2)))
            .await
            .expect("refunded");
        let totals = sandbox.core().refund_totals();
        assert_eq!((totals.made, totals.duplicated_references), (3, 1));
    }
}
