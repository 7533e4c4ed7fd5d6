//! What a charge event does to its payment. Pure: no I/O, no clock.
//!
//! Absolute operations: the event reports the state the charge is in, and the payment is
//! set to match it through the transition function — never "advanced one step". So an
//! event applied twice, or after another that already said the same, changes nothing.
//!
//! The table, by payment state (rows) and reported charge status (columns):
//!
//! | payment         | succeeded                   | declined                 | pending |
//! | --------------- | --------------------------- | ------------------------ | ------- |
//! | EN_PROCESO      | REVISION_MANUAL (never sent, yet charged) | keep       | keep    |
//! | ENVIADA         | COMPLETADA                  | FALLIDA (charged back: REVISION_MANUAL; declined as a duplicate: keep) | keep |
//! | COMPLETADA      | keep                        | REVISION_MANUAL          | keep    |
//! | FALLIDA         | REVISION_MANUAL             | keep                     | keep    |
//! | REVISION_MANUAL | keep: on-call owns it       | keep                     | keep    |
//!
//! COMPLETADA + declined because the money went back (Mercado Pago's `refunded`) is pagos'
//! own refund when its refunds of the charge cover what went back (`refunded_by_pagos`):
//! the consumer keeps the payment COMPLETADA before asking this table.
//!
//! FALLIDA + succeeded is an orphan charge: with `PAGOS_ORPHAN_CHARGES=refund` (the
//! default) the consumer refunds it in full before asking this table
//! (`saga::refund::compensate_in`) and the payment stays FALLIDA; the table's answer,
//! REVISION_MANUAL, is `review`'s.
//!
//! A charge that is not the payment's own (another charge id than the one recorded, or
//! another amount or currency) never settles it: if it succeeded, money was taken that
//! does not match, and the payment goes to REVISION_MANUAL; so does one charged back (it
//! took the money before its payer disputed it); if it is otherwise declined, or pending,
//! no money moved and nothing changes.

use crate::entities::payment;
use crate::gateway::{Charge, ChargeStatus};
use crate::saga::state::{Event, PaymentState};
use crate::saga::store::Changes;
use crate::webhooks::event::status_name;

/// What an event does to its payment.
#[derive(Clone, Debug)]
pub enum Effect {
    /// Apply `event` to the payment; `reason` goes to the audit trail.
    Move {
        event: Event,
        changes: Changes,
        reason: String,
    },
    /// The payment already says what the event says, or the event cannot change it.
    Keep(&'static str),
}

pub fn decide(p: &payment::Model, charge: &Charge, event_id: &str) -> Effect {
    use ChargeStatus::*;
    use PaymentState::*;
    let state = p.state;
    let said = describe(charge, event_id);

    let foreign_charge = p.gateway_ref.as_deref().is_some_and(|r| r != charge.id);
    let other_amount = charge.amount != p.amount || charge.currency != p.currency;
    if foreign_charge || other_amount {
        // A second charge charged back took the money before its payer disputed it: not
        // "no money moved" (the seller keeps it if the dispute goes its way).
        if charge.status != Succeeded && !charge.charged_back() {
            return Effect::Keep("a charge that is not this payment's, and no money moved");
        }
        let why = if foreign_charge {
            format!(
                "{said}, but the payment's charge is {}: a second charge",
                p.gateway_ref.as_deref().unwrap_or("-")
            )
        } else {
            format!(
                "{said} for {} {}, but the payment is for {} {}",
                charge.amount, charge.currency, p.amount, p.currency
            )
        };
        return match state {
            EnProceso | Enviada => escalate(Event::Escalate, why),
            Completada | Fallida => escalate(Event::Contradicted, format!("{why}; was {state}")),
            RevisionManual => Effect::Keep("under review: on-call decides"),
        };
    }

    match (state, charge.status) {
        (_, Pending) => Effect::Keep("the charge is still pending"),
        (Enviada, Succeeded) => Effect::Move {
            event: Event::Charged,
            changes: Changes {
                gateway_ref: Some(charge.id.clone()),
                ..Changes::default()
            },
            reason: said,
        },
        // Declined as a duplicate of a recent payment: the one it duplicates may be this
        // payment's own first charge, made by a send whose answer was lost under a key the
        // gateway has since forgotten. Not "no money taken": the reconciler looks it up.
        (Enviada, Declined) if charge.declined_as_duplicate() => Effect::Keep(
            "declined as a duplicate: the payment it duplicates may be this one's; the reconciler looks it up",
        ),
        // Taken, then disputed: not "no money taken".
        (Enviada, Declined) if charge.charged_back() => escalate(
            Event::Escalate,
            format!(
                "{said}: the charge took the money and the payer disputed it; on-call decides whether the money stands"
            ),
        ),
        (Enviada, Declined) => {
            let code = charge
                .decline_code
                .clone()
                .unwrap_or_else(|| "declined".into());
            Effect::Move {
                event: Event::Declined,
                changes: Changes {
                    gateway_ref: Some(charge.id.clone()),
                    decline_code: Some(code),
                    ..Changes::default()
                },
                reason: said,
            }
        }
        (Completada, Succeeded) | (Fallida, Declined) => {
            Effect::Keep("the payment already says so")
        }
        // The opposite of a final state: never flipped, on-call decides.
        (Completada, Declined) | (Fallida, Succeeded) => escalate(
            Event::Contradicted,
            format!("{said}, contradicting {state}"),
        ),
        // pagos marks a payment ENVIADA before it calls the gateway, so a charge for an
        // EN_PROCESO payment was not made by this payment's saga.
        (EnProceso, Succeeded) => escalate(
            Event::Escalate,
            format!("{said} for a payment pagos has not sent"),
        ),
        (EnProceso, Declined) => Effect::Keep("declined before pagos sent it: no money moved"),
        (RevisionManual, _) => Effect::Keep("under review: on-call decides"),
    }
}

/// Whether a charge reported returned (`returned`, minor units: Mercado Pago's
/// `refunded`) is pagos' own doing, so that its COMPLETADA payment stays COMPLETADA
/// (contract section 6: a refunded payment keeps its state): the payment's own charge, of
/// its amount and currency, and every unit that went back covered by pagos' refunds of
/// that charge that may have reached the provider (`covered`: COMPLETADO, and ENVIADO,
/// since the provider may tell before pagos records its refund's answer; never
/// EN_PROCESO, which no gateway call has carried yet). Anything beyond what pagos sent
/// went back some other way: the table above escalates it.
pub fn refunded_by_pagos(p: &payment::Model, charge: &Charge, returned: i64, covered: i64) -> bool {
    p.state == PaymentState::Completada
        && charge.status == ChargeStatus::Declined
        && p.gateway_ref.as_deref() == Some(charge.id.as_str())
        && charge.amount == p.amount
        && charge.currency == p.currency
        && returned > 0
        && returned <= covered
}

fn escalate(event: Event, reason: String) -> Effect {
    Effect::Move {
        event,
        changes: Changes::default(),
        reason,
    }
}

/// "webhook evt_1: charge ch_1 declined (card_declined)", for the audit trail.
fn describe(charge: &Charge, event_id: &str) -> String {
    let code = match (&charge.status, &charge.decline_code) {
        (ChargeStatus::Declined, Some(code)) => format!(" ({code})"),
        _ => String::new(),
    };
    format!(
        "webhook {event_id}: charge {} {}{code}",
        charge.id,
        status_name(charge.status)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::saga::state::transition;
    use chrono::Utc;
    use uuid::Uuid;

    fn payment(state: PaymentState, gateway_ref: Option<&str>) -> payment::Model {
        let at = Utc::now();
        payment::Model {
            id: Uuid::nil(),
            merchant_id: Uuid::nil(),
            idempotency_key: "k".into(),
            credit_id: "42".into(),
            amount: 250_000,
            currency: "COP".into(),
            description: None,
            payment_method: None,
            state,
            version: 3,
            attempts: 1,
            gateway_key: "gk".into(),
            gateway_ref: gateway_ref.map(str::to_owned),
            decline_code: None,
            next_attempt_at: at,
            created_at: at,
            updated_at: at,
            generation: 0,
            claimed_until: None,
            last_error: None,
            last_error_at: None,
        }
    }

    fn charge(status: ChargeStatus) -> Charge {
        Charge {
            id: "ch_1".into(),
            status,
            amount: 250_000,
            currency: "COP".into(),
            reference: Uuid::nil().to_string(),
            decline_code: (status == ChargeStatus::Declined).then(|| "card_declined".into()),
            charged_back: false,
        }
    }

    /// Where the decision takes the payment (its own state when kept).
    fn lands(state: PaymentState, gateway_ref: Option<&str>, c: &Charge) -> PaymentState {
        match decide(&payment(state, gateway_ref), c, "evt_1") {
            Effect::Keep(_) => state,
            Effect::Move { event, .. } => {
                transition(state, event).expect("the decision is a legal transition")
            }
        }
    }

    #[test]
    fn the_table_in_the_module_comment_holds() {
        use ChargeStatus::*;
        use PaymentState::*;
        let table = [
            (EnProceso, [RevisionManual, EnProceso, EnProceso]),
            (Enviada, [Completada, Fallida, Enviada]),
            (Completada, [Completada, RevisionManual, Completada]),
            (Fallida, [RevisionManual, Fallida, Fallida]),
            (
                RevisionManual,
                [RevisionManual, RevisionManual, RevisionManual],
            ),
        ];
        for (state, row) in table {
            for (status, to) in [Succeeded, Declined, Pending].into_iter().zip(row) {
                for gateway_ref in [None, Some("ch_1")] {
                    assert_eq!(
                        lands(state, gateway_ref, &charge(status)),
                        to,
                        "{state} + {status:?} (gateway_ref {gateway_ref:?})"
                    );
                }
            }
        }
    }

    #[test]
    fn a_decline_as_a_duplicate_never_answers_a_sent_payment_failed() {
        use PaymentState::*;
        for code in ["cc_rejected_duplicated_payment", "duplicate_transaction"] {
            let mut duplicate = charge(ChargeStatus::Declined);
            duplicate.decline_code = Some(code.into());
            assert_eq!(lands(Enviada, None, &duplicate), Enviada, "{code}");
        }
    }

    #[test]
    fn a_second_charge_charged_back_took_the_money_and_goes_to_on_call() {
        use PaymentState::*;
        let mut second = charge(ChargeStatus::Declined);
        second.id = "ch_2".into();
        assert_eq!(
            lands(Completada, Some("ch_1"), &second),
            Completada,
            "declined: no money moved"
        );
        second.charged_back = true;
        for (state, to) in [
            (Enviada, RevisionManual),
            (Completada, RevisionManual),
            (Fallida, RevisionManual),
            (RevisionManual, RevisionManual),
        ] {
            assert_eq!(lands(state, Some("ch_1"), &second), to, "{state}");
        }
        let Effect::Move { reason, .. } =
            decide(&payment(Completada, Some("ch_1")), &second, "evt_3")
        else {
            panic!("a move");
        };
        assert!(reason.contains("a second charge"), "{reason}");
    }

    #[test]
    fn a_settling_event_records_the_charge_and_the_decline_code() {
        let p = payment(PaymentState::Enviada, None);
        match decide(&p, &charge(ChargeStatus::Declined), "evt_9") {
            Effect::Move {
                event,
                changes,
                reason,
            } => {
                assert_eq!(event, Event::Declined);
                assert_eq!(changes.gateway_ref.as_deref(), Some("ch_1"));
                assert_eq!(changes.decline_code.as_deref(), Some("card_declined"));
                assert_eq!(
                    reason,
                    "webhook evt_9: charge ch_1 declined (card_declined)"
                );
            }
            other => panic!("expected a move, got {other:?}"),
        }
    }

    #[test]
    fn a_contradiction_names_the_event_and_the_state_it_contradicts() {
        let p = payment(PaymentState::Completada, Some("ch_1"));
        match decide(&p, &charge(ChargeStatus::Declined), "evt_7") {
            Effect::Move { event, reason, .. } => {
                assert_eq!(event, Event::Contradicted);
                assert!(reason.contains("evt_7"), "{reason}");
                assert!(reason.contains("COMPLETADA"), "{reason}");
            }
            other => panic!("expected a move, got {other:?}"),
        }
    }

    #[test]
    fn money_returned_is_pagos_own_only_when_its_refunds_cover_all_of_it() {
        use PaymentState::*;
        let mut returned = charge(ChargeStatus::Declined);
        returned.decline_code = Some("refunded".into());
        let own = payment(Completada, Some("ch_1"));
        assert!(refunded_by_pagos(&own, &returned, 250_000, 250_000));
        assert!(refunded_by_pagos(&own, &returned, 250_000, 300_000));
        assert!(
            !refunded_by_pagos(&own, &returned, 250_000, 249_999),
            "more went back than pagos asked for"
        );
        assert!(!refunded_by_pagos(&own, &returned, 250_000, 0));
        assert!(!refunded_by_pagos(&own, &returned, 0, 0));
        assert!(
            !refunded_by_pagos(&payment(Completada, Some("ch_0")), &returned, 1, 250_000),
            "another charge"
        );
        assert!(!refunded_by_pagos(
            &payment(Completada, None),
            &returned,
            1,
            250_000
        ));
        for state in [EnProceso, Enviada, Fallida, RevisionManual] {
            assert!(!refunded_by_pagos(
                &payment(state, Some("ch_1")),
                &returned,
                1,
                250_000
            ));
        }
        let mut other_amount = returned.clone();
        other_amount.amount = 1;
        assert!(!refunded_by_pagos(&own, &other_amount, 1, 250_000));
        assert!(!refunded_by_pagos(
            &own,
            &charge(ChargeStatus::Succeeded),
            1,
            250_000
        ));
    }

    #[test]
    fn a_second_charge_that_succeeded_sends_any_payment_to_review() {
        use PaymentState::*;
        let second = charge(ChargeStatus::Succeeded);
        for (state, to) in [
            (Enviada, RevisionManual),
            (Completada, RevisionManual),
            (Fallida, RevisionManual),
            (RevisionManual, RevisionManual),
        ] {
            assert_eq!(lands(state, Some("ch_0"), &second), to, "{state}");
        }
        // Declined or pending: no money moved, and the payment's own charge decides.
        for status in [ChargeStatus::Declined, ChargeStatus::Pending] {
            assert_eq!(lands(Enviada, Some("ch_0"), &charge(status)), Enviada);
        }
    }

    #[test]
    fn a_charge_for_another_amount_never_settles_the_payment() {
        let mut other = charge(ChargeStatus::Succeeded);
        other.amount = 1;
        assert_eq!(
            lands(PaymentState::Enviada, None, &other),
            PaymentState::RevisionManual
        );
        other.status = ChargeStatus::Declined;
        assert_eq!(
            lands(PaymentState::Enviada, None, &other),
            PaymentState::Enviada
        );
        let mut other_currency = charge(ChargeStatus::Succeeded);
        other_currency.currency = "USD".into();
        assert_eq!(
            lands(PaymentState::Completada, Some("ch_1"), &other_currency),
            PaymentState::RevisionManual
        );
    }
}
