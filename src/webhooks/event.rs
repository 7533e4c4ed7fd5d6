//! A gateway event, parsed from bytes whose signature was already verified.
//!
//! Pure. Holding a `GatewayEvent` means its fields fit what the consumer stores; a body
//! that does not parse is refused whole (400), before anything is written.

use crate::gateway::{Charge, ChargeStatus, decline_code};
use serde::Deserialize;
use serde_json::Value;

/// The event types with an effect; others are acknowledged and ignored.
pub const CHARGE_UPDATED: &str = "charge.updated";
/// A refund's state changed (contract section 6): `data` is a refund.
pub const REFUND_UPDATED: &str = "refund.updated";

pub(crate) const MAX_ID_LEN: usize = 255;
const MAX_CURRENCY_LEN: usize = 16;

/// The wire envelope: `{"id":"evt_…","type":"charge.updated","sequence":n,"data":{…}}`.
/// Unknown fields are allowed: gateways add fields without notice.
#[derive(Deserialize)]
struct Envelope {
    id: String,
    #[serde(rename = "type")]
    kind: String,
    sequence: i64,
    data: Value,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GatewayEvent {
    /// The gateway's event id: the dedupe key.
    pub id: String,
    /// Increases with each change of one charge: the ordering key.
    pub sequence: i64,
    pub payload: Payload,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Payload {
    /// `charge.updated`: the charge as it stands after the change.
    ChargeUpdated(Charge),
    /// `refund.updated`: the refund as it stands after the change.
    RefundUpdated(crate::gateway::Refund),
    /// A type pagos does not act on (kept for the logs).
    Other(String),
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct EventError(pub(crate) String);

pub(crate) fn bounded(field: &str, value: &str, max: usize) -> Result<(), EventError> {
    if value.is_empty() {
        return Err(EventError(format!("`{field}` must not be empty")));
    }
    storable(field, value, max)
}

/// A charge's or refund's reference as pagos stores it: empty or foreign is not malformed
/// (an orphan charge, a refund made outside pagos, both stored with it, the charge listed
/// for on-call), so a NUL, which PostgreSQL's text refuses, is kept as U+FFFD; only one
/// too long to store is refused.
pub(crate) fn reference(field: &str, value: &mut String) -> Result<(), EventError> {
    if value.contains('\0') {
        *value = crate::gateway::storable::words(std::mem::take(value));
    }
    if value.chars().count() > MAX_ID_LEN {
        return Err(EventError(format!(
            "`{field}` is over {MAX_ID_LEN} characters"
        )));
    }
    Ok(())
}

/// A refund event's words held to what pagos stores (the reference protocol's
/// `refund.updated`, Stripe's refund events): its id, the refund's id, charge, currency and
/// failure code refused when they cannot be stored, its reference as `reference` keeps it.
pub(crate) fn storable_refund(
    event_id: &str,
    refund: &mut crate::gateway::Refund,
) -> Result<(), EventError> {
    bounded("id", event_id, MAX_ID_LEN)?;
    bounded("data.id", &refund.id, MAX_ID_LEN)?;
    // An empty or foreign reference is not malformed: a refund made outside pagos
    // (answered `desconocido`), as a charge's is an orphan.
    reference("data.reference", &mut refund.reference)?;
    if !refund.charge.is_empty() {
        bounded("data.charge", &refund.charge, MAX_ID_LEN)?;
    }
    bounded("data.currency", &refund.currency, MAX_CURRENCY_LEN)?;
    // Cut and made storable, as the adapters keep a code: refusing the event over it
    // would lose what it reports at every delivery.
    refund.failure_code = refund.failure_code.as_deref().map(decline_code);
    Ok(())
}

/// At most `max` characters and no control character (a NUL, which PostgreSQL's text
/// refuses, would fail the event's write at every delivery).
fn storable(field: &str, value: &str, max: usize) -> Result<(), EventError> {
    if value.chars().count() > max {
        return Err(EventError(format!("`{field}` is over {max} characters")));
    }
    if value.chars().any(char::is_control) {
        return Err(EventError(format!(
            "`{field}` must not contain control characters"
        )));
    }
    Ok(())
}

impl GatewayEvent {
    pub fn parse(raw: &[u8]) -> Result<Self, EventError> {
        let envelope: Envelope = serde_json::from_slice(raw)
            .map_err(|e| EventError(format!("the body is not a gateway event: {e}")))?;
        bounded("id", &envelope.id, MAX_ID_LEN)?;
        if envelope.sequence < 0 {
            return Err(EventError("`sequence` must not be negative".into()));
        }
        let payload = if envelope.kind == CHARGE_UPDATED {
            let mut charge: Charge = serde_json::from_value(envelope.data)
                .map_err(|e| EventError(format!("`data` is not a charge: {e}")))?;
            bounded("data.id", &charge.id, MAX_ID_LEN)?;
            // An empty or foreign reference is not malformed: it is an orphan charge.
            reference("data.reference", &mut charge.reference)?;
            bounded("data.currency", &charge.currency, MAX_CURRENCY_LEN)?;
            // Cut and made storable, as the adapters keep a code: refusing the event over
            // it would lose what it reports (a completed payment's charge reversed) at
            // every delivery.
            charge.decline_code = charge.decline_code.as_deref().map(decline_code);
            Payload::ChargeUpdated(charge)
        } else if envelope.kind == REFUND_UPDATED {
            let mut refund: crate::gateway::Refund = serde_json::from_value(envelope.data)
                .map_err(|e| EventError(format!("`data` is not a refund: {e}")))?;
            storable_refund(&envelope.id, &mut refund)?;
            Payload::RefundUpdated(refund)
        } else {
            Payload::Other(envelope.kind.chars().take(64).collect())
        };
        Ok(GatewayEvent {
            id: envelope.id,
            sequence: envelope.sequence,
            payload,
        })
    }
}

/// The contract's spelling of a charge status.
pub fn status_name(status: ChargeStatus) -> &'static str {
    match status {
        ChargeStatus::Succeeded => "succeeded",
        ChargeStatus::Declined => "declined",
        ChargeStatus::Pending => "pending",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn charge() -> Value {
        json!({"id":"ch_1","status":"succeeded","amount":250000,"currency":"COP",
               "reference":"01a236bf-3ba3-730c-b454-685f40f9d62b","declineCode":null})
    }

    fn parse(v: Value) -> Result<GatewayEvent, EventError> {
        GatewayEvent::parse(&serde_json::to_vec(&v).expect("json"))
    }

    #[test]
    fn the_contract_example_parses() {
        let event = parse(json!({"id":"evt_1","type":"charge.updated","sequence":2,
                                 "data":charge(),"livemode":false}))
        .expect("valid");
        assert_eq!(event.id, "evt_1");
        assert_eq!(event.sequence, 2);
        match event.payload {
            Payload::ChargeUpdated(c) => assert_eq!(c.status, ChargeStatus::Succeeded),
            other => panic!("not a charge: {other:?}"),
        }
    }

    /// A decline or failure code too long or with a NUL is kept cut and storable, as the
    /// adapters keep one: the event is not refused over it (the gateway would deliver it
    /// again and again, and what it reports would be lost).
    #[test]
    fn a_long_or_unstorable_code_is_kept_cut_not_refused() {
        let mut declined = charge();
        declined["status"] = json!("declined");
        declined["declineCode"] = json!(format!("do_not\u{0}honor{}", "x".repeat(300)));
        let event = parse(json!({"id":"evt_3","type":"charge.updated","sequence":3,
                                 "data":declined}))
        .expect("valid");
        let Payload::ChargeUpdated(c) = event.payload else {
            panic!("not a charge");
        };
        let code = c.decline_code.expect("a code");
        assert_eq!(code.chars().count(), crate::gateway::MAX_DECLINE_CODE_LEN);
        assert!(code.starts_with("do_not\u{FFFD}honor"), "{code}");
    }

    #[test]
    fn other_types_parse_without_a_charge() {
        let event = parse(json!({"id":"evt_2","type":"payout.paid","sequence":1,"data":{}}))
            .expect("valid");
        assert_eq!(event.payload, Payload::Other("payout.paid".into()));
    }

    #[test]
    fn malformed_events_are_refused() {
        let mut no_status = charge();
        no_status["status"] = json!("refunded");
        for bad in [
            json!([1]),
            json!({"type":"charge.updated","sequence":1,"data":charge()}),
            json!({"id":"","type":"charge.updated","sequence":1,"data":charge()}),
            json!({"id":"evt","type":"charge.updated","data":charge()}),
            json!({"id":"evt","type":"charge.updated","sequence":-1,"data":charge()}),
            json!({"id":"evt","type":"charge.updated","sequence":1.5,"data":charge()}),
            json!({"id":"evt","type":"charge.updated","sequence":"1","data":charge()}),
            json!({"id":"evt","type":"charge.updated","sequence":1,"data":{}}),
            json!({"id":"evt","type":"charge.updated","sequence":1,"data":no_status}),
            json!({"id":"e".repeat(256),"type":"charge.updated","sequence":1,"data":charge()}),
        ] {
            assert!(parse(bad.clone()).is_err(), "{bad} must be refused");
        }
        assert!(GatewayEvent::parse(b"{not json").is_err());
        assert!(GatewayEvent::parse(b"").is_err());
    }
}
