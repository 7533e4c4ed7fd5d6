//! The payment state machine: the only place that knows which moves are legal.
//!
//! Pure: no I/O, no clock. Every write of `payments.state` asks `transition` first, so an
//! impossible move (COMPLETADA → ENVIADA) cannot be written by any code path.

use pagos_types::EventType;
pub use pagos_types::state::{PaymentState, UnknownState};

/// A saga's state (a payment's, a refund's) as the steps both sagas share read it: its
/// events, its transition table, and which states are which.
pub trait SagaState: Copy + PartialEq + std::fmt::Display + Send + Sync {
    type Event: Copy + PartialEq + Send + Sync;
    /// A move the table refuses.
    type Illegal;
    /// Registered, never sent (`EN_PROCESO`).
    const NEVER_SENT: Self;
    /// Marked sent before a gateway call (`ENVIADA`, `ENVIADO`).
    const SENT: Self;
    /// The event that marks a row sent, before the gateway call.
    const SEND: Self::Event;

    /// The transition table: the only place that knows which moves are legal.
    fn transition(self, event: Self::Event) -> Result<Self, Self::Illegal>;
    /// Final, whatever comes later (a refund of a payment).
    fn is_terminal(self) -> bool;
    /// The event the merchant is told of a move into this state, if it must know.
    fn event_type(self) -> Option<EventType>;

    /// Sent or never sent: a writer may still hold it.
    fn in_flight(self) -> bool {
        self == Self::NEVER_SENT || self == Self::SENT
    }
}

/// A state machine's events, as an enum with `ALL`: every event, in the order written.
macro_rules! events {
    ($(#[$meta:meta])* pub enum $name:ident { $($(#[$doc:meta])* $event:ident,)* }) => {
        $(#[$meta])*
        pub enum $name {
            $($(#[$doc])* $event,)*
        }

        impl $name {
            /// Every event, in the order written.
            pub const ALL: &'static [$name] = &[$($name::$event),*];
        }
    };
}
pub(crate) use events;

events! {
    /// What happened to a payment.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Event {
        /// About to call the gateway (written before the call: the recovery point).
        Send,
        /// The gateway reports the charge succeeded.
        Charged,
        /// The gateway declined or refused the charge.
        Declined,
        /// Nothing can be decided safely (no charge found outside the gateway's key window,
        /// provider unreachable past the give-up horizon).
        Escalate,
        /// The provider reports the opposite of a final state we hold (declined after
        /// COMPLETADA, succeeded after FALLIDA).
        Contradicted,
        /// On-call settles a payment under review.
        ResolveCompleted,
        ResolveFailed,
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("illegal transition: {event:?} from {from}")]
pub struct IllegalTransition {
    pub from: PaymentState,
    pub event: Event,
}

/// The transition table. Anything not listed is illegal.
pub fn transition(from: PaymentState, event: Event) -> Result<PaymentState, IllegalTransition> {
    use Event::*;
    use PaymentState::*;
    let to = match (from, event) {
        (EnProceso, Send) => Enviada,
        // A resend by the reconciler keeps the payment ENVIADA.
        (Enviada, Send) => Enviada,
        (Enviada, Charged) => Completada,
        (Enviada, Declined) => Fallida,
        (EnProceso | Enviada, Escalate) => RevisionManual,
        (Completada | Fallida, Contradicted) => RevisionManual,
        (RevisionManual, ResolveCompleted) => Completada,
        (RevisionManual, ResolveFailed) => Fallida,
        _ => return Err(IllegalTransition { from, event }),
    };
    Ok(to)
}

impl SagaState for PaymentState {
    type Event = Event;
    type Illegal = IllegalTransition;
    const NEVER_SENT: PaymentState = PaymentState::EnProceso;
    const SENT: PaymentState = PaymentState::Enviada;
    const SEND: Event = Event::Send;

    fn transition(self, event: Event) -> Result<PaymentState, IllegalTransition> {
        transition(self, event)
    }

    fn is_terminal(self) -> bool {
        PaymentState::is_terminal(self)
    }

    fn event_type(self) -> Option<EventType> {
        EventType::of_payment(self)
    }
}

/// The checks of a transition table, the payments' and the refunds'.
#[cfg(test)]
pub(crate) mod table {
    use std::fmt::{Debug, Display};

    /// Every move of `allowed` lands where it says.
    pub(crate) fn assert_lands<S, E, X>(transition: fn(S, E) -> Result<S, X>, allowed: &[(S, E, S)])
    where
        S: Copy + Eq + Debug + Display,
        E: Copy + Debug,
        X: Eq + Debug,
    {
        for &(from, event, to) in allowed {
            assert_eq!(transition(from, event), Ok(to), "{from} + {event:?}");
        }
    }

    /// Every move from `states` by `events` not in `allowed` is refused as `illegal`
    /// says; returns how many were.
    pub(crate) fn assert_refused<S, E, X>(
        transition: fn(S, E) -> Result<S, X>,
        states: &[S],
        events: &[E],
        allowed: &[(S, E, S)],
        illegal: fn(S, E) -> X,
    ) -> usize
    where
        S: Copy + Eq + Debug + Display,
        E: Copy + Eq + Debug,
        X: Eq + Debug,
    {
        let mut refused = 0;
        for &from in states {
            for &event in events {
                if allowed.iter().any(|(f, e, _)| *f == from && *e == event) {
                    continue;
                }
                assert_eq!(
                    transition(from, event),
                    Err(illegal(from, event)),
                    "{from} + {event:?} must be refused"
                );
                refused += 1;
            }
        }
        refused
    }
}

#[cfg(test)]
mod tests {
    use super::table::{assert_lands, assert_refused};
    use super::*;
    use Event::*;
    use PaymentState::*;

    /// The whole table, written out: every (state, event) pair not here must be refused.
    const ALLOWED: [(PaymentState, Event, PaymentState); 10] = [
        (EnProceso, Send, Enviada),
        (Enviada, Send, Enviada),
        (Enviada, Charged, Completada),
        (Enviada, Declined, Fallida),
        (EnProceso, Escalate, RevisionManual),
        (Enviada, Escalate, RevisionManual),
        (Completada, Contradicted, RevisionManual),
        (Fallida, Contradicted, RevisionManual),
        (RevisionManual, ResolveCompleted, Completada),
        (RevisionManual, ResolveFailed, Fallida),
    ];

    #[test]
    fn every_allowed_move_lands_where_the_table_says() {
        assert_lands(transition, &ALLOWED);
    }

    #[test]
    fn every_other_move_is_refused() {
        let refused = assert_refused(
            transition,
            &PaymentState::ALL,
            Event::ALL,
            &ALLOWED,
            |from, event| IllegalTransition { from, event },
        );
        assert_eq!(refused, 5 * 7 - ALLOWED.len());
    }

    #[test]
    fn a_final_payment_is_never_sent_again() {
        assert!(transition(Completada, Send).is_err());
        assert!(transition(Fallida, Send).is_err());
        assert!(transition(Completada, Declined).is_err());
        assert!(transition(Fallida, Charged).is_err());
    }
}
