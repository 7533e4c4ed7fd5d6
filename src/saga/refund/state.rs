//! The refund state machine: the only place that knows which moves of a refund are legal.
//!
//! Pure: no I/O, no clock. Every write of `refunds.state` asks `transition` first, so an
//! impossible move (COMPLETADO → ENVIADO: a second refund) cannot be written by any path.

use crate::saga::state::SagaState;
use pagos_types::EventType;
pub use pagos_types::RefundState;

crate::saga::state::events! {
    /// What happened to a refund.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Event {
        /// About to call the gateway (written before the call: the recovery point).
        Send,
        /// The gateway reports the money went back.
        Refunded,
        /// The gateway refused the refund, or reports it failed: no money went back.
        Failed,
        /// Nothing can be decided safely (no refund found outside the gateway's key window,
        /// provider unreachable past the give-up horizon, a refund for another amount, a
        /// provider refund that is not the refund's own: another charge's, a second one).
        Escalate,
        /// The provider reports the opposite of a final state held (Stripe: `failed` after
        /// `succeeded`), or a refund that succeeded beside the one held: a second refund at
        /// the provider, or its own for another amount.
        Contradicted,
        /// On-call settles a refund under review.
        ResolveCompleted,
        ResolveFailed,
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("illegal refund transition: {event:?} from {from}")]
pub struct IllegalTransition {
    pub from: RefundState,
    pub event: Event,
}

/// The transition table. Anything not listed is illegal.
pub fn transition(from: RefundState, event: Event) -> Result<RefundState, IllegalTransition> {
    use Event::*;
    use RefundState::*;
    let to = match (from, event) {
        (EnProceso, Send) => Enviado,
        // A resend by the reconciler keeps the refund ENVIADO (same gateway key).
        (Enviado, Send) => Enviado,
        (Enviado, Refunded) => Completado,
        (Enviado, Failed) => Fallido,
        (EnProceso | Enviado, Escalate) => RevisionManual,
        (Completado | Fallido, Contradicted) => RevisionManual,
        (RevisionManual, ResolveCompleted) => Completado,
        (RevisionManual, ResolveFailed) => Fallido,
        _ => return Err(IllegalTransition { from, event }),
    };
    Ok(to)
}

impl SagaState for RefundState {
    type Event = Event;
    type Illegal = IllegalTransition;
    const NEVER_SENT: RefundState = RefundState::EnProceso;
    const SENT: RefundState = RefundState::Enviado;
    const SEND: Event = Event::Send;

    fn transition(self, event: Event) -> Result<RefundState, IllegalTransition> {
        transition(self, event)
    }

    fn is_terminal(self) -> bool {
        RefundState::is_terminal(self)
    }

    fn event_type(self) -> Option<EventType> {
        EventType::of_refund(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::saga::state::table;
    use Event::*;
    use RefundState::*;

    /// The whole table, written out: every (state, event) pair not here must be refused.
    const ALLOWED: [(RefundState, Event, RefundState); 10] = [
        (EnProceso, Send, Enviado),
        (Enviado, Send, Enviado),
        (Enviado, Refunded, Completado),
        (Enviado, Failed, Fallido),
        (EnProceso, Escalate, RevisionManual),
        (Enviado, Escalate, RevisionManual),
        (Completado, Contradicted, RevisionManual),
        (Fallido, Contradicted, RevisionManual),
        (RevisionManual, ResolveCompleted, Completado),
        (RevisionManual, ResolveFailed, Fallido),
    ];

    #[test]
    fn every_allowed_refund_move_lands_where_the_table_says() {
        table::assert_lands(transition, &ALLOWED);
    }

    #[test]
    fn every_other_refund_move_is_refused() {
        let refused = table::assert_refused(
            transition,
            &RefundState::ALL,
            Event::ALL,
            &ALLOWED,
            |from, event| IllegalTransition { from, event },
        );
        assert_eq!(refused, 5 * 7 - ALLOWED.len());
    }

    #[test]
    fn a_final_refund_is_never_sent_again() {
        for from in [Completado, Fallido, RevisionManual] {
            assert!(transition(from, Send).is_err(), "{from}");
        }
        assert!(
            transition(EnProceso, Refunded).is_err(),
            "never sent, never refunded"
        );
    }
}
