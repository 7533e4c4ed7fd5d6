//! The payment state machine: the only place that knows which moves are legal.
//!
//! Pure: no I/O, no clock. Every write of `payments.state` asks `transition` first, so an
//! impossible move (COMPLETADA → ENVIADA) cannot be written by any code path.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Where a payment stands. The names are the contract's (`estado`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum PaymentState {
    /// Registered, never sent to the gateway.
    EnProceso,
    /// Maybe sent: after a crash, ask the provider before anything else.
    Enviada,
    /// Charged. Final.
    Completada,
    /// Declined or refused by the gateway; no money moved. Final.
    Fallida,
    /// pagos cannot decide without risking a second charge: on-call decides.
    RevisionManual,
}

impl PaymentState {
    pub const ALL: [PaymentState; 5] = [
        PaymentState::EnProceso,
        PaymentState::Enviada,
        PaymentState::Completada,
        PaymentState::Fallida,
        PaymentState::RevisionManual,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            PaymentState::EnProceso => "EN_PROCESO",
            PaymentState::Enviada => "ENVIADA",
            PaymentState::Completada => "COMPLETADA",
            PaymentState::Fallida => "FALLIDA",
            PaymentState::RevisionManual => "REVISION_MANUAL",
        }
    }

    /// COMPLETADA and FALLIDA never change again (but for a contradiction, see `Event`).
    pub fn is_terminal(self) -> bool {
        matches!(self, PaymentState::Completada | PaymentState::Fallida)
    }
}

impl fmt::Display for PaymentState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for PaymentState {
    type Err = UnknownState;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        PaymentState::ALL
            .into_iter()
            .find(|state| state.as_str() == s)
            .ok_or_else(|| UnknownState(s.to_owned()))
    }
}

#[derive(Debug, thiserror::Error)]
#[error("unknown payment state {0:?}")]
pub struct UnknownState(pub String);

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

#[cfg(test)]
mod tests {
    use super::*;
    use Event::*;
    use PaymentState::*;

    const EVENTS: [Event; 7] = [
        Send,
        Charged,
        Declined,
        Escalate,
        Contradicted,
        ResolveCompleted,
        ResolveFailed,
    ];

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
        for (from, event, to) in ALLOWED {
            assert_eq!(transition(from, event), Ok(to), "{from} + {event:?}");
        }
    }

    #[test]
    fn every_other_move_is_refused() {
        let mut refused = 0;
        for from in PaymentState::ALL {
            for event in EVENTS {
                if ALLOWED.iter().any(|(f, e, _)| *f == from && *e == event) {
                    continue;
                }
                assert_eq!(
                    transition(from, event),
                    Err(IllegalTransition { from, event }),
                    "{from} + {event:?} must be refused"
                );
                refused += 1;
            }
        }
        assert_eq!(refused, 5 * 7 - ALLOWED.len());
    }

    #[test]
    fn a_final_payment_is_never_sent_again() {
        assert!(transition(Completada, Send).is_err());
        assert!(transition(Fallida, Send).is_err());
        assert!(transition(Completada, Declined).is_err());
        assert!(transition(Fallida, Charged).is_err());
    }

    #[test]
    fn state_names_round_trip_through_their_contract_spelling() {
        for state in PaymentState::ALL {
            assert_eq!(state.as_str().parse::<PaymentState>().ok(), Some(state));
            let json = serde_json::to_string(&state).unwrap_or_default();
            assert_eq!(json, format!("\"{}\"", state.as_str()));
        }
        assert!("PAGADA".parse::<PaymentState>().is_err());
    }
}
