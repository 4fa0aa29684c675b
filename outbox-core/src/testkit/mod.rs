//! Test kit: the conformance suites every store and sink runs, and fakes for your own
//! tests.
//!
//! - [`store_suite`]: plain async checks of the [`Store`](crate::Store) contract, run by
//!   the in-memory store here and by every SQL store against a real database.
//! - [`sink_suite`]: the same for [`Sink`](crate::Sink)s against a real receiver.
//! - [`inbox_suite`]: the same for [`Inbox`](crate::Inbox)es; [`MemoryInbox`] is an
//!   in-memory one with transactions for consumers' tests.
//! - [`RecordingSink`] acknowledges and records everything; [`FlakySink`] fails on
//!   purpose, retryably or permanently, and can be slow; [`drain`] publishes what is due
//!   for one destination into a fresh recording sink; [`numbered`] makes test messages and
//!   [`publish`] sends a batch with the default deadline.
//! - [`ManualClock`](crate::ManualClock) moves time only when told.

/// Runs each named check on a fresh harness from `factory`, announcing it first with
/// `announce(&harness, name)`.
macro_rules! run_checks {
    ($factory:expr, $announce:expr; $($check:ident),* $(,)?) => {$(
        let h = $factory().await;
        $announce(&h, stringify!($check));
        $check(&h).await;
    )*};
}

mod inbox;
pub mod inbox_suite;
mod settings;
pub mod sink_suite;
mod sinks;
pub mod store_suite;

pub use inbox::{MemoryInbox, MemoryInboxTx};
pub use inbox_suite::{InboxHarness, MemoryInboxHarness};
pub use settings::{UrlCase, assert_url_parity, setting_names, tls_file_cases};
pub use sink_suite::{BinaryPayloads, Delivered, SinkHarness};
pub use sinks::{FlakySink, FlakyStats, RecordingSink};
pub use store_suite::{MemoryHarness, StoreHarness};

/// Publishes `batch` through `sink` with the default deadline and returns one outcome per
/// message.
///
/// # Panics
///
/// If the sink fails the whole batch: this is for tests.
pub async fn publish(sink: &impl crate::Sink, batch: &[crate::Message]) -> Vec<crate::Outcome> {
    sink.publish(batch, &crate::PublishContext::default())
        .await
        .expect("the sink answers per message")
}

/// `n` messages to `destination` of type `event_type` whose JSON payloads count from 0.
///
/// ```
/// let messages = outbox_engine::testkit::numbered("orders", "order.paid", 3);
/// assert_eq!(messages[2].payload(), b"2");
/// ```
pub fn numbered(destination: &str, event_type: &str, n: usize) -> Vec<crate::NewMessage> {
    (0..n)
        .map(|i| {
            crate::NewMessage::builder(destination, event_type)
                .json(&i)
                .build()
                .expect("a numbered message is valid")
        })
        .collect()
}

/// Publishes every due row of `destination` in `store` into a fresh [`RecordingSink`]
/// (one worker, batches of 100) and returns the relay's report with the sink.
///
/// # Panics
///
/// If the relay cannot be built, the drain fails, or it takes over 60 s: this is for tests.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use outbox_engine::{MemoryStore, NewMessage, testkit};
///
/// let store = MemoryStore::new();
/// store.enqueue(NewMessage::builder("orders", "order.paid").build().unwrap()).unwrap();
/// let (report, sink) = testkit::drain(store, "orders").await;
/// assert_eq!((report.published, sink.len()), (1, 1));
/// # });
/// ```
pub async fn drain<S: crate::Store + Clone>(
    store: S,
    destination: &str,
) -> (crate::BatchReport, RecordingSink) {
    let sink = RecordingSink::new();
    let relay = crate::Relay::builder(store)
        .route(destination, sink.clone())
        .batch_size(100)
        .concurrency(1)
        .build()
        .expect("a relay for one destination builds");
    let report = tokio::time::timeout(std::time::Duration::from_secs(60), relay.drain())
        .await
        .expect("the drain ends within 60 s")
        .expect("the drain succeeds");
    (report, sink)
}

/// The verdict of a producer-atomicity run, for any writer: the business rows the caller
/// counted equal its `committed` transactions (about 70 % of `attempted`, the rest rolled
/// back), and draining `destination` publishes exactly the `expected` messages of the
/// committed transactions, each once.
///
/// # Panics
///
/// When any of that does not hold, naming what differed.
pub async fn assert_only_committed_messages<S: crate::Store + Clone>(
    store: S,
    destination: &str,
    (attempted, committed, business_rows): (i64, i64, i64),
    expected: &std::collections::HashSet<crate::MessageId>,
) {
    assert_eq!(
        business_rows, committed,
        "business rows = committed transactions"
    );
    let rolled_back = (attempted - committed) as f64 / attempted as f64;
    assert!(
        (0.2..=0.4).contains(&rolled_back),
        "about 30% rolled back: {committed} of {attempted} committed"
    );
    let (report, sink) = drain(store, destination).await;
    assert_eq!(
        report.published,
        expected.len(),
        "one publish per committed message"
    );
    let delivered: std::collections::HashSet<_> = sink.messages().iter().map(|m| m.id).collect();
    assert_eq!(
        &delivered, expected,
        "outbox rows = the committed transactions' messages, exactly"
    );
}
