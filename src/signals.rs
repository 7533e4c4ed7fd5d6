//! What stops a process: Ctrl-C or SIGTERM. For every command that serves until told
//! to stop (`pagos serve`, `pagos sandbox-gateway`), and the periodic workers' loop that
//! runs until told to stop.

/// Resolves on Ctrl-C or (on Unix) SIGTERM. The handlers are installed when this is
/// called, not when the future is first polled: a `SIGTERM` that arrives between a
/// process saying it listens and its first poll of this future is a graceful stop, never
/// the default action that kills the process outright. Call it from within the runtime.
pub fn shutdown_signal() -> impl std::future::Future<Output = ()> + Send + 'static {
    let mut signals = Signals::install();
    async move {
        let _ = signals.next().await;
        tracing::info!("shutting down: finishing requests in flight");
    }
}

/// Which signal came.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// Ctrl-C (SIGINT): a human at a terminal.
    Interrupt,
    /// SIGTERM: an orchestrator, a process manager, `kill`.
    Terminate,
}

/// Ctrl-C and (on Unix) SIGTERM, one after another: `pagos serve` drains on the first and
/// stops at once on a Ctrl-C after it. Installed when made (see `shutdown_signal`); a
/// signal that arrives while nobody waits in `next` is kept for the next call (several of
/// one kind before that call count as one).
pub struct Signals {
    #[cfg(unix)]
    interrupt: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    terminate: Option<tokio::signal::unix::Signal>,
}

impl Signals {
    /// Installs the handlers. Call it from within the runtime.
    pub fn install() -> Signals {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            Signals {
                interrupt: signal(SignalKind::interrupt()).ok(),
                terminate: signal(SignalKind::terminate()).ok(),
            }
        }
        #[cfg(not(unix))]
        Signals {}
    }

    /// Resolves on the next Ctrl-C or SIGTERM, saying which.
    pub async fn next(&mut self) -> Stop {
        #[cfg(unix)]
        {
            async fn one(signal: &mut Option<tokio::signal::unix::Signal>) {
                match signal.as_mut() {
                    Some(s) => {
                        s.recv().await;
                    }
                    None => std::future::pending().await,
                }
            }
            tokio::select! {
                () = one(&mut self.interrupt) => Stop::Interrupt,
                () = one(&mut self.terminate) => Stop::Terminate,
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
            Stop::Interrupt
        }
    }
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
        // Both may be ready at once: a stop already given wins over the tick.
        if *stop.borrow() {
            break;
        }
        work().await;
    }
}
