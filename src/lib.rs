//! pagos: payments through external gateways, safe to retry.
//!
//! The pure core (`saga::state`, `idempotency::fingerprint`, `domain`) has no I/O; the
//! shell around it (`http`, `saga::store`, `gateway`) talks to the world.

pub mod app;
pub mod config;
pub mod db;
pub mod delivery;
pub mod dispatcher;
pub mod domain;
pub mod entities;
pub mod failpoint;
pub mod gateway;
pub mod http;
pub mod idempotency;
pub mod merchants;
pub mod metrics;
pub mod operators;
pub mod outbox;
pub mod reaper;
pub mod reconciler;
pub mod representation;
pub mod saga;
pub mod signals;
pub mod telemetry;
pub mod webhooks;
