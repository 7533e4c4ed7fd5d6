//! When to look at a payment again: exponential backoff with jitter, capped. Pure: the
//! caller passes the jitter.

use chrono::TimeDelta;

/// When to look again after `attempts` looks: exponential from `base`, capped at an hour.
pub fn backoff(base: std::time::Duration, attempts: i32, jitter: f64) -> TimeDelta {
    let exp = u32::try_from(attempts.clamp(0, 16)).unwrap_or(0);
    let raw = base
        .saturating_mul(2u32.saturating_pow(exp))
        .min(std::time::Duration::from_secs(3600));
    // ±20% so payments that failed together are not all retried together.
    let factor = 0.8 + 0.4 * jitter.clamp(0.0, 1.0);
    TimeDelta::from_std(raw.mul_f64(factor)).unwrap_or(TimeDelta::hours(1))
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
    }
}
