//! The relay: claims due rows, publishes them through their route's sink, and records the
//! outcome — published only after the sink acknowledged.

mod builder;
mod publication;

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::{Notify, watch};
use tokio::task::JoinSet;
use tracing::{Instrument, Span, debug, debug_span, info_span, warn};

pub use builder::RelayBuilder;

use crate::clock::Clock;
use crate::error::{StoreError, StoreErrorKind};
use crate::health::{GaugeSettings, RelayHealth};
use crate::message::{Message, MessageId, WaitedSince};
use crate::retry::{Decision, RetryPolicy};
use crate::sink::{DynSink, Failure, FailureClass, Outcome};
use crate::state::LeaseToken;
use crate::store::{ClaimRequest, CompleteAction, Completion, MessageOrder, Store};
use crate::wakeup::Wakeup;
use publication::{Done, Publication};

/// Moves messages from a [`Store`] to their [`Sink`](crate::Sink)s.
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
        let (completions, classes) = self.completions(ready, now, claimed_at);
        let span = debug_span!(
            "outbox_complete",
            count = completions.len(),
            ids = ?completions.iter().map(|c| c.id).collect::<Vec<_>>()
        );
        let completed = self.complete(token, &completions).instrument(span).await?;
        self.settle_in_flight(token, ready);
        let stale = count_stale(token, completed.stale, report);
        let applied = ready
            .iter()
            .zip(&completions)
            .zip(classes)
            .filter(|((done, _), _)| !stale.contains(&done.message().id))
            .map(|((done, completion), class)| (done.message(), completion, class));
        self.record_applied(applied, now, claimed_at, report);
        Ok(())
    }

    /// The completion of each of the `ready` messages, with its failure's class when it
    /// failed.
    fn completions(
        &self,
        ready: &[Done],
        now: DateTime<Utc>,
        claimed_at: tokio::time::Instant,
    ) -> (Vec<Completion>, Vec<Option<&'static str>>) {
        ready
            .iter()
            .map(|done| {
                let message = done.message();
                match &done.outcome {
                    Outcome::Published { .. } => (Completion::published(message.id), None),
                    Outcome::Failed(failure) => (
                        self.failed(message, failure, store_now(message, now, claimed_at)),
                        Some(failure.class.as_str()),
                    ),
                }
            })
            .unzip()
    }

    /// Takes the completed `ready` messages out of `token`'s lease in flight: a forced
    /// shutdown no longer releases them.
    fn settle_in_flight(&self, token: LeaseToken, ready: &[Done]) {
        if let Some(held) = self.lock_in_flight().get_mut(&token) {
            for done in ready {
                held.remove(&done.message().id);
            }
        }
    }

    /// Counts the completions the store applied, each with its message and its failure's
    /// class, in `report`, the metrics and the routes' health, and logs them.
    fn record_applied<'a>(
        &self,
        applied: impl Iterator<Item = (&'a Message, &'a Completion, Option<&'static str>)>,
        now: DateTime<Utc>,
        claimed_at: tokio::time::Instant,
        report: &mut BatchReport,
    ) {
        // Metric handles are looked up once per destination per call, not per message.
        let mut published: HashMap<&str, u64> = HashMap::new();
        let mut lags: HashMap<(&str, WaitedSince), metrics::Histogram> = HashMap::new();
        let mut activity = Vec::new();
        for (message, completion, class) in applied {
            let destination = message.destination.as_str();
            let class = class.unwrap_or_default();
            match &completion.action {
                CompleteAction::Published => {
                    report.published += 1;
                    let (lag, since) = commit_to_publish(message, now, claimed_at);
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

/// The lag `outbox_commit_to_publish_seconds` records for `message`, and what it is
/// measured from: the store's measure of the wait up to the claim, plus this relay's
/// monotonic time since; the relay's clock only where the store has none.
fn commit_to_publish(
    message: &Message,
    now: DateTime<Utc>,
    claimed_at: tokio::time::Instant,
) -> (Duration, WaitedSince) {
    match message.waited {
        Some(waited) => (waited.duration + claimed_at.elapsed(), waited.since),
        None => (
            (now - message.created_at).to_std().unwrap_or_default(),
            WaitedSince::Insert,
        ),
    }
}

/// Counts in `report` and the metrics the completions `token` had lost to another relay,
/// says so, and returns their ids.
fn count_stale(
    token: LeaseToken,
    stale: Vec<MessageId>,
    report: &mut BatchReport,
) -> HashSet<MessageId> {
    report.stale += stale.len();
    if !stale.is_empty() {
        metrics::counter!("outbox_lease_conflicts_total").increment(stale.len() as u64);
        warn!(
            stale = stale.len(),
            ids = ?stale,
            token = %token.as_uuid(),
            "lease lost before completion: another relay owns these rows now, nothing changed"
        );
    }
    stale.into_iter().collect()
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

fn unix_seconds(t: chrono::DateTime<chrono::Utc>) -> f64 {
    t.timestamp_millis() as f64 / 1000.0
}
