//! What pagos derives from a client's key: the payment's id (which is also the reference
//! sent to the gateway) and the gateway key. Pure: no I/O, no clock, no randomness.
//!
//! Two rules pull on this derivation (docs/architecture.md, "The gateway key"):
//! - **A new payment gets a key no gateway remembers.** After the reaper purges a client
//!   key, the same key string makes a new payment; a gateway that still remembered the old
//!   gateway key would answer it with the old charge. So the key's *generation* — how many
//!   earlier payments of this merchant used this client key, as pagos remembers them — is
//!   part of the derivation.
//! - **A payment the database forgot gets its original key and request.** If a failover
//!   to a lagging replica, or a restore from a backup, loses a payment after its charge
//!   reached the gateway, the client's retry must reach the gateway with the very same
//!   key *and the very same request*, so that the gateway replays the charge instead of
//!   refusing or charging again. So nothing random or stored goes into it: a database
//!   that lost the payment derives the same generation it derived the first time, and
//!   with it the same id (the reference the gateway sees) and the same gateway key.

use super::key::IdempotencyKey;
use sha2::{Digest, Sha256};
use uuid::Uuid;

/// The namespace of payment ids (UUIDv5). Fixed forever: changing it would give a
/// payment the database forgot another reference than the one its charge carries.
const PAYMENT_NAMESPACE: Uuid = Uuid::from_u128(0xd6ce_96a3_68f7_4221_9143_8997_0c1e_985d);

/// What one (merchant, client key, generation) names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Derived {
    /// The payment's id, and the `reference` every send of it carries.
    pub payment_id: Uuid,
    /// The key sent to the gateway on every send of this payment.
    pub gateway_key: String,
}

/// The id and gateway key of the payment that `merchant` makes with client key `key`, the
/// `generation`-th time pagos sees that key (0 the first time).
///
/// - Deterministic: the same inputs, the same payment id and gateway key.
/// - Injective: two merchants using one client key never share a gateway key (the merchant
///   id is in it literally); two generations of one key never do (the generation is a
///   suffix after a fixed-length digest).
/// - Generation 0 gives the gateway key pagos has always derived,
///   `pagos-<merchant>-<sha256(key)>` (103 characters), so a payment made before
///   generations existed keeps meeting its own charge. At most 115 characters.
pub fn derive(merchant: Uuid, key: &IdempotencyKey, generation: u32) -> Derived {
    let digest = Sha256::digest(key.as_str().as_bytes());
    let mut name = Vec::with_capacity(16 + 32 + 4);
    name.extend_from_slice(merchant.as_bytes());
    name.extend_from_slice(&digest);
    name.extend_from_slice(&generation.to_be_bytes());
    let base = format!("pagos-{}-{}", merchant.simple(), hex::encode(digest));
    Derived {
        payment_id: Uuid::new_v5(&PAYMENT_NAMESPACE, &name),
        gateway_key: if generation == 0 {
            base
        } else {
            format!("{base}-{generation}")
        },
    }
}

/// The namespace of refund ids (UUIDv5). Fixed forever, like the payments'.
const REFUND_NAMESPACE: Uuid = Uuid::from_u128(0x5f0c_2a71_93e4_4b8d_a1c6_0d2e_7b39_c4f8);

/// What one refund's key names: the refund's id (also its `reference`) and its gateway key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DerivedRefund {
    pub refund_id: Uuid,
    pub gateway_key: String,
}

/// The id and gateway key of the refund of `payment` that `merchant` asks for with `key`
/// in key space `scope` (`merchant`, `admin`, `orphan`), derived the way a payment's are,
/// and for the same reason: a refund the database forgot (a restore, a failover) reaches
/// the gateway again with the very same key and reference, so the gateway replays it
/// instead of refunding twice. Refund keys are never purged (the key lives on the refund's
/// row), so no generation is needed.
///
/// - Unique to the refund: never a payment's key (`pagos-refund-…` against `pagos-…`);
///   the scope, the merchant, the key and the payment all go in.
/// - At most 13 + 32 + 1 + 64 + 1 + 8 = 119 characters.
pub fn derive_refund(merchant: Uuid, scope: &str, key: &str, payment: Uuid) -> DerivedRefund {
    let mut hasher = Sha256::new();
    // Length-prefixed parts: no two inputs hash the same bytes.
    for part in [scope.as_bytes(), key.as_bytes(), payment.as_bytes()] {
        hasher.update((part.len() as u64).to_be_bytes());
        hasher.update(part);
    }
    let digest = hasher.finalize();
    let mut name = Vec::with_capacity(16 + 32);
    name.extend_from_slice(merchant.as_bytes());
    name.extend_from_slice(&digest);
    let scope_tag: String = scope
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(8)
        .collect();
    DerivedRefund {
        refund_id: Uuid::new_v5(&REFUND_NAMESPACE, &name),
        gateway_key: format!(
            "pagos-refund-{}-{}-{scope_tag}",
            merchant.simple(),
            hex::encode(digest)
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(s: &str) -> IdempotencyKey {
        IdempotencyKey::parse(s.as_bytes()).expect("valid key")
    }

    #[test]
    fn the_same_key_and_generation_derive_the_same_payment_every_time() {
        let merchant = Uuid::now_v7();
        let long = "k".repeat(255);
        assert_eq!(
            derive(merchant, &key(&long), 3),
            derive(merchant, &key(&long), 3)
        );
        assert!(derive(merchant, &key(&long), u32::MAX).gateway_key.len() <= 255);
    }

    #[test]
    fn merchants_keys_and_generations_never_share_a_payment_or_a_gateway_key() {
        let (a, b) = (Uuid::now_v7(), Uuid::now_v7());
        let all = [
            derive(a, &key("same"), 0),
            derive(b, &key("same"), 0),
            derive(a, &key("other"), 0),
            derive(a, &key("same"), 1),
            derive(a, &key("same"), 10),
            derive(b, &key("same"), 1),
        ];
        for (i, x) in all.iter().enumerate() {
            for y in &all[i + 1..] {
                assert_ne!(x.payment_id, y.payment_id);
                assert_ne!(x.gateway_key, y.gateway_key);
            }
        }
    }

    #[test]
    fn a_refund_key_is_deterministic_unique_and_never_a_payments() {
        let (a, b) = (Uuid::now_v7(), Uuid::now_v7());
        let (p, q) = (Uuid::now_v7(), Uuid::now_v7());
        assert_eq!(
            derive_refund(a, "merchant", "k", p),
            derive_refund(a, "merchant", "k", p)
        );
        let all = [
            derive_refund(a, "merchant", "k", p),
            derive_refund(b, "merchant", "k", p),
            derive_refund(a, "admin", "k", p),
            derive_refund(a, "merchant", "k2", p),
            derive_refund(a, "merchant", "k", q),
        ];
        for (i, x) in all.iter().enumerate() {
            for y in &all[i + 1..] {
                assert_ne!(x.refund_id, y.refund_id);
                assert_ne!(x.gateway_key, y.gateway_key);
            }
        }
        let payment = derive(a, &key("k"), 0);
        assert_ne!(all[0].gateway_key, payment.gateway_key);
        assert_ne!(all[0].refund_id, payment.payment_id);
        assert!(all[0].gateway_key.len() <= 255);
    }

    #[test]
    fn generation_zero_is_the_gateway_key_pagos_always_derived() {
        let merchant = Uuid::parse_str("01a236bf-3ba3-730c-b454-685f40f9d62b").expect("uuid");
        let derived = derive(merchant, &key("6f1b2c9e-4c1a-4b7e-9d1e-0a6c2f6a1b10"), 0);
        let digest = hex::encode(Sha256::digest(b"6f1b2c9e-4c1a-4b7e-9d1e-0a6c2f6a1b10"));
        assert_eq!(
            derived.gateway_key,
            format!("pagos-01a236bf3ba3730cb454685f40f9d62b-{digest}")
        );
        assert_eq!(derived.gateway_key.len(), 103);
        assert_eq!(derived.payment_id.get_version_num(), 5);
    }
}
