//! The merchant's side of a delivery: verify it (signature with any secret it holds during
//! a rotation, timestamp within the tolerance) and apply each event once — dedupe by
//! `webhook-id` in the same step as the effect, and ignore an event whose `secuencia` is
//! at or below the last one applied for its payment or refund (at-least-once delivery
//! brings duplicates, and retries bring old events late).
//!
//! Library code for merchants, kept free of anything of the server (no database, no
//! axum, nothing else of pagos): only the Standard Webhooks reference verifier, `http`'s
//! header types and serde. It is written to move as it is to the merchant-facing client
//! crate. `Inbox` is the in-memory example; a merchant with a database does the same in one
//! transaction (see `Inbox::apply_once`).

use http::HeaderMap;
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

/// How far a delivery's `webhook-timestamp` may be from now, either way: the
/// specification's five minutes, as the reference verifier applies it.
pub const TOLERANCE: Duration = Duration::from_secs(5 * 60);

/// More secrets than this is not a rotation.
const MAX_SECRETS: usize = 4;

/// Why a delivery is refused. Answer it with `status()`: pagos tries again later.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    #[error("the webhook secret is not whsec_ followed by base64")]
    Secret,
    #[error("the {0} header is missing")]
    MissingHeader(&'static str),
    #[error("the {0} header is malformed")]
    MalformedHeader(&'static str),
    #[error("the webhook-timestamp is more than 5 minutes away from now")]
    OutsideTolerance,
    #[error("no signature matches this body with the secrets held")]
    Signature,
    #[error("the body is not an event: {0}")]
    NotAnEvent(String),
    #[error("the event's id is not the webhook-id it was signed with")]
    IdMismatch,
}

impl VerifyError {
    /// The HTTP status to answer a refused delivery with.
    pub fn status(&self) -> u16 {
        match self {
            VerifyError::Secret => 500,
            VerifyError::OutsideTolerance | VerifyError::Signature => 401,
            _ => 400,
        }
    }
}

/// An event as pagos delivers it (contract section 7).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub id: String,
    /// `pago.completado`, `reembolso.fallido`, …
    pub tipo: String,
    /// RFC 3339.
    #[serde(rename = "creadoEn")]
    pub creado_en: String,
    /// Increases per payment (or refund): an event at or below the last applied is old.
    pub secuencia: u64,
    /// The payment's or refund's representation.
    pub datos: serde_json::Value,
}

impl Event {
    /// What `secuencia` counts in: the kind (`pago`, `reembolso`) and the object's id.
    pub fn subject(&self) -> String {
        let kind = self.tipo.split('.').next().unwrap_or_default();
        let id = self
            .datos
            .get("id")
            .and_then(serde_json::Value::as_str)
            .unwrap_or_default();
        format!("{kind}:{id}")
    }
}

/// Checks deliveries against the endpoint's secret, and during a rotation against the
/// others it holds too: pagos signs with every secret replaced in the last 24 h (up to
/// three signatures), and any one verifying is enough.
pub struct Verifier {
    secrets: Vec<standardwebhooks::Webhook>,
}

impl std::fmt::Debug for Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Verifier({} secrets, [REDACTED])", self.secrets.len())
    }
}

fn webhook(secret: &str) -> Result<standardwebhooks::Webhook, VerifyError> {
    if !secret.starts_with("whsec_") {
        return Err(VerifyError::Secret);
    }
    standardwebhooks::Webhook::new(secret).map_err(|_| VerifyError::Secret)
}

impl Verifier {
    pub fn new(secret: &str) -> Result<Verifier, VerifyError> {
        Ok(Verifier {
            secrets: vec![webhook(secret)?],
        })
    }

    /// Also accepts deliveries signed with `secret` (an older one of a rotation).
    pub fn also(mut self, secret: &str) -> Result<Verifier, VerifyError> {
        if self.secrets.len() >= MAX_SECRETS {
            return Err(VerifyError::Secret);
        }
        self.secrets.push(webhook(secret)?);
        Ok(self)
    }

    /// Verifies a delivery's headers and raw body (the bytes as received, before any
    /// parsing) and reads its event. The reference verifier checks the timestamp against
    /// the clock (`TOLERANCE`) and compares signatures in constant time.
    pub fn verify(&self, headers: &HeaderMap, body: &[u8]) -> Result<Event, VerifyError> {
        let mut first_error = None;
        let verified = self
            .secrets
            .iter()
            .any(|secret| match secret.verify(body, headers) {
                Ok(()) => true,
                Err(e) => {
                    first_error.get_or_insert(e);
                    false
                }
            });
        if !verified {
            return Err(first_error.map_or(VerifyError::Signature, from_reference));
        }
        let event: Event =
            serde_json::from_slice(body).map_err(|e| VerifyError::NotAnEvent(e.to_string()))?;
        let signed_id = headers
            .get(standardwebhooks::HEADER_WEBHOOK_ID)
            .and_then(|v| v.to_str().ok());
        if signed_id != Some(event.id.as_str()) {
            return Err(VerifyError::IdMismatch);
        }
        Ok(event)
    }
}

fn from_reference(e: standardwebhooks::WebhookError) -> VerifyError {
    use standardwebhooks::WebhookError as W;
    match e {
        W::InvalidSecret(_) => VerifyError::Secret,
        W::MissingHeader(name) => VerifyError::MissingHeader(header_name(name)),
        W::InvalidHeader(name) => VerifyError::MalformedHeader(header_name(name)),
        W::InvalidTimestamp => VerifyError::MalformedHeader("webhook-timestamp"),
        W::TimestampTooOldError | W::FutureTimestampError => VerifyError::OutsideTolerance,
        W::InvalidSignature => VerifyError::Signature,
        W::InvalidPayload => VerifyError::NotAnEvent("not UTF-8".into()),
    }
}

fn header_name(short: &str) -> &'static str {
    match short {
        "id" => "webhook-id",
        "timestamp" => "webhook-timestamp",
        _ => "webhook-signature",
    }
}

/// What to do with a verified event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    Apply,
    /// Its `webhook-id` was applied (or judged stale) before: a redelivery.
    Duplicate,
    /// A later event of the same payment or refund was applied already.
    Stale {
        last: u64,
    },
}

impl Decision {
    /// Every decision is answered 200: a duplicate or an old event is handled, and must
    /// not be delivered again.
    pub fn status(&self) -> u16 {
        200
    }
}

/// The apply-once rule, pure: the seed's first strategy (dedupe by id) and its third
/// (ignore a sequence at or below the one applied).
pub fn decide(seen_before: bool, last_applied: Option<u64>, secuencia: u64) -> Decision {
    if seen_before {
        return Decision::Duplicate;
    }
    match last_applied {
        Some(last) if secuencia <= last => Decision::Stale { last },
        _ => Decision::Apply,
    }
}

/// The example consumer's memory of what it applied.
#[derive(Debug, Default)]
pub struct Inbox {
    ledger: Mutex<Ledger>,
}

#[derive(Debug, Default)]
struct Ledger {
    processed: HashSet<String>,
    last: HashMap<String, u64>,
}

impl Inbox {
    pub fn new() -> Inbox {
        Inbox::default()
    }

    /// Applies `event` with `effect` once: the check, the effect and the record of the id
    /// are one step (here under one lock; with a database, one transaction that inserts
    /// the id into a table keyed by it — a conflict means "already applied" — reads the
    /// subject's last `secuencia` for update, applies the effect and stores the new
    /// `secuencia`). An effect that fails records nothing, so the redelivery applies it.
    pub fn apply_once<E>(
        &self,
        event: &Event,
        effect: impl FnOnce(&Event) -> Result<(), E>,
    ) -> Result<Decision, E> {
        let mut ledger = self.ledger.lock().unwrap_or_else(PoisonError::into_inner);
        let subject = event.subject();
        let decision = decide(
            ledger.processed.contains(&event.id),
            ledger.last.get(&subject).copied(),
            event.secuencia,
        );
        if decision == Decision::Apply {
            effect(event)?;
            ledger.last.insert(subject, event.secuencia);
        }
        ledger.processed.insert(event.id.clone());
        Ok(decision)
    }

    /// How many distinct events were applied or judged stale.
    pub fn processed(&self) -> usize {
        self.ledger
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .processed
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::delivery::signing::{Keys, Secret, sign};
    use serde_json::json;

    fn now() -> i64 {
        chrono::Utc::now().timestamp()
    }

    fn event(id: &str, payment: &str, secuencia: u64) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "id": id,
            "tipo": "pago.completado",
            "creadoEn": "2026-03-01T12:00:00Z",
            "secuencia": secuencia,
            "datos": {"id": payment, "estado": "COMPLETADA"},
        }))
        .expect("json")
    }

    fn delivery(id: &str, body: &[u8], at: i64, keys: &Keys) -> HeaderMap {
        let signed = sign(id, at, body, keys).expect("signed");
        let mut headers = HeaderMap::new();
        for (name, value) in signed.pairs() {
            headers.insert(name, value.parse().expect("header"));
        }
        headers
    }

    #[test]
    fn a_delivery_signed_by_pagos_is_verified_and_read() {
        let secret = Secret::generate();
        let body = event("evt_1", "pay_1", 1);
        let headers = delivery("evt_1", &body, now(), &Keys::new(secret.clone()));
        let event = Verifier::new(secret.expose())
            .expect("verifier")
            .verify(&headers, &body)
            .expect("verified");
        assert_eq!(event.id, "evt_1");
        assert_eq!(event.tipo, "pago.completado");
        assert_eq!(event.subject(), "pago:pay_1");
    }

    #[test]
    fn during_a_rotation_a_consumer_holding_either_secret_accepts_and_after_it_only_the_new() {
        let (old, new) = (Secret::generate(), Secret::generate());
        let body = event("evt_2", "pay_2", 1);
        let rotating = delivery(
            "evt_2",
            &body,
            now(),
            &Keys::rotating(new.clone(), old.clone()),
        );
        for held in [&old, &new] {
            Verifier::new(held.expose())
                .expect("verifier")
                .verify(&rotating, &body)
                .expect("either secret verifies during the rotation");
        }
        let after = delivery("evt_2", &body, now(), &Keys::new(new.clone()));
        assert_eq!(
            Verifier::new(old.expose())
                .expect("verifier")
                .verify(&after, &body),
            Err(VerifyError::Signature)
        );
        let both = Verifier::new(old.expose())
            .and_then(|v| v.also(new.expose()))
            .expect("verifier");
        both.verify(&after, &body)
            .expect("a consumer that holds both accepts the new signature");
        let stranger = delivery("evt_2", &body, now(), &Keys::new(Secret::generate()));
        assert_eq!(both.verify(&stranger, &body), Err(VerifyError::Signature));
    }

    #[test]
    fn a_delivery_outside_the_five_minute_tolerance_is_refused_either_way() {
        let secret = Secret::generate();
        let keys = Keys::new(secret.clone());
        let verifier = Verifier::new(secret.expose()).expect("verifier");
        let body = event("evt_3", "pay_3", 1);
        for (offset, accepted) in [(-400, false), (-240, true), (240, true), (400, false)] {
            let headers = delivery("evt_3", &body, now() + offset, &keys);
            let result = verifier.verify(&headers, &body);
            if accepted {
                assert!(result.is_ok(), "{offset}: {result:?}");
            } else {
                assert_eq!(result, Err(VerifyError::OutsideTolerance), "{offset}");
            }
        }
    }

    #[test]
    fn a_tampered_body_a_swapped_id_or_a_missing_header_is_refused() {
        let secret = Secret::generate();
        let keys = Keys::new(secret.clone());
        let verifier = Verifier::new(secret.expose()).expect("verifier");
        let body = event("evt_4", "pay_4", 1);
        let headers = delivery("evt_4", &body, now(), &keys);

        let tampered = event("evt_4", "pay_4", 2);
        assert_eq!(
            verifier.verify(&headers, &tampered),
            Err(VerifyError::Signature)
        );

        // Signed honestly under another id: the body's id must be the signed one.
        let other_id = delivery("evt_other", &body, now(), &keys);
        assert_eq!(
            verifier.verify(&other_id, &body),
            Err(VerifyError::IdMismatch)
        );

        for name in ["webhook-id", "webhook-timestamp", "webhook-signature"] {
            let mut missing = headers.clone();
            missing.remove(name);
            assert_eq!(
                verifier.verify(&missing, &body),
                Err(VerifyError::MissingHeader(name))
            );
        }
        assert_eq!(
            Verifier::new("not-a-secret").err(),
            Some(VerifyError::Secret)
        );
        let not_event = b"{\"hello\":1}";
        let signed = delivery("evt_5", not_event, now(), &keys);
        assert!(matches!(
            verifier.verify(&signed, not_event),
            Err(VerifyError::NotAnEvent(_))
        ));
    }

    fn read(body: &[u8]) -> Event {
        serde_json::from_slice(body).expect("an event")
    }

    #[test]
    fn each_webhook_id_is_applied_once_however_often_it_arrives() {
        let inbox = Inbox::new();
        let mut applied = Vec::new();
        let e = read(&event("evt_6", "pay_6", 1));
        for _ in 0..3 {
            let decision = inbox
                .apply_once(&e, |e| {
                    applied.push(e.id.clone());
                    Ok::<_, ()>(())
                })
                .expect("applied");
            assert!(decision == Decision::Apply || decision == Decision::Duplicate);
        }
        assert_eq!(applied, ["evt_6"]);
        assert_eq!(inbox.processed(), 1);
    }

    #[test]
    fn an_older_event_of_a_payment_arriving_late_is_ignored() {
        let inbox = Inbox::new();
        let mut applied = Vec::new();
        let mut apply = |body: Vec<u8>| {
            inbox
                .apply_once(&read(&body), |e| {
                    applied.push(e.secuencia);
                    Ok::<_, ()>(())
                })
                .expect("handled")
        };
        assert_eq!(apply(event("evt_b", "pay_7", 2)), Decision::Apply);
        assert_eq!(
            apply(event("evt_a", "pay_7", 1)),
            Decision::Stale { last: 2 }
        );
        assert_eq!(
            apply(event("evt_c", "pay_7", 2)),
            Decision::Stale { last: 2 }
        );
        assert_eq!(apply(event("evt_d", "pay_other", 1)), Decision::Apply);
        assert_eq!(apply(event("evt_e", "pay_7", 3)), Decision::Apply);
        assert_eq!(apply(event("evt_a", "pay_7", 1)), Decision::Duplicate);
        assert_eq!(applied, [2, 1, 3]);
    }

    #[test]
    fn an_effect_that_fails_records_nothing_so_the_redelivery_applies_it() {
        let inbox = Inbox::new();
        let e = read(&event("evt_8", "pay_8", 1));
        assert_eq!(
            inbox.apply_once(&e, |_| Err("database down")),
            Err("database down")
        );
        assert_eq!(inbox.processed(), 0);
        assert_eq!(
            inbox.apply_once(&e, |_| Ok::<_, &str>(())),
            Ok(Decision::Apply)
        );
    }

    #[test]
    fn the_decision_table_is_the_seeds_first_and_third_strategies() {
        assert_eq!(decide(true, None, 1), Decision::Duplicate);
        assert_eq!(decide(true, Some(0), 5), Decision::Duplicate);
        assert_eq!(decide(false, None, 1), Decision::Apply);
        assert_eq!(decide(false, Some(1), 2), Decision::Apply);
        assert_eq!(decide(false, Some(2), 2), Decision::Stale { last: 2 });
        assert_eq!(decide(false, Some(3), 2), Decision::Stale { last: 3 });
    }
}
