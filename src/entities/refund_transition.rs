use sea_orm::entity::prelude::*;

pub use super::payment_transition::Actor;
pub use pagos_types::RefundState;

audit_trail! {
    /// One row of a refund's audit trail: who moved it from where to where, and why.
    table = "refund_transitions",
    of = refund_id,
    state = RefundState
}
