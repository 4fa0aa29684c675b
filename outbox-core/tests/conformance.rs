//! The in-memory store and the test sinks pass the conformance suites they ship.

use outbox_engine::testkit::{
    FlakySink, InboxHarness, MemoryHarness, MemoryInboxHarness, RecordingSink, SinkHarness,
    inbox_suite, sink_suite, store_suite,
};
use outbox_engine::{Capabilities, PublishedRows};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_store_passes_the_store_suite() {
    store_suite::run_all(|| async { MemoryHarness::new() }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_store_passes_the_ordering_suite() {
    store_suite::run_ordering(|| async { MemoryHarness::new() }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_store_passes_the_store_and_ordering_suites_in_delete_mode() {
    let h = || async { MemoryHarness::with_mode(PublishedRows::Delete) };
    store_suite::run_all(h).await;
    store_suite::run_ordering(h).await;
}

/// The suite holds a store to what its harness declares: a store that keeps published
/// rows but declares delete mode fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[should_panic(expected = "assertion `left == right` failed")]
async fn store_suite_catches_a_store_that_keeps_rows_it_declares_deleted() {
    let declared = Capabilities::new("memory").published_rows(PublishedRows::Delete);
    let h = tampered::H::with(MemoryHarness::new(), tampered::Fault::Declares(declared));
    store_suite::stale_token_is_fenced(&h).await;
}

/// And a store that deletes published rows but declares it keeps them fails too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[should_panic(expected = "assertion `left == right` failed")]
async fn store_suite_catches_a_store_that_deletes_rows_it_declares_kept() {
    let declared = Capabilities::new("memory");
    let h = tampered::H::with(
        MemoryHarness::with_mode(PublishedRows::Delete),
        tampered::Fault::Declares(declared),
    );
    store_suite::purge_is_bounded_and_keeps_unfinished(&h).await;
}

/// A store that declares no per-key ordering is not held to it: the ordering checks are
/// skipped (and the matrix says so), not run against it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordering_checks_skip_a_store_that_declares_no_ordering() {
    let declared = std::sync::atomic::AtomicUsize::new(0);
    store_suite::run_ordering(|| async {
        declared.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let declared = Capabilities::new("memory").per_key_ordering(false);
        tampered::H::with(MemoryHarness::new(), tampered::Fault::Declares(declared))
    })
    .await;
    assert_eq!(
        declared.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "one harness asked for its capabilities, no check ran"
    );
}

#[tokio::test]
async fn recording_sink_passes_the_sink_suite() {
    sink_suite::run_all(|| async { RecordingSink::new() }).await;
}

/// A flaky sink that happens not to fail is still a correct sink.
struct QuietFlaky {
    sink: FlakySink,
    record: RecordingSink,
}

impl SinkHarness for QuietFlaky {
    type Sink = FlakySink;
    fn sink(&self) -> &FlakySink {
        &self.sink
    }
    async fn received(&self) -> Vec<sink_suite::Delivered> {
        self.record.received().await
    }
}

#[tokio::test]
async fn flaky_sink_without_failures_passes_the_sink_suite() {
    sink_suite::run_all(|| async {
        let record = RecordingSink::new();
        QuietFlaky {
            sink: FlakySink::new(record.clone()),
            record,
        }
    })
    .await;
}

/// The suite is able to fail: a sink that drops messages yet claims success is caught.
#[tokio::test]
#[should_panic(expected = "every acknowledged message arrived")]
async fn sink_suite_catches_a_lying_sink() {
    struct Liar(RecordingSink);
    impl outbox_engine::Sink for Liar {
        async fn publish(
            &self,
            batch: &[outbox_engine::Message],
            cx: &outbox_engine::PublishContext,
        ) -> Result<Vec<outbox_engine::Outcome>, outbox_engine::Failure> {
            // Acknowledge everything, deliver only the first message.
            let _ = self.0.publish(&batch[..batch.len().min(1)], cx).await?;
            Ok(vec![outbox_engine::Outcome::published(); batch.len()])
        }
    }
    struct H(Liar);
    impl SinkHarness for H {
        type Sink = Liar;
        fn sink(&self) -> &Liar {
            &self.0
        }
        async fn received(&self) -> Vec<sink_suite::Delivered> {
            self.0.0.received().await
        }
    }
    sink_suite::one_outcome_per_message(&H(Liar(RecordingSink::new()))).await;
}

/// A sink that changes what it sends: `Refuse` turns every binary payload down (as a
/// text-only transport would), `Corrupt` flips the last payload byte; both acknowledge
/// what they did send.
enum Broken {
    Refuse(RecordingSink),
    Corrupt(RecordingSink),
}

impl outbox_engine::Sink for Broken {
    async fn publish(
        &self,
        batch: &[outbox_engine::Message],
        cx: &outbox_engine::PublishContext,
    ) -> Result<Vec<outbox_engine::Outcome>, outbox_engine::Failure> {
        use outbox_engine::{Failure, FailureClass, Outcome};
        match self {
            Self::Refuse(inner) => {
                let text = |m: &outbox_engine::Message| std::str::from_utf8(&m.payload).is_ok();
                if batch.iter().all(text) {
                    return inner.publish(batch, cx).await;
                }
                let refused = Failure::permanent(FailureClass::Serialization, "text only");
                Ok(vec![refused.into(); batch.len()])
            }
            Self::Corrupt(inner) => {
                let mut changed = batch.to_vec();
                for m in &mut changed {
                    if let Some(last) = m.payload.last_mut() {
                        *last ^= 1;
                    }
                }
                let _ = inner.publish(&changed, cx).await?;
                Ok(vec![Outcome::published(); batch.len()])
            }
        }
    }
}

impl SinkHarness for Broken {
    type Sink = Self;
    fn sink(&self) -> &Self {
        self
    }
    async fn received(&self) -> Vec<sink_suite::Delivered> {
        let (Self::Refuse(inner) | Self::Corrupt(inner)) = self;
        inner.received().await
    }
}

/// A sink that refuses binary payloads fails the suite unless its harness declares it.
#[tokio::test]
#[should_panic(expected = "binary payloads declared Exact")]
async fn sink_suite_holds_a_sink_to_the_binary_payloads_it_declares() {
    sink_suite::binary_payload_is_exact_or_refused(&Broken::Refuse(RecordingSink::new())).await;
}

/// The suite compares what arrived with what was sent, byte for byte.
#[tokio::test]
#[should_panic(expected = "payload bytes")]
async fn sink_suite_catches_a_sink_that_changes_payloads() {
    sink_suite::delivers_identity_payload_and_headers(&Broken::Corrupt(RecordingSink::new())).await;
}

mod tampered {
    //! A memory store with one fault, for showing that the store suites can fail.

    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use outbox_engine::testkit::{MemoryHarness, StoreHarness};
    use outbox_engine::*;

    #[derive(Clone, Copy)]
    pub(crate) enum Fault {
        /// Completes with the newest token it handed out, whatever token the caller
        /// presents.
        IgnoresTokens,
        /// Claims unordered whatever the request asks.
        IgnoresOrder,
        /// Reads gauges that miss the dead letters.
        GaugesMissDead,
        /// Declares these capabilities instead of the memory store's.
        Declares(Capabilities),
    }

    #[derive(Clone)]
    pub(crate) struct Tampered {
        store: MemoryStore,
        newest: Arc<Mutex<Option<LeaseToken>>>,
        fault: Fault,
    }

    impl Store for Tampered {
        fn capabilities(&self) -> Capabilities {
            match self.fault {
                Fault::Declares(declared) => declared,
                _ => self.store.capabilities(),
            }
        }
        async fn claim(&self, r: &ClaimRequest) -> Result<Claim, StoreError> {
            let request = match self.fault {
                Fault::IgnoresOrder => r.clone().ordering(MessageOrder::Unordered),
                _ => r.clone(),
            };
            let claim = self.store.claim(&request).await?;
            *self.newest.lock().unwrap() = Some(claim.lease.token);
            Ok(claim)
        }
        async fn complete(
            &self,
            token: LeaseToken,
            c: &[Completion],
        ) -> Result<CompleteReport, StoreError> {
            let token = match self.fault {
                Fault::IgnoresTokens => self.newest.lock().unwrap().unwrap_or(token),
                _ => token,
            };
            self.store.complete(token, c).await
        }
        async fn release(
            &self,
            t: LeaseToken,
            ids: &[MessageId],
        ) -> Result<CompleteReport, StoreError> {
            self.store.release(t, ids).await
        }
        async fn gauges(&self, limit: usize) -> Result<Option<Gauges>, StoreError> {
            let mut gauges = self.store.gauges(limit).await?;
            if let (Fault::GaugesMissDead, Some(gauges)) = (self.fault, &mut gauges) {
                gauges.destinations.retain_mut(|g| {
                    g.dead = 0;
                    g.backlog() > 0
                });
            }
            Ok(gauges)
        }
    }
    impl StoreStats for Tampered {
        async fn stats(&self) -> Result<Stats, StoreError> {
            self.store.stats().await
        }
    }
    impl DeadLetters for Tampered {
        async fn list_dead(
            &self,
            f: &DeadLetterFilter,
            n: usize,
        ) -> Result<Vec<DeadLetter>, StoreError> {
            self.store.list_dead(f, n).await
        }
        async fn count_dead(&self, f: &DeadLetterFilter) -> Result<u64, StoreError> {
            self.store.count_dead(f).await
        }
        async fn replay_dead(&self, f: &DeadLetterFilter) -> Result<u64, StoreError> {
            self.store.replay_dead(f).await
        }
        async fn discard_dead(&self, f: &DeadLetterFilter) -> Result<u64, StoreError> {
            self.store.discard_dead(f).await
        }
    }
    impl FindMessages for Tampered {
        async fn find_messages(&self, k: &str, n: usize) -> Result<Vec<FoundMessage>, StoreError> {
            self.store.find_messages(k, n).await
        }
        async fn list_waiting(
            &self,
            f: &DeadLetterFilter,
            n: usize,
        ) -> Result<Vec<FoundMessage>, StoreError> {
            self.store.list_waiting(f, n).await
        }
    }
    impl Purge for Tampered {
        async fn purge(&self, r: &PurgeRequest) -> Result<u64, StoreError> {
            self.store.purge(r).await
        }
    }

    /// A memory harness whose store has `fault`.
    pub(crate) struct H(MemoryHarness, Tampered);

    impl H {
        pub(crate) fn new(fault: Fault) -> Self {
            Self::with(MemoryHarness::new(), fault)
        }

        /// `inner`'s store with `fault`.
        pub(crate) fn with(inner: MemoryHarness, fault: Fault) -> Self {
            let store = Tampered {
                store: inner.store().clone(),
                newest: Arc::default(),
                fault,
            };
            Self(inner, store)
        }
    }

    impl StoreHarness for H {
        type Store = Tampered;
        fn store(&self) -> &Tampered {
            &self.1
        }
        async fn enqueue(&self, m: Vec<NewMessage>) -> Result<(), StoreError> {
            self.0.enqueue(m).await
        }
        async fn advance(&self, by: Duration) {
            self.0.advance(by).await
        }
    }
}

/// The store suite is able to fail: a store that ignores lease tokens is caught.
#[tokio::test]
#[should_panic(expected = "a fenced completion changes no row")]
async fn store_suite_catches_a_store_without_fencing() {
    let h = tampered::H::new(tampered::Fault::IgnoresTokens);
    store_suite::stale_token_is_fenced(&h).await;
}

/// The ordering suite is able to fail: a store that declares per-key ordering but claims
/// unordered is caught.
#[tokio::test]
#[should_panic(expected = "heads and unkeyed only")]
async fn ordering_suite_catches_a_store_that_ignores_order() {
    let h = tampered::H::new(tampered::Fault::IgnoresOrder);
    store_suite::per_key_claims_only_heads(&h).await;
}

/// The gauge check is able to fail: a store whose gauges miss the dead letters is caught.
#[tokio::test]
#[should_panic(expected = "a: pending, leased, dead")]
async fn store_suite_catches_gauges_that_miss_dead_letters() {
    let h = tampered::H::new(tampered::Fault::GaugesMissDead);
    store_suite::gauges_match_the_table(&h).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_inbox_passes_the_inbox_suite() {
    inbox_suite::run_all(|| async { MemoryInboxHarness::new() }).await;
}

/// An inbox that looks only at committed records, the classic check-then-insert race:
/// two concurrent deliveries both see nothing and both apply. The suite catches it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[should_panic(expected = "exactly one of 8 concurrent deliveries of a key applies it")]
async fn inbox_suite_catches_an_inbox_that_forgets_under_concurrency() {
    use std::collections::HashSet;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use outbox_engine::{Delivery, Inbox, StoreError};

    #[derive(Default)]
    struct Forgetful(Arc<Mutex<HashSet<(String, String)>>>);
    struct Tx(Arc<Mutex<HashSet<(String, String)>>>, Vec<(String, String)>);

    impl Inbox for Forgetful {
        type Connection = Tx;
        async fn record(
            &self,
            tx: &mut Tx,
            consumer: &str,
            key: &str,
        ) -> Result<Delivery, StoreError> {
            outbox_engine::receive::check_key("key", key)?;
            outbox_engine::receive::check_key("consumer", consumer)?;
            let pair = (consumer.to_owned(), key.to_owned());
            if self.0.lock().unwrap().contains(&pair) || tx.1.contains(&pair) {
                return Ok(Delivery::Duplicate);
            }
            tx.1.push(pair);
            Ok(Delivery::New)
        }
        async fn purge(&self, _: &mut Tx, _: Duration, _: usize) -> Result<u64, StoreError> {
            Ok(0)
        }
    }

    struct Harness(Forgetful);
    impl InboxHarness for Harness {
        type Inbox = Forgetful;
        type Tx = Tx;
        fn inbox(&self) -> &Forgetful {
            &self.0
        }
        async fn begin(&self) -> Tx {
            Tx(self.0.0.clone(), Vec::new())
        }
        fn conn(tx: &mut Tx) -> &mut Tx {
            tx
        }
        async fn commit(tx: Tx) -> Result<(), StoreError> {
            tx.0.lock().unwrap().extend(tx.1);
            Ok(())
        }
        async fn rollback(_: Tx) {}
        async fn age(&self, _: Duration) {}
    }

    inbox_suite::concurrent_duplicates_apply_once(&Harness(Forgetful::default())).await;
}

/// A relay that asks for per-key ordering from a store that declares none is refused when
/// it is built, with an error naming the store and what it lacks; unordered, it builds.
#[test]
fn a_relay_refuses_per_key_ordering_from_a_store_without_it() {
    use outbox_engine::testkit::StoreHarness;
    use outbox_engine::{ConfigError, DeadHead, MessageOrder, Relay};

    let declared = Capabilities::new("unordered-store").per_key_ordering(false);
    let h = tampered::H::with(MemoryHarness::new(), tampered::Fault::Declares(declared));
    let relay = || Relay::builder(h.store().clone()).route("orders", RecordingSink::new());
    let error = relay()
        .ordering(MessageOrder::PerKey(DeadHead::Halt))
        .build()
        .err()
        .expect("per-key ordering on a store without it must not build");
    assert_eq!(
        error,
        ConfigError::Unsupported {
            store: "unordered-store",
            capability: "per-key ordering",
            setting: "ordering",
        }
    );
    let shown = error.to_string();
    assert!(
        shown.contains("unordered-store") && shown.contains("per-key ordering"),
        "{shown}"
    );
    assert!(
        relay().build().is_ok(),
        "an unordered relay needs no ordering"
    );
}
