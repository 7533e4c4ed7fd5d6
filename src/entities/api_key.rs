use sea_orm::entity::prelude::*;

/// One API key of a merchant. The key itself is never stored: only its SHA-256 and a
/// prefix too short to authenticate, shown so that people can tell keys apart.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "api_keys")]
pub struct Model {
    /// SHA-256 of the key, hex.
    #[sea_orm(primary_key, auto_increment = false)]
    pub key_hash: String,
    pub merchant_id: Uuid,
    /// The key's first characters (`sk_live_AbCd1234`), or `sha256:` and the first 12 hex
    /// digits of the hash for keys made before keys had prefixes.
    pub prefix: String,
    pub created_at: ChronoDateTimeUtc,
    /// Written at most once a minute per key (see `merchants::store::lookup`).
    pub last_used_at: Option<ChronoDateTimeUtc>,
    pub expires_at: Option<ChronoDateTimeUtc>,
    pub revoked_at: Option<ChronoDateTimeUtc>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
