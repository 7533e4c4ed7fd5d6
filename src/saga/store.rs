//! The saga's database work: each function is one short transaction, and every payment
//! write is fenced on the row's `version`.
//!
//! No gateway calls and no transaction held across one. A write that finds the version
//! moved (someone else decided first) changes nothing and reports `Fenced`.
//!
//! On PostgreSQL each of those transactions is a single statement (data-modifying `WITH`
//! clauses, `sql` below): atomic by itself, one round trip and one commit, where
//! `BEGIN` … `COMMIT` cost five or six round trips (measured with `benches/run.sh`). SQLite
//! has no data-modifying `WITH`: there the same writes run as statements in a transaction.
//! Both write exactly the same rows.

use crate::db::{begin_write, now};
use crate::domain::{NewPayment, PaymentMethod};
use crate::entities::{
    AuditRow, event, idempotency_key as keys, payment, payment_transition as transitions,
};
use crate::idempotency::IdempotencyKey;
use crate::idempotency::derive::derive;
use crate::outbox;
use crate::saga::state::{Event, IllegalTransition, PaymentState, SagaState};
use chrono::{DateTime, Utc};
use sea_orm::sea_query::{Expr, ExprTrait};
use sea_orm::{
    ColumnTrait, ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbBackend, DbErr,
    EntityTrait, FromQueryResult, ModelTrait, QueryFilter, QueryOrder, QuerySelect, QueryTrait,
    TryInsertResult,
};
use std::time::Duration;
use uuid::Uuid;

pub use crate::entities::payment_transition::Actor;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(transparent)]
    Db(#[from] DbErr),
    #[error(transparent)]
    Illegal(#[from] IllegalTransition),
}

pub use crate::entities::idempotency_key::{FrozenAnswer, KeyStatus};

/// What the layer above renders for a write of a payment or a refund (`saga::apply`
/// hands over `representation`'s): storage stores, it never renders.
pub struct Render<M = payment::Model> {
    /// The answer a payment or refund that just became final freezes on its key.
    pub answer: fn(&M) -> FrozenAnswer,
    /// The payment or refund as an event's `datos` shows it (JSON text).
    pub datos: fn(&M) -> String,
}

impl<M> Clone for Render<M> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<M> Copy for Render<M> {}

pub fn chrono_after(d: Duration) -> chrono::TimeDelta {
    chrono::TimeDelta::from_std(d).unwrap_or(chrono::TimeDelta::MAX)
}

/// Now plus `d`.
pub fn now_plus(d: Duration) -> DateTime<Utc> {
    now() + chrono_after(d)
}

/// The idempotency key row for `(merchant, key)`: the one query of a replay.
pub async fn find_key(
    db: &impl ConnectionTrait,
    merchant: Uuid,
    key: &str,
) -> Result<Option<keys::Model>, DbErr> {
    keys::Model::find_by_statement(find_key_statement(db.get_database_backend(), merchant, key))
        .one(db)
        .await
}

/// `find_key`'s statement. Its SQL is built once per database kind (sea-query's
/// `find_by_id(…).limit(1)`), not on every request: building it was about a twelfth of
/// a replay's CPU in pagos (`benches/run.sh`, perf). Only the bound values change.
fn find_key_statement(backend: DbBackend, merchant: Uuid, key: &str) -> sea_orm::Statement {
    use std::sync::OnceLock;
    static BUILT: [OnceLock<sea_orm::Statement>; 2] = [OnceLock::new(), OnceLock::new()];
    let built = || {
        keys::Entity::find_by_id((Uuid::nil(), String::new()))
            .limit(1)
            .build(backend)
    };
    let mut statement = match backend {
        DbBackend::Postgres => BUILT[0].get_or_init(built).clone(),
        DbBackend::Sqlite => BUILT[1].get_or_init(built).clone(),
        _ => built(),
    };
    if let Some(values) = statement.values.as_mut() {
        // The primary key's columns, in order, come first; the limit after them.
        values.0[0] = merchant.into();
        values.0[1] = key.into();
    }
    statement
}

pub async fn find_payment(
    db: &impl ConnectionTrait,
    id: Uuid,
) -> Result<Option<payment::Model>, DbErr> {
    payment::Entity::find_by_id(id).one(db).await
}

/// The payments other than `except` whose charge (`gateway_ref`) is `charge`, any
/// merchant's: at most a few, none when the charge is no other payment's. On-call's
/// resolution asks it before it records a charge on a payment under review.
///
/// What it costs: `payments.gateway_ref` has no index, so this reads the whole table, a
/// sequential scan that grows with it. Measured at one million payments, the table in
/// the operating system's cache, on two CPUs other work kept busy: 0.34–0.64 s on
/// PostgreSQL 15 (289 MB of table; a parallel scan, 0.61–0.64 s on one worker) and
/// 0.49–0.62 s on SQLite (a 607 MB file). Some seconds at ten million, more if the table
/// must come from disk. No index is kept for it: every payment settled would pay for one,
/// on the hottest table, for a question asked only by a resolution by hand.
pub async fn others_with_charge(
    db: &impl ConnectionTrait,
    charge: &str,
    except: Uuid,
) -> Result<Vec<payment::Model>, DbErr> {
    payment::Entity::find()
        .filter(payment::Column::GatewayRef.eq(charge))
        .filter(payment::Column::Id.ne(except))
        .limit(5)
        .all(db)
        .await
}

pub struct Registration<'a> {
    pub merchant: Uuid,
    pub key: &'a IdempotencyKey,
    pub fingerprint: &'a str,
    pub payment: &'a NewPayment,
    pub lease: Duration,
}

pub enum Registered {
    /// tx1 committed: the key (leased to this request) and the payment, EN_PROCESO.
    Started(payment::Model),
    /// Another request registered this key first.
    Taken(keys::Model),
}

/// What one attempt to register came to.
enum Inserted {
    Both,
    /// Nothing written: the key is taken, and this is its row.
    Taken(keys::Model),
    /// Nothing written: the key is taken by a registration the statement could not see
    /// (it committed after the statement began), or (on PostgreSQL, where one statement
    /// cannot tell the two apart) a payment of this generation of the key exists.
    Neither,
    /// Nothing written: a payment of this key exists with this generation or a later one
    /// (the key was purged and is being reused).
    GenerationUsed,
}

/// tx1: the key and the payment, together or not at all. The key's primary key settles
/// the race between simultaneous duplicates.
///
/// The payment's id and gateway key are derived from the key's generation
/// (`idempotency::derive`): 0 for a key never seen, one more than its last payment's for
/// a key reused after the reaper purged it. The first try assumes 0 (nearly every key is
/// new), guarded by "no payment of this key has this generation or a later one"; only a
/// reused key pays for a second try.
pub async fn register(db: &DatabaseConnection, reg: Registration<'_>) -> Result<Registered, DbErr> {
    let mut generation = 0;
    // Each round either registers, finds the key taken, or learns a higher generation;
    // generations only grow, so this ends. The bound only guards against a bug.
    for _ in 0..16 {
        let model = new_payment(&reg, generation);
        let inserted = if one_statement(db) {
            sql::register(db, &model, reg.fingerprint).await?
        } else {
            register_in_transaction(db, &model, reg.fingerprint).await?
        };
        match inserted {
            Inserted::Both => return Ok(Registered::Started(model)),
            Inserted::Taken(existing) => return Ok(Registered::Taken(existing)),
            Inserted::Neither => {
                if let Some(existing) = find_key(db, reg.merchant, reg.key.as_str()).await? {
                    return Ok(Registered::Taken(existing));
                }
            }
            Inserted::GenerationUsed => {}
        }
        match last_generation(db, reg.merchant, reg.key.as_str()).await? {
            Some(last) if last >= generation => generation = last + 1,
            // Inserted by someone else and purged already: vanishingly rare; let the
            // client retry.
            _ => return Err(DbErr::RecordNotInserted),
        }
    }
    Err(DbErr::RecordNotInserted)
}

/// The payment `reg` registers as the `generation`-th of its key.
fn new_payment(reg: &Registration<'_>, generation: i32) -> payment::Model {
    let at = now();
    let derived = derive(
        reg.merchant,
        reg.key,
        u32::try_from(generation).unwrap_or(0),
    );
    payment::Model {
        id: derived.payment_id,
        merchant_id: reg.merchant,
        idempotency_key: reg.key.as_str().to_owned(),
        credit_id: reg.payment.credit_id.clone(),
        amount: reg.payment.amount,
        currency: reg.payment.currency.code().to_owned(),
        description: reg.payment.description.clone(),
        payment_method: reg
            .payment
            .payment_method
            .as_ref()
            .map(|m| m.to_json().to_string()),
        state: PaymentState::EnProceso,
        version: 0,
        attempts: 0,
        gateway_key: derived.gateway_key,
        gateway_ref: None,
        decline_code: None,
        next_attempt_at: at + chrono_after(reg.lease),
        created_at: at,
        updated_at: at,
        generation,
        // The request holds the payment as long as it holds the key.
        claimed_until: Some(at + chrono_after(reg.lease)),
        last_error: None,
        last_error_at: None,
    }
}

/// The generation of the last payment `merchant` made with client key `key`, if any.
async fn last_generation(
    db: &impl ConnectionTrait,
    merchant: Uuid,
    key: &str,
) -> Result<Option<i32>, DbErr> {
    payment::Entity::find()
        .select_only()
        .column_as(payment::Column::Generation.max(), "last")
        .filter(payment::Column::MerchantId.eq(merchant))
        .filter(payment::Column::IdempotencyKey.eq(key))
        .into_tuple::<Option<i32>>()
        .one(db)
        .await
        .map(Option::flatten)
}

/// The key row of a payment being registered: leased to its request until the payment's
/// first `next_attempt_at`.
fn key_row(p: &payment::Model, fingerprint: &str) -> keys::Model {
    keys::Model {
        merchant_id: p.merchant_id,
        key: p.idempotency_key.clone(),
        fingerprint: fingerprint.to_owned(),
        payment_id: p.id,
        status: KeyStatus::InProgress,
        response_code: None,
        response_body: None,
        lease_until: Some(p.next_attempt_at),
        created_at: p.created_at,
        updated_at: p.updated_at,
    }
}

/// tx1 on SQLite. `BEGIN IMMEDIATE` holds the database, so the generation check and the
/// inserts see the same data.
async fn register_in_transaction(
    db: &DatabaseConnection,
    model: &payment::Model,
    fingerprint: &str,
) -> Result<Inserted, DbErr> {
    let tx = begin_write(db).await?;
    if let Some(existing) = find_key(&tx, model.merchant_id, &model.idempotency_key).await? {
        tx.rollback().await?;
        return Ok(Inserted::Taken(existing));
    }
    if last_generation(&tx, model.merchant_id, &model.idempotency_key)
        .await?
        .is_some_and(|last| last >= model.generation)
    {
        tx.rollback().await?;
        return Ok(Inserted::GenerationUsed);
    }
    // The payment first (the key row refers to it); a lost race rolls both back.
    payment::Entity::insert(payment::ActiveModel::from(model.clone()))
        .exec_without_returning(&tx)
        .await?;
    let inserted = keys::Entity::insert(keys::ActiveModel::from(key_row(model, fingerprint)))
        .on_conflict_do_nothing()
        .exec_without_returning(&tx)
        .await?;
    if !matches!(inserted, TryInsertResult::Inserted(n) if n > 0) {
        tx.rollback().await?;
        return Ok(Inserted::Neither);
    }
    tx.commit().await?;
    Ok(Inserted::Both)
}

/// What a fenced write came to (of a payment, or of a refund: `M` is the row written).
#[derive(Debug)]
pub enum Written<M = payment::Model> {
    Applied(Box<M>),
    /// The row moved since it was read: nothing written.
    Fenced,
}

impl<M> Written<M> {
    /// `next` as written if the fenced write `applied`, else `Fenced`.
    pub fn of(applied: bool, next: M) -> Self {
        if applied {
            Written::Applied(Box::new(next))
        } else {
            Written::Fenced
        }
    }
}

/// A saga's row (a payment, a refund) as its workers schedule and hold it.
pub trait Scheduled {
    /// The columns that say when the row is looked at and who holds it.
    fn schedule(&mut self) -> Schedule<'_>;

    fn id(&self) -> Uuid;
    fn merchant_id(&self) -> Uuid;
    fn version(&self) -> i64;
    fn attempts(&self) -> i32;
    fn created_at(&self) -> DateTime<Utc>;
    /// Held by a writer until then (`None`: by nobody).
    fn claimed_until(&self) -> Option<DateTime<Utc>>;

    /// Held by its writer until `until`, so the reconciler leaves it alone (a new version).
    fn hold(&mut self, until: DateTime<Utc>) {
        let s = self.schedule();
        *s.version += 1;
        *s.next_attempt_at = until;
        *s.claimed_until = Some(until);
    }

    /// A claim given back untouched (its worker told to stop before taking it up): due
    /// at `at`, as it was when claimed, and held by nobody (a new version). Nothing
    /// happened to it: no attempt counted, `updated_at` kept.
    fn released(&mut self, at: DateTime<Utc>) {
        let s = self.schedule();
        *s.version += 1;
        *s.next_attempt_at = at;
        *s.claimed_until = None;
    }

    /// Looked at again at `due_at` and held by nobody (a new version); one more attempt
    /// if `count_attempt`. Its last error as `error` says (`LastError`).
    fn due_again(&mut self, due_at: DateTime<Utc>, count_attempt: bool, error: &LastError) {
        let at = now();
        let mut s = self.schedule();
        *s.version += 1;
        if count_attempt {
            *s.attempts += 1;
        }
        *s.updated_at = at;
        *s.next_attempt_at = due_at;
        *s.claimed_until = None;
        error.write(&mut s, at);
    }
}

/// What a write does to a row's last error (`last_error`, `last_error_at`: what the
/// console's queue and on-call's detail show as why it waits).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum LastError {
    /// Left as it was: nothing new was learned from the provider.
    #[default]
    Kept,
    /// The provider could not be asked, or a send's outcome is unknown: this is its last
    /// error from now.
    Now(String),
    /// The provider answered (a look-up that found the charge pending, say): the error
    /// before is no longer why it waits.
    Cleared,
}

impl LastError {
    fn write(&self, s: &mut Schedule<'_>, at: DateTime<Utc>) {
        match self {
            LastError::Kept => {}
            LastError::Now(error) => {
                *s.last_error = Some(last_error_text(error));
                *s.last_error_at = Some(at);
            }
            LastError::Cleared => {
                *s.last_error = None;
                *s.last_error_at = None;
            }
        }
    }
}

/// The most characters of a row's `last_error`: enough for a provider's error and its
/// detail, never a whole HTML error page.
pub const LAST_ERROR_CHARS: usize = 500;

/// `error` as a row keeps it: its first `LAST_ERROR_CHARS` characters (cut between two
/// characters, never inside one), `…` ending one that was cut.
fn last_error_text(error: &str) -> String {
    if error.chars().count() <= LAST_ERROR_CHARS {
        return error.to_owned();
    }
    let kept: String = error.chars().take(LAST_ERROR_CHARS - 1).collect();
    format!("{kept}…")
}

/// A row's schedule, borrowed to be changed.
pub struct Schedule<'a> {
    pub version: &'a mut i64,
    pub attempts: &'a mut i32,
    pub updated_at: &'a mut DateTime<Utc>,
    pub next_attempt_at: &'a mut DateTime<Utc>,
    pub claimed_until: &'a mut Option<DateTime<Utc>>,
    /// What the reconciler's last look-up or send failed with, and when.
    pub last_error: &'a mut Option<String>,
    pub last_error_at: &'a mut Option<DateTime<Utc>>,
}

/// `Scheduled` for the models whose columns have the schedule's names.
macro_rules! scheduled {
    ($($model:ty),*) => {$(
        impl Scheduled for $model {
            fn schedule(&mut self) -> Schedule<'_> {
                Schedule {
                    version: &mut self.version,
                    attempts: &mut self.attempts,
                    updated_at: &mut self.updated_at,
                    next_attempt_at: &mut self.next_attempt_at,
                    claimed_until: &mut self.claimed_until,
                    last_error: &mut self.last_error,
                    last_error_at: &mut self.last_error_at,
                }
            }

            fn id(&self) -> Uuid {
                self.id
            }

            fn merchant_id(&self) -> Uuid {
                self.merchant_id
            }

            fn version(&self) -> i64 {
                self.version
            }

            fn attempts(&self) -> i32 {
                self.attempts
            }

            fn created_at(&self) -> DateTime<Utc> {
                self.created_at
            }

            fn claimed_until(&self) -> Option<DateTime<Utc>> {
                self.claimed_until
            }
        }
    )*};
}

scheduled!(payment::Model, crate::entities::refund::Model);

/// A saga's row (a payment, a refund) as a decision moves it. What a decision does to
/// either is worked out once (`moved`) and written once (`Plan::write`,
/// `Plan::write_now`); what is a payment's or a refund's own is said here.
pub trait SagaRow: Scheduled + Clone + Send + Sync + Sized {
    /// Its state, and the state machine that moves it.
    type State: SagaState<Event = Self::Event, Illegal = Self::Illegal>;
    type Event: Copy + PartialEq + Send + Sync;
    type Illegal;
    /// A row of its audit trail.
    type Audit: AuditRow<State = Self::State> + Send + Sync;
    /// What a decision writes besides the row, its audit row and its event: on a
    /// payment's idempotency key (a row of its own); a compensation refund's payment,
    /// when the refund fails.
    type Besides: Send + Sync;
    /// What the layer above renders for a decision's writes (storage stores, it never
    /// renders).
    type Render: Copy + Send + Sync;

    fn state(&self) -> Self::State;
    /// Its state and what the gateway said of it, borrowed to be changed.
    fn recorded(&mut self) -> Recorded<'_, Self::State>;

    /// Moves the row to `to`, with the gateway's reference and the decline or failure
    /// code when the decision has them.
    fn record(&mut self, to: Self::State, gateway_ref: Option<String>, code: Option<String>) {
        let r = self.recorded();
        *r.state = to;
        if gateway_ref.is_some() {
            *r.gateway_ref = gateway_ref;
        }
        if code.is_some() {
            *r.code = code;
        }
    }

    /// What applying `event` writes (the row after it, its audit row, its event, and
    /// what it writes on the key, with the answers as `render` renders them); an
    /// impossible move is refused here, before anything is written.
    fn plan(
        &self,
        event: Self::Event,
        step: Step,
        actor: Actor,
        reason: &str,
        render: Self::Render,
    ) -> Result<Plan<Self>, Self::Illegal>;

    /// What a hand-over writes: `next` (due again, with the provider's reference), and
    /// the request's lease on the row's key given up, with no answer frozen.
    fn handed_over(next: Self) -> Plan<Self>;

    /// A plan's writes as statements in `tx`, fenced on `current`'s version; false
    /// (nothing written) if the row moved since `current` was read.
    fn write_in<'a, C: ConnectionTrait>(
        tx: &'a C,
        current: &'a Self,
        plan: &'a Plan<Self>,
    ) -> impl Future<Output = Result<bool, DbErr>> + Send + 'a;

    /// A plan's writes as one statement (PostgreSQL), fenced the same way.
    fn write_one_statement<'a>(
        db: &'a DatabaseConnection,
        current: &'a Self,
        plan: &'a Plan<Self>,
    ) -> impl Future<Output = Result<bool, DbErr>> + Send + 'a;
}

/// A row's state and what the gateway said of it, borrowed to be changed.
pub struct Recorded<'a, S> {
    pub state: &'a mut S,
    pub gateway_ref: &'a mut Option<String>,
    /// A payment's `decline_code`, a refund's `failure_code`.
    pub code: &'a mut Option<String>,
}

/// What a decision changes besides the state, whatever the row: a payment's `Changes`
/// or a refund's.
#[derive(Clone, Debug, Default)]
pub struct Step {
    pub gateway_ref: Option<String>,
    /// A payment's `decline_code`, a refund's `failure_code`.
    pub code: Option<String>,
    pub hold_until: Option<DateTime<Utc>>,
    pub count_attempt: bool,
    /// What the decision learned of the provider, as the row's last error: an escalation
    /// because the provider cannot be asked says why (`Now`), one after it answered clears
    /// the error before (`Cleared`). A settled row's is cleared whatever this says.
    pub last_error: LastError,
}

/// A decision worked out, before what is a payment's or a refund's own is added to it.
pub struct Moved<M: SagaRow> {
    pub from: M::State,
    pub to: M::State,
    pub at: DateTime<Utc>,
    /// The row as it will be (its version one above the current one).
    pub next: M,
    pub audit: Option<M::Audit>,
}

/// Applies `event` to `current`: the row after it and its audit row, when the decision is
/// worth one. An impossible move is refused here, before anything is written.
pub fn moved<M: SagaRow>(
    current: &M,
    event: M::Event,
    step: Step,
    actor: Actor,
    reason: &str,
) -> Result<Moved<M>, M::Illegal> {
    let from = current.state();
    let to = from.transition(event)?;
    let at = now();
    let mut next = current.clone();
    next.record(to, step.gateway_ref, step.code);
    let mut s = next.schedule();
    *s.version += 1;
    *s.updated_at = at;
    step.last_error.write(&mut s, at);
    if step.count_attempt {
        *s.attempts += 1;
    }
    if let Some(until) = step.hold_until {
        *s.next_attempt_at = until;
        *s.claimed_until = Some(until);
    }
    if !to.in_flight() {
        // Nobody sends it again: nobody holds it.
        *s.claimed_until = None;
    }
    if to.is_terminal() {
        // Nothing waits any more. (Under review, on-call still reads why it waited: the
        // error before, or the one `step` says.)
        *s.last_error = None;
        *s.last_error_at = None;
    }
    // A resend keeps the state but is a decision worth an audit row.
    let resend = event == M::State::SEND && actor != Actor::Request;
    let audit = (from != to || resend)
        .then(|| M::Audit::of_move(current.id(), from, to, actor, reason, at));
    Ok(Moved {
        from,
        to,
        at,
        next,
        audit,
    })
}

impl<M: SagaRow> Moved<M> {
    /// The plan of the move, with what it writes besides the row and, when the move is
    /// one the merchant must know, its event (`datos` renders the row). The event's
    /// `secuencia` is the row's version after the move: it only grows, and each version is
    /// written once (fencing).
    pub fn plan(self, besides: M::Besides, datos: fn(&M) -> String) -> Plan<M> {
        let event = self
            .to
            .event_type()
            .filter(|_| self.from != self.to && outbox::ON)
            .map(|tipo| {
                let next = &self.next;
                outbox::event(
                    next.merchant_id(),
                    tipo,
                    next.id(),
                    next.version(),
                    &datos(next),
                    self.at,
                )
            });
        Plan {
            next: self.next,
            audit: self.audit,
            besides,
            event,
        }
    }
}

/// Everything one decision writes, worked out before anything is written (`plan`), then
/// written in the caller's transaction (`write`) or committed on its own (`write_now`).
pub struct Plan<M: SagaRow = payment::Model> {
    /// The row as it will be (its version one above the current one).
    pub(crate) next: M,
    /// The audit row, when the decision is worth one.
    pub(crate) audit: Option<M::Audit>,
    /// What it writes besides the row, its audit row and its event (`SagaRow::Besides`).
    pub(crate) besides: M::Besides,
    /// The event the merchant is told, when the move is one it must know (the outbox:
    /// written with the move or not at all).
    pub(crate) event: Option<event::Model>,
}

impl<M: SagaRow> Plan<M> {
    /// The plan's event told with other `datos` (its row as the API shows it, with what
    /// only the layer above reads: a payment's refunded amount). Nothing when the plan
    /// tells nothing.
    pub(crate) fn retell(&mut self, datos: &str) {
        if let Some(e) = &self.event {
            self.event = Some(outbox::event(
                e.merchant_id,
                e.event_type,
                e.subject_id,
                e.sequence,
                datos,
                e.created_at,
            ));
        }
    }

    /// The plan's writes in `tx`, over `current`; the caller commits.
    pub async fn write<C: ConnectionTrait>(self, tx: &C, current: &M) -> Result<Written<M>, DbErr> {
        let applied = M::write_in(tx, current, &self).await?;
        Ok(Written::of(applied, self.next))
    }

    /// The plan's writes over `current`, committed on their own.
    pub async fn write_now(
        self,
        db: &DatabaseConnection,
        current: &M,
    ) -> Result<Written<M>, DbErr> {
        let applied = self.write_committed(db, current).await?;
        Ok(Written::of(applied, self.next))
    }

    /// The plan's writes committed on their own: one statement on PostgreSQL, a
    /// transaction on SQLite. False when fenced.
    pub(crate) async fn write_committed(
        &self,
        db: &DatabaseConnection,
        current: &M,
    ) -> Result<bool, DbErr> {
        if one_statement(db) {
            return M::write_one_statement(db, current, self).await;
        }
        let tx = begin_write(db).await?;
        let applied = M::write_in(&tx, current, self).await?;
        kept_if(tx, applied).await
    }
}

impl SagaRow for payment::Model {
    type State = PaymentState;
    type Event = Event;
    type Illegal = IllegalTransition;
    type Audit = transitions::Model;
    type Besides = KeyWrite;
    type Render = Render;

    fn state(&self) -> PaymentState {
        self.state
    }

    fn recorded(&mut self) -> Recorded<'_, PaymentState> {
        Recorded {
            state: &mut self.state,
            gateway_ref: &mut self.gateway_ref,
            code: &mut self.decline_code,
        }
    }

    /// The fenced update, the audit row, and, when the payment becomes final, the key's
    /// frozen answer as `render` renders it.
    fn plan(
        &self,
        event: Event,
        step: Step,
        actor: Actor,
        reason: &str,
        render: Render,
    ) -> Result<Plan, IllegalTransition> {
        let mut moved = moved(self, event, step, actor, reason)?;
        if !PaymentState::IN_FLIGHT.contains(&moved.to) {
            // Nobody sends it again: what was kept only to resend the same request (card
            // token, payer e-mail and document) is erased.
            moved.next.payment_method = self.payment_method.as_deref().map(without_personal_data);
        }
        let answer = moved.to.is_terminal().then(|| (render.answer)(&moved.next));
        // Under review (REVISION_MANUAL): nobody works on it until on-call decides, so a
        // retry is answered its state (202), never 409 "still in flight" for what is left
        // of the first request's lease.
        let lease = if answer.is_none() && !PaymentState::IN_FLIGHT.contains(&moved.to) {
            Lease::Set(None)
        } else if actor == Actor::Request
            && moved.to == PaymentState::Enviada
            && moved.next.claimed_until > self.claimed_until
        {
            // A request marks its send with a hold beyond its lease on the key (its write
            // waited, or the lease is shorter than a send): the key is leased as long, so
            // that a retry meanwhile is told 409 (the first request still in flight), not
            // the payment's state as if nobody were sending it.
            Lease::Set(moved.next.claimed_until)
        } else {
            Lease::Kept
        };
        let key = KeyWrite { answer, lease };
        Ok(moved.plan(key, render.datos))
    }

    fn handed_over(next: Self) -> Plan {
        let key = KeyWrite {
            answer: None,
            lease: Lease::Set(None),
        };
        Plan {
            next,
            audit: None,
            besides: key,
            event: None,
        }
    }

    fn write_in<'a, C: ConnectionTrait>(
        tx: &'a C,
        current: &'a Self,
        plan: &'a Plan,
    ) -> impl Future<Output = Result<bool, DbErr>> + Send + 'a {
        write_plan(tx, current, plan)
    }

    fn write_one_statement<'a>(
        db: &'a DatabaseConnection,
        current: &'a Self,
        plan: &'a Plan,
    ) -> impl Future<Output = Result<bool, DbErr>> + Send + 'a {
        sql::write_plan(db, current, plan)
    }
}

/// What changes besides the state.
#[derive(Clone, Debug, Default)]
pub struct Changes {
    pub gateway_ref: Option<String>,
    pub decline_code: Option<String>,
    /// The writer holds the payment until then (`claimed_until`, and `next_attempt_at`
    /// so the reconciler leaves it alone): set by a send, whose claim must outlast it.
    pub hold_until: Option<DateTime<Utc>>,
    pub count_attempt: bool,
}

impl From<Changes> for Step {
    fn from(changes: Changes) -> Step {
        Step {
            gateway_ref: changes.gateway_ref,
            code: changes.decline_code,
            hold_until: changes.hold_until,
            count_attempt: changes.count_attempt,
            last_error: LastError::Kept,
        }
    }
}

/// What a decision writes on a payment's key besides the payment: the key is a row of its
/// own (`idempotency_keys`).
pub struct KeyWrite {
    /// The key's frozen answer, when the payment becomes final.
    answer: Option<FrozenAnswer>,
    /// What becomes of the request's lease on the key.
    lease: Lease,
}

/// A request's lease on its payment's key, as a decision leaves it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lease {
    Kept,
    /// Given up (`None`: a hand-over, no answer frozen) or held until then.
    Set(Option<DateTime<Utc>>),
}

/// A stored `medioPago` with only what identifies the method (`id`, Stripe's `cliente`,
/// installments and issuer): the card token and the payer's e-mail and document are needed
/// only while the payment may be sent again. One that does not parse is erased whole.
fn without_personal_data(stored: &str) -> String {
    serde_json::from_str(stored)
        .ok()
        .and_then(|value| PaymentMethod::from_json(&value).ok())
        .map(|method| {
            PaymentMethod {
                token: None,
                payer_email: None,
                document: None,
                ..method
            }
            .to_json()
            .to_string()
        })
        .unwrap_or_else(|| "{}".to_owned())
}

/// The plan's writes as statements in the caller's transaction; false (nothing written)
/// if the payment moved since `current` was read.
async fn write_plan<C: ConnectionTrait>(
    tx: &C,
    current: &payment::Model,
    plan: &Plan,
) -> Result<bool, DbErr> {
    if !write_fenced(tx, current, &plan.next).await? {
        return Ok(false);
    }
    if let Some(audit) = &plan.audit {
        transitions::Entity::insert(transitions::ActiveModel::from(audit.clone()))
            .exec_without_returning(tx)
            .await?;
    }
    if let Some(answer) = &plan.besides.answer {
        freeze_answer(tx, &plan.next, answer).await?;
    }
    if let Lease::Set(until) = plan.besides.lease {
        set_lease(tx, current, until).await?;
    }
    if let Some(event) = &plan.event {
        outbox::record(tx, event).await?;
    }
    Ok(true)
}

/// Ends the transaction of a fenced write: committed if the write `applied`, rolled back
/// (nothing to keep) if it was fenced. Returns `applied`.
pub(crate) async fn kept_if(tx: DatabaseTransaction, applied: bool) -> Result<bool, DbErr> {
    if applied {
        tx.commit().await?;
    } else {
        tx.rollback().await?;
    }
    Ok(applied)
}

/// The columns of a payment a decision may change, in the order its writes bind them
/// (`write_fenced`; a compensation refund's move of its payment to review, on PostgreSQL).
pub(crate) const PAYMENT_MOVED: [payment::Column; 11] = [
    payment::Column::State,
    payment::Column::Version,
    payment::Column::Attempts,
    payment::Column::GatewayRef,
    payment::Column::DeclineCode,
    payment::Column::NextAttemptAt,
    payment::Column::UpdatedAt,
    payment::Column::ClaimedUntil,
    payment::Column::PaymentMethod,
    payment::Column::LastError,
    payment::Column::LastErrorAt,
];

/// Writes `next` over `current` only if nobody wrote in between.
async fn write_fenced<C: ConnectionTrait>(
    tx: &C,
    current: &payment::Model,
    next: &payment::Model,
) -> Result<bool, DbErr> {
    update_fenced::<payment::Entity, _>(tx, &PAYMENT_MOVED, current, next).await
}

/// Writes `columns` of `next` over the row `current` of `E` only if nobody wrote in
/// between (its version is still `current`'s); false when fenced.
pub(crate) async fn update_fenced<E: Claimable, C: ConnectionTrait>(
    tx: &C,
    columns: &[E::Column],
    current: &E::Model,
    next: &E::Model,
) -> Result<bool, DbErr> {
    let mut update = E::update_many();
    for &column in columns {
        update = update.col_expr(column, Expr::val(next.get(column)));
    }
    let result = update
        .filter(E::ID.eq(current.id()))
        .filter(E::VERSION.eq(current.version()))
        .exec(tx)
        .await?;
    Ok(result.rows_affected == 1)
}

/// Freezes the final answer on the payment's key and releases its lease. An answer once
/// frozen never changes: what a client was told is what its retries are told.
async fn freeze_answer<C: ConnectionTrait>(
    tx: &C,
    p: &payment::Model,
    answer: &FrozenAnswer,
) -> Result<(), DbErr> {
    let update = keys::Entity::update_many()
        .col_expr(
            keys::Column::Status,
            Expr::value(KeyStatus::Completed.as_str()),
        )
        .col_expr(
            keys::Column::ResponseCode,
            Expr::value(i32::from(answer.status)),
        )
        .col_expr(keys::Column::ResponseBody, Expr::value(answer.body.clone()))
        .col_expr(
            keys::Column::LeaseUntil,
            Expr::value(Option::<DateTime<Utc>>::None),
        )
        .col_expr(keys::Column::UpdatedAt, Expr::value(p.updated_at));
    update_key_in_progress(tx, p, update).await
}

/// Runs `update` on the key of `p` while nobody has frozen an answer on it.
async fn update_key_in_progress<C: ConnectionTrait>(
    tx: &C,
    p: &payment::Model,
    update: sea_orm::UpdateMany<keys::Entity>,
) -> Result<(), DbErr> {
    update
        .filter(keys::Column::MerchantId.eq(p.merchant_id))
        .filter(keys::Column::Key.eq(p.idempotency_key.clone()))
        .filter(keys::Column::PaymentId.eq(p.id))
        .filter(keys::Column::Status.eq(KeyStatus::InProgress))
        .exec(tx)
        .await?;
    Ok(())
}

/// The request gives up ownership of a payment or refund it could not settle (gateway
/// pending or unknown): the reconciler takes it from `due_at`, and retries of its key are
/// answered with its current state instead of 409. `error`: what the send's answer says
/// of its last error (why its outcome is not known; cleared when the provider answered).
pub async fn hand_over<M: SagaRow>(
    db: &DatabaseConnection,
    current: &M,
    gateway_ref: Option<String>,
    error: &LastError,
    due_at: DateTime<Utc>,
) -> Result<Written<M>, DbErr> {
    let mut next = current.clone();
    next.due_again(due_at, false, error);
    next.record(current.state(), gateway_ref, None);
    M::handed_over(next).write_now(db, current).await
}

/// The row `id` of `E` as stored now.
pub async fn find_row<E: Claimable>(
    db: &DatabaseConnection,
    id: Uuid,
) -> Result<Option<E::Model>, DbErr> {
    E::find().filter(E::ID.eq(id)).one(db).await
}

/// Ends a request's lease on the payment's key (`None`; no answer is frozen), or holds it
/// until `until`.
async fn set_lease<C: ConnectionTrait>(
    tx: &C,
    p: &payment::Model,
    until: Option<DateTime<Utc>>,
) -> Result<(), DbErr> {
    let update = keys::Entity::update_many().col_expr(keys::Column::LeaseUntil, Expr::value(until));
    update_key_in_progress(tx, p, update).await
}

/// A saga's table (payments, refunds) as its workers claim rows of it: the rows a worker
/// may send or look up, and the columns a claim reads and moves.
pub trait Claimable: EntityTrait<Model: SagaRow> {
    const ID: Self::Column;
    const NEXT_ATTEMPT_AT: Self::Column;
    const CLAIMED_UNTIL: Self::Column;
    const VERSION: Self::Column;

    /// `state IN (…)` of the rows a worker may send or look up: never sent or sent, not
    /// final, not under review (`SagaState::in_flight`). The states are written into the
    /// SQL, not bound: the predicate of the table's partial index of unsettled rows
    /// (`payments_unsettled_due_idx`), which PostgreSQL uses for a prepared statement's
    /// generic plan only when the query's own condition proves the index's (bound values
    /// cannot).
    fn reconcilable() -> sea_orm::sea_query::SimpleExpr {
        let in_flight = [
            <Self::Model as SagaRow>::State::NEVER_SENT,
            <Self::Model as SagaRow>::State::SENT,
        ];
        let states = in_flight.map(|s| format!("'{s}'"));
        Expr::cust(format!(
            r#""{}"."state" IN ({})"#,
            Self::default().table_name(),
            states.join(", ")
        ))
    }
}

impl Claimable for payment::Entity {
    const ID: payment::Column = payment::Column::Id;
    const NEXT_ATTEMPT_AT: payment::Column = payment::Column::NextAttemptAt;
    const CLAIMED_UNTIL: payment::Column = payment::Column::ClaimedUntil;
    const VERSION: payment::Column = payment::Column::Version;
}

/// Claims up to `limit` rows of `E` due at `due_by`, oldest first: each claimed row gets
/// `next_attempt_at = claimed_until = now + claim_for` and a new version, so no other
/// process picks it until this one is done or has died. PostgreSQL skips rows another process is claiming
/// (`FOR UPDATE SKIP LOCKED`); SQLite's `BEGIN IMMEDIATE` serializes claims.
pub async fn claim_due<E: Claimable>(
    db: &DatabaseConnection,
    due_by: DateTime<Utc>,
    limit: u64,
    claim_for: Duration,
) -> Result<Vec<E::Model>, DbErr> {
    let query = E::find()
        .filter(E::reconcilable())
        .filter(E::NEXT_ATTEMPT_AT.lte(due_by))
        .order_by_asc(E::NEXT_ATTEMPT_AT)
        .limit(limit);
    claim(db, query, claim_for).await
}

/// Which rows `claim_one` may take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum When {
    /// Due or not (on-call's "this one, now").
    Now,
    /// Only if it is due (a client retry that found its payment or refund unsettled):
    /// however often clients retry, the provider is asked about it at most once per
    /// backoff step.
    IfDue,
}

/// Claims one row of `E` that nobody holds (see `claimed_until`): never one a request, a
/// reconciliation pass or another "reconcile now" is working on, so two workers never
/// send one payment (or refund) at once. None if it is held, final, under review, or
/// (`IfDue`) not due yet.
pub async fn claim_one<E: Claimable>(
    db: &DatabaseConnection,
    id: Uuid,
    when: When,
    claim_for: Duration,
) -> Result<Option<E::Model>, DbErr> {
    let at = now();
    let mut query = E::find()
        .filter(E::ID.eq(id))
        .filter(E::reconcilable())
        .filter(
            sea_orm::Condition::any()
                .add(E::CLAIMED_UNTIL.is_null())
                .add(E::CLAIMED_UNTIL.lte(at)),
        );
    if when == When::IfDue {
        query = query.filter(E::NEXT_ATTEMPT_AT.lte(at));
    }
    Ok(claim(db, query, claim_for).await?.into_iter().next())
}

async fn claim<E: Claimable>(
    db: &DatabaseConnection,
    query: sea_orm::Select<E>,
    claim_for: Duration,
) -> Result<Vec<E::Model>, DbErr> {
    let until = now() + chrono_after(claim_for);
    if one_statement(db) {
        return sql::claim(db, query, until).await;
    }
    let tx = begin_write(db).await?;
    let mut rows = query.all(&tx).await?;
    if rows.is_empty() {
        tx.rollback().await?;
        return Ok(rows);
    }
    // `BEGIN IMMEDIATE` holds the database: the versions cannot move before this update,
    // so each becomes exactly version + 1.
    E::update_many()
        .col_expr(E::NEXT_ATTEMPT_AT, Expr::value(until))
        .col_expr(E::CLAIMED_UNTIL, Expr::value(Some(until)))
        .col_expr(E::VERSION, Expr::col(E::VERSION).add(1))
        .filter(E::ID.is_in(rows.iter().map(Scheduled::id)))
        .exec(&tx)
        .await?;
    tx.commit().await?;
    for row in &mut rows {
        row.hold(until);
    }
    Ok(rows)
}

/// A saga's row (a payment, a refund) written over itself alone, fenced on its version:
/// a new schedule or claim, with no audit row and no event.
pub trait Rewritten: Scheduled + Clone + Send + Sync {
    /// Writes `next` over `current` only if nobody wrote in between; false when fenced.
    fn write_fenced<'a>(
        db: &'a DatabaseConnection,
        current: &'a Self,
        next: &'a Self,
    ) -> impl Future<Output = Result<bool, DbErr>> + Send + 'a;
}

impl Rewritten for payment::Model {
    fn write_fenced<'a>(
        db: &'a DatabaseConnection,
        current: &'a Self,
        next: &'a Self,
    ) -> impl Future<Output = Result<bool, DbErr>> + Send + 'a {
        write_fenced(db, current, next)
    }
}

/// Extends a claim this worker holds to `until` (a fenced write): a payment or refund
/// claimed ahead, taken up after waiting for a slot, starts its work with a whole claim
/// left. `Fenced` if someone else took it meanwhile.
pub async fn renew_claim<M: Rewritten>(
    db: &DatabaseConnection,
    current: &M,
    until: DateTime<Utc>,
) -> Result<Written<M>, DbErr> {
    rewrite(db, current, |next| next.hold(until)).await
}

/// Gives back a claim its worker never took up (told to stop), due now: another process
/// takes it at its next pass, not once the claim runs out. Fenced: nothing if someone
/// wrote the row since (its claim ran out and another took it).
pub async fn release_claim<M: Rewritten>(
    db: &DatabaseConnection,
    current: &M,
) -> Result<Written<M>, DbErr> {
    rewrite(db, current, |next| next.released(now())).await
}

/// The provider had no final answer, or could not be asked: look again at `due_at`, the
/// row's last error as `error` says (`LastError`). Counts an attempt.
pub async fn reschedule<M: Rewritten>(
    db: &DatabaseConnection,
    current: &M,
    due_at: DateTime<Utc>,
    error: &LastError,
) -> Result<Written<M>, DbErr> {
    rewrite(db, current, |next| next.due_again(due_at, true, error)).await
}

/// `current` as `change` leaves it, written only if nobody wrote in between.
pub(crate) async fn rewrite<M: Rewritten>(
    db: &DatabaseConnection,
    current: &M,
    change: impl FnOnce(&mut M),
) -> Result<Written<M>, DbErr> {
    let mut next = current.clone();
    change(&mut next);
    let applied = M::write_fenced(db, current, &next).await?;
    Ok(Written::of(applied, next))
}

/// Does this database take a transaction's writes as one statement (`sql`)?
pub fn one_statement(db: &impl ConnectionTrait) -> bool {
    db.get_database_backend() == DbBackend::Postgres
}

/// The PostgreSQL statements: each is what SQLite does in a transaction, written as one
/// statement with data-modifying `WITH` clauses. A statement is atomic: its parts commit
/// together or not at all. The parts that depend on the fenced payment update read its
/// `RETURNING` rows, so a fenced statement writes nothing.
mod sql {
    use super::{Inserted, KeyStatus, Plan, key_row};
    use crate::entities::{event, idempotency_key as keys, payment};
    use chrono::{DateTime, Utc};
    use sea_orm::sea_query::{LockBehavior, LockType};
    use sea_orm::{
        DatabaseConnection, DbBackend, DbErr, EntityTrait, FromQueryResult, IdenStatic, Iterable,
        ModelTrait, QuerySelect, QueryTrait, Statement, Value,
    };
    use std::sync::OnceLock;

    /// Bound values, numbered as they are added.
    #[derive(Default)]
    struct Params(Vec<Value>);

    /// The `$n` of a bound value, written into SQL text only when that text is built.
    #[derive(Clone, Copy)]
    pub(super) struct Placeholder(pub(super) usize);

    impl std::fmt::Display for Placeholder {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "${}", self.0)
        }
    }

    impl Params {
        fn add(&mut self, value: impl Into<Value>) -> Placeholder {
            self.0.push(value.into());
            Placeholder(self.0.len())
        }

        fn statement(self, sql: &str) -> Statement {
            Statement::from_sql_and_values(DbBackend::Postgres, sql, self.0)
        }
    }

    // The SQL of each statement depends only on its shape, never on its values: it is
    // built once per shape and kept, and each call only binds its values, in the order
    // the text numbers them. Formatting the text on every call was about a tenth of a
    // create's instructions in pagos (callgrind, docs/benchmarks.md).

    /// tx1: the key first, its primary key settling the race between duplicates, and
    /// only if no payment of this key has this generation or a later one (a key reused
    /// after a purge); the payment only if the key went in (its foreign key is checked at
    /// the end of the statement, when both rows exist). Nothing written when the key was
    /// taken or the generation used. Both rows are written whole, column by column from
    /// their entities, as the SQLite path inserts them: a column added to an entity is
    /// written here too.
    ///
    /// The statement also answers with the key's row as it stood when the statement
    /// began, so a taken key costs no second statement: the seed's algorithm (insert,
    /// and look only if nothing went in) in one round trip, where looking first cost every
    /// new payment a statement of its own. A key registered by a transaction that
    /// committed after the statement began is taken but not seen (`Neither`).
    pub(super) async fn register(
        db: &DatabaseConnection,
        p: &payment::Model,
        fingerprint: &str,
    ) -> Result<Inserted, DbErr> {
        static SQL: OnceLock<String> = OnceLock::new();
        let key = key_row(p, fingerprint);
        let mut v = Params::default();
        let key_values = bind_row(&mut v, &key);
        let payment_values = bind_row(&mut v, p);
        let merchant = v.add(p.merchant_id);
        let client_key = v.add(p.idempotency_key.clone());
        let generation = v.add(p.generation);
        let sql = SQL.get_or_init(|| {
            format!(
                r#"WITH "registered" AS (
  INSERT INTO "idempotency_keys" ({})
  SELECT {} WHERE NOT EXISTS (
    SELECT 1 FROM "payments"
    WHERE "merchant_id" = {merchant} AND "idempotency_key" = {client_key} AND "generation" >= {generation})
  ON CONFLICT ("merchant_id", "key") DO NOTHING
  RETURNING "payment_id"),
"paid" AS (
  INSERT INTO "payments" ({})
  SELECT {} FROM "registered"
  RETURNING "id")
SELECT (SELECT count(*) FROM "paid") AS "registered_payments", {}
FROM (VALUES (1)) AS "one" ("one")
LEFT JOIN "idempotency_keys" AS "k" ON "k"."merchant_id" = {merchant} AND "k"."key" = {client_key}"#,
                columns::<keys::Entity>(),
                listed(key_values),
                columns::<payment::Entity>(),
                listed(payment_values),
                keys::Column::iter()
                    .map(|column| format!("\"k\".\"{}\"", column.as_str()))
                    .collect::<Vec<_>>()
                    .join(", "),
            )
        });
        let row = crate::db::query_one_on_pool(db, v.statement(sql))
            .await?
            .ok_or_else(|| DbErr::RecordNotFound("the registration's answer".into()))?;
        if row.try_get::<i64>("", "registered_payments")? == 1 {
            return Ok(Inserted::Both);
        }
        // The key's columns are NULL when the statement saw no key row.
        Ok(match row.try_get::<Option<String>>("", "key")? {
            Some(_) => Inserted::Taken(keys::Model::from_query_result(&row, "")?),
            None => Inserted::Neither,
        })
    }

    /// Binds every column of `model`, in the entity's column order; the placeholders of
    /// the first and the last.
    fn bind_row<M: ModelTrait>(v: &mut Params, model: &M) -> (Placeholder, Placeholder) {
        let first = Placeholder(v.0.len() + 1);
        for column in <M::Entity as EntityTrait>::Column::iter() {
            v.add(model.get(column));
        }
        (first, Placeholder(v.0.len()))
    }

    /// Every column of `E`'s table, quoted, comma-separated, in the entity's order.
    fn columns<E: EntityTrait>() -> String {
        E::Column::iter()
            .map(|column| format!("\"{}\"", column.as_str()))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// `$first, …, $last`.
    fn listed((first, last): (Placeholder, Placeholder)) -> String {
        (first.0..=last.0)
            .map(|n| Placeholder(n).to_string())
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// A plan's writes: the payment fenced on its version, then, only if it moved, the
    /// audit row, the key's frozen answer or the release of its lease. False when fenced.
    pub(super) async fn write_plan(
        db: &DatabaseConnection,
        current: &payment::Model,
        plan: &Plan,
    ) -> Result<bool, DbErr> {
        // One text per shape: with or without the audit row, the frozen answer, the
        // release of the lease, the event.
        static SQL: [OnceLock<String>; 16] = [const { OnceLock::new() }; 16];
        let next = &plan.next;
        let mut v = Params::default();
        let moved = [
            v.add(next.state),
            v.add(next.version),
            v.add(next.attempts),
            v.add(next.gateway_ref.clone()),
            v.add(next.decline_code.clone()),
            v.add(next.next_attempt_at),
            v.add(next.updated_at),
            v.add(next.claimed_until),
            v.add(next.payment_method.clone()),
            v.add(next.last_error.clone()),
            v.add(next.last_error_at),
            v.add(current.id),
            v.add(current.version),
        ];
        let audit = plan.audit.as_ref().map(|audit| {
            [
                v.add(audit.id),
                v.add(audit.from_state),
                v.add(audit.to_state),
                v.add(audit.actor),
                v.add(audit.reason.clone()),
                v.add(audit.created_at),
            ]
        });
        // The key of this payment, while nobody has frozen an answer on it.
        let its_key = |v: &mut Params| {
            [
                v.add(current.merchant_id),
                v.add(current.idempotency_key.clone()),
                v.add(current.id),
                v.add(KeyStatus::InProgress),
            ]
        };
        let answer = plan.besides.answer.as_ref().map(|answer| {
            let set = [
                v.add(KeyStatus::Completed),
                v.add(i32::from(answer.status)),
                v.add(answer.body.clone()),
                v.add(next.updated_at),
            ];
            (set, its_key(&mut v))
        });
        let leased = match plan.besides.lease {
            super::Lease::Kept => None,
            super::Lease::Set(until) => Some((v.add(until), its_key(&mut v))),
        };
        let told = plan.event.as_ref().map(|e| bind_row(&mut v, e));
        let shape = usize::from(audit.is_some())
            | usize::from(answer.is_some()) << 1
            | usize::from(leased.is_some()) << 2
            | usize::from(told.is_some()) << 3;
        let sql = SQL[shape].get_or_init(|| write_plan_sql(moved, audit, answer, leased, told));
        let row = crate::db::query_one_on_pool(db, v.statement(sql))
            .await?
            .ok_or_else(|| DbErr::Custom("the fenced write returned no row".into()))?;
        Ok(row.try_get_by_index::<i64>(0)? == 1)
    }

    pub(super) fn write_plan_sql(
        moved: [Placeholder; 13],
        audit: Option<[Placeholder; 6]>,
        answer: Option<([Placeholder; 4], [Placeholder; 4])>,
        leased: Option<(Placeholder, [Placeholder; 4])>,
        told: Option<(Placeholder, Placeholder)>,
    ) -> String {
        let [
            state,
            version,
            attempts,
            gateway_ref,
            decline_code,
            next_attempt_at,
            updated_at,
            claimed_until,
            payment_method,
            last_error,
            last_error_at,
            id,
            current_version,
        ] = moved;
        let mut sql = format!(
            r#"WITH "moved" AS (
  UPDATE "payments" SET "state" = {state}, "version" = {version}, "attempts" = {attempts}, "gateway_ref" = {gateway_ref}, "decline_code" = {decline_code}, "next_attempt_at" = {next_attempt_at}, "updated_at" = {updated_at}, "claimed_until" = {claimed_until}, "payment_method" = {payment_method}, "last_error" = {last_error}, "last_error_at" = {last_error_at}
  WHERE "id" = {id} AND "version" = {current_version}
  RETURNING "id")"#
        );
        if let Some([id, from_state, to_state, actor, reason, created_at]) = audit {
            sql += &format!(
                r#",
"audit" AS (
  INSERT INTO "payment_transitions" ("id", "payment_id", "from_state", "to_state", "actor", "reason", "created_at")
  SELECT {id}, "id", {from_state}, {to_state}, {actor}, {reason}, {created_at} FROM "moved")"#
            );
        }
        let its_key = |[merchant, key, payment, in_progress]: [Placeholder; 4]| {
            format!(
                r#"WHERE "merchant_id" = {merchant} AND "key" = {key} AND "payment_id" = {payment} AND "status" = {in_progress} AND EXISTS (SELECT 1 FROM "moved")"#
            )
        };
        if let Some(([status, code, body, updated_at], key)) = answer {
            sql += &format!(
                ",\n\"frozen\" AS (\n  UPDATE \"idempotency_keys\" SET \"status\" = {status}, \"response_code\" = {code}, \"response_body\" = {body}, \"lease_until\" = NULL, \"updated_at\" = {updated_at}\n  {})",
                its_key(key)
            );
        }
        if let Some((until, key)) = leased {
            sql += &format!(
                ",\n\"leased\" AS (\n  UPDATE \"idempotency_keys\" SET \"lease_until\" = {until}\n  {})",
                its_key(key)
            );
        }
        if let Some(row) = told {
            // The outbox: the event only if the payment moved.
            // Queued for the delivery worker's fan-out in the same statement.
            sql += &format!(
                ",\n\"told\" AS (\n  INSERT INTO \"events\" ({})\n  SELECT {} FROM \"moved\"\n  RETURNING \"id\"),\n\"queued\" AS (\n  INSERT INTO \"events_to_fan_out\" (\"event_id\")\n  SELECT \"id\" FROM \"told\")",
                columns::<event::Entity>(),
                listed(row)
            );
        }
        sql += "\nSELECT count(*) AS \"moved\" FROM \"moved\"";
        sql
    }

    /// Claims what `query` selects, oldest due first: the rows are picked and locked
    /// (skipping those another process is claiming) and moved out of reach until `until`,
    /// each at exactly version + 1, in one statement. `= ANY(ARRAY(…))` rather than
    /// `IN (…)`: the pick runs once, first, and the update finds its rows by primary key,
    /// whatever plan the prepared statement settles on (`IN` let a generic plan hash-join
    /// the pick against a scan of the whole table: 34 ms instead of 1 ms at 60,000 rows).
    pub(super) async fn claim<E: super::Claimable>(
        db: &DatabaseConnection,
        query: sea_orm::Select<E>,
        until: DateTime<Utc>,
    ) -> Result<Vec<E::Model>, DbErr> {
        let picked = query
            .select_only()
            .column(E::ID)
            .lock_with_behavior(LockType::Update, LockBehavior::SkipLocked)
            .build(DbBackend::Postgres);
        let mut v = Params(picked.values.map(|values| values.0).unwrap_or_default());
        let until = v.add(until);
        // The entity's columns by name, never `*`: a migration adding a column would change
        // the result type of this prepared statement under processes already running, and
        // PostgreSQL refuses a cached plan whose result type changed (0A000) until the
        // connection is recycled: every claim of an older process failing through a
        // rolling upgrade.
        let sql = format!(
            r#"UPDATE "{}" SET "next_attempt_at" = {until}, "claimed_until" = {until}, "version" = "version" + 1 WHERE "id" = ANY(ARRAY({})) RETURNING {}"#,
            E::default().table_name(),
            picked.sql,
            columns::<E>()
        );
        E::find().from_raw_sql(v.statement(&sql)).all(db).await
    }
}

/// The payment columns a registration writes once and no later write changes: what the
/// column checks of the hand-written PostgreSQL writes leave out.
#[cfg(test)]
pub(crate) const PAYMENT_COLUMNS_FIXED_AT_REGISTRATION: [&str; 10] = [
    "id",
    "merchant_id",
    "idempotency_key",
    "credit_id",
    "amount",
    "currency",
    "description",
    "gateway_key",
    "created_at",
    "generation",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_last_error_is_kept_whole_up_to_its_limit_and_cut_between_characters_past_it() {
        assert_eq!(
            last_error_text("gateway answered 503"),
            "gateway answered 503"
        );
        let exact = "é".repeat(LAST_ERROR_CHARS);
        assert_eq!(last_error_text(&exact), exact);
        let long = format!("{}ñ€", "ü".repeat(LAST_ERROR_CHARS));
        let kept = last_error_text(&long);
        assert_eq!(kept.chars().count(), LAST_ERROR_CHARS);
        assert!(kept.ends_with("ü…"), "{kept}");
    }

    #[test]
    fn the_prebuilt_key_lookup_is_the_statement_sea_query_builds() {
        for backend in [DbBackend::Postgres, DbBackend::Sqlite] {
            for (merchant, key) in [(Uuid::now_v7(), "k-1"), (Uuid::now_v7(), "otra clave ñ")] {
                let expected = keys::Entity::find_by_id((merchant, key.to_owned()))
                    .limit(1)
                    .build(backend);
                assert_eq!(
                    find_key_statement(backend, merchant, key).to_string(),
                    expected.to_string(),
                    "{backend:?}"
                );
                assert_eq!(
                    find_key_statement(backend, merchant, key).values,
                    expected.values
                );
            }
        }
    }

    /// The column list of `INSERT INTO "<table>" (…)` in `sql`, or of the `SET` of
    /// `UPDATE "<table>"` (up to its `WHERE`).
    fn written_columns(sql: &str, table: &str) -> Vec<String> {
        let names = |list: &str| -> Vec<String> {
            list.split(", ")
                .map(|part| {
                    let column = part.split(" = ").next().unwrap_or(part).trim();
                    column.trim_matches('"').to_owned()
                })
                .collect()
        };
        if let Some((_, rest)) = sql.split_once(&format!("INSERT INTO \"{table}\" (")) {
            return names(rest.split_once(')').expect("a column list").0);
        }
        let (_, rest) = sql
            .split_once(&format!("UPDATE \"{table}\" SET "))
            .expect("an update of the table");
        names(rest.split_once("WHERE").expect("a WHERE").0.trim())
    }

    fn all_columns<E: EntityTrait>() -> Vec<String> {
        use sea_orm::Iterable;
        E::Column::iter()
            .map(|c| sea_orm::IdenStatic::as_str(&c).to_owned())
            .collect()
    }

    /// Fails when an entity gains a column that the PostgreSQL statements of a write do
    /// not write: on SQLite the same write saves the whole model, so the column would be
    /// written there and silently dropped on PostgreSQL. A new column must be written by
    /// the statement, or listed here as fixed once the row is registered.
    #[test]
    fn the_postgresql_statements_write_every_column_their_entities_have() {
        use sql::{Placeholder, write_plan_sql};
        let p = |n| Placeholder(n);
        let text = write_plan_sql(
            std::array::from_fn(|i| p(i + 1)),
            Some(std::array::from_fn(|i| p(i + 20))),
            Some((
                std::array::from_fn(|i| p(i + 30)),
                std::array::from_fn(|i| p(i + 40)),
            )),
            Some((p(49), std::array::from_fn(|i| p(i + 50)))),
            Some((p(60), p(60 + all_columns::<event::Entity>().len() - 1))),
        );

        // payments: what a write may change, and what is fixed at registration.
        let fixed_at_registration = PAYMENT_COLUMNS_FIXED_AT_REGISTRATION;
        let written = written_columns(&text, "payments");
        for column in all_columns::<payment::Entity>() {
            assert!(
                written.contains(&column) || fixed_at_registration.contains(&column.as_str()),
                "payments.{column} is not written by the PostgreSQL write of a plan \
                 (sql::write_plan): write it there, or say here why it never changes"
            );
        }
        for column in &written {
            assert!(
                !fixed_at_registration.contains(&column.as_str()),
                "payments.{column} is written, so it is not fixed"
            );
        }

        // The audit row is inserted whole.
        assert_eq!(
            written_columns(&text, "payment_transitions"),
            all_columns::<transitions::Entity>(),
            "payment_transitions: every column, in the entity's order"
        );
        // So is the event of the outbox.
        assert_eq!(
            written_columns(&text, "events"),
            all_columns::<event::Entity>(),
            "events: every column, in the entity's order"
        );

        // The key's frozen answer: what freezing changes, and what is fixed at registration.
        let fixed_key = [
            "merchant_id",
            "key",
            "fingerprint",
            "payment_id",
            "created_at",
        ];
        let frozen = written_columns(
            text.split_once("\"frozen\" AS")
                .expect("the frozen answer")
                .1,
            "idempotency_keys",
        );
        for column in all_columns::<keys::Entity>() {
            assert!(
                frozen.contains(&column) || fixed_key.contains(&column.as_str()),
                "idempotency_keys.{column} is not written when an answer is frozen \
                 (sql::write_plan): write it there, or say here why it never changes"
            );
        }
    }
}
