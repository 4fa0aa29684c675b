//! The relay claims due rows from a [`Store`](crate::Store), publishes them through the
//! [`Sink`](crate::Sink) of their route, and records each outcome fenced by the claim's
//! lease token. A row is marked published only after its sink acknowledged it; every other
//! path (no route, a timeout, a panic, a missing outcome, a give-up) ends in a failure that
//! is retried or dead-lettered.
//!
//! # Building
//!
//! `Relay::builder(store)` collects routes (destination → sink, held as `Arc<dyn DynSink>`)
//! and settings; [`RelayBuilder::build`](crate::RelayBuilder::build) refuses what cannot
//! work with a [`ConfigError`](crate::ConfigError) naming the setting:
//!
//! | setting | default | accepted |
//! |---|---|---|
//! | `batch_size` | 100 | 1..=10,000 |
//! | `concurrency` (workers) | 1 | 1..=1024 |
//! | `lease` | 30 s | at least 10 ms |
//! | `publish_timeout` | half the lease | above zero and **shorter than the lease**, so a slow publish cannot outlive its lease |
//! | `poll_interval` | 1 s | above zero |
//! | `min_wakeup_interval` | 1 ms | any |
//! | `shutdown_grace` | 10 s | any |
//! | `gauge_interval`, `gauge_limit` | 10 s, 50,000 rows | at least 10 ms, above zero |
//! | `owner` | `relay-<pid>-<hex>` | 1 to 255 bytes |
//!
//! A relay needs at least one route, and every route name must be a valid destination.
//! Per-key ordering on a store whose [`Capabilities`](crate::Capabilities) declare none is
//! `ConfigError::Unsupported`. [`RelayBuilder::settings`](crate::RelayBuilder::settings)
//! applies a `RelaySettings` as configuration gives it; unset fields keep the builder's
//! values.
//!
//! The claim is restricted to the routed destinations, so relays with different routes
//! share one table and never touch each other's rows. With `dead_letter_unrouted(true)` a
//! relay claims every destination and dead-letters a message without a route as a permanent
//! `UnknownDestination` failure; that suits only a relay that is the table's sole reader.
//!
//! # Running
//!
//! [`Relay::run_once`](crate::Relay::run_once) claims and finishes one batch;
//! [`Relay::drain`](crate::Relay::drain) repeats it until a claim comes back empty. Tests
//! and one-shot jobs use them. [`Relay::run`](crate::Relay::run) spawns `concurrency`
//! workers, a wakeup pacer and, unless gauges are off, a gauge reader, and runs until its
//! `shutdown` future completes; [`Relay::spawn`](crate::Relay::spawn) runs it in a task of
//! its own until its handle's [`stop`](crate::RunningRelay::stop).
//!
//! ## The worker loop
//!
//! Each turn sets `outbox_relay_heartbeat_seconds`, beats the relay's health, and finishes
//! one batch. Then the worker claims again at once when:
//!
//! - the batch came back full (due rows may be left behind);
//! - with per-key ordering, the batch published or dead-lettered something: finishing a
//!   key's head is what makes the key's next row claimable, and that row's own wakeup was
//!   spent on a claim that had to skip it;
//! - it already holds the next batch (see below).
//!
//! Otherwise it waits for whichever comes first: a wakeup, the poll interval, or the stop
//! signal.
//!
//! When a full batch was claimed unordered from a store that declares
//! `overlapped_claims` (every store but SQLite, whose single writer would make the claim
//! wait for the completions), the worker claims its next batch at once, while the full
//! batch is published and completed, and starts its next turn on what that claim returned.
//! That batch is published only if at least a publish timeout of its lease is left;
//! otherwise its rows are given back (their attempt not counted) and claimed afresh.
//! `run_once` and `drain` never overlap.
//!
//! A store error never ends a worker. The worker logs it, counts
//! `outbox_store_errors_total`, and backs off for a full-jitter draw in
//! `[0, min(poll × 2^min(failures, 5), 30 s)]`, so relays that lost the database together
//! do not come back together; a wakeup still cuts the wait short. A batch already claimed
//! goes on at once, since its lease is running.
//!
//! ## Store deadlines
//!
//! Every store call the relay makes (claim, completion, release, gauge read) is given up
//! after one lease, as a retryable `StoreErrorKind::Timeout`. By then a claim's rows and a
//! completion's lease have lapsed anyway, and a connection that fell silent (no reply, no
//! reset) would otherwise hold the worker until the operating system gives up on it. Giving
//! up drops the call's future, so a store must be safe to cancel.
//!
//! ## Wakeups
//!
//! A [`Wakeup`](crate::Wakeup) is a cloneable signal that any number of sources raise
//! (in-process enqueue, PostgreSQL LISTEN/NOTIFY); a raise that happens while nobody waits
//! is kept, not lost. `run` subscribes one pacer task to it. Each raise wakes **one** idle
//! worker (a permit that is kept if every worker is busy); the pacer then sleeps
//! `min_wakeup_interval`, and the raises during that sleep become one more wake-up at its
//! end. Under load this turns a wakeup per commit into at most one claim per interval; a
//! lone commit is still claimed at once. Without a wakeup, or once every clone of it is
//! gone, polling alone drives the loop; polling is always on as the fallback.
//!
//! ## One batch
//!
//! 1. **Claim.** The lease token and the claimed ids go into the in-flight table. Rows the
//!    store could not read as messages come back in `Claim::rejected`, already
//!    dead-lettered by the store; the relay logs them and counts them as dead with class
//!    `undecodable`.
//! 2. **Crash-loop guard.** A message whose `attempts` exceed the retry policy's
//!    `max_attempts` was claimed again and again without a completion: it crashes or hangs
//!    relays. It fails permanently and is dead-lettered **without being published**.
//! 3. **Route.** A message without a route fails permanently as `UnknownDestination` (only
//!    a relay built with `dead_letter_unrouted` claims such messages). The others are grouped
//!    by sink (routes that share one sink value share a call). Each group's
//!    `publish_reporting` runs in a task of its own under the publish timeout, with the
//!    deadline in its `PublishContext`; groups run concurrently, so a slow or panicking
//!    sink delays or fails only its own messages. Sinks report each outcome as soon as it
//!    is known. When a task ends, every message of its group still without an outcome gets
//!    a retryable failure: `Timeout` if the timeout cut the call short, `Other` if the sink
//!    returned without reporting it or panicked. The first outcome reported for a message
//!    counts.
//! 4. **Decide** each outcome as it arrives. `Published` becomes `Completion::published`. A
//!    failure goes to `RetryPolicy::decide`:
//!    - a permanent failure gives up at once, with the failure as the reason;
//!    - at `attempts >= max_attempts` it gives up;
//!    - otherwise the delay is a full-jitter draw in
//!      `[0, min(max_delay, initial_delay × 2^(attempts − 1))]`, raised to the sink's
//!      `retry_after` when that is longer (a retry-after may exceed the cap);
//!    - if the next attempt would start more than `max_age` after `created_at`, it gives up.
//!
//!    A retryable failure the sink marked `deferred` (never sent: an open circuit, a rate
//!    limit, a paused route) goes to `RetryPolicy::decide_deferred` instead: it waits for
//!    its retry-after, does not count the attempt, and gives up only at `max_age`. Defaults:
//!    1 s initial delay, 5 min cap, 25 attempts, 3 days. A give-up becomes
//!    `Completion::dead`, a retry `Completion::retry`, a deferral `Completion::defer`.
//!
//!    Ages are measured in the store's frame: where the claim reported how long a message
//!    waited (PostgreSQL, the in-memory store), "now" is `created_at` plus that wait plus
//!    the relay's monotonic time since the claim, so a relay whose wall clock is off gives
//!    up neither early nor late. Elsewhere the relay's [`Clock`](crate::Clock) is used.
//! 5. **Complete** what has arrived in one `Store::complete` call, and repeat until every
//!    message is completed: outcomes that arrive while a call runs go in the next one, so
//!    an acknowledged message is marked without waiting for the batch's slowest. A retryable
//!    store error is retried up to three times after full-jitter pauses of at most 50 ms,
//!    200 ms and 800 ms. If it still fails, those rows stay leased until the lease lapses
//!    (a duplicate delivery later, never a loss); the batch goes on with the rest and then
//!    returns the error.
//! 6. **Account.** Completed rows leave the in-flight table. Rows the store reports stale
//!    (another relay reclaimed them) changed nothing: they are counted in
//!    `BatchReport::stale` and `outbox_lease_conflicts_total` and logged once per call as a
//!    warning. Every other metric counts applied completions only.
//!
//! ## Shutdown
//!
//! When `shutdown` completes, the workers stop claiming; health reports the relay as
//! stopping. A batch in progress runs to its completion, and so does one a worker claimed
//! alongside its last completion. `run` waits up to `shutdown_grace` for the workers. After
//! that it aborts them and releases every lease still in the in-flight table, so those rows
//! are due again at once and their attempt does not count. A failed release is logged; its
//! rows come back when the lease lapses.
//!
//! # Per-key ordering
//!
//! With `MessageOrder::PerKey(dead_head)` the relay puts the mode in its `ClaimRequest`, and
//! the store hands out only *heads*: keyed rows whose key has no unfinished row of the same
//! destination with a lower `seq` (nor a dead one, under `DeadHead::Halt`). `seq` is the
//! row's position within its key in commit order. A batch therefore holds at most one
//! message per key, a failing head holds back only its key, and relays need no coordinator.
//! Rows without a key are unordered. The mode is per relay: to order only some routes, run
//! a second relay for them.
//!
//! # Gauges and health
//!
//! `run` spawns one task that reads `Store::gauges` every `gauge_interval` (at most
//! `gauge_limit` unfinished and dead rows, through the due and dead indexes, so the cost
//! follows the backlog, not the finished rows), exports them, and keeps the latest in the
//! relay's [`RelayHealth`](crate::RelayHealth). Per destination: `outbox_backlog`,
//! `outbox_leased`, `outbox_dead_letters`, `outbox_halted_keys`,
//! `outbox_oldest_pending_age_seconds`, and `outbox_unrouted_rows` (the backlog of a
//! destination this relay has no route for), each back to 0 once the destination's rows are
//! gone; and `outbox_gauges_truncated`, 1 when a read stopped at its limit (the counts are
//! then lower bounds). With several relays on one table, one exporting them is enough: turn
//! gauges off on the others.
//!
//! [`Relay::health`](crate::Relay::health) returns the [`RelayHealth`](crate::RelayHealth):
//! `alive` fails when no worker beat within the heartbeat limit (three leases, at least two
//! minutes) or the relay is stopping; `ready` fails also until a claim is answered and
//! while claims fail; `objective` checks a [`LagObjective`](crate::LagObjective) (fresh
//! gauges, pending age per routed destination, no route failing every publish for
//! `max_failing`) and gates readiness only when asked to. A route's first failure and its
//! recovery are each logged once at warn level.
//!
//! # Metrics
//!
//! Recorded through the `metrics` facade; the application installs the recorder.
//! `series::SERIES` lists every series with its help text and what to alert on.
//!
//! | name | kind | labels | recorded |
//! |---|---|---|---|
//! | `outbox_relay_heartbeat_seconds` | gauge | | every worker turn, unix seconds by the relay clock |
//! | `outbox_claims_total` | counter | | every claim |
//! | `outbox_batch_size` | histogram | | rows of each non-empty claim |
//! | `outbox_publish_duration_seconds` | histogram | `destination` | each sink call |
//! | `outbox_messages_published_total` | counter | `destination` | published completions applied |
//! | `outbox_commit_to_publish_seconds` | histogram | `destination`, `since` | the same rows: the store's measured wait plus the relay's time since the claim; `since` is `commit`, `transaction_start` or `insert` |
//! | `outbox_messages_retried_total` | counter | `destination`, `class` | retries applied |
//! | `outbox_messages_deferred_total` | counter | `destination`, `class` | deferrals applied |
//! | `outbox_messages_dead_total` | counter | `destination`, `class` | dead letters applied, and unreadable rows |
//! | `outbox_lease_conflicts_total` | counter | | stale completions |
//! | `outbox_store_errors_total` | counter | | failed claims, completions and gauge reads in `run` |
//!
//! # Tracing
//!
//! Each worker runs in an `outbox_relay_worker` span (`owner`, `worker`); each claim in an
//! `outbox_claim` span (batch size, rows claimed). Each non-empty batch is a root span,
//! `outbox_batch` (owner, rows claimed, lease token), so every batch is a trace of its own
//! rather than part of the worker's endless one. Inside it, each sink call is an
//! `outbox_publish` span (destination, count, ids), which with the `opentelemetry` feature
//! links to the trace context of every message it sends, and each completion call an
//! `outbox_complete` span (count, ids). Retries and deferrals are logged at debug level,
//! dead letters and lost leases at warn, each with the message id, destination, attempt,
//! class and error.

mod builder;
mod publication;
mod running;

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::{Notify, watch};
use tokio::task::JoinSet;
use tracing::{Instrument, Span, debug, debug_span, info_span, warn};

pub use builder::RelayBuilder;
pub use running::RunningRelay;

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
    /// Looked up for every message: hashed with foldhash rather than SipHash.
    routes: foldhash::HashMap<String, Arc<dyn DynSink>>,
    claim: ClaimRequest,
    publish_timeout: Duration,
    retry: RetryPolicy,
    clock: Arc<dyn Clock>,
    /// Leases held by batches in progress, released on a forced shutdown.
    in_flight: Mutex<HashMap<LeaseToken, InFlight>>,
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

    /// Runs the relay in a task of its own on the current Tokio runtime, as
    /// [`run`](Self::run) does, until the handle's [`stop`](RunningRelay::stop).
    ///
    /// # Panics
    ///
    /// Outside a Tokio runtime.
    pub fn spawn(self) -> RunningRelay {
        RunningRelay::spawn(|shutdown| self.run(shutdown))
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
                Some(Ok(ahead)) => match self.in_time(ahead).await {
                    Some(ahead) => Ok(ahead),
                    None => self.claim_batch().await,
                },
                Some(failed) => failed,
                None => self.claim_batch().await,
            };
            let result = match claimed {
                Ok(claimed) => {
                    // A full batch may have left due rows behind: claim them while this
                    // batch is published, where the store allows it. Not with per-key
                    // ordering, where this batch's completion unblocks the next claim.
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
        if let Some(Ok(ahead)) = next
            && let Some(claimed) = self.in_time(ahead).await
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
            let held = InFlight {
                claimed: claim.messages.iter().map(|m| m.id).collect(),
                settled: foldhash::HashSet::default(),
            };
            self.lock_in_flight().insert(claim.lease.token, held);
        }
        Ok(Claimed {
            claim,
            claimed_at,
            report,
        })
    }

    /// A batch claimed ahead, if enough of its lease is left to publish it: a whole
    /// publish timeout, as a batch just claimed has. Otherwise (the batch before it was
    /// slow) its rows are given back, their attempt not counted, for a fresh claim.
    async fn in_time(&self, ahead: Claimed) -> Option<Claimed> {
        let left = self.claim.lease.saturating_sub(ahead.claimed_at.elapsed());
        if left >= self.publish_timeout || ahead.claim.messages.is_empty() {
            return Some(ahead);
        }
        debug!(
            ?left,
            "a batch claimed ahead has too little lease left; releasing it"
        );
        let token = ahead.claim.lease.token;
        let held = self.lock_in_flight().remove(&token);
        if let Some(held) = held {
            self.release(token, held).await;
        }
        None
    }

    /// Publishes a claimed batch and records the outcomes. With `overlap`, the next batch
    /// is claimed while this one is published, and returned too.
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
        let publish = async {
            // Outcomes arrive one by one (each sink group reports as its receiver answers)
            // and are completed as they come: while one completion call runs, the next
            // outcomes queue up and go in the following call.
            let mut publication = Publication::start(self, claim.messages);
            let mut result = Ok(());
            while let Some(ready) = publication.next_outcomes().await {
                let completed = self
                    .complete_outcomes(token, claimed_at, &ready, &mut report)
                    .await;
                if let Err(error) = completed
                    && result.is_ok()
                {
                    result = Err(error);
                }
            }
            result
        }
        .instrument(batch);
        let next = async {
            if overlap {
                Some(self.claim_batch().instrument(worker).await)
            } else {
                None
            }
        };
        let (result, following) = tokio::join!(publish, next);
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
            held.settle(ready);
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
        let mut published = foldhash::HashMap::<&str, u64>::default();
        let mut lags = foldhash::HashMap::<(&str, WaitedSince), metrics::Histogram>::default();
        let since_claim = claimed_at.elapsed();
        let mut activity = Vec::new();
        for (message, completion, class) in applied {
            let destination = message.destination.as_str();
            let class = class.unwrap_or_default();
            match &completion.action {
                CompleteAction::Published => {
                    report.published += 1;
                    let (lag, since) = commit_to_publish(message, now, since_claim);
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
        for (token, held) in held {
            self.release(token, held).await;
        }
    }

    /// Gives back the rows of `held` not completed yet; on failure they return when the
    /// lease lapses.
    async fn release(&self, token: LeaseToken, held: InFlight) {
        let ids = held.unsettled();
        if ids.is_empty() {
            return;
        }
        match self.within_lease(self.store.release(token, &ids)).await {
            Ok(report) => debug!(released = report.applied, "released in-flight lease"),
            Err(error) => {
                warn!(%error, "could not release a lease; its rows return when it lapses")
            }
        }
    }

    fn lock_in_flight(&self) -> std::sync::MutexGuard<'_, HashMap<LeaseToken, InFlight>> {
        self.in_flight.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The messages of a batch in progress, and those of them already completed.
struct InFlight {
    claimed: Vec<MessageId>,
    settled: foldhash::HashSet<MessageId>,
}

impl InFlight {
    /// Counts the `ready` messages as completed. A batch completed in one call (the usual
    /// case) is settled without hashing an id.
    fn settle(&mut self, ready: &[Done]) {
        if self.settled.len() + ready.len() >= self.claimed.len() {
            self.claimed.clear();
            self.settled.clear();
        } else {
            self.settled
                .extend(ready.iter().map(|done| done.message().id));
        }
    }

    /// The messages not completed yet.
    fn unsettled(&self) -> Vec<MessageId> {
        let settled = &self.settled;
        self.claimed
            .iter()
            .filter(|id| !settled.contains(id))
            .copied()
            .collect()
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
    since_claim: Duration,
) -> (Duration, WaitedSince) {
    match message.waited {
        Some(waited) => (waited.duration + since_claim, waited.since),
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
