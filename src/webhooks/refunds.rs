//! Gateway events about refunds (reference `refund.updated`, Stripe `refund.*` /
//! `charge.refund.updated`; Mercado Pago sends none: its notifications name payments),
//! applied exactly once with the seed's four strategies: the event id deduped in
//! `processed_messages`, the refund found by its natural key (the reference is the
//! refund's id), a per-refund sequence (`refunds.last_event_sequence`: an event at or
//! below it is stale), and the absolute state it reports, moved through the refund
//! transition function.
//!
//! What the event reports is kept in `webhook_refunds` (one row per provider refund,
//! advanced only by a higher sequence, whatever the refund's state, and for a reference
//! naming no refund of ours too): a provider's search lags behind its events, and on-call's
//! resolution of a refund under review weighs what its webhooks reported
//! (`reported_for_refund`).
//!
//! `decide` is the pure table; `consume` applies it in one transaction with the dedupe
//! row and the report. It never calls a gateway.

use crate::db::begin_write;
use crate::entities::webhook_refund::{self as reports, ReportedRefundStatus};
use crate::entities::{payment, refund};
use crate::gateway::{Refund, RefundStatus};
use crate::saga::refund::state::{Event, RefundState};
use crate::saga::refund::store::{self, Changes, Written};
use crate::saga::refund::{Actor, settlement};
use crate::saga::store::SagaRow;
use crate::webhooks::consumer::{
    ConsumeError, Reported, locked_by_reference, record_message, record_newest,
};
use sea_orm::{
    ActiveValue::Set, ColumnTrait, ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbErr,
    EntityTrait, QueryFilter, QueryOrder, QuerySelect,
};
use uuid::Uuid;

/// What an event about a refund came to. Every one is answered 200.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RefundConsumed {
    Applied(RefundState),
    Unchanged,
    Duplicate,
    Stale,
    /// No refund of ours has this reference.
    Unknown,
}

impl RefundConsumed {
    /// The word in the 200 answer.
    pub fn as_str(self) -> &'static str {
        match self {
            RefundConsumed::Applied(RefundState::RevisionManual) => "revision_manual",
            RefundConsumed::Applied(_) => "aplicado",
            RefundConsumed::Unchanged => "sin_cambios",
            RefundConsumed::Duplicate => "duplicado",
            RefundConsumed::Stale => "obsoleto",
            RefundConsumed::Unknown => "desconocido",
        }
    }
}

/// A refund event, ready to apply.
#[derive(Clone, Copy, Debug)]
pub struct RefundEvent<'a> {
    pub source: &'a str,
    pub event_id: &'a str,
    pub sequence: i64,
    pub refund: &'a Refund,
}

/// What an event does to its refund.
#[derive(Clone, Debug)]
pub enum RefundEffect {
    Move {
        event: Event,
        changes: Changes,
        reason: String,
    },
    Keep(&'static str),
}

/// The table, by refund state (rows) and reported status (columns):
///
/// | refund          | succeeded       | failed          | pending |
/// | --------------- | --------------- | --------------- | ------- |
/// | EN_PROCESO      | REVISION_MANUAL (never sent, yet refunded) | keep | keep |
/// | ENVIADO         | COMPLETADO      | FALLIDO         | keep    |
/// | COMPLETADO      | keep            | REVISION_MANUAL (Stripe: failed after succeeded) | keep |
/// | FALLIDO         | REVISION_MANUAL | keep            | keep    |
/// | REVISION_MANUAL | keep: on-call   | keep            | keep    |
///
/// A refund for another amount or currency never settles it (`settlement`).
pub fn decide(r: &refund::Model, reported: &Refund, event_id: &str) -> RefundEffect {
    use RefundState::*;
    use RefundStatus::*;
    let said = format!(
        "gateway event {event_id} reports refund {} {}",
        reported.id,
        match reported.status {
            Succeeded => "succeeded",
            Failed => "failed",
            Pending => "pending",
        }
    );
    let escalate = |event: Event, reason: String| RefundEffect::Move {
        event,
        changes: Changes {
            gateway_ref: Some(reported.id.clone()),
            ..Changes::default()
        },
        reason,
    };
    match (r.state, reported.status) {
        (_, Pending) => RefundEffect::Keep("the refund is still pending"),
        (Enviado, _) => match settlement(r, reported) {
            Some((event, changes, why)) => RefundEffect::Move {
                event,
                changes,
                reason: format!("{said}: {why}"),
            },
            None => RefundEffect::Keep("the refund is still pending"),
        },
        (Completado, Succeeded) | (Fallido, Failed) => {
            RefundEffect::Keep("the refund already says so")
        }
        (Completado, Failed) | (Fallido, Succeeded) => escalate(
            Event::Contradicted,
            format!("{said}, contradicting {}", r.state),
        ),
        (EnProceso, Succeeded) => escalate(
            Event::Escalate,
            format!("{said} for a refund pagos has not sent"),
        ),
        (EnProceso, Failed) => RefundEffect::Keep("failed before pagos sent it: nothing moved"),
        (RevisionManual, _) => RefundEffect::Keep("under review: on-call decides"),
    }
}

const MAX_ATTEMPTS: usize = 5;

/// Applies the event exactly once; re-decided if the refund moved under it.
pub async fn consume(
    db: &DatabaseConnection,
    event: RefundEvent<'_>,
) -> Result<RefundConsumed, ConsumeError> {
    for _ in 0..MAX_ATTEMPTS {
        let tx = begin_write(db).await?;
        match consume_in(&tx, event).await {
            Ok(Some(outcome)) => {
                tx.commit().await?;
                tracing::info!(
                    event_id = event.event_id,
                    refund = event.refund.id,
                    reference = event.refund.reference,
                    outcome = outcome.as_str(),
                    "gateway refund event consumed"
                );
                return Ok(outcome);
            }
            Ok(None) => tx.rollback().await?,
            Err(err) => {
                let _ = tx.rollback().await;
                return Err(err);
            }
        }
    }
    Err(ConsumeError::Contended)
}

async fn consume_in(
    tx: &DatabaseTransaction,
    event: RefundEvent<'_>,
) -> Result<Option<RefundConsumed>, ConsumeError> {
    if !record_message(tx, event.source, event.event_id).await? {
        return Ok(Some(RefundConsumed::Duplicate));
    }
    // A compensation refund that fails moves its payment too, in the refund's write,
    // which locks the payment, then the refund. Its payment is locked first here, so that
    // every writer takes the two in that order: this event and a reconciliation pass's
    // write of the same refund cannot deadlock (each holding the row the other waits for).
    let compensation = match Uuid::parse_str(&event.refund.reference) {
        Ok(id) => refund::Entity::find_by_id(id)
            .one(tx)
            .await?
            .filter(|r| r.key_scope == refund::KeyScope::Orphan),
        Err(_) => None,
    };
    if let Some(r) = &compensation {
        payment::Entity::find_by_id(r.payment_id)
            .lock_exclusive()
            .one(tx)
            .await?;
    }
    let found = locked_by_reference::<refund::Entity>(tx, &event.refund.reference).await?;
    if let Some(current) = &found
        && !store::advance_event_sequence(tx, current.id, event.sequence).await?
    {
        return Ok(Some(RefundConsumed::Stale));
    }
    // What the provider reports, kept whatever the refund's state, before the decision:
    // the resolution of a refund under review weighs it (its search may lag behind this
    // event). Lock order: payment, refund, then this row.
    if !record_report(tx, event, found.as_ref()).await? {
        return Ok(Some(RefundConsumed::Stale));
    }
    let Some(current) = found else {
        tracing::warn!(
            event_id = event.event_id,
            refund = event.refund.id,
            reference = event.refund.reference,
            "refund event for no refund of ours (see runbooks/refunds.md)"
        );
        return Ok(Some(RefundConsumed::Unknown));
    };
    match decide(&current, event.refund, event.event_id) {
        RefundEffect::Keep(why) => {
            if current.state == RefundState::RevisionManual {
                tracing::warn!(event_id = event.event_id, refund_id = %current.id, provider_refund = event.refund.id, status = ?event.refund.status, amount = event.refund.amount, "refund event for a refund under review: kept for on-call's resolution");
            } else {
                tracing::debug!(event_id = event.event_id, refund_id = %current.id, why, "refund event changes nothing");
            }
            Ok(Some(RefundConsumed::Unchanged))
        }
        RefundEffect::Move {
            event: move_by,
            changes,
            reason,
        } => {
            let plan = current
                .plan(
                    move_by,
                    changes.into(),
                    Actor::Webhook,
                    &reason,
                    crate::saga::refund::RENDER,
                )
                .map_err(|e| ConsumeError::Db(sea_orm::DbErr::Custom(e.to_string())))?;
            Ok(match plan.write(tx, &current).await? {
                Written::Applied(moved) => Some(RefundConsumed::Applied(moved.state)),
                Written::Fenced => None,
            })
        }
    }
}

/// The refund's status as its report keeps it.
fn reported(status: RefundStatus) -> ReportedRefundStatus {
    match status {
        RefundStatus::Succeeded => ReportedRefundStatus::Succeeded,
        RefundStatus::Failed => ReportedRefundStatus::Failed,
        RefundStatus::Pending => ReportedRefundStatus::Pending,
    }
}

impl Reported for reports::ActiveModel {
    const LAST_SEQUENCE: reports::Column = reports::Column::LastSequence;
    const LAST_EVENT_ID: reports::Column = reports::Column::LastEventId;
    const FIRST_SEEN_AT: reports::Column = reports::Column::FirstSeenAt;
    const UPDATED_AT: reports::Column = reports::Column::UpdatedAt;
}

/// Records what the event says about its provider refund if it is the newest word on it
/// (`record_newest`); false when stale. `named`: the refund of ours its reference names.
async fn record_report(
    tx: &impl ConnectionTrait,
    event: RefundEvent<'_>,
    named: Option<&refund::Model>,
) -> Result<bool, DbErr> {
    let r = event.refund;
    let row = reports::ActiveModel {
        source: Set(event.source.to_owned()),
        provider_refund_id: Set(r.id.clone()),
        reference: Set(r.reference.clone()),
        refund_id: Set(named.map(|n| n.id)),
        payment_id: Set(named.map(|n| n.payment_id)),
        charge_id: Set(r.charge.clone()),
        status: Set(reported(r.status)),
        amount: Set(r.amount),
        currency: Set(r.currency.clone()),
        failure_code: Set(r.failure_code.clone()),
        ..Default::default()
    };
    record_newest(tx, row, event.sequence, event.event_id).await
}

/// What the provider's webhooks last reported about the provider refunds of refund
/// `refund`, the first seen first.
pub async fn reported_for_refund(
    db: &impl ConnectionTrait,
    refund: Uuid,
) -> Result<Vec<reports::Model>, DbErr> {
    oldest_first(db, reports::Column::RefundId.eq(refund)).await
}

/// What the provider's webhooks last reported about the refunds of payment `payment`, the
/// first seen first.
pub async fn reported_for_payment(
    db: &impl ConnectionTrait,
    payment: Uuid,
) -> Result<Vec<reports::Model>, DbErr> {
    oldest_first(db, reports::Column::PaymentId.eq(payment)).await
}

async fn oldest_first(
    db: &impl ConnectionTrait,
    which: sea_orm::sea_query::SimpleExpr,
) -> Result<Vec<reports::Model>, DbErr> {
    reports::Entity::find()
        .filter(which)
        .order_by_asc(reports::Column::FirstSeenAt)
        .order_by_asc(reports::Column::Source)
        .order_by_asc(reports::Column::ProviderRefundId)
        .all(db)
        .await
}

/// Deletes up to `batch` reports of refunds (`webhook_refunds`) no longer needed, the
/// oldest first; returns how many (the reaper calls it until it deletes fewer). A report
/// goes when its last event was applied before `older_than` and it names none of our
/// refunds (nothing reads those), or its refund is settled (`COMPLETADO`, `FALLIDO`), last
/// moved before `older_than`, and so is the refund's payment (`COMPLETADA`, `FALLIDA`):
/// while a refund is in flight or under review, its reports are what on-call's resolution
/// weighs (`reported_for_refund`).
pub async fn purge_refund_reports(
    db: &DatabaseConnection,
    older_than: chrono::DateTime<chrono::Utc>,
    batch: u64,
) -> Result<u64, DbErr> {
    use sea_orm::Condition;
    use sea_orm::sea_query::{Expr, Order, Query};
    let settled_payment = super::settled_payment((refund::Entity, refund::Column::PaymentId));
    let settled_refund = super::refunds_tied(
        refund::Column::Id,
        (reports::Entity, reports::Column::RefundId),
        true,
    )
    .and_where(refund::Column::UpdatedAt.lt(older_than))
    .and_where(Expr::exists(settled_payment))
    .to_owned();
    // The oldest first, through the index on `updated_at` (migration m20261211_000025).
    let expired = Query::select()
        .from(reports::Entity)
        .and_where(reports::Column::UpdatedAt.lt(older_than))
        .cond_where(
            Condition::any()
                .add(reports::Column::RefundId.is_null())
                .add(Expr::exists(settled_refund)),
        )
        .order_by(reports::Column::UpdatedAt, Order::Asc)
        .limit(batch)
        .to_owned();
    crate::db::delete_picked(db, "webhook_refunds", expired).await
}

/// A report as the gateway's refund it was read from (the reference it carried).
pub fn as_refund(report: &reports::Model) -> Refund {
    Refund {
        id: report.provider_refund_id.clone(),
        status: match report.status {
            ReportedRefundStatus::Succeeded => RefundStatus::Succeeded,
            ReportedRefundStatus::Failed => RefundStatus::Failed,
            ReportedRefundStatus::Pending => RefundStatus::Pending,
        },
        charge: report.charge_id.clone(),
        amount: report.amount,
        currency: report.currency.clone(),
        reference: report.reference.clone(),
        failure_code: report.failure_code.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use uuid::Uuid;

    fn refund_in(state: RefundState) -> refund::Model {
        let at = chrono::Utc::now();
        refund::Model {
            id: Uuid::nil(),
            payment_id: Uuid::nil(),
            merchant_id: Uuid::nil(),
            key_scope: refund::KeyScope::Merchant,
            idempotency_key: "k".into(),
            fingerprint: "f".into(),
            key_status: refund::KeyStatus::InProgress,
            response_code: None,
            response_body: None,
            lease_until: None,
            charge_ref: "ch_1".into(),
            amount: 100,
            currency: "COP".into(),
            reason: None,
            requested_by: None,
            state,
            version: 1,
            attempts: 1,
            gateway_key: "g".into(),
            gateway_ref: None,
            failure_code: None,
            next_attempt_at: at,
            claimed_until: None,
            created_at: at,
            updated_at: at,
            last_event_sequence: None,
            last_error: None,
            last_error_at: None,
        }
    }

    fn reported(status: RefundStatus, amount: i64) -> Refund {
        Refund {
            id: "re_1".into(),
            status,
            charge: "ch_1".into(),
            amount,
            currency: "COP".into(),
            reference: Uuid::nil().to_string(),
            failure_code: None,
        }
    }

    fn moved_by(effect: RefundEffect) -> Option<Event> {
        match effect {
            RefundEffect::Move { event, .. } => Some(event),
            RefundEffect::Keep(_) => None,
        }
    }

    #[test]
    fn the_refund_event_table_holds_row_by_row() {
        use RefundState::*;
        use RefundStatus::*;
        let table = [
            (Enviado, Succeeded, Some(Event::Refunded)),
            (Enviado, Failed, Some(Event::Failed)),
            (Enviado, Pending, None),
            (EnProceso, Succeeded, Some(Event::Escalate)),
            (EnProceso, Failed, None),
            (Completado, Succeeded, None),
            (Completado, Failed, Some(Event::Contradicted)),
            (Fallido, Succeeded, Some(Event::Contradicted)),
            (Fallido, Failed, None),
            (RevisionManual, Succeeded, None),
            (RevisionManual, Failed, None),
        ];
        for (state, status, expected) in table {
            let effect = decide(&refund_in(state), &reported(status, 100), "evt");
            assert_eq!(moved_by(effect), expected, "{state} + {status:?}");
        }
    }

    #[test]
    fn a_refund_for_another_amount_never_settles_it() {
        let effect = decide(
            &refund_in(RefundState::Enviado),
            &reported(RefundStatus::Succeeded, 99),
            "evt",
        );
        assert_eq!(moved_by(effect), Some(Event::Escalate));
    }
}
