//! The refund saga's database work: each function is one short transaction, and every
//! refund write is fenced on the row's `version`, as the payments' are.
//!
//! A refund's idempotency key lives on its own row (the refunds' key space), so a step's
//! state change, its audit row and the key's frozen answer are one update and one insert:
//! one statement on PostgreSQL (a data-modifying `WITH`), a transaction on SQLite.
//!
//! Registration is the one step that reads before it writes: what is left of the payment
//! and the new refund are one atomic step. On PostgreSQL the payment's row is locked
//! (`FOR UPDATE`) before the sum is read, in a statement of its own, so the sum's snapshot
//! is taken after every concurrent registration that held the lock committed; SQLite's
//! `BEGIN IMMEDIATE` serializes writers. No gateway calls, no rendering here.

use crate::db::{begin_write, now};
use crate::entities::payment;
use crate::entities::refund::{self, KeyScope, KeyStatus};
use crate::entities::refund_transition::{self as transitions, Actor};
use crate::idempotency::derive::derive_refund;
use crate::outbox;
use crate::saga::refund::state::{Event, IllegalTransition, RefundState};
use crate::saga::state::PaymentState;
use crate::saga::store::{
    Claimable, LastError, PAYMENT_MOVED, Recorded, Rewritten, SagaRow, Step, chrono_after, moved,
    one_statement, update_fenced,
};
pub use crate::saga::store::{renew_claim, reschedule};
use chrono::{DateTime, Utc};
use sea_orm::sea_query::Expr;
use sea_orm::{
    ColumnTrait, ConnectionTrait, DatabaseConnection, DbBackend, DbErr, EntityTrait, QueryFilter,
    QueryOrder, QuerySelect, Statement, TryInsertResult, Value,
};
use std::collections::HashMap;
use std::time::Duration;
use uuid::Uuid;

pub use crate::entities::idempotency_key::FrozenAnswer;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(transparent)]
    Db(#[from] DbErr),
    #[error(transparent)]
    Illegal(#[from] IllegalTransition),
}

/// What the store writes rendered, given by the layer above (storage stores, it never
/// renders): the refund's — the answer a refund that just became final freezes on its
/// key, and the refund as an event's `datos` shows it (JSON text) — and its payment's,
/// for a compensation refund whose failure moves its payment too (`PaymentToReview`).
#[derive(Clone, Copy)]
pub struct Render {
    pub refund: crate::saga::store::Render<refund::Model>,
    pub payment: crate::saga::store::Render,
    /// The payment as an event's `datos` shows it with what was refunded of it.
    pub payment_refunded: fn(&payment::Model, i64) -> String,
}

pub async fn find(db: &impl ConnectionTrait, id: Uuid) -> Result<Option<refund::Model>, DbErr> {
    refund::Entity::find_by_id(id).one(db).await
}

/// The refund `id` if it is `merchant`'s.
pub async fn find_for_merchant(
    db: &impl ConnectionTrait,
    merchant: Uuid,
    id: Uuid,
) -> Result<Option<refund::Model>, DbErr> {
    refund::Entity::find_by_id(id)
        .filter(refund::Column::MerchantId.eq(merchant))
        .one(db)
        .await
}

/// A payment's refunds, oldest first.
pub async fn of_payment(
    db: &impl ConnectionTrait,
    payment: Uuid,
) -> Result<Vec<refund::Model>, DbErr> {
    oldest_first(
        db,
        refund::Entity::find().filter(refund::Column::PaymentId.eq(payment)),
    )
    .await
}

/// The refunds other than `except` whose provider refund id (`gateway_ref`) is
/// `gateway_ref`, any payment's, any merchant's: at most a few. On-call's resolution of a
/// refund asks it before it records a provider refund on it.
///
/// What it costs: `refunds.gateway_ref` has no index, so this reads the whole table (a
/// sequential scan; refunds are fewer than payments, whose like read is measured at
/// `saga::store::others_with_charge`). Only a resolution by hand asks it.
pub async fn others_with_gateway_ref(
    db: &impl ConnectionTrait,
    gateway_ref: &str,
    except: Uuid,
) -> Result<Vec<refund::Model>, DbErr> {
    refund::Entity::find()
        .filter(refund::Column::GatewayRef.eq(gateway_ref))
        .filter(refund::Column::Id.ne(except))
        .limit(5)
        .all(db)
        .await
}

/// A payment's refunds of one charge, oldest first.
pub async fn of_charge(
    db: &impl ConnectionTrait,
    payment: Uuid,
    charge: &str,
) -> Result<Vec<refund::Model>, DbErr> {
    oldest_first(db, of_one_charge(payment, charge)).await
}

async fn oldest_first(
    db: &impl ConnectionTrait,
    refunds: sea_orm::Select<refund::Entity>,
) -> Result<Vec<refund::Model>, DbErr> {
    refunds
        .order_by_asc(refund::Column::CreatedAt)
        .order_by_asc(refund::Column::Id)
        .all(db)
        .await
}

/// A payment's refunds of one charge.
fn of_one_charge(payment: Uuid, charge: &str) -> sea_orm::Select<refund::Entity> {
    refund::Entity::find()
        .filter(refund::Column::PaymentId.eq(payment))
        .filter(refund::Column::ChargeRef.eq(charge))
}

/// The row of a key in the refunds' key space.
pub async fn find_key(
    db: &impl ConnectionTrait,
    merchant: Uuid,
    scope: KeyScope,
    key: &str,
) -> Result<Option<refund::Model>, DbErr> {
    refund::Entity::find()
        .filter(refund::Column::MerchantId.eq(merchant))
        .filter(refund::Column::KeyScope.eq(scope))
        .filter(refund::Column::IdempotencyKey.eq(key))
        .one(db)
        .await
}

/// Sum of a payment's refunds in `states`, in minor units.
async fn sum_in(
    db: &impl ConnectionTrait,
    payment: Uuid,
    states: &[RefundState],
) -> Result<i64, DbErr> {
    let refunds = refund::Entity::find()
        .filter(refund::Column::PaymentId.eq(payment))
        .filter(refund::Column::State.is_in(states.iter().copied()));
    total(db, refunds).await
}

/// The sum of the amounts of `refunds`, in minor units (0 for none).
async fn total(
    db: &impl ConnectionTrait,
    refunds: sea_orm::Select<refund::Entity>,
) -> Result<i64, DbErr> {
    Ok(refunds
        .select_only()
        // PostgreSQL's SUM of a bigint is a numeric: cast back.
        .expr_as(
            Expr::cust(r#"CAST(COALESCE(SUM("amount"), 0) AS BIGINT)"#),
            "total",
        )
        .into_tuple::<i64>()
        .one(db)
        .await?
        .unwrap_or(0))
}

/// The payment's `montoReembolsado`: its `COMPLETADO` refunds.
pub async fn refunded_amount(db: &impl ConnectionTrait, payment: Uuid) -> Result<i64, DbErr> {
    sum_in(db, payment, &[RefundState::Completado]).await
}

/// `refunded_amount` for a `pago.*` event written in `tx`: the payment locked first
/// (`FOR UPDATE`, PostgreSQL), in a statement of its own, so the sum's snapshot comes
/// after every refund completing at that moment committed. A refund's move to
/// `COMPLETADO` locks its payment (`FOR SHARE`) before anything else it writes
/// (`sql_write`, the refund events' consumer), so either it waits for this transaction and
/// takes its transaction id after it, or this one waits for it and sums it: in the
/// merchant's event list (in transaction id order) a payment's `montoReembolsado` is never
/// less than the completed refunds listed before it. SQLite's writers are one at a time.
pub async fn refunded_amount_locked(
    tx: &impl ConnectionTrait,
    payment: Uuid,
) -> Result<i64, DbErr> {
    if tx.get_database_backend() == DbBackend::Postgres {
        payment::Entity::find_by_id(payment)
            .select_only()
            .column(payment::Column::Id)
            .lock_exclusive()
            .into_tuple::<Uuid>()
            .one(tx)
            .await?;
    }
    refunded_amount(tx, payment).await
}

/// `refunded_amount` of each of `payments`, in one query (a page of a search); a payment
/// with no `COMPLETADO` refund is absent (0).
pub async fn refunded_amounts(
    db: &impl ConnectionTrait,
    payments: &[Uuid],
) -> Result<HashMap<Uuid, i64>, DbErr> {
    if payments.is_empty() {
        return Ok(HashMap::new());
    }
    let sums: Vec<(Uuid, i64)> = refund::Entity::find()
        .filter(refund::Column::PaymentId.is_in(payments.iter().copied()))
        .filter(refund::Column::State.eq(RefundState::Completado))
        .select_only()
        .column(refund::Column::PaymentId)
        // PostgreSQL's SUM of a bigint is a numeric: cast back.
        .expr_as(Expr::cust(r#"CAST(SUM("amount") AS BIGINT)"#), "total")
        .group_by(refund::Column::PaymentId)
        .into_tuple()
        .all(db)
        .await?;
    Ok(sums.into_iter().collect())
}

/// What pagos' refunds of one charge of a payment that may have reached the provider add
/// up to: `COMPLETADO`, and `ENVIADO` (sent: a provider may tell of its answer before
/// pagos records it). `EN_PROCESO` is left out: pagos marks a refund `ENVIADO` before any
/// gateway call, so one still `EN_PROCESO` has never reached the provider, and money that
/// went back cannot be its doing (a request that died before sending it leaves it so,
/// and the reconciler sends it later). Refunds under review are left out too: nobody
/// knows yet whether their money went back.
pub async fn covering(
    db: &impl ConnectionTrait,
    payment: Uuid,
    charge: &str,
) -> Result<i64, DbErr> {
    let refunds = of_one_charge(payment, charge)
        .filter(refund::Column::State.is_in([RefundState::Completado, RefundState::Enviado]));
    total(db, refunds).await
}

/// What a refund registration asks for.
pub struct Registration<'a> {
    pub merchant: Uuid,
    pub scope: KeyScope,
    pub key: &'a str,
    pub fingerprint: &'a str,
    pub payment: Uuid,
    /// None: everything not yet refunded.
    pub amount: Option<i64>,
    /// The refund's `motivo`: the merchant reads it.
    pub reason: Option<String>,
    /// What the refund's first audit row says after who asked, when it is not `reason`: a
    /// compensation's own account (the event that found the charge, the operator and
    /// their note), which on-call reads and the merchant's `motivo` does not show.
    pub audit: Option<String>,
    pub requested_by: String,
    /// The request holds the key and the refund this long.
    pub lease: Duration,
    /// The payment states a refund may be registered in: `COMPLETADA` for a merchant's
    /// or on-call's; the compensation of an orphan charge takes a `FALLIDA` one.
    pub payment_states: &'a [PaymentState],
    /// The charge to refund, when it is not the payment's `gatewayRef` (an orphan's).
    pub charge: Option<String>,
    /// That charge's amount: what is left is then what is left of that charge, not of
    /// the payment.
    pub charge_amount: Option<i64>,
}

#[derive(Debug)]
pub enum Registered {
    /// Committed: the refund, `EN_PROCESO`, its key leased to this request.
    Started(Box<refund::Model>),
    /// The key names a refund already (this request's earlier try, or another's).
    Taken(Box<refund::Model>),
    /// No such payment of this merchant's.
    NoPayment,
    /// The payment is not in a state that can be refunded (or nothing was charged).
    NotRefundable(PaymentState),
    /// The amount is over what is left (`remaining`, possibly 0).
    ExceedsRemaining { remaining: i64 },
}

/// The refund's registration and the check of what is left of its payment, as one atomic
/// step: concurrent refunds of one payment never together exceed it.
pub async fn register(db: &DatabaseConnection, reg: Registration<'_>) -> Result<Registered, DbErr> {
    if let Some(existing) = find_key(db, reg.merchant, reg.scope, reg.key).await? {
        return Ok(Registered::Taken(Box::new(existing)));
    }
    let tx = begin_write(db).await?;
    let registered = register_in(&tx, &reg, one_statement(db)).await?;
    if matches!(registered, Registered::Started(_)) {
        tx.commit().await?;
        return Ok(registered);
    }
    tx.rollback().await?;
    if let Registered::Taken(_) = registered {
        // The same key won a race meanwhile: its row, as committed.
        return match find_key(db, reg.merchant, reg.scope, reg.key).await? {
            Some(existing) => Ok(Registered::Taken(Box::new(existing))),
            None => Err(DbErr::RecordNotInserted),
        };
    }
    Ok(registered)
}

/// `register`'s work in the caller's transaction, which commits it only if `Started`.
/// `lock`: lock the payment's row first (PostgreSQL; a caller that holds the lock already,
/// or SQLite under `BEGIN IMMEDIATE`, passes false).
pub async fn register_in<C: ConnectionTrait>(
    tx: &C,
    reg: &Registration<'_>,
    lock: bool,
) -> Result<Registered, DbErr> {
    if let Some(existing) = find_key(tx, reg.merchant, reg.scope, reg.key).await? {
        return Ok(Registered::Taken(Box::new(existing)));
    }
    let mut query = payment::Entity::find_by_id(reg.payment)
        .filter(payment::Column::MerchantId.eq(reg.merchant));
    if lock {
        // Concurrent registrations of this payment wait here, one at a time; the sum
        // below is a statement of its own, so its snapshot sees every one that went first.
        query = query.lock_exclusive();
    }
    let Some(p) = query.one(tx).await? else {
        return Ok(Registered::NoPayment);
    };
    if lock && let Some(existing) = find_key(tx, reg.merchant, reg.scope, reg.key).await? {
        // A twin with this key held the lock first and committed: it is the refund (409
        // or its answer), not a second one measured against what it left.
        return Ok(Registered::Taken(Box::new(existing)));
    }
    let charge = reg.charge.clone().or_else(|| p.gateway_ref.clone());
    let Some(charge) = charge.filter(|_| reg.payment_states.contains(&p.state)) else {
        return Ok(Registered::NotRefundable(p.state));
    };
    let remaining = match reg.charge_amount {
        // What is left of that one charge (an orphan's: not the payment's own).
        Some(charged) => {
            let counted = sum_of_charge(tx, p.id, &charge).await?;
            std::cmp::max(charged - counted, 0)
        }
        None => {
            let counted = sum_in(tx, p.id, &RefundState::COUNTED).await?;
            std::cmp::max(p.amount - counted, 0)
        }
    };
    let amount = reg.amount.unwrap_or(remaining);
    if amount > remaining || amount <= 0 {
        return Ok(Registered::ExceedsRemaining { remaining });
    }
    let model = new_refund(reg, &p, charge, amount);
    let inserted = refund::Entity::insert(refund::ActiveModel::from(model.clone()))
        .on_conflict_do_nothing()
        .exec_without_returning(tx)
        .await?;
    if !matches!(inserted, TryInsertResult::Inserted(n) if n > 0) {
        return Ok(Registered::Taken(Box::new(model)));
    }
    transitions::Entity::insert(transitions::ActiveModel::from(transitions::Model {
        id: Uuid::now_v7(),
        refund_id: model.id,
        from_state: None,
        to_state: RefundState::EnProceso,
        actor: actor_of(reg.scope),
        reason: format!(
            "refund of {amount} {} asked by {}{}",
            model.currency,
            reg.requested_by,
            reg.audit
                .as_deref()
                .or(reg.reason.as_deref())
                .map(|r| format!(": {r}"))
                .unwrap_or_default()
        ),
        created_at: model.created_at,
    }))
    .exec_without_returning(tx)
    .await?;
    Ok(Registered::Started(Box::new(model)))
}

/// Sum of a payment's counted refunds of one charge.
async fn sum_of_charge(
    db: &impl ConnectionTrait,
    payment: Uuid,
    charge: &str,
) -> Result<i64, DbErr> {
    let refunds =
        of_one_charge(payment, charge).filter(refund::Column::State.is_in(RefundState::COUNTED));
    total(db, refunds).await
}

fn actor_of(scope: KeyScope) -> Actor {
    match scope {
        KeyScope::Merchant => Actor::Request,
        KeyScope::Admin => Actor::Admin,
        KeyScope::Orphan => Actor::Reconciler,
    }
}

fn new_refund(
    reg: &Registration<'_>,
    p: &payment::Model,
    charge: String,
    amount: i64,
) -> refund::Model {
    let at = now();
    let derived = derive_refund(reg.merchant, reg.scope.as_str(), reg.key, p.id);
    let held = at + chrono_after(reg.lease);
    refund::Model {
        id: derived.refund_id,
        payment_id: p.id,
        merchant_id: reg.merchant,
        key_scope: reg.scope,
        idempotency_key: reg.key.to_owned(),
        fingerprint: reg.fingerprint.to_owned(),
        key_status: KeyStatus::InProgress,
        response_code: None,
        response_body: None,
        lease_until: Some(held),
        charge_ref: charge,
        amount,
        currency: p.currency.clone(),
        reason: reg.reason.clone(),
        requested_by: Some(reg.requested_by.clone()),
        state: RefundState::EnProceso,
        version: 0,
        attempts: 0,
        gateway_key: derived.gateway_key,
        gateway_ref: None,
        failure_code: None,
        next_attempt_at: held,
        claimed_until: Some(held),
        created_at: at,
        updated_at: at,
        last_event_sequence: None,
        last_error: None,
        last_error_at: None,
    }
}

/// What a fenced write of a refund came to.
pub type Written = crate::saga::store::Written<refund::Model>;

/// What changes besides the state.
#[derive(Clone, Debug, Default)]
pub struct Changes {
    pub gateway_ref: Option<String>,
    pub failure_code: Option<String>,
    /// The writer holds the refund until then (a send).
    pub hold_until: Option<DateTime<Utc>>,
    pub count_attempt: bool,
}

impl From<Changes> for Step {
    fn from(changes: Changes) -> Step {
        Step {
            gateway_ref: changes.gateway_ref,
            code: changes.failure_code,
            hold_until: changes.hold_until,
            count_attempt: changes.count_attempt,
            last_error: LastError::Kept,
        }
    }
}

/// Everything one decision about a refund writes, worked out before anything is written
/// (`plan`): the refund after it (with the key's frozen answer when it becomes final), its
/// audit row, its event. Written in the caller's transaction (`write`: a webhook's, with
/// its dedupe row) or committed on its own (`write_now`).
pub type Plan = crate::saga::store::Plan<refund::Model>;

/// A compensation refund's move into `FALLIDO` (`plan`): the customer is still charged
/// while the payment's answer says no money was taken, and nothing of pagos' will try
/// again. Its payment, if it is still `FALLIDA`, goes to `REVISION_MANUAL` in the refund's
/// own write — one statement on PostgreSQL, one transaction on SQLite — with its audit row
/// (`reason`) and its `pago.revision_manual` event: a compensation refund cannot fail
/// without on-call being told.
pub struct PaymentToReview {
    /// The payment's answer and event, as the layer above renders them.
    pub render: crate::saga::store::Render,
    /// Its event's `datos` with what was refunded of it (`Render::payment_refunded`).
    pub refunded: fn(&payment::Model, i64) -> String,
    pub actor: Actor,
    /// The payment's audit row: which charge, which refund, that the customer is still
    /// charged.
    pub reason: String,
}

/// A refund as a decision moves it: its key lives on its own row, so a decision's writes
/// are the refund's update, its audit row and its event, and, for a compensation refund
/// that fails, its payment's move to review (`PaymentToReview`).
impl SagaRow for refund::Model {
    type State = RefundState;
    type Event = Event;
    type Illegal = IllegalTransition;
    type Audit = transitions::Model;
    type Besides = Option<PaymentToReview>;
    type Render = Render;

    fn state(&self) -> RefundState {
        self.state
    }

    fn recorded(&mut self) -> Recorded<'_, RefundState> {
        Recorded {
            state: &mut self.state,
            gateway_ref: &mut self.gateway_ref,
            code: &mut self.failure_code,
        }
    }

    /// The refund's update (with its key's frozen answer when it becomes final), its
    /// audit row, its event: a refund's key is on the refund, nothing more to write on it.
    /// A compensation refund (pagos' own, of an orphan charge) that fails takes its
    /// payment to review (`PaymentToReview`).
    fn plan(
        &self,
        event: Event,
        step: Step,
        actor: Actor,
        reason: &str,
        render: Render,
    ) -> Result<Plan, IllegalTransition> {
        let mut moved = moved(self, event, step, actor, reason)?;
        if moved.to.is_terminal() && self.key_status == KeyStatus::InProgress {
            // What a client was told first is what its retries are told: frozen once.
            let next = &mut moved.next;
            let answer = (render.refund.answer)(next);
            next.key_status = KeyStatus::Completed;
            next.response_code = Some(i32::from(answer.status));
            next.response_body = Some(answer.body);
            next.lease_until = None;
        }
        if moved.to == RefundState::RevisionManual {
            // Nobody works on it until on-call decides: a retry is answered its state
            // (202), never 409 "still in flight" for what is left of the first lease.
            moved.next.lease_until = None;
        }
        // A request marks its send with a hold beyond its lease (its write waited, or the
        // lease is shorter than a send): leased as long, so a retry meanwhile is told 409,
        // the first request still in flight (as a payment's key: `payment::Model::plan`).
        if matches!(actor, Actor::Request | Actor::Admin)
            && moved.to == RefundState::Enviado
            && self.lease_until.is_some()
            && moved.next.claimed_until > self.lease_until
        {
            moved.next.lease_until = moved.next.claimed_until;
        }
        // A compensation refund that fails; or any refund on-call resolves FALLIDO out of
        // review, which may have been COMPLETADO before (reported failed since): counted
        // as giving its charge back when the payment was answered FALLIDA
        // (`compensate_in`), it gives nothing back now. Either way its payment, if it is
        // FALLIDA, goes to on-call: the customer may still be charged.
        let compensation = self.key_scope == KeyScope::Orphan;
        let to_review = ((compensation || moved.from == RefundState::RevisionManual)
            && moved.from != RefundState::Fallido
            && moved.to == RefundState::Fallido)
            .then(|| {
                let code = moved.next.failure_code.as_deref().unwrap_or("no code");
                let reason = if compensation {
                    format!(
                        "the compensation of charge {} failed: refund {} of {} {} ended FALLIDO ({code}), so the customer is still charged while the payment's answer says no money was taken; on-call decides",
                        self.charge_ref, self.id, self.amount, self.currency,
                    )
                } else {
                    format!(
                        "refund {} of {} {} of charge {} ended FALLIDO ({code}) after the payment was answered FALLIDA: what it gave back, or was to, is not given back, so the customer may still be charged while the payment's answer says no money was taken; on-call decides",
                        self.id, self.amount, self.currency, self.charge_ref,
                    )
                };
                PaymentToReview {
                    render: render.payment,
                    refunded: render.payment_refunded,
                    actor,
                    reason,
                }
            });
        Ok(moved.plan(to_review, render.refund.datos))
    }

    /// A refund's key lives on the refund: its lease ends with the row's write.
    fn handed_over(mut next: Self) -> Plan {
        next.lease_until = None;
        Plan {
            next,
            audit: None,
            besides: None,
            event: None,
        }
    }

    fn write_in<'a, C: ConnectionTrait>(
        tx: &'a C,
        current: &'a Self,
        plan: &'a Plan,
    ) -> impl Future<Output = Result<bool, DbErr>> + Send + 'a {
        write_on(tx, current, plan)
    }

    /// One statement, but a plan that also moves the payment to review (a compensation
    /// that failed), which is a transaction: the payment is locked before its
    /// `montoReembolsado` is summed (`refunded_amount_locked`).
    async fn write_one_statement(
        db: &DatabaseConnection,
        current: &Self,
        plan: &Plan,
    ) -> Result<bool, DbErr> {
        if plan.besides.is_none() {
            return sql_write(db, current, plan).await;
        }
        let tx = begin_write(db).await?;
        let applied = sql_write(&tx, current, plan).await?;
        crate::saga::store::kept_if(tx, applied).await
    }
}

/// A refund's new schedule or claim (`saga::store::reschedule`, `renew_claim`): its
/// fenced update alone, with no audit row and no event.
impl Rewritten for refund::Model {
    fn write_fenced<'a>(
        db: &'a DatabaseConnection,
        current: &'a Self,
        next: &'a Self,
    ) -> impl Future<Output = Result<bool, DbErr>> + Send + 'a {
        let alone = Plan {
            next: next.clone(),
            audit: None,
            besides: None,
            event: None,
        };
        async move { alone.write_committed(db, current).await }
    }
}

/// The columns a step may change, in the order `write_on` and `sql_write` bind them.
const MOVED: [refund::Column; 14] = [
    refund::Column::State,
    refund::Column::Version,
    refund::Column::Attempts,
    refund::Column::GatewayRef,
    refund::Column::FailureCode,
    refund::Column::NextAttemptAt,
    refund::Column::ClaimedUntil,
    refund::Column::UpdatedAt,
    refund::Column::KeyStatus,
    refund::Column::ResponseCode,
    refund::Column::ResponseBody,
    refund::Column::LeaseUntil,
    refund::Column::LastError,
    refund::Column::LastErrorAt,
];

fn moved_values(next: &refund::Model) -> Vec<Value> {
    use sea_orm::ModelTrait;
    MOVED.iter().map(|c| next.get(*c)).collect()
}

/// The payment a plan moves besides its refund (`PaymentToReview`: a compensation refund
/// that failed), as read before the write, and its own plan when it is still `FALLIDA`
/// (otherwise on-call holds it already, or decided it: it does not move).
struct PaymentMove {
    current: payment::Model,
    to_review: Option<crate::saga::store::Plan>,
}

async fn payment_move<C: ConnectionTrait>(
    db: &C,
    refund: &refund::Model,
    plan: &Plan,
) -> Result<Option<PaymentMove>, DbErr> {
    let Some(to_review) = &plan.besides else {
        return Ok(None);
    };
    let Some(current) = payment::Entity::find_by_id(refund.payment_id)
        .one(db)
        .await?
    else {
        return Ok(None);
    };
    let to_review = if current.state == PaymentState::Fallida {
        let mut planned = current
            .plan(
                crate::saga::state::Event::Contradicted,
                Step::default(),
                to_review.actor,
                &to_review.reason,
                to_review.render,
            )
            .map_err(|e| DbErr::Custom(e.to_string()))?;
        // Told with what pagos gave back of it (a compensation that failed may follow
        // one that did not), as its read shows it; summed under the payment's lock, in the
        // transaction `write_one_statement` opens for a payment's move.
        let refunded = refunded_amount_locked(db, current.id).await?;
        if refunded > 0 {
            planned.retell(&(to_review.refunded)(&planned.next, refunded));
        }
        Some(planned)
    } else {
        None
    };
    Ok(Some(PaymentMove { current, to_review }))
}

/// The warning on-call's logs show when a write took a payment to review with its refund.
fn log_moved(refund: &refund::Model, payment: Option<&PaymentMove>) {
    if let Some(PaymentMove {
        current,
        to_review: Some(_),
    }) = payment
    {
        if refund.key_scope == KeyScope::Orphan {
            tracing::warn!(payment_id = %current.id, refund_id = %refund.id, charge = refund.charge_ref, "compensation refund failed: the customer is still charged; the payment goes to REVISION_MANUAL");
        } else {
            tracing::warn!(payment_id = %current.id, refund_id = %refund.id, charge = refund.charge_ref, "a refund of a payment answered FALLIDA was resolved FALLIDO: the customer may still be charged; the payment goes to REVISION_MANUAL");
        }
    }
}

/// A plan's writes in the caller's transaction, which commits them: fenced on `current`'s
/// version, with its audit row and its event (and its payment's move to review, when it
/// has one); one statement on PostgreSQL. False when fenced: nothing is to be kept (the
/// caller rolls its transaction back).
async fn write_on<C: ConnectionTrait>(
    tx: &C,
    current: &refund::Model,
    plan: &Plan,
) -> Result<bool, DbErr> {
    if one_statement(tx) {
        return sql_write(tx, current, plan).await;
    }
    // SQLite: the transaction is `BEGIN IMMEDIATE`, so the payment read here is the one
    // written over below.
    let payment = payment_move(tx, current, plan).await?;
    if !update_fenced::<refund::Entity, _>(tx, &MOVED, current, &plan.next).await? {
        return Ok(false);
    }
    if let Some(audit) = &plan.audit {
        transitions::Entity::insert(transitions::ActiveModel::from(audit.clone()))
            .exec_without_returning(tx)
            .await?;
    }
    if let Some(told) = &plan.event {
        outbox::record(tx, told).await?;
    }
    if let Some(PaymentMove {
        current: p,
        to_review: Some(to_review),
    }) = &payment
        && !<payment::Model as SagaRow>::write_in(tx, p, to_review).await?
    {
        // The payment moved since it was read: the refund's writes are rolled back with
        // it, and the decision is taken again.
        return Ok(false);
    }
    log_moved(current, payment.as_ref());
    Ok(true)
}

/// `INSERT INTO "<table>" (<every column of row's entity>) SELECT <its values> FROM
/// "<from>"`: the row written whole, only if `from` has a row; its values bound after
/// `values`.
fn insert_from<M: sea_orm::ModelTrait>(
    values: &mut Vec<Value>,
    table: &str,
    row: &M,
    from: &str,
) -> String {
    use sea_orm::{IdenStatic, Iterable};
    let mut columns = Vec::new();
    let mut placeholders = Vec::new();
    for column in <M::Entity as EntityTrait>::Column::iter() {
        columns.push(format!("\"{}\"", column.as_str()));
        values.push(row.get(column));
        placeholders.push(format!("${}", values.len()));
    }
    format!(
        "INSERT INTO \"{table}\" ({})\n  SELECT {} FROM \"{from}\"",
        columns.join(", "),
        placeholders.join(", ")
    )
}

/// A plan's writes as one statement (PostgreSQL). With a payment to move to review, the
/// statement first locks the payment at the version read (`held`: `FOR UPDATE`, which
/// waits for a writer in flight and then sees its row), and the refund moves only if it
/// holds it: the refund's failure and its payment's move commit together or not at all,
/// and a payment that moved since it was read fences the whole write.
async fn sql_write<C: ConnectionTrait>(
    db: &C,
    current: &refund::Model,
    plan: &Plan,
) -> Result<bool, DbErr> {
    use sea_orm::IdenStatic;
    let payment = payment_move(db, current, plan).await?;
    let mut values = moved_values(&plan.next);
    let set: Vec<String> = MOVED
        .iter()
        .enumerate()
        .map(|(i, c)| format!(r#""{}" = ${}"#, c.as_str(), i + 1))
        .collect();
    values.push(current.id.into());
    values.push(current.version.into());
    let mut sql = String::from("WITH ");
    let mut held = "";
    if let Some(PaymentMove { current: p, .. }) = &payment {
        values.push(p.id.into());
        values.push(p.version.into());
        let n = values.len();
        sql += &format!(
            r#""held" AS (
  SELECT "id" FROM "payments" WHERE "id" = ${} AND "version" = ${} FOR UPDATE),
"#,
            n - 1,
            n
        );
        held = r#" AND EXISTS (SELECT 1 FROM "held")"#;
    } else if plan.next.state == RefundState::Completado && current.state != RefundState::Completado
    {
        // Its payment's share lock, before the refund's own write (`refunded_amount_locked`
        // says why): a payment event written at the same moment either sums this refund or
        // is listed before it.
        values.push(current.payment_id.into());
        sql += &format!(
            r#""held" AS (
  SELECT "id" FROM "payments" WHERE "id" = ${} FOR SHARE),
"#,
            values.len()
        );
        held = r#" AND EXISTS (SELECT 1 FROM "held")"#;
    }
    sql += &format!(
        r#""moved" AS (
  UPDATE "refunds" SET {} WHERE "id" = ${} AND "version" = ${}{held} RETURNING "id")"#,
        set.join(", "),
        MOVED.len() + 1,
        MOVED.len() + 2
    );
    if let Some(audit) = &plan.audit {
        let n = values.len();
        values.extend([
            audit.id.into(),
            audit.from_state.into(),
            audit.to_state.into(),
            audit.actor.into(),
            audit.reason.clone().into(),
            audit.created_at.into(),
        ]);
        sql += &format!(
            r#",
"audit" AS (
  INSERT INTO "refund_transitions" ("id", "refund_id", "from_state", "to_state", "actor", "reason", "created_at")
  SELECT ${}, "id", ${}, ${}, ${}, ${}, ${} FROM "moved")"#,
            n + 1,
            n + 2,
            n + 3,
            n + 4,
            n + 5,
            n + 6
        );
    }
    if let Some(told) = &plan.event {
        // The outbox: the event only if the refund moved. Queued for the delivery
        // worker's fan-out in the same statement, as a payment's.
        sql += &format!(
            ",\n\"told\" AS (\n  {}\n  RETURNING \"id\"),\n\"queued\" AS (\n  INSERT INTO \"events_to_fan_out\" (\"event_id\")\n  SELECT \"id\" FROM \"told\")",
            insert_from(&mut values, "events", told, "moved")
        );
    }
    if let Some(PaymentMove {
        to_review: Some(to_review),
        ..
    }) = &payment
    {
        // The payment to review, only if the refund moved; the payment is held, so it is
        // the row read.
        let next = &to_review.next;
        let set: Vec<String> = PAYMENT_MOVED
            .iter()
            .map(|c| {
                values.push(sea_orm::ModelTrait::get(next, *c));
                format!(r#""{}" = ${}"#, c.as_str(), values.len())
            })
            .collect();
        sql += &format!(
            r#",
"reviewed" AS (
  UPDATE "payments" SET {} WHERE "id" IN (SELECT "id" FROM "held") AND EXISTS (SELECT 1 FROM "moved") RETURNING "id")"#,
            set.join(", ")
        );
        if let Some(audit) = &to_review.audit {
            sql += &format!(
                ",\n\"reviewed_audit\" AS (\n  {})",
                insert_from(&mut values, "payment_transitions", audit, "reviewed")
            );
        }
        if let Some(told) = &to_review.event {
            sql += &format!(
                ",\n\"reviewed_told\" AS (\n  {}\n  RETURNING \"id\"),\n\"reviewed_queued\" AS (\n  INSERT INTO \"events_to_fan_out\" (\"event_id\")\n  SELECT \"id\" FROM \"reviewed_told\")",
                insert_from(&mut values, "events", told, "reviewed")
            );
        }
    }
    sql += "\nSELECT count(*) AS \"moved\" FROM \"moved\"";
    let row = db
        .query_one_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            sql,
            values,
        ))
        .await?
        .ok_or_else(|| DbErr::Custom("the fenced write returned no row".into()))?;
    let applied = row.try_get_by_index::<i64>(0)? == 1;
    if applied {
        log_moved(current, payment.as_ref());
    }
    Ok(applied)
}

/// Refunds are claimed as payments are (`saga::store::claim_due`, `claim_one`):
/// `FOR UPDATE SKIP LOCKED` on PostgreSQL, `BEGIN IMMEDIATE` on SQLite.
impl Claimable for refund::Entity {
    const ID: refund::Column = refund::Column::Id;
    const NEXT_ATTEMPT_AT: refund::Column = refund::Column::NextAttemptAt;
    const CLAIMED_UNTIL: refund::Column = refund::Column::ClaimedUntil;
    const VERSION: refund::Column = refund::Column::Version;
}

/// A refund's audit trail, oldest first.
pub async fn trail(
    db: &impl ConnectionTrait,
    refund: Uuid,
) -> Result<Vec<transitions::Model>, DbErr> {
    transitions::Entity::find()
        .filter(transitions::Column::RefundId.eq(refund))
        .order_by_asc(transitions::Column::CreatedAt)
        .order_by_asc(transitions::Column::Id)
        .all(db)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fails when payments gain a column that a compensation refund's move of its payment
    /// to review (`sql_write`, PostgreSQL) does not write: SQLite writes the payment
    /// through the payments' own write, so it would be dropped on PostgreSQL only.
    #[test]
    fn the_payment_move_to_review_writes_every_column_a_payment_write_changes() {
        use sea_orm::{IdenStatic, Iterable};
        let fixed_at_registration = crate::saga::store::PAYMENT_COLUMNS_FIXED_AT_REGISTRATION;
        let written: Vec<&str> = PAYMENT_MOVED.iter().map(|c| c.as_str()).collect();
        for column in payment::Column::iter() {
            assert!(
                written.contains(&column.as_str())
                    || fixed_at_registration.contains(&column.as_str()),
                "payments.{} is not written by a compensation refund's move of its payment",
                column.as_str()
            );
        }
    }
}
