use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "merchants")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: Uuid,
    /// Unique; parsed by `merchants::name::MerchantName`.
    #[sea_orm(unique)]
    pub name: String,
    /// SHA-256 of the merchant's first API key, hex, kept for binaries older than
    /// `api_keys` during a rolling deploy; once that key is revoked, the hash of a random
    /// value nobody holds. pagos authenticates with `api_keys` only.
    #[sea_orm(unique)]
    pub api_key_hash: String,
    pub created_at: ChronoDateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
