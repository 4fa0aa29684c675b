//! A complete in-memory [`Store`], for tests and examples.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use chrono::{DateTime, Utc};

use crate::clock::{Clock, SystemClock};
use crate::error::{StoreError, StoreErrorKind};
use crate::message::{Message, MessageId, NewMessage, Waited, WaitedSince, chrono_duration};
use crate::registry::PublishedRows;
use crate::state::{Lease, LeaseToken, Row, RowState, Status};
use crate::store::{
    Capabilities, Claim, ClaimRequest, CompleteReport, Completion, DeadHead, DeadLetter,
    DeadLetterFilter, DeadLetters, DestinationStats, FindMessages, FoundMessage, Gauges,
    MessageOrder, Purge, PurgeRequest, Stats, Store, StoreStats, Wakeups,
};
use crate::wakeup::Wakeup;

/// An in-memory outbox that keeps every guarantee of the SQL stores except durability.
///
/// Clones share the same rows. Time comes from a [`Clock`], so tests can use a
/// [`ManualClock`](crate::ManualClock) to expire leases and backoffs instantly.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use std::time::Duration;
/// use outbox_engine::{ClaimRequest, Completion, MemoryStore, NewMessage, Store};
///
/// let store = MemoryStore::new();
/// store.enqueue(NewMessage::builder("billing", "invoice.paid").json(&42).build()?)?;
///
/// let claim = store.claim(&ClaimRequest::new("relay-1", 10, Duration::from_secs(30))).await?;
/// assert_eq!(claim.messages.len(), 1);
/// let done: Vec<_> = claim.messages.iter().map(|m| Completion::published(m.id)).collect();
/// let report = store.complete(claim.lease.token, &done).await?;
/// assert_eq!(report.applied, 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[derive(Debug, Clone)]
pub struct MemoryStore {
    inner: Arc<Mutex<Inner>>,
    clock: Arc<dyn Clock>,
    wakeup: Wakeup,
    delete_on_publish: bool,
}

#[derive(Debug, Default)]
struct Inner {
    rows: BTreeMap<MessageId, Entry>,
    /// Ids of pending and leased rows, oldest first: what a claim scans.
    active: BTreeSet<MessageId>,
    /// The last sequence number handed out per partition key.
    key_seq: HashMap<String, u64>,
}

#[derive(Debug, Clone)]
struct Entry {
    message: Message,
    row: Row,
    /// Position within the partition key, in commit (here: enqueue) order.
    seq: Option<u64>,
}

/// One row as the in-memory store holds it, for assertions in tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowSnapshot {
    /// The message (with its current `attempts`).
    pub message: Message,
    /// Its state.
    pub row: Row,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// An empty store on the system clock.
    pub fn new() -> Self {
        Self::with_clock(SystemClock)
    }

    /// An empty store on `clock`.
    pub fn with_clock(clock: impl Clock) -> Self {
        Self {
            inner: Arc::default(),
            clock: Arc::new(clock),
            wakeup: Wakeup::new(),
            delete_on_publish: false,
        }
    }

    /// Deletes rows when they are published instead of keeping them as `published`.
    pub fn delete_on_publish(mut self, enabled: bool) -> Self {
        self.delete_on_publish = enabled;
        self
    }

    /// The wakeup every enqueue raises, for a relay's
    /// [`wakeup`](crate::RelayBuilder::wakeup); the same signal
    /// [`Backend::listen`](crate::Backend::listen) returns.
    pub fn wakeup(&self) -> Wakeup {
        self.wakeup.clone()
    }

    /// Inserts one message and raises the wakeup signal.
    ///
    /// # Errors
    ///
    /// [`StoreErrorKind::Constraint`] if a message with the same id exists.
    pub fn enqueue(&self, message: NewMessage) -> Result<MessageId, StoreError> {
        let id = message.id();
        self.enqueue_all([message])?;
        Ok(id)
    }

    /// Inserts messages atomically (all or none) and raises the wakeup signal once.
    ///
    /// # Errors
    ///
    /// [`StoreErrorKind::Constraint`] if any id exists already or repeats in the batch.
    pub fn enqueue_all(
        &self,
        messages: impl IntoIterator<Item = NewMessage>,
    ) -> Result<usize, StoreError> {
        let now = self.clock.now();
        let messages: Vec<(Message, DateTime<Utc>)> = messages
            .into_iter()
            .map(|m| {
                let due = m.available_at(now);
                (m.into_message(now), due)
            })
            .collect();
        let mut inner = self.lock();
        let mut seen = BTreeSet::new();
        for (m, _) in &messages {
            if inner.rows.contains_key(&m.id) || !seen.insert(m.id) {
                return Err(StoreError::new(
                    StoreErrorKind::Constraint,
                    format!("duplicate message id {}", m.id),
                ));
            }
        }
        let n = messages.len();
        for (message, due) in messages {
            inner.active.insert(message.id);
            // Enqueue is the commit here, so numbering at enqueue is commit order.
            let seq = message.partition_key.clone().map(|key| {
                let n = inner.key_seq.entry(key).or_default();
                *n += 1;
                *n
            });
            let row = Row::new(due);
            inner.rows.insert(message.id, Entry { message, row, seq });
        }
        drop(inner);
        if n > 0 {
            self.wakeup.notify();
        }
        Ok(n)
    }

    /// The row with `id`, if the store has it.
    pub fn row(&self, id: MessageId) -> Option<RowSnapshot> {
        self.lock().rows.get(&id).map(Entry::snapshot)
    }

    /// Every row, oldest first.
    pub fn rows(&self) -> Vec<RowSnapshot> {
        self.lock().rows.values().map(Entry::snapshot).collect()
    }

    /// Ids of rows in `status`, oldest first.
    pub fn ids_with_status(&self, status: Status) -> Vec<MessageId> {
        self.lock()
            .rows
            .values()
            .filter(|e| e.row.status() == status)
            .map(|e| e.message.id)
            .collect()
    }

    /// The clock this store reads.
    pub fn clock(&self) -> &dyn Clock {
        self.clock.as_ref()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave a row half-changed: every mutation
        // is a single assignment on an entry. Keep serving.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn claim_now(&self, request: &ClaimRequest) -> Claim {
        let now = self.clock.now();
        let lease = Lease {
            owner: request.owner.clone(),
            token: LeaseToken::new(),
            until: now + chrono_duration(request.lease),
        };
        let mut inner = self.lock();
        let heads = match request.ordering {
            MessageOrder::Unordered => None,
            MessageOrder::PerKey(policy) => Some(inner.key_heads(policy)),
        };
        let Inner { rows, active, .. } = &mut *inner;
        let mut messages = Vec::new();
        for id in active.iter() {
            if messages.len() >= request.batch_size {
                break;
            }
            let entry = rows.get_mut(id).expect("active ids have rows");
            let is_head = match (&heads, &entry.message.partition_key, entry.seq) {
                (Some(heads), Some(key), Some(seq)) => {
                    let scoped = (entry.message.destination.clone(), key.clone());
                    heads.get(&scoped) == Some(&seq)
                }
                _ => true,
            };
            if is_head
                && request.wants(&entry.message.destination)
                && entry.row.claim(now, lease.clone()).is_ok()
            {
                entry.message.attempts = entry.row.attempts;
                let mut message = entry.message.clone();
                message.waited = Some(Waited {
                    duration: (now - message.created_at).to_std().unwrap_or_default(),
                    since: WaitedSince::Commit,
                });
                messages.push(message);
            }
        }
        Claim::new(lease, messages)
    }

    fn fenced<F>(&self, ids: impl Iterator<Item = (MessageId, F)>) -> CompleteReport
    where
        F: FnOnce(&mut Row) -> Result<(), crate::state::TransitionError>,
    {
        let mut inner = self.lock();
        let mut report = CompleteReport::default();
        let mut finished = Vec::new();
        for (id, apply) in ids {
            let Some(entry) = inner.rows.get_mut(&id) else {
                report.stale.push(id);
                continue;
            };
            if apply(&mut entry.row).is_err() {
                report.stale.push(id);
                continue;
            }
            entry.message.attempts = entry.row.attempts;
            report.applied += 1;
            if entry.row.due_at().is_none() {
                finished.push((id, entry.row.status()));
            }
        }
        for (id, status) in finished {
            inner.active.remove(&id);
            if self.delete_on_publish && status == Status::Published {
                inner.rows.remove(&id);
            }
        }
        report
    }
}

impl Inner {
    /// The lowest sequence number per (destination, key) among rows that hold the key
    /// back: pending and leased rows, and dead ones under [`DeadHead::Halt`]. Keys are
    /// scoped per destination: one key fanned out to two destinations is two sequences.
    fn key_heads(&self, policy: DeadHead) -> HashMap<(String, String), u64> {
        let mut heads: HashMap<(String, String), u64> = HashMap::new();
        let blocking = self.rows.values().filter(|e| match e.row.status() {
            Status::Pending | Status::Leased => true,
            Status::Dead => policy == DeadHead::Halt,
            Status::Published => false,
        });
        for entry in blocking {
            if let (Some(key), Some(seq)) = (&entry.message.partition_key, entry.seq) {
                let head = heads
                    .entry((entry.message.destination.clone(), key.clone()))
                    .or_insert(seq);
                *head = (*head).min(seq);
            }
        }
        heads
    }

    /// Per destination, its keys with a dead row followed by an unfinished one.
    fn halted_keys(&self) -> HashMap<String, u64> {
        let mut first_dead: HashMap<(&str, &str), u64> = HashMap::new();
        for e in self.rows.values() {
            if let (Status::Dead, Some(key), Some(seq)) =
                (e.row.status(), &e.message.partition_key, e.seq)
            {
                let first = first_dead
                    .entry((e.message.destination.as_str(), key.as_str()))
                    .or_insert(seq);
                *first = (*first).min(seq);
            }
        }
        let mut halted: HashSet<(&str, &str)> = HashSet::new();
        for e in self.rows.values() {
            if let (Status::Pending | Status::Leased, Some(key), Some(seq)) =
                (e.row.status(), &e.message.partition_key, e.seq)
            {
                let scoped = (e.message.destination.as_str(), key.as_str());
                if first_dead.get(&scoped).is_some_and(|dead| *dead < seq) {
                    halted.insert(scoped);
                }
            }
        }
        let mut per_destination = HashMap::new();
        for (destination, _) in halted {
            *per_destination.entry(destination.to_owned()).or_default() += 1;
        }
        per_destination
    }
}

impl Entry {
    /// The entry as an operator finds it: message, status and last failure.
    fn found(&self) -> FoundMessage {
        let mut found = FoundMessage::new(self.message.clone(), self.row.status());
        found.last_error = self.row.last_error.clone();
        found
    }

    fn snapshot(&self) -> RowSnapshot {
        RowSnapshot {
            message: self.message.clone(),
            row: self.row.clone(),
        }
    }
}

impl Store for MemoryStore {
    fn capabilities(&self) -> Capabilities {
        let rows = if self.delete_on_publish {
            PublishedRows::Delete
        } else {
            PublishedRows::Keep
        };
        Capabilities::new("memory")
            .published_rows(rows)
            .wakeups(Wakeups::InProcess)
    }

    async fn claim(&self, request: &ClaimRequest) -> Result<Claim, StoreError> {
        Ok(self.claim_now(request))
    }

    async fn gauges(&self, limit: usize) -> Result<Option<Gauges>, StoreError> {
        let stats = self.stats().await?;
        Ok(Some(Gauges::from_stats(&stats, self.clock.now(), limit)))
    }

    async fn complete(
        &self,
        token: LeaseToken,
        completions: &[Completion],
    ) -> Result<CompleteReport, StoreError> {
        let now = self.clock.now();
        Ok(self.fenced(completions.iter().map(|c| {
            (c.id, move |row: &mut Row| {
                row.complete(token, now, &c.action)
            })
        })))
    }

    async fn release(
        &self,
        token: LeaseToken,
        ids: &[MessageId],
    ) -> Result<CompleteReport, StoreError> {
        let now = self.clock.now();
        let report = self.fenced(
            ids.iter()
                .map(|id| (*id, move |row: &mut Row| row.release(token, now))),
        );
        if report.applied > 0 {
            self.wakeup.notify();
        }
        Ok(report)
    }
}

impl StoreStats for MemoryStore {
    async fn stats(&self) -> Result<Stats, StoreError> {
        let inner = self.lock();
        let mut by_destination: BTreeMap<&str, DestinationStats> = BTreeMap::new();
        for entry in inner.rows.values() {
            let d = by_destination
                .entry(&entry.message.destination)
                .or_insert_with(|| DestinationStats::new(entry.message.destination.clone()));
            match entry.row.status() {
                Status::Pending => d.pending += 1,
                Status::Leased => d.leased += 1,
                Status::Published => d.published += 1,
                Status::Dead => d.dead += 1,
            }
            if matches!(entry.row.status(), Status::Pending | Status::Leased) {
                let created = entry.message.created_at;
                d.oldest_pending_created_at = Some(
                    d.oldest_pending_created_at
                        .map_or(created, |t| t.min(created)),
                );
            }
        }
        for (destination, n) in inner.halted_keys() {
            if let Some(d) = by_destination.get_mut(destination.as_str()) {
                d.halted_keys = n;
            }
        }
        Ok(Stats {
            destinations: by_destination.into_values().collect(),
        })
    }
}

impl FindMessages for MemoryStore {
    async fn find_messages(
        &self,
        key: &str,
        limit: usize,
    ) -> Result<Vec<FoundMessage>, StoreError> {
        let inner = self.lock();
        Ok(inner
            .rows
            .values()
            .filter(|e| e.message.id.to_string() == key || e.message.idempotency_key == key)
            .take(limit)
            .map(|e| {
                let mut found = e.found();
                match &e.row.state {
                    RowState::Published { at } => found.published_at = Some(*at),
                    RowState::Dead { at, .. } => found.dead_at = Some(*at),
                    RowState::Pending { .. } | RowState::Leased(_) => {}
                }
                found
            })
            .collect())
    }

    async fn list_waiting(
        &self,
        filter: &DeadLetterFilter,
        limit: usize,
    ) -> Result<Vec<FoundMessage>, StoreError> {
        let inner = self.lock();
        Ok(inner
            .rows
            .values()
            .filter_map(|e| {
                let next = match &e.row.state {
                    RowState::Pending { available_at } => *available_at,
                    RowState::Leased(lease) => lease.until,
                    RowState::Published { .. } | RowState::Dead { .. } => return None,
                };
                let error = e.row.last_error.as_deref().unwrap_or_default();
                filter.matches(&e.message, error).then(|| {
                    let mut found = e.found();
                    found.next_attempt = Some(next);
                    found
                })
            })
            .take(limit)
            .collect())
    }
}

impl DeadLetters for MemoryStore {
    async fn list_dead(
        &self,
        filter: &DeadLetterFilter,
        limit: usize,
    ) -> Result<Vec<DeadLetter>, StoreError> {
        let inner = self.lock();
        Ok(inner
            .rows
            .values()
            .filter_map(|e| match &e.row.state {
                RowState::Dead { at, reason } if filter.matches(&e.message, reason) => {
                    Some(DeadLetter {
                        message: e.message.clone(),
                        reason: reason.clone(),
                        dead_at: *at,
                    })
                }
                _ => None,
            })
            .take(limit)
            .collect())
    }

    async fn count_dead(&self, filter: &DeadLetterFilter) -> Result<u64, StoreError> {
        let inner = self.lock();
        let n = inner
            .rows
            .values()
            .filter(|e| {
                matches!(&e.row.state, RowState::Dead { reason, .. } if filter.matches(&e.message, reason))
            })
            .count();
        Ok(n as u64)
    }

    async fn replay_dead(&self, filter: &DeadLetterFilter) -> Result<u64, StoreError> {
        let now = self.clock.now();
        let mut inner = self.lock();
        let Inner { rows, active, .. } = &mut *inner;
        let mut n = 0;
        for entry in rows.values_mut() {
            let matches = matches!(&entry.row.state, RowState::Dead { reason, .. } if filter.matches(&entry.message, reason));
            if matches && entry.row.replay(now).is_ok() {
                entry.message.attempts = 0;
                active.insert(entry.message.id);
                n += 1;
            }
        }
        drop(inner);
        if n > 0 {
            self.wakeup.notify();
        }
        Ok(n)
    }

    async fn discard_dead(&self, filter: &DeadLetterFilter) -> Result<u64, StoreError> {
        let mut inner = self.lock();
        let before = inner.rows.len();
        inner.rows.retain(|_, e| {
            !matches!(&e.row.state, RowState::Dead { reason, .. } if filter.matches(&e.message, reason))
        });
        Ok((before - inner.rows.len()) as u64)
    }
}

impl Purge for MemoryStore {
    async fn purge(&self, request: &PurgeRequest) -> Result<u64, StoreError> {
        let now = self.clock.now();
        let published_cutoff = now - chrono_duration(request.published_older_than);
        let dead_cutoff = request
            .dead_older_than
            .map(|age| now - chrono_duration(age));
        let mut inner = self.lock();
        let doomed: Vec<MessageId> = inner
            .rows
            .values()
            .filter(|e| match &e.row.state {
                RowState::Published { at } => *at <= published_cutoff,
                RowState::Dead { at, .. } => dead_cutoff.is_some_and(|cutoff| *at <= cutoff),
                _ => false,
            })
            .map(|e| e.message.id)
            .take(request.batch_size)
            .collect();
        for id in &doomed {
            inner.rows.remove(id);
        }
        Ok(doomed.len() as u64)
    }
}

/// Nothing to migrate; the listener is the in-process wakeup raised by every enqueue.
impl crate::backend::Backend for MemoryStore {
    async fn migrate(&self) -> Result<(), StoreError> {
        Ok(())
    }

    async fn listen(&self) -> Result<Option<crate::backend::Listener>, StoreError> {
        Ok(Some(crate::backend::Listener::new(self.wakeup.clone(), ())))
    }

    async fn notify(&self) -> Result<(), StoreError> {
        self.wakeup.notify();
        Ok(())
    }
}
