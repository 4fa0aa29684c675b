//! The relay: claims due rows, publishes them through their route's sink, and records the
//! outcome — published only after the sink acknowledged.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::{Instrument, debug, info_span, warn};

use crate::clock::{Clock, SystemClock};
use crate::error::{ConfigError, StoreError};
use crate::message::{Message, MessageId};
use crate::retry::{Decision, RetryPolicy};
use crate::sink::{DynSink, Failure, FailureClass, Outcome, Sink};
use crate::state::LeaseToken;
use crate::store::{ClaimRequest, CompleteAction, Completion, Ordering, Store};
use crate::wakeup::Wakeup;

/// Builds a [`Relay`].
///
/// ```
/// use std::time::Duration;
/// use outbox_core::{MemoryStore, Relay, RetryPolicy, testkit::RecordingSink};
///
/// let store = MemoryStore::new();
/// let relay = Relay::builder(store.clone())
///     .route("billing", RecordingSink::new())
///     .batch_size(100)
///     .concurrency(2)
///     .lease(Duration::from_secs(30))
///     .poll_interval(Duration::from_millis(500))
///     .wakeup(outbox_core::Wakeups::wakeup(&store))
///     .retry(RetryPolicy::default().max_attempts(10))
///     .build()?;
/// # Ok::<(), outbox_core::ConfigError>(())
/// ```
#[must_use = "a builder does nothing until `build` is called"]
pub struct RelayBuilder<S> {
    store: S,
    routes: HashMap<String, Arc<dyn DynSink>>,
    owner: String,
    batch_size: usize,
    concurrency: usize,
    lease: Duration,
    publish_timeout: Option<Duration>,
    poll_interval: Duration,
    shutdown_grace: Duration,
    dead_letter_unrouted: bool,
    wakeup: Option<Wakeup>,
    retry: RetryPolicy,
    ordering: Ordering,
    clock: Arc<dyn Clock>,
}

impl<S: Store> RelayBuilder<S> {
    fn new(store: S) -> Self {
        Self {
            store,
            routes: HashMap::new(),
            owner: format!("relay-{}-{:04x}", std::process::id(), fastrand::u16(..)),
            batch_size: 100,
            concurrency: 1,
            lease: Duration::from_secs(30),
            publish_timeout: None,
            poll_interval: Duration::from_secs(1),
            shutdown_grace: Duration::from_secs(10),
            dead_letter_unrouted: false,
            wakeup: None,
            retry: RetryPolicy::default(),
            ordering: Ordering::Unordered,
            clock: Arc::new(SystemClock),
        }
    }

    /// Publishes messages whose destination is `destination` through `sink`.
    pub fn route(mut self, destination: impl Into<String>, sink: impl Sink) -> Self {
        self.routes.insert(destination.into(), Arc::new(sink));
        self
    }

    /// Like [`route`](Self::route), for a sink that is already shared or type-erased.
    pub fn route_dyn(mut self, destination: impl Into<String>, sink: Arc<dyn DynSink>) -> Self {
        self.routes.insert(destination.into(), sink);
        self
    }

    /// The name stored as `lease_owner` (default `relay-<pid>-<random>`).
    pub fn owner(mut self, owner: impl Into<String>) -> Self {
        self.owner = owner.into();
        self
    }

    /// Rows per claim (1..=10,000; default 100).
    pub fn batch_size(mut self, n: usize) -> Self {
        self.batch_size = n;
        self
    }

    /// Workers, each claiming and publishing its own batches (default 1).
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n;
        self
    }

    /// How long a claim holds its rows (default 30 s). A relay that dies holding rows
    /// delays them by at most this long.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// How long one publish call may take before it counts as a retryable timeout
    /// (default: half the lease; must be shorter than the lease).
    pub fn publish_timeout(mut self, timeout: Duration) -> Self {
        self.publish_timeout = Some(timeout);
        self
    }

    /// How long an idle worker waits before claiming again without a wakeup (default 1 s).
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval;
        self
    }

    /// How long shutdown waits for in-flight batches before releasing their leases
    /// (default 10 s).
    pub fn shutdown_grace(mut self, grace: Duration) -> Self {
        self.shutdown_grace = grace;
        self
    }

    /// Claims every destination, and dead-letters the messages of destinations that have
    /// no route as a permanent `unknown_destination` failure.
    ///
    /// Off by default: a relay claims only the destinations it routes and leaves the
    /// others to the relays that route them, so several relays with different routes can
    /// share one table. Turn it on only for a relay that is the table's sole reader, to
    /// surface messages written for a destination nobody serves.
    pub fn dead_letter_unrouted(mut self, enabled: bool) -> Self {
        self.dead_letter_unrouted = enabled;
        self
    }

    /// Wakes idle workers when this signal is raised (in-process enqueue, LISTEN/NOTIFY).
    /// Several sources can share one signal. Polling stays on as the fallback.
    pub fn wakeup(mut self, wakeup: Wakeup) -> Self {
        self.wakeup = Some(wakeup);
        self
    }

    /// The retry policy (default [`RetryPolicy::default`]).
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = policy;
        self
    }

    /// The ordering mode (default [`Ordering::Unordered`]). With
    /// [`Ordering::PerKey`] the store hands out only the oldest unfinished message of
    /// each key, so a key never has two messages in flight and a failing message holds
    /// back only its own key. Per route: run one relay per ordering mode, each routing
    /// its own destinations.
    pub fn ordering(mut self, ordering: Ordering) -> Self {
        self.ordering = ordering;
        self
    }

    /// The clock used for retry ages and lag metrics (default: system clock).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Checks the settings and builds the relay.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming the setting that is out of range, or [`ConfigError::NoRoutes`].
    pub fn build(self) -> Result<Relay<S>, ConfigError> {
        let invalid = |setting, reason: &str| ConfigError::InvalidSetting {
            setting,
            reason: reason.to_owned(),
        };
        if self.routes.is_empty() {
            return Err(ConfigError::NoRoutes);
        }
        if !(1..=10_000).contains(&self.batch_size) {
            return Err(invalid("batch_size", "must be between 1 and 10000"));
        }
        if !(1..=1024).contains(&self.concurrency) {
            return Err(invalid("concurrency", "must be between 1 and 1024"));
        }
        if self.lease < Duration::from_millis(10) {
            return Err(invalid("lease", "must be at least 10 ms"));
        }
        let publish_timeout = self.publish_timeout.unwrap_or(self.lease / 2);
        if publish_timeout.is_zero() || publish_timeout >= self.lease {
            return Err(invalid(
                "publish_timeout",
                "must be above zero and shorter than the lease, or a slow publish would outlive its lease",
            ));
        }
        if self.poll_interval.is_zero() {
            return Err(invalid("poll_interval", "must be above zero"));
        }
        if self.owner.is_empty() || self.owner.len() > 255 {
            return Err(invalid("owner", "must be 1 to 255 bytes"));
        }
        let mut destinations: Vec<String> = self.routes.keys().cloned().collect();
        destinations.sort();
        let mut claim =
            ClaimRequest::new(self.owner, self.batch_size, self.lease).ordering(self.ordering);
        if !self.dead_letter_unrouted {
            claim = claim.destinations(destinations);
        }
        Ok(Relay {
            inner: Arc::new(Inner {
                store: self.store,
                routes: self.routes,
                claim,
                publish_timeout,
                retry: self.retry,
                clock: self.clock,
                in_flight: Mutex::default(),
            }),
            concurrency: self.concurrency,
            poll_interval: self.poll_interval,
            shutdown_grace: self.shutdown_grace,
            wakeup: self.wakeup.unwrap_or_default(),
            ordering: self.ordering,
        })
    }
}

/// Moves messages from a [`Store`] to their [`Sink`]s.
///
/// Run it with [`run`](Relay::run) until a shutdown signal, or step it in tests with
/// [`run_once`](Relay::run_once) and [`drain`](Relay::drain).
pub struct Relay<S> {
    inner: Arc<Inner<S>>,
    concurrency: usize,
    poll_interval: Duration,
    shutdown_grace: Duration,
    wakeup: Wakeup,
    ordering: Ordering,
}

struct Inner<S> {
    store: S,
    routes: HashMap<String, Arc<dyn DynSink>>,
    claim: ClaimRequest,
    publish_timeout: Duration,
    retry: RetryPolicy,
    clock: Arc<dyn Clock>,
    /// Leases held by batches in progress, released on a forced shutdown.
    in_flight: Mutex<HashMap<LeaseToken, Vec<MessageId>>>,
}

/// What one batch did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchReport {
    /// Rows claimed.
    pub claimed: usize,
    /// Marked published.
    pub published: usize,
    /// Scheduled for another attempt.
    pub retried: usize,
    /// Dead-lettered.
    pub dead: usize,
    /// Completions rejected because the lease had passed to another relay.
    pub stale: usize,
}

impl BatchReport {
    fn add(&mut self, other: BatchReport) {
        self.claimed += other.claimed;
        self.published += other.published;
        self.retried += other.retried;
        self.dead += other.dead;
        self.stale += other.stale;
    }
}

impl<S: Store> Relay<S> {
    /// Starts building a relay over `store`.
    pub fn builder(store: S) -> RelayBuilder<S> {
        RelayBuilder::new(store)
    }

    /// The store this relay drains.
    pub fn store(&self) -> &S {
        &self.inner.store
    }

    /// The ordering mode.
    pub fn ordering(&self) -> Ordering {
        self.ordering
    }

    /// Claims one batch, publishes it and records the outcomes.
    ///
    /// # Errors
    ///
    /// A [`StoreError`] from the claim or the completion; the rows then stay leased and
    /// are retried after the lease lapses.
    pub async fn run_once(&self) -> Result<BatchReport, StoreError> {
        self.inner.process_batch().await
    }

    /// Runs batches until a claim comes back empty (due rows only; scheduled retries wait).
    ///
    /// # Errors
    ///
    /// The first [`StoreError`].
    pub async fn drain(&self) -> Result<BatchReport, StoreError> {
        let mut total = BatchReport::default();
        loop {
            let report = self.run_once().await?;
            if report.claimed == 0 {
                return Ok(total);
            }
            total.add(report);
        }
    }

    /// Runs `concurrency` workers until `shutdown` completes, then stops claiming, lets
    /// in-flight batches finish for up to the shutdown grace, and releases the leases of
    /// any batch still running after that.
    ///
    /// Store errors never stop the relay: a worker logs them and backs off.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send) {
        let (stop_tx, stop_rx) = watch::channel(false);
        let mut workers = JoinSet::new();
        for worker in 0..self.concurrency {
            let inner = Arc::clone(&self.inner);
            let listener = self.wakeup.subscribe();
            let stop = stop_rx.clone();
            let poll = self.poll_interval;
            let span = info_span!("outbox_relay_worker", owner = %inner.claim.owner, worker);
            workers.spawn(inner.work(listener, stop, poll).instrument(span));
        }
        shutdown.await;
        let _ = stop_tx.send(true);
        let finished = tokio::time::timeout(self.shutdown_grace, async {
            while workers.join_next().await.is_some() {}
        })
        .await;
        if finished.is_err() {
            workers.abort_all();
            while workers.join_next().await.is_some() {}
            self.inner.release_in_flight().await;
        }
    }
}

impl<S: Store> Inner<S> {
    async fn work(
        self: Arc<Self>,
        mut listener: crate::wakeup::WakeupListener,
        mut stop: watch::Receiver<bool>,
        poll: Duration,
    ) {
        let mut failures = 0u32;
        while !*stop.borrow() {
            metrics::gauge!("outbox_relay_heartbeat_seconds").set(unix_seconds(self.clock.now()));
            listener.mark_seen();
            let wait = match self.process_batch().await {
                Ok(report) => {
                    failures = 0;
                    if report.claimed >= self.claim.batch_size {
                        continue;
                    }
                    poll
                }
                Err(error) => {
                    failures = failures.saturating_add(1);
                    warn!(%error, "claim or completion failed; backing off");
                    metrics::counter!("outbox_store_errors_total").increment(1);
                    (poll * 2u32.saturating_pow(failures.min(5))).min(Duration::from_secs(30))
                }
            };
            tokio::select! {
                () = listener.wait() => {}
                () = tokio::time::sleep(wait) => {}
                _ = stop.changed() => {}
            }
        }
    }

    async fn process_batch(&self) -> Result<BatchReport, StoreError> {
        let claim = self.store.claim(&self.claim).await?;
        let mut report = BatchReport {
            claimed: claim.messages.len() + claim.rejected.len(),
            dead: claim.rejected.len(),
            ..BatchReport::default()
        };
        for rejected in &claim.rejected {
            let destination = rejected.destination.as_deref().unwrap_or("");
            warn!(id = %rejected.id, destination, reason = %rejected.reason, "dead-lettered a row that could not be read as a message");
            metrics::counter!("outbox_messages_dead_total", "destination" => destination.to_owned(), "class" => FailureClass::Undecodable.as_str()).increment(1);
        }
        if claim.messages.is_empty() {
            return Ok(report);
        }
        let token = claim.lease.token;
        let ids: Vec<MessageId> = claim.messages.iter().map(|m| m.id).collect();
        self.lock_in_flight().insert(token, ids);
        let outcomes = self.publish(claim.messages).await;

        let now = self.clock.now();
        let mut completions = Vec::with_capacity(outcomes.len());
        let mut classes = Vec::with_capacity(outcomes.len());
        for (message, outcome) in &outcomes {
            let (completion, class) = match outcome {
                Outcome::Published { .. } => (Completion::published(message.id), None),
                Outcome::Failed(failure) => {
                    let completion = if failure.deferred && failure.retryable {
                        // Never sent: wait as asked, and the attempt does not count.
                        match self.retry.decide_deferred(failure, message.created_at, now) {
                            Decision::Retry(delay) => {
                                Completion::defer(message.id, delay, failure.to_string())
                            }
                            Decision::GiveUp(reason) => Completion::dead(message.id, reason),
                        }
                    } else {
                        let decision =
                            self.retry
                                .decide(failure, message.attempts, message.created_at, now);
                        match decision {
                            Decision::Retry(delay) => {
                                Completion::retry(message.id, delay, failure.to_string())
                            }
                            Decision::GiveUp(reason) => Completion::dead(message.id, reason),
                        }
                    };
                    (completion, Some(failure.class.as_str()))
                }
            };
            completions.push(completion);
            classes.push(class);
        }
        let result = self.complete(token, &completions).await;
        self.lock_in_flight().remove(&token);
        let completed = result?;
        report.stale = completed.stale.len();
        if report.stale > 0 {
            metrics::counter!("outbox_lease_conflicts_total").increment(report.stale as u64);
            warn!(
                stale = report.stale,
                token = %token.as_uuid(),
                "lease lost before completion: another relay owns these rows now, nothing changed"
            );
        }
        let stale: HashSet<MessageId> = completed.stale.into_iter().collect();
        // Metric handles are looked up once per destination per batch, not per message.
        let mut published: HashMap<&str, (u64, metrics::Histogram)> = HashMap::new();
        for (((message, _), completion), class) in outcomes.iter().zip(&completions).zip(classes) {
            if stale.contains(&message.id) {
                continue;
            }
            let destination = message.destination.as_str();
            let class = class.unwrap_or_default();
            match &completion.action {
                CompleteAction::Published => {
                    report.published += 1;
                    let lag = (now - message.created_at).to_std().unwrap_or_default();
                    let (count, lag_histogram) = published.entry(destination).or_insert_with(|| {
                        let histogram = metrics::histogram!("outbox_commit_to_publish_seconds", "destination" => destination.to_owned());
                        (0, histogram)
                    });
                    *count += 1;
                    lag_histogram.record(lag.as_secs_f64());
                }
                CompleteAction::Retry { .. } | CompleteAction::Defer { .. } => {
                    report.retried += 1;
                    metrics::counter!("outbox_messages_retried_total", "destination" => destination.to_owned(), "class" => class).increment(1);
                }
                CompleteAction::Dead { reason } => {
                    report.dead += 1;
                    warn!(id = %message.id, destination, %reason, "dead-lettered");
                    metrics::counter!("outbox_messages_dead_total", "destination" => destination.to_owned(), "class" => class).increment(1);
                }
            }
        }
        for (destination, (count, _)) in published {
            metrics::counter!("outbox_messages_published_total", "destination" => destination.to_owned()).increment(count);
        }
        debug!(?report, "batch done");
        Ok(report)
    }

    /// Publishes a claimed batch, one sink call per destination, destinations in parallel.
    /// Every message gets exactly one outcome; a crashed or confused sink gives failures.
    async fn publish(&self, messages: Vec<Message>) -> Vec<(Message, Outcome)> {
        let mut results = Vec::with_capacity(messages.len());
        let mut groups: Vec<(Arc<dyn DynSink>, Vec<Message>)> = Vec::new();
        for message in messages {
            if message.attempts > self.retry.attempt_limit() {
                // Claimed again and again without a completion: it crashes or hangs relays.
                let reason = format!(
                    "claimed {} times without completing (relay crash or lease loss each time)",
                    message.attempts
                );
                results.push((message, Outcome::permanent(FailureClass::Other, reason)));
                continue;
            }
            match self.routes.get(&message.destination) {
                Some(sink) => match groups.iter_mut().find(|(s, _)| Arc::ptr_eq(s, sink)) {
                    Some((_, group)) => group.push(message),
                    None => groups.push((Arc::clone(sink), vec![message])),
                },
                None => {
                    let reason = format!("no route for destination {:?}", message.destination);
                    results.push((
                        message,
                        Outcome::permanent(FailureClass::UnknownDestination, reason),
                    ));
                }
            }
        }
        // Each group runs as its own task so a panicking sink fails its messages, not the
        // worker. The batch is shared, not copied: the task returns only outcomes.
        let timeout = self.publish_timeout;
        let mut tasks = JoinSet::new();
        let mut pending: HashMap<tokio::task::Id, Arc<Vec<Message>>> = HashMap::new();
        for (sink, batch) in groups {
            let batch = Arc::new(batch);
            let handle = tasks.spawn(publish_group(sink, Arc::clone(&batch), timeout));
            pending.insert(handle.id(), batch);
        }
        while let Some(joined) = tasks.join_next_with_id().await {
            let (id, outcomes) = match joined {
                Ok((id, outcomes)) => (id, outcomes),
                Err(error) => {
                    let failure = Failure::retryable(
                        FailureClass::Other,
                        format!("sink task failed: {error}"),
                    );
                    let n = pending.get(&error.id()).map_or(0, |b| b.len());
                    (error.id(), vec![failure.into(); n])
                }
            };
            let batch = pending.remove(&id).expect("every task has its batch");
            let batch = Arc::try_unwrap(batch).unwrap_or_else(|shared| (*shared).clone());
            results.extend(batch.into_iter().zip(outcomes));
        }
        results
    }

    /// Records completions, retrying a retryable store failure three times with backoff:
    /// if it still fails, the rows stay leased and are reclaimed after the lease — a
    /// duplicate publish, never a lost row.
    async fn complete(
        &self,
        token: LeaseToken,
        completions: &[Completion],
    ) -> Result<crate::store::CompleteReport, StoreError> {
        let mut delay = Duration::from_millis(50);
        let mut tries = 0;
        loop {
            match self.store.complete(token, completions).await {
                Ok(report) => return Ok(report),
                Err(error) if error.is_retryable() && tries < 3 => {
                    warn!(%error, "completion failed; retrying");
                    tries += 1;
                    tokio::time::sleep(delay).await;
                    delay *= 4;
                }
                Err(error) => return Err(error),
            }
        }
    }

    async fn release_in_flight(&self) {
        let held: Vec<_> = self.lock_in_flight().drain().collect();
        for (token, ids) in held {
            match self.store.release(token, &ids).await {
                Ok(report) => debug!(released = report.applied, "released in-flight lease"),
                Err(error) => {
                    warn!(%error, "could not release a lease; its rows return when it lapses")
                }
            }
        }
    }

    fn lock_in_flight(&self) -> std::sync::MutexGuard<'_, HashMap<LeaseToken, Vec<MessageId>>> {
        self.in_flight.lock().unwrap_or_else(|e| e.into_inner())
    }
}

async fn publish_group(
    sink: Arc<dyn DynSink>,
    batch: Arc<Vec<Message>>,
    timeout: Duration,
) -> Vec<Outcome> {
    match tokio::time::timeout(timeout, sink.publish_dyn(&batch)).await {
        Ok(Ok(outcomes)) if outcomes.len() == batch.len() => outcomes,
        Ok(Ok(outcomes)) => {
            let failure = Failure::retryable(
                FailureClass::Other,
                format!(
                    "sink returned {} outcomes for {} messages",
                    outcomes.len(),
                    batch.len()
                ),
            );
            vec![failure.into(); batch.len()]
        }
        Ok(Err(failure)) => vec![failure.into(); batch.len()],
        Err(_) => {
            let failure = Failure::retryable(
                FailureClass::Timeout,
                format!("publish timed out after {timeout:?}"),
            );
            vec![failure.into(); batch.len()]
        }
    }
}

fn unix_seconds(t: chrono::DateTime<chrono::Utc>) -> f64 {
    t.timestamp_millis() as f64 / 1000.0
}
