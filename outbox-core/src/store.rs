//! The relay side of a store: claim, complete, release, what it declares it can do, and
//! the operator's traits (stats, dead letters, find, purge).
//!
//! Enqueueing is not here on purpose: it happens inside the application's own
//! transaction, with the backend crate's types (`outbox-sqlx`, `outbox-diesel`), or with
//! [`MemoryStore::enqueue`](crate::MemoryStore::enqueue) in tests.

use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::error::StoreError;
use crate::message::{Message, MessageId};
use crate::registry::PublishedRows;
use crate::state::{Lease, LeaseToken, Status};

/// How messages that share a partition key are ordered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum MessageOrder {
    /// No ordering: any message may be published as soon as it is due. Highest throughput.
    #[default]
    Unordered,
    /// Messages with the same partition key and the same destination are published one at
    /// a time, in commit order: a message is claimed only when every earlier message of
    /// its key on its destination is finished. Messages without a partition key are
    /// unordered. Different keys run in parallel, and so does one key on two
    /// destinations (one aggregate's events fanned out to two endpoints are two
    /// independent sequences).
    PerKey(DeadHead),
}

/// What per-key ordering does when a key's oldest unfinished message is dead-lettered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum DeadHead {
    /// Go on with the key's next message (default): a dead letter is finished.
    #[default]
    Skip,
    /// Hold the key's later messages until an operator replays or discards the dead one.
    Halt,
}

/// What a relay asks for when it claims.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClaimRequest {
    /// The relay's name, stored as `lease_owner` for operators.
    pub owner: String,
    /// Most rows to lease.
    pub batch_size: usize,
    /// How long the lease lasts (measured by the store's clock).
    pub lease: Duration,
    /// Only these destinations; `None` claims every destination.
    pub destinations: Option<Vec<String>>,
    /// Per-key ordering, if any.
    pub ordering: MessageOrder,
}

impl ClaimRequest {
    /// A request for up to `batch_size` rows of any destination.
    pub fn new(owner: impl Into<String>, batch_size: usize, lease: Duration) -> Self {
        Self {
            owner: owner.into(),
            batch_size,
            lease,
            destinations: None,
            ordering: MessageOrder::Unordered,
        }
    }

    /// Claims in `ordering`.
    pub fn ordering(mut self, ordering: MessageOrder) -> Self {
        self.ordering = ordering;
        self
    }

    /// Restricts the claim to these destinations.
    pub fn destinations(mut self, destinations: Vec<String>) -> Self {
        self.destinations = Some(destinations);
        self
    }

    /// Whether `destination` passes the filter.
    pub fn wants(&self, destination: &str) -> bool {
        self.destinations
            .as_ref()
            .is_none_or(|d| d.iter().any(|x| x == destination))
    }
}

/// Rows leased by one claim, all under the same lease.
#[derive(Debug, Clone)]
pub struct Claim {
    /// The lease every row in `messages` carries.
    pub lease: Lease,
    /// The leased messages, oldest first.
    pub messages: Vec<Message>,
    /// Rows the claim took but could not read as messages (written by another program,
    /// say); the store dead-lettered each of them with its reason.
    pub rejected: Vec<Rejected>,
}

impl Claim {
    /// A claim of `messages` under `lease`, with nothing rejected.
    pub fn new(lease: Lease, messages: Vec<Message>) -> Self {
        Self {
            lease,
            messages,
            rejected: Vec::new(),
        }
    }
}

/// A claimed row that could not be decoded into a [`Message`]; the store dead-lettered it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejected {
    /// The row's id as stored (it may be the value that could not be decoded).
    pub id: String,
    /// The row's destination, when it could be read.
    pub destination: Option<String>,
    /// What could not be decoded, naming the column; also the dead letter's reason.
    pub reason: String,
}

/// How a leased row ends its attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CompleteAction {
    /// The sink acknowledged it.
    Published,
    /// Try again after `delay` (from the store's clock).
    Retry {
        /// Backoff before the next claim.
        delay: Duration,
        /// The failure, kept in `last_error`.
        error: String,
    },
    /// Try again after `delay` without counting this attempt: the message was never sent
    /// (see [`Failure::deferred`](crate::Failure::deferred)).
    Defer {
        /// Wait before the next claim.
        delay: Duration,
        /// Why it was not sent, kept in `last_error`.
        error: String,
    },
    /// Give up; the row stays queryable as a dead letter.
    Dead {
        /// Why.
        reason: String,
    },
}

/// The completion of one leased row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    /// The row.
    pub id: MessageId,
    /// What happened.
    pub action: CompleteAction,
}

impl Completion {
    /// Marks `id` published.
    pub fn published(id: MessageId) -> Self {
        Self {
            id,
            action: CompleteAction::Published,
        }
    }
    /// Schedules `id` again after `delay`.
    pub fn retry(id: MessageId, delay: Duration, error: impl Into<String>) -> Self {
        Self {
            id,
            action: CompleteAction::Retry {
                delay,
                error: error.into(),
            },
        }
    }
    /// Schedules `id` again after `delay`, giving the attempt back.
    pub fn defer(id: MessageId, delay: Duration, error: impl Into<String>) -> Self {
        Self {
            id,
            action: CompleteAction::Defer {
                delay,
                error: error.into(),
            },
        }
    }
    /// Dead-letters `id`.
    pub fn dead(id: MessageId, reason: impl Into<String>) -> Self {
        Self {
            id,
            action: CompleteAction::Dead {
                reason: reason.into(),
            },
        }
    }
}

/// What a fenced operation did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CompleteReport {
    /// Rows changed.
    pub applied: usize,
    /// Rows left alone because their lease token no longer matched (another relay
    /// reclaimed them, or they were already completed).
    pub stale: Vec<MessageId>,
}

/// The relay side of an outbox table.
///
/// # Contract
///
/// - [`claim`](Store::claim) leases up to `batch_size` rows that are pending and due, or
///   leased with a lapsed lease, in one atomic step; two concurrent claims never return
///   the same row. Each claimed row's `attempts` grows by one. Rows come oldest first.
/// - A claimed row that cannot be decoded into a [`Message`] (a column another program
///   wrote with the wrong shape) never fails the claim: the store dead-letters that row
///   alone, with a reason naming the column, reports it in [`Claim::rejected`], and
///   returns the rest of the batch.
/// - [`complete`](Store::complete) and [`release`](Store::release) change a row only if
///   it is still leased with the given token, and report every other row as stale.
/// - With [`MessageOrder::PerKey`], a row with a partition key is claimed only when every row
///   of the same key and destination committed before it is finished (published, or dead under
///   [`DeadHead::Skip`]); the store defines "committed before" so that it equals commit
///   order, whatever order the ids were assigned in.
/// - Time (due, lease deadlines, backoff) is measured by the store's clock, so relays on
///   hosts with skewed clocks agree.
/// - A failed call changes nothing, or its effect is the same as if it had succeeded
///   before a crash (a relay crash at any point must never lose a row).
pub trait Store: Send + Sync + 'static {
    /// What the store does; the relay refuses settings that need what it lacks.
    fn capabilities(&self) -> Capabilities;

    /// Leases a batch. An empty claim has an empty `messages`.
    fn claim(
        &self,
        request: &ClaimRequest,
    ) -> impl Future<Output = Result<Claim, StoreError>> + Send;

    /// Records how each leased row ended, fenced by `token`.
    fn complete(
        &self,
        token: LeaseToken,
        completions: &[Completion],
    ) -> impl Future<Output = Result<CompleteReport, StoreError>> + Send;

    /// Gives leased rows back without counting the attempt (graceful shutdown).
    fn release(
        &self,
        token: LeaseToken,
        ids: &[MessageId],
    ) -> impl Future<Output = Result<CompleteReport, StoreError>> + Send;

    /// The unfinished and dead rows per destination, read so that the cost follows the
    /// backlog and the dead letters, never the finished rows: each count stops after
    /// `limit` rows (then [`Gauges::truncated`] says the figures are lower bounds). The
    /// relay exports them as metrics and checks its lag objective with them. `None`: the
    /// store has no gauges (the default).
    fn gauges(
        &self,
        limit: usize,
    ) -> impl Future<Output = Result<Option<Gauges>, StoreError>> + Send {
        let _ = limit;
        std::future::ready(Ok(None))
    }
}

/// The figures an operator alerts on, per destination, as [`Store::gauges`] reads them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Gauges {
    /// One entry per destination with unfinished or dead rows, sorted by destination.
    pub destinations: Vec<DestinationGauges>,
    /// A count reached the limit: the figures are lower bounds, and the oldest age is
    /// that of the earliest due rows read.
    pub truncated: bool,
}

impl Gauges {
    /// The gauges that full `stats` give at `now` (the store's clock), counting at most
    /// `limit` unfinished and `limit` dead rows in all, as a store reading rows would:
    /// for a store whose stats are cheap, such as [`MemoryStore`].
    ///
    /// [`MemoryStore`]: crate::MemoryStore
    pub fn from_stats(stats: &Stats, now: DateTime<Utc>, limit: usize) -> Self {
        let limit = u64::try_from(limit).unwrap_or(u64::MAX);
        let (mut unfinished, mut dead) = (limit, limit);
        let take = |budget: &mut u64, n: u64| {
            let taken = n.min(*budget);
            *budget -= taken;
            taken
        };
        let mut gauges = Gauges::default();
        for d in &stats.destinations {
            if d.backlog() + d.dead == 0 {
                continue;
            }
            let pending = take(&mut unfinished, d.pending);
            let leased = take(&mut unfinished, d.leased);
            let dead_letters = take(&mut dead, d.dead);
            gauges.truncated |= pending + leased < d.backlog() || dead_letters < d.dead;
            gauges.destinations.push(DestinationGauges {
                destination: d.destination.clone(),
                pending,
                leased,
                dead: dead_letters,
                halted_keys: d.halted_keys,
                oldest_pending_age: d.oldest_pending_age(now),
            });
        }
        gauges.truncated |= unfinished == 0 || dead == 0;
        gauges
    }

    /// The entry for `destination`, if it has unfinished or dead rows.
    pub fn destination(&self, destination: &str) -> Option<&DestinationGauges> {
        self.destinations
            .iter()
            .find(|d| d.destination == destination)
    }
}

/// The gauges of one destination.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DestinationGauges {
    /// The route name.
    pub destination: String,
    /// Pending rows, due or scheduled.
    pub pending: u64,
    /// Leased rows.
    pub leased: u64,
    /// Dead letters.
    pub dead: u64,
    /// Keys that a dead head holds back (see [`DestinationStats::halted_keys`]).
    pub halted_keys: u64,
    /// How long the oldest pending or leased row has been in the table, by the store's
    /// clock.
    pub oldest_pending_age: Option<Duration>,
}

impl DestinationGauges {
    /// An all-zero entry for `destination`.
    pub fn new(destination: impl Into<String>) -> Self {
        Self {
            destination: destination.into(),
            ..Self::default()
        }
    }

    /// Rows not yet finished: pending plus leased.
    pub fn backlog(&self) -> u64 {
        self.pending + self.leased
    }
}

/// Counts for one destination.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DestinationStats {
    /// The route name.
    pub destination: String,
    /// Pending rows, due or scheduled.
    pub pending: u64,
    /// Leased rows, including lapsed leases not yet reclaimed.
    pub leased: u64,
    /// Dead letters.
    pub dead: u64,
    /// Published rows still kept in the table.
    pub published: u64,
    /// `created_at` of the oldest pending or leased row.
    pub oldest_pending_created_at: Option<DateTime<Utc>>,
    /// Partition keys with a dead letter followed by unfinished messages: the keys that
    /// [`DeadHead::Halt`] holds back until an operator replays or discards.
    pub halted_keys: u64,
}

impl DestinationStats {
    /// An all-zero entry for `destination`.
    pub fn new(destination: impl Into<String>) -> Self {
        Self {
            destination: destination.into(),
            ..Self::default()
        }
    }

    /// Rows not yet finished: pending plus leased.
    pub fn backlog(&self) -> u64 {
        self.pending + self.leased
    }

    /// Age of the oldest unfinished row at `now`.
    pub fn oldest_pending_age(&self, now: DateTime<Utc>) -> Option<Duration> {
        self.oldest_pending_created_at
            .map(|t| (now - t).to_std().unwrap_or(Duration::ZERO))
    }
}

/// Counts per destination, sorted by destination.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// One entry per destination that has rows.
    pub destinations: Vec<DestinationStats>,
}

impl Stats {
    /// The entry for `destination`, if it has rows.
    pub fn destination(&self, destination: &str) -> Option<&DestinationStats> {
        self.destinations
            .iter()
            .find(|d| d.destination == destination)
    }

    /// Sums over every destination.
    pub fn total(&self) -> DestinationStats {
        let mut total = DestinationStats::new("*");
        for d in &self.destinations {
            total.pending += d.pending;
            total.leased += d.leased;
            total.dead += d.dead;
            total.published += d.published;
            total.halted_keys += d.halted_keys;
            total.oldest_pending_created_at =
                match (total.oldest_pending_created_at, d.oldest_pending_created_at) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
        }
        total
    }
}

/// Optional capability: counts for dashboards and the CLI.
pub trait StoreStats: Send + Sync {
    /// Counts per destination.
    fn stats(&self) -> impl Future<Output = Result<Stats, StoreError>> + Send;
}

/// Which dead letters an operation applies to. Empty fields match everything; set fields
/// must all match.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeadLetterFilter {
    /// Only these ids.
    pub ids: Vec<MessageId>,
    /// Only these destinations.
    pub destinations: Vec<String>,
    /// Only these event types.
    pub event_types: Vec<String>,
    /// Created at or after.
    pub created_after: Option<DateTime<Utc>>,
    /// Created before.
    pub created_before: Option<DateTime<Utc>>,
    /// The reason contains this text (case-sensitive).
    pub error_contains: Option<String>,
    /// Only ids above this one: the last id of the previous page, for paging through a
    /// list (dead letters are listed in id order).
    pub after_id: Option<MessageId>,
}

impl DeadLetterFilter {
    /// Matches every dead letter.
    pub fn all() -> Self {
        Self::default()
    }
    /// Only these ids.
    pub fn ids(mut self, ids: impl IntoIterator<Item = MessageId>) -> Self {
        self.ids.extend(ids);
        self
    }
    /// Only this destination (call again to add more).
    pub fn destination(mut self, destination: impl Into<String>) -> Self {
        self.destinations.push(destination.into());
        self
    }
    /// Only this event type (call again to add more).
    pub fn event_type(mut self, event_type: impl Into<String>) -> Self {
        self.event_types.push(event_type.into());
        self
    }
    /// Created in `[after, before)`.
    pub fn created_between(
        mut self,
        after: Option<DateTime<Utc>>,
        before: Option<DateTime<Utc>>,
    ) -> Self {
        self.created_after = after;
        self.created_before = before;
        self
    }
    /// The reason contains `text`.
    pub fn error_contains(mut self, text: impl Into<String>) -> Self {
        self.error_contains = Some(text.into());
        self
    }
    /// Only ids above `id` (the next page after a list that ended with `id`).
    pub fn after_id(mut self, id: MessageId) -> Self {
        self.after_id = Some(id);
        self
    }

    /// Whether a dead letter matches (used by the in-memory store and tests).
    pub fn matches(&self, message: &Message, reason: &str) -> bool {
        (self.ids.is_empty() || self.ids.contains(&message.id))
            && (self.destinations.is_empty() || self.destinations.contains(&message.destination))
            && (self.event_types.is_empty() || self.event_types.contains(&message.event_type))
            && self.created_after.is_none_or(|t| message.created_at >= t)
            && self.created_before.is_none_or(|t| message.created_at < t)
            && self
                .error_contains
                .as_ref()
                .is_none_or(|s| reason.contains(s.as_str()))
            && self.after_id.is_none_or(|id| message.id > id)
    }
}

/// A dead-lettered message with why and when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    /// The message as stored.
    pub message: Message,
    /// Why it was given up on.
    pub reason: String,
    /// When.
    pub dead_at: DateTime<Utc>,
}

/// Optional capability: operate dead letters.
pub trait DeadLetters: Send + Sync {
    /// Up to `limit` matching dead letters, oldest first.
    fn list_dead(
        &self,
        filter: &DeadLetterFilter,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<DeadLetter>, StoreError>> + Send;

    /// How many dead letters match, counted by the store without reading them (what a
    /// replay or discard with the same filter would touch, barring concurrent changes).
    fn count_dead(
        &self,
        filter: &DeadLetterFilter,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Makes matching dead letters pending again, due now, with zero attempts.
    fn replay_dead(
        &self,
        filter: &DeadLetterFilter,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Deletes matching dead letters.
    fn discard_dead(
        &self,
        filter: &DeadLetterFilter,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;
}

/// A message found by [`FindMessages::find_messages`], in whatever state it is.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct FoundMessage {
    /// The message as stored.
    pub message: Message,
    /// Its state now.
    pub status: Status,
    /// The last failure (kept after a replay), if any.
    pub last_error: Option<String>,
    /// When it was published, if it was (and the store keeps published rows).
    pub published_at: Option<DateTime<Utc>>,
    /// When it was dead-lettered, if it is dead.
    pub dead_at: Option<DateTime<Utc>>,
    /// When it may be claimed next, if it waits (pending: its next attempt; leased: when
    /// its lease lapses).
    pub next_attempt: Option<DateTime<Utc>>,
}

impl FoundMessage {
    /// A found message with no failure and no finish time.
    pub fn new(message: Message, status: Status) -> Self {
        Self {
            message,
            status,
            last_error: None,
            published_at: None,
            dead_at: None,
            next_attempt: None,
        }
    }
}

/// Optional capability: find messages for an operator, whatever their state.
pub trait FindMessages: Send + Sync {
    /// Up to `limit` messages whose id or idempotency key is `key`, in id order. Finding by
    /// id reads the primary key; finding by idempotency key reads the whole table on the
    /// SQL stores (the key has no index, which would tax every enqueue).
    fn find_messages(
        &self,
        key: &str,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<FoundMessage>, StoreError>> + Send;

    /// Up to `limit` rows still waiting to be published (pending or leased) that `filter`
    /// matches (its fields as for dead letters: ids, destinations, event types, creation
    /// times, text of the last error, ids above), in id order: what an operator reads to
    /// see why a backlog does not move. Each has its attempts, last error and
    /// [`next_attempt`](FoundMessage::next_attempt).
    fn list_waiting(
        &self,
        filter: &DeadLetterFilter,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<FoundMessage>, StoreError>> + Send;
}

/// Which finished rows a purge deletes.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PurgeRequest {
    /// Delete published rows finished at least this long ago.
    pub published_older_than: Duration,
    /// Also delete dead letters that died at least this long ago; `None` keeps them.
    pub dead_older_than: Option<Duration>,
    /// Most rows one call deletes, so a purge never holds long locks.
    pub batch_size: usize,
}

impl PurgeRequest {
    /// Purges published rows older than `age`, 1,000 rows a call, keeping dead letters.
    pub fn published_older_than(age: Duration) -> Self {
        Self {
            published_older_than: age,
            dead_older_than: None,
            batch_size: 1000,
        }
    }
    /// Also purges dead letters older than `age`.
    pub fn dead_older_than(mut self, age: Duration) -> Self {
        self.dead_older_than = Some(age);
        self
    }
    /// Sets the per-call bound.
    pub fn batch_size(mut self, n: usize) -> Self {
        self.batch_size = n;
        self
    }
}

/// Optional capability: retention.
pub trait Purge: Send + Sync {
    /// Deletes at most `request.batch_size` finished rows (a store in the
    /// [`Rotate`](crate::PublishedRows::Rotate) layout instead empties its oldest slot when
    /// that is due, whatever it holds) and, on stores that number keyed
    /// rows, the counter rows of at most `request.batch_size` keys left with no pending,
    /// leased or dead row (a key's numbering then starts again; see decision 0030);
    /// returns how many rows in all. Call again until it returns less than the batch size
    /// (see [`purge_all`]).
    fn purge(&self, request: &PurgeRequest)
    -> impl Future<Output = Result<u64, StoreError>> + Send;
}

/// Runs [`Purge::purge`] in bounded batches until nothing old is left; returns the total.
pub async fn purge_all<P: Purge + ?Sized>(
    store: &P,
    request: &PurgeRequest,
) -> Result<u64, StoreError> {
    let mut total = 0;
    loop {
        let n = store.purge(request).await?;
        total += n;
        if n < request.batch_size as u64 {
            return Ok(total);
        }
    }
}

/// What a store does, as it declares it: the relay refuses at [`build`] a setting that needs
/// what the store lacks, `outbox status` and the dashboard print it, and the conformance
/// suite holds the store to it.
///
/// [`build`]: crate::RelayBuilder::build
///
/// ```
/// use outbox_engine::{Capabilities, PublishedRows, Wakeups};
///
/// let memory = Capabilities::new("memory")
///     .published_rows(PublishedRows::Delete)
///     .wakeups(Wakeups::InProcess);
/// assert_eq!(
///     memory.to_string(),
///     "memory: published rows delete, per-key ordering yes, gauges yes, wakeups in-process, \
///      overlapped claims yes"
/// );
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[non_exhaustive]
pub struct Capabilities {
    /// The store's short name, such as `postgres`.
    pub store: &'static str,
    /// What happens to a published row.
    pub published_rows: PublishedRows,
    /// Whether claims honour [`MessageOrder::PerKey`].
    pub per_key_ordering: bool,
    /// Whether [`Store::gauges`] reads gauges (rather than `None`).
    pub gauges: bool,
    /// Who can wake a relay before its next poll.
    pub wakeups: Wakeups,
    /// Whether a claim may run while completions are being written, on another
    /// connection: the relay then claims its next batch as soon as a full one comes back.
    /// Not where writers queue behind one another (SQLite), as the two would only wait.
    pub overlapped_claims: bool,
}

impl Capabilities {
    /// A store named `store` that keeps published rows, orders per key, reads gauges, has
    /// no wakeups and lets a claim overlap a completion; change what differs with the
    /// setters.
    pub fn new(store: &'static str) -> Self {
        Self {
            store,
            published_rows: PublishedRows::Keep,
            per_key_ordering: true,
            gauges: true,
            wakeups: Wakeups::Poll,
            overlapped_claims: true,
        }
    }

    /// Sets what happens to a published row.
    #[must_use]
    pub fn published_rows(mut self, mode: PublishedRows) -> Self {
        self.published_rows = mode;
        self
    }

    /// Sets whether claims honour per-key ordering.
    #[must_use]
    pub fn per_key_ordering(mut self, supported: bool) -> Self {
        self.per_key_ordering = supported;
        self
    }

    /// Sets whether the store reads gauges.
    #[must_use]
    pub fn gauges(mut self, supported: bool) -> Self {
        self.gauges = supported;
        self
    }

    /// Sets who can wake a relay.
    #[must_use]
    pub fn wakeups(mut self, wakeups: Wakeups) -> Self {
        self.wakeups = wakeups;
        self
    }

    /// Sets whether a claim may run while a completion is being written.
    #[must_use]
    pub fn overlapped_claims(mut self, supported: bool) -> Self {
        self.overlapped_claims = supported;
        self
    }
}

impl std::fmt::Display for Capabilities {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let rows = match self.published_rows {
            PublishedRows::Keep => "keep",
            PublishedRows::Delete => "delete",
            PublishedRows::Rotate => "rotate",
        };
        let yes = |b: bool| if b { "yes" } else { "no" };
        write!(
            f,
            "{}: published rows {rows}, per-key ordering {}, gauges {}, wakeups {}, overlapped claims {}",
            self.store,
            yes(self.per_key_ordering),
            yes(self.gauges),
            self.wakeups,
            yes(self.overlapped_claims)
        )
    }
}

/// Who can wake a relay before its next poll, through the store's
/// [`Backend::listen`](crate::Backend::listen).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum Wakeups {
    /// Nobody: relays find new rows at their next poll.
    Poll,
    /// Enqueues through this process's store value (SQLite, MySQL, memory).
    InProcess,
    /// Any writer of the database, in any process or language (PostgreSQL NOTIFY).
    Database,
}

impl std::fmt::Display for Wakeups {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Poll => "none (polling)",
            Self::InProcess => "in-process",
            Self::Database => "from the database",
        })
    }
}
