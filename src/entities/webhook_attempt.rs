use sea_orm::entity::prelude::*;

/// One attempt of a delivery, kept.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "webhook_attempts")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: Uuid,
    pub event_id: String,
    pub endpoint_id: Uuid,
    /// 1 for the first attempt of the delivery; one row per number.
    pub number: i32,
    /// Its `webhook-timestamp`.
    pub attempted_at: ChronoDateTimeUtc,
    /// The answer's status (None: no answer).
    pub status: Option<i32>,
    pub latency_ms: i64,
    /// The first 1 KiB of the answer's body.
    pub answer: String,
    pub error: Option<String>,
    /// `delivered`, `gone`, `failed`, `refused`.
    pub outcome: String,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
