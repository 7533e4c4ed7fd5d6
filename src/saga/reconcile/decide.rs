//! The reconciler's decision table (design.md), as a pure function of what pagos holds and
//! what the provider says. No I/O, no clock: `now` is an argument.
//!
//! Its one rule above the others: never resend once the gateway may have forgotten the
//! key, because then a resend could make a second charge.

use crate::gateway::{Charge, ChargeStatus, GatewayError};
use crate::saga::state::PaymentState;
use chrono::{DateTime, TimeDelta, Utc};

/// What the reconciler knows about one payment.
#[derive(Clone, Debug)]
pub struct Facts<'a> {
    pub state: PaymentState,
    pub created_at: DateTime<Utc>,
    pub now: DateTime<Utc>,
    /// The provider's answer to "what happened to this reference?" (None: not asked).
    pub lookup: Option<&'a Result<Vec<Charge>, GatewayError>>,
}

/// The horizons the decisions depend on.
#[derive(Clone, Copy, Debug)]
pub struct Horizons {
    /// How long the gateway honours a key.
    pub key_window: TimeDelta,
    /// Margin kept before the window ends: a resend must land well inside it.
    pub resend_margin: TimeDelta,
    /// Unresolved this long → REVISION_MANUAL.
    pub give_up_after: TimeDelta,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Never sent (EN_PROCESO), or sent with no charge at the provider inside its key
    /// window: send with the same gateway key.
    Send,
    Settle(Charge),
    /// Ask again later.
    Reschedule(String),
    /// Nothing can be decided without risking a second charge: on-call decides.
    Escalate(String),
    /// Not the reconciler's to touch (final, or under review).
    Skip,
}

/// Does the payment need the provider's answer before deciding?
pub fn needs_lookup(state: PaymentState) -> bool {
    state == PaymentState::Enviada
}

pub fn decide(facts: &Facts<'_>, horizons: &Horizons) -> Decision {
    let age = facts.now - facts.created_at;
    match facts.state {
        // Never sent: sending is safe, but charging a customer days after they paid is
        // a decision for a person.
        PaymentState::EnProceso if age > horizons.give_up_after => Decision::Escalate(format!(
            "never sent, and registered {} ago: sending now would charge the customer late",
            human(age)
        )),
        PaymentState::EnProceso => Decision::Send,
        PaymentState::Enviada => match facts.lookup {
            None => Decision::Reschedule("the provider was not asked".into()),
            Some(Err(err)) if age > horizons.give_up_after => Decision::Escalate(format!(
                "unresolved {} after it was registered and the provider cannot be asked (last error: {err})",
                human(age)
            )),
            Some(Err(err)) => Decision::Reschedule(format!("provider lookup failed: {err}")),
            Some(Ok(charges)) => decide_on_charges(charges, age, horizons),
        },
        PaymentState::Completada | PaymentState::Fallida | PaymentState::RevisionManual => {
            Decision::Skip
        }
    }
}

fn decide_on_charges(charges: &[Charge], age: TimeDelta, horizons: &Horizons) -> Decision {
    if charges.len() > 1 {
        let ids: Vec<&str> = charges.iter().map(|c| c.id.as_str()).collect();
        return Decision::Escalate(format!(
            "the provider holds {} charges for this one payment ({}): refund all but one",
            charges.len(),
            ids.join(", ")
        ));
    }
    let Some(charge) = charges.first() else {
        return if age + horizons.resend_margin < horizons.key_window {
            Decision::Send
        } else {
            Decision::Escalate(format!(
                "no charge at the provider and the gateway's key window ({}) has passed: a resend could charge twice",
                human(horizons.key_window)
            ))
        };
    };
    match charge.status {
        ChargeStatus::Succeeded | ChargeStatus::Declined => Decision::Settle(charge.clone()),
        ChargeStatus::Pending if age > horizons.give_up_after => Decision::Escalate(format!(
            "charge {} still pending after {}",
            charge.id,
            human(age)
        )),
        ChargeStatus::Pending => {
            Decision::Reschedule(format!("charge {} is pending at the provider", charge.id))
        }
    }
}

fn human(d: TimeDelta) -> String {
    let secs = u64::try_from(d.num_seconds()).unwrap_or(0);
    humantime::format_duration(std::time::Duration::from_secs(secs)).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn horizons() -> Horizons {
        Horizons {
            key_window: TimeDelta::hours(24),
            resend_margin: TimeDelta::minutes(1),
            give_up_after: TimeDelta::hours(24),
        }
    }

    fn charge(status: ChargeStatus) -> Charge {
        Charge {
            id: "ch_1".into(),
            status,
            amount: 100,
            currency: "COP".into(),
            reference: "r".into(),
            decline_code: None,
        }
    }

    fn decide_at(
        state: PaymentState,
        age: TimeDelta,
        lookup: Option<Result<Vec<Charge>, GatewayError>>,
    ) -> Decision {
        let now = Utc::now();
        decide(
            &Facts {
                state,
                created_at: now - age,
                now,
                lookup: lookup.as_ref(),
            },
            &horizons(),
        )
    }

    #[test]
    fn a_payment_never_sent_is_sent_until_the_horizon() {
        assert!(matches!(
            decide_at(PaymentState::EnProceso, TimeDelta::hours(30), None),
            Decision::Escalate(ref why) if why.contains("never sent")
        ));
        assert_eq!(
            decide_at(PaymentState::EnProceso, TimeDelta::hours(3), None),
            Decision::Send
        );
    }

    #[test]
    fn a_final_charge_settles_the_payment() {
        for status in [ChargeStatus::Succeeded, ChargeStatus::Declined] {
            let decided = decide_at(
                PaymentState::Enviada,
                TimeDelta::minutes(5),
                Some(Ok(vec![charge(status)])),
            );
            assert_eq!(decided, Decision::Settle(charge(status)));
        }
    }

    #[test]
    fn a_pending_charge_is_looked_at_again_until_the_horizon() {
        let pending = || Some(Ok(vec![charge(ChargeStatus::Pending)]));
        assert!(matches!(
            decide_at(PaymentState::Enviada, TimeDelta::hours(1), pending()),
            Decision::Reschedule(_)
        ));
        assert!(matches!(
            decide_at(PaymentState::Enviada, TimeDelta::hours(25), pending()),
            Decision::Escalate(_)
        ));
    }

    #[test]
    fn no_charge_inside_the_key_window_is_resent_with_the_same_key() {
        assert_eq!(
            decide_at(PaymentState::Enviada, TimeDelta::hours(2), Some(Ok(vec![]))),
            Decision::Send
        );
    }

    #[test]
    fn no_charge_outside_the_key_window_is_never_resent() {
        let decided = decide_at(
            PaymentState::Enviada,
            TimeDelta::hours(24),
            Some(Ok(vec![])),
        );
        assert!(
            matches!(decided, Decision::Escalate(ref why) if why.contains("key window")),
            "{decided:?}"
        );
        // The margin: a minute before the window ends is already too late.
        let decided = decide_at(
            PaymentState::Enviada,
            TimeDelta::hours(24) - TimeDelta::seconds(30),
            Some(Ok(vec![])),
        );
        assert!(matches!(decided, Decision::Escalate(_)));
    }

    #[test]
    fn a_failed_lookup_is_retried_until_the_give_up_horizon() {
        let failed = || Some(Err(GatewayError::Unknown("timed out".into())));
        assert!(matches!(
            decide_at(PaymentState::Enviada, TimeDelta::hours(1), failed()),
            Decision::Reschedule(_)
        ));
        assert!(matches!(
            decide_at(PaymentState::Enviada, TimeDelta::hours(25), failed()),
            Decision::Escalate(_)
        ));
    }

    #[test]
    fn two_charges_for_one_payment_go_to_on_call() {
        let two = Some(Ok(vec![
            charge(ChargeStatus::Succeeded),
            charge(ChargeStatus::Succeeded),
        ]));
        assert!(matches!(
            decide_at(PaymentState::Enviada, TimeDelta::minutes(1), two),
            Decision::Escalate(_)
        ));
    }

    #[test]
    fn final_and_reviewed_payments_are_not_touched() {
        for state in [
            PaymentState::Completada,
            PaymentState::Fallida,
            PaymentState::RevisionManual,
        ] {
            assert_eq!(
                decide_at(state, TimeDelta::hours(1), Some(Ok(vec![]))),
                Decision::Skip
            );
        }
    }
}
