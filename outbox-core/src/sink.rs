//! The `Sink` trait: publish a batch, answer one outcome per message.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::time::Instant;

use crate::message::Message;

/// Why a publish failed, for metrics labels and operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FailureClass {
    /// The broker or endpoint did not answer in time.
    Timeout,
    /// Connecting failed or the connection broke.
    Connection,
    /// Throttled (HTTP 429, broker quota).
    RateLimited,
    /// The receiver is temporarily unable (HTTP 5xx, broker unavailable, circuit open).
    Unavailable,
    /// The receiver refused the message (HTTP 4xx other than 408/425/429).
    Rejected,
    /// The message exceeds the receiver's size limit.
    TooLarge,
    /// The broker accepted but could not route the message (AMQP `basic.return`).
    Unroutable,
    /// The message could not be encoded for this sink.
    Serialization,
    /// The relay has no route for the message's destination.
    UnknownDestination,
    /// The stored row could not be read as a message (a column has the wrong shape).
    Undecodable,
    /// The sink is misconfigured.
    Config,
    /// Anything else.
    Other,
}

impl FailureClass {
    /// A short `snake_case` name, used as the `class` metrics label.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Timeout => "timeout",
            Self::Connection => "connection",
            Self::RateLimited => "rate_limited",
            Self::Unavailable => "unavailable",
            Self::Rejected => "rejected",
            Self::TooLarge => "too_large",
            Self::Unroutable => "unroutable",
            Self::Serialization => "serialization",
            Self::UnknownDestination => "unknown_destination",
            Self::Undecodable => "undecodable",
            Self::Config => "config",
            Self::Other => "other",
        }
    }
}

impl fmt::Display for FailureClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A failed publish: its class, a message for `last_error`, and whether retrying can help.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// What kind of failure.
    pub class: FailureClass,
    /// Human-readable detail, stored as the row's last error.
    pub message: String,
    /// `false`: dead-letter at once. `true`: back off and try again.
    pub retryable: bool,
    /// The receiver asked to wait at least this long (e.g. `Retry-After`).
    pub retry_after: Option<Duration>,
    /// The message was never handed to the receiver (an open circuit, a rate limit, a
    /// pause the receiver asked for): the relay schedules it again and gives the attempt
    /// back, so waiting out an outage never exhausts `max_attempts`.
    pub deferred: bool,
    /// The receiver said it is overloaded (HTTP 429 or 503): an answer about the
    /// endpoint, not this message, so the route pauses (see
    /// [`CircuitBreaker`](crate::layers::CircuitBreaker)).
    pub overloaded: bool,
}

impl Failure {
    /// A failure that a later attempt may not repeat.
    pub fn retryable(class: FailureClass, message: impl Into<String>) -> Self {
        Self {
            class,
            message: message.into(),
            retryable: true,
            retry_after: None,
            deferred: false,
            overloaded: false,
        }
    }

    /// A failure that every attempt would repeat; the message is dead-lettered.
    pub fn permanent(class: FailureClass, message: impl Into<String>) -> Self {
        Self {
            class,
            message: message.into(),
            retryable: false,
            retry_after: None,
            deferred: false,
            overloaded: false,
        }
    }

    /// Marks the failure as the receiver saying it is overloaded (see
    /// [`overloaded`](Self::overloaded)).
    pub fn overloaded(mut self) -> Self {
        self.overloaded = true;
        self
    }

    /// Marks the failure as *not sent*: retryable, and the attempt does not count.
    pub fn deferred(mut self) -> Self {
        self.retryable = true;
        self.deferred = true;
        self
    }

    /// Waits at least `delay` before the next attempt.
    pub fn with_retry_after(mut self, delay: Duration) -> Self {
        self.retry_after = Some(delay);
        self
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = if self.retryable {
            "retryable"
        } else {
            "permanent"
        };
        write!(f, "{kind} {}: {}", self.class, self.message)
    }
}

impl std::error::Error for Failure {}

/// The result of publishing one message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The sink acknowledged the message; `receipt` is what the broker returned, such as
    /// a partition/offset, a stream entry id or an SQS message id.
    Published {
        /// The broker's receipt, if it gives one.
        receipt: Option<String>,
    },
    /// Not acknowledged.
    Failed(Failure),
}

impl Outcome {
    /// Acknowledged, no receipt.
    pub fn published() -> Self {
        Self::Published { receipt: None }
    }
    /// Acknowledged with a receipt.
    pub fn published_with(receipt: impl Into<String>) -> Self {
        Self::Published {
            receipt: Some(receipt.into()),
        }
    }
    /// A retryable failure.
    pub fn retryable(class: FailureClass, message: impl Into<String>) -> Self {
        Self::Failed(Failure::retryable(class, message))
    }
    /// A permanent failure.
    pub fn permanent(class: FailureClass, message: impl Into<String>) -> Self {
        Self::Failed(Failure::permanent(class, message))
    }
    /// Whether the sink acknowledged the message.
    pub fn is_published(&self) -> bool {
        matches!(self, Self::Published { .. })
    }
}

impl From<Failure> for Outcome {
    fn from(failure: Failure) -> Self {
        Self::Failed(failure)
    }
}

/// What the relay tells a sink about one publish call: when it must be done by, and
/// whether a policy wrapped around the sink asked it to stop sending.
///
/// The deadline is the relay's `publish_timeout` from the start of the call (or tighter,
/// under a [`Timeout`](crate::layers::Timeout) layer). A sink must answer by then: a
/// message it has not reported when the deadline passes fails retryably as a timeout.
/// A sink that sends messages one by one checks [`stopped`](Self::stopped) before each
/// and reports the rest as [deferred](Failure::deferred) (never sent) once it is set,
/// for instance when a circuit breaker opened in the middle of the batch.
///
/// ```
/// use std::time::Duration;
/// use outbox_engine::PublishContext;
///
/// let cx = PublishContext::timeout(Duration::from_secs(5));
/// assert!(cx.remaining() <= Duration::from_secs(5));
/// assert_eq!(cx.stopped(), None);
/// let (child, stop) = cx.child();
/// stop.stop("the circuit opened");
/// assert_eq!(child.stopped(), Some("the circuit opened"));
/// assert_eq!(cx.stopped(), None, "the parent is not stopped");
/// ```
#[derive(Debug, Clone)]
pub struct PublishContext {
    deadline: Instant,
    stops: Vec<Arc<OnceLock<String>>>,
}

/// Stops the sends of a [`PublishContext::child`].
#[derive(Debug, Clone)]
pub struct Stopper(Arc<OnceLock<String>>);

impl Stopper {
    /// Asks the sink to send nothing more, for `reason` (the first reason given counts).
    pub fn stop(&self, reason: impl Into<String>) {
        let _ = self.0.set(reason.into());
    }
}

/// The deadline of [`PublishContext::default`], for calling a sink directly.
pub const DEFAULT_PUBLISH_TIMEOUT: Duration = Duration::from_secs(30);

impl PublishContext {
    /// A context with this deadline.
    pub fn new(deadline: Instant) -> Self {
        Self {
            deadline,
            stops: Vec::new(),
        }
    }

    /// A context whose deadline is `timeout` from now.
    pub fn timeout(timeout: Duration) -> Self {
        Self::new(Instant::now() + timeout)
    }

    /// When the call must be done.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// The time left before the deadline (zero once it passed).
    pub fn remaining(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    /// Why sending should stop, once a policy asked for it.
    pub fn stopped(&self) -> Option<&str> {
        self.stops
            .iter()
            .find_map(|stop| stop.get())
            .map(String::as_str)
    }

    /// The same context with its deadline moved to `deadline` if that is earlier.
    pub fn narrowed(&self, deadline: Instant) -> Self {
        Self {
            deadline: self.deadline.min(deadline),
            stops: self.stops.clone(),
        }
    }

    /// A context that is stopped when this one is, or when the returned [`Stopper`] says.
    pub fn child(&self) -> (Self, Stopper) {
        let stop = Arc::new(OnceLock::new());
        let mut stops = self.stops.clone();
        stops.push(Arc::clone(&stop));
        (
            Self {
                deadline: self.deadline,
                stops,
            },
            Stopper(stop),
        )
    }
}

impl Default for PublishContext {
    /// A deadline [`DEFAULT_PUBLISH_TIMEOUT`] from now.
    fn default() -> Self {
        Self::timeout(DEFAULT_PUBLISH_TIMEOUT)
    }
}

/// Publishes messages to one kind of receiver.
///
/// # Contract
///
/// - Return exactly one [`Outcome`] per message, in batch order. A sink that cannot tell
///   messages apart returns `Err`, and every message of the batch gets that failure.
/// - Return [`Outcome::Published`] only after the receiver acknowledged durably (HTTP 2xx,
///   Kafka delivery report, SQS per-entry success, AMQP confirm without return, Redis
///   reply). When unsure, fail retryably: a duplicate is recoverable, a loss is not.
/// - Answer by the context's [deadline](PublishContext::deadline); a message sent but not
///   answered by then is a retryable timeout (it may have arrived).
/// - Carry `id` and `idempotency_key` to the receiver unchanged on every attempt.
/// - Never panic on a broker reply; classify it.
///
/// Sinks compose: `Arc<S>` and `Arc<dyn DynSink>` are sinks too, and
/// the [`layers`](crate::layers) (rate limit, circuit breaker, concurrency cap, timeout)
/// wrap any sink.
///
/// ```
/// use outbox_engine::{Failure, FailureClass, Message, Outcome, PublishContext, Sink};
///
/// struct Stdout;
///
/// impl Sink for Stdout {
///     async fn publish(&self, batch: &[Message], _: &PublishContext) -> Result<Vec<Outcome>, Failure> {
///         Ok(batch
///             .iter()
///             .map(|m| match m.payload_str() {
///                 Some(text) => {
///                     println!("{} {}", m.event_type, text);
///                     Outcome::published()
///                 }
///                 None => Outcome::permanent(FailureClass::Serialization, "payload is not UTF-8"),
///             })
///             .collect())
///     }
/// }
/// ```
pub trait Sink: Send + Sync + 'static {
    /// Publishes `batch`; see the trait's contract.
    fn publish(
        &self,
        batch: &[Message],
        cx: &PublishContext,
    ) -> impl Future<Output = Result<Vec<Outcome>, Failure>> + Send;

    /// Publishes `batch`, reporting each message's outcome through `outcomes` as soon as
    /// it is known (`outcomes.report(index, outcome)`, `index` into `batch`).
    ///
    /// The relay records each reported outcome at once, so a message the receiver
    /// acknowledged is marked published without waiting for the batch's slowest message:
    /// a relay killed mid-batch re-sends fewer messages, and when the deadline cuts the
    /// call short, what was already reported is kept. A message with no report when the
    /// call ends gets a retryable failure; only the first report for an index counts.
    ///
    /// The default calls [`publish`](Sink::publish) and reports every outcome when it
    /// returns. Sinks that finish messages at different times (one request per message,
    /// say) implement [`ReportingSink`] instead, and get `Sink` from it.
    fn publish_reporting(
        &self,
        batch: &[Message],
        cx: &PublishContext,
        outcomes: &Outcomes,
    ) -> impl Future<Output = ()> + Send {
        async move { outcomes.report_all(batch.len(), self.publish(batch, cx).await) }
    }
}

/// A sink that finishes the messages of a batch at different times (one request per
/// message, say) and reports each outcome as soon as it is known. Implementing it gives
/// [`Sink`]: `publish_reporting` is [`publish_each`](ReportingSink::publish_each), and
/// `publish` collects its reports into one outcome per message, a retryable failure
/// for any message left without one.
///
/// ```
/// use outbox_engine::{Message, Outcome, Outcomes, PublishContext, ReportingSink, Sink};
///
/// /// Acknowledges the messages last to first.
/// struct Backwards;
///
/// impl ReportingSink for Backwards {
///     async fn publish_each(&self, batch: &[Message], _: &PublishContext, outcomes: &Outcomes) {
///         for index in (0..batch.len()).rev() {
///             outcomes.report(index, Outcome::published());
///         }
///     }
/// }
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let message = |n: u32| {
///     outbox_engine::NewMessage::builder("orders", "order.paid")
///         .json(&n)
///         .build()
///         .unwrap()
///         .into_message(chrono::Utc::now())
/// };
/// let batch = [message(1), message(2)];
/// let outcomes = Backwards.publish(&batch, &PublishContext::default()).await.unwrap();
/// assert!(outcomes.iter().all(Outcome::is_published));
/// # });
/// ```
pub trait ReportingSink: Send + Sync + 'static {
    /// Publishes `batch`, reporting each message's outcome through `outcomes` as soon as
    /// it is known (`outcomes.report(index, outcome)`, `index` into `batch`); see
    /// [`Sink::publish_reporting`].
    fn publish_each(
        &self,
        batch: &[Message],
        cx: &PublishContext,
        outcomes: &Outcomes,
    ) -> impl Future<Output = ()> + Send;
}

impl<S: ReportingSink> Sink for S {
    async fn publish(
        &self,
        batch: &[Message],
        cx: &PublishContext,
    ) -> Result<Vec<Outcome>, Failure> {
        Ok(gather(batch.len(), |outcomes| async move {
            self.publish_each(batch, cx, &outcomes).await;
        })
        .await)
    }

    async fn publish_reporting(&self, batch: &[Message], cx: &PublishContext, outcomes: &Outcomes) {
        self.publish_each(batch, cx, outcomes).await
    }
}

impl<S: Sink> Sink for Arc<S> {
    async fn publish(
        &self,
        batch: &[Message],
        cx: &PublishContext,
    ) -> Result<Vec<Outcome>, Failure> {
        S::publish(self, batch, cx).await
    }

    async fn publish_reporting(&self, batch: &[Message], cx: &PublishContext, outcomes: &Outcomes) {
        S::publish_reporting(self, batch, cx, outcomes).await
    }
}

impl Sink for Arc<dyn DynSink> {
    async fn publish(
        &self,
        batch: &[Message],
        cx: &PublishContext,
    ) -> Result<Vec<Outcome>, Failure> {
        self.as_ref().publish_dyn(batch, cx).await
    }

    async fn publish_reporting(&self, batch: &[Message], cx: &PublishContext, outcomes: &Outcomes) {
        self.as_ref()
            .publish_reporting_dyn(batch, cx, outcomes)
            .await
    }
}

/// Where a sink reports outcomes one message at a time (see [`Sink::publish_reporting`]).
/// Cheap to clone; every clone reports to the same place.
#[derive(Clone)]
pub struct Outcomes {
    report: Arc<dyn Fn(usize, Outcome) + Send + Sync>,
    /// Takes the outcomes of a whole batch at once, where the receiver can.
    report_batch: Option<Arc<dyn Fn(Vec<Outcome>) + Send + Sync>>,
}

impl Outcomes {
    /// Outcomes that go to `report(index, outcome)`.
    pub fn new(report: impl Fn(usize, Outcome) + Send + Sync + 'static) -> Self {
        Self {
            report: Arc::new(report),
            report_batch: None,
        }
    }

    /// Outcomes that go to `report(index, outcome)`, and those of a whole batch, from
    /// [`report_all`](Self::report_all), to `report_batch` at once.
    pub(crate) fn batched(
        report: impl Fn(usize, Outcome) + Send + Sync + 'static,
        report_batch: impl Fn(Vec<Outcome>) + Send + Sync + 'static,
    ) -> Self {
        Self {
            report: Arc::new(report),
            report_batch: Some(Arc::new(report_batch)),
        }
    }

    /// Reports the outcome of message `index` of the batch.
    pub fn report(&self, index: usize, outcome: Outcome) {
        (self.report)(index, outcome);
    }

    /// Reports a whole [`Sink::publish`] result for a batch of `len`: each outcome, or
    /// the batch failure for every message; a wrong number of outcomes is a retryable
    /// failure for every message.
    pub fn report_all(&self, len: usize, result: Result<Vec<Outcome>, Failure>) {
        match result {
            Ok(list) if list.len() == len => {
                if let Some(report_batch) = &self.report_batch {
                    return report_batch(list);
                }
                for (index, outcome) in list.into_iter().enumerate() {
                    self.report(index, outcome);
                }
            }
            Ok(list) => {
                let failure = Failure::retryable(
                    FailureClass::Other,
                    format!("sink returned {} outcomes for {len} messages", list.len()),
                );
                for index in 0..len {
                    self.report(index, failure.clone().into());
                }
            }
            Err(failure) => {
                for index in 0..len {
                    self.report(index, failure.clone().into());
                }
            }
        }
    }

    /// Outcomes for a sub-batch: index `i` of the sub-batch is reported as `indexes[i]`.
    pub fn mapped(&self, indexes: Vec<usize>) -> Self {
        let parent = self.clone();
        Self::new(move |index, outcome| {
            if let Some(&original) = indexes.get(index) {
                parent.report(original, outcome);
            }
        })
    }
}

impl fmt::Debug for Outcomes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Outcomes")
    }
}

/// Forwards reports to an [`Outcomes`] and remembers which messages of a batch have
/// one, so a layer can fail the rest when it cuts a call short.
#[derive(Debug, Clone)]
pub(crate) struct Tracker {
    reported: Arc<Mutex<Vec<bool>>>,
    outcomes: Outcomes,
}

impl Tracker {
    /// Tracks a batch of `len` reported to `outcomes`; `observe` sees every first report.
    pub(crate) fn new(
        len: usize,
        outcomes: &Outcomes,
        observe: impl Fn(usize, &Outcome) + Send + Sync + 'static,
    ) -> Self {
        let reported = Arc::new(Mutex::new(vec![false; len]));
        let (seen, parent) = (Arc::clone(&reported), outcomes.clone());
        let outcomes = Outcomes::new(move |index, outcome| {
            let first = {
                let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
                seen.get_mut(index)
                    .is_some_and(|slot| !std::mem::replace(slot, true))
            };
            if first {
                observe(index, &outcome);
                parent.report(index, outcome);
            }
        });
        Self { reported, outcomes }
    }

    /// Where the inner sink reports.
    pub(crate) fn outcomes(&self) -> &Outcomes {
        &self.outcomes
    }

    /// Reports `failure` for every message that has no outcome yet.
    pub(crate) fn fail_rest(&self, failure: &Failure) {
        let missing: Vec<usize> = {
            let seen = self.reported.lock().unwrap_or_else(|e| e.into_inner());
            (0..seen.len()).filter(|&i| !seen[i]).collect()
        };
        for index in missing {
            self.outcomes.report(index, failure.clone().into());
        }
    }
}

/// Runs `publish` with an [`Outcomes`] that collects into one outcome per message of a
/// batch of `len`, in batch order: the first report for an index counts, and an index
/// with no report gets a retryable failure.
async fn gather<F, Fut>(len: usize, publish: F) -> Vec<Outcome>
where
    F: FnOnce(Outcomes) -> Fut,
    Fut: Future<Output = ()>,
{
    let slots: Arc<Mutex<Vec<Option<Outcome>>>> = Arc::new(Mutex::new(vec![None; len]));
    let sink = Arc::clone(&slots);
    publish(Outcomes::new(move |index, outcome| {
        let mut slots = sink.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(slot @ None) = slots.get_mut(index) {
            *slot = Some(outcome);
        }
    }))
    .await;
    let mut slots = slots.lock().unwrap_or_else(|e| e.into_inner());
    slots
        .drain(..)
        .map(|slot| {
            slot.unwrap_or_else(|| {
                Outcome::retryable(FailureClass::Other, "the sink reported no outcome")
            })
        })
        .collect()
}

/// A boxed future, as [`DynSink`] returns.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The object-safe twin of [`Sink`], implemented for every `Sink`, so a relay can hold
/// sinks of different types as `Arc<dyn DynSink>`.
pub trait DynSink: Send + Sync + 'static {
    /// Publishes `batch`; see [`Sink::publish`].
    fn publish_dyn<'a>(
        &'a self,
        batch: &'a [Message],
        cx: &'a PublishContext,
    ) -> BoxFuture<'a, Result<Vec<Outcome>, Failure>>;

    /// Publishes `batch`, reporting as outcomes arrive; see [`Sink::publish_reporting`].
    fn publish_reporting_dyn<'a>(
        &'a self,
        batch: &'a [Message],
        cx: &'a PublishContext,
        outcomes: &'a Outcomes,
    ) -> BoxFuture<'a, ()>;
}

impl<S: Sink> DynSink for S {
    fn publish_dyn<'a>(
        &'a self,
        batch: &'a [Message],
        cx: &'a PublishContext,
    ) -> BoxFuture<'a, Result<Vec<Outcome>, Failure>> {
        Box::pin(self.publish(batch, cx))
    }

    fn publish_reporting_dyn<'a>(
        &'a self,
        batch: &'a [Message],
        cx: &'a PublishContext,
        outcomes: &'a Outcomes,
    ) -> BoxFuture<'a, ()> {
        Box::pin(self.publish_reporting(batch, cx, outcomes))
    }
}
