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
    purge_charge_reports, purge_processed_messages, remember_processed,
};
pub use refunds::purge_refund_reports;

/// The `source` of events posted to `/v1/webhooks/http` (the reference protocol).
pub const SOURCE_HTTP: &str = "http";

/// The `source` of events posted to `/v1/webhooks/stripe`.
pub const SOURCE_STRIPE: &str = "stripe";

/// The `source` of notifications posted to `/v1/webhooks/mercadopago`.
pub const SOURCE_MERCADOPAGO: &str = "mercadopago";
