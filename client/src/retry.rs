//! When to try again, and how long to wait: exponential backoff with full jitter, capped
//! in attempts and in total time, and never sooner than the server's `Retry-After`.
//!
//! Pure: no I/O, and no clock of its own (callers pass `now`), so every rule is tested
//! without sleeping. It must never decide *what* is worth retrying — that is the reading
//! of the answer — and never change the request: the caller resends the same key and body.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::time::{Duration, Instant};

/// How hard one `pay` tries. The defaults suit an interactive payment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PayPolicy {
    /// Tries of a request that failed with an unknown outcome, the first one included.
    /// Looking a pending payment up again does not count, nor does a 409 saying the
    /// first request is still in flight (the deadline bounds those).
    pub max_attempts: u32,
    /// How long one `pay` may take in all, waits included. A payment still pending then
    /// is reported as pending; a request still failing, as given up.
    pub deadline: Duration,
    /// Longest wait for one answer; cut to what is left of the deadline.
    pub request_timeout: Duration,
    /// Base of the exponential backoff: the n-th retry waits a random time in
    /// `[0, min(max_delay, min_delay · 2ⁿ)]`.
    pub min_delay: Duration,
    /// Cap of one wait (a longer `Retry-After` still wins).
    pub max_delay: Duration,
    /// Seed of the jitter; `None` draws one from the OS. Tests set it to repeat a run.
    pub seed: Option<u64>,
}

impl Default for PayPolicy {
    fn default() -> Self {
        PayPolicy {
            max_attempts: 10,
            deadline: Duration::from_secs(120),
            request_timeout: Duration::from_secs(15),
            min_delay: Duration::from_millis(250),
            max_delay: Duration::from_secs(10),
            seed: None,
        }
    }
}

impl PayPolicy {
    /// The jittered delays of this policy, as a backon backoff.
    pub fn backoff(&self) -> FullJitter {
        let rng = match self.seed {
            Some(seed) => StdRng::seed_from_u64(seed),
            None => StdRng::from_os_rng(),
        };
        FullJitter {
            rng,
            base: self.min_delay,
            cap: self.max_delay,
            retry: 0,
        }
    }
}

/// "Full jitter" exponential backoff: the n-th delay (from 0) is uniform in
/// `[0, min(cap, base · 2ⁿ)]`. Spreading retries over the whole window keeps many clients
/// that failed together from coming back together. Endless: [`Budget`] decides when to stop.
#[derive(Debug)]
pub struct FullJitter {
    rng: StdRng,
    base: Duration,
    cap: Duration,
    retry: u32,
}

impl FullJitter {
    /// The upper bound of the n-th delay.
    pub fn ceiling(base: Duration, cap: Duration, retry: u32) -> Duration {
        let factor = 2u32.saturating_pow(retry);
        base.saturating_mul(factor).min(cap)
    }
}

impl Iterator for FullJitter {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let ceiling = FullJitter::ceiling(self.base, self.cap, self.retry);
        self.retry = self.retry.saturating_add(1);
        let micros = u64::try_from(ceiling.as_micros()).unwrap_or(u64::MAX);
        Some(Duration::from_micros(self.rng.random_range(0..=micros)))
    }
}

/// Why a try did not settle the intent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unsettled {
    /// The request failed with an unknown outcome, or the server was busy; counts as an
    /// attempt.
    Failed { retry_after: Option<Duration> },
    /// 409 `request-in-flight`: the first request with this key is still being worked
    /// on. A known state, not a failure: it waits (`Retry-After` wins) and uses up no
    /// attempt; only the deadline bounds it.
    InFlight { retry_after: Option<Duration> },
    /// The server has the payment and no outcome yet; looking again is not a failure.
    /// Not before its `Retry-After` (a 202's: when the server next works on the payment,
    /// five minutes for one in REVISION_MANUAL): looking sooner only reads the same state.
    Pending { retry_after: Option<Duration> },
}

/// What one `pay` may still spend: attempts and time. Time is counted as durations since
/// `started`, never as an `Instant` plus a duration: a deadline or a `Retry-After` of any
/// size (`Duration::MAX`, a proxy's `Retry-After: 18446744073709551615`) cannot overflow
/// the clock.
#[derive(Clone, Debug)]
pub struct Budget {
    started: Instant,
    deadline: Duration,
    max_attempts: u32,
    min_delay: Duration,
    failures: u32,
}

/// Why the budget said stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exhausted {
    Attempts,
    Time,
}

impl Budget {
    pub fn new(policy: &PayPolicy, now: Instant) -> Budget {
        Budget {
            started: now,
            deadline: policy.deadline,
            max_attempts: policy.max_attempts.max(1),
            min_delay: policy.min_delay,
            failures: 0,
        }
    }

    /// The wait before the next try, or why there is none. `jittered` is the backoff's
    /// proposal; a `Retry-After` longer than it wins (a pending payment's too), and a
    /// pending payment is not looked up again sooner than `min_delay`. A wait that would
    /// end at or past the deadline is none: no try could start in time (a `Retry-After`
    /// longer than what is left means "not before the deadline").
    pub fn next_wait(
        &mut self,
        why: Unsettled,
        jittered: Duration,
        now: Instant,
    ) -> Result<Duration, Exhausted> {
        let wait = match why {
            Unsettled::Failed { retry_after } => {
                self.failures = self.failures.saturating_add(1);
                if self.failures >= self.max_attempts {
                    return Err(Exhausted::Attempts);
                }
                jittered.max(retry_after.unwrap_or_default())
            }
            Unsettled::InFlight { retry_after } => jittered.max(retry_after.unwrap_or_default()),
            Unsettled::Pending { retry_after } => jittered
                .max(self.min_delay)
                .max(retry_after.unwrap_or_default()),
        };
        if wait >= self.remaining(now) {
            return Err(Exhausted::Time);
        }
        Ok(wait)
    }

    /// How long the next request may wait for its answer.
    pub fn request_timeout(&self, policy_timeout: Duration, now: Instant) -> Duration {
        policy_timeout.min(self.remaining(now))
    }

    /// What is left of the deadline at `now`.
    pub fn remaining(&self, now: Instant) -> Duration {
        self.deadline.saturating_sub(self.elapsed(now))
    }

    /// Tries that failed so far.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    pub fn elapsed(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.started)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PENDING: Unsettled = Unsettled::Pending { retry_after: None };

    fn policy(seed: u64) -> PayPolicy {
        PayPolicy {
            min_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(2),
            seed: Some(seed),
            ..PayPolicy::default()
        }
    }

    fn delays(seed: u64, n: usize) -> Vec<Duration> {
        policy(seed).backoff().take(n).collect()
    }

    #[test]
    fn no_delay_is_over_its_exponential_ceiling_or_the_cap() {
        let cap = Duration::from_secs(2);
        for seed in 0..200 {
            for (n, delay) in delays(seed, 12).into_iter().enumerate() {
                let ceiling = Duration::from_millis(100 * 2u64.pow(n as u32)).min(cap);
                assert!(
                    delay <= ceiling,
                    "seed {seed}, retry {n}: {delay:?} over {ceiling:?}"
                );
            }
        }
    }

    #[test]
    fn different_seeds_give_different_sequences_and_one_seed_repeats_itself() {
        let sequences: Vec<_> = (0..200).map(|seed| delays(seed, 8)).collect();
        for (i, a) in sequences.iter().enumerate() {
            for (j, b) in sequences.iter().enumerate().skip(i + 1) {
                assert_ne!(a, b, "seeds {i} and {j} drew the same delays");
            }
        }
        assert_eq!(delays(7, 8), delays(7, 8));
    }

    #[test]
    fn delays_are_spread_over_the_whole_window() {
        // At the cap, full jitter draws anywhere in [0, cap]: across seeds the draws must
        // reach both the bottom and the top fifth, not cluster at the ceiling.
        let cap = Duration::from_secs(2);
        let capped: Vec<Duration> = (0..500).map(|seed| delays(seed, 10)[9]).collect();
        assert!(capped.iter().any(|d| *d < cap / 5), "none low: {capped:?}");
        assert!(capped.iter().any(|d| *d > cap * 4 / 5), "none high");
        let mean = capped.iter().sum::<Duration>() / 500;
        assert!(
            mean > cap * 2 / 5 && mean < cap * 3 / 5,
            "mean {mean:?} is not near half the cap"
        );
    }

    #[test]
    fn a_retry_after_longer_than_the_jitter_is_honoured() {
        let now = Instant::now();
        let mut budget = Budget::new(&policy(1), now);
        let wait = budget.next_wait(
            Unsettled::Failed {
                retry_after: Some(Duration::from_secs(3)),
            },
            Duration::from_millis(40),
            now,
        );
        assert_eq!(wait, Ok(Duration::from_secs(3)));
        let wait = budget.next_wait(
            Unsettled::Failed {
                retry_after: Some(Duration::from_millis(10)),
            },
            Duration::from_millis(40),
            now,
        );
        assert_eq!(wait, Ok(Duration::from_millis(40)));
    }

    /// A payment under review is answered 202 with `Retry-After: 300`: the next look waits
    /// for it, and one past the deadline ends the wait at once.
    #[test]
    fn a_pending_payments_retry_after_is_honoured_and_one_past_the_deadline_ends_it() {
        let now = Instant::now();
        let p = PayPolicy {
            deadline: Duration::from_secs(600),
            ..policy(1)
        };
        let mut budget = Budget::new(&p, now);
        let small = Duration::from_millis(1);
        let under_review = Unsettled::Pending {
            retry_after: Some(Duration::from_secs(300)),
        };
        assert_eq!(
            budget.next_wait(under_review, small, now),
            Ok(Duration::from_secs(300))
        );
        assert_eq!(
            budget.next_wait(under_review, small, now + Duration::from_secs(400)),
            Err(Exhausted::Time)
        );
    }

    #[test]
    fn failures_stop_at_max_attempts_but_pending_lookups_do_not_count() {
        let now = Instant::now();
        let p = PayPolicy {
            max_attempts: 3,
            ..policy(1)
        };
        let mut budget = Budget::new(&p, now);
        let failed = Unsettled::Failed { retry_after: None };
        let small = Duration::from_millis(1);
        for _ in 0..50 {
            assert!(budget.next_wait(PENDING, small, now).is_ok());
        }
        assert!(budget.next_wait(failed, small, now).is_ok(), "after try 1");
        assert!(budget.next_wait(failed, small, now).is_ok(), "after try 2");
        assert_eq!(
            budget.next_wait(failed, small, now),
            Err(Exhausted::Attempts),
            "try 3 was the last"
        );
        assert_eq!(budget.failures(), 3);
    }

    #[test]
    fn a_first_request_in_flight_uses_up_no_attempt_and_only_the_deadline_bounds_it() {
        let now = Instant::now();
        let p = PayPolicy {
            max_attempts: 2,
            deadline: Duration::from_secs(60),
            ..policy(1)
        };
        let mut budget = Budget::new(&p, now);
        let in_flight = Unsettled::InFlight {
            retry_after: Some(Duration::from_secs(1)),
        };
        let small = Duration::from_millis(1);
        for _ in 0..50 {
            assert_eq!(
                budget.next_wait(in_flight, small, now),
                Ok(Duration::from_secs(1))
            );
        }
        assert_eq!(budget.failures(), 0);
        assert_eq!(
            budget.next_wait(in_flight, small, now + Duration::from_secs(59)),
            Err(Exhausted::Time)
        );
        let failed = Unsettled::Failed { retry_after: None };
        assert!(budget.next_wait(failed, small, now).is_ok());
        assert_eq!(
            budget.next_wait(failed, small, now),
            Err(Exhausted::Attempts)
        );
    }

    #[test]
    fn no_try_starts_past_the_deadline() {
        let now = Instant::now();
        let p = PayPolicy {
            deadline: Duration::from_secs(5),
            max_attempts: 1000,
            ..policy(1)
        };
        let mut budget = Budget::new(&p, now);
        let failed = Unsettled::Failed { retry_after: None };
        let second = Duration::from_secs(1);
        assert!(budget.next_wait(failed, second, now).is_ok());
        assert_eq!(
            budget.next_wait(failed, second, now + Duration::from_secs(4)),
            Err(Exhausted::Time)
        );
        let far = Unsettled::Failed {
            retry_after: Some(Duration::from_secs(60)),
        };
        assert_eq!(budget.next_wait(far, second, now), Err(Exhausted::Time));
        assert_eq!(
            budget.next_wait(PENDING, second, now + Duration::from_secs(4)),
            Err(Exhausted::Time)
        );
    }

    #[test]
    fn durations_beyond_any_clock_end_the_wait_at_the_deadline_and_never_overflow() {
        let now = Instant::now();
        let endless = PayPolicy {
            deadline: Duration::MAX,
            ..policy(1)
        };
        let mut budget = Budget::new(&endless, now);
        assert_eq!(
            budget.request_timeout(Duration::MAX, now),
            Duration::MAX,
            "nothing but the policy's own timeout"
        );
        let small = Duration::from_millis(1);
        assert_eq!(
            budget.next_wait(PENDING, small, now),
            Ok(policy(1).min_delay)
        );
        // A misbehaving proxy's `Retry-After: 18446744073709551615`, under a deadline: no
        // try could start before the deadline, so there is none.
        let far = Some(Duration::from_secs(u64::MAX));
        let p = PayPolicy {
            deadline: Duration::from_secs(30),
            ..policy(1)
        };
        let mut budget = Budget::new(&p, now);
        for why in [
            Unsettled::Failed { retry_after: far },
            Unsettled::InFlight { retry_after: far },
        ] {
            assert_eq!(budget.next_wait(why, small, now), Err(Exhausted::Time));
        }
        let mut endless = Budget::new(&endless, now);
        assert_eq!(
            endless.next_wait(Unsettled::InFlight { retry_after: far }, small, now),
            Ok(Duration::from_secs(u64::MAX))
        );
    }

    #[test]
    fn a_request_never_waits_past_the_deadline() {
        let now = Instant::now();
        let p = PayPolicy {
            deadline: Duration::from_secs(5),
            ..policy(1)
        };
        let budget = Budget::new(&p, now);
        let timeout = Duration::from_secs(15);
        assert_eq!(budget.request_timeout(timeout, now), Duration::from_secs(5));
        assert_eq!(
            budget.request_timeout(timeout, now + Duration::from_secs(4)),
            Duration::from_secs(1)
        );
        assert_eq!(
            budget.request_timeout(Duration::from_millis(300), now),
            Duration::from_millis(300)
        );
    }
}
