//! The periodic reconciler of `pagos serve`: a worker that runs one reconciliation pass
//! (`saga::reconcile`) every `PAGOS_RECONCILE_EVERY`, until told to stop.
//!
//! It gets exactly what it uses (a `Reconciler`, its period), never the application, and
//! it imports neither the HTTP surface nor the other workers: what it shares with them
//! (a pass, one payment's reconciliation, the report) lives below, in the saga layer.

use crate::saga::reconcile::{Reconciler, run_pass};
use std::time::Duration;

/// Passes every `every`, the first at once, until `stop` fires. A pass in progress then
/// claims nothing more: the payments in its work finish (each write atomic anyway), and
/// those it claimed but had not taken up are due again once their claims run out, as
/// after a crash. A backlog never holds a shutdown past its grace.
pub async fn run_periodically(
    reconciler: Reconciler,
    every: Duration,
    stop: tokio::sync::watch::Receiver<bool>,
) {
    let stopping = stop.clone();
    crate::signals::every(every, stop, || async {
        if let Err(err) = run_pass(&reconciler, Some(&stopping)).await {
            tracing::error!(error = %err.source, done = ?err.report, "reconciliation pass failed; retrying next period");
        }
    })
    .await;
}
