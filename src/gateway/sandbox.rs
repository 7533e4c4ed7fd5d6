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

enum KeyEntry {
    InFlight {
        body_hash: [u8; 32],
    },
    Done {
        body_hash: [u8; 32],
        charge_id: String,
    },
}

struct StoredCharge {
    charge: Charge,
    /// For a pending charge: when it settles, and how.
    settles: Option<(Instant, ChargeStatus, Option<String>)>,
    /// 1 when made, bumped by each change after.
    sequence: u64,
}

/// A charge as it stands after a change, with the charge's sequence number.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChargeChange {
    pub charge: Charge,
    pub sequence: u64,
}

struct State {
    rng: StdRng,
    keys: HashMap<String, KeyEntry>,
    charges: HashMap<String, StoredCharge>,
    by_reference: HashMap<String, Vec<String>>,
    next_id: u64,
}

pub struct SandboxCore {
    outcomes: Outcomes,
    state: Mutex<State>,
    /// Where changes are reported, in the order they happen (sent under the lock).
    changes: Option<UnboundedSender<ChargeChange>>,
}

fn body_hash(body: &ChargeBody) -> [u8; 32] {
    let value = serde_json::to_value(body).unwrap_or_default();
    let canonical = serde_json_canonicalizer::to_vec(&value).unwrap_or_default();
    Sha256::digest(canonical).into()
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
                charges: HashMap::new(),
                by_reference: HashMap::new(),
                next_id: 1,
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
        let mut state = self.lock();
        let state = &mut *state;
        match state.keys.get(key) {
            None => {
                state
                    .keys
                    .insert(key.to_owned(), KeyEntry::InFlight { body_hash: hash });
                Begin::New
            }
            Some(KeyEntry::InFlight { body_hash }) if *body_hash == hash => Begin::InFlight,
            Some(KeyEntry::Done {
                body_hash,
                charge_id,
            }) if *body_hash == hash => {
                let stored = state.charges.get_mut(charge_id);
                match stored {
                    Some(stored) => Begin::Replay(settle(stored, &self.changes).clone()),
                    None => Begin::InFlight,
                }
            }
            Some(_) => Begin::Mismatch,
        }
    }

    /// Forgets an in-flight key whose request failed before charging (a 503).
    pub fn abandon(&self, key: &str) {
        let mut state = self.lock();
        if matches!(state.keys.get(key), Some(KeyEntry::InFlight { .. })) {
            state.keys.remove(key);
        }
    }

    /// Makes the charge for a key that `begin` answered `New` for.
    pub fn complete(&self, key: &str, body: &ChargeBody) -> Charge {
        let mut state = self.lock();
        let state = &mut *state;
        let id = format!(
            "ch_{:06}{}",
            state.next_id,
            &Uuid::new_v4().simple().to_string()[..10]
        );
        state.next_id += 1;
        let roll: f64 = state.rng.random();
        let decline: f64 = state.rng.random();
        let final_status = if decline < self.outcomes.decline_rate {
            ChargeStatus::Declined
        } else {
            ChargeStatus::Succeeded
        };
        let final_code =
            (final_status == ChargeStatus::Declined).then(|| "card_declined".to_owned());
        let (status, decline_code, settles) = if roll < self.outcomes.pending_rate {
            let at = Instant::now() + self.outcomes.pending_for;
            (
                ChargeStatus::Pending,
                None,
                Some((at, final_status, final_code)),
            )
        } else {
            (final_status, final_code, None)
        };
        let charge = Charge {
            id: id.clone(),
            status,
            amount: body.amount,
            currency: body.currency.clone(),
            reference: body.reference.clone(),
            decline_code,
        };
        state.charges.insert(
            id.clone(),
            StoredCharge {
                charge: charge.clone(),
                settles,
                sequence: 1,
            },
        );
        report(
            &self.changes,
            ChargeChange {
                charge: charge.clone(),
                sequence: 1,
            },
        );
        state
            .by_reference
            .entry(body.reference.clone())
            .or_default()
            .push(id.clone());
        state.keys.insert(
            key.to_owned(),
            KeyEntry::Done {
                body_hash: body_hash(body),
                charge_id: id,
            },
        );
        charge
    }

    /// Every charge for a reference, pending ones settled if their time has come.
    pub fn charges_for(&self, reference: &str) -> Vec<Charge> {
        let mut state = self.lock();
        let state = &mut *state;
        let ids = state
            .by_reference
            .get(reference)
            .cloned()
            .unwrap_or_default();
        ids.iter()
            .filter_map(|id| {
                state
                    .charges
                    .get_mut(id)
                    .map(|c| settle(c, &self.changes).clone())
            })
            .collect()
    }

    /// Settles one pending charge if its time has come; the charge as it stands.
    pub fn settle_due(&self, charge_id: &str) -> Option<Charge> {
        let mut state = self.lock();
        state
            .charges
            .get_mut(charge_id)
            .map(|c| settle(c, &self.changes).clone())
    }

    /// (charges made, references charged more than once).
    pub fn totals(&self) -> (usize, usize) {
        let state = self.lock();
        let duplicated = state
            .by_reference
            .values()
            .filter(|ids| ids.len() > 1)
            .count();
        (state.charges.len(), duplicated)
    }

    /// Every charge made, settled where due: for the standalone server's counts.
    pub fn all_charges(&self) -> Vec<Charge> {
        let mut state = self.lock();
        state
            .charges
            .values_mut()
            .map(|c| settle(c, &self.changes).clone())
            .collect()
    }
}

fn report(changes: &Option<UnboundedSender<ChargeChange>>, change: ChargeChange) {
    if let Some(changes) = changes {
        // Nobody listening any more (shutting down) is not an error.
        let _ = changes.send(change);
    }
}

fn settle<'a>(
    stored: &'a mut StoredCharge,
    changes: &Option<UnboundedSender<ChargeChange>>,
) -> &'a Charge {
    if let Some((at, status, code)) = &stored.settles
        && Instant::now() >= *at
    {
        stored.charge.status = *status;
        stored.charge.decline_code = code.clone();
        stored.settles = None;
        stored.sequence += 1;
        report(
            changes,
            ChargeChange {
                charge: stored.charge.clone(),
                sequence: stored.sequence,
            },
        );
    }
    &stored.charge
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
            Begin::Mismatch => Err(GatewayError::Rejected {
                status: 422,
                detail: "sandbox: this key was used with another body".into(),
            }),
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
    async fn one_key_with_another_body_is_refused() {
        let sandbox = SandboxGateway::new(Outcomes::default());
        sandbox.charge(&request("k", 10)).await.expect("charged");
        let err = sandbox
            .charge(&request("k", 11))
            .await
            .expect_err("refused");
        assert!(matches!(err, GatewayError::Rejected { status: 422, .. }));
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
