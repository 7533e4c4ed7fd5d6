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

pub async fn charge(
    gateway: &dyn Gateway,
    req: &ChargeRequest,
    policy: RetryPolicy,
) -> ChargeOutcome {
    let result = (|| gateway.charge(req))
        .retry(policy.backoff())
        .when(GatewayError::is_retryable)
        .notify(|err, delay| {
            tracing::warn!(payment_id = %req.reference, error = %err, retry_in = ?delay, "gateway call failed, retrying with the same key");
        })
        .await;
    match result {
        Ok(charge) => match charge.status {
            ChargeStatus::Succeeded => ChargeOutcome::Succeeded(charge),
            ChargeStatus::Declined => ChargeOutcome::Declined(charge),
            ChargeStatus::Pending => ChargeOutcome::Pending(charge),
        },
        Err(GatewayError::Rejected { status, detail }) => {
            ChargeOutcome::Rejected { status, detail }
        }
        Err(GatewayError::Unknown(why)) => ChargeOutcome::Unknown(why),
    }
}
