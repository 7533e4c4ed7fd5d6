//! The settings of deliveries to merchants' endpoints (`PAGOS_WEBHOOKS_*`), part of
//! `pagos serve`'s settings. Each is parsed at start: a bad one stops the process with
//! one line naming it (exit 2), like every setting.

use super::guard::AddressPolicy;
use super::schedule::{Retries, Schedule};
use clap::Args;
use std::time::Duration;

/// The longest `PAGOS_WEBHOOKS_TIMEOUT`: a longer one only holds a delivery slot for a
/// receiver that is not answering anyway.
const MAX_TIMEOUT: Duration = Duration::from_secs(300);

fn timeout(text: &str) -> Result<Duration, String> {
    match humantime::parse_duration(text) {
        Err(e) => Err(format!("{e}; expected a duration such as 250ms, 15s or 1m")),
        Ok(d) if d.is_zero() => Err("must be greater than zero".into()),
        Ok(d) if d > MAX_TIMEOUT => Err("must be at most 5m".into()),
        Ok(d) => Ok(d),
    }
}

fn horizon(text: &str) -> Result<Duration, String> {
    match humantime::parse_duration(text) {
        Err(e) => Err(format!("{e}; expected a duration such as 12h or 5d")),
        Ok(d) if d.is_zero() => Err("must be greater than zero".into()),
        Ok(d) => crate::domain::at_most_a_century(d),
    }
}

#[derive(Clone, Debug, Args)]
pub struct WebhookSettings {
    /// Timeout of one delivery to a merchant's endpoint, from resolving its host to its
    /// answer: a 2xx within it is delivered
    #[arg(long = "webhooks-timeout", env = "PAGOS_WEBHOOKS_TIMEOUT", default_value = "15s",
          value_parser = timeout, value_name = "DURATION")]
    pub timeout: Duration,
    /// Wait before each attempt of a delivery, comma-separated (each ±20 % jitter; a 429 or
    /// 503 with Retry-After waits at least that long); after the last, the delivery is
    /// given up
    #[arg(long = "webhooks-schedule", env = "PAGOS_WEBHOOKS_SCHEDULE",
          default_value = Schedule::DEFAULT, value_parser = Schedule::parse, value_name = "WAITS")]
    pub schedule: Schedule,
    /// An endpoint whose deliveries have all failed for this long is deactivated
    /// (DESACTIVADO)
    #[arg(long = "webhooks-disable-after", env = "PAGOS_WEBHOOKS_DISABLE_AFTER",
          default_value = "5d", value_parser = horizon, value_name = "DURATION")]
    pub disable_after: Duration,
    /// Let endpoints be plain http:// and resolve to loopback, private or link-local
    /// addresses (local receivers in development and tests; never in production)
    #[arg(long = "webhooks-allow-private", env = "PAGOS_WEBHOOKS_ALLOW_PRIVATE",
          num_args = 0..=1, default_value = "false", default_missing_value = "true",
          value_parser = clap::builder::BoolishValueParser::new(), value_name = "BOOL")]
    pub allow_private: bool,
}

impl WebhookSettings {
    pub fn policy(&self) -> AddressPolicy {
        AddressPolicy::from_allow_private(self.allow_private)
    }

    pub fn retries(&self) -> Retries {
        Retries {
            schedule: self.schedule.clone(),
            disable_after: self.disable_after,
        }
    }
}
