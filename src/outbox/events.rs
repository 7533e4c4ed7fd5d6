//! Reading a merchant's events: the list (`GET /v1/eventos`, by id, which is the order
//! they were written in) and one event with its deliveries and attempts.

use crate::entities::webhook_attempt as attempts;
use crate::entities::webhook_delivery as deliveries;
use crate::entities::{event, webhook_endpoint as endpoints};
use sea_orm::sea_query::Expr;
use sea_orm::{
    ColumnTrait, DatabaseConnection, DbErr, EntityTrait, QueryFilter, QueryOrder, QuerySelect,
};
use uuid::Uuid;

/// Not yet delivered to every endpoint that wants it: not fanned out yet, or with a
/// delivery that is not `ENTREGADA`.
fn pending() -> sea_orm::sea_query::SimpleExpr {
    Expr::cust(
        r#"(EXISTS (SELECT 1 FROM "events_to_fan_out" AS "q" WHERE "q"."event_id" = "events"."id") OR EXISTS (SELECT 1 FROM "webhook_deliveries" AS "d" WHERE "d"."event_id" = "events"."id" AND "d"."state" IN ('PENDIENTE', 'ABANDONADA')))"#,
    )
}

/// Up to `limit` of the merchant's events after the one with id `after`, oldest first;
/// with `only_pending`, only those not yet delivered to every endpoint.
pub async fn list(
    db: &DatabaseConnection,
    merchant: Uuid,
    after: Option<&str>,
    limit: u64,
    only_pending: bool,
) -> Result<Vec<event::Model>, DbErr> {
    let mut query = event::Entity::find().filter(event::Column::MerchantId.eq(merchant));
    if let Some(after) = after {
        query = query.filter(event::Column::Id.gt(after));
    }
    if only_pending {
        query = query.filter(pending());
    }
    query
        .order_by_asc(event::Column::Id)
        .limit(limit)
        .all(db)
        .await
}

/// One event of the merchant's, its deliveries (with their endpoints' URLs) and every
/// attempt, oldest first.
pub struct Detail {
    pub event: event::Model,
    pub deliveries: Vec<(deliveries::Model, Option<endpoints::Model>)>,
    pub attempts: Vec<attempts::Model>,
}

pub async fn find(
    db: &DatabaseConnection,
    merchant: Uuid,
    id: &str,
) -> Result<Option<Detail>, DbErr> {
    let Some(event) = event::Entity::find_by_id(id.to_owned())
        .filter(event::Column::MerchantId.eq(merchant))
        .one(db)
        .await?
    else {
        return Ok(None);
    };
    let rows = deliveries::Entity::find()
        .filter(deliveries::Column::EventId.eq(id))
        .order_by_asc(deliveries::Column::CreatedAt)
        .all(db)
        .await?;
    let ids: Vec<Uuid> = rows.iter().map(|d| d.endpoint_id).collect();
    let known = endpoints::Entity::find()
        .filter(endpoints::Column::Id.is_in(ids))
        .all(db)
        .await?;
    let deliveries = rows
        .into_iter()
        .map(|d| {
            let endpoint = known.iter().find(|e| e.id == d.endpoint_id).cloned();
            (d, endpoint)
        })
        .collect();
    let attempts = attempts::Entity::find()
        .filter(attempts::Column::EventId.eq(id))
        .order_by_asc(attempts::Column::AttemptedAt)
        .order_by_asc(attempts::Column::Number)
        .all(db)
        .await?;
    Ok(Some(Detail {
        event,
        deliveries,
        attempts,
    }))
}

/// When the oldest event not yet delivered to every endpoint that wants it was written.
/// Two indexed look-ups (events not fanned out; deliveries not delivered), never a scan
/// of every event.
pub async fn oldest_undelivered(
    db: &DatabaseConnection,
) -> Result<Option<chrono::DateTime<chrono::Utc>>, DbErr> {
    let oldest = |condition: sea_orm::sea_query::SimpleExpr| {
        event::Entity::find()
            .select_only()
            .column_as(event::Column::CreatedAt.min(), "oldest")
            .filter(condition)
            .into_tuple::<Option<chrono::DateTime<chrono::Utc>>>()
            .one(db)
    };
    let not_fanned = oldest(Expr::cust(
        r#""events"."id" IN (SELECT "event_id" FROM "events_to_fan_out")"#,
    ))
    .await?
    .flatten();
    let not_delivered = oldest(Expr::cust(
        r#""events"."id" IN (SELECT "event_id" FROM "webhook_deliveries" WHERE "state" IN ('PENDIENTE', 'ABANDONADA'))"#,
    ))
    .await?
    .flatten();
    Ok(not_fanned.into_iter().chain(not_delivered).min())
}
