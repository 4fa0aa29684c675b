//! Retry policy: exponential backoff with full jitter, a cap, and two ways to give up.

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::sink::Failure;

/// When and how often a failed message is tried again.
///
/// The delay before attempt `n + 1` is a random duration in `[0, min(max_delay,
/// initial_delay × 2^(n-1))]` ("full jitter", so relays that failed together do not retry
/// together), but never less than the receiver's `retry_after`. A message is
/// dead-lettered once it has been attempted `max_attempts` times, or when the next
/// attempt would start later than `max_age` after the message was created.
///
/// ```
/// use std::time::Duration;
/// use outbox_engine::RetryPolicy;
///
/// let policy = RetryPolicy::exponential(Duration::from_millis(500), Duration::from_secs(60))
///     .max_attempts(10)
///     .max_age(Some(Duration::from_secs(24 * 3600)));
/// assert!(policy.backoff(3) <= Duration::from_secs(2));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    initial_delay: Duration,
    max_delay: Duration,
    max_attempts: u32,
    max_age: Option<Duration>,
}

impl Default for RetryPolicy {
    /// 1 s initial delay, 5 min cap, 25 attempts, 3 days maximum age.
    fn default() -> Self {
        Self {
            initial_delay: Duration::from_secs(1),
            max_delay: Duration::from_secs(300),
            max_attempts: 25,
            max_age: Some(Duration::from_secs(3 * 24 * 3600)),
        }
    }
}

/// What to do with a failed message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Try again after this delay.
    Retry(Duration),
    /// Dead-letter it with this reason.
    GiveUp(String),
}

impl RetryPolicy {
    /// Backoff from `initial`, doubling up to `max`; the attempt and age limits are the
    /// defaults.
    ///
    /// ```
    /// use std::time::Duration;
    /// use outbox_engine::RetryPolicy;
    ///
    /// let policy = RetryPolicy::exponential(Duration::from_millis(20), Duration::from_secs(1));
    /// assert!(policy.backoff(10) <= Duration::from_secs(1));
    /// assert_eq!(policy.attempt_limit(), RetryPolicy::default().attempt_limit());
    /// ```
    pub fn exponential(initial: Duration, max: Duration) -> Self {
        Self::default().initial_delay(initial).max_delay(max)
    }

    /// The base of the exponential backoff.
    pub fn initial_delay(mut self, delay: Duration) -> Self {
        self.initial_delay = delay;
        self
    }
    /// The cap on one backoff (a `retry_after` may exceed it).
    pub fn max_delay(mut self, delay: Duration) -> Self {
        self.max_delay = delay;
        self
    }
    /// Attempts before giving up (at least 1).
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts.max(1);
        self
    }
    /// Give up when a retry would start later than this after creation; `None` disables.
    pub fn max_age(mut self, age: Option<Duration>) -> Self {
        self.max_age = age;
        self
    }
    /// The configured attempt limit.
    pub fn attempt_limit(&self) -> u32 {
        self.max_attempts
    }

    /// The upper bound of the jittered backoff after `attempts` attempts.
    pub fn backoff_ceiling(&self, attempts: u32) -> Duration {
        let exp = attempts.saturating_sub(1).min(32);
        self.initial_delay
            .saturating_mul(1u32 << exp.min(31))
            .min(self.max_delay)
    }

    /// A random backoff in `[0, backoff_ceiling(attempts)]`.
    pub fn backoff(&self, attempts: u32) -> Duration {
        full_jitter(self.backoff_ceiling(attempts))
    }

    /// Decides what happens to a message that was not sent (a deferred failure): wait for
    /// the receiver's `retry_after` (or the first backoff step), unless that would pass
    /// `max_age`. Attempts are not counted.
    pub fn decide_deferred(
        &self,
        failure: &Failure,
        created_at: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Decision {
        let delay = failure.retry_after.unwrap_or_else(|| self.backoff(1));
        self.retry_within_max_age(delay, failure, created_at, now)
    }

    /// Decides what happens to a message that failed on attempt number `attempts`.
    pub fn decide(
        &self,
        failure: &Failure,
        attempts: u32,
        created_at: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Decision {
        if !failure.retryable {
            return Decision::GiveUp(failure.to_string());
        }
        if attempts >= self.max_attempts {
            return Decision::GiveUp(format!(
                "gave up after {attempts} attempts; last error: {failure}"
            ));
        }
        let delay = self
            .backoff(attempts)
            .max(failure.retry_after.unwrap_or_default());
        self.retry_within_max_age(delay, failure, created_at, now)
    }

    /// A retry after `delay`, unless it would start later than `max_age` after creation.
    fn retry_within_max_age(
        &self,
        delay: Duration,
        failure: &Failure,
        created_at: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Decision {
        if let Some(max_age) = self.max_age {
            let next = now + crate::message::chrono_duration(delay);
            if next - created_at > crate::message::chrono_duration(max_age) {
                return Decision::GiveUp(format!(
                    "gave up: next attempt would exceed max age {max_age:?}; last error: {failure}"
                ));
            }
        }
        Decision::Retry(delay)
    }
}

/// A wait drawn uniformly from `[0, ceiling]` ("full jitter"): every backoff of the
/// outbox (message retries, store errors, reconnects, route pauses) draws its wait this
/// way, so processes that failed together do not retry together.
///
/// ```
/// use std::time::Duration;
/// use outbox_engine::full_jitter;
///
/// let wait = full_jitter(Duration::from_secs(2));
/// assert!(wait <= Duration::from_secs(2));
/// assert_eq!(full_jitter(Duration::ZERO), Duration::ZERO);
/// ```
pub fn full_jitter(ceiling: Duration) -> Duration {
    let nanos = ceiling.as_nanos().min(u128::from(u64::MAX)) as u64;
    Duration::from_nanos(fastrand::u64(0..=nanos))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sink::FailureClass;

    fn retryable() -> Failure {
        Failure::retryable(FailureClass::Unavailable, "503")
    }

    #[test]
    fn backoff_grows_exponentially_up_to_the_cap() {
        let p = RetryPolicy::default()
            .initial_delay(Duration::from_millis(100))
            .max_delay(Duration::from_secs(1));
        assert_eq!(p.backoff_ceiling(1), Duration::from_millis(100));
        assert_eq!(p.backoff_ceiling(2), Duration::from_millis(200));
        assert_eq!(p.backoff_ceiling(4), Duration::from_millis(800));
        assert_eq!(p.backoff_ceiling(5), Duration::from_secs(1));
        assert_eq!(p.backoff_ceiling(u32::MAX), Duration::from_secs(1));
        for attempt in 1..40 {
            assert!(p.backoff(attempt) <= p.backoff_ceiling(attempt));
        }
    }

    #[test]
    fn jitter_spreads_delays() {
        let p = RetryPolicy::default();
        let delays: std::collections::HashSet<_> = (0..50).map(|_| p.backoff(10)).collect();
        assert!(delays.len() > 40, "full jitter should rarely repeat");
    }

    #[test]
    fn honours_retry_after_even_above_the_cap() {
        let p = RetryPolicy::default().max_delay(Duration::from_secs(1));
        let f = retryable().with_retry_after(Duration::from_secs(120));
        let now = Utc::now();
        assert_eq!(
            p.decide(&f, 1, now, now),
            Decision::Retry(Duration::from_secs(120))
        );
    }

    #[test]
    fn gives_up_on_permanent_exhausted_and_old() {
        let now = Utc::now();
        let p = RetryPolicy::default()
            .max_attempts(3)
            .max_age(Some(Duration::from_secs(60)));
        let permanent = Failure::permanent(FailureClass::Rejected, "400 bad phone");
        assert!(
            matches!(p.decide(&permanent, 1, now, now), Decision::GiveUp(r) if r.contains("400 bad phone"))
        );
        assert!(matches!(
            p.decide(&retryable(), 2, now, now),
            Decision::Retry(_)
        ));
        assert!(
            matches!(p.decide(&retryable(), 3, now, now), Decision::GiveUp(r) if r.contains("3 attempts"))
        );
        let old = now - chrono::Duration::seconds(61);
        assert!(
            matches!(p.decide(&retryable(), 1, old, now), Decision::GiveUp(r) if r.contains("max age"))
        );
        let no_age = p.max_age(None);
        assert!(matches!(
            no_age.decide(&retryable(), 1, old, now),
            Decision::Retry(_)
        ));
    }
}
