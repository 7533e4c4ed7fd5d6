//! A Mercado Pago notification (`POST /v1/webhooks/mercadopago?data.id=…&type=payment`)
//! and its `x-signature`. Pure: the clock and the secret are arguments.
//!
//! The signature covers a manifest, not the body: `id:<data.id>;request-id:<x-request-id>;
//! ts:<ts>;`, HMAC-SHA256 with the webhook secret, hex — where `data.id` comes from the
//! URL's query (lower-cased) and a part whose value the request lacks is left out, as
//! Mercado Pago documents.
//!
//! A captured notification must not be replayable forever: each one asks Mercado Pago's
//! API for the payment it names, so replays would drive provider calls at an attacker's
//! rate. `ts` must be within 5 minutes of now either way (as for every webhook pagos
//! takes), and inside that window `replay_key` names the signed request, so that the
//! same one is answered as a duplicate. The body is not signed: its `id` cannot be that
//! key.

use crate::gateway::mercadopago::{Payment, rank};
use crate::webhooks::event::{EventError, MAX_ID_LEN, bounded};
use crate::webhooks::signature::{SignatureError, TOLERANCE_SECS};
use hmac::{Hmac, Mac};
use serde::Deserialize;
use serde_json::Value;
use sha2::Sha256;

pub const SIGNATURE_HEADER: &str = "x-signature";
pub const REQUEST_ID_HEADER: &str = "x-request-id";

/// Milliseconds: below 10^13 until the year 2286.
const RANK_STEP: i64 = 10_000_000_000_000;

/// The only notification type with an effect: payments.
pub const PAYMENT: &str = "payment";
/// How long after a notification was made its payment may still be missing from
/// Mercado Pago's reads: a notification that young whose payment is not found is refused
/// (503), so that Mercado Pago delivers it again, not acknowledged.
pub const READ_LAG: chrono::TimeDelta = chrono::TimeDelta::minutes(15);

#[derive(Deserialize)]
struct Envelope {
    id: Value,
    #[serde(rename = "type", default)]
    kind: Option<String>,
    #[serde(default)]
    action: Option<String>,
    #[serde(default)]
    data: Option<DataId>,
    /// Unsigned: only ever used to wait longer for Mercado Pago's reads, never to apply.
    #[serde(default)]
    date_created: Option<Value>,
}

#[derive(Deserialize)]
struct DataId {
    #[serde(default)]
    id: Option<Value>,
}

/// A parsed notification body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Notification {
    /// The notification's id: the dedupe key.
    pub id: String,
    /// `payment`, `merchant_order`, …
    pub kind: String,
    pub action: Option<String>,
    /// `data.id` of the body (the signed one is in the URL's query).
    pub data_id: Option<String>,
    /// When Mercado Pago made the notification, if it said so readably (unsigned).
    pub date_created: Option<chrono::DateTime<chrono::Utc>>,
}

fn text(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

impl Notification {
    pub fn parse(raw: &[u8]) -> Result<Notification, EventError> {
        let envelope: Envelope = serde_json::from_slice(raw)
            .map_err(|e| EventError(format!("the body is not a Mercado Pago notification: {e}")))?;
        let id = text(&envelope.id)
            .ok_or_else(|| EventError("`id` must be a number or a string".into()))?;
        bounded("id", &id, MAX_ID_LEN)?;
        let data_id = envelope.data.and_then(|d| d.id).as_ref().and_then(text);
        if let Some(data_id) = &data_id {
            bounded("data.id", data_id, MAX_ID_LEN)?;
        }
        Ok(Notification {
            id,
            kind: envelope.kind.unwrap_or_default().chars().take(64).collect(),
            action: envelope.action.map(|a| a.chars().take(64).collect()),
            data_id,
            date_created: envelope
                .date_created
                .as_ref()
                .and_then(Value::as_str)
                .and_then(|at| chrono::DateTime::parse_from_rfc3339(at).ok())
                .map(|at| at.to_utc()),
        })
    }
}

/// A parsed `x-signature`: `ts=<timestamp>,v1=<64 hex>` (other keys ignored).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct XSignature {
    ts: String,
    v1: [u8; 32],
}

/// A `ts` at or above this is in milliseconds, below it in seconds: seconds reach 10^11
/// only in the year 5138, milliseconds passed it in 1973. Mercado Pago's examples and
/// SDKs use seconds, while its text has said milliseconds; both are read.
const MILLISECONDS_FROM: i64 = 100_000_000_000;

impl XSignature {
    pub fn parse(raw: &[u8]) -> Result<XSignature, SignatureError> {
        use SignatureError::Malformed;
        let text = std::str::from_utf8(raw).map_err(|_| Malformed("not ASCII"))?;
        if text.split(',').count() > 8 {
            return Err(Malformed("too many items"));
        }
        let (mut ts, mut v1) = (None, None);
        for item in text.split(',') {
            let (name, value) = item
                .split_once('=')
                .ok_or(Malformed("every item must be name=value"))?;
            match name.trim() {
                "ts" => {
                    let value = value.trim();
                    if ts.is_some() {
                        return Err(Malformed("more than one ts="));
                    }
                    if value.is_empty()
                        || value.len() > 20
                        || !value.bytes().all(|b| b.is_ascii_digit())
                    {
                        return Err(Malformed("ts= must be a timestamp"));
                    }
                    ts = Some(value.to_owned());
                }
                "v1" => {
                    if v1.is_some() {
                        return Err(Malformed("more than one v1="));
                    }
                    let mut signature = [0u8; 32];
                    hex::decode_to_slice(value.trim(), &mut signature)
                        .map_err(|_| Malformed("v1= must be 64 hex digits"))?;
                    v1 = Some(signature);
                }
                _ => {}
            }
        }
        Ok(XSignature {
            ts: ts.ok_or(Malformed("ts= is missing"))?,
            v1: v1.ok_or(Malformed("v1= is missing"))?,
        })
    }

    /// `ts` in unix seconds (None: out of range).
    pub fn unix_seconds(&self) -> Option<i64> {
        let ts: i64 = self.ts.parse().ok()?;
        Some(if ts >= MILLISECONDS_FROM {
            ts / 1000
        } else {
            ts
        })
    }

    /// Accepts when `ts` is within the tolerance of `now` (unix seconds) and `v1` is the
    /// MAC of the manifest under `secret` (constant time).
    pub fn verify(
        &self,
        secret: &[u8],
        data_id: Option<&str>,
        request_id: Option<&str>,
        now: i64,
    ) -> Result<(), SignatureError> {
        match self.unix_seconds() {
            Some(ts) if (now - ts).abs() <= TOLERANCE_SECS => {}
            _ => return Err(SignatureError::OutsideTolerance),
        }
        let mut mac =
            <Hmac<Sha256> as Mac>::new_from_slice(secret).expect("HMAC takes keys of any length");
        mac.update(manifest(data_id, request_id, &self.ts).as_bytes());
        mac.verify_slice(&self.v1)
            .map_err(|_| SignatureError::Mismatch)
    }
}

/// What Mercado Pago signs: `id:<data.id>;request-id:<x-request-id>;ts:<ts>;`, each part
/// left out when the request lacks its value; an alphanumeric `data.id` lower-cased.
pub fn manifest(data_id: Option<&str>, request_id: Option<&str>, ts: &str) -> String {
    let mut manifest = String::new();
    if let Some(id) = data_id.filter(|s| !s.is_empty()) {
        manifest.push_str(&format!("id:{};", id.to_ascii_lowercase()));
    }
    if let Some(request_id) = request_id.filter(|s| !s.is_empty()) {
        manifest.push_str(&format!("request-id:{request_id};"));
    }
    manifest.push_str(&format!("ts:{ts};"));
    manifest
}

/// Verifies the request's `x-signature` (exactly one) for its query's `data.id` and its
/// `x-request-id`, at `now` (unix seconds); the verified header.
pub fn verify_request<'a>(
    mut values: impl Iterator<Item = &'a [u8]>,
    secret: &[u8],
    data_id: Option<&str>,
    request_id: Option<&str>,
    now: i64,
) -> Result<XSignature, SignatureError> {
    let header = match (values.next(), values.next()) {
        (None, _) => return Err(SignatureError::Missing),
        (Some(_), Some(_)) => return Err(SignatureError::Repeated),
        (Some(value), None) => XSignature::parse(value)?,
    };
    header.verify(secret, data_id, request_id, now)?;
    Ok(header)
}

/// Longer request ids are kept by their hash (the dedupe column holds 255 characters).
const MAX_KEPT_REQUEST_ID: usize = 200;

/// What names one signed notification request for deduplication: its `x-request-id`
/// (signed, unique per notification), or, when a request comes without one, its
/// signature (the manifest is then `data.id` and `ts` only, so the same signature is the
/// same request). A replay of a captured request has the same key; Mercado Pago's next
/// notification has another.
pub fn replay_key(request_id: Option<&str>, signature: &XSignature) -> String {
    use sha2::Digest;
    match request_id.filter(|id| !id.is_empty()) {
        Some(id) if id.len() <= MAX_KEPT_REQUEST_ID && !id.chars().any(char::is_control) => {
            format!("x-request-id:{id}")
        }
        Some(id) => format!("x-request-id-sha256:{}", hex::encode(Sha256::digest(id))),
        None => format!("x-signature:{}:{}", signature.ts, hex::encode(signature.v1)),
    }
}

/// The ordering key of what one read of a payment said: its status's rank (pending <
/// final < money returned), then when Mercado Pago last changed it.
pub fn sequence(payment: &Payment) -> i64 {
    rank(&payment.status) * RANK_STEP + payment.updated_at_millis().clamp(0, RANK_STEP - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &[u8] = b"mp_webhook_secret";

    fn sign(manifest: &str) -> String {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(SECRET).expect("key");
        mac.update(manifest.as_bytes());
        hex::encode(mac.finalize().into_bytes())
    }

    #[test]
    fn the_manifest_is_the_documented_template() {
        assert_eq!(
            manifest(
                Some("123456"),
                Some("bb56a2f1-6aae-46ac-982e-9dcd3581d08e"),
                "1704908010"
            ),
            "id:123456;request-id:bb56a2f1-6aae-46ac-982e-9dcd3581d08e;ts:1704908010;"
        );
        assert_eq!(manifest(Some("ABC12"), None, "1"), "id:abc12;ts:1;");
        assert_eq!(manifest(None, Some("r"), "1"), "request-id:r;ts:1;");
    }

    const TS: i64 = 1_704_908_010;

    #[test]
    fn a_signed_manifest_verifies_and_anything_else_does_not() {
        let v1 = sign("id:123456;request-id:req-1;ts:1704908010;");
        let header = format!("ts=1704908010,v1={v1}");
        let ok = |id: Option<&str>, req: Option<&str>| {
            verify_request([header.as_bytes()].into_iter(), SECRET, id, req, TS).map(|_| ())
        };
        assert_eq!(ok(Some("123456"), Some("req-1")), Ok(()));
        assert_eq!(
            ok(Some("123457"), Some("req-1")),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            ok(Some("123456"), Some("req-2")),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(ok(None, Some("req-1")), Err(SignatureError::Mismatch));
        assert_eq!(
            verify_request(
                [header.as_bytes()].into_iter(),
                b"other",
                Some("123456"),
                Some("req-1"),
                TS
            ),
            Err(SignatureError::Mismatch)
        );
        let spaced = format!("ts=1704908010, v1={v1}");
        assert!(
            verify_request(
                [spaced.as_bytes()].into_iter(),
                SECRET,
                Some("123456"),
                Some("req-1"),
                TS
            )
            .is_ok()
        );
    }

    #[test]
    fn ts_must_be_within_five_minutes_of_now_either_way() {
        let header = |ts: i64| {
            let v1 = sign(&format!("id:123456;request-id:req-1;ts:{ts};"));
            format!("ts={ts},v1={v1}")
        };
        let at = |ts: i64, now: i64| {
            let header = header(ts);
            verify_request(
                [header.as_bytes()].into_iter(),
                SECRET,
                Some("123456"),
                Some("req-1"),
                now,
            )
            .map(|_| ())
        };
        assert_eq!(at(TS, TS + 300), Ok(()));
        assert_eq!(at(TS, TS - 300), Ok(()));
        assert_eq!(
            at(TS, TS + 301),
            Err(SignatureError::OutsideTolerance),
            "stale"
        );
        assert_eq!(
            at(TS, TS - 301),
            Err(SignatureError::OutsideTolerance),
            "future"
        );
        // The same instant in milliseconds.
        assert_eq!(at(TS * 1000 + 999, TS + 300), Ok(()));
        assert_eq!(
            at(TS * 1000, TS + 301),
            Err(SignatureError::OutsideTolerance)
        );
        assert_eq!(at(0, TS), Err(SignatureError::OutsideTolerance));
        let huge = "99999999999999999999";
        let v1 = sign(&format!("id:1;ts:{huge};"));
        let header = format!("ts={huge},v1={v1}");
        assert_eq!(
            verify_request([header.as_bytes()].into_iter(), SECRET, Some("1"), None, TS)
                .map(|_| ()),
            Err(SignatureError::OutsideTolerance),
            "a ts out of range is no timestamp"
        );
    }

    #[test]
    fn the_replay_key_is_the_signed_request_id_or_the_signature() {
        let v1 = sign("id:1;ts:1704908010;");
        let signature =
            XSignature::parse(format!("ts=1704908010,v1={v1}").as_bytes()).expect("parses");
        assert_eq!(
            replay_key(Some("bb56a2f1-6aae-46ac-982e-9dcd3581d08e"), &signature),
            "x-request-id:bb56a2f1-6aae-46ac-982e-9dcd3581d08e"
        );
        assert_eq!(
            replay_key(None, &signature),
            format!("x-signature:1704908010:{v1}")
        );
        assert_eq!(
            replay_key(Some(""), &signature),
            replay_key(None, &signature)
        );
        let long = replay_key(Some(&"r".repeat(500)), &signature);
        assert!(
            long.starts_with("x-request-id-sha256:") && long.len() < 255,
            "{long}"
        );
    }

    #[test]
    fn the_header_must_have_one_ts_and_one_v1() {
        let v1 = "ab".repeat(32);
        for bad in [
            String::new(),
            format!("v1={v1}"),
            "ts=1".to_owned(),
            format!("ts=x,v1={v1}"),
            format!("ts=1,v1={}", &v1[..10]),
            format!("ts=1,ts=2,v1={v1}"),
            format!("ts=1,v1={v1},v1={v1}"),
        ] {
            assert!(XSignature::parse(bad.as_bytes()).is_err(), "{bad:?}");
        }
        let none: [&[u8]; 0] = [];
        assert_eq!(
            verify_request(none.into_iter(), SECRET, None, None, TS),
            Err(SignatureError::Missing)
        );
    }

    #[test]
    fn notifications_parse_with_numeric_or_string_ids() {
        let parsed = Notification::parse(
            br#"{"action":"payment.updated","api_version":"v1","data":{"id":"1234567890"},
                "date_created":"2026-12-02T15:00:00Z","id":112233445566,"live_mode":false,
                "type":"payment","user_id":"2037271"}"#,
        )
        .expect("valid");
        assert_eq!(parsed.id, "112233445566");
        assert_eq!(parsed.kind, "payment");
        assert_eq!(parsed.data_id.as_deref(), Some("1234567890"));
        assert!(Notification::parse(br#"{"type":"payment"}"#).is_err());
        assert!(Notification::parse(b"[]").is_err());
    }
}
