//! When to try a delivery again, when to give up on it, and when to give up on an
//! endpoint. Pure: the clock and the jitter are arguments.
//!
//! `PAGOS_WEBHOOKS_SCHEDULE` lists the wait before each attempt (default
//! `0s,5s,5m,30m,2h,5h,10h,10h`: the first at once, the eighth and last about 28 hours
//! after the first), each stretched or shrunk by up to 20 % so that many deliveries failing
//! together (an endpoint down) do not come back together. A `Retry-After` the receiver sent
//! with a 429 or 503 moves the next attempt later, never earlier.

use chrono::{DateTime, TimeDelta, Utc};
use std::time::Duration;

/// How far either way a wait may be moved: ±20 %.
pub const JITTER: f64 = 0.2;

/// More attempts than this per delivery is not a schedule, it is a mistake (every attempt
/// is stored).
pub const MAX_ATTEMPTS: usize = 50;

/// The waits before each attempt. Never empty, at most `MAX_ATTEMPTS` long.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule(Vec<Duration>);

impl Schedule {
    /// The contract's schedule.
    pub const DEFAULT: &'static str = "0s,5s,5m,30m,2h,5h,10h,10h";

    /// Parses comma-separated durations (`0s`, `5m`, `1h 30m`, …).
    pub fn parse(text: &str) -> Result<Schedule, String> {
        let items: Vec<&str> = text.split(',').map(str::trim).collect();
        if items.iter().all(|i| i.is_empty()) {
            return Err("expected comma-separated waits such as 0s,5s,5m,30m".into());
        }
        if items.len() > MAX_ATTEMPTS {
            return Err(format!("{} attempts; at most {MAX_ATTEMPTS}", items.len()));
        }
        let waits = items
            .iter()
            .enumerate()
            .map(|(n, item)| {
                humantime::parse_duration(item)
                    .map_err(|e| {
                        format!("{e}; expected comma-separated waits such as 0s,5s,5m,30m")
                    })
                    .and_then(crate::domain::at_most_a_century)
                    .map_err(|e| format!("wait {} ({item:?}): {e}", n + 1))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Schedule(waits))
    }

    /// How many attempts a delivery gets.
    pub fn attempts(&self) -> u32 {
        u32::try_from(self.0.len()).unwrap_or(u32::MAX)
    }

    /// The wait before attempt `n` (1-based), unjittered.
    pub fn wait_before(&self, n: u32) -> Option<Duration> {
        let index = usize::try_from(n.checked_sub(1)?).ok()?;
        self.0.get(index).copied()
    }
}

/// `wait` moved by `jitter` (uniform in [0, 1)) within ±20 %.
pub fn jittered(wait: Duration, jitter: f64) -> TimeDelta {
    let factor = 1.0 - JITTER + 2.0 * JITTER * jitter.clamp(0.0, 1.0);
    let millis = (wait.as_millis() as f64 * factor).round();
    // The schedule's waits are short enough for this never to saturate.
    TimeDelta::try_milliseconds(millis as i64).unwrap_or(TimeDelta::MAX)
}

/// After a failed attempt: when the next one is due, or that there is none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    At(DateTime<Utc>),
    GiveUp,
}

/// A failed attempt, as the decision needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Failure {
    /// Which attempt it was (1-based).
    pub attempt: u32,
    pub at: DateTime<Utc>,
    /// Not before this: the receiver's `Retry-After`.
    pub not_before: Option<DateTime<Utc>>,
}

/// The schedule and the endpoint horizon together: everything the delivery worker asks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Retries {
    pub schedule: Schedule,
    /// An endpoint whose deliveries have all failed this long is deactivated
    /// (`PAGOS_WEBHOOKS_DISABLE_AFTER`).
    pub disable_after: Duration,
}

impl Retries {
    /// When the first attempt of an event written at `created_at` is due.
    pub fn first_attempt(&self, created_at: DateTime<Utc>, jitter: f64) -> DateTime<Utc> {
        let wait = self.schedule.wait_before(1).unwrap_or_default();
        later(created_at, jittered(wait, jitter))
    }

    /// After `failure`: the next attempt's time, or give up once the last has failed.
    ///
    /// A `Retry-After` later than the schedule's wait wins; one longer than
    /// `disable_after` counts as that long (by then the endpoint is deactivated, if
    /// nothing got through, and a reactivation redelivers).
    pub fn after_failure(&self, failure: &Failure, jitter: f64) -> Next {
        let next = failure.attempt.saturating_add(1);
        let Some(wait) = self.schedule.wait_before(next) else {
            return Next::GiveUp;
        };
        let scheduled = later(failure.at, jittered(wait, jitter));
        let horizon = later(failure.at, to_delta(self.disable_after));
        let asked = failure.not_before.map(|t| t.min(horizon));
        Next::At(asked.map_or(scheduled, |t| t.max(scheduled)))
    }

    /// Whether an endpoint whose deliveries have all failed since `failing_since` (its
    /// first failure after its last success; None: its last attempt succeeded, or it has
    /// none) is to be deactivated at `now`.
    pub fn should_disable(&self, failing_since: Option<DateTime<Utc>>, now: DateTime<Utc>) -> bool {
        failing_since.is_some_and(|since| since <= self.disable_if_failing_since(now))
    }

    /// An endpoint failing since this time or earlier (with no success since) is to be
    /// deactivated at `now`: the bound the store compares with the endpoint's row as it
    /// is when a failure is stored.
    pub fn disable_if_failing_since(&self, now: DateTime<Utc>) -> DateTime<Utc> {
        now.checked_sub_signed(to_delta(self.disable_after))
            .unwrap_or(DateTime::<Utc>::MIN_UTC)
    }
}

/// `at + by`, at the latest date there is rather than a panic: the settings are bounded
/// at start (a century), so only a bug gets there.
fn later(at: DateTime<Utc>, by: TimeDelta) -> DateTime<Utc> {
    at.checked_add_signed(by)
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

fn to_delta(d: Duration) -> TimeDelta {
    TimeDelta::from_std(d).unwrap_or(TimeDelta::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    fn default_retries() -> Retries {
        Retries {
            schedule: Schedule::parse(Schedule::DEFAULT).expect("the default parses"),
            disable_after: Duration::from_secs(5 * 24 * 3600),
        }
    }

    fn t0() -> DateTime<Utc> {
        "2026-03-01T12:00:00Z".parse().expect("a time")
    }

    const MIDDLE: f64 = 0.5;

    #[test]
    fn the_default_schedule_is_the_contracts_eight_waits() {
        let s = Schedule::parse(Schedule::DEFAULT).expect("parses");
        let secs: Vec<u64> = (1..=8)
            .map(|n| s.wait_before(n).expect("a wait").as_secs())
            .collect();
        assert_eq!(secs, [0, 5, 300, 1800, 7200, 18000, 36000, 36000]);
        assert_eq!(s.attempts(), 8);
        assert_eq!(s.wait_before(0), None);
        assert_eq!(s.wait_before(9), None);
    }

    #[test]
    fn a_bad_schedule_is_refused_naming_the_wait_at_fault() {
        let err = Schedule::parse("0s,5s,soon,30m").expect_err("refused");
        assert!(err.contains("wait 3") && err.contains("soon"), "{err}");
        assert!(!err.contains('\n'));
        assert!(Schedule::parse("").is_err());
        assert!(Schedule::parse(" , ").is_err());
        assert!(
            Schedule::parse("5s,,5m")
                .expect_err("refused")
                .contains("wait 2")
        );
        let too_many = vec!["1s"; MAX_ATTEMPTS + 1].join(",");
        assert!(Schedule::parse(&too_many).is_err());
        let spaced = Schedule::parse(" 1s , 1h 30m ").expect("spaces around items are fine");
        assert_eq!(spaced.wait_before(2), Some(Duration::from_secs(5400)));
    }

    #[test]
    fn jitter_stays_within_twenty_percent_and_spans_the_whole_band() {
        let wait = Duration::from_secs(300);
        assert_eq!(jittered(wait, 0.0), TimeDelta::seconds(240));
        assert_eq!(jittered(wait, 1.0), TimeDelta::seconds(360));
        assert_eq!(jittered(wait, MIDDLE), TimeDelta::seconds(300));
        let mut rng = StdRng::seed_from_u64(7);
        let draws: Vec<i64> = (0..2000)
            .map(|_| jittered(wait, rng.random()).num_milliseconds())
            .collect();
        let (lo, hi) = (
            *draws.iter().min().expect("draws"),
            *draws.iter().max().expect("draws"),
        );
        assert!(lo >= 240_000 && hi <= 360_000, "{lo}..{hi}");
        assert!(lo < 250_000 && hi > 350_000, "uses the band: {lo}..{hi}");
        assert_eq!(jittered(Duration::ZERO, 0.9), TimeDelta::zero());
    }

    #[test]
    fn each_failed_attempt_waits_the_next_step_of_the_schedule() {
        let r = default_retries();
        assert_eq!(
            r.first_attempt(t0(), 0.3),
            t0(),
            "the first attempt is at once"
        );
        for (failed, wait) in [(1, 5), (2, 300), (3, 1800), (4, 7200), (7, 36000)] {
            let failure = Failure {
                attempt: failed,
                at: t0(),
                not_before: None,
            };
            assert_eq!(
                r.after_failure(&failure, MIDDLE),
                Next::At(t0() + TimeDelta::seconds(wait)),
                "after attempt {failed}"
            );
            let Next::At(early) = r.after_failure(&failure, 0.0) else {
                panic!("a next attempt")
            };
            let Next::At(late) = r.after_failure(&failure, 1.0) else {
                panic!("a next attempt")
            };
            assert_eq!(early - t0(), TimeDelta::milliseconds(wait * 800));
            assert_eq!(late - t0(), TimeDelta::milliseconds(wait * 1200));
        }
    }

    #[test]
    fn after_the_last_attempt_fails_the_delivery_gives_up() {
        let r = default_retries();
        let last = Failure {
            attempt: 8,
            at: t0(),
            not_before: Some(t0() + TimeDelta::seconds(60)),
        };
        assert_eq!(r.after_failure(&last, MIDDLE), Next::GiveUp);
        let one = Retries {
            schedule: Schedule::parse("0s").expect("parses"),
            ..r
        };
        let first = Failure {
            attempt: 1,
            at: t0(),
            not_before: None,
        };
        assert_eq!(one.after_failure(&first, MIDDLE), Next::GiveUp);
    }

    #[test]
    fn a_retry_after_later_than_the_schedule_moves_the_next_attempt_never_earlier() {
        let r = default_retries();
        let failed = |not_before: Option<DateTime<Utc>>| Failure {
            attempt: 1,
            at: t0(),
            not_before,
        };
        let later = t0() + TimeDelta::seconds(120);
        assert_eq!(r.after_failure(&failed(Some(later)), 1.0), Next::At(later));
        let sooner = t0() + TimeDelta::seconds(1);
        assert_eq!(
            r.after_failure(&failed(Some(sooner)), MIDDLE),
            Next::At(t0() + TimeDelta::seconds(5)),
            "the schedule's wait stands when Retry-After is shorter"
        );
        let past = t0() - TimeDelta::seconds(30);
        assert_eq!(
            r.after_failure(&failed(Some(past)), MIDDLE),
            Next::At(t0() + TimeDelta::seconds(5))
        );
        let next_year = t0() + TimeDelta::days(365);
        assert_eq!(
            r.after_failure(&failed(Some(next_year)), MIDDLE),
            Next::At(t0() + TimeDelta::days(5)),
            "no receiver parks an event past the endpoint's horizon"
        );
    }

    #[test]
    fn an_endpoint_is_disabled_once_all_its_deliveries_have_failed_for_the_horizon() {
        let r = default_retries();
        let since = t0();
        assert!(!r.should_disable(
            Some(since),
            since + TimeDelta::days(5) - TimeDelta::seconds(1)
        ));
        assert!(r.should_disable(Some(since), since + TimeDelta::days(5)));
        assert!(r.should_disable(Some(since), since + TimeDelta::days(9)));
        assert!(
            !r.should_disable(None, since + TimeDelta::days(30)),
            "an endpoint whose last delivery succeeded stays active"
        );
        let short = Retries {
            disable_after: Duration::from_secs(3600),
            ..r
        };
        assert!(short.should_disable(Some(since), since + TimeDelta::hours(1)));
    }
}
