//! Policies that wrap any [`Sink`]: a rate limit, a circuit breaker, a concurrency cap
//! and a timeout. Each is a small sink of its own around an inner one, added with a
//! [`SinkExt`] method, so a Kafka, SQS, Redis or HTTP route gets them alike, in code or
//! from a route's settings ([`RoutePolicy`]).
//!
//! ```
//! use std::time::Duration;
//! use outbox_engine::layers::{CircuitConfig, RateLimit, SinkExt};
//! use outbox_engine::testkit::RecordingSink;
//!
//! let sink = RecordingSink::new()
//!     .rate_limited(RateLimit::per_second(80.0).burst(20))
//!     .circuit_breaker(CircuitConfig::default())
//!     .concurrency_limit(4)
//!     .timeout(Duration::from_secs(10));
//! # let _ = sink;
//! ```
//!
//! Messages a policy keeps from being sent (no rate slot before the deadline, an open
//! circuit, a full concurrency cap) fail retryably and [deferred](crate::Failure::deferred):
//! the attempt does not count, so an endpoint that is down for hours cannot exhaust
//! `max_attempts`.

mod circuit;
mod concurrency;
mod rate;
mod timeout;

use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

pub use circuit::{CircuitBreaker, CircuitConfig, CircuitState, Health, MAX_THROTTLE_PAUSE};
pub use concurrency::ConcurrencyLimit;
pub use rate::{RateLimit, RateLimited};
pub use timeout::Timeout;

use crate::sink::{DynSink, Sink};

/// Wrapping methods for every sink.
pub trait SinkExt: Sink + Sized {
    /// At most `limit.per_second` messages a second, in bursts of `limit.burst`.
    ///
    /// # Panics
    ///
    /// If `limit` is invalid ([`RateLimit::validate`]).
    fn rate_limited(self, limit: RateLimit) -> RateLimited<Self> {
        RateLimited::new(self, limit)
    }

    /// Stops sending after consecutive failures, for a cool-down; honours `Retry-After`.
    ///
    /// # Panics
    ///
    /// If `config` is invalid ([`CircuitConfig::validate`]).
    fn circuit_breaker(self, config: CircuitConfig) -> CircuitBreaker<Self> {
        CircuitBreaker::new(self, config)
    }

    /// At most `calls` publish calls in flight at once.
    fn concurrency_limit(self, calls: usize) -> ConcurrencyLimit<Self> {
        ConcurrencyLimit::new(self, calls)
    }

    /// A publish call gets at most `timeout`, or less when the relay's deadline is nearer.
    fn timeout(self, timeout: Duration) -> Timeout<Self> {
        Timeout::new(self, timeout)
    }
}

impl<S: Sink> SinkExt for S {}

/// The policies of one route, as a route's settings give them; each is off when absent,
/// except that a route without a circuit breaker still honours the receiver's pauses
/// ([`CircuitBreaker::pause_only`]).
///
/// ```toml
/// [routes.billing]
/// url = "https://billing.example.com/hooks"
/// rate_limit = { per_second = 80, burst = 20 }
/// circuit = { failures = 5, cool_down = "30s" }
/// concurrency = 4
/// timeout = "10s"
/// ```
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct RoutePolicy {
    /// Messages per second and burst.
    pub rate_limit: Option<RateLimit>,
    /// Circuit breaker.
    pub circuit: Option<CircuitConfig>,
    /// Publish calls in flight at once.
    pub concurrency: Option<usize>,
    /// Longest publish call.
    #[serde(with = "crate::duration::optional")]
    pub timeout: Option<Duration>,
}

/// The keys of [`RoutePolicy`] in a route's settings; the rest belongs to the sink.
pub const POLICY_KEYS: &[&str] = &["rate_limit", "circuit", "concurrency", "timeout"];

impl RoutePolicy {
    /// Checks the values.
    ///
    /// # Errors
    ///
    /// The setting that is out of range and why.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(rate) = &self.rate_limit {
            rate.validate().map_err(|e| format!("rate_limit: {e}"))?;
        }
        if let Some(circuit) = &self.circuit {
            circuit.validate().map_err(|e| format!("circuit: {e}"))?;
        }
        if self.concurrency.is_some_and(|n| !(1..=1024).contains(&n)) {
            return Err("concurrency: must be 1 to 1024".to_owned());
        }
        if self.timeout.is_some_and(|t| t.is_zero()) {
            return Err("timeout: must be above zero".to_owned());
        }
        Ok(())
    }

    /// Wraps the sink of `route` in the configured policies: the timeout outermost, then
    /// the concurrency cap, the circuit breaker (or the receiver's pauses alone) and the
    /// rate limit next to the sink.
    pub fn apply(&self, route: &str, sink: Arc<dyn DynSink>) -> Arc<dyn DynSink> {
        let mut sink = sink;
        if let Some(rate) = &self.rate_limit {
            sink = Arc::new(sink.rate_limited(rate.clone()));
        }
        sink = match &self.circuit {
            Some(circuit) => Arc::new(sink.circuit_breaker(circuit.clone()).named(route)),
            None => Arc::new(CircuitBreaker::pause_only(sink).named(route)),
        };
        if let Some(calls) = self.concurrency {
            sink = Arc::new(sink.concurrency_limit(calls));
        }
        if let Some(timeout) = self.timeout {
            sink = Arc::new(sink.timeout(timeout));
        }
        sink
    }
}
