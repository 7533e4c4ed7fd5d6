use sea_orm::entity::prelude::*;

/// One gateway event already applied: its id, inserted in the same transaction as the
/// event's effect, so a redelivery finds it and changes nothing.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "processed_messages")]
pub struct Model {
    /// Which gateway sent it (`http` for the reference protocol).
    #[sea_orm(primary_key, auto_increment = false)]
    pub source: String,
    /// The gateway's event id (`evt_…`).
    #[sea_orm(primary_key, auto_increment = false)]
    pub message_id: String,
    pub received_at: ChronoDateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
