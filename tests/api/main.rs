//! Integration tests of pagos over real HTTP: one binary, one module per area.
//! Each scenario runs on SQLite and on PostgreSQL (`PAGOS_TEST_POSTGRES_URL`).
//! `TEST_LOG=1` shows the service's logs.

mod helpers;

mod amount_limits;
mod bad_input;
#[path = "../support/binary.rs"]
mod binary;
mod claims;
mod cli;
mod compensation;
mod console;
mod console_browser;
mod crash;
mod delivery;
mod doors;
mod event_order;
mod gateway_faults;
mod gateway_refunds;
mod lane;
mod mercadopago;
mod merchants;
mod money_path;
mod older_processes;
mod openapi_doc;
mod operator_actions;
mod operators;
mod ops;
mod outbox;
mod payment_search;
mod payments;
mod process;
mod provider_table;
mod providers;
mod receiver;
mod reconciler;
mod refund_crash;
mod refund_resolution;
mod refunds;
mod refunds_stripe;
mod replay_cache;
mod resolution;
mod restore;
mod shutdown;
mod startup;
mod stripe;
#[path = "../support/stripe.rs"]
mod stripe_fake;
mod webhook_endpoints;
mod webhooks;
mod webhooks_out;
mod webhooks_processes;
