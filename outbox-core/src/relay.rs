//! The relay: claims due rows, publishes them through their route's sink, and records the
//! outcome — published only after the sink acknowledged.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::{Notify, mpsc, watch};
use tokio::task::JoinSet;
use tracing::{Instrument, Span, debug, debug_span, info_span, warn};

use crate::clock::{Clock, SystemClock};
use crate::error::{ConfigError, MessageError, StoreError, StoreErrorKind};
use crate::health::{GaugeSettings, RelayHealth};
use crate::message::{Message, MessageId, WaitedSince, check_destination_name};
use crate::retry::{Decision, RetryPolicy};
use crate::sink::{DynSink, Failure, FailureClass, Outcome, Outcomes, PublishContext, Sink};
use crate::state::LeaseToken;
use crate::store::{ClaimRequest, CompleteAction, Completion, MessageOrder, Store};
use crate::wakeup::Wakeup;

/// Builds a [`Relay`].
///
/// ```
/// use std::time::Duration;
/// use outbox_engine::{MemoryStore, Relay, RetryPolicy, testkit::RecordingSink};
///
/// let store = MemoryStore::new();
/// let relay = Relay::builder(store.clone())
///     .route("billing", RecordingSink::new())
///     .batch_size(100)
///     .concurrency(2)
///     .lease(Duration::from_secs(30))
///     .poll_interval(Duration::from_millis(500))
///     .wakeup(store.wakeup())
///     .retry(RetryPolicy::default().max_attempts(10))
///     .build()?;
/// # Ok::<(), outbox_engine::ConfigError>(())
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
    min_wakeup_interval: Duration,
    retry: RetryPolicy,
    ordering: MessageOrder,
    clock: Arc<dyn Clock>,
    gauges: Option<GaugeSettings>,
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
            min_wakeup_interval: Duration::from_millis(1),
            retry: RetryPolicy::default(),
            ordering: MessageOrder::Unordered,
            clock: Arc::new(SystemClock),
            gauges: Some(GaugeSettings::default()),
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

    /// The shortest time between two claims caused by wakeups (default 1 ms). A wakeup
    /// wakes one idle worker; the wakeups raised during the next `interval` are coalesced
    /// into one more claim at its end. Under load (a wakeup per commit) this turns
    /// thousands of one-row claims per second into at most one claim per interval, each
    /// taking every row committed meanwhile, so the relay does not tax the writers'
    /// database; a lone commit is still claimed at once. `Duration::ZERO` claims on every
    /// wakeup.
    pub fn min_wakeup_interval(mut self, interval: Duration) -> Self {
        self.min_wakeup_interval = interval;
        self
    }

    /// The retry policy (default [`RetryPolicy::default`]).
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = policy;
        self
    }

    /// The ordering mode (default [`MessageOrder::Unordered`]). With
    /// [`MessageOrder::PerKey`] the store hands out only the oldest unfinished message of
    /// each key, so a key never has two messages in flight and a failing message holds
    /// back only its own key. Per route: run one relay per ordering mode, each routing
    /// its own destinations.
    pub fn ordering(mut self, ordering: MessageOrder) -> Self {
        self.ordering = ordering;
        self
    }

    /// Applies every setting that `settings` gives (the others keep their values).
    pub fn settings(mut self, settings: &crate::settings::RelaySettings) -> Self {
        if let Some(owner) = &settings.owner {
            self.owner = owner.clone();
        }
        if let Some(n) = settings.batch_size {
            self.batch_size = n;
        }
        if let Some(n) = settings.concurrency {
            self.concurrency = n;
        }
        if let Some(lease) = settings.lease {
            self.lease = lease;
        }
        if let Some(timeout) = settings.publish_timeout {
            self.publish_timeout = Some(timeout);
        }
        if let Some(poll) = settings.poll_interval {
            self.poll_interval = poll;
        }
        if let Some(interval) = settings.min_wakeup_interval {
            self.min_wakeup_interval = interval;
        }
        if let Some(grace) = settings.shutdown_grace {
            self.shutdown_grace = grace;
        }
        if let Some(enabled) = settings.dead_letter_unrouted {
            self.dead_letter_unrouted = enabled;
        }
        if let Some(order) = settings.order() {
            self.ordering = order;
        }
        if let Some(enabled) = settings.gauges {
            self = self.gauges(enabled);
        }
        if let Some(interval) = settings.gauge_interval {
            self = self.gauge_interval(interval);
        }
        if let Some(limit) = settings.gauge_limit {
            self = self.gauge_limit(limit);
        }
        self
    }

    /// Whether the running relay reads the store's gauges and exports them as metrics
    /// (default on): `outbox_backlog`, `outbox_leased`, `outbox_dead_letters`,
    /// `outbox_halted_keys` and `outbox_oldest_pending_age_seconds` per destination, and
    /// `outbox_gauges_truncated`. They describe the whole table, so with several relays on
    /// one table, one exporting them is enough: turn it off on the others.
    pub fn gauges(mut self, enabled: bool) -> Self {
        self.gauges = enabled.then(|| self.gauges.unwrap_or_default());
        self
    }

    /// How often the gauges are read (default 10 s).
    pub fn gauge_interval(mut self, interval: Duration) -> Self {
        if let Some(gauges) = &mut self.gauges {
            gauges.interval = interval;
        }
        self
    }

    /// How many unfinished (and dead) rows a gauge read counts at most (default 50,000);
    /// past it the counts are lower bounds and `outbox_gauges_truncated` is 1.
    pub fn gauge_limit(mut self, limit: usize) -> Self {
        if let Some(gauges) = &mut self.gauges {
            gauges.limit = limit;
        }
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
    /// [`ConfigError`] naming the setting that is out of range, the setting that needs
    /// what the store's [`capabilities`](Store::capabilities) lack, or
    /// [`ConfigError::NoRoutes`].
    pub fn build(self) -> Result<Relay<S>, ConfigError> {
        let invalid = |setting, reason: &str| ConfigError::InvalidSetting {
            setting,
            reason: reason.to_owned(),
        };
        if self.routes.is_empty() {
            return Err(ConfigError::NoRoutes);
        }
        for route in self.routes.keys() {
            if let Err(MessageError::InvalidField { reason, .. }) = check_destination_name(route) {
                let route = route.clone();
                return Err(ConfigError::InvalidRoute { route, reason });
            }
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
        if let Some(gauges) = self.gauges {
            if gauges.interval < Duration::from_millis(10) {
                return Err(invalid("gauge_interval", "must be at least 10 ms"));
            }
            if gauges.limit == 0 {
                return Err(invalid("gauge_limit", "must be above zero"));
            }
        }
        if self.owner.is_empty() || self.owner.len() > 255 {
            return Err(invalid("owner", "must be 1 to 255 bytes"));
        }
        let capabilities = self.store.capabilities();
        if self.ordering != MessageOrder::Unordered && !capabilities.per_key_ordering {
            return Err(ConfigError::Unsupported {
                store: capabilities.store,
                capability: "per-key ordering",
                setting: "ordering",
            });
        }
        let mut destinations: Vec<String> = self.routes.keys().cloned().collect();
        destinations.sort();
        let mut claim =
            ClaimRequest::new(self.owner, self.batch_size, self.lease).ordering(self.ordering);
        if !self.dead_letter_unrouted {
            claim = claim.destinations(destinations);
        }
        let health = RelayHealth::new(
            self.lease,
            self.gauges.unwrap_or_default(),
            self.routes.keys().cloned(),
        );
        Ok(Relay {
            inner: Arc::new(Inner {
                store: self.store,
                routes: self.routes,
                claim,
                publish_timeout,
                retry: self.retry,
                clock: self.clock,
                in_flight: Mutex::default(),
                overlapped_claims: capabilities.overlapped_claims,
                health,
            }),
            gauges: self.gauges,
            concurrency: self.concurrency,
            poll_interval: self.poll_interval,
            shutdown_grace: self.shutdown_grace,
            wakeup: self.wakeup.unwrap_or_default(),
            min_wakeup_interval: self.min_wakeup_interval,
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
    min_wakeup_interval: Duration,
    ordering: MessageOrder,
    gauges: Option<GaugeSettings>,
}

struct Inner<S> {
    store: S,
    routes: HashMap<String, Arc<dyn DynSink>>,
    claim: ClaimRequest,
    publish_timeout: Duration,
    retry: RetryPolicy,
    clock: Arc<dyn Clock>,
    /// Leases held by batches in progress, released on a forced shutdown.
    in_flight: Mutex<HashMap<LeaseToken, HashSet<MessageId>>>,
    health: RelayHealth,
    /// Whether the store lets a claim run while a completion is written.
    overlapped_claims: bool,
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
    pub fn ordering(&self) -> MessageOrder {
        self.ordering
    }

    /// A handle on the relay's liveness, readiness and latest gauges, to serve from
    /// health endpoints while [`run`](Self::run) runs.
    ///
    /// ```
    /// use outbox_engine::{LagObjective, MemoryStore, Relay, testkit::RecordingSink};
    ///
    /// let relay = Relay::builder(MemoryStore::new()).route("billing", RecordingSink::new()).build()?;
    /// let health = relay.health();
    /// // A relay counts as alive for one heartbeat limit after it is built; once it runs,
    /// // its workers' beats keep it alive.
    /// assert!(health.alive(&LagObjective::new()).is_ok());
    /// # Ok::<(), outbox_engine::ConfigError>(())
    /// ```
    pub fn health(&self) -> RelayHealth {
        self.inner.health.clone()
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
        // Wakeups reach the workers through a pacer: each raise wakes one idle worker
        // (or is kept for the next one to wait), and raises during the following
        // `min_wakeup_interval` wait for its end and count as one.
        let wakeups = Arc::new(Notify::new());
        let mut pacer = JoinSet::new();
        {
            let mut raised = self.wakeup.subscribe();
            let wakeups = Arc::clone(&wakeups);
            let interval = self.min_wakeup_interval;
            pacer.spawn(async move {
                loop {
                    raised.wait().await;
                    wakeups.notify_one();
                    tokio::time::sleep(interval).await;
                }
            });
        }
        let mut workers = JoinSet::new();
        for worker in 0..self.concurrency {
            let inner = Arc::clone(&self.inner);
            let wakeups = Arc::clone(&wakeups);
            let stop = stop_rx.clone();
            let poll = self.poll_interval;
            let span = info_span!("outbox_relay_worker", owner = %inner.claim.owner, worker);
            workers.spawn(inner.work(wakeups, stop, poll).instrument(span));
        }
        // In a JoinSet, so the reader ends with this future even when it is dropped.
        let mut gauges = JoinSet::new();
        if let Some(settings) = self.gauges {
            let inner = Arc::clone(&self.inner);
            let routes = inner.routes.keys().cloned().collect();
            let stop = stop_rx.clone();
            let health = inner.health.clone();
            gauges.spawn(
                async move {
                    let read = |limit| inner.within_lease(inner.store.gauges(limit));
                    crate::health::export_gauges(read, settings, health, routes, stop).await;
                }
                .instrument(info_span!("outbox_gauges")),
            );
        }
        shutdown.await;
        self.inner.health.stop();
        let _ = stop_tx.send(true);
        gauges.abort_all();
        pacer.abort_all();
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
        wakeups: Arc<Notify>,
        mut stop: watch::Receiver<bool>,
        poll: Duration,
    ) {
        let mut failures = 0u32;
        // A batch claimed while the previous one's completion was being written.
        let mut next = None;
        while !*stop.borrow() {
            metrics::gauge!("outbox_relay_heartbeat_seconds").set(unix_seconds(self.clock.now()));
            self.health.beat();
            let claimed = match next.take() {
                Some(claimed) => claimed,
                None => self.claim_batch().await,
            };
            let result = match claimed {
                Ok(claimed) => {
                    // A full batch may have left due rows behind: claim them while this
                    // batch's completion is written, where the store allows it. Not with
                    // per-key ordering, where that completion unblocks the next claim.
                    let overlap = self.overlapped_claims
                        && self.claim.ordering == MessageOrder::Unordered
                        && claimed.report.claimed >= self.claim.batch_size;
                    let (result, following) = self.finish_batch(claimed, overlap).await;
                    next = following;
                    result
                }
                Err(error) => Err(error),
            };
            let wait = match result {
                Ok(report) => {
                    failures = 0;
                    // A full batch may have left due rows behind. With per-key ordering,
                    // finishing a key's head also makes its next row claimable, and no
                    // wakeup says so (that row's wakeup came before, when it could not be
                    // claimed): claim again rather than wait for the poll.
                    let unblocked = self.claim.ordering != MessageOrder::Unordered
                        && report.published + report.dead > 0;
                    if report.claimed >= self.claim.batch_size || unblocked || next.is_some() {
                        continue;
                    }
                    poll
                }
                Err(error) => {
                    failures = failures.saturating_add(1);
                    warn!(%error, "claim or completion failed; backing off");
                    metrics::counter!("outbox_store_errors_total").increment(1);
                    if next.is_some() {
                        // A batch already claimed goes on at once: its lease is running.
                        continue;
                    }
                    // Full jitter: relays that lost the database together do not all
                    // come back in the same instant.
                    crate::retry::full_jitter(
                        (poll * 2u32.saturating_pow(failures.min(5))).min(Duration::from_secs(30)),
                    )
                }
            };
            tokio::select! {
                () = wakeups.notified() => {}
                () = tokio::time::sleep(wait) => {}
                _ = stop.changed() => {}
            }
        }
        // Claimed just before the stop: publish it within the shutdown grace like any
        // batch in flight (past the grace, its lease is released).
        if let Some(Ok(claimed)) = next
            && let (Err(error), _) = self.finish_batch(claimed, false).await
        {
            warn!(%error, "completion failed while stopping; those rows return when their lease lapses");
        }
    }

    async fn process_batch(&self) -> Result<BatchReport, StoreError> {
        let claimed = self.claim_batch().await?;
        self.finish_batch(claimed, false).await.0
    }

    /// Claims a batch and registers its lease as in flight.
    async fn claim_batch(&self) -> Result<Claimed, StoreError> {
        let span = debug_span!(
            "outbox_claim",
            batch_size = self.claim.batch_size,
            claimed = tracing::field::Empty
        );
        let claim = self
            .within_lease(self.store.claim(&self.claim))
            .instrument(span.clone())
            .await;
        self.health.claimed(claim.as_ref().map(|_| ()));
        let claim = claim?;
        let claimed_at = tokio::time::Instant::now();
        let claimed = claim.messages.len() + claim.rejected.len();
        span.record("claimed", claimed);
        metrics::counter!("outbox_claims_total").increment(1);
        if claimed > 0 {
            metrics::histogram!("outbox_batch_size").record(claimed as f64);
        }
        let report = BatchReport {
            claimed,
            dead: claim.rejected.len(),
            ..BatchReport::default()
        };
        for rejected in &claim.rejected {
            let destination = rejected.destination.as_deref().unwrap_or("");
            warn!(id = %rejected.id, destination, reason = %rejected.reason, "dead-lettered a row that could not be read as a message");
            metrics::counter!("outbox_messages_dead_total", "destination" => destination.to_owned(), "class" => FailureClass::Undecodable.as_str()).increment(1);
        }
        if !claim.messages.is_empty() {
            let ids: HashSet<MessageId> = claim.messages.iter().map(|m| m.id).collect();
            self.lock_in_flight().insert(claim.lease.token, ids);
        }
        Ok(Claimed {
            claim,
            claimed_at,
            report,
        })
    }

    /// Publishes a claimed batch and records the outcomes. With `overlap`, the next batch
    /// is claimed while the last completion is written, and returned too.
    async fn finish_batch(
        &self,
        claimed: Claimed,
        overlap: bool,
    ) -> (
        Result<BatchReport, StoreError>,
        Option<Result<Claimed, StoreError>>,
    ) {
        let Claimed {
            claim,
            claimed_at,
            mut report,
        } = claimed;
        if claim.messages.is_empty() {
            return (Ok(report), None);
        }
        let token = claim.lease.token;
        // The next claim belongs to the worker, not to this batch's trace.
        let worker = Span::current();
        // Each batch is a trace of its own (a root span): under the worker's span, which
        // lives as long as the relay, every batch would join one endless trace. Empty
        // polls open none.
        let batch = info_span!(
            parent: None,
            "outbox_batch",
            owner = %self.claim.owner,
            claimed = report.claimed,
            token = %token.as_uuid()
        );
        let mut following = None;
        let result = async {
            // Outcomes arrive one by one (each sink group reports as its receiver answers)
            // and are completed as they come: while one completion call runs, the next
            // outcomes queue up and go in the following call.
            let mut publication = Publication::start(self, claim.messages);
            let mut result = Ok(());
            while let Some(ready) = publication.next_outcomes().await {
                let complete = self.complete_outcomes(token, claimed_at, &ready, &mut report);
                let completed = if overlap && following.is_none() && publication.settled() {
                    let next = self.claim_batch().instrument(worker.clone());
                    let (completed, next) = tokio::join!(complete, next);
                    following = Some(next);
                    completed
                } else {
                    complete.await
                };
                if let Err(error) = completed
                    && result.is_ok()
                {
                    result = Err(error);
                }
            }
            result
        }
        .instrument(batch)
        .await;
        self.lock_in_flight().remove(&token);
        debug!(?report, "batch done");
        (result.map(|()| report), following)
    }

    /// Decides and records the completion of `ready` messages, fenced by `token`, and
    /// counts what was applied in `report` and the metrics.
    async fn complete_outcomes(
        &self,
        token: LeaseToken,
        claimed_at: tokio::time::Instant,
        ready: &[Done],
        report: &mut BatchReport,
    ) -> Result<(), StoreError> {
        let now = self.clock.now();
        let mut completions = Vec::with_capacity(ready.len());
        let mut classes = Vec::with_capacity(ready.len());
        for done in ready {
            let message = done.message();
            let (completion, class) = match &done.outcome {
                Outcome::Published { .. } => (Completion::published(message.id), None),
                Outcome::Failed(failure) => (
                    self.failed(message, failure, store_now(message, now, claimed_at)),
                    Some(failure.class.as_str()),
                ),
            };
            completions.push(completion);
            classes.push(class);
        }
        let span = debug_span!(
            "outbox_complete",
            count = completions.len(),
            ids = ?completions.iter().map(|c| c.id).collect::<Vec<_>>()
        );
        let completed = self.complete(token, &completions).instrument(span).await?;
        if let Some(held) = self.lock_in_flight().get_mut(&token) {
            for done in ready {
                held.remove(&done.message().id);
            }
        }
        report.stale += completed.stale.len();
        if !completed.stale.is_empty() {
            metrics::counter!("outbox_lease_conflicts_total")
                .increment(completed.stale.len() as u64);
            warn!(
                stale = completed.stale.len(),
                ids = ?completed.stale,
                token = %token.as_uuid(),
                "lease lost before completion: another relay owns these rows now, nothing changed"
            );
        }
        let stale: HashSet<MessageId> = completed.stale.into_iter().collect();
        // Metric handles are looked up once per destination per call, not per message.
        let mut published: HashMap<&str, u64> = HashMap::new();
        let mut lags: HashMap<(&str, WaitedSince), metrics::Histogram> = HashMap::new();
        let mut activity = Vec::new();
        for ((done, completion), class) in ready.iter().zip(&completions).zip(classes) {
            let message = done.message();
            if stale.contains(&message.id) {
                continue;
            }
            let destination = message.destination.as_str();
            let class = class.unwrap_or_default();
            match &completion.action {
                CompleteAction::Published => {
                    report.published += 1;
                    // The store's measure of the wait up to the claim, plus this relay's
                    // monotonic time since; the relay's clock only where the store has none.
                    let (lag, since) = match message.waited {
                        Some(waited) => (waited.duration + claimed_at.elapsed(), waited.since),
                        None => (
                            (now - message.created_at).to_std().unwrap_or_default(),
                            WaitedSince::Insert,
                        ),
                    };
                    *published.entry(destination).or_default() += 1;
                    if let Some((took, failures)) = self.health.route_published(destination) {
                        warn!(destination, failures, down_for = ?took, "route recovered: publishing again");
                    }
                    activity.push((destination, lag));
                    lags.entry((destination, since))
                        .or_insert_with(|| {
                            metrics::histogram!("outbox_commit_to_publish_seconds", "destination" => destination.to_owned(), "since" => since.as_str())
                        })
                        .record(lag.as_secs_f64());
                }
                CompleteAction::Retry { delay, error } => {
                    report.retried += 1;
                    if self.health.route_failed(destination, class) {
                        warn!(destination, class, %error, "route failing: publishes are retried (said once; again when it recovers)");
                    }
                    debug!(id = %message.id, destination, attempt = message.attempts, class, retry_in = ?delay, %error, "publish failed; retrying");
                    metrics::counter!("outbox_messages_retried_total", "destination" => destination.to_owned(), "class" => class).increment(1);
                }
                CompleteAction::Defer { delay, error } => {
                    report.retried += 1;
                    if self.health.route_failed(destination, class) {
                        warn!(destination, class, %error, "route failing: messages wait to be sent (said once; again when it recovers)");
                    }
                    debug!(id = %message.id, destination, attempt = message.attempts, class, retry_in = ?delay, %error, "not sent; deferred");
                    metrics::counter!("outbox_messages_deferred_total", "destination" => destination.to_owned(), "class" => class).increment(1);
                }
                CompleteAction::Dead { reason } => {
                    report.dead += 1;
                    warn!(id = %message.id, destination, attempt = message.attempts, class, %reason, "dead-lettered");
                    metrics::counter!("outbox_messages_dead_total", "destination" => destination.to_owned(), "class" => class).increment(1);
                }
            }
        }
        for (destination, count) in published {
            metrics::counter!("outbox_messages_published_total", "destination" => destination.to_owned()).increment(count);
        }
        if !activity.is_empty() {
            self.health.published(activity);
        }
        Ok(())
    }

    /// The completion of a failed attempt: retry after a backoff, defer a message that was
    /// never sent, or give up.
    fn failed(&self, message: &Message, failure: &Failure, now: DateTime<Utc>) -> Completion {
        let decision = if failure.deferred && failure.retryable {
            // Never sent: wait as asked, and the attempt does not count.
            self.retry.decide_deferred(failure, message.created_at, now)
        } else {
            self.retry
                .decide(failure, message.attempts, message.created_at, now)
        };
        match decision {
            Decision::Retry(delay) if failure.deferred && failure.retryable => {
                Completion::defer(message.id, delay, failure.to_string())
            }
            Decision::Retry(delay) => Completion::retry(message.id, delay, failure.to_string()),
            Decision::GiveUp(reason) => Completion::dead(message.id, reason),
        }
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
            match self
                .within_lease(self.store.complete(token, completions))
                .await
            {
                Ok(report) => return Ok(report),
                Err(error) if error.is_retryable() && tries < 3 => {
                    warn!(%error, "completion failed; retrying");
                    tries += 1;
                    tokio::time::sleep(crate::retry::full_jitter(delay)).await;
                    delay *= 4;
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// `call` to the store, given up after the lease: by then a claim's rows and a
    /// completion's lease have lapsed, and a connection that fell silent (no reply, no
    /// reset) must not hold the worker until the operating system gives up on it.
    async fn within_lease<T>(
        &self,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        within(self.claim.lease, call).await
    }

    async fn release_in_flight(&self) {
        let held: Vec<_> = self.lock_in_flight().drain().collect();
        for (token, ids) in held {
            let ids: Vec<MessageId> = ids.into_iter().collect();
            match self.within_lease(self.store.release(token, &ids)).await {
                Ok(report) => debug!(released = report.applied, "released in-flight lease"),
                Err(error) => {
                    warn!(%error, "could not release a lease; its rows return when it lapses")
                }
            }
        }
    }

    fn lock_in_flight(&self) -> std::sync::MutexGuard<'_, HashMap<LeaseToken, HashSet<MessageId>>> {
        self.in_flight.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Now, in the frame of `message.created_at`: by the store's clock where the claim
/// measured the message's wait (its age at the claim, plus this relay's monotonic time
/// since), so that a relay whose wall clock is off gives up on `max_age` neither early
/// nor late; `relay_now` where the store measures nothing.
fn store_now(
    message: &Message,
    relay_now: DateTime<Utc>,
    claimed_at: tokio::time::Instant,
) -> DateTime<Utc> {
    message.waited.map_or(relay_now, |waited| {
        message.created_at + crate::message::chrono_duration(waited.duration + claimed_at.elapsed())
    })
}

/// `call`, or a retryable [`StoreErrorKind::Timeout`] once `limit` has passed.
async fn within<T>(
    limit: Duration,
    call: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    tokio::time::timeout(limit, call).await.unwrap_or_else(|_| {
        Err(StoreError::new(
            StoreErrorKind::Timeout,
            format!("the store did not answer within {limit:?}"),
        ))
    })
}

/// A claimed batch, its lease registered as in flight.
struct Claimed {
    claim: crate::store::Claim,
    claimed_at: tokio::time::Instant,
    /// What the claim did: rows claimed, unreadable rows dead-lettered.
    report: BatchReport,
}

/// A message of a claimed batch with its outcome.
struct Done {
    batch: Arc<[Message]>,
    index: usize,
    outcome: Outcome,
}

impl Done {
    fn message(&self) -> &Message {
        &self.batch[self.index]
    }
}

/// One claimed batch on its way through the sinks: one task per sink group, each
/// reporting outcomes as they arrive, plus the relay's own verdicts (no route, claimed
/// too often), known at once.
struct Publication {
    /// Each group's messages, as its sink sees them (shared with the task, not copied).
    groups: Vec<Arc<[Message]>>,
    /// Which messages of each group have an outcome.
    reported: Vec<Vec<bool>>,
    /// Each task ends with whether the publish timeout cut it short.
    tasks: JoinSet<bool>,
    task_group: HashMap<tokio::task::Id, usize>,
    /// `(group, index, outcome)` as the sinks report them.
    receiver: mpsc::UnboundedReceiver<(usize, usize, Outcome)>,
    verdicts: Vec<Done>,
    /// Messages without an outcome yet.
    unsettled: usize,
    timeout: Duration,
}

impl Publication {
    fn start<S: Store>(relay: &Inner<S>, messages: Vec<Message>) -> Self {
        let mut verdicts = (Vec::new(), Vec::new());
        let mut by_sink: Vec<(Arc<dyn DynSink>, Vec<Message>)> = Vec::new();
        let limit = relay.retry.attempt_limit();
        for message in messages {
            if message.attempts > limit {
                // The claim counts an attempt, and a relay dead-letters a row at the first
                // claim past the limit: a row past it by more came that way.
                let reason = if message.attempts == limit.saturating_add(1) {
                    // Claimed again and again without a completion: it crashes or hangs relays.
                    format!(
                        "claimed {} times without completing (relay crash or lease loss each time)",
                        message.attempts
                    )
                } else {
                    format!(
                        "the row arrived with attempts = {} (above the limit of {limit}): written so, or the limit was lowered since",
                        message.attempts - 1
                    )
                };
                verdicts.0.push(message);
                verdicts
                    .1
                    .push(Outcome::permanent(FailureClass::Other, reason));
                continue;
            }
            match relay.routes.get(&message.destination) {
                Some(sink) => match by_sink.iter_mut().find(|(s, _)| Arc::ptr_eq(s, sink)) {
                    Some((_, group)) => group.push(message),
                    None => by_sink.push((Arc::clone(sink), vec![message])),
                },
                None => {
                    let reason = format!("no route for destination {:?}", message.destination);
                    verdicts.0.push(message);
                    verdicts
                        .1
                        .push(Outcome::permanent(FailureClass::UnknownDestination, reason));
                }
            }
        }
        let judged: Arc<[Message]> = verdicts.0.into();
        let verdicts = verdicts
            .1
            .into_iter()
            .enumerate()
            .map(|(index, outcome)| Done {
                batch: Arc::clone(&judged),
                index,
                outcome,
            })
            .collect();
        let (sender, receiver) = mpsc::unbounded_channel();
        let mut publication = Self {
            groups: Vec::with_capacity(by_sink.len()),
            reported: Vec::with_capacity(by_sink.len()),
            tasks: JoinSet::new(),
            task_group: HashMap::new(),
            receiver,
            verdicts,
            unsettled: 0,
            timeout: relay.publish_timeout,
        };
        // Each group runs as its own task, so a panicking sink fails its own messages, not
        // the worker, and a slow sink holds back only its own messages.
        for (group, (sink, members)) in by_sink.into_iter().enumerate() {
            let batch: Arc<[Message]> = members.into();
            let sender = sender.clone();
            let outcomes = Outcomes::new(move |index, outcome| {
                let _ = sender.send((group, index, outcome));
            });
            let (shared, timeout) = (Arc::clone(&batch), publication.timeout);
            let destination = batch[0].destination.clone();
            let span = info_span!(
                "outbox_publish",
                destination = %destination,
                count = batch.len(),
                ids = ?batch.iter().map(|m| m.id).collect::<Vec<_>>()
            );
            #[cfg(feature = "opentelemetry")]
            crate::trace::link_messages(&span, &batch);
            let handle = publication.tasks.spawn(
                async move {
                    // The sink is told the deadline; the timeout is the backstop if it
                    // ignores it.
                    let cx = PublishContext::timeout(timeout);
                    let started = tokio::time::Instant::now();
                    let publish = sink.publish_reporting_dyn(&shared, &cx, &outcomes);
                    let timed_out = tokio::time::timeout_at(cx.deadline(), publish).await.is_err();
                    metrics::histogram!("outbox_publish_duration_seconds", "destination" => destination)
                        .record(started.elapsed().as_secs_f64());
                    timed_out
                }
                .instrument(span),
            );
            publication.task_group.insert(handle.id(), group);
            publication.unsettled += batch.len();
            publication.reported.push(vec![false; batch.len()]);
            publication.groups.push(batch);
        }
        publication
    }

    /// The outcomes that arrived since the last call, waiting for at least one; `None`
    /// once every message has its outcome.
    async fn next_outcomes(&mut self) -> Option<Vec<Done>> {
        let mut ready = std::mem::take(&mut self.verdicts);
        loop {
            self.take_reported(&mut ready);
            if !ready.is_empty() {
                return Some(ready);
            }
            if self.tasks.is_empty() {
                return None;
            }
            tokio::select! {
                Some((group, index, outcome)) = self.receiver.recv() => {
                    self.accept(group, index, outcome, &mut ready);
                }
                Some(joined) = self.tasks.join_next_with_id() => {
                    // Whatever the task reported before it ended is already queued.
                    self.take_reported(&mut ready);
                    let (id, failure) = match joined {
                        Ok((id, true)) => (id, Failure::retryable(
                            FailureClass::Timeout,
                            format!("publish timed out after {:?}", self.timeout),
                        )),
                        Ok((id, false)) => (id, Failure::retryable(
                            FailureClass::Other,
                            "the sink reported no outcome for this message",
                        )),
                        Err(error) => (error.id(), Failure::retryable(
                            FailureClass::Other,
                            format!("sink task failed: {error}"),
                        )),
                    };
                    let group = self.task_group[&id];
                    self.finish(group, failure, &mut ready);
                }
            }
        }
    }

    /// Whether every message has its outcome, handed out by [`next_outcomes`](Self::next_outcomes).
    fn settled(&self) -> bool {
        self.unsettled == 0 && self.verdicts.is_empty()
    }

    /// Moves every queued report into `ready`.
    fn take_reported(&mut self, ready: &mut Vec<Done>) {
        while let Ok((group, index, outcome)) = self.receiver.try_recv() {
            self.accept(group, index, outcome, ready);
        }
    }

    /// Keeps the first outcome reported for a message; later ones and bad indexes are
    /// ignored.
    fn accept(&mut self, group: usize, index: usize, outcome: Outcome, ready: &mut Vec<Done>) {
        if let Some(reported) = self.reported[group].get_mut(index)
            && !*reported
        {
            *reported = true;
            self.unsettled -= 1;
            ready.push(Done {
                batch: Arc::clone(&self.groups[group]),
                index,
                outcome,
            });
        }
    }

    /// A group's task ended (returned, timed out or panicked): every message it left
    /// without an outcome gets `failure`.
    fn finish(&mut self, group: usize, failure: Failure, ready: &mut Vec<Done>) {
        for index in 0..self.groups[group].len() {
            self.accept(group, index, failure.clone().into(), ready);
        }
    }
}

fn unix_seconds(t: chrono::DateTime<chrono::Utc>) -> f64 {
    t.timestamp_millis() as f64 / 1000.0
}
