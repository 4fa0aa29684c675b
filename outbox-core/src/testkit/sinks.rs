//! Sinks for tests: one that records, one that fails on purpose.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use crate::message::Message;
use crate::sink::{Failure, FailureClass, Outcome, PublishContext, Sink};

/// Acknowledges every message and remembers it, in publish order. Clones share the record.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use outbox_engine::{Sink, testkit::RecordingSink};
///
/// let sink = RecordingSink::new();
/// let outcomes = sink.publish(&[], &outbox_engine::PublishContext::default()).await.unwrap();
/// assert!(outcomes.is_empty());
/// assert_eq!(sink.len(), 0);
/// # });
/// ```
#[derive(Debug, Clone, Default)]
pub struct RecordingSink {
    record: Arc<Record>,
}

#[derive(Debug, Default)]
struct Record {
    messages: Mutex<Vec<Message>>,
    changed: Notify,
}

impl RecordingSink {
    /// An empty recording sink.
    pub fn new() -> Self {
        Self::default()
    }

    /// Every message acknowledged so far, duplicates included, in publish order.
    pub fn messages(&self) -> Vec<Message> {
        self.lock().clone()
    }

    /// How many messages were acknowledged (duplicates included).
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether nothing was acknowledged yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Waits until at least `n` messages were acknowledged; `false` on timeout.
    pub async fn wait_for(&self, n: usize, timeout: Duration) -> bool {
        tokio::time::timeout(timeout, async {
            loop {
                let changed = self.record.changed.notified();
                if self.len() >= n {
                    return;
                }
                changed.await;
            }
        })
        .await
        .is_ok()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Message>> {
        self.record
            .messages
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }
}

impl Sink for RecordingSink {
    async fn publish(
        &self,
        batch: &[Message],
        _cx: &PublishContext,
    ) -> Result<Vec<Outcome>, Failure> {
        let mut messages = self.lock();
        let start = messages.len();
        messages.extend_from_slice(batch);
        drop(messages);
        self.record.changed.notify_waiters();
        Ok((start..start + batch.len())
            .map(|n| Outcome::published_with(n.to_string()))
            .collect())
    }
}

type Predicate = Arc<dyn Fn(&Message) -> bool + Send + Sync>;

/// Wraps a sink and fails on purpose: permanently for messages a predicate picks (the same
/// messages every time), retryably at random for a share of attempts, and optionally slowly.
///
/// ```
/// use std::time::Duration;
/// use outbox_engine::testkit::{FlakySink, RecordingSink};
///
/// let delivered = RecordingSink::new();
/// let sink = FlakySink::new(delivered.clone())
///     .retryable_rate(0.3)
///     .permanent_when(|m| m.event_type == "poison")
///     .delay(Duration::from_millis(1), Duration::from_millis(5))
///     .seed(7);
/// ```
#[derive(Clone)]
pub struct FlakySink<S = RecordingSink> {
    inner: S,
    retryable_rate: f64,
    retry_after: Option<Duration>,
    permanent: Predicate,
    delay: Option<(Duration, Duration)>,
    rng: Arc<Mutex<fastrand::Rng>>,
    stats: Arc<Counters>,
}

#[derive(Debug, Default)]
struct Counters {
    retryable: AtomicU64,
    permanent: AtomicU64,
    forwarded: AtomicU64,
}

/// How often a [`FlakySink`] failed on purpose.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FlakyStats {
    /// Retryable failures returned.
    pub retryable: u64,
    /// Permanent failures returned.
    pub permanent: u64,
    /// Messages passed to the inner sink.
    pub forwarded: u64,
}

impl<S> std::fmt::Debug for FlakySink<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlakySink")
            .field("retryable_rate", &self.retryable_rate)
            .field("delay", &self.delay)
            .finish_non_exhaustive()
    }
}

impl<S: Sink> FlakySink<S> {
    /// Wraps `inner`; with no other setting it fails nothing.
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            retryable_rate: 0.0,
            retry_after: None,
            permanent: Arc::new(|_| false),
            delay: None,
            rng: Arc::new(Mutex::new(fastrand::Rng::new())),
            stats: Arc::default(),
        }
    }

    /// Fails this share (0.0–1.0) of attempts with a retryable error.
    pub fn retryable_rate(mut self, rate: f64) -> Self {
        self.retryable_rate = rate.clamp(0.0, 1.0);
        self
    }

    /// Attaches a retry-after to every retryable failure.
    pub fn retry_after(mut self, delay: Duration) -> Self {
        self.retry_after = Some(delay);
        self
    }

    /// Fails every attempt of the messages `predicate` picks with a permanent error.
    pub fn permanent_when(
        mut self,
        predicate: impl Fn(&Message) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.permanent = Arc::new(predicate);
        self
    }

    /// Sleeps a random time in `[min, max]` before answering each batch.
    pub fn delay(mut self, min: Duration, max: Duration) -> Self {
        self.delay = Some((min, max.max(min)));
        self
    }

    /// Makes the random choices repeatable.
    pub fn seed(self, seed: u64) -> Self {
        *self.rng.lock().unwrap_or_else(|e| e.into_inner()) = fastrand::Rng::with_seed(seed);
        self
    }

    /// Failures returned so far.
    pub fn stats(&self) -> FlakyStats {
        FlakyStats {
            retryable: self.stats.retryable.load(Ordering::Relaxed),
            permanent: self.stats.permanent.load(Ordering::Relaxed),
            forwarded: self.stats.forwarded.load(Ordering::Relaxed),
        }
    }
}

impl<S: Sink> Sink for FlakySink<S> {
    async fn publish(
        &self,
        batch: &[Message],
        cx: &PublishContext,
    ) -> Result<Vec<Outcome>, Failure> {
        let (sleep, rolls) = {
            let mut rng = self.rng.lock().unwrap_or_else(|e| e.into_inner());
            let sleep = self.delay.map(|(min, max)| {
                let span = (max - min).as_nanos() as u64;
                min + Duration::from_nanos(rng.u64(0..=span))
            });
            let rolls: Vec<f64> = batch.iter().map(|_| rng.f64()).collect();
            (sleep, rolls)
        };
        if let Some(sleep) = sleep {
            tokio::time::sleep(sleep).await;
        }
        let mut outcomes: Vec<Option<Outcome>> = vec![None; batch.len()];
        let mut forward = Vec::new();
        let mut forward_at = Vec::new();
        for (i, message) in batch.iter().enumerate() {
            if (self.permanent)(message) {
                self.stats.permanent.fetch_add(1, Ordering::Relaxed);
                outcomes[i] = Some(Outcome::permanent(
                    FailureClass::Rejected,
                    "flaky sink: permanent failure",
                ));
            } else if rolls[i] < self.retryable_rate {
                self.stats.retryable.fetch_add(1, Ordering::Relaxed);
                let mut failure =
                    Failure::retryable(FailureClass::Unavailable, "flaky sink: retryable failure");
                failure.retry_after = self.retry_after;
                outcomes[i] = Some(Outcome::Failed(failure));
            } else {
                forward.push(message.clone());
                forward_at.push(i);
            }
        }
        if !forward.is_empty() {
            self.stats
                .forwarded
                .fetch_add(forward.len() as u64, Ordering::Relaxed);
            let inner = match self.inner.publish(&forward, cx).await {
                Ok(inner) => inner,
                Err(failure) => vec![Outcome::Failed(failure); forward.len()],
            };
            for (i, outcome) in forward_at.into_iter().zip(inner) {
                outcomes[i] = Some(outcome);
            }
        }
        Ok(outcomes
            .into_iter()
            .map(|o| {
                o.unwrap_or_else(|| {
                    Outcome::retryable(FailureClass::Other, "inner sink gave no outcome")
                })
            })
            .collect())
    }
}
