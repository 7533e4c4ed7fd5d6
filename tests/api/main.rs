//! Integration tests of pagos over real HTTP: one binary, one module per area.
//! Each scenario runs on SQLite and on PostgreSQL (`PAGOS_TEST_POSTGRES_URL`).
//! `TEST_LOG=1` shows the service's logs.

mod helpers;

mod amount_limits;
mod bad_input;
mod claims;
mod cli;
mod console;
mod console_browser;
mod crash;
mod delivery;
mod doors;
mod gateway_faults;
mod gateway_refunds;
mod mercadopago;
mod merchants;
mod money_path;
mod operators;
mod ops;
mod outbox;
mod payment_search;
mod payments;
mod process;
mod providers;
mod receiver;
mod reconciler;
mod restore;
mod startup;
mod stripe;
mod webhook_endpoints;
mod webhooks;
mod webhooks_out;
mod webhooks_processes;
