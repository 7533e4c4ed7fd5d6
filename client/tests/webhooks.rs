//! The merchant's side of pagos' webhooks: a delivery verified with one secret or either
//! of a rotation, each event applied once (by id, in the effect's transaction), an older
//! event ignored, and a failed effect leaving nothing recorded.

use http::{HeaderMap, HeaderValue};
use pagos_client::webhooks::{Applied, Inbox, InboxError, Verifier, VerifyError};
use pagos_types::Evento;
use serde_json::json;

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const OTHER: &str = "whsec_dGhpcyBpcyBhbm90aGVyIHNlY3JldCBvZiAzMiBieXRlcw==";

fn body(id: &str, secuencia: u64, estado: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "id": id, "tipo": "pago.completado", "creadoEn": "2026-12-03T00:00:00.000Z",
        "secuencia": secuencia, "datos": {"id": "p-1", "estado": estado}
    }))
    .expect("json")
}

fn signed(secret: &str, id: &str, body: &[u8]) -> HeaderMap {
    let now = chrono::Utc::now().timestamp();
    let signature = standardwebhooks::Webhook::new(secret)
        .expect("secret")
        .sign(id, now, body)
        .expect("signed");
    let mut headers = HeaderMap::new();
    headers.insert("webhook-id", HeaderValue::from_str(id).expect("id"));
    headers.insert("webhook-timestamp", HeaderValue::from(now));
    headers.insert(
        "webhook-signature",
        HeaderValue::from_str(&signature).expect("sig"),
    );
    headers
}

fn event(id: &str, secuencia: u64, estado: &str) -> Evento {
    serde_json::from_slice(&body(id, secuencia, estado)).expect("event")
}

#[test]
fn a_delivery_signed_with_either_secret_of_a_rotation_verifies_and_a_forged_one_does_not() {
    let b = body("evt_1", 1, "COMPLETADA");
    let rotating = Verifier::new(OTHER).expect("v").also(SECRET).expect("v");
    assert_eq!(
        rotating
            .verify(&signed(SECRET, "evt_1", &b), &b)
            .expect("ok")
            .id,
        "evt_1"
    );
    assert!(rotating.verify(&signed(OTHER, "evt_1", &b), &b).is_ok());
    let only_other = Verifier::new(OTHER).expect("v");
    let refused = only_other
        .verify(&signed(SECRET, "evt_1", &b), &b)
        .expect_err("forged");
    assert_eq!(refused.status(), 401);
    let mut tampered = b.clone();
    tampered.push(b' ');
    assert!(
        rotating
            .verify(&signed(SECRET, "evt_1", &b), &tampered)
            .is_err()
    );
}

/// With an empty or short key anyone can sign: a secret that is not `whsec_` and the
/// base64 of a 24- to 64-byte key (the specification's, and what pagos makes) is refused,
/// as the endpoint's secret and as a rotation's older one, and so no delivery signed with
/// such a key is ever accepted.
#[test]
fn an_empty_short_or_unprefixed_secret_is_refused_so_nobody_can_forge_with_it() {
    let b = body("evt_1", 1, "COMPLETADA");
    // What anyone can sign, with the empty key of "" or "whsec_".
    let forged = signed("whsec_", "evt_1", &b);
    for empty in ["", "whsec_"] {
        let accepted = Verifier::new(empty).map(|v| v.verify(&forged, &b).is_ok());
        assert!(
            !matches!(accepted, Ok(true)),
            "{empty:?}: a forged delivery was accepted"
        );
    }
    for secret in [
        "",
        "whsec_",
        // 16 bytes, 65 bytes: outside 24..=64.
        "whsec_MTIzNDU2Nzg5MDEyMzQ1Ng==",
        "whsec_QUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUE=",
        // A good key without its prefix.
        "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        "whsec_not base64!",
    ] {
        let alone = Verifier::new(secret);
        assert!(
            matches!(alone, Err(VerifyError::Secret)),
            "{secret:?} was taken as a secret"
        );
        let rotating = Verifier::new(SECRET).expect("v").also(secret);
        assert!(
            matches!(rotating, Err(VerifyError::Secret)),
            "{secret:?} was taken as a rotation's secret"
        );
    }
    // The edges of the specification's range (24 and 64 bytes) are secrets.
    for secret in [
        "whsec_BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcH",
        "whsec_BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBw==",
    ] {
        assert!(Verifier::new(secret).is_ok(), "{secret}");
    }
}

/// A crafted `webhook-timestamp` (far in the past, far ahead, not a number) is a refused
/// delivery (401: pagos would retry a real one), never a panic in the merchant's handler,
/// even signed with the right secret.
#[test]
fn a_timestamp_far_from_the_clock_or_unreadable_is_refused_not_a_panic() {
    let b = body("evt_1", 1, "COMPLETADA");
    let webhook = standardwebhooks::Webhook::new(SECRET).expect("secret");
    let verifier = Verifier::new(SECRET).expect("v");
    let now = chrono::Utc::now().timestamp();
    for timestamp in [
        i64::MIN.to_string(),
        (i64::MIN + 1).to_string(),
        i64::MAX.to_string(),
        (now - 2 * 86_400).to_string(),
        (now + 2 * 86_400).to_string(),
        "soon".to_owned(),
        "99999999999999999999".to_owned(),
    ] {
        let mut headers = signed(SECRET, "evt_1", &b);
        if let Ok(ts) = timestamp.parse::<i64>() {
            let signature = webhook.sign("evt_1", ts, &b).expect("signed");
            headers.insert(
                "webhook-signature",
                HeaderValue::from_str(&signature).expect("sig"),
            );
        }
        headers.insert(
            "webhook-timestamp",
            HeaderValue::from_str(&timestamp).expect("ts"),
        );

        let refused = std::panic::catch_unwind(|| verifier.verify(&headers, &b))
            .unwrap_or_else(|_| panic!("{timestamp}: a panic, not a refusal"))
            .expect_err(&timestamp);

        assert!(
            matches!(refused, VerifyError::Signature(_)),
            "{timestamp}: {refused:?}"
        );
        assert_eq!(refused.status(), 401);
    }
}

#[test]
fn each_event_is_applied_once_and_an_older_one_is_ignored() {
    let dir = tempfile::tempdir().expect("dir");
    let inbox = Inbox::open(dir.path().join("inbox.db")).expect("inbox");
    let mut effects = Vec::new();
    let mut apply = |e: &Evento| {
        inbox
            .apply(e, |_, e| {
                effects.push(e.id.clone());
                Ok::<_, String>(())
            })
            .expect("applied")
    };
    assert_eq!(
        apply(&event("evt_2", 5, "REVISION_MANUAL")),
        Applied::Applied
    );
    assert_eq!(
        apply(&event("evt_2", 5, "REVISION_MANUAL")),
        Applied::Duplicate
    );
    assert_eq!(
        apply(&event("evt_1", 3, "FALLIDA")),
        Applied::Stale,
        "older, late"
    );
    assert_eq!(apply(&event("evt_1", 3, "FALLIDA")), Applied::Duplicate);
    assert_eq!(apply(&event("evt_3", 7, "COMPLETADA")), Applied::Applied);
    assert_eq!(effects, ["evt_2", "evt_3"]);
}

#[test]
fn a_failed_effect_records_nothing_so_the_redelivery_applies_it() {
    let dir = tempfile::tempdir().expect("dir");
    let inbox = Inbox::open(dir.path().join("inbox.db")).expect("inbox");
    let e = event("evt_9", 2, "COMPLETADA");
    let failed = inbox.apply(&e, |_, _| Err("disk full"));
    assert!(matches!(failed, Err(InboxError::Effect("disk full"))));
    let again = inbox
        .apply(&e, |_, _| Ok::<_, String>(()))
        .expect("applied");
    assert_eq!(again, Applied::Applied);
}

fn event_of(payment: &str, id: &str, secuencia: u64) -> Evento {
    serde_json::from_value(json!({
        "id": id, "tipo": "pago.completado", "creadoEn": "2026-03-01T12:00:00Z",
        "secuencia": secuencia, "datos": {"id": payment, "estado": "COMPLETADA"}
    }))
    .expect("event")
}

fn inbox_in(dir: &tempfile::TempDir) -> Inbox {
    Inbox::open(dir.path().join("inbox.db")).expect("inbox")
}

#[test]
fn each_webhook_id_is_applied_once_however_often_it_arrives() {
    let dir = tempfile::tempdir().expect("dir");
    let inbox = inbox_in(&dir);
    let mut applied = Vec::new();
    let e = event_of("pay_6", "evt_6", 1);
    let mut decisions = Vec::new();
    for _ in 0..3 {
        let decision = inbox
            .apply(&e, |_, e| {
                applied.push(e.id.clone());
                Ok::<_, ()>(())
            })
            .expect("applied");
        assert!(decision == Applied::Applied || decision == Applied::Duplicate);
        decisions.push(decision);
    }
    assert_eq!(applied, ["evt_6"]);
    assert_eq!(
        decisions,
        [Applied::Applied, Applied::Duplicate, Applied::Duplicate]
    );
}

#[test]
fn an_older_event_of_a_payment_arriving_late_is_ignored() {
    let dir = tempfile::tempdir().expect("dir");
    let inbox = inbox_in(&dir);
    let mut applied = Vec::new();
    let mut apply = |e: Evento| {
        inbox
            .apply(&e, |_, e| {
                applied.push(e.secuencia);
                Ok::<_, ()>(())
            })
            .expect("handled")
    };
    assert_eq!(apply(event_of("pay_7", "evt_b", 2)), Applied::Applied);
    assert_eq!(apply(event_of("pay_7", "evt_a", 1)), Applied::Stale);
    // The same `secuencia` as the last applied one is old too.
    assert_eq!(apply(event_of("pay_7", "evt_c", 2)), Applied::Stale);
    assert_eq!(apply(event_of("pay_other", "evt_d", 1)), Applied::Applied);
    assert_eq!(apply(event_of("pay_7", "evt_e", 3)), Applied::Applied);
    // An id judged stale is recorded: its redelivery is a duplicate.
    assert_eq!(apply(event_of("pay_7", "evt_a", 1)), Applied::Duplicate);
    assert_eq!(applied, [2, 1, 3]);
}

/// The rule, row by row: an id seen before is a duplicate whatever its `secuencia`; a new
/// one is applied unless its payment's last applied `secuencia` is at or above its own.
#[test]
fn the_decision_is_dedupe_by_id_first_then_the_sequence() {
    // (applied before: id and secuencia, for the same payment), then this event's.
    let rows = [
        (Some(("evt_x", 1)), ("evt_x", 1), Applied::Duplicate),
        (Some(("evt_x", 0)), ("evt_x", 5), Applied::Duplicate),
        (None, ("evt_x", 1), Applied::Applied),
        (Some(("evt_w", 1)), ("evt_x", 2), Applied::Applied),
        (Some(("evt_w", 2)), ("evt_x", 2), Applied::Stale),
        (Some(("evt_w", 3)), ("evt_x", 2), Applied::Stale),
    ];
    for (before, (id, secuencia), expected) in rows {
        let dir = tempfile::tempdir().expect("dir");
        let inbox = inbox_in(&dir);
        if let Some((id, secuencia)) = before {
            let first = inbox
                .apply(&event_of("pay_t", id, secuencia), |_, _| Ok::<_, ()>(()))
                .expect("applied");
            assert_eq!(first, Applied::Applied);
        }
        let decision = inbox
            .apply(&event_of("pay_t", id, secuencia), |_, _| Ok::<_, ()>(()))
            .expect("decided");
        assert_eq!(decision, expected, "{before:?} then {id} {secuencia}");
    }
}

#[test]
fn an_inbox_in_memory_applies_each_event_once_too() {
    let inbox = Inbox::open(":memory:").expect("inbox");
    let e = event("evt_m", 1, "COMPLETADA");
    let mut effects = 0;
    for expected in [Applied::Applied, Applied::Duplicate] {
        let got = inbox
            .apply(&e, |_, _| {
                effects += 1;
                Ok::<_, ()>(())
            })
            .expect("applied");
        assert_eq!(got, expected);
    }
    assert_eq!(effects, 1);
}
