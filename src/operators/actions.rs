//! What on-call asked, in the database (`operator_actions`): a row written before the
//! work, completed with what came of it, and read back newest first. The admin API and the
//! console (`http::actions::audited`) and `pagos reconcile --once` record their actions
//! here, the same way: `begin` before the work (an action that cannot be recorded is not
//! done), `finish` after it.
//!
//! Stores text it is given: what was asked and what came of it are put in words by the
//! caller, never here; a row's `detail` is the one joined to the other (`OUTCOME_AFTER`).

use crate::db;
pub use crate::entities::operator_action::{Action, Model as Row};
use crate::entities::operator_action::{ActiveModel, Column, Entity};
use sea_orm::sea_query::Expr;
use sea_orm::{
    ActiveModelTrait, ActiveValue::Set, ColumnTrait, DatabaseConnection, DbErr, EntityTrait,
    QueryFilter, QueryOrder, QuerySelect,
};
use std::collections::HashMap;
use uuid::Uuid;

/// Records that `operator` asked `action` on `target`, before the work starts: `asked`
/// says what. The row's id, to `finish` it with.
pub async fn begin(
    db: &DatabaseConnection,
    operator: &str,
    action: Action,
    target: Option<Uuid>,
    asked: &str,
) -> Result<Uuid, DbErr> {
    let row = ActiveModel {
        id: Set(Uuid::now_v7()),
        at: Set(db::now()),
        operator: Set(operator.to_owned()),
        action: Set(action.as_str().to_owned()),
        target: Set(target),
        detail: Set(asked.to_owned()),
        finished_at: Set(None),
    };
    Ok(row.insert(db).await?.id)
}

/// What separates what was asked from what came of it in a row's `detail`.
const OUTCOME_AFTER: &str = " — ";

/// How a row says an action ended in an error: `failed: ` and the error's words.
pub fn failed(error: impl std::fmt::Display) -> String {
    format!("failed: {error}")
}

/// How a row says pagos refused an action (a 409, a 422, a provider that cannot be
/// asked): `refused (` its status and its problem type `): ` and why.
pub fn refused(status: Option<u16>, kind: &str, why: &str) -> String {
    match status {
        Some(status) => format!("refused ({status} {kind}): {why}"),
        None => format!("refused ({kind}): {why}"),
    }
}

/// The action `id` is over: `asked` (what `begin` was told) and what came of it
/// (`outcome`: a report in words, or `failed`'s words) make its `detail`.
pub async fn finish(
    db: &DatabaseConnection,
    id: Uuid,
    asked: &str,
    outcome: &str,
) -> Result<(), DbErr> {
    let detail = format!("{asked}{OUTCOME_AFTER}{outcome}");
    Entity::update_many()
        .col_expr(Column::Detail, Expr::value(detail))
        .col_expr(Column::FinishedAt, Expr::value(db::now()))
        .filter(Column::Id.eq(id))
        .exec(db)
        .await?;
    Ok(())
}

/// What came of an action, from its row; None while it is not over (still running, or its
/// process stopped before it ended).
pub fn outcome_of(row: &Row) -> Option<&str> {
    row.finished_at?;
    row.detail
        .split_once(OUTCOME_AFTER)
        .map(|(_, outcome)| outcome)
}

/// Which rows to read: each filter that is set must hold.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    pub operator: Option<String>,
    pub target: Option<Uuid>,
    pub action: Option<Action>,
}

/// At most `limit` rows that `filter` selects, newest first.
pub async fn list(db: &DatabaseConnection, filter: &Filter, limit: u64) -> Result<Vec<Row>, DbErr> {
    let mut query = Entity::find();
    if let Some(operator) = &filter.operator {
        // Two operators never differ by case alone: `ana` finds the rows of `Ana`
        // (revoked or not) as written, `ADMIN` the break-glass token's; another name no
        // operator has is matched as given.
        let asked = operator.to_lowercase();
        let stored = super::store::list(db)
            .await?
            .into_iter()
            .find(|o| o.name.to_lowercase() == asked)
            .map(|o| o.name)
            .or_else(|| (asked == super::BREAK_GLASS).then(|| super::BREAK_GLASS.to_owned()))
            .unwrap_or_else(|| operator.clone());
        query = query.filter(Column::Operator.eq(stored));
    }
    if let Some(target) = filter.target {
        query = query.filter(Column::Target.eq(target));
    }
    if let Some(action) = filter.action {
        query = query.filter(Column::Action.eq(action.as_str()));
    }
    query
        .order_by_desc(Column::At)
        .order_by_desc(Column::Id)
        .limit(limit)
        .all(db)
        .await
}

/// At most `limit` rows of `action` on any of `targets`, newest first.
pub async fn list_on(
    db: &DatabaseConnection,
    action: Action,
    targets: &[Uuid],
    limit: u64,
) -> Result<Vec<Row>, DbErr> {
    if targets.is_empty() {
        return Ok(Vec::new());
    }
    Entity::find()
        .filter(Column::Action.eq(action.as_str()))
        .filter(Column::Target.is_in(targets.iter().copied()))
        .order_by_desc(Column::At)
        .order_by_desc(Column::Id)
        .limit(limit)
        .all(db)
        .await
}

/// The last `action` on each of `targets` that has one.
pub async fn last_on_each(
    db: &DatabaseConnection,
    action: Action,
    targets: &[Uuid],
) -> Result<HashMap<Uuid, Row>, DbErr> {
    let rows = Entity::find()
        .filter(Column::Action.eq(action.as_str()))
        .filter(Column::Target.is_in(targets.iter().copied()))
        .order_by_asc(Column::At)
        .order_by_asc(Column::Id)
        .all(db)
        .await?;
    Ok(rows
        .into_iter()
        .filter_map(|row| Some((row.target?, row)))
        .collect())
}
