//! The rate-limit layer: a token bucket per route (GCRA: a theoretical arrival time).

use std::sync::Mutex;
use std::time::Duration;

use futures_util::future::join_all;
use serde::Deserialize;
use tokio::time::Instant;

use crate::message::Message;
use crate::sink::{Failure, FailureClass, Outcomes, PublishContext, ReportingSink, Sink};

/// A rate limit: `per_second` messages a second on average, up to `burst` at once.
///
/// ```
/// use std::time::Duration;
/// use outbox_engine::layers::RateLimit;
///
/// let limit = RateLimit::per_second(80.0).burst(20).max_wait(Duration::from_secs(2));
/// assert_eq!(limit.burst, 20);
/// assert!(RateLimit::per_second(0.0).validate().is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct RateLimit {
    /// Average messages per second (above 0, at most 1,000,000).
    pub per_second: f64,
    /// Messages that may go at once after a quiet spell (at least 1; default 1).
    #[serde(default = "default_burst")]
    pub burst: u32,
    /// The longest a message waits for its slot within a publish call (default 5 s);
    /// one that would wait longer is not sent and is retried after that wait.
    #[serde(default = "default_max_wait", with = "crate::duration")]
    pub max_wait: Duration,
}

fn default_burst() -> u32 {
    1
}

fn default_max_wait() -> Duration {
    Duration::from_secs(5)
}

impl RateLimit {
    /// `n` messages a second, no burst.
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

    /// Checks the values.
    ///
    /// # Errors
    ///
    /// What is out of range.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.per_second > 0.0 && self.per_second <= 1_000_000.0) {
            return Err(format!(
                "per_second must be above 0 and at most 1000000, got {}",
                self.per_second
            ));
        }
        if self.burst == 0 {
            return Err("burst must be at least 1".to_owned());
        }
        Ok(())
    }
}

/// Slots at a steady interval with a burst tolerance. `reserve` never waits: it hands
/// out the instant the caller may go, or refuses when that is too far away.
#[derive(Debug)]
struct Limiter {
    interval: Duration,
    tolerance: Duration,
    max_wait: Duration,
    /// The theoretical arrival time of the next message.
    tat: Mutex<Option<Instant>>,
}

impl Limiter {
    fn new(limit: &RateLimit) -> Self {
        let interval = Duration::from_secs_f64(1.0 / limit.per_second);
        Self {
            interval,
            tolerance: interval * (limit.burst.max(1) - 1),
            max_wait: limit.max_wait,
            tat: Mutex::new(None),
        }
    }

    /// The slot for one message, if it comes within `max_wait` and `limit`; otherwise the
    /// wait it would have had, and nothing is taken.
    fn reserve(&self, now: Instant, limit: Duration) -> Result<Instant, Duration> {
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

/// Sends at most the configured rate: each message waits for its slot (messages whose
/// slots coincide go together), and a message whose slot would come after `max_wait` or
/// the deadline is not sent; it fails retryably, deferred, with the wait as retry-after.
#[derive(Debug)]
pub struct RateLimited<S> {
    inner: S,
    limiter: Limiter,
}

impl<S> RateLimited<S> {
    /// Wraps `inner`.
    ///
    /// # Panics
    ///
    /// If `limit` is invalid ([`RateLimit::validate`]). Settings from a file are
    /// validated before, with an error.
    pub fn new(inner: S, limit: RateLimit) -> Self {
        if let Err(reason) = limit.validate() {
            panic!("invalid rate limit: {reason}");
        }
        Self {
            inner,
            limiter: Limiter::new(&limit),
        }
    }
}

impl<S: Sink> ReportingSink for RateLimited<S> {
    async fn publish_each(&self, batch: &[Message], cx: &PublishContext, outcomes: &Outcomes) {
        let now = Instant::now();
        let mut groups: Vec<(Instant, Vec<usize>)> = Vec::new();
        for index in 0..batch.len() {
            match self.limiter.reserve(now, cx.remaining()) {
                Ok(slot) => match groups.last_mut() {
                    Some((at, members)) if *at == slot => members.push(index),
                    _ => groups.push((slot, vec![index])),
                },
                Err(wait) => outcomes.report(
                    index,
                    Failure::retryable(
                        FailureClass::RateLimited,
                        format!(
                            "not sent: the route's rate limit has no slot for another {wait:?}"
                        ),
                    )
                    .with_retry_after(wait)
                    .deferred()
                    .into(),
                ),
            }
        }
        let whole = groups.len() == 1 && groups[0].1.len() == batch.len();
        join_all(groups.into_iter().map(|(slot, members)| async move {
            tokio::time::sleep_until(slot).await;
            if let Some(reason) = cx.stopped() {
                let failure =
                    Failure::retryable(FailureClass::Unavailable, format!("not sent: {reason}"))
                        .deferred();
                for index in members {
                    outcomes.report(index, failure.clone().into());
                }
            } else if whole {
                self.inner.publish_reporting(batch, cx, outcomes).await;
            } else {
                let part: Vec<Message> = members.iter().map(|&i| batch[i].clone()).collect();
                self.inner
                    .publish_reporting(&part, cx, &outcomes.mapped(members))
                    .await;
            }
        }))
        .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FOREVER: Duration = Duration::from_secs(3600);

    #[test]
    fn burst_then_steady_interval() {
        let limiter = Limiter::new(&RateLimit::per_second(10.0).burst(3));
        let t = Instant::now();
        let slots: Vec<_> = (0..6)
            .map(|_| limiter.reserve(t, FOREVER).unwrap() - t)
            .collect();
        let ms = Duration::from_millis;
        assert_eq!(slots, [ms(0), ms(0), ms(0), ms(100), ms(200), ms(300)]);
    }

    #[test]
    fn refills_while_idle_but_not_beyond_the_burst() {
        let limiter = Limiter::new(&RateLimit::per_second(10.0).burst(2));
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
        let limiter = Limiter::new(&RateLimit::per_second(1.0).max_wait(Duration::from_secs(2)));
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
        assert_eq!(
            limiter.reserve(t + Duration::from_secs(1), FOREVER),
            Ok(t + Duration::from_secs(3))
        );
    }
}
