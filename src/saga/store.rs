//! The saga's database work: each function is one short transaction, and every payment
//! write is fenced on the row's `version`.
//!
//! No gateway calls and no transaction held across one. A write that finds the version
//! moved (someone else decided first) changes nothing and reports `Fenced`.

use crate::db::{begin_write, now};
use crate::domain::NewPayment;
use crate::entities::{idempotency_key as keys, payment, payment_transition as transitions};
use crate::representation::{Answer, answer};
use crate::saga::state::{Event, IllegalTransition, PaymentState, transition};
use chrono::{DateTime, Utc};
use sea_orm::sea_query::{Expr, ExprTrait};
use sea_orm::sea_query::{LockBehavior, LockType};
use sea_orm::{
    ActiveValue::Set, ColumnTrait, ConnectionTrait, DatabaseConnection, DbBackend, DbErr,
    EntityTrait, QueryFilter, QueryOrder, QuerySelect, TryInsertResult,
};
use std::time::Duration;
use uuid::Uuid;

/// Who made a decision, for the audit trail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Actor {
    Request,
    Reconciler,
    Webhook,
    Admin,
}

impl Actor {
    pub fn as_str(self) -> &'static str {
        match self {
            Actor::Request => "request",
            Actor::Reconciler => "reconciler",
            Actor::Webhook => "webhook",
            Actor::Admin => "admin",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(transparent)]
    Db(#[from] DbErr),
    #[error(transparent)]
    Illegal(#[from] IllegalTransition),
}

/// Key row status while nobody has frozen an answer on it.
pub const KEY_IN_PROGRESS: &str = "EN_PROCESO";
/// Key row status once its answer is frozen.
pub const KEY_COMPLETED: &str = "COMPLETADA";

pub fn chrono_after(d: Duration) -> chrono::TimeDelta {
    chrono::TimeDelta::from_std(d).unwrap_or(chrono::TimeDelta::MAX)
}

/// The idempotency key row for `(merchant, key)`: the one query of a replay.
pub async fn find_key(
    db: &impl ConnectionTrait,
    merchant: Uuid,
    key: &str,
) -> Result<Option<keys::Model>, DbErr> {
    keys::Entity::find_by_id((merchant, key.to_owned()))
        .one(db)
        .await
}

pub async fn find_payment(
    db: &impl ConnectionTrait,
    id: Uuid,
) -> Result<Option<payment::Model>, DbErr> {
    payment::Entity::find_by_id(id).one(db).await
}

pub struct Registration<'a> {
    pub merchant: Uuid,
    pub key: &'a str,
    pub fingerprint: &'a str,
    pub payment: &'a NewPayment,
    pub gateway_key: String,
    pub lease: Duration,
}

pub enum Registered {
    /// tx1 committed: the key (leased to this request) and the payment, EN_PROCESO.
    Started(payment::Model),
    /// Another request registered this key first.
    Taken(keys::Model),
}

/// tx1: the key and the payment, together or not at all. The key's primary key settles
/// the race between simultaneous duplicates.
pub async fn register(db: &DatabaseConnection, reg: Registration<'_>) -> Result<Registered, DbErr> {
    let at = now();
    let payment_id = Uuid::now_v7();
    let model = payment::Model {
        id: payment_id,
        merchant_id: reg.merchant,
        idempotency_key: reg.key.to_owned(),
        credit_id: reg.payment.credit_id.clone(),
        amount: reg.payment.amount,
        currency: reg.payment.currency.code().to_owned(),
        description: reg.payment.description.clone(),
        state: PaymentState::EnProceso.as_str().to_owned(),
        version: 0,
        attempts: 0,
        gateway_key: reg.gateway_key,
        gateway_ref: None,
        decline_code: None,
        next_attempt_at: at + chrono_after(reg.lease),
        created_at: at,
        updated_at: at,
    };
    let key_row = keys::ActiveModel {
        merchant_id: Set(reg.merchant),
        key: Set(reg.key.to_owned()),
        fingerprint: Set(reg.fingerprint.to_owned()),
        payment_id: Set(payment_id),
        status: Set(KEY_IN_PROGRESS.to_owned()),
        response_code: Set(None),
        response_body: Set(None),
        lease_until: Set(Some(at + chrono_after(reg.lease))),
        created_at: Set(at),
        updated_at: Set(at),
    };
    let tx = begin_write(db).await?;
    // The payment first (the key row refers to it); a lost race rolls both back.
    payment::Entity::insert(payment::ActiveModel::from(model.clone()))
        .exec_without_returning(&tx)
        .await?;
    let inserted = keys::Entity::insert(key_row)
        .on_conflict_do_nothing()
        .exec_without_returning(&tx)
        .await?;
    if !matches!(inserted, TryInsertResult::Inserted(n) if n > 0) {
        tx.rollback().await?;
        return match find_key(db, reg.merchant, reg.key).await? {
            Some(existing) => Ok(Registered::Taken(existing)),
            // Inserted by someone else and purged already: vanishingly rare; let the
            // client retry.
            None => Err(DbErr::RecordNotInserted),
        };
    }
    tx.commit().await?;
    Ok(Registered::Started(model))
}

/// What a fenced write came to.
#[derive(Debug)]
pub enum Written {
    Applied(Box<payment::Model>),
    /// The payment moved since it was read: nothing written.
    Fenced,
}

/// What changes besides the state.
#[derive(Clone, Debug, Default)]
pub struct Changes {
    pub gateway_ref: Option<String>,
    pub decline_code: Option<String>,
    pub next_attempt_at: Option<DateTime<Utc>>,
    pub count_attempt: bool,
}

/// Applies `event` to `current` in `tx`: the fenced update, the audit row, and — when the
/// payment becomes final — the key's frozen answer. The caller commits.
pub async fn apply<C: ConnectionTrait>(
    tx: &C,
    current: &payment::Model,
    event: Event,
    changes: Changes,
    actor: Actor,
    reason: &str,
) -> Result<Written, StoreError> {
    let from: PaymentState = current
        .state
        .parse()
        .unwrap_or(PaymentState::RevisionManual);
    let to = transition(from, event)?;
    let at = now();
    let mut next = current.clone();
    next.state = to.as_str().to_owned();
    next.version += 1;
    next.updated_at = at;
    if changes.count_attempt {
        next.attempts += 1;
    }
    if let Some(gateway_ref) = changes.gateway_ref {
        next.gateway_ref = Some(gateway_ref);
    }
    if let Some(code) = changes.decline_code {
        next.decline_code = Some(code);
    }
    if let Some(at) = changes.next_attempt_at {
        next.next_attempt_at = at;
    }
    if !write_fenced(tx, current, &next).await? {
        return Ok(Written::Fenced);
    }
    // A resend keeps the state but is a decision worth an audit row.
    let resend = event == Event::Send && actor != Actor::Request;
    if from != to || resend {
        transitions::Entity::insert(transitions::ActiveModel {
            id: Set(Uuid::now_v7()),
            payment_id: Set(current.id),
            from_state: Set(Some(from.as_str().to_owned())),
            to_state: Set(to.as_str().to_owned()),
            actor: Set(actor.as_str().to_owned()),
            reason: Set(reason.to_owned()),
            created_at: Set(at),
        })
        .exec_without_returning(tx)
        .await?;
    }
    if to.is_terminal() {
        freeze_answer(tx, &next, &answer(&next)).await?;
    }
    Ok(Written::Applied(Box::new(next)))
}

/// Writes `next` over `current` only if nobody wrote in between.
async fn write_fenced<C: ConnectionTrait>(
    tx: &C,
    current: &payment::Model,
    next: &payment::Model,
) -> Result<bool, DbErr> {
    let result = payment::Entity::update_many()
        .col_expr(payment::Column::State, Expr::value(next.state.clone()))
        .col_expr(payment::Column::Version, Expr::value(next.version))
        .col_expr(payment::Column::Attempts, Expr::value(next.attempts))
        .col_expr(
            payment::Column::GatewayRef,
            Expr::value(next.gateway_ref.clone()),
        )
        .col_expr(
            payment::Column::DeclineCode,
            Expr::value(next.decline_code.clone()),
        )
        .col_expr(
            payment::Column::NextAttemptAt,
            Expr::value(next.next_attempt_at),
        )
        .col_expr(payment::Column::UpdatedAt, Expr::value(next.updated_at))
        .filter(payment::Column::Id.eq(current.id))
        .filter(payment::Column::Version.eq(current.version))
        .exec(tx)
        .await?;
    Ok(result.rows_affected == 1)
}

/// Freezes the final answer on the payment's key and releases its lease. An answer once
/// frozen never changes: what a client was told is what its retries are told.
async fn freeze_answer<C: ConnectionTrait>(
    tx: &C,
    p: &payment::Model,
    answer: &Answer,
) -> Result<(), DbErr> {
    keys::Entity::update_many()
        .col_expr(keys::Column::Status, Expr::value(KEY_COMPLETED))
        .col_expr(
            keys::Column::ResponseCode,
            Expr::value(i32::from(answer.status)),
        )
        .col_expr(keys::Column::ResponseBody, Expr::value(answer.body.clone()))
        .col_expr(
            keys::Column::LeaseUntil,
            Expr::value(Option::<DateTime<Utc>>::None),
        )
        .col_expr(keys::Column::UpdatedAt, Expr::value(p.updated_at))
        .filter(keys::Column::MerchantId.eq(p.merchant_id))
        .filter(keys::Column::Key.eq(p.idempotency_key.clone()))
        .filter(keys::Column::PaymentId.eq(p.id))
        .filter(keys::Column::Status.eq(KEY_IN_PROGRESS))
        .exec(tx)
        .await?;
    Ok(())
}

/// One event in its own transaction.
pub async fn apply_now(
    db: &DatabaseConnection,
    current: &payment::Model,
    event: Event,
    changes: Changes,
    actor: Actor,
    reason: &str,
) -> Result<Written, StoreError> {
    let tx = begin_write(db).await?;
    let written = apply(&tx, current, event, changes, actor, reason).await?;
    match written {
        Written::Applied(_) => tx.commit().await?,
        Written::Fenced => tx.rollback().await?,
    }
    Ok(written)
}

/// The request gives up ownership of a payment it could not settle (gateway pending or
/// unknown): the reconciler takes it from `next_attempt_at`, and retries of the key are
/// answered with the payment's current state instead of 409.
pub async fn hand_over(
    db: &DatabaseConnection,
    current: &payment::Model,
    gateway_ref: Option<String>,
    due_at: DateTime<Utc>,
) -> Result<Written, DbErr> {
    let tx = begin_write(db).await?;
    let mut next = current.clone();
    next.version += 1;
    next.updated_at = now();
    next.next_attempt_at = due_at;
    if gateway_ref.is_some() {
        next.gateway_ref = gateway_ref;
    }
    if !write_fenced(&tx, current, &next).await? {
        tx.rollback().await?;
        return Ok(Written::Fenced);
    }
    release_lease(&tx, current).await?;
    tx.commit().await?;
    Ok(Written::Applied(Box::new(next)))
}

/// Ends a request's lease on the payment's key (no answer is frozen).
pub async fn release_lease<C: ConnectionTrait>(tx: &C, p: &payment::Model) -> Result<(), DbErr> {
    keys::Entity::update_many()
        .col_expr(
            keys::Column::LeaseUntil,
            Expr::value(Option::<DateTime<Utc>>::None),
        )
        .filter(keys::Column::MerchantId.eq(p.merchant_id))
        .filter(keys::Column::Key.eq(p.idempotency_key.clone()))
        .filter(keys::Column::PaymentId.eq(p.id))
        .filter(keys::Column::Status.eq(KEY_IN_PROGRESS))
        .exec(tx)
        .await?;
    Ok(())
}

/// Payments the reconciler may pick: sent or never sent, not final, not under review.
pub const RECONCILABLE: [PaymentState; 2] = [PaymentState::EnProceso, PaymentState::Enviada];

/// `state IN ('EN_PROCESO', 'ENVIADA')` with the states written into the SQL, not bound:
/// it is the predicate of the partial index `payments_unsettled_due_idx`, and PostgreSQL
/// uses a partial index for a prepared statement's generic plan only when the query's own
/// condition proves the index's, which bound values cannot.
fn reconcilable() -> sea_orm::sea_query::SimpleExpr {
    let states: Vec<String> = RECONCILABLE
        .iter()
        .map(|s| format!("'{}'", s.as_str()))
        .collect();
    Expr::cust(format!(r#""payments"."state" IN ({})"#, states.join(", ")))
}

/// Claims up to `limit` payments due at `due_by`, oldest first: each claimed row gets
/// `next_attempt_at = now + claim_for` and a new version, so no other process picks it
/// until this one is done or has died. PostgreSQL skips rows another process is claiming
/// (`FOR UPDATE SKIP LOCKED`); SQLite's `BEGIN IMMEDIATE` serializes claims.
pub async fn claim_due(
    db: &DatabaseConnection,
    due_by: DateTime<Utc>,
    limit: u64,
    claim_for: Duration,
) -> Result<Vec<payment::Model>, DbErr> {
    let query = payment::Entity::find()
        .filter(reconcilable())
        .filter(payment::Column::NextAttemptAt.lte(due_by))
        .order_by_asc(payment::Column::NextAttemptAt)
        .limit(limit);
    claim(db, query, claim_for).await
}

/// Claims one payment whether it is due or not (on-call's "this one, now", a client retry
/// that found its request abandoned). None if it is final, under review, or being claimed.
pub async fn claim_one(
    db: &DatabaseConnection,
    id: Uuid,
    claim_for: Duration,
) -> Result<Option<payment::Model>, DbErr> {
    let query = payment::Entity::find()
        .filter(payment::Column::Id.eq(id))
        .filter(reconcilable());
    Ok(claim(db, query, claim_for).await?.into_iter().next())
}

async fn claim(
    db: &DatabaseConnection,
    query: sea_orm::Select<payment::Entity>,
    claim_for: Duration,
) -> Result<Vec<payment::Model>, DbErr> {
    let tx = begin_write(db).await?;
    let query = if db.get_database_backend() == DbBackend::Postgres {
        query.lock_with_behavior(LockType::Update, LockBehavior::SkipLocked)
    } else {
        query
    };
    let mut rows = query.all(&tx).await?;
    if rows.is_empty() {
        tx.rollback().await?;
        return Ok(rows);
    }
    let until = now() + chrono_after(claim_for);
    // The rows are locked (PostgreSQL) or the database is (SQLite): their versions
    // cannot move before this update, so each becomes exactly version + 1.
    payment::Entity::update_many()
        .col_expr(payment::Column::NextAttemptAt, Expr::value(until))
        .col_expr(
            payment::Column::Version,
            Expr::col(payment::Column::Version).add(1),
        )
        .filter(payment::Column::Id.is_in(rows.iter().map(|p| p.id)))
        .exec(&tx)
        .await?;
    tx.commit().await?;
    for row in &mut rows {
        row.version += 1;
        row.next_attempt_at = until;
    }
    Ok(rows)
}

/// The provider had no final answer: look again at `due_at`. Counts an attempt.
pub async fn reschedule(
    db: &DatabaseConnection,
    current: &payment::Model,
    due_at: DateTime<Utc>,
) -> Result<Written, DbErr> {
    let mut next = current.clone();
    next.version += 1;
    next.attempts += 1;
    next.updated_at = now();
    next.next_attempt_at = due_at;
    Ok(if write_fenced(db, current, &next).await? {
        Written::Applied(Box::new(next))
    } else {
        Written::Fenced
    })
}
