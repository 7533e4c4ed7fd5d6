//! Applying one gateway event exactly once, whatever the gateway repeats or reorders.
//!
//! One transaction per event. The seed's four strategies, each where it fits:
//! 1. dedupe by id — the event id goes into `processed_messages` first; a conflict on
//!    its primary key means "already applied": nothing more is done;
//! 2. natural upsert — the charge's row in `webhook_charges` is inserted on its natural
//!    key (gateway, charge id) with `ON CONFLICT DO NOTHING`; that is also how an orphan
//!    charge is recorded;
//! 3. sequence — the row then advances only to a higher sequence (`UPDATE … WHERE
//!    last_sequence < n`); an event at or below it is stale and changes nothing;
//! 4. absolute operation — the payment is set to the state the event reports, through
//!    the transition function (`decide`), never moved "one step".
//!
//! The id row, the charge row, the payment, its audit row and its key's frozen answer
//! commit together or not at all: a crash or an error leaves nothing, and the gateway's
//! redelivery starts over. It never holds a transaction across anything but the database.

use crate::db::{begin_write, now};
use crate::entities::webhook_charge::{self as charges, ReportedStatus};
use crate::entities::{payment, processed_message as messages};
use crate::gateway::{Charge, ChargeStatus};
use crate::saga::refund::state::RefundState;
use crate::saga::refund::store as refund_store;
use crate::saga::refund::{AfterFailure, Compensation, OrphanCharges, compensate_in};
use crate::saga::state::{IllegalTransition, PaymentState};
use crate::saga::store::{Actor, StoreError, Written};
use crate::webhooks::decide::{Effect, decide, refunded_by_pagos};
use crate::webhooks::event::status_name;
use sea_orm::{
    ActiveModelTrait, ActiveValue::Set, ColumnTrait, Condition, ConnectionTrait,
    DatabaseConnection, DatabaseTransaction, DbErr, EntityTrait, IdenStatic, Iterable,
    PrimaryKeyToColumn, PrimaryKeyTrait, QueryFilter, QuerySelect, TryInsertResult,
};
use uuid::Uuid;

/// The charge's status as its row keeps it.
fn reported(status: ChargeStatus) -> ReportedStatus {
    match status {
        ChargeStatus::Succeeded => ReportedStatus::Succeeded,
        ChargeStatus::Declined => ReportedStatus::Declined,
        ChargeStatus::Pending => ReportedStatus::Pending,
    }
}

/// How often an event is re-decided when the payment moved under it before the error
/// goes back to the gateway (which delivers again later: the event is never lost).
const MAX_ATTEMPTS: usize = 5;

/// What consuming an event came to. Every one of them is answered 200.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Consumed {
    /// The payment moved to this state.
    Applied(PaymentState),
    /// Recorded; the payment already said so, or the event cannot change it.
    Unchanged,
    /// This event id was applied before: nothing done.
    Duplicate,
    /// A later event for this charge was applied before: nothing done.
    Stale,
    /// No payment has this reference: the charge is kept for on-call.
    Orphan,
    /// The charge succeeded for a payment answered `FALLIDA`: it is being refunded in
    /// full (`PAGOS_ORPHAN_CHARGES=refund`), and the payment stays `FALLIDA`.
    Compensated,
}

impl Consumed {
    /// The word in the 200 answer.
    pub fn as_str(self) -> &'static str {
        match self {
            Consumed::Applied(PaymentState::RevisionManual) => "revision_manual",
            Consumed::Applied(_) => "aplicado",
            Consumed::Unchanged => "sin_cambios",
            Consumed::Duplicate => "duplicado",
            Consumed::Stale => "obsoleto",
            Consumed::Orphan => "huerfano",
            Consumed::Compensated => "reembolsando",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConsumeError {
    #[error(transparent)]
    Db(#[from] DbErr),
    /// A decision the transition table refuses: a bug in `decide`.
    #[error(transparent)]
    Illegal(#[from] IllegalTransition),
    #[error("the payment kept moving while the event was applied ({MAX_ATTEMPTS} attempts)")]
    Contended,
}

impl From<StoreError> for ConsumeError {
    fn from(err: StoreError) -> Self {
        match err {
            StoreError::Db(e) => ConsumeError::Db(e),
            StoreError::Illegal(e) => ConsumeError::Illegal(e),
        }
    }
}

/// A `charge.updated` event, ready to apply.
#[derive(Clone, Copy, Debug)]
pub struct ChargeEvent<'a> {
    /// Which gateway (`http`): ids and charge ids are only unique per gateway.
    pub source: &'a str,
    pub event_id: &'a str,
    pub sequence: i64,
    pub charge: &'a Charge,
    /// The charge's money went back after it was paid, this much of it (minor units):
    /// Mercado Pago's `refunded` (`Payment::returned`). A COMPLETADA payment whose own
    /// refunds cover it stays COMPLETADA (`decide::refunded_by_pagos`). None for every
    /// other event.
    pub returned: Option<i64>,
}

/// Applies the event exactly once. If the payment moves between the read and the fenced
/// write (the request or the reconciler decided first), the whole transaction is rolled
/// back and the event re-decided on the new state.
pub async fn consume(
    db: &DatabaseConnection,
    event: ChargeEvent<'_>,
    orphans: OrphanCharges,
) -> Result<Consumed, ConsumeError> {
    for attempt in 1..=MAX_ATTEMPTS {
        let tx = begin_write(db).await?;
        match consume_in(&tx, event, orphans).await {
            Ok(Some(outcome)) => {
                tx.commit().await?;
                log(event, outcome);
                return Ok(outcome);
            }
            Ok(None) => {
                tx.rollback().await?;
                tracing::info!(
                    event_id = event.event_id,
                    attempt,
                    "payment moved under the event; deciding again"
                );
            }
            Err(err) => {
                // Dropping the transaction rolls it back; say so explicitly.
                let _ = tx.rollback().await;
                return Err(err);
            }
        }
    }
    Err(ConsumeError::Contended)
}

/// The row whose id a gateway object's reference is, locked (`FOR UPDATE` on PostgreSQL)
/// for the rest of `tx`; `None` when the reference is no id or names no row.
pub async fn locked_by_reference<E>(
    tx: &DatabaseTransaction,
    reference: &str,
) -> Result<Option<E::Model>, DbErr>
where
    E: EntityTrait,
    Uuid: Into<<E::PrimaryKey as PrimaryKeyTrait>::ValueType>,
{
    match Uuid::parse_str(reference) {
        Ok(id) => E::find_by_id(id).lock_exclusive().one(tx).await,
        Err(_) => Ok(None),
    }
}

/// One attempt. `None`: fenced, roll back and try again.
async fn consume_in(
    tx: &DatabaseTransaction,
    event: ChargeEvent<'_>,
    orphans: OrphanCharges,
) -> Result<Option<Consumed>, ConsumeError> {
    // 1. Dedupe by id. On PostgreSQL a simultaneous twin waits here on our uncommitted
    //    key, then finds the conflict; on SQLite BEGIN IMMEDIATE already serialized them.
    if !record_message(tx, event.source, event.event_id).await? {
        return Ok(Some(Consumed::Duplicate));
    }

    // The payment the reference names, locked (FOR UPDATE on PostgreSQL) so that the
    // decision below is taken on the state it will be written over. Lock order is
    // always payment, then charge row: two events of one payment cannot deadlock.
    let payment = locked_by_reference::<payment::Entity>(tx, &event.charge.reference).await?;

    // What the charge was reported before this event (read under the payment's lock).
    let before = charges::Entity::find_by_id((event.source.to_owned(), event.charge.id.clone()))
        .one(tx)
        .await?
        .map(|row| row.status);

    // 2 and 3. Natural upsert of the charge row, advanced only by a higher sequence.
    if !advance_charge(tx, event, payment.as_ref().map(|p| p.id)).await? {
        return Ok(Some(Consumed::Stale));
    }
    let Some(payment) = payment else {
        return Ok(Some(Consumed::Orphan));
    };

    // A charge reported succeeded again for a payment FALLIDA since: nothing new. Every
    // succeeded report settles its payment, escalates it or finds it under review, so a
    // payment FALLIDA after one was made so knowing of the charge: pagos compensated it,
    // or on-call resolved FALLIDA refunding it or overruling the provider (a charge kept
    // by agreement, money returned outside pagos). A later update of the charge at the
    // provider must neither refund it again nor reopen the payment. Every charge on-call's
    // resolution weighed is recorded so by the resolution, and no event moves that report
    // (`record_known_charges`: such an event is stale, above); the reaper keeps succeeded
    // reports of a FALLIDA payment while the payment is kept (`purge_charge_reports`).
    if payment.state == PaymentState::Fallida
        && event.charge.status == ChargeStatus::Succeeded
        && before == Some(ReportedStatus::Succeeded)
    {
        tracing::info!(event_id = event.event_id, payment_id = %payment.id, charge = event.charge.id, "charge reported succeeded again for a payment FALLIDA since it was known: nothing new");
        return Ok(Some(Consumed::Unchanged));
    }

    // A charge that succeeded for a payment answered FALLIDA: money was taken and the
    // merchant was told none was. With PAGOS_ORPHAN_CHARGES=refund it is refunded in full,
    // in this transaction (the payment's row is locked above), and the answer stays true;
    // otherwise `decide` sends the payment to REVISION_MANUAL.
    if orphans == OrphanCharges::Refund
        && payment.state == PaymentState::Fallida
        && event.charge.status == ChargeStatus::Succeeded
    {
        let why = format!(
            "gateway event {} reports charge {} succeeded",
            event.event_id, event.charge.id
        );
        let compensation = compensate_in(
            tx,
            &payment,
            event.charge,
            Actor::Webhook,
            &why,
            AfterFailure::Stop,
            false,
        )
        .await?;
        match compensation {
            Compensation::Started(_) => return Ok(Some(Consumed::Compensated)),
            // pagos' refunds of the charge give it all back already, or its compensation
            // is under way (or under review, where on-call owns it).
            Compensation::Covered => return Ok(Some(Consumed::Unchanged)),
            Compensation::Taken(ref r) if r.state != RefundState::Fallido => {
                return Ok(Some(Consumed::Unchanged));
            }
            // Its compensation failed, a refund of it is not settled yet, it cannot be
            // refunded as it stands, or it is in another currency: the money is taken and nothing of pagos' will give it
            // back, so on-call decides, through the table below (REVISION_MANUAL).
            Compensation::Taken(_)
            | Compensation::Unsettled(_)
            | Compensation::Refused(_)
            | Compensation::OtherCurrency { .. } => {
                tracing::warn!(payment_id = %payment.id, charge = event.charge.id, why = compensation.why_not(), "orphan charge pagos cannot refund now; on-call decides");
            }
        }
    }

    // Money that went back after the payment was paid (Mercado Pago's `refunded`), all
    // of it by pagos' own refunds of the charge that reached the provider (COMPLETADO or
    // ENVIADO; an EN_PROCESO one was never sent): the payment stays COMPLETADA (contract
    // section 6), and its audit trail says why. Beyond what pagos sent, `decide`
    // escalates it.
    if let Some(returned) = event.returned
        && payment.state == PaymentState::Completada
    {
        let covered = refund_store::covering(tx, payment.id, &event.charge.id).await?;
        if refunded_by_pagos(&payment, event.charge, returned, covered) {
            let reason = format!(
                "webhook {}: charge {} refunded ({returned} {cur}), all of it by pagos' own refunds of it ({covered} {cur} completed or sent): the payment stays COMPLETADA",
                event.event_id,
                event.charge.id,
                cur = payment.currency
            );
            kept_with_reason(tx, &payment, &reason).await?;
            tracing::info!(event_id = event.event_id, payment_id = %payment.id, returned, covered, "the charge went back by pagos' own refunds; the payment stays COMPLETADA");
            return Ok(Some(Consumed::Unchanged));
        }
    }

    // 4. The absolute state.
    match decide(&payment, event.charge, event.event_id) {
        Effect::Keep(why) => {
            tracing::debug!(event_id = event.event_id, payment_id = %payment.id, why, "event changes nothing");
            Ok(Some(Consumed::Unchanged))
        }
        Effect::Move {
            event: move_by,
            changes,
            reason,
        } => match crate::saga::apply(tx, &payment, move_by, changes, Actor::Webhook, &reason)
            .await?
        {
            Written::Applied(moved) => {
                let to = moved.state;
                if to == PaymentState::RevisionManual {
                    tracing::warn!(payment_id = %payment.id, reason, "webhook sent the payment to manual review");
                }
                Ok(Some(Consumed::Applied(to)))
            }
            Written::Fenced => Ok(None),
        },
    }
}

/// An audit row saying why an event left the payment in its state.
async fn kept_with_reason(
    tx: &DatabaseTransaction,
    p: &payment::Model,
    reason: &str,
) -> Result<(), DbErr> {
    use crate::entities::payment_transition as transitions;
    transitions::Entity::insert(transitions::ActiveModel::from(transitions::Model {
        id: Uuid::now_v7(),
        payment_id: p.id,
        from_state: Some(p.state),
        to_state: p.state,
        actor: Actor::Webhook,
        reason: reason.to_owned(),
        created_at: now(),
    }))
    .exec_without_returning(tx)
    .await?;
    Ok(())
}

/// Whether the event id was applied already: a cheap read to skip work (such as asking
/// the provider) for an obvious duplicate. `consume` still decides inside its
/// transaction; this answer may be stale by the time it is used.
pub async fn already_processed(
    db: &impl ConnectionTrait,
    source: &str,
    id: &str,
) -> Result<bool, DbErr> {
    Ok(
        messages::Entity::find_by_id((source.to_owned(), id.to_owned()))
            .one(db)
            .await?
            .is_some(),
    )
}

/// Records `id` as seen for `source`, on its own; false when it was there already. Only
/// for keys that save work (asking the provider again), never an event's effect, which
/// `consume` records in the effect's transaction.
pub async fn remember_processed(
    db: &impl ConnectionTrait,
    source: &str,
    id: &str,
) -> Result<bool, DbErr> {
    record_message(db, source, id).await
}

/// Inserts the event id; false when it was there already.
pub(crate) async fn record_message(
    tx: &impl ConnectionTrait,
    source: &str,
    id: &str,
) -> Result<bool, DbErr> {
    let inserted = messages::Entity::insert(messages::ActiveModel {
        source: Set(source.to_owned()),
        message_id: Set(id.to_owned()),
        received_at: Set(now()),
    })
    .on_conflict_do_nothing()
    .exec_without_returning(tx)
    .await?;
    Ok(matches!(inserted, TryInsertResult::Inserted(n) if n > 0))
}

/// Records every succeeded charge (`known`) of payment `payment_id` that on-call's
/// resolution `FALLIDA` weighed (the provider's search and its webhooks' reports) as a
/// `source` report of a succeeded charge, in the resolution's transaction, whatever was
/// kept of it before. The payment was made `FALLIDA` knowing of them — refunded
/// (`reembolsar`), or kept by agreement or returned outside pagos (overruling the
/// provider) — so no later report of one changes anything (`consume`): it must neither
/// refund it again nor reopen the payment. The report is final (`RESOLVED_SEQUENCE`): an
/// event of the charge delivered late, or one the provider sends as the charge goes from
/// pending to succeeded, is older than what pagos knows, and stale. A report kept already
/// (pending, declined, or succeeded) is written over: kept as it was, a pending one was
/// moved by the charge's next succeeded event, taken for a new orphan charge.
///
/// `settled_outside`: the resolution overruled the provider (a charge kept by agreement,
/// money returned another way) rather than refunding through pagos; the report says so
/// (`OVERRULED_AT_RESOLUTION`), and a later `reembolsar` is refused for it
/// (`settled_outside_pagos`): pagos does not know how much of it went back.
pub(crate) async fn record_known_charges(
    tx: &impl ConnectionTrait,
    source: &str,
    payment_id: Uuid,
    known: &[Charge],
    settled_outside: bool,
) -> Result<(), DbErr> {
    use charges::Column;
    use sea_orm::sea_query::OnConflict;
    let at = now();
    for charge in known {
        charges::Entity::insert(charges::ActiveModel {
            source: Set(source.to_owned()),
            charge_id: Set(charge.id.clone()),
            reference: Set(charge.reference.clone()),
            payment_id: Set(Some(payment_id)),
            status: Set(ReportedStatus::Succeeded),
            amount: Set(charge.amount),
            currency: Set(charge.currency.clone()),
            decline_code: Set(None),
            last_sequence: Set(RESOLVED_SEQUENCE),
            last_event_id: Set(if settled_outside {
                OVERRULED_AT_RESOLUTION
            } else {
                KNOWN_AT_RESOLUTION
            }
            .to_owned()),
            first_seen_at: Set(at),
            updated_at: Set(at),
        })
        .on_conflict(
            OnConflict::columns([Column::Source, Column::ChargeId])
                .update_columns([
                    Column::PaymentId,
                    Column::Status,
                    Column::DeclineCode,
                    Column::LastSequence,
                    Column::LastEventId,
                    Column::UpdatedAt,
                ])
                .to_owned(),
        )
        .exec_without_returning(tx)
        .await?;
    }
    Ok(())
}

/// The `last_event_id` of a report `record_known_charges` wrote: no event's, on-call's
/// resolution's.
pub const KNOWN_AT_RESOLUTION: &str = "resolution";

/// The `last_event_id` of a report `record_known_charges` wrote for a resolution that
/// overruled the provider: the charge was settled outside pagos.
pub const OVERRULED_AT_RESOLUTION: &str = "resolution-overruled";

/// The first of `charges` (`source`'s) an earlier resolution settled outside pagos,
/// overruling the provider (`record_known_charges`).
pub(crate) async fn settled_outside_pagos(
    tx: &impl ConnectionTrait,
    source: &str,
    charges: &[Charge],
) -> Result<Option<String>, DbErr> {
    if charges.is_empty() {
        return Ok(None);
    }
    Ok(charges::Entity::find()
        .filter(charges::Column::Source.eq(source))
        .filter(charges::Column::ChargeId.is_in(charges.iter().map(|c| c.id.clone())))
        .filter(charges::Column::LastEventId.eq(OVERRULED_AT_RESOLUTION))
        .one(tx)
        .await?
        .map(|row| row.charge_id))
}

/// The `last_sequence` of a report `record_known_charges` wrote: above every event's, so
/// no event of the charge moves it.
pub const RESOLVED_SEQUENCE: i64 = i64::MAX;

/// Records what the event says about its charge if it is the newest word on it; false
/// when an event of the same or a higher sequence was applied before (stale).
async fn advance_charge(
    tx: &impl ConnectionTrait,
    event: ChargeEvent<'_>,
    payment_id: Option<Uuid>,
) -> Result<bool, DbErr> {
    let charge = event.charge;
    let row = charges::ActiveModel {
        source: Set(event.source.to_owned()),
        charge_id: Set(charge.id.clone()),
        reference: Set(charge.reference.clone()),
        payment_id: Set(payment_id),
        status: Set(reported(charge.status)),
        amount: Set(charge.amount),
        currency: Set(charge.currency.clone()),
        decline_code: Set(charge.decline_code.clone()),
        ..Default::default()
    };
    record_newest(tx, row, event.sequence, event.event_id).await
}

/// The column type of an active model's entity.
type ColumnOf<A> = <<A as ActiveModelTrait>::Entity as EntityTrait>::Column;

/// A row of what a gateway's events reported about one of its objects (`webhook_charges`,
/// `webhook_refunds`): which columns say the newest event applied, and when.
pub(crate) trait Reported: ActiveModelTrait + Send {
    const LAST_SEQUENCE: ColumnOf<Self>;
    const LAST_EVENT_ID: ColumnOf<Self>;
    const FIRST_SEEN_AT: ColumnOf<Self>;
    const UPDATED_AT: ColumnOf<Self>;
}

impl Reported for charges::ActiveModel {
    const LAST_SEQUENCE: charges::Column = charges::Column::LastSequence;
    const LAST_EVENT_ID: charges::Column = charges::Column::LastEventId;
    const FIRST_SEEN_AT: charges::Column = charges::Column::FirstSeenAt;
    const UPDATED_AT: charges::Column = charges::Column::UpdatedAt;
}

/// The natural upsert and the sequence (module docs, 2 and 3) of what event `event_id`
/// (of `sequence`) reported, `row`: inserted on its primary key with `ON CONFLICT DO
/// NOTHING`; a row already there is written over (all but when it was first seen) only
/// from a lower sequence. False when an event of the same or a higher sequence was
/// applied before (stale).
pub(crate) async fn record_newest<A: Reported>(
    tx: &impl ConnectionTrait,
    mut row: A,
    sequence: i64,
    event_id: &str,
) -> Result<bool, DbErr> {
    let at = now();
    row.try_set(A::LAST_SEQUENCE, sequence.into())?;
    row.try_set(A::LAST_EVENT_ID, event_id.into())?;
    row.try_set(A::FIRST_SEEN_AT, at.into())?;
    row.try_set(A::UPDATED_AT, at.into())?;
    let inserted = <A::Entity as EntityTrait>::insert(row.clone())
        .on_conflict_do_nothing()
        .exec_without_returning(tx)
        .await?;
    if matches!(inserted, TryInsertResult::Inserted(n) if n > 0) {
        return Ok(true);
    }
    // The row exists: move it forward only from a lower sequence. On PostgreSQL a
    // concurrent event for the same object holds the row; this waits, then re-checks the
    // condition against what it committed.
    let mut same = Condition::all();
    for key in <A::Entity as EntityTrait>::PrimaryKey::iter() {
        let column = key.into_column();
        let value = row.get(column).into_value().ok_or_else(|| {
            DbErr::Custom(format!("a reported row without its {}", column.as_str()))
        })?;
        same = same.add(column.eq(value));
    }
    row.not_set(A::FIRST_SEEN_AT);
    let advanced = <A::Entity as EntityTrait>::update_many()
        .set(row)
        .filter(same)
        .filter(A::LAST_SEQUENCE.lt(sequence))
        .exec(tx)
        .await?;
    Ok(advanced.rows_affected == 1)
}

fn log(event: ChargeEvent<'_>, outcome: Consumed) {
    let charge = event.charge;
    match outcome {
        Consumed::Orphan => tracing::warn!(
            event_id = event.event_id,
            charge_id = charge.id,
            reference = charge.reference,
            status = status_name(charge.status),
            "orphan charge: no payment has this reference (see runbooks/webhooks.md)"
        ),
        _ => tracing::info!(
            event_id = event.event_id,
            charge_id = charge.id,
            reference = charge.reference,
            sequence = event.sequence,
            status = status_name(charge.status),
            outcome = outcome.as_str(),
            "gateway event consumed"
        ),
    }
}

/// On-call's list of orphan charges: charges no payment of ours matches, newest first
/// (the ones on-call has not seen yet; those it handled stay listed, and oldest first put
/// a new one behind them once they filled a page).
pub async fn orphan_charges(
    db: &impl ConnectionTrait,
    limit: u64,
) -> Result<Vec<charges::Model>, DbErr> {
    use sea_orm::QueryOrder;
    charges::Entity::find()
        .filter(charges::Column::PaymentId.is_null())
        .order_by_desc(charges::Column::FirstSeenAt)
        .order_by_desc(charges::Column::Source)
        .order_by_desc(charges::Column::ChargeId)
        .limit(limit)
        .all(db)
        .await
}

/// Of `orphans`, those whose reference names a payment now: registered after the charge
/// was reported (the database restored from before it, and the client's retry registered
/// it again with the same key and reference). A payment of ours stands for the charge.
pub async fn registered_since(
    db: &impl ConnectionTrait,
    orphans: &[charges::Model],
) -> Result<std::collections::HashSet<Uuid>, DbErr> {
    let named: Vec<Uuid> = orphans
        .iter()
        .filter_map(|c| Uuid::parse_str(&c.reference).ok())
        .collect();
    if named.is_empty() {
        return Ok(Default::default());
    }
    let found = payment::Entity::find()
        .select_only()
        .column(payment::Column::Id)
        .filter(payment::Column::Id.is_in(named))
        .into_tuple::<Uuid>()
        .all(db)
        .await?;
    Ok(found.into_iter().collect())
}

/// Deletes up to `batch` ids of events received before `older_than`, the oldest first;
/// returns how many (the reaper calls it until it deletes fewer). An event redelivered
/// after its id is gone is still caught by its charge's sequence while the charge's report
/// is kept (`purge_charge_reports`: at least as long as the id).
pub async fn purge_processed_messages(
    db: &DatabaseConnection,
    older_than: chrono::DateTime<chrono::Utc>,
    batch: u64,
) -> Result<u64, DbErr> {
    let expired = sea_orm::sea_query::Query::select()
        .from(messages::Entity)
        .and_where(messages::Column::ReceivedAt.lt(older_than))
        .order_by(messages::Column::ReceivedAt, sea_orm::Order::Asc)
        .limit(batch)
        .to_owned();
    crate::db::delete_picked(db, "processed_messages", expired).await
}

/// The `last_event_id` of a report migration m29 gave back from a resolution's mark.
const UNMARKED_BY_M29: &str = "resolution-unmarked";

/// Deletes up to `batch` reports of charges (`webhook_charges`) no longer needed, the
/// oldest first; returns how many (the reaper calls it until it deletes fewer). A report
/// goes when its last event was applied before `older_than` and:
///
/// - its payment is settled (`COMPLETADA`, `FALLIDA`), last moved before `older_than`,
///   none of its refunds is unsettled, and it is not a succeeded charge of a `FALLIDA`
///   payment (kept while the payment is: what makes a later report of that charge
///   change nothing, `consume`): while a payment is in flight or under review
///   its reports are what on-call's resolution weighs (`admin::with_reported_charges`, a
///   plain `FALLIDA` refused while one says a charge succeeded), and a refund that is not
///   settled may still fail and send its payment there;
/// - or it names none of our payments and the charge was `declined`: no money moved. An
///   orphan charge that succeeded (or is pending) stays on on-call's list
///   (`orphan_charges`) whatever its age: it may be money taken with no payment of ours.
///
/// A report is also what stops a late event about its charge (a lower sequence); the
/// reaper keeps it at least as long as event ids (`PAGOS_MESSAGE_RETENTION`). One that
/// migration m29 gave back (`UNMARKED_BY_M29`) stays until its charge's next event: it is
/// on on-call's list to check by hand (runbooks/refunds.md), and its dates are an old
/// resolution's, long past the retention.
pub async fn purge_charge_reports(
    db: &DatabaseConnection,
    older_than: chrono::DateTime<chrono::Utc>,
    batch: u64,
) -> Result<u64, DbErr> {
    use crate::entities::refund;
    use sea_orm::ExprTrait;
    use sea_orm::sea_query::{Expr, Order, Query};
    let settled_payment = super::payment_in(
        (charges::Entity, charges::Column::PaymentId),
        super::SETTLED,
    )
    .and_where(payment::Column::UpdatedAt.lt(older_than))
    .to_owned();
    let unsettled_refund = super::refunds_tied(
        refund::Column::PaymentId,
        (charges::Entity, charges::Column::PaymentId),
        false,
    );
    // A succeeded charge of a FALLIDA payment is money pagos gave back or on-call kept
    // knowingly: its report is what tells a later report of it apart from a new orphan
    // charge (`consume`), so it is kept as long as its payment is.
    let known_charge = Condition::all()
        .add(charges::Column::Status.eq(ReportedStatus::Succeeded))
        .add(Expr::exists(super::payment_in(
            (charges::Entity, charges::Column::PaymentId),
            &[PaymentState::Fallida.as_str()],
        )));
    let not_needed = Condition::any()
        .add(
            Condition::all()
                .add(Expr::exists(settled_payment))
                .add(Expr::exists(unsettled_refund).not())
                .add(known_charge.not())
                .add(charges::Column::LastEventId.ne(UNMARKED_BY_M29)),
        )
        .add(
            Condition::all()
                .add(charges::Column::PaymentId.is_null())
                .add(charges::Column::Status.eq(ReportedStatus::Declined)),
        );
    // The oldest first, through the index on `updated_at` (migration m20261211_000025):
    // the rows a statement deleted are skipped by the next one's index scan.
    let expired = Query::select()
        .from(charges::Entity)
        .and_where(charges::Column::UpdatedAt.lt(older_than))
        .cond_where(not_needed)
        .order_by(charges::Column::UpdatedAt, Order::Asc)
        .limit(batch)
        .to_owned();
    crate::db::delete_picked(db, "webhook_charges", expired).await
}
