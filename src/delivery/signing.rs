//! The signature on every delivery, as the Standard Webhooks specification defines it:
//! `webhook-id` (the event id, the same on every attempt), `webhook-timestamp` (unix
//! seconds of this attempt) and `webhook-signature: v1,<base64 HMAC-SHA256(key,
//! "<id>.<timestamp>.<body>")>`, where `key` is the base64-decoded part of the secret
//! after `whsec_`. After a rotation the header carries one signature per secret still
//! signing (the current one, and each replaced less than 24 h ago: up to three), separated
//! by a space, so a receiver holding any of them accepts the delivery.
//!
//! The HMAC itself is the `standardwebhooks` crate's, the specification authors' own
//! implementation, so what pagos signs is by construction what their verifiers check.
//!
//! Pure: the timestamp is an argument. A secret is never logged or shown by `Debug`.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use rand::RngCore;
use secrecy::{ExposeSecret, SecretString};

pub const HEADER_ID: &str = standardwebhooks::HEADER_WEBHOOK_ID;
pub const HEADER_TIMESTAMP: &str = standardwebhooks::HEADER_WEBHOOK_TIMESTAMP;
pub const HEADER_SIGNATURE: &str = standardwebhooks::HEADER_WEBHOOK_SIGNATURE;

/// What every secret starts with.
pub const PREFIX: &str = "whsec_";

/// Random bytes of a generated secret: as long as HMAC-SHA256's output, the shortest key
/// RFC 2104 recommends (the specification asks for 24 to 64).
pub const GENERATED_BYTES: usize = 32;

/// The key lengths the specification allows.
const KEY_BYTES: std::ops::RangeInclusive<usize> = 24..=64;

/// More secrets than this at once is not a rotation.
const MAX_SECRETS: usize = 4;

/// An endpoint's signing secret, `whsec_` + the base64 of its key. Valid by construction.
#[derive(Clone)]
pub struct Secret(SecretString);

#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    #[error("a webhook secret starts with whsec_")]
    NoPrefix,
    #[error("a webhook secret is whsec_ followed by standard base64")]
    NotBase64,
    #[error("a webhook secret's key is 24 to 64 bytes")]
    Length,
}

impl Secret {
    /// A new secret: `whsec_` + base64 of 32 bytes from the operating system's generator
    /// (through `rand`'s thread generator, a CSPRNG seeded from it).
    pub fn generate() -> Secret {
        let mut key = [0u8; GENERATED_BYTES];
        rand::rng().fill_bytes(&mut key);
        let text = format!("{PREFIX}{}", STANDARD.encode(key));
        key.fill(0);
        Secret(SecretString::from(text))
    }

    /// A stored secret, read back.
    pub fn parse(text: &str) -> Result<Secret, SecretError> {
        let encoded = text.strip_prefix(PREFIX).ok_or(SecretError::NoPrefix)?;
        let mut key = STANDARD
            .decode(encoded)
            .map_err(|_| SecretError::NotBase64)?;
        let length_ok = KEY_BYTES.contains(&key.len());
        key.fill(0);
        if !length_ok {
            return Err(SecretError::Length);
        }
        Ok(Secret(SecretString::from(text)))
    }

    /// The secret as text: to store it, and to show it once to the merchant.
    pub fn expose(&self) -> &str {
        self.0.expose_secret()
    }

    fn signer(&self) -> Result<standardwebhooks::Webhook, SignError> {
        // Cannot fail: `parse` and `generate` only hold standard base64.
        standardwebhooks::Webhook::new(self.expose()).map_err(|_| SignError::Secret)
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(whsec_[REDACTED])")
    }
}

/// The secrets an endpoint signs with: its current one and, after rotations, each secret
/// they replaced that still signs (for 24 h after it was replaced; at most two). Never
/// empty.
#[derive(Clone, Debug)]
pub struct Keys {
    current: Secret,
    replaced: Vec<Secret>,
}

impl Keys {
    pub fn new(current: Secret) -> Keys {
        Keys {
            current,
            replaced: Vec::new(),
        }
    }

    /// During a rotation: both sign, so a receiver that still holds the old one, or
    /// already holds the new one, accepts every delivery.
    pub fn rotating(current: Secret, previous: Secret) -> Keys {
        Keys::new(current).also(previous)
    }

    /// Also signs with `replaced`, a secret a rotation replaced that still signs.
    pub fn also(mut self, replaced: Secret) -> Keys {
        self.replaced.push(replaced);
        self
    }

    fn all(&self) -> impl Iterator<Item = &Secret> {
        std::iter::once(&self.current).chain(&self.replaced)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SignError {
    #[error("an event body is JSON, so UTF-8; this one is not")]
    BodyNotUtf8,
    #[error("an event id is 1 to 255 visible ASCII characters without '.'")]
    BadId,
    #[error("the secret cannot be read")]
    Secret,
}

/// The three headers of one attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SignedHeaders {
    pub id: String,
    pub timestamp: i64,
    /// `v1,<base64>` per secret, newest first, separated by a space.
    pub signature: String,
}

impl SignedHeaders {
    /// As `(name, value)` pairs, ready for a request.
    pub fn pairs(&self) -> [(&'static str, String); 3] {
        [
            (HEADER_ID, self.id.clone()),
            (HEADER_TIMESTAMP, self.timestamp.to_string()),
            (HEADER_SIGNATURE, self.signature.clone()),
        ]
    }
}

/// Signs one attempt of the event `id` with body `body` at `timestamp` (unix seconds).
pub fn sign(
    id: &str,
    timestamp: i64,
    body: &[u8],
    keys: &Keys,
) -> Result<SignedHeaders, SignError> {
    // The signed content is "<id>.<timestamp>.<body>": an id with a '.' could be read
    // with another split, and a header value must be visible ASCII.
    let id_ok =
        !id.is_empty() && id.len() <= 255 && id.bytes().all(|b| b.is_ascii_graphic() && b != b'.');
    if !id_ok {
        return Err(SignError::BadId);
    }
    let mut signatures = Vec::with_capacity(MAX_SECRETS);
    for secret in keys.all().take(MAX_SECRETS) {
        let signature = secret
            .signer()?
            .sign(id, timestamp, body)
            .map_err(|e| match e {
                standardwebhooks::WebhookError::InvalidPayload => SignError::BodyNotUtf8,
                _ => SignError::Secret,
            })?;
        signatures.push(signature);
    }
    Ok(SignedHeaders {
        id: id.to_owned(),
        timestamp,
        signature: signatures.join(" "),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const VECTOR_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const VECTOR_ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
    const VECTOR_TIMESTAMP: i64 = 1_614_265_330;
    const VECTOR_BODY: &[u8] = br#"{"test": 2432232314}"#;
    const VECTOR_SIGNATURE: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

    fn secret(text: &str) -> Secret {
        Secret::parse(text).expect("a valid secret")
    }

    fn now() -> i64 {
        chrono::Utc::now().timestamp()
    }

    fn header_map(signed: &SignedHeaders) -> http::HeaderMap {
        let mut headers = http::HeaderMap::new();
        for (name, value) in signed.pairs() {
            headers.insert(name, value.parse().expect("a header value"));
        }
        headers
    }

    #[test]
    fn the_specifications_test_vector_gives_its_published_signature() {
        let signed = sign(
            VECTOR_ID,
            VECTOR_TIMESTAMP,
            VECTOR_BODY,
            &Keys::new(secret(VECTOR_SECRET)),
        )
        .expect("signed");
        assert_eq!(signed.signature, VECTOR_SIGNATURE);
        assert_eq!(signed.id, VECTOR_ID);
        assert_eq!(
            signed.pairs(),
            [
                ("webhook-id", VECTOR_ID.to_owned()),
                ("webhook-timestamp", "1614265330".to_owned()),
                ("webhook-signature", VECTOR_SIGNATURE.to_owned()),
            ]
        );
    }

    #[test]
    fn the_reference_implementation_verifies_what_pagos_signs() {
        let generated = Secret::generate();
        let body =
            br#"{"id":"evt_1","tipo":"pago.completado","secuencia":3,"datos":{"monto":1500}}"#;
        let signed = sign("evt_1", now(), body, &Keys::new(generated.clone())).expect("signed");
        let verifier = standardwebhooks::Webhook::new(generated.expose()).expect("secret");
        verifier
            .verify(body, &header_map(&signed))
            .expect("the reference verifier accepts it");

        let mut tampered = body.to_vec();
        tampered[body.len() - 3] = b'9';
        assert!(verifier.verify(&tampered, &header_map(&signed)).is_err());
        let other = standardwebhooks::Webhook::new(Secret::generate().expose()).expect("secret");
        assert!(other.verify(body, &header_map(&signed)).is_err());
    }

    #[test]
    fn during_a_rotation_both_signatures_are_sent_and_each_secret_alone_verifies() {
        let (old, new) = (Secret::generate(), Secret::generate());
        let body = br#"{"id":"evt_2"}"#;
        let signed = sign(
            "evt_2",
            now(),
            body,
            &Keys::rotating(new.clone(), old.clone()),
        )
        .expect("signed");
        let parts: Vec<&str> = signed.signature.split(' ').collect();
        assert_eq!(parts.len(), 2, "{}", signed.signature);
        assert!(parts.iter().all(|p| p.starts_with("v1,")));
        for secret in [&old, &new] {
            standardwebhooks::Webhook::new(secret.expose())
                .expect("secret")
                .verify(body, &header_map(&signed))
                .expect("each secret verifies during the rotation");
        }
        let after = sign("evt_2", now(), body, &Keys::new(new.clone())).expect("signed");
        assert!(
            standardwebhooks::Webhook::new(old.expose())
                .expect("secret")
                .verify(body, &header_map(&after))
                .is_err(),
            "after the rotation the old secret no longer verifies"
        );
    }

    #[test]
    fn after_two_rotations_three_signatures_are_sent_and_each_secret_alone_verifies() {
        let (a, b, c) = (Secret::generate(), Secret::generate(), Secret::generate());
        let body = br#"{"id":"evt_3"}"#;
        let keys = Keys::new(c.clone()).also(b.clone()).also(a.clone());
        let signed = sign("evt_3", now(), body, &keys).expect("signed");
        let parts: Vec<&str> = signed.signature.split(' ').collect();
        assert_eq!(parts.len(), 3, "{}", signed.signature);
        assert!(parts.iter().all(|p| p.starts_with("v1,")));
        for secret in [&a, &b, &c] {
            standardwebhooks::Webhook::new(secret.expose())
                .expect("secret")
                .verify(body, &header_map(&signed))
                .expect("each secret verifies alone");
        }
    }

    #[test]
    fn the_same_event_signed_at_another_time_gets_another_signature() {
        let keys = Keys::new(secret(VECTOR_SECRET));
        let first = sign(VECTOR_ID, VECTOR_TIMESTAMP, VECTOR_BODY, &keys).expect("signed");
        let later = sign(VECTOR_ID, VECTOR_TIMESTAMP + 5, VECTOR_BODY, &keys).expect("signed");
        assert_eq!(first.id, later.id);
        assert_ne!(first.signature, later.signature);
    }

    #[test]
    fn a_generated_secret_is_whsec_and_32_fresh_random_bytes() {
        let a = Secret::generate();
        let b = Secret::generate();
        assert_ne!(a.expose(), b.expose());
        for s in [&a, &b] {
            let key = STANDARD
                .decode(s.expose().strip_prefix("whsec_").expect("prefix"))
                .expect("base64");
            assert_eq!(key.len(), 32);
            assert!(Secret::parse(s.expose()).is_ok());
        }
    }

    #[test]
    fn a_secret_without_its_prefix_or_in_bad_base64_or_too_short_is_refused() {
        assert_eq!(
            Secret::parse("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").err(),
            Some(SecretError::NoPrefix)
        );
        assert_eq!(
            Secret::parse("whsec_not base64!").err(),
            Some(SecretError::NotBase64)
        );
        assert_eq!(
            Secret::parse(&format!("whsec_{}", STANDARD.encode([7u8; 16]))).err(),
            Some(SecretError::Length)
        );
        assert_eq!(
            Secret::parse(&format!("whsec_{}", STANDARD.encode([7u8; 65]))).err(),
            Some(SecretError::Length)
        );
    }

    #[test]
    fn an_id_that_could_be_read_another_way_is_not_signed() {
        let keys = Keys::new(Secret::generate());
        for id in ["", "evt.1", "evt 1", "evt\n1"] {
            assert_eq!(sign(id, 1, b"{}", &keys), Err(SignError::BadId), "{id:?}");
        }
        assert_eq!(
            sign("evt_1", 1, b"\xff\xfe", &keys),
            Err(SignError::BodyNotUtf8)
        );
    }

    /// What pagos signs, the merchant's verifier (`pagos_client::webhooks`) checks: the
    /// two sides of one delivery, each with its own crate.
    mod merchants_verifier {
        use super::*;
        use pagos_client::webhooks::{Verifier, VerifyError, subject};
        use pagos_types::EventType;
        use serde_json::json;

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

        fn delivery(id: &str, body: &[u8], at: i64, keys: &Keys) -> http::HeaderMap {
            header_map(&sign(id, at, body, keys).expect("signed"))
        }

        fn refused_signature(result: Result<pagos_types::Evento, VerifyError>) -> String {
            match result {
                Err(VerifyError::Signature(why)) => why,
                other => panic!("not refused for its signature: {other:?}"),
            }
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
            assert_eq!(event.tipo, EventType::PagoCompletado);
            assert_eq!(subject(&event), "pago:pay_1");
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
            refused_signature(
                Verifier::new(old.expose())
                    .expect("verifier")
                    .verify(&after, &body),
            );
            let both = Verifier::new(old.expose())
                .and_then(|v| v.also(new.expose()))
                .expect("verifier");
            both.verify(&after, &body)
                .expect("a consumer that holds both accepts the new signature");
            let stranger = delivery("evt_2", &body, now(), &Keys::new(Secret::generate()));
            refused_signature(both.verify(&stranger, &body));
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
                    let refused = result.expect_err("outside the tolerance");
                    assert!(
                        matches!(&refused, VerifyError::Signature(why) if why.contains("timestamp")),
                        "{offset}: {refused:?}"
                    );
                    assert_eq!(refused.status(), 401, "{offset}");
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
            refused_signature(verifier.verify(&headers, &tampered));

            // Signed honestly under another id: the body's id must be the signed one.
            let other_id = delivery("evt_other", &body, now(), &keys);
            assert!(matches!(
                verifier.verify(&other_id, &body),
                Err(VerifyError::Body(why)) if why.contains("webhook-id")
            ));

            for (name, short) in [
                ("webhook-id", "id"),
                ("webhook-timestamp", "timestamp"),
                ("webhook-signature", "signature"),
            ] {
                let mut missing = headers.clone();
                missing.remove(name);
                assert_eq!(
                    refused_signature(verifier.verify(&missing, &body)),
                    format!("missing header {short}"),
                    "{name}"
                );
            }
            assert!(matches!(
                Verifier::new("not-a-secret").err(),
                Some(VerifyError::Secret)
            ));
            let not_event = b"{\"hello\":1}";
            let signed = delivery("evt_5", not_event, now(), &keys);
            assert!(matches!(
                verifier.verify(&signed, not_event),
                Err(VerifyError::Body(_))
            ));
        }
    }

    #[test]
    fn debug_output_never_shows_a_secret() {
        let s = Secret::generate();
        let keys = Keys::rotating(s.clone(), Secret::generate());
        for shown in [format!("{s:?}"), format!("{keys:?}")] {
            assert!(!shown.contains(s.expose()), "{shown}");
            assert!(shown.contains("REDACTED"), "{shown}");
        }
    }
}
