//! The reconciler's decision table (design.md), as a pure function of what pagos holds and
//! what the provider says. No I/O, no clock: `now` is an argument.
//!
//! Its one rule above the others: never resend once the gateway may have forgotten the
//! key, because then a resend could make a second charge.

use crate::gateway::{Charge, ChargeStatus, GatewayError};
use crate::saga::state::{PaymentState, SagaState};
use chrono::{DateTime, TimeDelta, Utc};

/// What the reconciler knows about one payment (`S`: its state, the default) or one
/// refund (`S`: a refund's state).
#[derive(Clone, Debug)]
pub struct Facts<'a, S: Reconciled = PaymentState> {
    pub state: S,
    pub created_at: DateTime<Utc>,
    pub now: DateTime<Utc>,
    /// The provider's answer to "what happened to this reference?" (None: not asked).
    pub lookup: Option<&'a Result<Vec<S::Held>, GatewayError>>,
    /// The provider's id for it that an answer gave before (a pending answer, a send
    /// handed over): the provider made it, whatever its search shows now.
    pub named: Option<&'a str>,
}

/// What a pass did with one payment or refund: one bucket of its report (and, for a
/// payment, one metric label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Handled {
    Completed,
    Failed,
    Resent,
    Rescheduled,
    ManualReview,
    Error,
    Skipped,
}

/// What a pass did with the payments (or refunds) it examined: each examined one is
/// counted in exactly one of the other fields (contract section 3).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Tally {
    pub examinados: u64,
    /// Settled COMPLETADA (COMPLETADO) in this pass, by the provider's answer or by a send.
    pub completados: u64,
    /// Settled FALLIDA (FALLIDO) in this pass.
    pub fallidos: u64,
    /// Sent (or sent again, same key) and the answer is not final yet.
    pub reenviados: u64,
    /// Provider pending, or could not be asked: looked at again later.
    pub pendientes: u64,
    /// Moved to REVISION_MANUAL: on-call decides.
    pub revision_manual: u64,
    /// Could not be processed (database errors); retried on a later pass.
    pub errores: u64,
    /// Moved by someone else meanwhile, or not the reconciler's to touch.
    pub omitidos: u64,
}

impl Tally {
    pub fn is_empty(&self) -> bool {
        self.examinados == 0
    }

    /// Counts one examined payment or refund in its bucket.
    pub fn add(&mut self, handled: Handled) {
        self.examinados += 1;
        *match handled {
            Handled::Completed => &mut self.completados,
            Handled::Failed => &mut self.fallidos,
            Handled::Resent => &mut self.reenviados,
            Handled::Rescheduled => &mut self.pendientes,
            Handled::ManualReview => &mut self.revision_manual,
            Handled::Error => &mut self.errores,
            Handled::Skipped => &mut self.omitidos,
        } += 1;
    }
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

/// What to do with one payment (`T`: the charge the provider holds, the default) or one
/// refund (`T`: the provider's refund).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision<T = Charge> {
    /// Never sent (EN_PROCESO), or sent with nothing at the provider inside its key
    /// window: send with the same gateway key.
    Send,
    Settle(T),
    /// Ask again later.
    Reschedule(String),
    /// Nothing can be decided without risking a second charge (or refund): on-call
    /// decides.
    Escalate(String),
    /// Not the reconciler's to touch (final, or under review).
    Skip,
}

/// Where a payment or a refund stands, as the table reads its state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Registered, never sent (EN_PROCESO).
    NeverSent,
    /// Sent: only the provider can tell what came of it.
    Sent,
    /// Final, or under review.
    Left,
}

/// What the provider holds for a payment (a charge) or a refund (a refund).
pub trait Held: Clone {
    /// Its id at the provider.
    fn id(&self) -> &str;
    /// Not final yet at the provider.
    fn is_pending(&self) -> bool;
    /// Final, and moved no money (a charge declined and not charged back): beside one that
    /// did, or may yet, it says nothing of the row.
    fn moved_nothing(&self) -> bool {
        false
    }
    /// Final, but what it says of the row cannot be told (a charge declined as a duplicate
    /// of a recent payment: the payment it duplicates may be the row's own, made by a send
    /// whose answer was lost): waited on like a pending one.
    fn says_nothing_alone(&self) -> bool {
        false
    }
}

impl Held for Charge {
    fn id(&self) -> &str {
        &self.id
    }

    fn is_pending(&self) -> bool {
        self.status == ChargeStatus::Pending
    }

    fn moved_nothing(&self) -> bool {
        self.status == ChargeStatus::Declined && !self.charged_back()
    }

    fn says_nothing_alone(&self) -> bool {
        self.declined_as_duplicate()
    }
}

/// The state of what the table decides on: a payment's, or a refund's.
pub trait Reconciled: SagaState {
    /// What the provider holds for one.
    type Held: Held + Send + Sync;
    /// How the table's reasons name it.
    const WORDS: Words;

    /// Where it stands: never sent, sent, or neither (final, or under review).
    fn stage(self) -> Stage {
        if self == Self::NEVER_SENT {
            Stage::NeverSent
        } else if self == Self::SENT {
            Stage::Sent
        } else {
            Stage::Left
        }
    }
}

/// The words of the table's reasons that name what is reconciled.
#[derive(Clone, Copy, Debug)]
pub struct Words {
    /// What the provider holds for one: `charge`, `refund`.
    pub held: &'static str,
    /// Several of them: `charges`, `refunds`.
    pub held_plural: &'static str,
    /// What is reconciled: `payment`, `refund`.
    pub reconciled: &'static str,
    /// Before `never sent` and `unresolved`: empty, or `refund `.
    pub subject: &'static str,
    /// After `never sent, and registered … ago`.
    pub never_sent_late: &'static str,
    /// After the provider's several ids.
    pub several_advice: &'static str,
}

impl Reconciled for PaymentState {
    type Held = Charge;
    const WORDS: Words = Words {
        held: "charge",
        held_plural: "charges",
        reconciled: "payment",
        subject: "",
        never_sent_late: ": sending now would charge the customer late",
        several_advice: ": refund all but one",
    };
}

/// Does the payment (or refund) need the provider's answer before deciding?
pub fn needs_lookup<S: Reconciled>(state: S) -> bool {
    state.stage() == Stage::Sent
}

pub fn decide<S: Reconciled>(facts: &Facts<'_, S>, horizons: &Horizons) -> Decision<S::Held> {
    let age = facts.now - facts.created_at;
    let words = S::WORDS;
    let subject = words.subject;
    match facts.state.stage() {
        // Never sent, as pagos' records say. Inside the gateway's key window a send is
        // safe whatever they say: a send they lost (a database restored from before it,
        // a failover that lost its last commits) is answered from the gateway's memory
        // of the key, not charged again. Past it nothing guards a send the records lost:
        // a person decides. And charging a customer days after they paid is a decision
        // for a person too.
        Stage::NeverSent if age + horizons.resend_margin >= horizons.key_window => {
            Decision::Escalate(format!(
                "{subject}never sent as pagos' records say, registered {} ago, past the gateway's key window ({}): a send the records lost (a database restored from before it) is no longer remembered by the gateway, so sending now could {} twice{}",
                human(age),
                human(horizons.key_window),
                words.held,
                if age > horizons.give_up_after {
                    words.never_sent_late
                } else {
                    ""
                }
            ))
        }
        Stage::NeverSent if age > horizons.give_up_after => Decision::Escalate(format!(
            "{subject}never sent, and registered {} ago{}",
            human(age),
            words.never_sent_late
        )),
        Stage::NeverSent => Decision::Send,
        Stage::Sent => match facts.lookup {
            None => Decision::Reschedule("the provider was not asked".into()),
            Some(Err(err)) if age > horizons.give_up_after => Decision::Escalate(format!(
                "{subject}unresolved {} after it was registered and the provider cannot be asked (last error: {err})",
                human(age)
            )),
            Some(Err(err)) => Decision::Reschedule(format!("provider lookup failed: {err}")),
            Some(Ok(found)) => decide_on_found(found, age, horizons, words, facts.named),
        },
        Stage::Left => Decision::Skip,
    }
}

fn decide_on_found<T: Held>(
    found: &[T],
    age: TimeDelta,
    horizons: &Horizons,
    words: Words,
    named: Option<&str>,
) -> Decision<T> {
    let held = words.held;
    // Declines beside a charge that took, or may take, the money (a first try's charge
    // approved, a resend declined as its duplicate): the payment is that charge's.
    let standing: Vec<T> = found
        .iter()
        .filter(|h| !h.moved_nothing())
        .cloned()
        .collect();
    let found = if standing.is_empty() || standing.len() == found.len() {
        found
    } else {
        standing.as_slice()
    };
    if found.len() > 1 {
        let ids: Vec<&str> = found.iter().map(Held::id).collect();
        return Decision::Escalate(format!(
            "the provider holds {} {} for this one {} ({}){}",
            found.len(),
            words.held_plural,
            words.reconciled,
            ids.join(", "),
            words.several_advice
        ));
    }
    let Some(one) = found.first() else {
        // The provider named it before: it was made, and a search that does not show it
        // is behind (a search index). A resend would be answered from the key's memory,
        // or, by a provider that forgot the key, made a second time: never sent again.
        if let Some(named) = named {
            return if age > horizons.give_up_after {
                Decision::Escalate(format!(
                    "the provider named {held} {named} for this {} before, and its search still does not show it after {}: on-call decides",
                    words.reconciled,
                    human(age)
                ))
            } else {
                Decision::Reschedule(format!(
                    "the provider named {held} {named} before, and its search does not show it yet: not sent again"
                ))
            };
        }
        return if age > horizons.give_up_after {
            // Resending with the same key could go on until the key window ends (days, for
            // a gateway that keeps keys that long): unresolved this long is on-call's.
            Decision::Escalate(format!(
                "no {held} at the provider after {} of sends with the same key (PAGOS_GIVE_UP_AFTER): on-call decides",
                human(age)
            ))
        } else if age + horizons.resend_margin < horizons.key_window {
            Decision::Send
        } else {
            Decision::Escalate(format!(
                "no {held} at the provider and the gateway's key window ({}) has passed: a resend could {held} twice",
                human(horizons.key_window)
            ))
        };
    };
    if one.says_nothing_alone() {
        return if age > horizons.give_up_after {
            Decision::Escalate(format!(
                "the provider shows only {held} {}, declined as a duplicate of a recent payment, after {}: the payment it duplicates may be this one's own, made by a send whose answer was lost (its search may not show it yet); on-call decides",
                one.id(),
                human(age)
            ))
        } else {
            Decision::Reschedule(format!(
                "{held} {} was declined as a duplicate of a recent payment: the one it duplicates may be this one's, not shown yet",
                one.id()
            ))
        };
    }
    if !one.is_pending() {
        Decision::Settle(one.clone())
    } else if age > horizons.give_up_after {
        Decision::Escalate(format!(
            "{held} {} still pending after {}",
            one.id(),
            human(age)
        ))
    } else {
        Decision::Reschedule(format!("{held} {} is pending at the provider", one.id()))
    }
}

fn human(d: TimeDelta) -> String {
    let secs = u64::try_from(d.num_seconds()).unwrap_or(0);
    humantime::format_duration(std::time::Duration::from_secs(secs)).to_string()
}

/// What the table decides (in tests, with a day's key window and give-up horizon) for
/// something in `state`, registered `age` ago, given what the provider said (`lookup`).
#[cfg(test)]
pub(crate) fn decide_at<S: Reconciled>(
    state: S,
    age: TimeDelta,
    lookup: Option<Result<Vec<S::Held>, GatewayError>>,
) -> Decision<S::Held> {
    decide_named_at(state, age, lookup, None)
}

/// The same, for something the provider named `named` before.
#[cfg(test)]
pub(crate) fn decide_named_at<S: Reconciled>(
    state: S,
    age: TimeDelta,
    lookup: Option<Result<Vec<S::Held>, GatewayError>>,
    named: Option<&str>,
) -> Decision<S::Held> {
    let now = Utc::now();
    decide(
        &Facts {
            state,
            created_at: now - age,
            now,
            lookup: lookup.as_ref(),
            named,
        },
        &Horizons {
            key_window: TimeDelta::hours(24),
            resend_margin: TimeDelta::minutes(1),
            give_up_after: TimeDelta::hours(24),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn charge(status: ChargeStatus) -> Charge {
        Charge {
            id: "ch_1".into(),
            status,
            amount: 100,
            currency: "COP".into(),
            reference: "r".into(),
            decline_code: None,
            charged_back: false,
        }
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

    /// A restored database may have forgotten that a payment was sent: past the key
    /// window a send is never made on its records' word.
    #[test]
    fn a_payment_never_sent_past_the_key_window_goes_to_on_call_not_to_the_gateway() {
        let now = Utc::now();
        let horizons = Horizons {
            key_window: TimeDelta::hours(1),
            resend_margin: TimeDelta::minutes(1),
            give_up_after: TimeDelta::hours(24),
        };
        let at = |age: TimeDelta| {
            decide(
                &Facts {
                    state: PaymentState::EnProceso,
                    created_at: now - age,
                    now,
                    lookup: None,
                    named: None,
                },
                &horizons,
            )
        };
        assert_eq!(at(TimeDelta::minutes(58)), Decision::Send);
        for age in [TimeDelta::minutes(59), TimeDelta::hours(2)] {
            let decided = at(age);
            assert!(
                matches!(decided, Decision::Escalate(ref why) if why.contains("key window") && why.contains("charge twice")),
                "{age}: {decided:?}"
            );
        }
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

    /// A charge the provider named before (its pending answer) that its search does not
    /// show is a search behind, not a charge never made: a resend would be made a second
    /// time by a provider that forgot the key. Waited on, then on-call.
    #[test]
    fn a_charge_the_provider_named_before_is_never_resent_when_its_search_shows_nothing() {
        let at = |age: TimeDelta| {
            decide_named_at(
                PaymentState::Enviada,
                age,
                Some(Ok(vec![])),
                Some("ch_named"),
            )
        };
        assert!(
            matches!(at(TimeDelta::hours(2)), Decision::Reschedule(why) if why.contains("ch_named")),
            "inside the key window: waited on, not sent"
        );
        assert!(
            matches!(at(TimeDelta::hours(25)), Decision::Escalate(why) if why.contains("ch_named")),
            "past the give-up horizon: on-call"
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

    /// `PAGOS_GIVE_UP_AFTER` is "unresolved this long → REVISION_MANUAL" for a payment
    /// the provider shows no charge for, too: with a key window longer than it (the
    /// reference protocol's is the operator's to set), resends went on until the window
    /// ended, and nobody was told.
    #[test]
    fn no_charge_past_the_give_up_horizon_goes_to_on_call_inside_the_key_window() {
        let now = Utc::now();
        let horizons = Horizons {
            key_window: TimeDelta::hours(48),
            resend_margin: TimeDelta::minutes(1),
            give_up_after: TimeDelta::hours(2),
        };
        let none: Result<Vec<Charge>, GatewayError> = Ok(vec![]);
        let at = |age: TimeDelta| {
            decide(
                &Facts {
                    state: PaymentState::Enviada,
                    created_at: now - age,
                    now,
                    lookup: Some(&none),
                    named: None,
                },
                &horizons,
            )
        };
        assert_eq!(at(TimeDelta::hours(1)), Decision::Send);
        let decided = at(TimeDelta::hours(3));
        assert!(
            matches!(decided, Decision::Escalate(ref why) if why.contains("PAGOS_GIVE_UP_AFTER")),
            "{decided:?}"
        );
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
    fn a_decline_beside_a_charge_that_took_the_money_says_nothing_of_the_payment() {
        let with_id = |id: &str, status, code: Option<&str>| {
            let mut c = charge(status);
            c.id = id.into();
            c.decline_code = code.map(str::to_owned);
            c
        };
        let approved = with_id("ch_1", ChargeStatus::Succeeded, None);
        let duplicate = with_id(
            "ch_2",
            ChargeStatus::Declined,
            Some("cc_rejected_duplicated_payment"),
        );
        // The first try's charge approved, its resend declined as its duplicate.
        assert_eq!(
            decide_at(
                PaymentState::Enviada,
                TimeDelta::minutes(5),
                Some(Ok(vec![approved.clone(), duplicate.clone()]))
            ),
            Decision::Settle(approved.clone())
        );
        // The duplicate alone: the one it duplicates may not show yet. Waited on, then
        // on-call's; never settled FALLIDA.
        let alone = || Some(Ok(vec![duplicate.clone()]));
        assert!(matches!(
            decide_at(PaymentState::Enviada, TimeDelta::minutes(5), alone()),
            Decision::Reschedule(_)
        ));
        assert!(matches!(
            decide_at(PaymentState::Enviada, TimeDelta::hours(25), alone()),
            Decision::Escalate(ref why) if why.contains("duplicate")
        ));
        // Two declines: as before, on-call's; a charged-back one beside an approved one too.
        let declined = with_id("ch_3", ChargeStatus::Declined, Some("card_declined"));
        assert!(matches!(
            decide_at(
                PaymentState::Enviada,
                TimeDelta::minutes(5),
                Some(Ok(vec![declined.clone(), duplicate.clone()]))
            ),
            Decision::Escalate(_)
        ));
        let mut disputed = declined;
        disputed.charged_back = true;
        assert!(matches!(
            decide_at(
                PaymentState::Enviada,
                TimeDelta::minutes(5),
                Some(Ok(vec![approved, disputed]))
            ),
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
