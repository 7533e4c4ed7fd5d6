//! A Stripe event (`POST /v1/webhooks/stripe`), parsed from bytes whose `Stripe-Signature`
//! was already verified. Pure.
//!
//! Stripe has no per-object sequence and delivers in any order, so events are ordered by
//! the state they report: a final PaymentIntent (succeeded, requires_payment_method,
//! canceled) outranks a pending one, and between two of the same rank the later event
//! (`created`) wins. A final payment therefore never goes back to pending, and a replay
//! of an old event changes nothing.

use crate::gateway::stripe::{PaymentIntent, status_of};
use crate::gateway::{Charge, ChargeStatus};
use crate::webhooks::event::{EventError, MAX_ID_LEN, bounded, reference};
use serde::Deserialize;
use serde_json::Value;

/// The event types that report a PaymentIntent's outcome; others are acknowledged and
/// ignored (`payment_intent.created` included: its snapshot predates the confirmation).
pub const ACTED_ON: [&str; 5] = [
    "payment_intent.succeeded",
    "payment_intent.payment_failed",
    "payment_intent.processing",
    "payment_intent.requires_action",
    "payment_intent.canceled",
];

/// The dispute events: a card dispute opened, changed or closed on a charge of a
/// PaymentIntent. A Dispute carries no pagos reference, only its PaymentIntent's id, so
/// the handler asks Stripe for that PaymentIntent (`Payload::Dispute`).
pub const DISPUTE_EVENTS: [&str; 5] = [
    "charge.dispute.created",
    "charge.dispute.updated",
    "charge.dispute.closed",
    "charge.dispute.funds_withdrawn",
    "charge.dispute.funds_reinstated",
];

/// The decline code of a charge reported by a dispute: `dispute_<status>`.
pub const DISPUTED: &str = "dispute_";

/// A Stripe Dispute, trimmed to what pagos reads.
#[derive(Deserialize)]
struct Dispute {
    id: String,
    /// Null for a charge made without a PaymentIntent (never pagos').
    #[serde(default)]
    payment_intent: Option<String>,
    status: String,
}

/// What a dispute's status says of the money its charge took:
///
/// | status | the money |
/// | --- | --- |
/// | `needs_response`, `under_review` | withdrawn from the account while the dispute is open |
/// | `lost` | gone back to the payer |
/// | `won` | reinstated: the charge stands |
/// | `warning_needs_response`, `warning_under_review`, `warning_closed` | an inquiry: nothing withdrawn (an inquiry that turns into a chargeback is reported `needs_response`) |
/// | `prevented` | read as withdrawn: a dispute prevented by an automatic refund (Visa's Rapid Dispute Resolution) gave the money back, by a refund that names no pagos refund |
///
/// Any other status is read as withdrawn: on-call reads it in the dashboard, rather than
/// a charge that may be gone being taken for one that stands.
pub fn disputed_money_withdrawn(status: &str) -> bool {
    !matches!(
        status,
        "won" | "warning_needs_response" | "warning_under_review" | "warning_closed"
    )
}

/// `created` is in seconds: below 10^10 until the year 2286.
const RANK_STEP: i64 = 10_000_000_000;

#[derive(Deserialize)]
struct Envelope {
    id: String,
    #[serde(rename = "type")]
    kind: String,
    created: i64,
    data: Data,
}

#[derive(Deserialize)]
struct Data {
    object: Value,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StripeEvent {
    /// `evt_…`: the dedupe key.
    pub id: String,
    pub kind: String,
    pub payload: Payload,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Payload {
    /// A PaymentIntent of pagos' (it carries `metadata.pagos_reference`).
    Charge { charge: Charge, sequence: i64 },
    /// A dispute of the charge of PaymentIntent `payment_intent`, whose reference (and
    /// whether it is pagos' at all) only Stripe can say: the PaymentIntent is asked for,
    /// and reported as a charge declined as charged back while `withdrawn`, as it stands
    /// otherwise. `sequence` orders the report with the PaymentIntent's own events: a
    /// later dispute event outranks the `succeeded` one before it, and a dispute won
    /// after it was opened outranks the opening.
    Dispute {
        dispute: String,
        payment_intent: String,
        status: String,
        withdrawn: bool,
        created: i64,
    },
    /// Nothing for pagos to do, and why (for the logs).
    Ignored(&'static str),
}

/// The ordering key of a PaymentIntent's state as reported by an event created at
/// `created` (unix seconds).
pub fn sequence(status: ChargeStatus, created: i64) -> i64 {
    let rank = match status {
        ChargeStatus::Pending => 1,
        ChargeStatus::Succeeded | ChargeStatus::Declined => 2,
    };
    rank * RANK_STEP + created.clamp(0, RANK_STEP - 1)
}

/// The charge a dispute reports, from its PaymentIntent as Stripe holds it now (Stripe
/// keeps a disputed PaymentIntent `succeeded`): declined as charged back, code
/// `dispute_<status>`, while the money is `withdrawn`; otherwise as the PaymentIntent
/// stands (a dispute won: succeeded again, outranking the opening's report).
pub fn disputed_charge(
    pi: &PaymentIntent,
    status: &str,
    withdrawn: bool,
) -> Result<Charge, crate::gateway::GatewayError> {
    let mut charge = pi.to_charge(None)?;
    if withdrawn && charge.status == ChargeStatus::Succeeded {
        charge.status = ChargeStatus::Declined;
        charge.charged_back = true;
        charge.decline_code = Some(crate::gateway::decline_code(&format!("{DISPUTED}{status}")));
    }
    Ok(charge)
}

impl StripeEvent {
    pub fn parse(raw: &[u8]) -> Result<StripeEvent, EventError> {
        let envelope: Envelope = serde_json::from_slice(raw)
            .map_err(|e| EventError(format!("the body is not a Stripe event: {e}")))?;
        bounded("id", &envelope.id, MAX_ID_LEN)?;
        if envelope.created < 0 {
            return Err(EventError("`created` must not be negative".into()));
        }
        let kind: String = envelope.kind.chars().take(64).collect();
        if crate::gateway::stripe::REFUND_EVENTS.contains(&envelope.kind.as_str()) {
            // Read by `gateway::stripe::refund_event` first: here only when it had
            // nothing pagos acts on.
            return Ok(StripeEvent {
                id: envelope.id,
                kind,
                payload: Payload::Ignored(
                    "a refund pagos did not make, or in a status pagos does not know",
                ),
            });
        }
        if DISPUTE_EVENTS.contains(&envelope.kind.as_str()) {
            if envelope.data.object["object"]
                .as_str()
                .is_some_and(|object| object != "dispute")
            {
                return Err(EventError(format!(
                    "a {} event whose `data.object` is not a dispute",
                    envelope.kind
                )));
            }
            let dispute: Dispute = serde_json::from_value(envelope.data.object)
                .map_err(|e| EventError(format!("`data.object` is not a Dispute: {e}")))?;
            bounded("data.object.id", &dispute.id, MAX_ID_LEN)?;
            let Some(payment_intent) = dispute.payment_intent else {
                return Ok(StripeEvent {
                    id: envelope.id,
                    kind,
                    payload: Payload::Ignored(
                        "a dispute of a charge without a PaymentIntent (never pagos')",
                    ),
                });
            };
            bounded("data.object.payment_intent", &payment_intent, MAX_ID_LEN)?;
            let status: String = dispute.status.chars().take(40).collect();
            return Ok(StripeEvent {
                id: envelope.id,
                kind,
                payload: Payload::Dispute {
                    dispute: dispute.id,
                    payment_intent,
                    withdrawn: disputed_money_withdrawn(&status),
                    status,
                    created: envelope.created,
                },
            });
        }
        if !ACTED_ON.contains(&envelope.kind.as_str()) {
            return Ok(StripeEvent {
                id: envelope.id,
                kind,
                payload: Payload::Ignored("an event type pagos does not act on"),
            });
        }
        let pi: PaymentIntent = serde_json::from_value(envelope.data.object)
            .map_err(|e| EventError(format!("`data.object` is not a PaymentIntent: {e}")))?;
        bounded("data.object.id", &pi.id, MAX_ID_LEN)?;
        if pi.reference().is_none() {
            return Ok(StripeEvent {
                id: envelope.id,
                kind,
                payload: Payload::Ignored(
                    "a PaymentIntent pagos did not make (no pagos_reference)",
                ),
            });
        }
        if status_of(&pi.status).is_none() {
            // Signed and Stripe's: refusing it would only make Stripe send it again for
            // days. It says nothing pagos can act on; the reconciler asks Stripe about a
            // payment in flight.
            tracing::warn!(
                event_id = %envelope.id,
                payment_intent = %pi.id,
                status = %pi.status.chars().take(40).collect::<String>(),
                "PaymentIntent status pagos does not know"
            );
            return Ok(StripeEvent {
                id: envelope.id,
                kind,
                payload: Payload::Ignored("a PaymentIntent status pagos does not know"),
            });
        }
        let charge = pi
            .to_charge(None)
            .map_err(|e| EventError(format!("`data.object`: {e}")))?;
        let mut charge = charge;
        reference("metadata.pagos_reference", &mut charge.reference)?;
        bounded("data.object.currency", &charge.currency, 16)?;
        if let Some(code) = &charge.decline_code {
            bounded("decline code", code, 100)?;
        }
        Ok(StripeEvent {
            id: envelope.id,
            kind,
            payload: Payload::Charge {
                sequence: sequence(charge.status, envelope.created),
                charge,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn event(kind: &str, status: &str, created: i64, metadata: Value) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "id": "evt_1NG8Du2eZvKYlo2CUI79vXWy", "object": "event", "type": kind,
            "created": created, "livemode": false, "api_version": "2024-06-20",
            "data": {"object": {
                "id": "pi_3MtwBwLkdIwHu7ix28a3tqPa", "object": "payment_intent",
                "status": status, "amount": 250000, "currency": "cop", "created": created,
                "metadata": metadata,
            }},
        }))
        .expect("json")
    }

    fn ours() -> Value {
        json!({"pagos_reference": "01a236bf-3ba3-730c-b454-685f40f9d62b"})
    }

    #[test]
    fn a_succeeded_event_is_a_charge_of_ours() {
        let parsed = StripeEvent::parse(&event(
            "payment_intent.succeeded",
            "succeeded",
            1_700_000_000,
            ours(),
        ))
        .expect("valid");
        match parsed.payload {
            Payload::Charge { charge, sequence } => {
                assert_eq!(charge.status, ChargeStatus::Succeeded);
                assert_eq!(charge.reference, "01a236bf-3ba3-730c-b454-685f40f9d62b");
                assert_eq!(charge.amount, 250_000);
                assert_eq!(sequence, 2 * RANK_STEP + 1_700_000_000);
            }
            other => panic!("not a charge: {other:?}"),
        }
    }

    #[test]
    fn a_final_state_outranks_any_pending_one_and_later_breaks_ties() {
        let final_early = sequence(ChargeStatus::Succeeded, 1_000);
        let pending_late = sequence(ChargeStatus::Pending, 9_999_999_999);
        assert!(final_early > pending_late);
        assert!(sequence(ChargeStatus::Declined, 2_000) > sequence(ChargeStatus::Succeeded, 1_000));
    }

    #[test]
    fn other_types_and_other_peoples_intents_are_ignored() {
        for raw in [
            event(
                "payment_intent.created",
                "requires_payment_method",
                1,
                ours(),
            ),
            event("charge.refunded", "succeeded", 1, ours()),
            event("payment_intent.succeeded", "succeeded", 1, json!({})),
        ] {
            assert!(matches!(
                StripeEvent::parse(&raw).expect("valid").payload,
                Payload::Ignored(_)
            ));
        }
    }

    fn dispute(status: &str, payment_intent: Value) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "id": "evt_1QdsPvJvEtkwdCNY0Y8pD2kq", "object": "event",
            "type": "charge.dispute.created", "created": 1_764_766_860,
            "data": {"object": {
                "id": "dp_1QdsPuJvEtkwdCNYr9Tq4X3m", "object": "dispute", "amount": 250000,
                "currency": "cop", "charge": "ch_3MtwBwLkdIwHu7ix2gE3ukLd",
                "payment_intent": payment_intent, "status": status,
            }},
        }))
        .expect("json")
    }

    #[test]
    fn a_dispute_names_its_payment_intent_and_whether_the_money_was_withdrawn() {
        for (status, withdrawn) in [
            ("needs_response", true),
            ("under_review", true),
            ("lost", true),
            ("a_status_stripe_adds_later", true),
            ("won", false),
            ("warning_needs_response", false),
            ("warning_closed", false),
            ("prevented", true),
        ] {
            let parsed = StripeEvent::parse(&dispute(status, json!("pi_3MtwBwLkdIwHu7ix28a3tqPa")))
                .expect("valid");
            match parsed.payload {
                Payload::Dispute {
                    payment_intent,
                    withdrawn: said,
                    created,
                    ..
                } => {
                    assert_eq!(payment_intent, "pi_3MtwBwLkdIwHu7ix28a3tqPa");
                    assert_eq!(said, withdrawn, "{status}");
                    assert_eq!(created, 1_764_766_860);
                }
                other => panic!("{status}: not a dispute: {other:?}"),
            }
        }
        assert!(matches!(
            StripeEvent::parse(&dispute("lost", Value::Null))
                .expect("valid")
                .payload,
            Payload::Ignored(_)
        ));
    }

    #[test]
    fn a_dispute_with_the_money_withdrawn_reports_the_succeeded_charge_declined_as_charged_back() {
        let pi: PaymentIntent = serde_json::from_value(json!({
            "id": "pi_3MtwBwLkdIwHu7ix28a3tqPa", "status": "succeeded", "amount": 250000,
            "currency": "cop", "metadata": ours(),
        }))
        .expect("intent");
        let lost = disputed_charge(&pi, "lost", true).expect("read");
        assert_eq!(lost.status, ChargeStatus::Declined);
        assert!(lost.charged_back());
        assert_eq!(lost.decline_code.as_deref(), Some("dispute_lost"));
        let won = disputed_charge(&pi, "won", false).expect("read");
        assert_eq!(won.status, ChargeStatus::Succeeded);
        assert!(!won.charged_back());
        assert!(
            sequence(won.status, 2) > sequence(lost.status, 1),
            "won later outranks"
        );
    }

    #[test]
    fn malformed_events_are_refused() {
        assert!(StripeEvent::parse(b"{}").is_err());
        // A status pagos does not know is Stripe's word all the same: acknowledged and
        // ignored (refused, Stripe would send it again for days to no end).
        assert!(matches!(
            StripeEvent::parse(&event("payment_intent.succeeded", "teleported", 1, ours()))
                .expect("read")
                .payload,
            Payload::Ignored(_)
        ));
        assert!(
            StripeEvent::parse(&event("payment_intent.succeeded", "succeeded", -1, ours()))
                .is_err()
        );
    }
}
