//! The retry policy for one gateway call: exponential backoff with jitter (backon), the
//! same request (and so the same gateway key) on every try, and only on errors that leave
//! the outcome unknown.

use super::{Charge, ChargeRequest, ChargeStatus, Gateway, GatewayError};
use backon::{ExponentialBuilder, Retryable};
use std::time::Duration;

/// How hard to try one gateway call.
#[derive(Clone, Copy, Debug)]
pub struct RetryPolicy {
    /// Retries after the first try.
    pub retries: usize,
    pub min_delay: Duration,
    pub max_delay: Duration,
}

impl RetryPolicy {
    pub fn new(retries: usize) -> Self {
        RetryPolicy {
            retries,
            min_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(2),
        }
    }

    fn backoff(&self) -> ExponentialBuilder {
        ExponentialBuilder::default()
            .with_min_delay(self.min_delay)
            .with_max_delay(self.max_delay)
            .with_max_times(self.retries)
            .with_jitter()
    }

    /// The longest a call can take, sleeps included, given a per-try timeout.
    pub fn worst_case(&self, per_try: Duration) -> Duration {
        let tries = u32::try_from(self.retries + 1).unwrap_or(u32::MAX);
        let sleeps = self.max_delay * 2 * u32::try_from(self.retries).unwrap_or(u32::MAX);
        per_try.saturating_mul(tries) + sleeps
    }
}

/// What a charge call came to, after retries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ChargeOutcome {
    Succeeded(Charge),
    Declined(Charge),
    /// The gateway accepted the charge and will settle it later.
    Pending(Charge),
    /// The gateway refused the request: no charge exists.
    Rejected {
        status: u16,
        detail: String,
    },
    /// Nobody knows whether the charge exists: the reconciler must ask.
    Unknown(String),
}

/// One charge call, retried with the same request on unknown outcomes.
///
/// `maybe_sent_before`: an earlier send of this payment may have reached the gateway (it
/// was ENVIADA). Then, as after any try of this call whose outcome was unknown, a refusal
/// proves nothing — the charge an earlier try may have made still may exist — and the
/// outcome stays `Unknown`: only a readable charge status settles such a payment.
pub async fn charge(
    gateway: &dyn Gateway,
    req: &ChargeRequest,
    policy: RetryPolicy,
    maybe_sent_before: bool,
) -> ChargeOutcome {
    // Set once a try may have made a charge whose existence is unknown.
    let uncertain = std::sync::atomic::AtomicBool::new(maybe_sent_before);
    let result = (|| gateway.charge(req))
        .retry(policy.backoff())
        .when(GatewayError::is_retryable)
        .notify(|err, delay| {
            uncertain.store(true, std::sync::atomic::Ordering::Relaxed);
            tracing::warn!(payment_id = %req.reference, error = %err, retry_in = ?delay, "gateway call failed, retrying with the same key");
        })
        .await;
    match result {
        Ok(charge) => match charge.status {
            ChargeStatus::Succeeded => ChargeOutcome::Succeeded(charge),
            ChargeStatus::Declined => ChargeOutcome::Declined(charge),
            ChargeStatus::Pending => ChargeOutcome::Pending(charge),
        },
        // A refusal proves no charge was made only if no earlier try may have made one.
        Err(GatewayError::Rejected { status, detail })
            if uncertain.load(std::sync::atomic::Ordering::Relaxed) =>
        {
            ChargeOutcome::Unknown(format!(
                "refused with {status}, but an earlier try of this payment may have reached the gateway: {detail}"
            ))
        }
        Err(GatewayError::Rejected { status, detail }) => {
            ChargeOutcome::Rejected { status, detail }
        }
        Err(GatewayError::Unknown(why)) => ChargeOutcome::Unknown(why),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::Charge;
    use async_trait::async_trait;
    use std::sync::Mutex;
    use uuid::Uuid;

    /// Answers each try with the next scripted result; counts the tries.
    struct Scripted(
        Mutex<Vec<Result<Charge, GatewayError>>>,
        std::sync::atomic::AtomicUsize,
    );

    fn scripted(script: Vec<Result<Charge, GatewayError>>) -> Scripted {
        Scripted(Mutex::new(script), std::sync::atomic::AtomicUsize::new(0))
    }

    #[async_trait]
    impl Gateway for Scripted {
        async fn charge(&self, _req: &ChargeRequest) -> Result<Charge, GatewayError> {
            self.1.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let mut script = self.0.lock().unwrap_or_else(|e| e.into_inner());
            if script.is_empty() {
                return Err(GatewayError::Unknown("script ended".into()));
            }
            script.remove(0)
        }

        async fn lookup(&self, _reference: Uuid) -> Result<Vec<Charge>, GatewayError> {
            Ok(vec![])
        }
    }

    fn request() -> ChargeRequest {
        ChargeRequest {
            gateway_key: "k".into(),
            amount: 1,
            currency: "COP".into(),
            reference: Uuid::nil(),
            description: None,
            payment_method: None,
        }
    }

    fn fast(retries: usize) -> RetryPolicy {
        RetryPolicy {
            retries,
            min_delay: Duration::from_millis(1),
            max_delay: Duration::from_millis(2),
        }
    }

    fn rejected() -> GatewayError {
        GatewayError::Rejected {
            status: 400,
            detail: "bad".into(),
        }
    }

    #[tokio::test]
    async fn a_refusal_on_the_first_try_means_no_charge() {
        let gateway = scripted(vec![Err(rejected())]);
        let outcome = charge(&gateway, &request(), fast(3), false).await;
        assert!(matches!(
            outcome,
            ChargeOutcome::Rejected { status: 400, .. }
        ));
    }

    #[tokio::test]
    async fn a_refusal_after_an_unknown_try_stays_unknown() {
        let gateway = scripted(vec![
            Err(GatewayError::Unknown("timed out".into())),
            Err(rejected()),
        ]);
        let outcome = charge(&gateway, &request(), fast(3), false).await;
        assert!(matches!(outcome, ChargeOutcome::Unknown(_)), "{outcome:?}");
    }

    #[tokio::test]
    async fn a_refusal_of_a_resend_stays_unknown() {
        let gateway = scripted(vec![Err(rejected())]);
        let outcome = charge(&gateway, &request(), fast(3), true).await;
        assert!(matches!(outcome, ChargeOutcome::Unknown(_)), "{outcome:?}");
        assert_eq!(
            gateway.1.load(std::sync::atomic::Ordering::Relaxed),
            1,
            "a refusal is not retried"
        );
    }

    #[tokio::test]
    async fn a_readable_charge_settles_a_resend() {
        let declined = Charge {
            id: "ch_1".into(),
            status: ChargeStatus::Declined,
            amount: 1,
            currency: "COP".into(),
            reference: Uuid::nil().to_string(),
            decline_code: Some("insufficient_funds".into()),
        };
        let gateway = scripted(vec![Ok(declined)]);
        let outcome = charge(&gateway, &request(), fast(3), true).await;
        assert!(matches!(outcome, ChargeOutcome::Declined(_)), "{outcome:?}");
    }

    #[tokio::test]
    async fn retries_stop_at_the_budget() {
        let gateway = scripted(vec![]);
        let outcome = charge(&gateway, &request(), fast(2), false).await;
        assert!(matches!(outcome, ChargeOutcome::Unknown(_)));
        assert_eq!(
            gateway.1.load(std::sync::atomic::Ordering::Relaxed),
            3,
            "one try and two retries"
        );
    }
}
