use sea_orm::entity::prelude::*;

/// One row of the audit trail: who moved a payment from where to where, and why.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "payment_transitions")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: Uuid,
    pub payment_id: Uuid,
    pub from_state: Option<String>,
    pub to_state: String,
    /// `request`, `reconciler`, `webhook` or `admin`.
    pub actor: String,
    pub reason: String,
    pub created_at: ChronoDateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
