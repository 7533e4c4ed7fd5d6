//! Gateway webhooks: an at-least-once stream applied exactly once.
//!
//! `signature` checks who sent the bytes, `event` parses them (`stripe` and `mercadopago`
//! the providers' own events), `decide` says what an event does to its payment (pure),
//! and `consumer` applies it in one transaction.
//! This room never calls a gateway and never moves a payment except through
//! `saga::apply` (the transition function, the version fence, the audit trail, the
//! frozen answer).

pub mod consumer;
pub mod decide;
pub mod event;
pub mod mercadopago;
pub mod refunds;
pub mod signature;
pub mod stripe;

pub use consumer::{
    ChargeEvent, ConsumeError, Consumed, already_processed, consume, orphan_charges,
    purge_charge_reports, purge_processed_messages, registered_since, remember_processed,
};
pub use refunds::purge_refund_reports;

/// The `source` of events posted to `/v1/webhooks/http` (the reference protocol).
pub const SOURCE_HTTP: &str = "http";

/// The `source` of events posted to `/v1/webhooks/stripe`.
pub const SOURCE_STRIPE: &str = "stripe";

/// The `source` of notifications posted to `/v1/webhooks/mercadopago`.
pub const SOURCE_MERCADOPAGO: &str = "mercadopago";

/// The payments settled: `COMPLETADA`, `FALLIDA` (`payment_in`).
const SETTLED: &[&str] = &[
    crate::saga::state::PaymentState::Completada.as_str(),
    crate::saga::state::PaymentState::Fallida.as_str(),
];

/// The payment whose id is `outer` if it is in one of `states`, for `EXISTS`.
fn payment_in(
    outer: impl sea_orm::sea_query::IntoColumnRef,
    states: &[&'static str],
) -> sea_orm::sea_query::SelectStatement {
    use crate::entities::payment;
    tied_row(
        payment::Entity,
        payment::Column::Id,
        outer,
        payment::Column::State,
        states,
        true,
    )
}

/// The refunds whose `key` is `outer`, settled (`COMPLETADO`, `FALLIDO`) or, with
/// `settled` false, not yet, for `EXISTS`.
fn refunds_tied(
    key: crate::entities::refund::Column,
    outer: impl sea_orm::sea_query::IntoColumnRef,
    settled: bool,
) -> sea_orm::sea_query::SelectStatement {
    use crate::entities::refund;
    use crate::saga::refund::state::RefundState;
    tied_row(
        refund::Entity,
        key,
        outer,
        refund::Column::State,
        &[
            RefundState::Completado.as_str(),
            RefundState::Fallido.as_str(),
        ],
        settled,
    )
}

/// `SELECT 1 FROM entity WHERE entity.key = outer AND state [NOT] IN (states)`: a row of
/// `entity` tied to the report a purge weighs, in the `states` given (`within`) or out of
/// them, for `EXISTS`; the caller may narrow it further.
fn tied_row<E: sea_orm::EntityTrait + Copy>(
    entity: E,
    key: E::Column,
    outer: impl sea_orm::sea_query::IntoColumnRef,
    state: E::Column,
    states: &[&'static str],
    within: bool,
) -> sea_orm::sea_query::SelectStatement {
    use sea_orm::ColumnTrait;
    use sea_orm::sea_query::{Expr, ExprTrait, Query};
    Query::select()
        .expr(Expr::val(1))
        .from(entity)
        .and_where(Expr::col((entity, key)).equals(outer))
        .and_where(if within {
            state.is_in(states.iter().copied())
        } else {
            state.is_not_in(states.iter().copied())
        })
        .to_owned()
}
