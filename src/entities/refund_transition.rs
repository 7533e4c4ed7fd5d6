use sea_orm::entity::prelude::*;

pub use super::payment_transition::Actor;
pub use pagos_types::RefundState;

/// One row of a refund's audit trail: who moved it from where to where, and why.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "refund_transitions")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: Uuid,
    pub refund_id: Uuid,
    pub from_state: Option<RefundState>,
    pub to_state: RefundState,
    pub actor: Actor,
    pub reason: String,
    pub created_at: ChronoDateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
