//! Gateway events about refunds (reference `refund.updated`, Stripe `refund.*` /
//! `charge.refund.updated`; Mercado Pago sends none: its notifications name payments),
//! applied exactly once with the seed's four strategies: the event id deduped in
//! `processed_messages`, the refund found by its natural key (the reference is the
//! refund's id), a sequence per provider refund (the contract gives one per refund at the
//! provider, kept in its report below: an event at or below it is stale), and the absolute
//! state it reports, moved through the refund transition function.
//!
//! What the event reports is kept in `webhook_refunds` (one row per provider refund,
//! advanced only by a higher sequence, whatever the refund's state, and for a reference
//! naming no refund of ours too): a provider's search lags behind its events, and on-call's
//! resolution of a refund under review weighs what its webhooks reported
//! (`reported_for_refund`). A second provider refund carrying the refund's reference has a
//! sequence of its own: one of its events is never stale for the other's.
//!
//! A report of a provider refund that is not the refund's own (another charge's, or
//! another id than the refund's `gatewayRef`: `saga::refund::not_its_own`) never settles
//! it: a second refund at the provider is on-call's.
//!
//! `decide` is the pure table; `consume` applies it in one transaction with the dedupe
//! row and the report. It never calls a gateway.

use crate::db::begin_write;
use crate::entities::webhook_refund::{self as reports, ReportedRefundStatus};
use crate::entities::{payment, refund};
use crate::gateway::{Refund, RefundStatus};
use crate::saga::refund::state::{Event, RefundState};
use crate::saga::refund::store::{Changes, Written};
use crate::saga::refund::{Actor, not_its_own, other_amount, settlement, status_word};
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

/// The table, by refund state (rows) and reported status (columns), for a report of the
/// refund's own provider refund (its `gatewayRef`, or any while it has none, of its
/// charge):
///
/// | refund          | succeeded       | failed          | pending |
/// | --------------- | --------------- | --------------- | ------- |
/// | EN_PROCESO      | REVISION_MANUAL (never sent, yet refunded) | keep | keep |
/// | ENVIADO         | COMPLETADO      | FALLIDO         | keep    |
/// | COMPLETADO      | keep            | REVISION_MANUAL (Stripe: failed after succeeded) | keep |
/// | FALLIDO         | REVISION_MANUAL | keep            | keep    |
/// | REVISION_MANUAL | keep: on-call   | keep            | keep    |
///
/// Its own refund reported for another amount or currency never settles it
/// (`settlement`), and reported succeeded so once the refund is `COMPLETADO` sends it to
/// review: the gateway contradicts what was recorded.
///
/// A report of another provider refund (`not_its_own`: another charge's, or another id
/// than its `gatewayRef`) never settles it, succeeded or failed: a second refund at the
/// provider. The refund keeps its own `gatewayRef`:
///
/// | refund          | succeeded       | failed          | pending |
/// | --------------- | --------------- | --------------- | ------- |
/// | EN_PROCESO      | REVISION_MANUAL | keep            | keep    |
/// | ENVIADO         | REVISION_MANUAL | REVISION_MANUAL | keep    |
/// | COMPLETADO      | REVISION_MANUAL | keep (no money moved) | keep |
/// | FALLIDO         | REVISION_MANUAL | keep            | keep    |
/// | REVISION_MANUAL | keep: on-call   | keep            | keep    |
pub fn decide(r: &refund::Model, reported: &Refund, event_id: &str) -> RefundEffect {
    use RefundState::*;
    use RefundStatus::*;
    let said = format!(
        "gateway event {event_id} reports refund {} {}",
        reported.id,
        status_word(reported.status)
    );
    let escalate = |event: Event, reason: String| RefundEffect::Move {
        event,
        changes: Changes {
            gateway_ref: Some(reported.id.clone()),
            ..Changes::default()
        },
        reason,
    };
    if let Some(why) = not_its_own(r, reported) {
        let review = |event: Event, reason: String| RefundEffect::Move {
            event,
            changes: Changes::default(),
            reason: format!("gateway event {event_id}: {why}{reason}"),
        };
        return match (r.state, reported.status) {
            (_, Pending) => RefundEffect::Keep("another provider refund, still pending"),
            (RevisionManual, _) => RefundEffect::Keep("under review: on-call decides"),
            (EnProceso, Failed) => {
                RefundEffect::Keep("another provider refund failed before pagos sent this one")
            }
            (EnProceso, Succeeded) => {
                review(Event::Escalate, " (for a refund pagos has not sent)".into())
            }
            (Enviado, _) => review(Event::Escalate, String::new()),
            (Completado | Fallido, Succeeded) => {
                review(Event::Contradicted, format!("; was {}", r.state))
            }
            (Completado | Fallido, Failed) => {
                RefundEffect::Keep("another provider refund failed: no money moved")
            }
        };
    }
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
        (Completado, Succeeded) => match other_amount(r, reported) {
            Some(why) => escalate(
                Event::Contradicted,
                format!("{said}: {why}; was {}", r.state),
            ),
            None => RefundEffect::Keep("the refund already says so"),
        },
        (Fallido, Failed) => RefundEffect::Keep("the refund already says so"),
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
    // The refund's payment is locked before anything is written here, the refund after
    // it, as every writer takes the two: this event and a reconciliation pass's write of
    // the same refund cannot deadlock (each holding the row the other waits for). A
    // compensation refund that fails moves its payment too (`FOR UPDATE`); any other
    // refund may complete, which takes the payment's share lock first
    // (`refund::store::refunded_amount_locked` says why: taken after this transaction's
    // first write, its id would come before a payment event that does not sum it).
    if let Ok(id) = Uuid::parse_str(&event.refund.reference)
        && let Some(r) = refund::Entity::find_by_id(id).one(tx).await?
    {
        let payment = payment::Entity::find_by_id(r.payment_id);
        if r.key_scope == refund::KeyScope::Orphan {
            payment.lock_exclusive().one(tx).await?;
        } else {
            payment.lock_shared().one(tx).await?;
        }
    }
    if !record_message(tx, event.source, event.event_id).await? {
        return Ok(Some(RefundConsumed::Duplicate));
    }
    crate::failpoint::pause("refund_event_recorded").await;
    let found = locked_by_reference::<refund::Entity>(tx, &event.refund.reference).await?;
    // What the provider reports, kept whatever the refund's state, before the decision:
    // the resolution of a refund under review weighs it (its search may lag behind this
    // event). Lock order: payment, refund, then this row. Its sequence is the provider
    // refund's (the contract's ordering key): an event at or below the last one of the
    // same provider refund is stale, whatever another provider refund carrying the same
    // reference reported.
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
    if let Some(why) = not_its_own(&current, event.refund) {
        tracing::warn!(event_id = event.event_id, refund_id = %current.id, estado = %current.state, provider_refund = event.refund.id, gateway_ref = current.gateway_ref.as_deref().unwrap_or("-"), status = ?event.refund.status, why, "refund event for a provider refund that is not the refund's own (see runbooks/refunds.md)");
    }
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
    let settled_payment =
        super::payment_in((refund::Entity, refund::Column::PaymentId), super::SETTLED);
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

    /// The provider's answer to a send: a pending refund under another id than the one it
    /// named for the refund before is a second refund at the provider (before: it took the
    /// refund's `gatewayRef`, and the first one's success later looked like the second).
    #[test]
    fn a_pending_answer_of_another_provider_refund_goes_to_review() {
        use crate::gateway::retry::RefundOutcome;
        use crate::saga::{Saga, Settle};
        let mut sent = refund_in(RefundState::Enviado);
        sent.gateway_ref = Some("re_0".into());
        let pending = reported(RefundStatus::Pending, 100);
        let moved = |settle: Settle<Event>| match settle {
            Settle::Move(event, _, why) => Some((event, why)),
            Settle::Pending(_) | Settle::Unknown(_) => None,
        };
        let (event, why) =
            moved(sent.settle(RefundOutcome::Pending(pending.clone()))).expect("not left pending");
        assert_eq!(event, Event::Escalate);
        assert!(why.contains("re_0") && why.contains("re_1"), "{why}");
        // Its own id, or a refund whose answer was lost: still pending.
        sent.gateway_ref = Some("re_1".into());
        assert!(moved(sent.settle(RefundOutcome::Pending(pending.clone()))).is_none());
        sent.gateway_ref = None;
        assert!(moved(sent.settle(RefundOutcome::Pending(pending))).is_none());
    }

    #[test]
    fn a_refund_for_another_amount_never_settles_it() {
        let effect = decide(
            &refund_in(RefundState::Enviado),
            &reported(RefundStatus::Succeeded, 99),
            "evt",
        );
        assert_eq!(moved_by(effect), Some(Event::Escalate));
        let completed = decide(
            &refund_in(RefundState::Completado),
            &reported(RefundStatus::Succeeded, 99),
            "evt",
        );
        assert_eq!(moved_by(completed), Some(Event::Contradicted));
    }

    /// What a move records as the refund's `gatewayRef` (None: it keeps its own).
    fn recorded(effect: &RefundEffect) -> Option<Option<String>> {
        match effect {
            RefundEffect::Move { changes, .. } => Some(changes.gateway_ref.clone()),
            RefundEffect::Keep(_) => None,
        }
    }

    #[test]
    fn another_provider_refund_never_settles_the_refund_and_leaves_its_gateway_ref() {
        use RefundState::*;
        use RefundStatus::*;
        // Another id than the refund's own, or another charge than the refund's.
        let other_id = |status| Refund {
            id: "re_2".into(),
            ..reported(status, 100)
        };
        let other_charge = |status| Refund {
            charge: "ch_someone_else".into(),
            ..reported(status, 100)
        };
        let table = [
            (EnProceso, Succeeded, Some(Event::Escalate)),
            (EnProceso, Failed, None),
            (Enviado, Succeeded, Some(Event::Escalate)),
            (Enviado, Failed, Some(Event::Escalate)),
            (Enviado, Pending, None),
            (Completado, Succeeded, Some(Event::Contradicted)),
            (Completado, Failed, None),
            (Fallido, Succeeded, Some(Event::Contradicted)),
            (Fallido, Failed, None),
            (RevisionManual, Succeeded, None),
        ];
        for (state, status, expected) in table {
            let mut own = refund_in(state);
            own.gateway_ref = Some("re_1".into());
            for (what, report) in [("id", other_id(status)), ("charge", other_charge(status))] {
                let effect = decide(&own, &report, "evt");
                if let RefundEffect::Move { reason, .. } = &effect {
                    assert!(reason.contains(&report.id), "{reason}");
                }
                assert_eq!(
                    recorded(&effect),
                    expected.map(|_| None),
                    "{what}: {state} + {status:?}"
                );
                assert_eq!(moved_by(effect), expected, "{what}: {state} + {status:?}");
            }
        }
        // Without a `gatewayRef` (its answer was lost), the first report of its charge,
        // amount and currency is believed; another charge's is not.
        let unnamed = refund_in(Enviado);
        let believed = decide(&unnamed, &other_id(Succeeded), "evt");
        assert_eq!(recorded(&believed), Some(Some("re_2".into())));
        assert_eq!(moved_by(believed), Some(Event::Refunded));
        let foreign = decide(&unnamed, &other_charge(Succeeded), "evt");
        assert_eq!(recorded(&foreign), Some(None));
        assert_eq!(moved_by(foreign), Some(Event::Escalate));
        // A report that carries no charge is not refused for that.
        let chargeless = Refund {
            charge: String::new(),
            ..reported(Succeeded, 100)
        };
        assert_eq!(
            moved_by(decide(&unnamed, &chargeless, "evt")),
            Some(Event::Refunded)
        );
    }
}
