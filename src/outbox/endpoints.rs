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
use sea_orm::sea_query::{Expr, LockType, OnConflict, Query};
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

/// An endpoint made at `at` with `secret`, `ACTIVO`, never rotated nor failing; every
/// event type, and nil ids and an example URL until the caller sets its own.
pub fn fresh(secret: &str, at: DateTime<Utc>) -> endpoints::Model {
    endpoints::Model {
        id: Uuid::nil(),
        merchant_id: Uuid::nil(),
        url: "https://example.com".into(),
        event_types: None,
        secret: secret.to_owned(),
        previous_secret: None,
        previous_secret_until: None,
        older_secret: None,
        older_secret_until: None,
        state: EndpointState::Activo,
        failing_since: None,
        disabled_reason: None,
        created_at: at,
        updated_at: at,
    }
}

/// The most endpoints a merchant has, in any state: a fan-out round makes one delivery
/// row per event and endpoint of its merchant (a `DESACTIVADO` one included), in one
/// transaction.
pub const MAX_PER_MERCHANT: u64 = 16;

/// Registers the endpoint; `None` (nothing stored) if the merchant has
/// `MAX_PER_MERCHANT` already. Two registrations at once cannot both take the last place:
/// the merchant's row is locked first on PostgreSQL (SQLite's writers take turns).
pub async fn create(
    db: &DatabaseConnection,
    new: NewEndpoint<'_>,
) -> Result<Option<endpoints::Model>, DbErr> {
    use crate::entities::merchant;
    use sea_orm::sea_query::LockType;
    use sea_orm::{DbBackend, PaginatorTrait, QuerySelect};
    let tx = begin_write(db).await?;
    if db.get_database_backend() == DbBackend::Postgres {
        merchant::Entity::find_by_id(new.merchant)
            // FOR NO KEY UPDATE: registrations of one merchant take turns, while the
            // foreign-key checks of its payments' and events' inserts (FOR KEY SHARE)
            // never wait for one.
            .lock(LockType::NoKeyUpdate)
            .one(&tx)
            .await?;
    }
    let have = endpoints::Entity::find()
        .filter(endpoints::Column::MerchantId.eq(new.merchant))
        .count(&tx)
        .await?;
    if have >= MAX_PER_MERCHANT {
        tx.rollback().await?;
        return Ok(None);
    }
    let mut model = fresh(new.secret, now());
    model.id = Uuid::now_v7();
    model.merchant_id = new.merchant;
    new.url.clone_into(&mut model.url);
    model.event_types = stored_types(new.types);
    endpoints::Entity::insert(endpoints::ActiveModel::from(model.clone()))
        .exec_without_returning(&tx)
        .await?;
    tx.commit().await?;
    Ok(Some(model))
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

/// A write transaction and the merchant's endpoint `id` read in it, its row locked until
/// the transaction ends (`lock` on PostgreSQL; SQLite's `BEGIN IMMEDIATE` writers take
/// turns); `None` (the transaction rolled back) if the merchant has no such endpoint.
/// A change worked out from the row read (a rotation keeps the secret it replaces) is
/// written over that row: two rotations at once no longer both replace the same secret,
/// the second writing over the first, whose answer handed out a secret that never signed.
///
/// The endpoint is locked before any of its deliveries, as a stored attempt does
/// ([`super::deliveries::record`]): the two never wait for each other crosswise. A change
/// that keeps the row takes `FOR NO KEY UPDATE`, which the foreign-key checks of the
/// fan-out's new deliveries (`FOR KEY SHARE`) do not wait for: a reactivation resending
/// events never holds the endpoint while waiting for a fan-out that waits for it. Only a
/// deletion takes `FOR UPDATE`.
async fn begin_on(
    db: &DatabaseConnection,
    merchant: Uuid,
    id: Uuid,
    lock: LockType,
) -> Result<Option<(DatabaseTransaction, endpoints::Model)>, DbErr> {
    use sea_orm::QuerySelect;
    let tx = begin_write(db).await?;
    let found = endpoints::Entity::find_by_id(id)
        .filter(endpoints::Column::MerchantId.eq(merchant))
        .lock(lock)
        .one(&tx)
        .await?;
    match found {
        Some(found) => Ok(Some((tx, found))),
        None => {
            tx.rollback().await?;
            Ok(None)
        }
    }
}

/// Removes the endpoint, its deliveries and their attempts; false if there was none.
pub async fn delete(db: &DatabaseConnection, merchant: Uuid, id: Uuid) -> Result<bool, DbErr> {
    let Some((tx, _)) = begin_on(db, merchant, id, LockType::Update).await? else {
        return Ok(false);
    };
    crate::failpoint::pause("endpoint_locked").await;
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

/// A new secret; the current one goes on signing beside it until `overlap_until`, and the
/// one the last rotation replaced keeps the rest of its own overlap (see [`rotated`]).
pub async fn rotate(
    db: &DatabaseConnection,
    merchant: Uuid,
    id: Uuid,
    new_secret: &str,
    overlap_until: DateTime<Utc>,
) -> Result<Option<endpoints::Model>, DbErr> {
    let Some((tx, found)) = begin_on(db, merchant, id, LockType::NoKeyUpdate).await? else {
        return Ok(None);
    };
    let next = rotated(&found, new_secret, now(), overlap_until);
    // Only the columns a rotation changes.
    let mut model = found.into_active_model();
    model.secret = Set(next.secret);
    model.previous_secret = Set(next.previous_secret);
    model.previous_secret_until = Set(next.previous_secret_until);
    model.older_secret = Set(next.older_secret);
    model.older_secret_until = Set(next.older_secret_until);
    model.updated_at = Set(next.updated_at);
    let updated = model.update(&tx).await?;
    tx.commit().await?;
    Ok(Some(updated))
}

/// `endpoint` rotated at `at` to `new_secret`. A replaced secret signs until its own overlap
/// ends, whatever rotations follow: the current secret becomes the previous one (until
/// `overlap_until`), and the previous one, if it still signs at `at`, becomes the older
/// one with its own end. An older one is dropped: at most two replaced secrets sign, so a
/// third rotation within an overlap ends the oldest early.
pub fn rotated(
    endpoint: &endpoints::Model,
    new_secret: &str,
    at: DateTime<Utc>,
    overlap_until: DateTime<Utc>,
) -> endpoints::Model {
    let (older_secret, older_secret_until) = match previous_secret_at(endpoint, at) {
        Some(previous) => (Some(previous.to_owned()), endpoint.previous_secret_until),
        None => (None, None),
    };
    endpoints::Model {
        secret: new_secret.to_owned(),
        previous_secret: Some(endpoint.secret.clone()),
        previous_secret_until: Some(overlap_until),
        older_secret,
        older_secret_until,
        updated_at: at,
        ..endpoint.clone()
    }
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
    let Some((tx, found)) = begin_on(db, merchant, id, LockType::NoKeyUpdate).await? else {
        return Ok(None);
    };
    let mut model = found.clone().into_active_model();
    model.state = Set(EndpointState::Activo);
    model.failing_since = Set(None);
    model.disabled_reason = Set(None);
    model.updated_at = Set(at);
    let updated = model.update(&tx).await?;
    // What is pending starts a new round now, whether the endpoint was down or only
    // failing (on-call's "send it now" once the merchant says it works). A delivery a
    // worker is sending right now is made due too, but its claim (`claimed_until`, which
    // this leaves alone) keeps every other worker off it until its attempt is stored.
    deliveries::Entity::update_many()
        .col_expr(deliveries::Column::NextAttemptAt, Expr::value(at))
        .col_expr(
            deliveries::Column::RoundStart,
            Expr::col(deliveries::Column::Attempts),
        )
        .col_expr(deliveries::Column::UpdatedAt, Expr::value(at))
        .filter(deliveries::Column::EndpointId.eq(id))
        .filter(deliveries::Column::State.eq(DeliveryState::Pending))
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

/// Since when "every event since it started failing" goes back for `endpoint`: the
/// earliest of its `failing_since` and the writing of every event it has not got in
/// these failures (a delivery of it still `PENDIENTE`, or `ABANDONADA` since then).
/// `failing_since` is the time of the first failed *attempt*: the event whose failure
/// started it, and those fanned out with it, were written before, and redelivering only
/// from `failing_since` left them `ABANDONADA` for good. `None` if it is not failing.
pub async fn failures_began(
    db: &impl ConnectionTrait,
    endpoint: &endpoints::Model,
) -> Result<Option<DateTime<Utc>>, DbErr> {
    use sea_orm::sea_query::Condition;
    use sea_orm::{QuerySelect, sea_query::ExprTrait};
    let Some(since) = endpoint.failing_since else {
        return Ok(None);
    };
    let missed = Query::select()
        .column(deliveries::Column::EventId)
        .from(deliveries::Entity)
        .and_where(deliveries::Column::EndpointId.eq(endpoint.id))
        .cond_where(
            Condition::any()
                .add(deliveries::Column::State.eq(DeliveryState::Pending))
                .add(
                    deliveries::Column::State
                        .eq(DeliveryState::GivenUp)
                        .and(deliveries::Column::UpdatedAt.gte(since)),
                ),
        )
        .to_owned();
    let first: Option<DateTime<Utc>> = event::Entity::find()
        .select_only()
        .column_as(event::Column::CreatedAt.min(), "first")
        .filter(event::Column::Id.in_subquery(missed))
        .into_tuple::<Option<DateTime<Utc>>>()
        .one(db)
        .await?
        .flatten();
    Ok(Some(
        first.map_or(since, |first| std::cmp::min(first, since)),
    ))
}

/// The secret the last rotation replaced, if it still signs at `at`.
pub fn previous_secret_at(endpoint: &endpoints::Model, at: DateTime<Utc>) -> Option<&str> {
    still_signing(
        endpoint.previous_secret.as_deref(),
        endpoint.previous_secret_until,
        at,
    )
}

/// The replaced secrets that still sign at `at`, newest first: the previous one and the
/// older one, each until its own end.
pub fn replaced_secrets_at(endpoint: &endpoints::Model, at: DateTime<Utc>) -> Vec<&str> {
    [
        previous_secret_at(endpoint, at),
        still_signing(
            endpoint.older_secret.as_deref(),
            endpoint.older_secret_until,
            at,
        ),
    ]
    .into_iter()
    .flatten()
    .collect()
}

fn still_signing(
    secret: Option<&str>,
    until: Option<DateTime<Utc>>,
    at: DateTime<Utc>,
) -> Option<&str> {
    secret.filter(|_| until.is_some_and(|until| at < until))
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

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeDelta;

    const DAY: TimeDelta = TimeDelta::hours(24);

    fn endpoint(secret: &str, at: DateTime<Utc>) -> endpoints::Model {
        fresh(secret, at)
    }

    fn rotate_at(e: &endpoints::Model, new: &str, at: DateTime<Utc>) -> endpoints::Model {
        rotated(e, new, at, at + DAY)
    }

    fn signing(e: &endpoints::Model, at: DateTime<Utc>) -> Vec<&str> {
        let mut all = vec![e.secret.as_str()];
        all.extend(replaced_secrets_at(e, at));
        all
    }

    #[test]
    fn a_secret_signs_for_24_hours_after_it_is_replaced_whatever_rotations_follow() {
        let t0 = chrono::DateTime::parse_from_rfc3339("2026-12-07T10:00:00Z")
            .expect("time")
            .to_utc();
        let first = t0 + TimeDelta::hours(1);
        let second = t0 + TimeDelta::hours(3);
        let e = rotate_at(&endpoint("A", t0), "B", first);
        let e = rotate_at(&e, "C", second);

        assert_eq!(signing(&e, second), ["C", "B", "A"]);
        assert_eq!(
            signing(&e, first + DAY - TimeDelta::seconds(1)),
            ["C", "B", "A"]
        );
        assert_eq!(signing(&e, first + DAY), ["C", "B"], "A's 24 h are over");
        assert_eq!(
            signing(&e, second + DAY - TimeDelta::seconds(1)),
            ["C", "B"]
        );
        assert_eq!(signing(&e, second + DAY), ["C"], "B's 24 h are over");
        assert_eq!(e.previous_secret_until, Some(second + DAY));
        assert_eq!(e.older_secret_until, Some(first + DAY));
    }

    #[test]
    fn a_third_rotation_within_24_hours_drops_the_oldest_replaced_secret() {
        let t0 = chrono::DateTime::parse_from_rfc3339("2026-12-07T10:00:00Z")
            .expect("time")
            .to_utc();
        let mut e = endpoint("A", t0);
        for (n, new) in ["B", "C", "D"].into_iter().enumerate() {
            e = rotate_at(&e, new, t0 + TimeDelta::hours(i64::try_from(n).expect("n")));
        }
        assert_eq!(signing(&e, t0 + TimeDelta::hours(2)), ["D", "C", "B"]);
    }

    #[test]
    fn a_rotation_after_the_previous_secrets_24_hours_keeps_no_older_one() {
        let t0 = chrono::DateTime::parse_from_rfc3339("2026-12-07T10:00:00Z")
            .expect("time")
            .to_utc();
        let e = rotate_at(&endpoint("A", t0), "B", t0);
        let e = rotate_at(&e, "C", t0 + DAY);
        assert_eq!(e.older_secret, None);
        assert_eq!(e.older_secret_until, None);
        assert_eq!(signing(&e, t0 + DAY), ["C", "B"]);
        // And a stale older one is cleared, not carried on.
        let e = rotate_at(&e, "D", t0 + DAY + DAY);
        assert_eq!((e.older_secret, e.older_secret_until), (None, None));
    }
}
