//! What stops a process: Ctrl-C or SIGTERM. For every command that serves until told
//! to stop (`pagos serve`, `pagos sandbox-gateway`), and the periodic workers' loop that
//! runs until told to stop.

/// Resolves on Ctrl-C or (on Unix) SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        if let Ok(mut term) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        {
            term.recv().await;
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = terminate => {},
    }
    tracing::info!("shutting down: finishing requests in flight");
}

/// Runs `work` every `period`, the first at once, until `stop` fires; a run in progress
/// finishes first. A late run delays the next ones rather than bunching them up.
pub async fn every<F, Fut>(
    period: std::time::Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
    mut work: F,
) where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut ticker = tokio::time::interval(period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = stop.changed() => break,
        }
        work().await;
    }
}
