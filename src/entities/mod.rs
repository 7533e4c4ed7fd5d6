//! Sea-ORM entities: one module per table, rows as the database holds them.
//!
//! Entities carry no behaviour; the rules live in `saga` and `idempotency`.

pub mod api_key;
pub mod idempotency_key;
pub mod instance_fact;
pub mod merchant;
pub mod payment;
pub mod payment_transition;
pub mod processed_message;
pub mod webhook_charge;
