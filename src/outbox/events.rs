//! Reading a merchant's events: the list (`GET /v1/eventos`, in the order they were
//! committed) and one event with its deliveries and attempts.
//!
//! The list's order is the order of commits, not of ids: an event's id is made before
//! the write that stores it waits for its connection or lock, so ids can commit out of
//! order, and a cursor by id passed over an event committed behind it. On PostgreSQL the
//! order is the writing transaction's id (`events.tx`, filled in by the column's default)
//! and the list shows only events of transactions older than every write of this
//! database still running, so nothing can commit behind a cursor it hands out; on
//! SQLite, whose writers take turns, it is the `rowid` (migration `m20261208_000018`).

use crate::entities::event_to_fan_out as queued;
use crate::entities::webhook_attempt as attempts;
use crate::entities::webhook_delivery::{self as deliveries, DeliveryState};
use crate::entities::{event, webhook_endpoint as endpoints};
use sea_orm::sea_query::{Alias, Expr, ExprTrait, Query, SelectStatement, UnionType};
use sea_orm::{
    ColumnTrait, DatabaseConnection, DbBackend, DbErr, EntityTrait, Order, QueryFilter, QueryOrder,
    QuerySelect,
};
use uuid::Uuid;

/// The merchant's events not yet delivered to every endpoint that wants them: those not
/// fanned out yet, and those with a delivery that is not `ENTREGADA` (every delivery of
/// the merchant's events is to one of its endpoints). Read from the deliveries, by their
/// endpoint (`webhook_deliveries_endpoint_due_idx`), and the fan-out queue: as many rows
/// as there are events pending, never the merchant's whole history.
fn pending_of(merchant: Uuid) -> SelectStatement {
    let endpoints_of = Query::select()
        .column(endpoints::Column::Id)
        .from(endpoints::Entity)
        .and_where(endpoints::Column::MerchantId.eq(merchant))
        .to_owned();
    let not_fanned_out = Query::select()
        .column(queued::Column::EventId)
        .from(queued::Entity)
        .to_owned();
    Query::select()
        .column(deliveries::Column::EventId)
        .from(deliveries::Entity)
        .and_where(deliveries::Column::EndpointId.in_subquery(endpoints_of))
        .and_where(
            deliveries::Column::State.is_in([DeliveryState::Pending, DeliveryState::GivenUp]),
        )
        .union(UnionType::Distinct, not_fanned_out)
        .to_owned()
}

/// PostgreSQL: the event's transaction is older than every write transaction of this
/// database still running when the statement's snapshot was taken, so no event can
/// commit before it afterwards.
///
/// The transactions running then are the snapshot's `xip`; transaction ids are the
/// cluster's, so those known to run in another database (`pg_stat_activity`, by their
/// 32-bit id) are left out: another database's long transaction does not hold this
/// list back. One that has ended since the snapshot is no longer listed there, so it
/// holds the list back: it may have been this database's. With none, everything
/// visible is listed (`xmax`: every later transaction gets a larger id).
const BEFORE_EVERY_WRITE_RUNNING: &str = r#""events"."tx" < COALESCE(
    (SELECT min("r"."xid"::text::bigint)
       FROM pg_snapshot_xip(pg_current_snapshot()) AS "r"("xid")
      WHERE NOT EXISTS (
            SELECT 1 FROM pg_stat_activity AS "a"
             WHERE "a"."datname" <> current_database()
               AND "a"."backend_xid"::text::bigint = ("r"."xid"::text::bigint & 4294967295))),
    pg_snapshot_xmax(pg_current_snapshot())::text::bigint)"#;

/// Where an event stands in the order of commits: what a cursor of the list resumes
/// after.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Position {
    committed: i64,
    id: String,
}

/// The column of commit order: the writing transaction's id on PostgreSQL, the `rowid`
/// on SQLite.
fn commit_order(db: &DatabaseConnection) -> Expr {
    let column = match db.get_database_backend() {
        DbBackend::Postgres => "tx",
        _ => "rowid",
    };
    Expr::col((event::Entity, Alias::new(column)))
}

/// What an event id given as a cursor is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cursor {
    /// An event the list shows: the list resumes after it.
    At(Position),
    /// An event the list does not show yet (PostgreSQL: a write begun before it is still
    /// running, and may commit an event that comes before it). Resuming after it could
    /// pass over that event for good: the caller must use a cursor the list gave.
    NotListedYet,
    /// No event of the merchant's has this id.
    Unknown,
}

/// The merchant's event `id` as a cursor.
pub async fn cursor(db: &DatabaseConnection, merchant: Uuid, id: &str) -> Result<Cursor, DbErr> {
    let listed = match db.get_database_backend() {
        DbBackend::Postgres => Expr::cust(BEFORE_EVERY_WRITE_RUNNING),
        _ => Expr::cust("TRUE"),
    };
    let found: Option<(i64, bool)> = event::Entity::find()
        .select_only()
        .column_as(commit_order(db), "committed")
        .column_as(listed, "listed")
        .filter(event::Column::Id.eq(id))
        .filter(event::Column::MerchantId.eq(merchant))
        .into_tuple()
        .one(db)
        .await?;
    Ok(match found {
        None => Cursor::Unknown,
        Some((_, false)) => Cursor::NotListedYet,
        Some((committed, true)) => Cursor::At(Position {
            committed,
            id: id.to_owned(),
        }),
    })
}

/// Up to `limit` of the merchant's events after `after`, in the order they were
/// committed; with `only_pending`, only those not yet delivered to every endpoint.
///
/// With `only_pending` the events are found from the pending ones (`pending_of`) and
/// sorted, rather than read in order from the merchant's first event until enough are
/// pending (every call read the whole history of a merchant with little pending). The
/// rows, their order and the cursor are the same either way: only the set they are taken
/// from is smaller. On SQLite, whose planner would still walk the merchant's index in
/// order, the merchant is compared as `+merchant_id`, which no index serves.
pub async fn list(
    db: &DatabaseConnection,
    merchant: Uuid,
    after: Option<&Position>,
    limit: u64,
    only_pending: bool,
) -> Result<Vec<event::Model>, DbErr> {
    let of_merchant = if only_pending && db.get_database_backend() == DbBackend::Sqlite {
        Expr::cust_with_values(r#"+"events"."merchant_id" = ?"#, [merchant])
    } else {
        event::Column::MerchantId.eq(merchant)
    };
    let mut query = event::Entity::find().filter(of_merchant);
    if let Some(after) = after {
        query = query.filter(
            Expr::tuple([
                commit_order(db),
                Expr::col((event::Entity, event::Column::Id)),
            ])
            .gt(Expr::tuple([
                Expr::val(after.committed),
                Expr::val(after.id.clone()),
            ])),
        );
    }
    if db.get_database_backend() == DbBackend::Postgres {
        query = query.filter(Expr::cust(BEFORE_EVERY_WRITE_RUNNING));
    }
    if only_pending {
        query = query.filter(event::Column::Id.in_subquery(pending_of(merchant)));
    }
    query
        .order_by(commit_order(db), Order::Asc)
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

/// When the oldest event pagos is still delivering to an `ACTIVO` endpoint (a delivery
/// `PENDIENTE`) was written, or one not fanned out yet. Two indexed look-ups, never a scan
/// of every event.
///
/// A delivery given up (`ABANDONADA`) is left out: pagos sends it no more, so its age
/// would only grow, and the alert on it would stay up with nothing on-call can do (the
/// merchant asks for it again with `reenviarDesde`). Each one is counted once, when it is
/// given up (`pagos_webhook_deliveries_given_up_total`).
///
/// An endpoint that is `DESACTIVADO` gets nothing until it is reactivated: what it did not
/// get is left out here (it would hold the age, and the alert on it, up for as long as
/// the endpoint stays down) and shows as `pagos_webhook_endpoints_disabled`, in the
/// console and in `GET /v1/eventos?pendientes=true`.
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
        r#""events"."id" IN (SELECT "d"."event_id" FROM "webhook_endpoints" AS "e" JOIN "webhook_deliveries" AS "d" ON "d"."endpoint_id" = "e"."id" WHERE "e"."state" = 'ACTIVO' AND "d"."state" = 'PENDIENTE')"#,
    ))
    .await?
    .flatten();
    Ok(not_fanned.into_iter().chain(not_delivered).min())
}
