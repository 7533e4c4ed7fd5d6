use sea_orm::entity::prelude::*;

/// What a gateway's webhooks last told us about one of its charges.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "webhook_charges")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub source: String,
    #[sea_orm(primary_key, auto_increment = false)]
    pub charge_id: String,
    /// The reference the charge carries, as the gateway sent it.
    pub reference: String,
    /// The payment the reference names; `None` for an orphan charge (no such payment).
    pub payment_id: Option<Uuid>,
    /// `succeeded`, `declined` or `pending`, as of `last_sequence`.
    pub status: String,
    pub amount: i64,
    pub currency: String,
    pub decline_code: Option<String>,
    /// The highest event sequence applied for this charge; lower or equal ones are stale.
    pub last_sequence: i64,
    pub last_event_id: String,
    pub first_seen_at: ChronoDateTimeUtc,
    pub updated_at: ChronoDateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
