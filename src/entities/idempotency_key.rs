use sea_orm::entity::prelude::*;

/// Key row status while nobody has frozen an answer on it.
pub const KEY_IN_PROGRESS: &str = "EN_PROCESO";
/// Key row status once its answer is frozen.
pub const KEY_COMPLETED: &str = "COMPLETADA";

/// A key's frozen answer as stored (`response_code`, `response_body`): a status and the
/// exact bytes first sent, opaque to the store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrozenAnswer {
    pub status: u16,
    pub body: String,
}

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "idempotency_keys")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub merchant_id: Uuid,
    #[sea_orm(primary_key, auto_increment = false)]
    pub key: String,
    /// SHA-256 of method, path and canonical body, hex.
    pub fingerprint: String,
    pub payment_id: Uuid,
    /// `EN_PROCESO` until the answer is frozen, then `COMPLETADA`.
    pub status: String,
    pub response_code: Option<i32>,
    /// The frozen answer, byte for byte as first sent.
    pub response_body: Option<String>,
    /// While in the future, a request handler owns the key: duplicates get 409.
    pub lease_until: Option<ChronoDateTimeUtc>,
    pub created_at: ChronoDateTimeUtc,
    pub updated_at: ChronoDateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
