use sea_orm::entity::prelude::*;

pub use pagos_types::EventType;

/// One event of the outbox: written with the change it tells, delivered afterwards.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "events")]
pub struct Model {
    /// `evt_` + a UUIDv7 in hex (time-ordered): the `webhook-id`.
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: String,
    pub merchant_id: Uuid,
    pub event_type: EventType,
    /// The payment (or refund) it is about.
    pub subject_id: Uuid,
    /// The subject's `secuencia`: increases with each of its events.
    pub sequence: i64,
    /// The event as delivered, byte for byte on every attempt.
    pub body: String,
    pub created_at: ChronoDateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
