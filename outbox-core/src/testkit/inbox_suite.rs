//! The inbox conformance suite: every [`Inbox`] must pass every check here.
//!
//! Each check takes a fresh [`InboxHarness`] and panics with a message saying which part
//! of the contract broke; [`run_all`] runs them all.
//!
//! ```
//! # tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap().block_on(async {
//! use outbox_engine::testkit::{MemoryInboxHarness, inbox_suite};
//!
//! inbox_suite::run_all(|| async { MemoryInboxHarness::new() }).await;
//! # });
//! ```

use std::future::Future;
use std::time::Duration;

use futures_util::future::join_all;

use crate::clock::ManualClock;
use crate::error::{StoreError, StoreErrorKind};
use crate::receive::{Delivery, Inbox};
use crate::testkit::{MemoryInbox, MemoryInboxTx};

/// What the suite needs besides the [`Inbox`]: transactions on its connection type, and
/// a way to age the records already written.
pub trait InboxHarness: Send + Sync {
    /// The inbox under test.
    type Inbox: Inbox;
    /// An open transaction.
    type Tx: Send;

    /// The inbox under test, empty.
    fn inbox(&self) -> &Self::Inbox;

    /// Opens a transaction.
    fn begin(&self) -> impl Future<Output = Self::Tx> + Send;

    /// The connection `tx` runs on.
    fn conn(tx: &mut Self::Tx) -> &mut <Self::Inbox as Inbox>::Connection;

    /// Commits `tx`.
    fn commit(tx: Self::Tx) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Rolls `tx` back.
    fn rollback(tx: Self::Tx) -> impl Future<Output = ()> + Send;

    /// Makes the records committed so far `by` older (SQL harnesses move their
    /// timestamps back instead of sleeping).
    fn age(&self, by: Duration) -> impl Future<Output = ()> + Send;
}

/// [`MemoryInbox`] on a [`ManualClock`].
#[derive(Debug, Clone)]
pub struct MemoryInboxHarness {
    inbox: MemoryInbox,
    clock: ManualClock,
}

impl MemoryInboxHarness {
    /// A fresh empty inbox.
    pub fn new() -> Self {
        let clock = ManualClock::new();
        Self {
            inbox: MemoryInbox::with_clock(clock.clone()),
            clock,
        }
    }
}

impl Default for MemoryInboxHarness {
    fn default() -> Self {
        Self::new()
    }
}

impl InboxHarness for MemoryInboxHarness {
    type Inbox = MemoryInbox;
    type Tx = MemoryInboxTx;

    fn inbox(&self) -> &MemoryInbox {
        &self.inbox
    }

    async fn begin(&self) -> MemoryInboxTx {
        self.inbox.begin()
    }

    fn conn(tx: &mut MemoryInboxTx) -> &mut MemoryInboxTx {
        tx
    }

    async fn commit(tx: MemoryInboxTx) -> Result<(), StoreError> {
        tx.commit();
        Ok(())
    }

    async fn rollback(tx: MemoryInboxTx) {
        tx.rollback();
    }

    async fn age(&self, by: Duration) {
        self.clock.advance(by);
    }
}

/// Runs every check, each on a fresh harness from `factory`, printing each name.
pub async fn run_all<H: InboxHarness>(factory: impl AsyncFn() -> H) {
    run_checks!(factory, |_: &H, name| eprintln!("inbox conformance: {name}");
        first_delivery_is_new_then_duplicate,
        keys_are_scoped_per_consumer_and_compared_exactly,
        unfit_keys_are_refused,
        rollback_forgets_the_record,
        concurrent_duplicates_apply_once,
        many_keys_delivered_three_times_by_four_consumers_apply_once_each,
        a_waiting_duplicate_takes_over_after_a_rollback,
        retention_forgets_only_old_records_in_bounded_batches,
    );
}

/// Records one key in its own transaction and commits it.
async fn deliver<H: InboxHarness>(h: &H, consumer: &str, key: &str) -> Delivery {
    let mut tx = h.begin().await;
    let delivery = h
        .inbox()
        .record(H::conn(&mut tx), consumer, key)
        .await
        .expect("record");
    H::commit(tx).await.expect("commit");
    delivery
}

/// A key is new once; every later delivery, in the same transaction or after commit,
/// is a duplicate.
pub async fn first_delivery_is_new_then_duplicate<H: InboxHarness>(h: &H) {
    let mut tx = h.begin().await;
    let inbox = h.inbox();
    assert_eq!(
        inbox
            .record(H::conn(&mut tx), "billing", "order-1")
            .await
            .expect("record"),
        Delivery::New,
        "the first delivery is new"
    );
    assert_eq!(
        inbox
            .record(H::conn(&mut tx), "billing", "order-1")
            .await
            .expect("record"),
        Delivery::Duplicate,
        "a second record in the same transaction sees the first"
    );
    H::commit(tx).await.expect("commit");
    assert_eq!(
        deliver(h, "billing", "order-1").await,
        Delivery::Duplicate,
        "a delivery after commit is a duplicate"
    );
}

/// Consumers dedupe separately, and keys compare byte for byte (no case folding, no
/// trailing-space padding), up to 191 bytes.
pub async fn keys_are_scoped_per_consumer_and_compared_exactly<H: InboxHarness>(h: &H) {
    let long = "k".repeat(191);
    assert_eq!(deliver(h, "billing", "k").await, Delivery::New);
    assert_eq!(
        deliver(h, "shipping", "k").await,
        Delivery::New,
        "another consumer has its own records"
    );
    for key in ["K", "k ", "ké", "k\u{00a0}", long.as_str()] {
        assert_eq!(
            deliver(h, "billing", key).await,
            Delivery::New,
            "{key:?} is a different key from \"k\""
        );
    }
    assert_eq!(
        deliver(h, "billing", &long).await,
        Delivery::Duplicate,
        "a 191-byte key is kept whole"
    );
}

/// What [`check_key`](crate::receive::check_key) refuses (empty, over 191 bytes, NUL) is
/// refused as invalid input, not recorded or cut.
pub async fn unfit_keys_are_refused<H: InboxHarness>(h: &H) {
    let mut tx = h.begin().await;
    let long = "k".repeat(192);
    for (consumer, key) in [
        ("billing", ""),
        ("", "order-1"),
        ("billing", long.as_str()),
        ("billing", "a\0b"),
        (long.as_str(), "order-1"),
    ] {
        let e = h
            .inbox()
            .record(H::conn(&mut tx), consumer, key)
            .await
            .expect_err("an unfit consumer or key is refused");
        assert_eq!(
            e.kind(),
            StoreErrorKind::InvalidInput,
            "{consumer:?}/{key:?}: {e}"
        );
    }
    H::rollback(tx).await;
}

/// A record is part of the consumer's transaction: rolling back forgets it.
pub async fn rollback_forgets_the_record<H: InboxHarness>(h: &H) {
    let mut tx = h.begin().await;
    assert_eq!(
        h.inbox()
            .record(H::conn(&mut tx), "billing", "order-1")
            .await
            .expect("record"),
        Delivery::New
    );
    H::rollback(tx).await;
    assert_eq!(
        deliver(h, "billing", "order-1").await,
        Delivery::New,
        "a rolled-back record is forgotten"
    );
    assert_eq!(deliver(h, "billing", "order-1").await, Delivery::Duplicate);
}

/// Delivers `key` in its own transaction until it is not refused with a retryable error
/// (a consumer retries the whole transaction), holding the transaction for `hold` after
/// a new record as a side effect would.
async fn deliver_retrying<H: InboxHarness>(h: &H, key: &str, hold: Duration) -> Delivery {
    for _ in 0..20 {
        let mut tx = h.begin().await;
        match h.inbox().record(H::conn(&mut tx), "billing", key).await {
            Ok(delivery) => {
                if delivery.is_new() && !hold.is_zero() {
                    tokio::time::sleep(hold).await;
                }
                match H::commit(tx).await {
                    Ok(()) => return delivery,
                    Err(e) if e.is_retryable() => {}
                    Err(e) => panic!("{key}: commit failed: {e}"),
                }
            }
            Err(e) if e.is_retryable() => H::rollback(tx).await,
            Err(e) => panic!("{key}: record failed: {e}"),
        }
    }
    panic!("{key}: 20 retryable failures in a row");
}

/// Eight concurrent deliveries of one key, each holding its transaction open for a
/// while after recording: exactly one applies its side effect and commits as new. A
/// delivery refused with a retryable error retries its whole transaction, as a consumer
/// would.
pub async fn concurrent_duplicates_apply_once<H: InboxHarness>(h: &H) {
    let hold = Duration::from_millis(50);
    let deliveries = join_all((0..8).map(|_| deliver_retrying(h, "order-1", hold))).await;
    let applied = deliveries.iter().filter(|d| d.is_new()).count();
    assert_eq!(
        applied, 1,
        "exactly one of 8 concurrent deliveries of a key applies it (got {deliveries:?})"
    );
    assert_eq!(deliver(h, "billing", "order-1").await, Delivery::Duplicate);
}

/// 300 keys, each delivered three times, by four concurrent consumers taking deliveries
/// from one queue (copies of a key are usually in flight together): each key is new
/// exactly once.
pub async fn many_keys_delivered_three_times_by_four_consumers_apply_once_each<H: InboxHarness>(
    h: &H,
) {
    const KEYS: usize = 300;
    let queue: Vec<String> = (0..KEYS)
        .flat_map(|k| std::iter::repeat_n(format!("order-{k}"), 3))
        .collect();
    let queue = std::sync::Mutex::new(queue);
    let consumer = || async {
        let mut new = Vec::new();
        loop {
            let Some(key) = queue.lock().expect("queue").pop() else {
                return new;
            };
            if deliver_retrying(h, &key, Duration::ZERO).await.is_new() {
                new.push(key);
            }
        }
    };
    let mut new: Vec<String> = join_all((0..4).map(|_| consumer())).await.concat();
    new.sort();
    let mut expected: Vec<String> = (0..KEYS).map(|k| format!("order-{k}")).collect();
    expected.sort();
    assert_eq!(
        new, expected,
        "every key is new exactly once across 3 deliveries"
    );
}

/// A delivery that waits behind an open transaction holding the same key becomes the
/// new one when that transaction rolls back.
pub async fn a_waiting_duplicate_takes_over_after_a_rollback<H: InboxHarness>(h: &H) {
    let mut first = h.begin().await;
    assert_eq!(
        h.inbox()
            .record(H::conn(&mut first), "billing", "order-1")
            .await
            .expect("record"),
        Delivery::New
    );
    let second = deliver_retrying(h, "order-1", Duration::ZERO);
    let first_rolls_back = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        H::rollback(first).await;
    };
    let (delivery, ()) = tokio::join!(second, first_rolls_back);
    assert_eq!(
        delivery,
        Delivery::New,
        "after the first delivery rolled back, the waiting one is new"
    );
    assert_eq!(deliver(h, "billing", "order-1").await, Delivery::Duplicate);
}

/// Purge forgets records older than the retention, at most a batch at a time, and
/// keeps younger ones.
pub async fn retention_forgets_only_old_records_in_bounded_batches<H: InboxHarness>(h: &H) {
    for key in ["old-1", "old-2", "old-3"] {
        assert_eq!(deliver(h, "billing", key).await, Delivery::New);
    }
    h.age(Duration::from_secs(2 * 3600)).await;
    assert_eq!(deliver(h, "billing", "young").await, Delivery::New);

    let hour = Duration::from_secs(3600);
    let mut purged = Vec::new();
    for _ in 0..3 {
        let mut tx = h.begin().await;
        let n = h
            .inbox()
            .purge(H::conn(&mut tx), hour, 2)
            .await
            .expect("purge");
        H::commit(tx).await.expect("commit");
        purged.push(n);
    }
    assert_eq!(
        purged,
        [2, 1, 0],
        "three old records purged in batches of at most 2, the young one kept"
    );
    assert_eq!(
        deliver(h, "billing", "young").await,
        Delivery::Duplicate,
        "a record younger than the retention is kept"
    );
    for key in ["old-1", "old-2", "old-3"] {
        assert_eq!(
            deliver(h, "billing", key).await,
            Delivery::New,
            "{key} was purged, so it is new again"
        );
    }
}
