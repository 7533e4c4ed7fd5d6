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
