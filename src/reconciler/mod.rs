//! The periodic reconciler of `pagos serve`: a worker that runs one reconciliation pass
//! (`saga::reconcile`) every `PAGOS_RECONCILE_EVERY`, until told to stop.
//!
//! It gets exactly what it uses (a `Reconciler`, its period), never the application, and
//! it imports neither the HTTP surface nor the other workers: what it shares with them
//! (a pass, one payment's reconciliation, the report) lives below, in the saga layer.

use crate::saga::reconcile::{Reconciler, run_pass};
use std::time::Duration;

/// Passes every `every`, the first at once, until `stop` fires. A pass in progress
/// finishes its payments first; each of its writes is atomic anyway.
pub async fn run_periodically(
    reconciler: Reconciler,
    every: Duration,
    stop: tokio::sync::watch::Receiver<bool>,
) {
    crate::signals::every(every, stop, || async {
        if let Err(err) = run_pass(&reconciler).await {
            tracing::error!(error = %err, "reconciliation pass failed; retrying next period");
        }
    })
    .await;
}
