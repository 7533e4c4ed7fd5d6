//! The wire types pagos' server and its client share: what a payment looks like
//! ([`Pago`]), where it stands ([`PaymentState`]), how a request is written and checked
//! ([`request`], its body read by [`body`]), the `Idempotency-Key` ([`key`]), and the RFC 9457 problem documents
//! answers carry ([`Problem`], with its stable `type` slugs).
//!
//! Pure: no I/O, no clock, no HTTP framework, no database. It must never hold the server's
//! behaviour (storage, sagas, gateways) nor the client's (retries, journal): only the
//! shapes both ends agree on, so neither can drift from the other. Refunds and events get
//! their wire shapes here too, next to the payment's.
//!
//! Derives only the server needs sit behind features a merchant's build never enables:
//! `openapi` (`utoipa::ToSchema`) and `sea-orm` (`DeriveActiveEnum`, so an entity stores
//! an enum as its contract text).

pub mod body;
pub mod event;
pub mod key;
pub mod payment;
pub mod problem;
pub mod refund;
pub mod request;
pub mod state;

pub use event::{EndpointState, EventType, Evento, WebhookEndpoint};
pub use key::{IdempotencyKey, KeyError};
pub use payment::{MedioPago, Pago};
pub use problem::{Problem, ProblemType};
pub use refund::{NewRefund, Reembolso, RefundState};
pub use request::{Currency, FieldError, NewPayment, PaymentMethod};
pub use state::PaymentState;
