//! When to look at a payment again: exponential backoff with jitter, capped. Pure: the
//! caller passes the jitter.

use chrono::TimeDelta;
use std::time::Duration;

/// The longest the reconciler waits between two looks at a payment or a refund, whatever
/// its attempts (and so the most `PAGOS_STALE_AFTER` may be: a longer one would be cut to
/// this).
pub const LONGEST: Duration = Duration::from_secs(3600);

/// ±20% so payments that failed together are not all retried together.
const JITTER: f64 = 0.2;

/// When to look again after `attempts` looks: exponential from `base`, capped at
/// `LONGEST`, then ±`JITTER` (`jitter` from 0 to 1).
pub fn backoff(base: Duration, attempts: i32, jitter: f64) -> TimeDelta {
    let exp = u32::try_from(attempts.clamp(0, 16)).unwrap_or(0);
    let raw = base.saturating_mul(2u32.saturating_pow(exp)).min(LONGEST);
    let factor = 1.0 - JITTER + 2.0 * JITTER * jitter.clamp(0.0, 1.0);
    TimeDelta::from_std(raw.mul_f64(factor)).unwrap_or(TimeDelta::hours(1))
}

/// The longest `backoff` can be after `attempts` looks (its jitter at the top).
pub fn longest(base: Duration, attempts: i32) -> Duration {
    backoff(base, attempts, 1.0).to_std().unwrap_or(LONGEST)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_is_capped() {
        let base = std::time::Duration::from_secs(30);
        assert_eq!(backoff(base, 0, 0.5), TimeDelta::seconds(30));
        assert_eq!(backoff(base, 2, 0.5), TimeDelta::seconds(120));
        assert_eq!(backoff(base, 40, 0.5), TimeDelta::hours(1));
        assert!(backoff(base, 1, 0.0) < backoff(base, 1, 1.0));
        assert_eq!(longest(base, 1), Duration::from_secs(72));
        assert_eq!(longest(base, 40), Duration::from_secs(4320));
    }
}
