//! A per-endpoint circuit breaker, plus the pause an endpoint asks for with `Retry-After`.
//!
//! - **Closed**: requests flow; each retryable failure of a request (connection error,
//!   timeout, 408/425/429/5xx, a temporary redirect) adds one to a counter, any other
//!   answer resets it. At [`CircuitConfig::failures`] consecutive failures the circuit
//!   opens.
//! - **Open** for [`CircuitConfig::cool_down`]: no request is made; each message fails
//!   retryably with class `Unavailable` and a retry-after of the time left.
//! - **Half-open** after the cool-down: one request (the probe) goes through while the
//!   others still fail fast. A probe that succeeds closes the circuit; one that fails
//!   opens it for another cool-down.
//!
//! Separately, a `Retry-After` on a retryable answer pauses the whole endpoint until
//! then (capped by the sink's `max_retry_after`): one 429 stops the rest of the batch
//! from hammering a throttled API.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde::Deserialize;
use tokio::time::Instant;

use crate::config::duration;

/// Circuit breaker settings for one endpoint.
///
/// ```
/// use std::time::Duration;
/// use outbox_sink_http::CircuitConfig;
///
/// let circuit = CircuitConfig::default().failures(10).cool_down(Duration::from_secs(60));
/// assert_eq!(circuit.failures, 10);
/// assert!(CircuitConfig::disabled().failures == 0);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct CircuitConfig {
    /// Consecutive failures that open the circuit; `0` disables the breaker. Default 5.
    pub failures: u32,
    /// How long the circuit stays open before a probe is let through. Default 30 s.
    #[serde(with = "duration")]
    pub cool_down: Duration,
}

impl Default for CircuitConfig {
    fn default() -> Self {
        Self {
            failures: 5,
            cool_down: Duration::from_secs(30),
        }
    }
}

impl CircuitConfig {
    /// A breaker that never opens.
    pub fn disabled() -> Self {
        Self {
            failures: 0,
            ..Self::default()
        }
    }

    /// Sets the consecutive failures that open the circuit (`0` disables it).
    #[must_use]
    pub fn failures(mut self, n: u32) -> Self {
        self.failures = n;
        self
    }

    /// Sets how long the circuit stays open.
    #[must_use]
    pub fn cool_down(mut self, cool_down: Duration) -> Self {
        self.cool_down = cool_down;
        self
    }
}

/// The state of an endpoint's circuit, as [`HttpSink::health`](crate::HttpSink::health)
/// reports it.
///
/// ```
/// use outbox_sink_http::{CircuitState, EndpointConfig, HttpSinkConfig};
///
/// let sink = HttpSinkConfig::new()
///     .route("orders", EndpointConfig::new("https://hooks.example.com/"))
///     .build()?;
/// // A fresh endpoint takes requests.
/// assert_eq!(sink.health("orders").map(|h| h.circuit), Some(CircuitState::Closed));
/// # Ok::<(), outbox_sink_http::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CircuitState {
    /// Requests flow.
    Closed,
    /// No requests until the cool-down has passed.
    Open,
    /// The cool-down has passed; the next request is a probe.
    HalfOpen,
}

/// A snapshot of an endpoint's health.
///
/// ```no_run
/// # fn show(sink: &outbox_sink_http::HttpSink) {
/// if let Some(health) = sink.health("orders") {
///     println!("{:?}, {} consecutive failures", health.circuit, health.consecutive_failures);
/// }
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct EndpointHealth {
    /// The circuit state.
    pub circuit: CircuitState,
    /// Retryable failures in a row since the last healthy answer.
    pub consecutive_failures: u32,
    /// How long the endpoint stays closed to requests: the open circuit's cool-down or
    /// a `Retry-After` pause, whichever ends later.
    pub paused_for: Option<Duration>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Closed,
    Open { until: Instant },
    HalfOpen { probing: bool },
}

#[derive(Debug)]
struct Inner {
    state: State,
    consecutive: u32,
    paused_until: Option<Instant>,
}

/// Why a request may not be made now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The circuit is open (or half-open with its probe in flight).
    Open { retry_after: Duration },
    /// The endpoint asked to wait (`Retry-After`).
    Paused { retry_after: Duration },
}

#[derive(Debug, Clone)]
pub(crate) struct Circuit {
    config: CircuitConfig,
    inner: Arc<Mutex<Inner>>,
}

/// Leave to make one request. Report its result with [`Admission::record`]; an admission
/// dropped without a report (the request was never made or was cut short) gives a
/// half-open circuit's probe slot back.
#[derive(Debug)]
pub(crate) struct Admission {
    circuit: Circuit,
    probe: bool,
    done: bool,
}

impl Circuit {
    pub(crate) fn new(config: CircuitConfig) -> Self {
        Self {
            config,
            inner: Arc::new(Mutex::new(Inner {
                state: State::Closed,
                consecutive: 0,
                paused_until: None,
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // The state is a few plain fields; a panic elsewhere cannot leave it inconsistent.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a request could be made now, without taking the probe slot.
    pub(crate) fn check(&self, now: Instant) -> Result<(), Refusal> {
        let inner = self.lock();
        Self::refusal(&self.config, &inner, now).map_or(Ok(()), Err)
    }

    fn refusal(config: &CircuitConfig, inner: &Inner, now: Instant) -> Option<Refusal> {
        match inner.state {
            State::Open { until } if now < until => {
                return Some(Refusal::Open {
                    retry_after: until - now,
                });
            }
            State::HalfOpen { probing: true } => {
                return Some(Refusal::Open {
                    retry_after: config.cool_down,
                });
            }
            _ => {}
        }
        match inner.paused_until {
            Some(until) if now < until => Some(Refusal::Paused {
                retry_after: until - now,
            }),
            _ => None,
        }
    }

    /// Takes leave to make a request now; in a half-open circuit only one caller gets it.
    pub(crate) fn admit(&self, now: Instant) -> Result<Admission, Refusal> {
        let mut inner = self.lock();
        if let Some(refusal) = Self::refusal(&self.config, &inner, now) {
            return Err(refusal);
        }
        let probe = match inner.state {
            State::Closed => false,
            State::Open { .. } | State::HalfOpen { .. } => {
                inner.state = State::HalfOpen { probing: true };
                true
            }
        };
        Ok(Admission {
            circuit: self.clone(),
            probe,
            done: false,
        })
    }

    /// Pauses the endpoint for `delay` (from a `Retry-After`), unless already paused longer.
    pub(crate) fn pause(&self, now: Instant, delay: Duration) {
        if delay.is_zero() {
            return;
        }
        let mut inner = self.lock();
        let until = now + delay;
        if inner.paused_until.is_none_or(|current| current < until) {
            inner.paused_until = Some(until);
        }
    }

    pub(crate) fn health(&self, now: Instant) -> EndpointHealth {
        let inner = self.lock();
        let (circuit, open_for) = match inner.state {
            State::Closed => (CircuitState::Closed, None),
            State::Open { until } if now < until => (CircuitState::Open, Some(until - now)),
            State::Open { .. } | State::HalfOpen { .. } => (CircuitState::HalfOpen, None),
        };
        let paused = inner
            .paused_until
            .filter(|until| now < *until)
            .map(|until| until - now);
        EndpointHealth {
            circuit,
            consecutive_failures: inner.consecutive,
            paused_for: open_for.max(paused),
        }
    }
}

impl Admission {
    /// Records the request's result: `healthy` for any answer that says the endpoint works
    /// (2xx, permanent refusals), `false` for a retryable failure.
    pub(crate) fn record(mut self, healthy: bool, now: Instant) -> Option<CircuitState> {
        self.done = true;
        let config = &self.circuit.config;
        let mut inner = self.circuit.lock();
        let before = inner.state;
        if healthy {
            inner.consecutive = 0;
            inner.state = State::Closed;
        } else {
            inner.consecutive = inner.consecutive.saturating_add(1);
            let trips = config.failures > 0 && inner.consecutive >= config.failures;
            if self.probe || (trips && inner.state == State::Closed) {
                inner.state = State::Open {
                    until: now + config.cool_down,
                };
            }
        }
        let after = inner.state;
        let changed = std::mem::discriminant(&before) != std::mem::discriminant(&after);
        changed.then_some(match after {
            State::Closed => CircuitState::Closed,
            State::Open { .. } => CircuitState::Open,
            State::HalfOpen { .. } => CircuitState::HalfOpen,
        })
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        if self.probe && !self.done {
            let mut inner = self.circuit.lock();
            if inner.state == (State::HalfOpen { probing: true }) {
                inner.state = State::HalfOpen { probing: false };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn circuit(failures: u32) -> Circuit {
        Circuit::new(
            CircuitConfig::default()
                .failures(failures)
                .cool_down(Duration::from_secs(10)),
        )
    }

    #[test]
    fn opens_after_consecutive_failures_and_resets_on_success() {
        let c = circuit(3);
        let t = Instant::now();
        c.admit(t).unwrap().record(false, t);
        c.admit(t).unwrap().record(false, t);
        c.admit(t).unwrap().record(true, t);
        c.admit(t).unwrap().record(false, t);
        c.admit(t).unwrap().record(false, t);
        assert_eq!(c.health(t).circuit, CircuitState::Closed);
        assert_eq!(
            c.admit(t).unwrap().record(false, t),
            Some(CircuitState::Open)
        );
        assert_eq!(
            c.check(t + Duration::from_secs(4)),
            Err(Refusal::Open {
                retry_after: Duration::from_secs(6)
            })
        );
        assert!(c.admit(t + Duration::from_secs(4)).is_err());
    }

    #[test]
    fn half_open_lets_one_probe_through() {
        let c = circuit(1);
        let t = Instant::now();
        c.admit(t).unwrap().record(false, t);
        let later = t + Duration::from_secs(10);
        assert_eq!(c.health(later).circuit, CircuitState::HalfOpen);
        let probe = c.admit(later).unwrap();
        assert!(matches!(c.admit(later), Err(Refusal::Open { .. })));
        // A probe that fails opens the circuit again for a full cool-down.
        assert_eq!(probe.record(false, later), Some(CircuitState::Open));
        assert!(c.admit(later + Duration::from_secs(9)).is_err());
        let probe = c.admit(later + Duration::from_secs(10)).unwrap();
        assert_eq!(probe.record(true, later), Some(CircuitState::Closed));
        assert_eq!(c.health(later).consecutive_failures, 0);
    }

    #[test]
    fn an_unused_probe_gives_its_slot_back() {
        let c = circuit(1);
        let t = Instant::now();
        c.admit(t).unwrap().record(false, t);
        let later = t + Duration::from_secs(11);
        drop(c.admit(later).unwrap());
        assert!(c.admit(later).is_ok());
    }

    #[test]
    fn disabled_never_opens_and_pause_blocks_until_it_ends() {
        let c = circuit(0);
        let t = Instant::now();
        for _ in 0..100 {
            c.admit(t).unwrap().record(false, t);
        }
        assert_eq!(c.health(t).circuit, CircuitState::Closed);
        c.pause(t, Duration::from_secs(5));
        c.pause(t, Duration::from_secs(1));
        assert_eq!(
            c.check(t + Duration::from_secs(2)),
            Err(Refusal::Paused {
                retry_after: Duration::from_secs(3)
            })
        );
        assert!(c.check(t + Duration::from_secs(5)).is_ok());
    }
}
