use sea_orm::entity::prelude::*;

/// Where a key row stands; stored as its name, as it always was.
#[derive(Clone, Copy, Debug, PartialEq, Eq, EnumIter, DeriveActiveEnum)]
#[sea_orm(rs_type = "String", db_type = "String(StringLen::N(20))")]
pub enum KeyStatus {
    /// Nobody has frozen an answer on it yet.
    #[sea_orm(string_value = "EN_PROCESO")]
    InProgress,
    /// Its answer is frozen.
    #[sea_orm(string_value = "COMPLETADA")]
    Completed,
}

impl std::fmt::Display for KeyStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Equal to its stored name.
impl PartialEq<&str> for KeyStatus {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl KeyStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            KeyStatus::InProgress => "EN_PROCESO",
            KeyStatus::Completed => "COMPLETADA",
        }
    }
}

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
    pub status: KeyStatus,
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
