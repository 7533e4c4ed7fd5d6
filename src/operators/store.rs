//! Operators in the database: add, revoke, list, and the look-up by token hash that the
//! admin API and the console run. Stores only hashes of tokens.

use super::{OperatorName, Role, Token};
use crate::db;
use crate::entities::operator;
use sea_orm::{
    ActiveModelTrait, ActiveValue::Set, ColumnTrait, DatabaseConnection, DbErr, EntityTrait,
    QueryFilter, QueryOrder, SqlErr,
};
use uuid::Uuid;

#[derive(Debug, thiserror::Error)]
pub enum AddError {
    #[error("an operator named {0:?} already exists; choose another name")]
    NameTaken(String),
    #[error(transparent)]
    Db(#[from] DbErr),
}

/// Creates an operator holding `token`, unless an operator (revoked ones too) has the
/// name in any case: `Ana` beside `ana` would read as the same person in the audit trail.
/// The check and the insert are one transaction that adds serialize on (SQLite's write
/// lock; on PostgreSQL a lock on the table that only adds take).
pub async fn add(
    db: &DatabaseConnection,
    name: &OperatorName,
    role: Role,
    token: &Token,
) -> Result<operator::Model, AddError> {
    use sea_orm::{ConnectionTrait, DbBackend};
    let tx = db::begin_write(db).await?;
    if db.get_database_backend() == DbBackend::Postgres {
        tx.execute_unprepared("LOCK TABLE operators IN SHARE ROW EXCLUSIVE MODE")
            .await?;
    }
    let folded = name.folded();
    let taken = operator::Entity::find()
        .all(&tx)
        .await?
        .into_iter()
        .find(|existing| existing.name.to_lowercase() == folded);
    if let Some(existing) = taken {
        return Err(AddError::NameTaken(existing.name));
    }
    let row = operator::ActiveModel {
        id: Set(Uuid::now_v7()),
        name: Set(name.as_str().to_owned()),
        role: Set(role),
        token_hash: Set(token.hash()),
        created_at: Set(db::now()),
        revoked_at: Set(None),
    };
    match row.insert(&tx).await {
        Ok(model) => {
            tx.commit().await?;
            Ok(model)
        }
        Err(err) if matches!(err.sql_err(), Some(SqlErr::UniqueConstraintViolation(_))) => {
            Err(AddError::NameTaken(name.as_str().to_owned()))
        }
        Err(err) => Err(err.into()),
    }
}

pub enum Revocation {
    NoSuchOperator,
    AlreadyRevoked(operator::Model),
    Revoked(operator::Model),
}

/// Revokes the operator named `name`, whatever its case (names are unique without case:
/// `LUIS` is `luis`, the name on-call remembers revokes the token it means).
pub async fn revoke(db: &DatabaseConnection, name: &OperatorName) -> Result<Revocation, DbErr> {
    let folded = name.folded();
    let Some(found) = operator::Entity::find()
        .all(db)
        .await?
        .into_iter()
        .find(|existing| existing.name.to_lowercase() == folded)
    else {
        return Ok(Revocation::NoSuchOperator);
    };
    if found.revoked_at.is_some() {
        return Ok(Revocation::AlreadyRevoked(found));
    }
    let mut row: operator::ActiveModel = found.into();
    row.revoked_at = Set(Some(db::now()));
    Ok(Revocation::Revoked(row.update(db).await?))
}

/// Every operator, revoked ones too, by name.
pub async fn list(db: &DatabaseConnection) -> Result<Vec<operator::Model>, DbErr> {
    operator::Entity::find()
        .order_by_asc(operator::Column::Name)
        .all(db)
        .await
}

/// The operator named `name`, whatever its case (two never differ by case alone), unless
/// revoked.
pub async fn active_by_name(
    db: &DatabaseConnection,
    name: &OperatorName,
) -> Result<Option<operator::Model>, DbErr> {
    let folded = name.folded();
    Ok(operator::Entity::find()
        .filter(operator::Column::RevokedAt.is_null())
        .all(db)
        .await?
        .into_iter()
        .find(|active| active.name.to_lowercase() == folded))
}

/// The operator whose token hashes to `token_hash`, unless revoked.
pub async fn active_by_token(
    db: &DatabaseConnection,
    token_hash: &str,
) -> Result<Option<operator::Model>, DbErr> {
    operator::Entity::find()
        .filter(operator::Column::TokenHash.eq(token_hash))
        .filter(operator::Column::RevokedAt.is_null())
        .one(db)
        .await
}

/// The operator with this id, unless revoked: a console session checks it on every page,
/// so revoking an operator ends their sessions at once.
pub async fn active_by_id(
    db: &DatabaseConnection,
    id: Uuid,
) -> Result<Option<operator::Model>, DbErr> {
    operator::Entity::find_by_id(id)
        .filter(operator::Column::RevokedAt.is_null())
        .one(db)
        .await
}
