//! The delivery worker's storage: fan-out (each new event gets one delivery per
//! endpoint of its merchant that wants its type: pending to an active one, given up to a
//! deactivated one), claims of due deliveries, and each attempt stored with what it means
//! for its delivery and its endpoint.
//!
//! Claims are like the reconciler's: on PostgreSQL `FOR UPDATE SKIP LOCKED` in a short
//! transaction, on SQLite under `BEGIN IMMEDIATE`; a claim writes `claimed_until` (and
//! moves `next_attempt_at` there too), and no claim takes a delivery whose
//! `claimed_until` has not run out, so no other process takes it while this one sends it,
//! even if something reschedules it meanwhile (a reactivation makes an endpoint's pending
//! deliveries due now). Storing the attempt clears the claim. A claim
//! takes each active endpoint's share (its room) before its limit, so one endpoint's
//! backlog never holds up another's deliveries. An
//! attempt is stored fenced on the delivery's attempt count (and its number is unique per
//! delivery): a worker whose claim ran out cannot store a second attempt of the same
//! number.

use crate::db::{begin_write, now};
use crate::delivery::Attempt;
use crate::entities::event::{self, EventType};
use crate::entities::event_to_fan_out as queued;
use crate::entities::webhook_attempt as attempts;
use crate::entities::webhook_delivery::{self as deliveries, DeliveryState};
use crate::entities::webhook_endpoint::{self as endpoints, EndpointState};
use crate::outbox::endpoints::wants;
use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use sea_orm::sea_query::{Condition, Expr, Func, LockBehavior, LockType};
use sea_orm::{
    ColumnTrait, ConnectionTrait, DatabaseConnection, DbBackend, DbErr, EntityTrait, QueryFilter,
    QueryOrder, QuerySelect, Select, Statement,
};
use std::collections::HashMap;
use uuid::Uuid;

/// A claimed delivery with what sending it needs.
#[derive(Clone, Debug)]
pub struct Due {
    pub delivery: deliveries::Model,
    pub event: event::Model,
    pub endpoint: endpoints::Model,
}

/// On PostgreSQL, rows another process is claiming are skipped.
fn skip_locked<E: EntityTrait>(query: Select<E>, backend: DbBackend) -> Select<E> {
    if backend == DbBackend::Postgres {
        query.lock_with_behavior(LockType::Update, LockBehavior::SkipLocked)
    } else {
        query
    }
}

/// Delivery rows per insert of the fan-out: 11 values each, well under what one
/// statement may bind (32,766 values on SQLite, 65,535 on PostgreSQL); a round of 500
/// events to 14 endpoints is 7,000 rows.
const ROWS_PER_INSERT: usize = 1_000;

/// Makes the deliveries of up to `limit` events not fanned out yet (those in
/// `events_to_fan_out`, whose rows it deletes), due at `due_at`;
/// the number of events fanned out. An event of a merchant with no endpoint that wants it
/// gets none (it is then never "pending").
///
/// To a `DESACTIVADO` endpoint the delivery is made `ABANDONADA`, with no attempt: the
/// event was not delivered there, so `GET /v1/eventos?pendientes=true` keeps it, and a
/// reactivation with `reenviarDesde` sends it; no claim ever scans it (claims take
/// `PENDIENTE` rows), however long the endpoint stays down.
pub async fn fan_out(
    db: &DatabaseConnection,
    limit: u64,
    due_at: impl Fn(DateTime<Utc>) -> DateTime<Utc>,
) -> Result<usize, DbErr> {
    let tx = begin_write(db).await?;
    let query = queued::Entity::find()
        .order_by_asc(queued::Column::EventId)
        .limit(limit);
    let ids: Vec<String> = skip_locked(query, db.get_database_backend())
        .all(&tx)
        .await?
        .into_iter()
        .map(|q| q.event_id)
        .collect();
    if ids.is_empty() {
        tx.rollback().await?;
        return Ok(0);
    }
    // What the fan-out reads of an event: not its body (~1 KiB), which only an attempt
    // sends.
    let events: Vec<(String, Uuid, EventType, DateTime<Utc>)> = event::Entity::find()
        .select_only()
        .columns([
            event::Column::Id,
            event::Column::MerchantId,
            event::Column::EventType,
            event::Column::CreatedAt,
        ])
        .filter(event::Column::Id.is_in(ids.clone()))
        .order_by_asc(event::Column::Id)
        .into_tuple()
        .all(&tx)
        .await?;
    let mut merchants: Vec<Uuid> = events.iter().map(|e| e.1).collect();
    merchants.sort_unstable();
    merchants.dedup();
    let endpoints = endpoints::Entity::find()
        .filter(endpoints::Column::MerchantId.is_in(merchants))
        .all(&tx)
        .await?;
    let at = now();
    let mut rows = Vec::new();
    for (id, merchant, event_type, created_at) in &events {
        for endpoint in endpoints
            .iter()
            .filter(|ep| ep.merchant_id == *merchant && wants(ep, *event_type))
        {
            rows.push(deliveries::ActiveModel::from(deliveries::Model {
                event_id: id.clone(),
                endpoint_id: endpoint.id,
                merchant_id: *merchant,
                state: match endpoint.state {
                    EndpointState::Activo => DeliveryState::Pending,
                    EndpointState::Desactivado => DeliveryState::GivenUp,
                },
                attempts: 0,
                round_start: 0,
                next_attempt_at: due_at(*created_at),
                claimed_until: None,
                delivered_at: None,
                created_at: at,
                updated_at: at,
            }));
        }
    }
    // In statements of at most `ROWS_PER_INSERT` rows, all in this transaction: a round
    // to many endpoints makes more rows than one statement may bind, and a round that
    // fails is taken up again whole by the next, which would fail the same way.
    let mut rows = rows.into_iter().peekable();
    while rows.peek().is_some() {
        let chunk: Vec<_> = rows.by_ref().take(ROWS_PER_INSERT).collect();
        deliveries::Entity::insert_many(chunk)
            .on_conflict_do_nothing()
            .exec_without_returning(&tx)
            .await?;
    }
    queued::Entity::delete_many()
        .filter(queued::Column::EventId.is_in(ids.clone()))
        .exec(&tx)
        .await?;
    tx.commit().await?;
    Ok(ids.len())
}

/// Each `ACTIVO` endpoint's oldest deliveries due by `$1` and not claimed (their
/// `claimed_until` run out by `$1`, or none), at most `$2` of each: a short read of
/// `webhook_deliveries_endpoint_due_idx` per endpoint, in its order, whatever its backlog,
/// and nothing of a `DESACTIVADO` endpoint's (its pending deliveries stay due until it is
/// reactivated). A claim moves `next_attempt_at` to `claimed_until`, so the rows the claim
/// filter passes over are only those rescheduled while in flight: at most the endpoint's
/// attempts in flight. PostgreSQL: a `LATERAL` subquery; SQLite: the same as a correlated
/// list of rowids.
fn due_per_endpoint(backend: DbBackend) -> &'static str {
    match backend {
        DbBackend::Postgres => {
            r#"SELECT "d"."event_id", "d"."endpoint_id", "d"."next_attempt_at"
                 FROM "webhook_endpoints" AS "e"
                 CROSS JOIN LATERAL (
                     SELECT "x"."event_id", "x"."endpoint_id", "x"."next_attempt_at"
                       FROM "webhook_deliveries" AS "x"
                      WHERE "x"."endpoint_id" = "e"."id" AND "x"."state" = 'PENDIENTE'
                        AND "x"."next_attempt_at" <= $1
                        AND ("x"."claimed_until" IS NULL OR "x"."claimed_until" <= $1)
                      ORDER BY "x"."next_attempt_at", "x"."event_id"
                      LIMIT $2) AS "d"
                WHERE "e"."state" = 'ACTIVO'"#
        }
        _ => {
            r#"SELECT "d"."event_id", "d"."endpoint_id", "d"."next_attempt_at"
                 FROM "webhook_endpoints" AS "e", "webhook_deliveries" AS "d"
                WHERE "e"."state" = 'ACTIVO' AND "d"."rowid" IN (
                     SELECT "x"."rowid"
                       FROM "webhook_deliveries" AS "x"
                      WHERE "x"."endpoint_id" = "e"."id" AND "x"."state" = 'PENDIENTE'
                        AND "x"."next_attempt_at" <= ?1
                        AND ("x"."claimed_until" IS NULL OR "x"."claimed_until" <= ?1)
                      ORDER BY "x"."next_attempt_at", "x"."event_id"
                      LIMIT ?2)"#
        }
    }
}

/// Deliveries no worker holds at `at`: never claimed, their attempt stored since, or
/// their claim run out.
fn unclaimed(at: DateTime<Utc>) -> Condition {
    Condition::any()
        .add(deliveries::Column::ClaimedUntil.is_null())
        .add(deliveries::Column::ClaimedUntil.lte(at))
}

/// Claims up to `limit` deliveries due by `due_by` to active endpoints, oldest due
/// first, to one endpoint at most `per_endpoint` less the caller's attempts in flight to
/// it (`busy`, by endpoint); each held for `hold` from when it is locked.
///
/// The room of each endpoint is applied before the `limit`: the candidates are each
/// active endpoint's oldest due deliveries (at most `per_endpoint` of each), and the
/// claim is the oldest `limit` of those within their endpoint's room. (Taking the oldest
/// `limit` due rows and then dropping those past an endpoint's room left the claim to one
/// endpoint's backlog: every other merchant's deliveries waited until it drained.)
/// The candidates are locked by key and checked again under the lock: on PostgreSQL a
/// row another process is claiming is skipped, one it claimed since is no longer due.
///
/// A claimed delivery gets `claimed_until` and `next_attempt_at` both at the time of the
/// lock + `hold` (whole milliseconds, so that it reads back as written on both databases:
/// `record` clears the claim only if it is still this one). No claim takes a delivery
/// whose `claimed_until` has not run out, whatever reschedules it meanwhile: a
/// reactivation of its endpoint makes its pending deliveries due now, and without its own
/// claim the one in flight was sent again by another worker.
pub async fn claim_due(
    db: &DatabaseConnection,
    due_by: DateTime<Utc>,
    limit: u64,
    hold: TimeDelta,
    per_endpoint: usize,
    busy: &HashMap<Uuid, usize>,
) -> Result<Vec<Due>, DbErr> {
    let room =
        |endpoint: Uuid| per_endpoint.saturating_sub(busy.get(&endpoint).copied().unwrap_or(0));
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    if limit == 0 || per_endpoint == 0 {
        return Ok(Vec::new());
    }
    let backend = db.get_database_backend();
    // Nothing due anywhere (an idle process's every top-up): one probe of the due index,
    // not one per endpoint, and no write transaction (SQLite's one write lock). Only an
    // active endpoint's: a deactivated endpoint's delivery stays due, never claimed, and
    // would open the write transaction at every top-up.
    let any_due = deliveries::Entity::find()
        .filter(deliveries::Column::State.eq(DeliveryState::Pending))
        .filter(deliveries::Column::NextAttemptAt.lte(due_by))
        .filter(unclaimed(due_by))
        .filter(
            deliveries::Column::EndpointId.in_subquery(
                sea_orm::sea_query::Query::select()
                    .column(endpoints::Column::Id)
                    .from(endpoints::Entity)
                    .and_where(endpoints::Column::State.eq(EndpointState::Activo))
                    .to_owned(),
            ),
        )
        .one(db)
        .await?;
    if any_due.is_none() {
        return Ok(Vec::new());
    }
    let tx = begin_write(db).await?;
    let rows = tx
        .query_all_raw(Statement::from_sql_and_values(
            backend,
            due_per_endpoint(backend),
            [
                due_by.into(),
                i64::try_from(per_endpoint).unwrap_or(i64::MAX).into(),
            ],
        ))
        .await?;
    let mut candidates = rows
        .iter()
        .map(|row| {
            Ok((
                row.try_get::<DateTime<Utc>>("", "next_attempt_at")?,
                row.try_get::<String>("", "event_id")?,
                row.try_get::<Uuid>("", "endpoint_id")?,
            ))
        })
        .collect::<Result<Vec<_>, DbErr>>()?;
    candidates.sort_unstable();
    let mut taken: HashMap<Uuid, usize> = HashMap::new();
    let mut keys = Condition::any();
    let mut picked = 0;
    for (_, event_id, endpoint) in candidates {
        let n = taken.entry(endpoint).or_default();
        if *n >= room(endpoint) {
            continue;
        }
        *n += 1;
        keys = keys.add(
            Condition::all()
                .add(deliveries::Column::EventId.eq(event_id))
                .add(deliveries::Column::EndpointId.eq(endpoint)),
        );
        picked += 1;
        if picked == limit {
            break;
        }
    }
    if picked == 0 {
        tx.rollback().await?;
        return Ok(Vec::new());
    }
    let query = deliveries::Entity::find()
        .filter(keys)
        .filter(deliveries::Column::State.eq(DeliveryState::Pending))
        .filter(deliveries::Column::NextAttemptAt.lte(due_by))
        .filter(unclaimed(due_by))
        .order_by_asc(deliveries::Column::NextAttemptAt);
    let mut claimed: Vec<deliveries::Model> = skip_locked(query, backend).all(&tx).await?;
    if claimed.is_empty() {
        tx.rollback().await?;
        return Ok(Vec::new());
    }
    // Held from now, the rows locked: not from before the wait for a connection or the
    // write lock, which the attempt's own time must not pay for.
    let until = now()
        .checked_add_signed(hold)
        .and_then(|t| t.duration_trunc(TimeDelta::milliseconds(1)).ok())
        .unwrap_or(DateTime::<Utc>::MAX_UTC);
    for d in &mut claimed {
        deliveries::Entity::update_many()
            .col_expr(deliveries::Column::NextAttemptAt, Expr::value(until))
            .col_expr(deliveries::Column::ClaimedUntil, Expr::value(Some(until)))
            .filter(deliveries::Column::EventId.eq(d.event_id.clone()))
            .filter(deliveries::Column::EndpointId.eq(d.endpoint_id))
            .exec(&tx)
            .await?;
        d.next_attempt_at = until;
        d.claimed_until = Some(until);
    }
    tx.commit().await?;
    let events: HashMap<String, event::Model> = event::Entity::find()
        .filter(event::Column::Id.is_in(claimed.iter().map(|d| d.event_id.clone())))
        .all(db)
        .await?
        .into_iter()
        .map(|e| (e.id.clone(), e))
        .collect();
    let endpoints: HashMap<Uuid, endpoints::Model> = endpoints::Entity::find()
        .filter(endpoints::Column::Id.is_in(claimed.iter().map(|d| d.endpoint_id)))
        .all(db)
        .await?
        .into_iter()
        .map(|e| (e.id, e))
        .collect();
    Ok(claimed
        .into_iter()
        .filter_map(|delivery| {
            let event = events.get(&delivery.event_id)?.clone();
            let endpoint = endpoints.get(&delivery.endpoint_id)?.clone();
            Some(Due {
                delivery,
                event,
                endpoint,
            })
        })
        .collect())
}

/// What becomes of the delivery after an attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum After {
    Delivered,
    RetryAt(DateTime<Utc>),
    /// The schedule ran out: `ABANDONADA`.
    GiveUp,
}

/// What becomes of the endpoint after an attempt.
///
/// The endpoint's `failing_since` is never carried from the claim to the store: another
/// attempt of the same batch may have succeeded (and cleared it) in between, so a failure
/// reads and writes it in the statements that store it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EndpointAfter {
    /// A success: it is failing no more.
    Succeeded,
    /// A failure at `at`: failing since its first failure after its last success (this
    /// one, if the row says none); `DESACTIVADO`, for `reason`, if the row says it has
    /// been failing since `disable_if_failing_since` or earlier (never, when None: a
    /// delivery's first attempt, `dispatcher::decide`).
    Failed {
        at: DateTime<Utc>,
        disable_if_failing_since: Option<DateTime<Utc>>,
        reason: String,
    },
    /// `DESACTIVADO` at once (a failure at `at`), for this reason, if the endpoint is as
    /// the attempt's claim read it (`updated_at` no later than `as_read`): one the
    /// merchant reactivated or changed since is not deactivated by the older attempt.
    Deactivate {
        at: DateTime<Utc>,
        as_read: DateTime<Utc>,
        reason: String,
    },
}

/// What storing an attempt did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recorded {
    /// Nothing: the delivery's attempt count moved since it was claimed (another worker
    /// stored this attempt).
    Raced,
    /// Nothing: the delivery's round started over since it was claimed (its endpoint was
    /// reactivated while the attempt was in flight); what the attempt means must be
    /// decided again in the round it now belongs to, which starts at `round_start`.
    RoundMoved { round_start: i32 },
    /// The attempt, its delivery and its endpoint stored.
    Stored,
    /// Stored, and the endpoint became `DESACTIVADO`.
    StoredAndDeactivated,
}

/// Stores `attempt` of the claimed delivery `due`, and what it means for the delivery and
/// its endpoint, in one transaction; nothing if the delivery's attempt count moved since
/// it was claimed (another worker stored this attempt), or if its round did (`RoundMoved`:
/// decide again and store). The claim is cleared if it is
/// still this one: a worker whose claim ran out, and which stores its attempt while
/// another worker holds the delivery, leaves that worker's claim in place.
pub async fn record(
    db: &DatabaseConnection,
    due: &Due,
    attempt: &Attempt,
    after: After,
    endpoint: EndpointAfter,
) -> Result<Recorded, DbErr> {
    let at = now();
    let d = &due.delivery;
    let number = d.attempts + 1;
    let tx = begin_write(db).await?;
    // The endpoint first, then its delivery: the order of every writer of both (a
    // deletion, a reactivation), which otherwise held the endpoint and waited for this
    // delivery while this held the delivery and waited for the endpoint (the attempt's
    // foreign-key check, the endpoint's update): a deadlock, PostgreSQL aborting one of
    // them (the merchant's DELETE answered 503, or this attempt lost and sent again).
    if db.get_database_backend() == DbBackend::Postgres {
        let endpoint = endpoints::Entity::find_by_id(d.endpoint_id)
            .select_only()
            .column(endpoints::Column::Id)
            .lock(LockType::NoKeyUpdate)
            .into_tuple::<Uuid>()
            .one(&tx)
            .await?;
        if endpoint.is_none() {
            tx.rollback().await?;
            return Ok(Recorded::Raced);
        }
    }
    let (state, next, delivered_at) = match after {
        After::Delivered => (DeliveryState::Delivered, d.next_attempt_at, Some(at)),
        After::RetryAt(t) => (DeliveryState::Pending, t, None),
        After::GiveUp => (DeliveryState::GivenUp, d.next_attempt_at, None),
    };
    let moved = deliveries::Entity::update_many()
        .col_expr(deliveries::Column::Attempts, Expr::value(number))
        .col_expr(deliveries::Column::State, Expr::value(state))
        .col_expr(deliveries::Column::NextAttemptAt, Expr::value(next))
        .col_expr(deliveries::Column::DeliveredAt, Expr::value(delivered_at))
        .col_expr(deliveries::Column::ClaimedUntil, released(d.claimed_until))
        .col_expr(deliveries::Column::UpdatedAt, Expr::value(at))
        .filter(deliveries::Column::EventId.eq(d.event_id.clone()))
        .filter(deliveries::Column::EndpointId.eq(d.endpoint_id))
        .filter(deliveries::Column::Attempts.eq(d.attempts))
        .filter(deliveries::Column::RoundStart.eq(d.round_start))
        .exec(&tx)
        .await?;
    if moved.rows_affected != 1 {
        let now_is = deliveries::Entity::find_by_id((d.event_id.clone(), d.endpoint_id))
            .one(&tx)
            .await?;
        tx.rollback().await?;
        return Ok(match now_is {
            Some(row) if row.attempts == d.attempts && row.round_start != d.round_start => {
                Recorded::RoundMoved {
                    round_start: row.round_start,
                }
            }
            _ => Recorded::Raced,
        });
    }
    attempts::Entity::insert(attempts::ActiveModel::from(attempts::Model {
        id: Uuid::now_v7(),
        event_id: d.event_id.clone(),
        endpoint_id: d.endpoint_id,
        number,
        attempted_at: attempt.at,
        status: attempt.status.map(i32::from),
        latency_ms: i64::try_from(attempt.latency.as_millis()).unwrap_or(i64::MAX),
        answer: attempt.answer.clone(),
        error: attempt.error.clone(),
        outcome: attempt.outcome.as_str().to_owned(),
    }))
    .exec_without_returning(&tx)
    .await?;
    let deactivated = write_endpoint(&tx, d.endpoint_id, &endpoint, at).await?;
    tx.commit().await?;
    Ok(if deactivated {
        Recorded::StoredAndDeactivated
    } else {
        Recorded::Stored
    })
}

/// Gives back the claims of deliveries whose attempts were never begun (the worker told to
/// stop while it claimed them): each due now and held by nobody, for another process's
/// next top-up rather than once its claim runs out. Only a claim still this one and no
/// attempt stored since: one that ran out and was taken again is the other worker's.
pub async fn release(db: &DatabaseConnection, claimed: &[Due]) -> Result<(), DbErr> {
    let at = now();
    for due in claimed {
        let d = &due.delivery;
        let Some(ours) = d.claimed_until else {
            continue;
        };
        deliveries::Entity::update_many()
            .col_expr(deliveries::Column::NextAttemptAt, Expr::value(at))
            .col_expr(
                deliveries::Column::ClaimedUntil,
                Expr::value(Option::<DateTime<Utc>>::None),
            )
            .filter(deliveries::Column::EventId.eq(d.event_id.clone()))
            .filter(deliveries::Column::EndpointId.eq(d.endpoint_id))
            .filter(deliveries::Column::ClaimedUntil.eq(ours))
            .filter(deliveries::Column::Attempts.eq(d.attempts))
            .exec(db)
            .await?;
    }
    Ok(())
}

/// `claimed_until` once the attempt of the claim `ours` is stored: none if the row still
/// holds that claim, else the row's own (another worker's, or none).
fn released(ours: Option<DateTime<Utc>>) -> Expr {
    let none = Expr::value(Option::<DateTime<Utc>>::None);
    match ours {
        Some(ours) => Expr::case(deliveries::Column::ClaimedUntil.eq(ours), none)
            .finally(Expr::col(deliveries::Column::ClaimedUntil))
            .into(),
        None => Expr::col(deliveries::Column::ClaimedUntil),
    }
}

/// Writes what the attempt means for endpoint `id`; whether it became `DESACTIVADO`.
/// Every decision on `failing_since` is taken on the row as it is now, in the statement
/// that writes it: a success stored since the claim counts.
async fn write_endpoint<C: ConnectionTrait>(
    tx: &C,
    id: Uuid,
    after: &EndpointAfter,
    at: DateTime<Utc>,
) -> Result<bool, DbErr> {
    let update = endpoints::Entity::update_many().filter(endpoints::Column::Id.eq(id));
    // Failing since the first failure after the last success: this one if none.
    let failing_since = |failed_at: DateTime<Utc>| {
        Expr::from(Func::coalesce([
            Expr::col(endpoints::Column::FailingSince),
            Expr::value(failed_at),
        ]))
    };
    let deactivate = |reason: &str| {
        endpoints::Entity::update_many()
            .col_expr(
                endpoints::Column::State,
                Expr::value(EndpointState::Desactivado),
            )
            .col_expr(
                endpoints::Column::DisabledReason,
                Expr::value(Some(reason.to_owned())),
            )
            .col_expr(endpoints::Column::UpdatedAt, Expr::value(at))
            .filter(endpoints::Column::Id.eq(id))
            .filter(endpoints::Column::State.eq(EndpointState::Activo))
    };
    match after {
        EndpointAfter::Succeeded => {
            update
                .col_expr(
                    endpoints::Column::FailingSince,
                    Expr::value(Option::<DateTime<Utc>>::None),
                )
                .filter(endpoints::Column::FailingSince.is_not_null())
                .exec(tx)
                .await?;
            Ok(false)
        }
        EndpointAfter::Failed {
            at: failed_at,
            disable_if_failing_since,
            reason,
        } => {
            update
                .col_expr(endpoints::Column::FailingSince, failing_since(*failed_at))
                .exec(tx)
                .await?;
            let Some(horizon) = disable_if_failing_since else {
                return Ok(false);
            };
            // Fenced on the value just written: failing since before the horizon, with no
            // success in between.
            let done = deactivate(reason)
                .filter(endpoints::Column::FailingSince.lte(*horizon))
                .exec(tx)
                .await?;
            Ok(done.rows_affected == 1)
        }
        EndpointAfter::Deactivate {
            at: failed_at,
            as_read,
            reason,
        } => {
            // Only the endpoint as the attempt's claim read it: one the merchant changed or
            // reactivated since (told `ACTIVO`, having fixed what was gone) is not
            // deactivated by an older attempt's answer. Compared with the value read, not
            // with a clock: the attempt's host and the one that reactivated may be apart.
            let done = deactivate(reason)
                .col_expr(endpoints::Column::FailingSince, failing_since(*failed_at))
                .filter(endpoints::Column::UpdatedAt.lte(*as_read))
                .exec(tx)
                .await?;
            Ok(done.rows_affected == 1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sea_orm::Iterable;

    /// The most values one statement may bind on SQLite (its bundled build's
    /// `SQLITE_MAX_VARIABLE_NUMBER`); PostgreSQL allows 65,535.
    const MAX_BOUND_VALUES: usize = 32_766;

    #[test]
    fn one_insert_of_the_fan_out_binds_fewer_values_than_either_database_allows() {
        let values = ROWS_PER_INSERT * deliveries::Column::iter().count();
        assert!(values <= MAX_BOUND_VALUES, "{values}");
    }
}
