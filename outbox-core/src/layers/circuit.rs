//! The circuit-breaker layer, plus the pause a receiver asks for with a retry-after.
//!
//! - **Closed**: messages flow; each retryable failure of a sent message adds one to a
//!   counter, any other answer (published, or a permanent refusal: the receiver works)
//!   resets it. At [`CircuitConfig::failures`] consecutive failures the circuit opens.
//! - **Open** for [`CircuitConfig::cool_down`]: nothing is sent; each message fails
//!   retryably, deferred, with class `unavailable` and a retry-after of the time left.
//! - **Half-open** after the cool-down: one message (the probe) goes through while the
//!   others still fail fast. A probe that succeeds closes the circuit; one that fails
//!   opens it for another cool-down.
//!
//! Separately, the receiver's pauses: a retryable failure with a retry-after (HTTP
//! `Retry-After`, say) pauses the whole route until then, and a throttle without one
//! (class `RateLimited`, or marked [`overloaded`](crate::Failure::overloaded): HTTP 429
//! and 503) for 1 s, doubling with each throttle in a row up to
//! [`MAX_THROTTLE_PAUSE`]. When a pause ends, one message goes first as a probe; the
//! others wait for its answer. [`CircuitBreaker::pause_only`] keeps only this part, and
//! route policies apply it to every route that has no circuit breaker. When the circuit
//! opens or a pause starts in the middle of a call, the inner sink's
//! [context](crate::PublishContext::stopped) is stopped, so a sink that sends message by
//! message sends no more of the batch.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde::Deserialize;
use tokio::time::Instant;
use tracing::{info, warn};

use crate::message::Message;
use crate::sink::{Failure, FailureClass, Outcome, Outcomes, PublishContext, ReportingSink, Sink};

/// The longest pause a throttle without a retry-after starts.
pub const MAX_THROTTLE_PAUSE: Duration = Duration::from_secs(60);

/// How long a message waits while a pause's probe is out.
const PROBE_WAIT: Duration = Duration::from_secs(1);

/// Circuit breaker settings.
///
/// ```
/// use std::time::Duration;
/// use outbox_engine::layers::CircuitConfig;
///
/// let circuit = CircuitConfig::default().failures(10).cool_down(Duration::from_secs(60));
/// assert_eq!(circuit.failures, 10);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct CircuitConfig {
    /// Consecutive failures that open the circuit (at least 1). Default 5.
    pub failures: u32,
    /// How long the circuit stays open before a probe is let through. Default 30 s.
    #[serde(with = "crate::duration")]
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
    /// Sets the consecutive failures that open the circuit.
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

    /// Checks the values.
    ///
    /// # Errors
    ///
    /// What is out of range.
    pub fn validate(&self) -> Result<(), String> {
        if self.failures == 0 {
            return Err(
                "failures must be at least 1 (leave `circuit` out to have none)".to_owned(),
            );
        }
        if self.cool_down.is_zero() {
            return Err("cool_down must be above zero".to_owned());
        }
        Ok(())
    }
}

/// The state of a circuit, as [`CircuitBreaker::health`] reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CircuitState {
    /// Messages flow.
    Closed,
    /// Nothing is sent until the cool-down has passed.
    Open,
    /// The cool-down has passed; the next message is a probe.
    HalfOpen,
}

/// A snapshot of a route's health.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Health {
    /// The circuit state.
    pub circuit: CircuitState,
    /// Retryable failures in a row since the last healthy answer.
    pub consecutive_failures: u32,
    /// How long the route stays closed to messages: the open circuit's cool-down or a
    /// retry-after pause, whichever ends later.
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
    /// After a pause, one message goes first: `Some(false)` until it is admitted,
    /// `Some(true)` while it is out, `None` once the receiver answered it.
    pause_probe: Option<bool>,
    /// Throttles without a retry-after in a row.
    throttles: u32,
    /// The last failure the receiver answered with, so a refusal names the real cause.
    last_failure: Option<String>,
}

/// Why a message may not be sent now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    /// The circuit is open (or half-open with its probe in flight).
    Open { retry_after: Duration },
    /// The receiver asked to wait.
    Paused { retry_after: Duration },
}

#[derive(Debug, Clone)]
struct Breaker {
    config: CircuitConfig,
    /// False for [`CircuitBreaker::pause_only`]: the circuit never opens.
    opens: bool,
    inner: Arc<Mutex<Inner>>,
}

/// Leave to send one message. Report its result with [`Admission::record`]; an admission
/// dropped without a report (the message was never sent) gives a probe slot back.
#[derive(Debug)]
struct Admission {
    breaker: Breaker,
    probe: bool,
    pause_probe: bool,
    done: bool,
}

impl Breaker {
    fn new(config: CircuitConfig, opens: bool) -> Self {
        Self {
            config,
            opens,
            inner: Arc::new(Mutex::new(Inner {
                state: State::Closed,
                consecutive: 0,
                paused_until: None,
                pause_probe: None,
                throttles: 0,
                last_failure: None,
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A few plain fields; a panic elsewhere cannot leave them inconsistent.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn refusal(&self, inner: &Inner, now: Instant) -> Option<Refusal> {
        match inner.state {
            State::Open { until } if now < until => {
                return Some(Refusal::Open {
                    retry_after: until - now,
                });
            }
            State::HalfOpen { probing: true } => {
                return Some(Refusal::Open {
                    retry_after: self.config.cool_down,
                });
            }
            _ => {}
        }
        match inner.paused_until {
            Some(until) if now < until => Some(Refusal::Paused {
                retry_after: until - now,
            }),
            _ if inner.pause_probe == Some(true) => Some(Refusal::Paused {
                retry_after: PROBE_WAIT,
            }),
            _ => None,
        }
    }

    /// Takes leave to send one message now; in a half-open circuit only one gets it.
    fn admit(&self, now: Instant) -> Result<Admission, Refusal> {
        let mut inner = self.lock();
        if let Some(refusal) = self.refusal(&inner, now) {
            return Err(refusal);
        }
        let probe = match inner.state {
            State::Closed => false,
            State::Open { .. } | State::HalfOpen { .. } => {
                inner.state = State::HalfOpen { probing: true };
                true
            }
        };
        let pause_probe = inner.pause_probe == Some(false);
        if pause_probe {
            inner.pause_probe = Some(true);
        }
        Ok(Admission {
            breaker: self.clone(),
            probe,
            pause_probe,
            done: false,
        })
    }

    /// Remembers the receiver's failure, for the refusals that follow it.
    fn remember(&self, failure: &Failure) {
        self.lock().last_failure = Some(failure.to_string());
    }

    /// The receiver's last failure, if any.
    fn last_failure(&self) -> Option<String> {
        self.lock().last_failure.clone()
    }

    /// The pause a throttle without a retry-after asks for: while the route is paused,
    /// what is left of the pause (the answers of one wave count once); else 1 s, doubled
    /// for each pause in a row before it, at most [`MAX_THROTTLE_PAUSE`].
    fn throttled(&self, now: Instant) -> Duration {
        let mut inner = self.lock();
        if let Some(until) = inner.paused_until.filter(|until| now < *until) {
            return until - now;
        }
        let doublings = inner.throttles.min(6);
        inner.throttles = inner.throttles.saturating_add(1);
        (Duration::from_secs(1) * 2u32.pow(doublings)).min(MAX_THROTTLE_PAUSE)
    }

    /// Pauses the route for `delay`, unless already paused longer; true when the route
    /// was not paused before.
    fn pause(&self, now: Instant, delay: Duration) -> bool {
        if delay.is_zero() {
            return false;
        }
        let mut inner = self.lock();
        let until = now + delay;
        let started = inner.paused_until.is_none_or(|current| current <= now);
        if inner.paused_until.is_none_or(|current| current < until) {
            inner.paused_until = Some(until);
        }
        if inner.pause_probe.is_none() {
            inner.pause_probe = Some(false);
        }
        started
    }

    fn health(&self, now: Instant) -> Health {
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
        Health {
            circuit,
            consecutive_failures: inner.consecutive,
            paused_for: open_for.max(paused),
        }
    }
}

impl Admission {
    /// Records the message's result: `healthy` when the receiver works (published, or a
    /// permanent refusal), `false` for a retryable failure. Returns the new state when
    /// it changed.
    fn record(mut self, healthy: bool, now: Instant) -> Option<CircuitState> {
        self.done = true;
        let config = &self.breaker.config;
        let mut inner = self.breaker.lock();
        if self.pause_probe {
            // Answered: the next pause (if this answer started one) has its own probe.
            let paused = inner.paused_until.is_some_and(|until| now < until);
            inner.pause_probe = (!healthy && paused).then_some(false);
        }
        let before = inner.state;
        if healthy {
            inner.consecutive = 0;
            inner.throttles = 0;
            inner.state = State::Closed;
        } else {
            inner.consecutive = inner.consecutive.saturating_add(1);
            let trips = self.breaker.opens && inner.consecutive >= config.failures;
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
        if self.done {
            return;
        }
        let mut inner = self.breaker.lock();
        if self.probe && inner.state == (State::HalfOpen { probing: true }) {
            inner.state = State::HalfOpen { probing: false };
        }
        if self.pause_probe && inner.pause_probe == Some(true) {
            inner.pause_probe = Some(false);
        }
    }
}

/// Permanent failures the sink decides alone, without an answer from the receiver: they
/// say nothing about its health.
fn is_local(class: FailureClass) -> bool {
    matches!(
        class,
        FailureClass::Config
            | FailureClass::Serialization
            | FailureClass::UnknownDestination
            | FailureClass::Undecodable
    )
}

/// Stops sending to a failing receiver for a while, and honours its retry-after pauses.
///
/// - **Closed**: messages flow; each retryable failure of a sent message adds one to a
///   counter, any other answer (published, or a permanent refusal: the receiver works)
///   resets it. At [`CircuitConfig::failures`] consecutive failures the circuit opens.
/// - **Open** for [`CircuitConfig::cool_down`]: nothing is sent; each message fails
///   retryably, deferred, with class `unavailable` and a retry-after of the time left.
/// - **Half-open** after the cool-down: one message (the probe) goes through while the
///   others still fail fast. A probe that succeeds closes the circuit; one that fails
///   opens it for another cool-down.
///
/// Separately, the receiver's pauses: a retryable failure with a retry-after pauses the
/// route until then, a throttle without one (class `RateLimited`, or
/// [`overloaded`](crate::Failure::overloaded)) for 1 s doubling up to
/// [`MAX_THROTTLE_PAUSE`]; after a pause one message goes first, as a probe. Messages held
/// back fail deferred, so waiting never spends their attempts. When the circuit opens or a
/// pause starts in the middle of a call, the inner sink's
/// [context](crate::PublishContext::stopped) is stopped, so a sink that sends message by
/// message sends no more of the batch.
#[derive(Debug)]
pub struct CircuitBreaker<S> {
    inner: S,
    breaker: Breaker,
    name: String,
}

impl<S> CircuitBreaker<S> {
    /// Wraps `inner`.
    ///
    /// # Panics
    ///
    /// If `config` is invalid ([`CircuitConfig::validate`]): `failures` 0 or a zero
    /// cool-down. Settings from a file are validated before, with an error.
    pub fn new(inner: S, config: CircuitConfig) -> Self {
        if let Err(reason) = config.validate() {
            panic!("invalid circuit breaker settings: {reason}");
        }
        Self {
            inner,
            breaker: Breaker::new(config, true),
            name: String::new(),
        }
    }

    /// Wraps `inner` in the receiver's pauses alone: retry-afters and throttles pause the
    /// route, and the circuit never opens.
    ///
    /// ```
    /// use outbox_engine::layers::{CircuitBreaker, CircuitState};
    /// use outbox_engine::testkit::RecordingSink;
    ///
    /// let sink = CircuitBreaker::pause_only(RecordingSink::new()).named("billing");
    /// assert_eq!(sink.health().circuit, CircuitState::Closed);
    /// ```
    pub fn pause_only(inner: S) -> Self {
        Self {
            inner,
            breaker: Breaker::new(CircuitConfig::default(), false),
            name: String::new(),
        }
    }

    /// Names the route in the breaker's log lines.
    #[must_use]
    pub fn named(mut self, route: impl Into<String>) -> Self {
        self.name = route.into();
        self
    }

    /// The circuit's state now.
    pub fn health(&self) -> Health {
        self.breaker.health(Instant::now())
    }

    fn refused(&self, refusal: Refusal) -> Outcome {
        let failure = match refusal {
            Refusal::Open { retry_after } => Failure::retryable(
                FailureClass::Unavailable,
                format!(
                    "not sent: the circuit breaker is open after {} consecutive failures (the last: {}); next probe in {retry_after:?}",
                    self.breaker.config.failures,
                    self.breaker.last_failure().as_deref().unwrap_or("unknown"),
                ),
            )
            .with_retry_after(retry_after),
            Refusal::Paused { retry_after } => Failure::retryable(
                FailureClass::RateLimited,
                format!("not sent: the receiver asked to wait another {retry_after:?}"),
            )
            .with_retry_after(retry_after),
        };
        failure.deferred().into()
    }
}

impl<S: Sink> ReportingSink for CircuitBreaker<S> {
    async fn publish_each(&self, batch: &[Message], cx: &PublishContext, outcomes: &Outcomes) {
        let now = Instant::now();
        let mut admitted = Vec::new();
        let mut admissions = Vec::new();
        for index in 0..batch.len() {
            match self.breaker.admit(now) {
                Ok(admission) => {
                    admitted.push(index);
                    admissions.push(Some(admission));
                }
                Err(refusal) => outcomes.report(index, self.refused(refusal)),
            }
        }
        if admitted.is_empty() {
            return;
        }
        let (cx, stop) = cx.child();
        let admissions = Arc::new(Mutex::new(admissions));
        let (breaker, name, parent) = (self.breaker.clone(), self.name.clone(), outcomes.clone());
        let indexes = admitted.clone();
        let observed = Outcomes::new(move |position, outcome| {
            let Some(&index) = indexes.get(position) else {
                return;
            };
            let admission = admissions
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get_mut(position)
                .and_then(Option::take);
            let mut outcome = outcome;
            if let Some(admission) = admission {
                let now = Instant::now();
                match &mut outcome {
                    // Never sent (the call was stopped, say): says nothing about the
                    // receiver; the admission's drop gives a probe slot back. It comes
                    // back when the route reopens, not at the relay's ordinary backoff.
                    Outcome::Failed(f) if f.deferred => {
                        drop(admission);
                        if f.retry_after.is_none() {
                            f.retry_after = breaker.health(now).paused_for;
                        }
                    }
                    Outcome::Failed(f) if f.retryable => {
                        breaker.remember(f);
                        // A retry-after says how long (zero: no wait); without one, a
                        // throttle pauses as `throttled` says.
                        let pause = match f.retry_after {
                            Some(delay) => (!delay.is_zero()).then_some(delay),
                            None => (f.overloaded || f.class == FailureClass::RateLimited)
                                .then(|| breaker.throttled(now)),
                        };
                        if let Some(delay) = pause {
                            f.retry_after.get_or_insert(delay);
                            if breaker.pause(now, delay) {
                                warn!(route = %name, pause = ?delay, failure = %f, "route paused: nothing is sent to it until the pause ends, then one message probes");
                                metrics::counter!("outbox_route_pauses_total", "route" => name.clone()).increment(1);
                            }
                            stop.stop(format!("the receiver asked to wait {delay:?}"));
                        }
                        if admission.record(false, now) == Some(CircuitState::Open) {
                            warn!(route = %name, failures = breaker.config.failures, last_failure = %f, "circuit opened");
                            stop.stop("the circuit breaker opened");
                        }
                    }
                    // Refused before reaching the receiver (a local check): neutral.
                    Outcome::Failed(f) if is_local(f.class) => drop(admission),
                    _ => {
                        if admission.record(true, now) == Some(CircuitState::Closed) {
                            info!(route = %name, "circuit closed");
                        }
                    }
                }
            }
            parent.report(index, outcome);
        });
        if admitted.len() == batch.len() {
            self.inner.publish_reporting(batch, &cx, &observed).await;
        } else {
            let part: Vec<Message> = admitted.iter().map(|&i| batch[i].clone()).collect();
            self.inner.publish_reporting(&part, &cx, &observed).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn breaker(failures: u32) -> Breaker {
        Breaker::new(
            CircuitConfig::default()
                .failures(failures)
                .cool_down(Duration::from_secs(10)),
            true,
        )
    }

    #[test]
    fn opens_after_consecutive_failures_and_resets_on_success() {
        let c = breaker(3);
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
        assert!(matches!(
            c.admit(t + Duration::from_secs(4)),
            Err(Refusal::Open { retry_after }) if retry_after == Duration::from_secs(6)
        ));
    }

    #[test]
    fn half_open_lets_one_probe_through() {
        let c = breaker(1);
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
        let c = breaker(1);
        let t = Instant::now();
        c.admit(t).unwrap().record(false, t);
        let later = t + Duration::from_secs(11);
        drop(c.admit(later).unwrap());
        assert!(c.admit(later).is_ok());
    }

    #[test]
    fn a_pause_blocks_until_it_ends() {
        let c = breaker(100);
        let t = Instant::now();
        c.pause(t, Duration::from_secs(5));
        c.pause(t, Duration::from_secs(1));
        assert!(matches!(
            c.admit(t + Duration::from_secs(2)),
            Err(Refusal::Paused { retry_after }) if retry_after == Duration::from_secs(3)
        ));
        assert!(c.admit(t + Duration::from_secs(5)).is_ok());
    }

    #[test]
    fn after_a_pause_one_probe_goes_first() {
        let c = Breaker::new(CircuitConfig::default(), false);
        let t = Instant::now();
        assert!(c.pause(t, Duration::from_secs(20)), "a new pause");
        assert!(!c.pause(t, Duration::from_secs(5)), "already paused");
        let later = t + Duration::from_secs(20);
        let probe = c.admit(later).unwrap();
        assert!(matches!(
            c.admit(later),
            Err(Refusal::Paused { retry_after }) if retry_after == PROBE_WAIT
        ));
        // Refused again with a retry-after: another pause, and another single probe.
        assert!(c.pause(later, Duration::from_secs(20)));
        probe.record(false, later);
        let again = later + Duration::from_secs(20);
        let probe = c.admit(again).unwrap();
        assert!(c.admit(again).is_err(), "one probe at a time");
        probe.record(true, again);
        assert!(
            c.admit(again).is_ok() && c.admit(again).is_ok(),
            "open again"
        );
        // The pause-only breaker never opens its circuit.
        for _ in 0..100 {
            c.admit(again).unwrap().record(false, again);
        }
        assert_eq!(c.health(again).circuit, CircuitState::Closed);
    }

    #[test]
    fn throttles_in_a_row_double_the_pause_up_to_the_limit() {
        let c = Breaker::new(CircuitConfig::default(), false);
        let mut t = Instant::now();
        let mut pauses = Vec::new();
        for _ in 0..8 {
            let pause = c.throttled(t);
            c.pause(t, pause);
            // The rest of a wave, answered during the pause, does not double it again.
            assert_eq!(
                c.throttled(t + Duration::from_millis(500)),
                pause - Duration::from_millis(500)
            );
            pauses.push(pause.as_secs());
            t += pause;
        }
        assert_eq!(pauses, [1, 2, 4, 8, 16, 32, 60, 60]);
        c.admit(t).unwrap().record(true, t);
        assert_eq!(c.throttled(t), Duration::from_secs(1), "reset by a success");
    }
}
