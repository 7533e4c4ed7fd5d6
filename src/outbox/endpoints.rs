//! A merchant's webhook endpoints: made, listed, removed, their secret rotated, made
//! active again. Every function takes the merchant: another merchant's endpoint is
//! `None`, never a leak.

use crate::db::{begin_write, now};
use crate::entities::event;
use crate::entities::webhook_attempt as attempts;
use crate::entities::webhook_delivery::{self as deliveries, DeliveryState};
use crate::entities::webhook_endpoint::{self as endpoints, EndpointState};
use chrono::{DateTime, Utc};
use pagos_types::EventType;
use sea_orm::sea_query::{Expr, OnConflict, Query};
use sea_orm::{
    ActiveModelTrait, ActiveValue::Set, ColumnTrait, ConnectionTrait, DatabaseConnection,
    DatabaseTransaction, DbErr, EntityTrait, IntoActiveModel, QueryFilter, QueryOrder,
};
use uuid::Uuid;

/// The event types an endpoint wants, as stored (None: all).
pub fn stored_types(types: Option<&[EventType]>) -> Option<String> {
    types.map(|types| {
        types
            .iter()
            .map(|t| t.as_str())
            .collect::<Vec<_>>()
            .join(",")
    })
}

/// The event types an endpoint wants (every type when it named none).
pub fn wanted(endpoint: &endpoints::Model) -> Vec<EventType> {
    match &endpoint.event_types {
        None => EventType::ALL.to_vec(),
        Some(text) => text.split(',').filter_map(|t| t.parse().ok()).collect(),
    }
}

/// Whether `endpoint` wants events of type `tipo`.
pub fn wants(endpoint: &endpoints::Model, tipo: EventType) -> bool {
    wanted(endpoint).contains(&tipo)
}

pub struct NewEndpoint<'a> {
    pub merchant: Uuid,
    pub url: &'a str,
    pub types: Option<&'a [EventType]>,
    pub secret: &'a str,
}

pub async fn create(
    db: &DatabaseConnection,
    new: NewEndpoint<'_>,
) -> Result<endpoints::Model, DbErr> {
    let at = now();
    let model = endpoints::Model {
        id: Uuid::now_v7(),
        merchant_id: new.merchant,
        url: new.url.to_owned(),
        event_types: stored_types(new.types),
        secret: new.secret.to_owned(),
        previous_secret: None,
        previous_secret_until: None,
        state: EndpointState::Activo,
        failing_since: None,
        disabled_reason: None,
        created_at: at,
        updated_at: at,
    };
    endpoints::Entity::insert(endpoints::ActiveModel::from(model.clone()))
        .exec_without_returning(db)
        .await?;
    Ok(model)
}

/// The merchant's endpoints, oldest first.
pub async fn list(db: &DatabaseConnection, merchant: Uuid) -> Result<Vec<endpoints::Model>, DbErr> {
    endpoints::Entity::find()
        .filter(endpoints::Column::MerchantId.eq(merchant))
        .order_by_asc(endpoints::Column::CreatedAt)
        .order_by_asc(endpoints::Column::Id)
        .all(db)
        .await
}

pub async fn find(
    db: &impl ConnectionTrait,
    merchant: Uuid,
    id: Uuid,
) -> Result<Option<endpoints::Model>, DbErr> {
    endpoints::Entity::find_by_id(id)
        .filter(endpoints::Column::MerchantId.eq(merchant))
        .one(db)
        .await
}

/// A write transaction and the merchant's endpoint `id` read in it; `None` (the
/// transaction rolled back) if the merchant has no such endpoint.
async fn begin_on(
    db: &DatabaseConnection,
    merchant: Uuid,
    id: Uuid,
) -> Result<Option<(DatabaseTransaction, endpoints::Model)>, DbErr> {
    let tx = begin_write(db).await?;
    match find(&tx, merchant, id).await? {
        Some(found) => Ok(Some((tx, found))),
        None => {
            tx.rollback().await?;
            Ok(None)
        }
    }
}

/// Removes the endpoint, its deliveries and their attempts; false if there was none.
pub async fn delete(db: &DatabaseConnection, merchant: Uuid, id: Uuid) -> Result<bool, DbErr> {
    let Some((tx, _)) = begin_on(db, merchant, id).await? else {
        return Ok(false);
    };
    attempts::Entity::delete_many()
        .filter(attempts::Column::EndpointId.eq(id))
        .exec(&tx)
        .await?;
    deliveries::Entity::delete_many()
        .filter(deliveries::Column::EndpointId.eq(id))
        .exec(&tx)
        .await?;
    endpoints::Entity::delete_by_id(id).exec(&tx).await?;
    tx.commit().await?;
    Ok(true)
}

/// A new secret; the current one goes on signing beside it until `overlap_until`.
pub async fn rotate(
    db: &DatabaseConnection,
    merchant: Uuid,
    id: Uuid,
    new_secret: &str,
    overlap_until: DateTime<Utc>,
) -> Result<Option<endpoints::Model>, DbErr> {
    let Some((tx, found)) = begin_on(db, merchant, id).await? else {
        return Ok(None);
    };
    let mut model = found.clone().into_active_model();
    model.previous_secret = Set(Some(found.secret.clone()));
    model.previous_secret_until = Set(Some(overlap_until));
    model.secret = Set(new_secret.to_owned());
    model.updated_at = Set(now());
    let updated = model.update(&tx).await?;
    tx.commit().await?;
    Ok(Some(updated))
}

/// `ACTIVO` again: if it was `DESACTIVADO`, its pending deliveries are due now; and with
/// `resend_since` every event of the merchant since then that the endpoint wants and
/// that is not pending already is delivered again (its schedule starting over),
/// delivered before or not.
pub async fn reactivate(
    db: &DatabaseConnection,
    merchant: Uuid,
    id: Uuid,
    resend_since: Option<DateTime<Utc>>,
) -> Result<Option<endpoints::Model>, DbErr> {
    let at = now();
    let Some((tx, found)) = begin_on(db, merchant, id).await? else {
        return Ok(None);
    };
    let mut model = found.clone().into_active_model();
    model.state = Set(EndpointState::Activo);
    model.failing_since = Set(None);
    model.disabled_reason = Set(None);
    model.updated_at = Set(at);
    let updated = model.update(&tx).await?;
    // What was pending when it went down starts a new round now. (An endpoint that was
    // active may have a delivery claimed by a worker right now: making that one due
    // again would let a second worker send the same attempt, so its deliveries keep
    // their schedule.)
    let was_down = found.state == EndpointState::Desactivado;
    deliveries::Entity::update_many()
        .col_expr(deliveries::Column::NextAttemptAt, Expr::value(at))
        .col_expr(
            deliveries::Column::RoundStart,
            Expr::col(deliveries::Column::Attempts),
        )
        .col_expr(deliveries::Column::UpdatedAt, Expr::value(at))
        .filter(deliveries::Column::EndpointId.eq(id))
        .filter(deliveries::Column::State.eq(DeliveryState::Pending))
        .filter(Expr::value(was_down))
        .exec(&tx)
        .await?;
    if let Some(since) = resend_since {
        // One statement, whatever the merchant's history: the rows are made from the
        // events in the database (never their bodies in memory), and the write lock
        // (`BEGIN IMMEDIATE` on SQLite) is held for that one statement.
        let events = Query::select()
            .column((event::Entity, event::Column::Id))
            .expr(Expr::value(id))
            .column((event::Entity, event::Column::MerchantId))
            .expr(Expr::value(DeliveryState::Pending))
            .expr(Expr::value(0))
            .expr(Expr::value(0))
            .expr(Expr::value(at))
            .expr(Expr::value(at))
            .expr(Expr::value(at))
            .from(event::Entity)
            .and_where(event::Column::MerchantId.eq(merchant))
            .and_where(event::Column::CreatedAt.gte(since))
            .and_where(event::Column::EventType.is_in(wanted(&updated)))
            .to_owned();
        let redeliver = Query::insert()
            .into_table(deliveries::Entity)
            .columns([
                deliveries::Column::EventId,
                deliveries::Column::EndpointId,
                deliveries::Column::MerchantId,
                deliveries::Column::State,
                deliveries::Column::Attempts,
                deliveries::Column::RoundStart,
                deliveries::Column::NextAttemptAt,
                deliveries::Column::CreatedAt,
                deliveries::Column::UpdatedAt,
            ])
            .select_from(events)
            .map_err(|e| DbErr::Custom(e.to_string()))?
            .on_conflict(
                OnConflict::columns([deliveries::Column::EventId, deliveries::Column::EndpointId])
                    .value(deliveries::Column::State, DeliveryState::Pending)
                    .value(deliveries::Column::NextAttemptAt, at)
                    .value(deliveries::Column::UpdatedAt, at)
                    .value(
                        deliveries::Column::RoundStart,
                        Expr::col((deliveries::Entity, deliveries::Column::Attempts)),
                    )
                    // One still pending is already on its way (see above).
                    .action_and_where(deliveries::Column::State.ne(DeliveryState::Pending))
                    .to_owned(),
            )
            .to_owned();
        tx.execute(&redeliver).await?;
    }
    tx.commit().await?;
    Ok(Some(updated))
}

/// Whether the secret before the last rotation still signs at `at`.
pub fn previous_secret_at(endpoint: &endpoints::Model, at: DateTime<Utc>) -> Option<&str> {
    match (&endpoint.previous_secret, endpoint.previous_secret_until) {
        (Some(previous), Some(until)) if at < until => Some(previous),
        _ => None,
    }
}

/// How many endpoints are `DESACTIVADO`.
pub async fn count_disabled(db: &DatabaseConnection) -> Result<i64, DbErr> {
    use sea_orm::PaginatorTrait;
    let n = endpoints::Entity::find()
        .filter(endpoints::Column::State.eq(EndpointState::Desactivado))
        .count(db)
        .await?;
    Ok(i64::try_from(n).unwrap_or(i64::MAX))
}
