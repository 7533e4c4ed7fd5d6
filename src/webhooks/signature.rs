//! The `Gateway-Signature` header: `t=<unix seconds>,v1=<hex HMAC-SHA256(secret,
//! "<t>.<raw body>")>`, with one or more `v1` (a gateway rotating its secret signs with
//! both). Stripe's `Stripe-Signature` is the same scheme, except that it may carry other
//! schemes (`v0=…`) that must be ignored: `parse_lenient`.
//!
//! Pure: the clock is an argument. It works on the raw bytes and never parses the body,
//! compares MACs in constant time (`hmac`'s `verify_slice`), and never logs a secret or a
//! signature.

use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// The header's name.
pub const HEADER: &str = "gateway-signature";

/// How far `t` may be from now, either way, in seconds: a captured request cannot be
/// replayed later than this (and the dedupe table catches replays inside it).
pub const TOLERANCE_SECS: i64 = 5 * 60;

/// More `v1` values than this is not a rotation, it is someone guessing.
const MAX_SIGNATURES: usize = 8;

/// More items than this in a lenient header is not a provider's header.
const MAX_ITEMS: usize = 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("the Gateway-Signature header is missing")]
    Missing,
    #[error("send exactly one Gateway-Signature header")]
    Repeated,
    #[error("the Gateway-Signature header is malformed: {0}")]
    Malformed(&'static str),
    #[error("the signature's timestamp is more than 5 minutes away from now")]
    OutsideTolerance,
    #[error("no v1 signature matches this body")]
    Mismatch,
}

/// A parsed header: valid by construction (one timestamp, 1–8 signatures of 32 bytes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SignatureHeader {
    timestamp: i64,
    signatures: Vec<[u8; 32]>,
}

impl SignatureHeader {
    /// Parses the header strictly: comma-separated `t=` (exactly once, decimal digits)
    /// and `v1=` (at least once, 64 hex digits); anything else is refused.
    pub fn parse(raw: &[u8]) -> Result<Self, SignatureError> {
        Self::parse_with(raw, false)
    }

    /// As `parse`, but items other than `t=` and `v1=` (Stripe's `v0=`, schemes a
    /// provider adds later) are skipped, as Stripe asks of its receivers.
    pub fn parse_lenient(raw: &[u8]) -> Result<Self, SignatureError> {
        Self::parse_with(raw, true)
    }

    fn parse_with(raw: &[u8], skip_unknown: bool) -> Result<Self, SignatureError> {
        use SignatureError::Malformed;
        let text = std::str::from_utf8(raw).map_err(|_| Malformed("not ASCII"))?;
        if skip_unknown && text.split(',').count() > MAX_ITEMS {
            return Err(Malformed("too many items"));
        }
        let mut timestamp = None;
        let mut signatures = Vec::new();
        for item in text.split(',') {
            let (name, value) = item
                .split_once('=')
                .ok_or(Malformed("every item must be name=value"))?;
            match name {
                "t" => {
                    if timestamp.is_some() {
                        return Err(Malformed("more than one t="));
                    }
                    if value.is_empty()
                        || value.len() > 18
                        || !value.bytes().all(|b| b.is_ascii_digit())
                    {
                        return Err(Malformed("t= must be unix seconds"));
                    }
                    timestamp = Some(value.parse().map_err(|_| Malformed("t= out of range"))?);
                }
                "v1" => {
                    let mut signature = [0u8; 32];
                    hex::decode_to_slice(value, &mut signature)
                        .map_err(|_| Malformed("v1= must be 64 hex digits"))?;
                    signatures.push(signature);
                    if signatures.len() > MAX_SIGNATURES {
                        return Err(Malformed("too many v1= values"));
                    }
                }
                _ if skip_unknown => {}
                _ => return Err(Malformed("only t= and v1= are allowed")),
            }
        }
        let timestamp = timestamp.ok_or(Malformed("t= is missing"))?;
        if signatures.is_empty() {
            return Err(Malformed("v1= is missing"));
        }
        Ok(SignatureHeader {
            timestamp,
            signatures,
        })
    }

    pub fn timestamp(&self) -> i64 {
        self.timestamp
    }

    /// Accepts when `t` is within the tolerance of `now` and any `v1` is the MAC of
    /// `"<t>.<body>"` under `secret`.
    pub fn verify(&self, secret: &[u8], body: &[u8], now: i64) -> Result<(), SignatureError> {
        if (now - self.timestamp).abs() > TOLERANCE_SECS {
            return Err(SignatureError::OutsideTolerance);
        }
        let mac = signed_payload_mac(secret, self.timestamp, body);
        // Every candidate is checked (no early exit), each in constant time.
        let matched = self.signatures.iter().fold(false, |found, sig| {
            mac.clone().verify_slice(sig).is_ok() | found
        });
        if matched {
            Ok(())
        } else {
            Err(SignatureError::Mismatch)
        }
    }
}

fn signed_payload_mac(secret: &[u8], timestamp: i64, body: &[u8]) -> HmacSha256 {
    // HMAC pads or hashes a key of any length: `InvalidLength` is never returned.
    let mut mac =
        <HmacSha256 as Mac>::new_from_slice(secret).expect("HMAC takes keys of any length");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    mac
}

/// Verifies the `Gateway-Signature` values of a request (all of them: more than one is
/// refused) over the raw body.
pub fn verify_header<'a>(
    values: impl Iterator<Item = &'a [u8]>,
    secret: &[u8],
    body: &[u8],
    now: i64,
) -> Result<(), SignatureError> {
    one_header(values, SignatureHeader::parse)?.verify(secret, body, now)
}

/// Verifies the `Stripe-Signature` values of a request (exactly one header; schemes
/// other than `v1` ignored) over the raw body, with the same 5-minute tolerance.
pub fn verify_stripe_header<'a>(
    values: impl Iterator<Item = &'a [u8]>,
    secret: &[u8],
    body: &[u8],
    now: i64,
) -> Result<(), SignatureError> {
    one_header(values, SignatureHeader::parse_lenient)?.verify(secret, body, now)
}

fn one_header<'a>(
    mut values: impl Iterator<Item = &'a [u8]>,
    parse: fn(&[u8]) -> Result<SignatureHeader, SignatureError>,
) -> Result<SignatureHeader, SignatureError> {
    match (values.next(), values.next()) {
        (None, _) => Err(SignatureError::Missing),
        (Some(_), Some(_)) => Err(SignatureError::Repeated),
        (Some(value), None) => parse(value),
    }
}

/// The header a gateway sends for `body` at `timestamp` (used by the sandbox gateway).
pub fn sign(secret: &[u8], timestamp: i64, body: &[u8]) -> String {
    let tag = signed_payload_mac(secret, timestamp, body)
        .finalize()
        .into_bytes();
    format!("t={timestamp},v1={}", hex::encode(tag))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &[u8] = b"whsec_test";
    const BODY: &[u8] = br#"{"id":"evt_1"}"#;
    const NOW: i64 = 1_764_633_600;

    /// Computed outside Rust: `printf '1764633600.{"id":"evt_1"}' | openssl dgst -sha256
    /// -hmac whsec_test`.
    const KNOWN_V1: &str = "fa5bcb43f4afb49edb3ba50bfc5e3e7f2e8a1507416ce98c6c54eb322109893d";

    #[test]
    fn the_signature_is_hmac_sha256_of_t_dot_body_in_hex() {
        assert_eq!(sign(SECRET, NOW, BODY), format!("t={NOW},v1={KNOWN_V1}"));
    }

    #[test]
    fn a_signed_body_verifies_and_any_v1_may_match() {
        let header = sign(SECRET, NOW, BODY);
        let parsed = SignatureHeader::parse(header.as_bytes()).expect("parses");
        assert_eq!(parsed.verify(SECRET, BODY, NOW), Ok(()));
        let other = sign(b"old_secret", NOW, BODY);
        let rotated = format!("{other},{}", header.split_once(',').expect("two items").1);
        let parsed = SignatureHeader::parse(rotated.as_bytes()).expect("parses");
        assert_eq!(parsed.verify(SECRET, BODY, NOW), Ok(()));
    }

    #[test]
    fn another_secret_another_body_or_another_t_do_not_verify() {
        let header = SignatureHeader::parse(sign(SECRET, NOW, BODY).as_bytes()).expect("parses");
        assert_eq!(
            header.verify(b"whsec_other", BODY, NOW),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            header.verify(SECRET, br#"{"id":"evt_2"}"#, NOW),
            Err(SignatureError::Mismatch)
        );
        let moved = sign(SECRET, NOW, BODY).replace(&format!("t={NOW}"), &format!("t={}", NOW + 1));
        let moved = SignatureHeader::parse(moved.as_bytes()).expect("parses");
        assert_eq!(
            moved.verify(SECRET, BODY, NOW),
            Err(SignatureError::Mismatch)
        );
    }

    #[test]
    fn the_timestamp_must_be_within_five_minutes_either_way() {
        for (t, ok) in [
            (NOW - 300, true),
            (NOW + 300, true),
            (NOW - 301, false),
            (NOW + 301, false),
            (NOW - 600, false),
            (0, false),
        ] {
            let header = SignatureHeader::parse(sign(SECRET, t, BODY).as_bytes()).expect("parses");
            let verdict = header.verify(SECRET, BODY, NOW);
            if ok {
                assert_eq!(verdict, Ok(()), "t = now{:+}", t - NOW);
            } else {
                assert_eq!(verdict, Err(SignatureError::OutsideTolerance), "t = {t}");
            }
        }
    }

    #[test]
    fn the_header_is_parsed_strictly() {
        let v1 = "ab".repeat(32);
        for bad in [
            String::new(),
            format!("v1={v1}"),
            format!("t={NOW}"),
            format!("t={NOW},t={NOW},v1={v1}"),
            format!("t=-5,v1={v1}"),
            format!("t= {NOW},v1={v1}"),
            format!("t={NOW}, v1={v1}"),
            format!("t={NOW},v1={}", &v1[..62]),
            format!("t={NOW},v1={}zz", &v1[..62]),
            format!("t={NOW},v1={v1},"),
            format!("t={NOW},v0={v1}"),
            format!("t={NOW};v1={v1}"),
            format!("t={NOW},v1"),
            format!("t=99999999999999999999,v1={v1}"),
            format!("t={NOW}{}", format!(",v1={v1}").repeat(9)),
        ] {
            assert!(
                matches!(
                    SignatureHeader::parse(bad.as_bytes()),
                    Err(SignatureError::Malformed(_))
                ),
                "{bad:?} must be refused"
            );
        }
        assert!(SignatureHeader::parse(format!("t={NOW},v1={v1},v1={v1}").as_bytes()).is_ok());
    }

    #[test]
    fn stripes_header_may_carry_other_schemes_which_are_ignored() {
        let signed = sign(SECRET, NOW, BODY);
        let with_v0 = format!("{signed},v0={}", "cd".repeat(32));
        assert!(
            SignatureHeader::parse(with_v0.as_bytes()).is_err(),
            "strict refuses v0"
        );
        let parsed = SignatureHeader::parse_lenient(with_v0.as_bytes()).expect("lenient");
        assert_eq!(parsed.verify(SECRET, BODY, NOW), Ok(()));
        for bad in [
            format!("v0={}", "cd".repeat(32)),
            format!("t={NOW},v0={}", "cd".repeat(32)),
            format!("t={NOW},v1=zz"),
            format!("t={NOW},v1={}{}", "ab".repeat(32), ",x=1".repeat(16)),
        ] {
            assert!(
                SignatureHeader::parse_lenient(bad.as_bytes()).is_err(),
                "{bad:?} must be refused"
            );
        }
        assert_eq!(
            verify_stripe_header([with_v0.as_bytes()].into_iter(), SECRET, BODY, NOW),
            Ok(())
        );
        assert_eq!(
            verify_stripe_header([with_v0.as_bytes()].into_iter(), b"whsec_other", BODY, NOW),
            Err(SignatureError::Mismatch)
        );
    }

    #[test]
    fn exactly_one_header_is_accepted() {
        let header = sign(SECRET, NOW, BODY);
        let none: [&[u8]; 0] = [];
        assert_eq!(
            verify_header(none.into_iter(), SECRET, BODY, NOW),
            Err(SignatureError::Missing)
        );
        assert_eq!(
            verify_header(
                [header.as_bytes(), header.as_bytes()].into_iter(),
                SECRET,
                BODY,
                NOW
            ),
            Err(SignatureError::Repeated)
        );
        assert_eq!(
            verify_header([header.as_bytes()].into_iter(), SECRET, BODY, NOW),
            Ok(())
        );
    }
}
