//! The sandbox gateway: an in-memory implementation of the reference protocol's rules.
//!
//! `SandboxCore` holds the rules (same key + same body replays, same key + other body is
//! refused, a key in flight answers "in flight", pending charges settle later); the
//! in-process `SandboxGateway` and the standalone server (`sandbox_server`) share it.
//! Every change of a charge (made, then settled if it was pending) bumps the charge's
//! sequence and, when someone listens, is reported as a `ChargeChange`: the standalone
//! server turns those into webhooks.
//! Nothing here is durable: it is for demos and tests, never for money.

use super::{Charge, ChargeBody, ChargeRequest, ChargeStatus, Gateway, GatewayError};
use async_trait::async_trait;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::sync::mpsc::UnboundedSender;
use uuid::Uuid;

/// How charges turn out.
#[derive(Clone, Copy, Debug)]
pub struct Outcomes {
    pub decline_rate: f64,
    pub pending_rate: f64,
    /// How long a pending charge stays pending before it settles.
    pub pending_for: Duration,
    pub seed: Option<u64>,
}

impl Default for Outcomes {
    fn default() -> Self {
        Outcomes {
            decline_rate: 0.0,
            pending_rate: 0.0,
            pending_for: Duration::from_secs(2),
            seed: None,
        }
    }
}

/// What the core says about a charge request before any work is done.
#[derive(Debug)]
pub enum Begin {
    /// First request with this key: now marked in flight; call `complete` or `abandon`.
    New,
    /// The key was used with the same body: here is its charge.
    Replay(Charge),
    /// The first request with this key is still being processed.
    InFlight,
    /// The key was used with another body.
    Mismatch,
}

/// The first 16 bytes of a SHA-256: what the ledger keeps of a gateway key (about 100
/// bytes) and of a charge body. A sandbox behind a long benchmark holds hundreds of
/// thousands of charges: every byte per charge counts.
type Digest16 = [u8; 16];

fn digest16(bytes: &[u8]) -> Digest16 {
    let full = Sha256::digest(bytes);
    let mut short = [0; 16];
    short.copy_from_slice(&full[..16]);
    short
}

enum KeyEntry {
    InFlight { body_hash: Digest16 },
    Done { body_hash: Digest16, charge: u32 },
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

impl StoredCharge {
    fn charge(&self, index: usize) -> Charge {
        Charge {
            id: format!("ch_{:06}{:010x}", index + 1, self.suffix),
            status: self.status,
            amount: self.amount,
            currency: self.currency.to_string(),
            reference: self.reference.to_string(),
            decline_code: (self.status == ChargeStatus::Declined).then(|| DECLINE_CODE.into()),
        }
    }
}

/// The index of the charge `id` names, if it names one of `charges`.
fn index_of(charges: &[StoredCharge], id: &str) -> Option<usize> {
    let rest = id.strip_prefix("ch_")?;
    let split = rest.len().checked_sub(10)?;
    let (number, suffix) = (rest.get(..split)?, rest.get(split..)?);
    let index = number.parse::<usize>().ok()?.checked_sub(1)?;
    let suffix = u64::from_str_radix(suffix, 16).ok()?;
    (charges.get(index)?.suffix == suffix && number.len() >= 6).then_some(index)
}

/// The charges made for one reference: nearly always one.
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

struct State {
    rng: StdRng,
    keys: HashMap<Digest16, KeyEntry>,
    charges: Vec<StoredCharge>,
    /// Charge indexes by a hash of their reference (two references may share a hash:
    /// readers compare the reference itself).
    by_reference: HashMap<u64, Refs>,
}

pub struct SandboxCore {
    outcomes: Outcomes,
    state: Mutex<State>,
    /// Where changes are reported, in the order they happen (sent under the lock).
    changes: Option<UnboundedSender<ChargeChange>>,
}

fn body_hash(body: &ChargeBody) -> Digest16 {
    let value = serde_json::to_value(body).unwrap_or_default();
    let canonical = serde_json_canonicalizer::to_vec(&value).unwrap_or_default();
    digest16(&canonical)
}

impl SandboxCore {
    pub fn new(outcomes: Outcomes) -> Self {
        Self::build(outcomes, None)
    }

    /// A core that reports every change of a charge on `changes`.
    pub fn reporting(outcomes: Outcomes, changes: UnboundedSender<ChargeChange>) -> Self {
        Self::build(outcomes, Some(changes))
    }

    fn build(outcomes: Outcomes, changes: Option<UnboundedSender<ChargeChange>>) -> Self {
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

    pub fn begin(&self, key: &str, body: &ChargeBody) -> Begin {
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

    /// Forgets an in-flight key whose request failed before charging (a 503).
    pub fn abandon(&self, key: &str) {
        let key = digest16(key.as_bytes());
        let mut state = self.lock();
        if matches!(state.keys.get(&key), Some(KeyEntry::InFlight { .. })) {
            state.keys.remove(&key);
        }
    }

    /// Makes the charge for a key that `begin` answered `New` for.
    pub fn complete(&self, key: &str, body: &ChargeBody) -> Charge {
        let (key, hash) = (digest16(key.as_bytes()), body_hash(body));
        let mut state = self.lock();
        let state = &mut *state;
        let index = state.charges.len();
        let number = u32::try_from(index).unwrap_or(u32::MAX);
        let suffix: u64 = state.rng.random::<u64>() & 0xff_ffff_ffff;
        let roll: f64 = state.rng.random();
        let decline: f64 = state.rng.random();
        let final_status = if decline < self.outcomes.decline_rate {
            ChargeStatus::Declined
        } else {
            ChargeStatus::Succeeded
        };
        let (status, settles) = if roll < self.outcomes.pending_rate {
            let at = Instant::now() + self.outcomes.pending_for;
            (ChargeStatus::Pending, Some((at, final_status)))
        } else {
            (final_status, None)
        };
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
            ChargeChange {
                charge: charge.clone(),
                sequence: 1,
            },
        );
        state
            .by_reference
            .entry(reference_hash(&body.reference))
            .and_modify(|refs| match refs {
                Refs::One(one) => *refs = Refs::Many(vec![*one, number]),
                Refs::Many(many) => many.push(number),
            })
            .or_insert(Refs::One(number));
        state.keys.insert(
            key,
            KeyEntry::Done {
                body_hash: hash,
                charge: number,
            },
        );
        charge
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

    /// Settles one pending charge if its time has come; the charge as it stands.
    pub fn settle_due(&self, charge_id: &str) -> Option<Charge> {
        let mut state = self.lock();
        let index = index_of(&state.charges, charge_id)?;
        let stored = state.charges.get_mut(index)?;
        Some(settle(stored, index, &self.changes))
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

fn report(changes: &Option<UnboundedSender<ChargeChange>>, change: ChargeChange) {
    if let Some(changes) = changes {
        // Nobody listening any more (shutting down) is not an error.
        let _ = changes.send(change);
    }
}

/// The charge at `index` as it stands, settled first if it was pending and its time has
/// come (a change, reported).
fn settle(
    stored: &mut StoredCharge,
    index: usize,
    changes: &Option<UnboundedSender<ChargeChange>>,
) -> Charge {
    if let Some((at, status)) = stored.settles
        && Instant::now() >= at
    {
        stored.status = status;
        stored.settles = None;
        stored.sequence += 1;
        report(
            changes,
            ChargeChange {
                charge: stored.charge(index),
                sequence: u64::from(stored.sequence),
            },
        );
    }
    stored.charge(index)
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

#[async_trait]
impl Gateway for SandboxGateway {
    async fn charge(&self, req: &ChargeRequest) -> Result<Charge, GatewayError> {
        let body = ChargeBody::from(req);
        match self.core.begin(&req.gateway_key, &body) {
            Begin::New => Ok(self.core.complete(&req.gateway_key, &body)),
            Begin::Replay(charge) => Ok(charge),
            Begin::InFlight => Err(GatewayError::Unknown(
                "sandbox: a request with this key is in flight".into(),
            )),
            // What the standalone sandbox answers 422 for, read the way every adapter's
            // answers are read.
            Begin::Mismatch => Err(super::classify::refusal(
                "the sandbox",
                reqwest::StatusCode::UNPROCESSABLE_ENTITY,
                super::classify::KeySaid::UsedWithAnotherRequest,
                "this key was used with another body",
            )),
        }
    }

    async fn lookup(&self, reference: Uuid) -> Result<Vec<Charge>, GatewayError> {
        Ok(self.core.charges_for(&reference.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let core = SandboxCore::reporting(
            Outcomes {
                pending_rate: 1.0,
                pending_for: Duration::from_millis(20),
                ..Outcomes::default()
            },
            tx,
        );
        let body = ChargeBody::from(&request("k", 10));
        assert!(matches!(core.begin("k", &body), Begin::New));
        let charge = core.complete("k", &body);
        assert!(matches!(core.begin("k", &body), Begin::Replay(_)));
        let made = rx.try_recv().expect("reported");
        assert_eq!(
            (made.sequence, made.charge.status),
            (1, ChargeStatus::Pending)
        );
        assert!(rx.try_recv().is_err(), "a replay is not a change");

        tokio::time::sleep(Duration::from_millis(30)).await;
        let settled = core.settle_due(&charge.id).expect("known");
        assert_eq!(settled.status, ChargeStatus::Succeeded);
        let change = rx.try_recv().expect("reported");
        assert_eq!((change.sequence, change.charge), (2, settled));
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
        let sandbox = SandboxGateway::new(Outcomes {
            pending_rate: 1.0,
            pending_for: Duration::from_millis(30),
            ..Outcomes::default()
        });
        let charge = sandbox.charge(&request("k", 10)).await.expect("accepted");
        assert_eq!(charge.status, ChargeStatus::Pending);
        tokio::time::sleep(Duration::from_millis(40)).await;
        let found = sandbox.lookup(Uuid::nil()).await.expect("lookup");
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].status, ChargeStatus::Succeeded);
    }
}
