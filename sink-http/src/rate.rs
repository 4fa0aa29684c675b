//! A per-endpoint token bucket, kept as a single "theoretical arrival time" (GCRA).
//!
//! With a rate of `r` requests per second and a burst of `b`, up to `b` requests may go
//! at once after a quiet period, and from then on one every `1/r` seconds; over any
//! window of `t` seconds at most `b + r·t` requests start. Each request *reserves* its
//! slot under a short lock and then sleeps until the slot, so waiting requests go in
//! the order they asked and the slots never drift.
//!
//! A request whose slot is further away than `max_wait` (or past the sink's publish
//! deadline) takes no slot and is not sent: it fails retryably with class
//! `RateLimited` and a retry-after of the wait it would have had.

use std::sync::Mutex;
use std::time::Duration;

use serde::Deserialize;
use tokio::time::Instant;

use crate::config::duration;

/// A token-bucket rate limit for one endpoint.
///
/// ```
/// use std::time::Duration;
/// use outbox_sink_http::RateLimit;
///
/// // A messaging API that allows 80 requests per second.
/// let limit = RateLimit::per_second(80.0).burst(10).max_wait(Duration::from_secs(2));
/// assert_eq!(limit.burst, 10);
/// ```
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct RateLimit {
    /// Sustained requests per second (> 0, at most 1,000,000).
    pub per_second: f64,
    /// Requests that may go at once after a quiet period (≥ 1). Default 1.
    #[serde(default = "default_burst")]
    pub burst: u32,
    /// Longest a message waits for its slot inside one publish; a message whose slot is
    /// further away is not sent and is retried later. Default 5 s.
    #[serde(default = "default_max_wait", with = "duration")]
    pub max_wait: Duration,
}

fn default_burst() -> u32 {
    1
}

fn default_max_wait() -> Duration {
    Duration::from_secs(5)
}

impl RateLimit {
    /// `n` requests per second, burst 1, waiting at most 5 s.
    pub fn per_second(n: f64) -> Self {
        Self {
            per_second: n,
            burst: default_burst(),
            max_wait: default_max_wait(),
        }
    }

    /// Sets the burst.
    #[must_use]
    pub fn burst(mut self, burst: u32) -> Self {
        self.burst = burst;
        self
    }

    /// Sets the longest wait for a slot.
    #[must_use]
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.max_wait = max_wait;
        self
    }

    pub(crate) fn validate(&self) -> Result<(), String> {
        if !(self.per_second > 0.0 && self.per_second <= 1_000_000.0) {
            return Err(format!(
                "per_second must be > 0 and at most 1000000, got {}",
                self.per_second
            ));
        }
        if self.burst == 0 {
            return Err("burst must be at least 1".to_owned());
        }
        Ok(())
    }
}

#[derive(Debug)]
pub(crate) struct RateLimiter {
    interval: Duration,
    tolerance: Duration,
    max_wait: Duration,
    /// When the bucket would be empty again if every reserved slot were used.
    tat: Mutex<Option<Instant>>,
}

impl RateLimiter {
    pub(crate) fn new(limit: &RateLimit) -> Self {
        let interval = Duration::from_secs_f64(1.0 / limit.per_second);
        Self {
            interval,
            tolerance: interval * (limit.burst - 1),
            max_wait: limit.max_wait,
            tat: Mutex::new(None),
        }
    }

    /// Reserves the next slot and returns when it starts, or, when that is more than
    /// `max_wait` (and `limit`) away, reserves nothing and returns the wait.
    pub(crate) fn reserve(&self, now: Instant, limit: Duration) -> Result<Instant, Duration> {
        let mut tat = self.tat.lock().unwrap_or_else(|e| e.into_inner());
        let base = tat.map_or(now, |t| t.max(now));
        let slot = base.checked_sub(self.tolerance).map_or(now, |s| s.max(now));
        let wait = slot - now;
        if wait > self.max_wait.min(limit) {
            return Err(wait);
        }
        *tat = Some(base + self.interval);
        Ok(slot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FOREVER: Duration = Duration::from_secs(3600);

    #[test]
    fn burst_then_steady_interval() {
        let limiter = RateLimiter::new(&RateLimit::per_second(10.0).burst(3));
        let t = Instant::now();
        let slots: Vec<_> = (0..6)
            .map(|_| limiter.reserve(t, FOREVER).unwrap() - t)
            .collect();
        let ms = |n| Duration::from_millis(n);
        assert_eq!(slots, [ms(0), ms(0), ms(0), ms(100), ms(200), ms(300)]);
    }

    #[test]
    fn refills_while_idle_but_not_beyond_the_burst() {
        let limiter = RateLimiter::new(&RateLimit::per_second(10.0).burst(2));
        let t = Instant::now();
        for _ in 0..2 {
            limiter.reserve(t, FOREVER).unwrap();
        }
        let later = t + Duration::from_secs(60);
        assert_eq!(limiter.reserve(later, FOREVER), Ok(later));
        assert_eq!(limiter.reserve(later, FOREVER), Ok(later));
        assert_eq!(
            limiter.reserve(later, FOREVER),
            Ok(later + Duration::from_millis(100))
        );
    }

    #[test]
    fn refuses_slots_beyond_max_wait_without_taking_them() {
        let limiter =
            RateLimiter::new(&RateLimit::per_second(1.0).max_wait(Duration::from_secs(2)));
        let t = Instant::now();
        for expected in 0..3 {
            assert_eq!(
                limiter.reserve(t, FOREVER),
                Ok(t + Duration::from_secs(expected))
            );
        }
        assert_eq!(limiter.reserve(t, FOREVER), Err(Duration::from_secs(3)));
        assert_eq!(
            limiter.reserve(t, Duration::from_millis(500)),
            Err(Duration::from_secs(3))
        );
        // Nothing was taken by the refusals.
        assert_eq!(
            limiter.reserve(t + Duration::from_secs(1), FOREVER),
            Ok(t + Duration::from_secs(3))
        );
    }

    #[test]
    fn validation() {
        assert!(RateLimit::per_second(0.0).validate().is_err());
        assert!(RateLimit::per_second(f64::NAN).validate().is_err());
        assert!(RateLimit::per_second(5.0).burst(0).validate().is_err());
        assert!(RateLimit::per_second(0.5).validate().is_ok());
    }
}
