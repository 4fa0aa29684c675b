//! An in-memory [`Inbox`] with transactions, for consumers' tests.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::Notify;

use crate::clock::{Clock, SystemClock};
use crate::error::StoreError;
use crate::message::chrono_duration;
use crate::receive::{Delivery, Inbox, check_key};

/// An in-memory inbox that behaves like the SQL ones: a record belongs to its
/// [`MemoryInboxTx`] until that commits, a concurrent delivery of the same key waits for
/// it, and a transaction dropped without commit forgets its records.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use outbox_engine::{Delivery, Inbox, testkit::MemoryInbox};
///
/// let inbox = MemoryInbox::new();
/// let mut tx = inbox.begin();
/// assert_eq!(inbox.record(&mut tx, "billing", "k").await?, Delivery::New);
/// tx.commit();
///
/// let mut tx = inbox.begin();
/// assert_eq!(inbox.record(&mut tx, "billing", "k").await?, Delivery::Duplicate);
/// # Ok::<(), outbox_engine::StoreError>(())
/// # }).unwrap();
/// ```
#[derive(Debug, Clone)]
pub struct MemoryInbox {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    slots: Mutex<HashMap<(String, String), Slot>>,
    /// Signalled whenever a transaction ends, so waiting deliveries look again.
    ended: Notify,
    next_tx: AtomicU64,
    clock: Arc<dyn Clock>,
}

#[derive(Debug, Clone, Copy)]
enum Slot {
    /// Written by a transaction that has not ended.
    Pending(u64),
    Committed(DateTime<Utc>),
}

/// A transaction on a [`MemoryInbox`]: the inbox's [`Connection`](Inbox::Connection).
#[derive(Debug)]
pub struct MemoryInboxTx {
    shared: Arc<Shared>,
    id: u64,
    written: Vec<(String, String)>,
}

impl Default for MemoryInbox {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryInbox {
    /// An empty inbox on the system clock.
    pub fn new() -> Self {
        Self::with_clock(SystemClock)
    }

    /// An empty inbox whose records are stamped by `clock` (a
    /// [`ManualClock`](crate::ManualClock) makes retention testable without waiting).
    pub fn with_clock(clock: impl Clock) -> Self {
        Self {
            shared: Arc::new(Shared {
                slots: Mutex::new(HashMap::new()),
                ended: Notify::new(),
                next_tx: AtomicU64::new(1),
                clock: Arc::new(clock),
            }),
        }
    }

    /// Starts a transaction.
    pub fn begin(&self) -> MemoryInboxTx {
        MemoryInboxTx {
            shared: Arc::clone(&self.shared),
            id: self.shared.next_tx.fetch_add(1, Ordering::Relaxed),
            written: Vec::new(),
        }
    }

    /// How many committed records the inbox holds.
    pub fn len(&self) -> usize {
        let slots = self.shared.slots.lock().expect("inbox lock");
        slots
            .values()
            .filter(|s| matches!(s, Slot::Committed(_)))
            .count()
    }

    /// `true` when no record is committed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl MemoryInboxTx {
    /// Makes this transaction's records visible to every later delivery.
    pub fn commit(mut self) {
        let now = self.shared.clock.now();
        self.end(Slot::Committed(now));
    }

    /// Forgets this transaction's records (dropping it does the same).
    pub fn rollback(self) {}

    fn end(&mut self, to: Slot) {
        let mut slots = self.shared.slots.lock().expect("inbox lock");
        for key in self.written.drain(..) {
            match to {
                Slot::Committed(_) => {
                    slots.insert(key, to);
                }
                Slot::Pending(_) => {
                    slots.remove(&key);
                }
            }
        }
        drop(slots);
        self.shared.ended.notify_waiters();
    }
}

impl Drop for MemoryInboxTx {
    fn drop(&mut self) {
        if !self.written.is_empty() {
            self.end(Slot::Pending(self.id));
        }
    }
}

impl Inbox for MemoryInbox {
    type Connection = MemoryInboxTx;

    async fn record(
        &self,
        tx: &mut MemoryInboxTx,
        consumer: &str,
        key: &str,
    ) -> Result<Delivery, StoreError> {
        check_key("consumer", consumer)?;
        check_key("key", key)?;
        let slot_key = (consumer.to_owned(), key.to_owned());
        loop {
            // Registered before looking, so an end between the look and the wait is seen.
            let ended = self.shared.ended.notified();
            {
                let mut slots = self.shared.slots.lock().expect("inbox lock");
                match slots.get(&slot_key) {
                    Some(Slot::Committed(_)) => return Ok(Delivery::Duplicate),
                    Some(Slot::Pending(owner)) if *owner == tx.id => {
                        return Ok(Delivery::Duplicate);
                    }
                    Some(Slot::Pending(_)) => {}
                    None => {
                        slots.insert(slot_key.clone(), Slot::Pending(tx.id));
                        tx.written.push(slot_key);
                        return Ok(Delivery::New);
                    }
                }
            }
            ended.await;
        }
    }

    async fn purge(
        &self,
        _tx: &mut MemoryInboxTx,
        older_than: Duration,
        batch_size: usize,
    ) -> Result<u64, StoreError> {
        let Some(cutoff) = self
            .shared
            .clock
            .now()
            .checked_sub_signed(chrono_duration(older_than))
        else {
            return Ok(0);
        };
        let mut slots = self.shared.slots.lock().expect("inbox lock");
        let old: Vec<_> = slots
            .iter()
            .filter(|(_, slot)| matches!(slot, Slot::Committed(at) if *at <= cutoff))
            .map(|(key, _)| key.clone())
            .take(batch_size)
            .collect();
        for key in &old {
            slots.remove(key);
        }
        Ok(old.len() as u64)
    }
}
