//! Merchants and API keys in the database: creating, listing and revoking them, and the
//! look-up authentication runs when its cache misses. Stores only hashes of keys.

use super::key::{ApiKey, KeyKind, hash_api_key};
use super::name::MerchantName;
use crate::db;
use crate::entities::{api_key, instance_fact, merchant};
use chrono::{DateTime, TimeDelta, Utc};
use sea_orm::sea_query::Condition;
use sea_orm::{
    ActiveModelTrait, ActiveValue::Set, ColumnTrait, DatabaseConnection, DbErr, EntityTrait,
    QueryFilter, QueryOrder, QuerySelect, SqlErr,
};
use uuid::Uuid;

/// "Last used" is written at most this often per key, by the look-up that refreshes a
/// process's cache: a busy key costs one write a minute, not one per request.
pub const LAST_USED_PRECISION: TimeDelta = TimeDelta::minutes(1);

#[derive(Debug, thiserror::Error)]
pub enum AddError {
    #[error("a merchant named {0:?} already exists; choose another name")]
    NameTaken(String),
    #[error(
        "this API key is already in use; choose another, or omit --api-key for a generated one"
    )]
    KeyTaken,
    #[error(transparent)]
    Db(#[from] DbErr),
}

/// What a key is now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyState {
    Active,
    Expired,
    Revoked,
}

impl KeyState {
    pub fn of(key: &api_key::Model, now: DateTime<Utc>) -> KeyState {
        if key.revoked_at.is_some() {
            KeyState::Revoked
        } else if key.expires_at.is_some_and(|at| at <= now) {
            KeyState::Expired
        } else {
            KeyState::Active
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            KeyState::Active => "active",
            KeyState::Expired => "expired",
            KeyState::Revoked => "revoked",
        }
    }
}

/// The kind of key to generate for this database: the gateway it is pinned to decides
/// (`sandbox` → `sk_test_`); `configured` (the gateway `PAGOS_GATEWAY` names) only when
/// nothing has pinned one yet.
pub async fn key_kind(db: &DatabaseConnection, configured: &str) -> Result<KeyKind, DbErr> {
    let pinned = instance_fact::Entity::find_by_id("gateway".to_owned())
        .one(db)
        .await?
        .map(|fact| fact.value);
    Ok(KeyKind::of_gateway(pinned.as_deref().unwrap_or(configured)))
}

/// Creates a merchant with `key` as its first key.
pub async fn add_merchant(
    db: &DatabaseConnection,
    name: &MerchantName,
    key: &ApiKey,
) -> Result<Uuid, AddError> {
    let hash = key.hash();
    let id = Uuid::now_v7();
    let now = db::now();
    let tx = db::begin_write(db).await?;
    if find_merchant(&tx, name).await?.is_some() {
        return Err(AddError::NameTaken(name.to_string()));
    }
    if key_in_use(&tx, &hash).await? {
        return Err(AddError::KeyTaken);
    }
    let inserted = async {
        merchant::Entity::insert(merchant::ActiveModel {
            id: Set(id),
            name: Set(name.to_string()),
            api_key_hash: Set(hash.clone()),
            created_at: Set(now),
        })
        .exec_without_returning(&tx)
        .await?;
        insert_key(&tx, id, key, now, None).await
    }
    .await;
    match inserted {
        Ok(_) => {
            tx.commit().await?;
            Ok(id)
        }
        // Another process took the name or the key between the checks and the insert.
        Err(err) if is_unique_violation(&err) => {
            drop(tx);
            if find_merchant(db, name).await?.is_some() {
                Err(AddError::NameTaken(name.to_string()))
            } else {
                Err(AddError::KeyTaken)
            }
        }
        Err(err) => Err(err.into()),
    }
}

/// A key of an existing merchant, valid until revoked or until `expires_at`.
pub async fn add_key(
    db: &DatabaseConnection,
    merchant: &merchant::Model,
    key: &ApiKey,
    expires_at: Option<DateTime<Utc>>,
) -> Result<api_key::Model, AddError> {
    adopt(db, merchant).await?;
    if key_in_use(db, &key.hash()).await? {
        return Err(AddError::KeyTaken);
    }
    insert_key(db, merchant.id, key, db::now(), expires_at)
        .await
        .map_err(|err| {
            if is_unique_violation(&err) {
                AddError::KeyTaken
            } else {
                AddError::Db(err)
            }
        })
}

fn is_unique_violation(err: &DbErr) -> bool {
    matches!(err.sql_err(), Some(SqlErr::UniqueConstraintViolation(_)))
}

async fn insert_key(
    db: &impl sea_orm::ConnectionTrait,
    merchant: Uuid,
    key: &ApiKey,
    now: DateTime<Utc>,
    expires_at: Option<DateTime<Utc>>,
) -> Result<api_key::Model, DbErr> {
    let row = api_key::Model {
        key_hash: key.hash(),
        merchant_id: merchant,
        prefix: key.prefix(),
        created_at: now,
        last_used_at: None,
        expires_at,
        revoked_at: None,
    };
    api_key::Entity::insert(api_key::ActiveModel::from(row.clone()))
        .exec_without_returning(db)
        .await?;
    Ok(row)
}

async fn key_in_use(db: &impl sea_orm::ConnectionTrait, hash: &str) -> Result<bool, DbErr> {
    if api_key::Entity::find_by_id(hash.to_owned())
        .one(db)
        .await?
        .is_some()
    {
        return Ok(true);
    }
    Ok(merchant::Entity::find()
        .filter(merchant::Column::ApiKeyHash.eq(hash))
        .one(db)
        .await?
        .is_some())
}

pub async fn find_merchant(
    db: &impl sea_orm::ConnectionTrait,
    name: &MerchantName,
) -> Result<Option<merchant::Model>, DbErr> {
    merchant::Entity::find()
        .filter(merchant::Column::Name.eq(name.as_str()))
        .one(db)
        .await
}

/// A merchant of the list, with how many of its keys work now.
#[derive(Clone, Debug)]
pub struct MerchantSummary {
    pub id: Uuid,
    pub name: String,
    pub created_at: DateTime<Utc>,
    pub active_keys: u64,
}

/// Every merchant, oldest first.
pub async fn list_merchants(db: &DatabaseConnection) -> Result<Vec<MerchantSummary>, DbErr> {
    let now = db::now();
    let merchants = merchant::Entity::find()
        .order_by_asc(merchant::Column::CreatedAt)
        .order_by_asc(merchant::Column::Id)
        .all(db)
        .await?;
    let mut summaries = Vec::with_capacity(merchants.len());
    let counts: Vec<(Uuid, i64)> = api_key::Entity::find()
        .select_only()
        .column(api_key::Column::MerchantId)
        .column_as(api_key::Column::KeyHash.count(), "n")
        .filter(api_key::Column::RevokedAt.is_null())
        .filter(
            Condition::any()
                .add(api_key::Column::ExpiresAt.is_null())
                .add(api_key::Column::ExpiresAt.gt(now)),
        )
        .group_by(api_key::Column::MerchantId)
        .into_tuple()
        .all(db)
        .await?;
    for m in merchants {
        let mut active = counts
            .iter()
            .find(|(id, _)| *id == m.id)
            .map_or(0, |(_, n)| u64::try_from(*n).unwrap_or(0));
        if active == 0 && adopt(db, &m).await?.is_some() {
            active = 1;
        }
        summaries.push(MerchantSummary {
            id: m.id,
            name: m.name,
            created_at: m.created_at,
            active_keys: active,
        });
    }
    Ok(summaries)
}

/// A merchant's keys, oldest first.
pub async fn list_keys(
    db: &DatabaseConnection,
    merchant: &merchant::Model,
) -> Result<Vec<api_key::Model>, DbErr> {
    adopt(db, merchant).await?;
    api_key::Entity::find()
        .filter(api_key::Column::MerchantId.eq(merchant.id))
        .order_by_asc(api_key::Column::CreatedAt)
        .order_by_asc(api_key::Column::Prefix)
        .all(db)
        .await
}

/// What revoking a key did.
#[derive(Clone, Debug)]
pub enum Revocation {
    Revoked(api_key::Model),
    /// It was revoked before (at `revoked_at`); nothing changed.
    AlreadyRevoked(api_key::Model),
    NoSuchKey,
}

/// Revokes the key of `merchant` whose prefix is `prefix`.
pub async fn revoke_key(
    db: &DatabaseConnection,
    merchant: &merchant::Model,
    prefix: &str,
) -> Result<Revocation, DbErr> {
    adopt(db, merchant).await?;
    let tx = db::begin_write(db).await?;
    let Some(key) = api_key::Entity::find()
        .filter(api_key::Column::MerchantId.eq(merchant.id))
        .filter(api_key::Column::Prefix.eq(prefix))
        .one(&tx)
        .await?
    else {
        return Ok(Revocation::NoSuchKey);
    };
    if key.revoked_at.is_some() {
        return Ok(Revocation::AlreadyRevoked(key));
    }
    let revoked = revoke_in(&tx, key).await?;
    tx.commit().await?;
    Ok(Revocation::Revoked(revoked))
}

/// Revokes `key` in `tx`.
async fn revoke_in(
    tx: &sea_orm::DatabaseTransaction,
    key: api_key::Model,
) -> Result<api_key::Model, DbErr> {
    let mut revoking = api_key::ActiveModel::from(key);
    revoking.revoked_at = Set(Some(db::now()));
    let revoked = revoking.update(tx).await?;
    // A binary older than `api_keys` authenticates with `merchants.api_key_hash`: make it
    // the hash of a value nobody holds, so the revoked key fails there too.
    let current = merchant::Entity::find_by_id(revoked.merchant_id)
        .one(tx)
        .await?;
    if current.is_some_and(|m| m.api_key_hash == revoked.key_hash) {
        let nobody = hex::encode(rand::random::<[u8; 32]>());
        merchant::Entity::update_many()
            .col_expr(
                merchant::Column::ApiKeyHash,
                sea_orm::sea_query::Expr::value(hash_api_key(&nobody)),
            )
            .filter(merchant::Column::Id.eq(revoked.merchant_id))
            .exec(tx)
            .await?;
    }
    Ok(revoked)
}

/// Revokes the key whose hash is `hash` if it is active (a merchant created by an older
/// binary gets its key row first); the key revoked and the name of its merchant.
pub async fn revoke_active_by_hash(
    db: &DatabaseConnection,
    hash: &str,
) -> Result<Option<(api_key::Model, String)>, DbErr> {
    if api_key::Entity::find_by_id(hash.to_owned())
        .one(db)
        .await?
        .is_none()
    {
        adopt_by_hash(db, hash).await?;
    }
    let tx = db::begin_write(db).await?;
    let Some(key) = api_key::Entity::find_by_id(hash.to_owned())
        .one(&tx)
        .await?
    else {
        return Ok(None);
    };
    if KeyState::of(&key, db::now()) == KeyState::Revoked {
        return Ok(None);
    }
    let revoked = revoke_in(&tx, key).await?;
    let name = merchant::Entity::find_by_id(revoked.merchant_id)
        .one(&tx)
        .await?
        .map(|m| m.name)
        .unwrap_or_default();
    tx.commit().await?;
    Ok(Some((revoked, name)))
}

/// How many of a merchant's keys work now.
pub async fn active_keys(db: &DatabaseConnection, merchant: Uuid) -> Result<usize, DbErr> {
    let now = db::now();
    Ok(api_key::Entity::find()
        .filter(api_key::Column::MerchantId.eq(merchant))
        .all(db)
        .await?
        .iter()
        .filter(|key| KeyState::of(key, now) == KeyState::Active)
        .count())
}

/// What the database says about a presented key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Credential {
    /// The key of `merchant`, until `expires_at` if set.
    Known {
        merchant: Uuid,
        expires_at: Option<DateTime<Utc>>,
    },
    Revoked,
    Unknown,
}

/// The look-up behind authentication, by the key's hash. A key that works has its "last
/// used" moved to now if it was older than a minute (so at most one write a minute per key),
/// by a task of its own: the answer is what the read saw, and a write held up (a lock, a
/// pool) must not hold it back. Requests for the same key wait for one look-up and take
/// its answer as it ends; a look-up that ended seconds after its read would let a key
/// revoked meanwhile work that much longer than the 5 s the revocation promises.
pub async fn lookup(db: &DatabaseConnection, hash: &str) -> Result<Credential, DbErr> {
    let found = match api_key::Entity::find_by_id(hash.to_owned()).one(db).await? {
        Some(key) => Some(key),
        None => adopt_by_hash(db, hash).await?,
    };
    let Some(key) = found else {
        return Ok(Credential::Unknown);
    };
    let now = db::now();
    match KeyState::of(&key, now) {
        KeyState::Revoked => return Ok(Credential::Revoked),
        KeyState::Expired => {}
        KeyState::Active => {
            if key
                .last_used_at
                .is_none_or(|at| now - at >= LAST_USED_PRECISION)
            {
                let (db, hash) = (db.clone(), hash.to_owned());
                tokio::spawn(async move {
                    crate::failpoint::pause("key_used").await;
                    if let Err(err) = record_use(&db, &hash, now).await {
                        // Losing one "last used" is better than refusing a good key.
                        tracing::warn!(error = %err, "could not record an API key's last use");
                    }
                });
            }
        }
    }
    Ok(Credential::Known {
        merchant: key.merchant_id,
        expires_at: key.expires_at,
    })
}

async fn record_use(db: &DatabaseConnection, hash: &str, now: DateTime<Utc>) -> Result<(), DbErr> {
    // The condition keeps several processes refreshing at once to one write a minute.
    api_key::Entity::update_many()
        .col_expr(
            api_key::Column::LastUsedAt,
            sea_orm::sea_query::Expr::value(now),
        )
        .filter(api_key::Column::KeyHash.eq(hash))
        .filter(
            Condition::any()
                .add(api_key::Column::LastUsedAt.is_null())
                .add(api_key::Column::LastUsedAt.lte(now - LAST_USED_PRECISION)),
        )
        .exec(db)
        .await?;
    Ok(())
}

/// A merchant created by a binary older than `api_keys` (during a rolling deploy) has its
/// key only in `merchants.api_key_hash`: give it its row, as the migration did for the
/// merchants before it. Nothing for a merchant that has rows already.
async fn adopt(
    db: &DatabaseConnection,
    merchant: &merchant::Model,
) -> Result<Option<api_key::Model>, DbErr> {
    let has_keys = api_key::Entity::find()
        .filter(api_key::Column::MerchantId.eq(merchant.id))
        .one(db)
        .await?
        .is_some();
    if has_keys {
        return Ok(None);
    }
    let hash = &merchant.api_key_hash;
    let row = api_key::Model {
        key_hash: hash.clone(),
        merchant_id: merchant.id,
        prefix: format!("sha256:{}", hash.get(..12).unwrap_or(hash)),
        created_at: merchant.created_at,
        last_used_at: None,
        expires_at: None,
        revoked_at: None,
    };
    api_key::Entity::insert(api_key::ActiveModel::from(row))
        .on_conflict_do_nothing()
        .exec_without_returning(db)
        .await?;
    api_key::Entity::find_by_id(hash.clone()).one(db).await
}

async fn adopt_by_hash(
    db: &DatabaseConnection,
    hash: &str,
) -> Result<Option<api_key::Model>, DbErr> {
    let Some(owner) = merchant::Entity::find()
        .filter(merchant::Column::ApiKeyHash.eq(hash))
        .one(db)
        .await?
    else {
        return Ok(None);
    };
    Ok(adopt(db, &owner).await?.filter(|key| key.key_hash == hash))
}
