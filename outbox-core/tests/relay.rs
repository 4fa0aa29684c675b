//! Relay behaviour on the in-memory store: routing, classification, timeouts, shutdown.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};
use std::time::Duration;

use outbox_engine::testkit::{FlakySink, RecordingSink};
use outbox_engine::{
    Clock, Failure, FailureClass, ManualClock, MemoryStore, Message, NewMessage, Outcome, Relay,
    RetryPolicy, Sink, Status, StoreStats,
};

fn msg(destination: &str, event: &str) -> NewMessage {
    NewMessage::builder(destination, event)
        .json(&serde_json::json!({"e": event}))
        .build()
        .unwrap()
}

fn status(store: &MemoryStore, id: outbox_engine::MessageId) -> Status {
    store.row(id).unwrap().row.status()
}

/// Runs `relay` until `sink` has received `n` messages, failing after 10 s.
async fn run_until_delivered<S: outbox_engine::Store>(
    relay: Relay<S>,
    sink: &RecordingSink,
    n: usize,
) {
    let done = sink.clone();
    relay
        .run(async move { assert!(done.wait_for(n, Duration::from_secs(10)).await) })
        .await;
}

#[tokio::test]
async fn publishes_and_marks_only_after_ack() {
    let store = MemoryStore::new();
    let ids: Vec<_> = (0..10)
        .map(|i| store.enqueue(msg("orders", &format!("e{i}"))).unwrap())
        .collect();
    let sink = RecordingSink::new();
    let relay = Relay::builder(store.clone())
        .route("orders", sink.clone())
        .batch_size(4)
        .build()
        .unwrap();
    let report = relay.drain().await.unwrap();
    assert_eq!((report.claimed, report.published), (10, 10));
    assert_eq!(
        sink.messages().iter().map(|m| m.id).collect::<Vec<_>>(),
        ids
    );
    assert!(
        ids.iter()
            .all(|id| status(&store, *id) == Status::Published)
    );
}

#[tokio::test]
async fn unknown_destination_is_dead_lettered_when_asked() {
    let store = MemoryStore::new();
    let lost = store.enqueue(msg("nowhere", "x")).unwrap();
    let fine = store.enqueue(msg("orders", "y")).unwrap();
    let sink = RecordingSink::new();
    let relay = Relay::builder(store.clone())
        .route("orders", sink.clone())
        .dead_letter_unrouted(true)
        .build()
        .unwrap();
    let report = relay.drain().await.unwrap();
    assert_eq!((report.published, report.dead), (1, 1));
    assert_eq!(status(&store, fine), Status::Published);
    let row = store.row(lost).unwrap().row;
    assert_eq!(row.status(), Status::Dead);
    assert!(
        row.last_error
            .unwrap()
            .contains("no route for destination \"nowhere\"")
    );
}

#[tokio::test]
async fn a_relay_leaves_destinations_it_does_not_route_alone_by_default() {
    let store = MemoryStore::new();
    let other = store.enqueue(msg("someone-else", "x")).unwrap();
    store.enqueue(msg("orders", "y")).unwrap();
    let relay = Relay::builder(store.clone())
        .route("orders", RecordingSink::new())
        .build()
        .unwrap();
    let report = relay.drain().await.unwrap();
    assert_eq!((report.claimed, report.published, report.dead), (1, 1, 0));
    assert_eq!(status(&store, other), Status::Pending);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_running_relays_with_disjoint_routes_share_a_table() {
    let store = MemoryStore::new();
    let ids: Vec<_> = (0..200)
        .map(|n| {
            let destination = if n % 2 == 0 { "sms" } else { "email" };
            store.enqueue(msg(destination, "x")).unwrap()
        })
        .collect();
    let (sms, email) = (RecordingSink::new(), RecordingSink::new());
    let relay = |destination: &str, sink: &RecordingSink| {
        Relay::builder(store.clone())
            .route(destination, sink.clone())
            .batch_size(7)
            .concurrency(2)
            .poll_interval(Duration::from_millis(5))
            .build()
            .unwrap()
    };
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let until_stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    let a = tokio::spawn(relay("sms", &sms).run(until_stopped(stopped.clone())));
    let b = tokio::spawn(relay("email", &email).run(until_stopped(stopped)));
    assert!(
        sms.wait_for(100, Duration::from_secs(20)).await,
        "sms got its 100"
    );
    assert!(
        email.wait_for(100, Duration::from_secs(20)).await,
        "email got its 100"
    );
    outbox_test_support::wait_until("every row published", Duration::from_secs(20), || async {
        ids.iter()
            .all(|id| status(&store, *id) == Status::Published)
    })
    .await;
    stop.send(true).unwrap();
    a.await.unwrap();
    b.await.unwrap();
    assert!(sms.messages().iter().all(|m| m.destination == "sms"));
    assert!(email.messages().iter().all(|m| m.destination == "email"));
    assert_eq!(
        store.ids_with_status(Status::Dead).len(),
        0,
        "no relay dead-lettered the other's rows"
    );
}

#[tokio::test]
async fn permanent_failures_dead_letter_at_once_while_others_flow() {
    let store = MemoryStore::new();
    let bad = store.enqueue(msg("sms", "bad-phone")).unwrap();
    let good: Vec<_> = (0..5)
        .map(|_| store.enqueue(msg("sms", "ok")).unwrap())
        .collect();
    let delivered = RecordingSink::new();
    let sink = FlakySink::new(delivered.clone()).permanent_when(|m| m.event_type == "bad-phone");
    let relay = Relay::builder(store.clone())
        .route("sms", sink)
        .build()
        .unwrap();
    let report = relay.drain().await.unwrap();
    assert_eq!((report.published, report.dead, report.retried), (5, 1, 0));
    let row = store.row(bad).unwrap().row;
    assert_eq!(
        (row.status(), row.attempts),
        (Status::Dead, 1),
        "one attempt, no retries"
    );
    assert!(
        good.iter()
            .all(|id| status(&store, *id) == Status::Published)
    );
}

#[tokio::test]
async fn retryable_failures_back_off_and_honour_retry_after() {
    let clock = ManualClock::new();
    let store = MemoryStore::with_clock(clock.clone());
    let id = store.enqueue(msg("api", "x")).unwrap();
    let sink = FlakySink::new(RecordingSink::new())
        .retryable_rate(1.0)
        .retry_after(Duration::from_secs(120));
    let relay = Relay::builder(store.clone())
        .route("api", sink)
        .clock(clock.clone())
        .retry(RetryPolicy::default().max_delay(Duration::from_secs(1)))
        .build()
        .unwrap();
    let report = relay.run_once().await.unwrap();
    assert_eq!(report.retried, 1);
    let snapshot = store.row(id).unwrap();
    let due = snapshot.row.due_at().unwrap();
    assert_eq!(
        due - clock.now(),
        chrono::Duration::seconds(120),
        "Retry-After wins over the 1 s cap"
    );
    assert!(
        snapshot
            .row
            .last_error
            .unwrap()
            .contains("retryable unavailable")
    );
    clock.advance(Duration::from_secs(119));
    assert_eq!(
        relay.run_once().await.unwrap().claimed,
        0,
        "still backing off"
    );
    clock.advance(Duration::from_secs(1));
    assert_eq!(relay.run_once().await.unwrap().claimed, 1);
}

struct Miscounting;
impl Sink for Miscounting {
    async fn publish(
        &self,
        batch: &[Message],
        _cx: &outbox_engine::PublishContext,
    ) -> Result<Vec<Outcome>, Failure> {
        Ok(vec![Outcome::published(); batch.len().saturating_sub(1)])
    }
}

#[tokio::test]
async fn a_sink_that_miscounts_outcomes_publishes_nothing() {
    let store = MemoryStore::new();
    let ids: Vec<_> = (0..3)
        .map(|_| store.enqueue(msg("x", "e")).unwrap())
        .collect();
    let relay = Relay::builder(store.clone())
        .route("x", Miscounting)
        .build()
        .unwrap();
    let report = relay.run_once().await.unwrap();
    assert_eq!((report.published, report.retried), (0, 3));
    let err = store.row(ids[0]).unwrap().row.last_error.unwrap();
    assert!(
        err.contains("sink returned 2 outcomes for 3 messages"),
        "{err}"
    );
}

struct Panicking;
impl Sink for Panicking {
    async fn publish(
        &self,
        _: &[Message],
        _cx: &outbox_engine::PublishContext,
    ) -> Result<Vec<Outcome>, Failure> {
        panic!("sink bug")
    }
}

#[tokio::test]
async fn a_panicking_sink_fails_its_messages_not_the_relay() {
    let store = MemoryStore::new();
    let a = store.enqueue(msg("boom", "e")).unwrap();
    let b = store.enqueue(msg("fine", "e")).unwrap();
    let relay = Relay::builder(store.clone())
        .route("boom", Panicking)
        .route("fine", RecordingSink::new())
        .build()
        .unwrap();
    let report = relay.run_once().await.unwrap();
    assert_eq!((report.published, report.retried), (1, 1));
    assert_eq!(status(&store, a), Status::Pending);
    assert!(
        store
            .row(a)
            .unwrap()
            .row
            .last_error
            .unwrap()
            .contains("sink task failed")
    );
    assert_eq!(status(&store, b), Status::Published);
}

struct Slow(Duration);
impl Sink for Slow {
    async fn publish(
        &self,
        batch: &[Message],
        _cx: &outbox_engine::PublishContext,
    ) -> Result<Vec<Outcome>, Failure> {
        tokio::time::sleep(self.0).await;
        Ok(vec![Outcome::published(); batch.len()])
    }
}

#[tokio::test]
async fn a_publish_slower_than_the_timeout_is_retried_not_marked() {
    let store = MemoryStore::new();
    let id = store.enqueue(msg("slow", "e")).unwrap();
    let relay = Relay::builder(store.clone())
        .route("slow", Slow(Duration::from_secs(5)))
        .lease(Duration::from_millis(400))
        .build()
        .unwrap();
    let report = relay.run_once().await.unwrap();
    assert_eq!(report.retried, 1);
    let row = store.row(id).unwrap().row;
    assert_eq!(row.status(), Status::Pending);
    assert!(row.last_error.unwrap().contains("timed out after 200ms"));
}

/// Acknowledges the fast messages at once and holds the one named `slow` for ever.
struct OneSlow;
impl Sink for OneSlow {
    async fn publish(
        &self,
        _: &[Message],
        _cx: &outbox_engine::PublishContext,
    ) -> Result<Vec<Outcome>, Failure> {
        unreachable!("the relay publishes through publish_reporting")
    }

    async fn publish_reporting(
        &self,
        batch: &[Message],
        _: &outbox_engine::PublishContext,
        outcomes: &outbox_engine::Outcomes,
    ) {
        for (index, message) in batch.iter().enumerate() {
            if message.event_type != "slow" {
                outcomes.report(index, Outcome::published());
            }
        }
        std::future::pending::<()>().await;
    }
}

/// Acknowledged messages are marked published while the batch's slowest message is still
/// in flight, and stay published when the publish timeout ends the call; only the
/// unanswered one is retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_messages_are_completed_before_the_slowest_one() {
    let store = MemoryStore::new();
    let slow = store.enqueue(msg("orders", "slow")).unwrap();
    let fast: Vec<_> = (0..5)
        .map(|_| store.enqueue(msg("orders", "fast")).unwrap())
        .collect();
    let relay = Relay::builder(store.clone())
        .route("orders", OneSlow)
        .lease(Duration::from_secs(20))
        .publish_timeout(Duration::from_secs(3))
        .build()
        .unwrap();
    let batch = tokio::spawn(async move { relay.run_once().await });
    outbox_test_support::wait_until(
        "the five acknowledged messages marked published",
        Duration::from_secs(5),
        || async {
            fast.iter()
                .all(|id| status(&store, *id) == Status::Published)
        },
    )
    .await;
    assert_eq!(
        status(&store, slow),
        Status::Leased,
        "the slow one is still in flight"
    );
    let report = batch.await.unwrap().unwrap();
    assert_eq!((report.published, report.retried), (5, 1));
    let row = store.row(slow).unwrap().row;
    assert_eq!(row.status(), Status::Pending);
    assert!(row.last_error.unwrap().contains("timed out after 3s"));
}

#[tokio::test]
async fn rows_claimed_too_often_without_completion_are_dead_lettered_unpublished() {
    let clock = ManualClock::new();
    let store = MemoryStore::with_clock(clock.clone());
    let id = store.enqueue(msg("x", "crashy")).unwrap();
    let request = outbox_engine::ClaimRequest::new("crashing-relay", 10, Duration::from_secs(1));
    for _ in 0..3 {
        // A relay claims and dies each time.
        let claim = outbox_engine::Store::claim(&store, &request).await.unwrap();
        assert_eq!(claim.messages.len(), 1);
        clock.advance(Duration::from_secs(2));
    }
    let sink = RecordingSink::new();
    let relay = Relay::builder(store.clone())
        .route("x", sink.clone())
        .retry(RetryPolicy::default().max_attempts(3))
        .build()
        .unwrap();
    assert_eq!(relay.run_once().await.unwrap().dead, 1);
    assert!(
        sink.is_empty(),
        "a crash-looping message is not published again"
    );
    assert!(
        store
            .row(id)
            .unwrap()
            .row
            .last_error
            .unwrap()
            .contains("claimed 4 times")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wakeups_beat_the_poll_interval() {
    let store = MemoryStore::new();
    let sink = RecordingSink::new();
    let relay = Relay::builder(store.clone())
        .route("orders", sink.clone())
        .poll_interval(Duration::from_secs(3600))
        .wakeup(store.wakeup())
        .concurrency(2)
        .build()
        .unwrap();
    let running = relay.spawn();
    tokio::time::sleep(Duration::from_millis(100)).await; // workers are idle now
    for round in 1..=3 {
        store.enqueue(msg("orders", "e")).unwrap();
        assert!(
            sink.wait_for(round, Duration::from_secs(5)).await,
            "woken for message {round}"
        );
    }
    running.stop().await.unwrap();
}

/// A spawned relay runs until its handle's `stop`; a dropped handle leaves it running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spawned_relay_outlives_its_dropped_handle_and_stops_through_a_kept_one() {
    let store = MemoryStore::new();
    let sink = RecordingSink::new();
    let build = || {
        Relay::builder(store.clone())
            .route("orders", sink.clone())
            .poll_interval(Duration::from_millis(10))
            .build()
            .unwrap()
    };
    drop(build().spawn());
    store.enqueue(msg("orders", "e")).unwrap();
    assert!(
        sink.wait_for(1, Duration::from_secs(5)).await,
        "the relay whose handle was dropped published"
    );

    let running = build().spawn();
    tokio::time::timeout(Duration::from_secs(20), running.stop())
        .await
        .expect("stop returned within 20 s")
        .expect("the relay's task ended without a panic");
}

/// Counts publish calls, i.e. claimed batches, and the messages in them.
#[derive(Clone, Default)]
struct CountingSink {
    batches: Arc<AtomicUsize>,
    messages: Arc<AtomicUsize>,
}

impl Sink for CountingSink {
    async fn publish(
        &self,
        batch: &[Message],
        _cx: &outbox_engine::PublishContext,
    ) -> Result<Vec<Outcome>, Failure> {
        self.batches.fetch_add(1, AtomicOrdering::SeqCst);
        self.messages.fetch_add(batch.len(), AtomicOrdering::SeqCst);
        Ok(vec![Outcome::published(); batch.len()])
    }
}

/// One message, then 20 more 5 ms apart, each raising the wakeup; returns how many
/// batches the relay claimed for the 21 messages.
async fn batches_for_a_burst(min_wakeup_interval: Duration) -> usize {
    let store = MemoryStore::new();
    let sink = CountingSink::default();
    let relay = Relay::builder(store.clone())
        .route("orders", sink.clone())
        .poll_interval(Duration::from_secs(3600))
        .wakeup(store.wakeup())
        .min_wakeup_interval(min_wakeup_interval)
        .concurrency(2)
        .build()
        .unwrap();
    let running = relay.spawn();
    tokio::time::sleep(Duration::from_millis(100)).await; // workers are idle now
    store.enqueue(msg("orders", "first")).unwrap();
    outbox_test_support::wait_until(
        "the first message published",
        Duration::from_secs(5),
        || async { sink.messages.load(AtomicOrdering::SeqCst) == 1 },
    )
    .await;
    for i in 0..20 {
        store.enqueue(msg("orders", &format!("e{i}"))).unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    outbox_test_support::wait_until(
        "all 21 messages published",
        Duration::from_secs(10),
        || async { sink.messages.load(AtomicOrdering::SeqCst) == 21 },
    )
    .await;
    running.stop().await.unwrap();
    sink.batches.load(AtomicOrdering::SeqCst)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wakeups_within_the_min_interval_coalesce_into_one_claim() {
    // The first message is claimed at once; the 20 wakeups of the next ~100 ms fall in
    // the 2 s interval that follows and make one claim at its end.
    let paced = batches_for_a_burst(Duration::from_secs(2)).await;
    assert_eq!(
        paced, 2,
        "one claim for the first message, one for the burst"
    );
    // Without an interval every wakeup is a claim of its own (the control: the count
    // above is the pacing's doing).
    let unpaced = batches_for_a_burst(Duration::ZERO).await;
    assert!(
        unpaced >= 10,
        "without pacing each wakeup claims: {unpaced} batches"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_waits_for_in_flight_batches_within_the_grace() {
    let store = MemoryStore::new();
    let id = store.enqueue(msg("slow", "e")).unwrap();
    let relay = Relay::builder(store.clone())
        .route("slow", Slow(Duration::from_secs(1)))
        .shutdown_grace(Duration::from_secs(5))
        .build()
        .unwrap();
    // Shut down once the batch is in flight.
    let shutdown = outbox_test_support::wait_until(
        "the row leased by the relay",
        Duration::from_secs(10),
        || async { status(&store, id) == Status::Leased },
    );
    relay.run(shutdown).await;
    assert_eq!(
        status(&store, id),
        Status::Published,
        "the in-flight publish finished"
    );
}

/// A batch the grace cannot finish gives back what it left unfinished, and only that:
/// messages of the batch already completed stay published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_releases_leases_it_cannot_finish() {
    let store = MemoryStore::new();
    let enqueue = |destination| -> Vec<_> {
        (0..3)
            .map(|_| store.enqueue(msg(destination, "e")).unwrap())
            .collect()
    };
    let (fast, slow) = (enqueue("fast"), enqueue("slow"));
    let relay = Relay::builder(store.clone())
        .route("fast", RecordingSink::new())
        .route("slow", Slow(Duration::from_secs(30)))
        .lease(Duration::from_secs(120))
        .shutdown_grace(Duration::from_millis(100))
        .build()
        .unwrap();
    relay
        .run(tokio::time::sleep(Duration::from_millis(300)))
        .await;
    for id in fast {
        assert_eq!(
            status(&store, id),
            Status::Published,
            "completed in the batch"
        );
    }
    for id in slow {
        let row = store.row(id).unwrap().row;
        assert_eq!(
            (row.status(), row.attempts),
            (Status::Pending, 0),
            "released at once, attempt given back"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_errors_do_not_stop_the_relay() {
    /// Fails every other claim.
    #[derive(Clone)]
    struct Unreliable(MemoryStore, Arc<AtomicUsize>);
    impl outbox_engine::Store for Unreliable {
        fn capabilities(&self) -> outbox_engine::Capabilities {
            self.0.capabilities()
        }
        async fn claim(
            &self,
            r: &outbox_engine::ClaimRequest,
        ) -> Result<outbox_engine::Claim, outbox_engine::StoreError> {
            if self
                .1
                .fetch_add(1, AtomicOrdering::SeqCst)
                .is_multiple_of(2)
            {
                return Err(outbox_engine::StoreError::new(
                    outbox_engine::StoreErrorKind::Unavailable,
                    "db down",
                ));
            }
            self.0.claim(r).await
        }
        async fn complete(
            &self,
            t: outbox_engine::LeaseToken,
            c: &[outbox_engine::Completion],
        ) -> Result<outbox_engine::CompleteReport, outbox_engine::StoreError> {
            self.0.complete(t, c).await
        }
        async fn release(
            &self,
            t: outbox_engine::LeaseToken,
            ids: &[outbox_engine::MessageId],
        ) -> Result<outbox_engine::CompleteReport, outbox_engine::StoreError> {
            self.0.release(t, ids).await
        }
    }
    let store = MemoryStore::new();
    for _ in 0..20 {
        store.enqueue(msg("orders", "e")).unwrap();
    }
    let sink = RecordingSink::new();
    let relay = Relay::builder(Unreliable(store.clone(), Arc::default()))
        .route("orders", sink.clone())
        .batch_size(5)
        .poll_interval(Duration::from_millis(10))
        .build()
        .unwrap();
    run_until_delivered(relay, &sink, 20).await;
    assert_eq!(store.stats().await.unwrap().total().published, 20);
}

/// Counts the claims that start while a batch claimed before is not completed yet (each
/// batch here is completed in one call), and the rows given back; declares overlapped
/// claims as told.
#[derive(Clone)]
struct Overlaps {
    store: MemoryStore,
    declared: bool,
    unfinished: Arc<AtomicUsize>,
    overlapped: Arc<AtomicUsize>,
    released: Arc<AtomicUsize>,
}

impl outbox_engine::Store for Overlaps {
    fn capabilities(&self) -> outbox_engine::Capabilities {
        self.store.capabilities().overlapped_claims(self.declared)
    }
    async fn claim(
        &self,
        r: &outbox_engine::ClaimRequest,
    ) -> Result<outbox_engine::Claim, outbox_engine::StoreError> {
        if self.unfinished.load(AtomicOrdering::SeqCst) > 0 {
            self.overlapped.fetch_add(1, AtomicOrdering::SeqCst);
        }
        let claim = self.store.claim(r).await?;
        if !claim.messages.is_empty() {
            self.unfinished.fetch_add(1, AtomicOrdering::SeqCst);
        }
        Ok(claim)
    }
    async fn complete(
        &self,
        t: outbox_engine::LeaseToken,
        c: &[outbox_engine::Completion],
    ) -> Result<outbox_engine::CompleteReport, outbox_engine::StoreError> {
        let report = self.store.complete(t, c).await;
        self.unfinished.fetch_sub(1, AtomicOrdering::SeqCst);
        report
    }
    async fn release(
        &self,
        t: outbox_engine::LeaseToken,
        ids: &[outbox_engine::MessageId],
    ) -> Result<outbox_engine::CompleteReport, outbox_engine::StoreError> {
        self.released.fetch_add(ids.len(), AtomicOrdering::SeqCst);
        let report = self.store.release(t, ids).await;
        self.unfinished.fetch_sub(1, AtomicOrdering::SeqCst);
        report
    }
}

/// Records each batch after taking `delay` to publish it.
#[derive(Clone)]
struct Delayed {
    sink: RecordingSink,
    delay: Duration,
}

impl Sink for Delayed {
    async fn publish(
        &self,
        batch: &[Message],
        cx: &outbox_engine::PublishContext,
    ) -> Result<Vec<Outcome>, Failure> {
        tokio::time::sleep(self.delay).await;
        self.sink.publish(batch, cx).await
    }
}

/// What [`claims_ahead`] saw: claims started before the batch in hand was completed, and
/// rows given back unpublished.
#[derive(Debug, PartialEq, Eq)]
struct Ahead {
    overlapped: usize,
    released: usize,
}

/// Drains 20 messages in batches of 5 through one worker, each batch taking `delay` to
/// publish, under a `lease` with a publish timeout of three quarters of it.
async fn claims_ahead(
    declared: bool,
    ordering: outbox_engine::MessageOrder,
    delay: Duration,
    lease: Duration,
) -> Ahead {
    let store = Overlaps {
        store: MemoryStore::new(),
        declared,
        unfinished: Arc::default(),
        overlapped: Arc::default(),
        released: Arc::default(),
    };
    for i in 0..20 {
        let message = NewMessage::builder("orders", "e")
            .json(&serde_json::json!({ "i": i }))
            .partition_key(format!("key-{i}"))
            .build()
            .unwrap();
        store.store.enqueue(message).unwrap();
    }
    let sink = Delayed {
        sink: RecordingSink::new(),
        delay,
    };
    let relay = Relay::builder(store.clone())
        .route("orders", sink.clone())
        .batch_size(5)
        .ordering(ordering)
        .lease(lease)
        .publish_timeout(lease * 3 / 4)
        .poll_interval(Duration::from_secs(60))
        .build()
        .unwrap();
    run_until_delivered(relay, &sink.sink, 20).await;
    let stats = store.store.stats().await.unwrap().total();
    assert_eq!((stats.published, stats.pending), (20, 0), "{stats:?}");
    let published = sink.sink.messages();
    assert_eq!(published.len(), 20, "each message published once");
    assert!(
        published.iter().all(|m| m.attempts == 1),
        "rows given back keep their attempt: {:?}",
        published.iter().map(|m| m.attempts).collect::<Vec<_>>()
    );
    Ahead {
        overlapped: store.overlapped.load(AtomicOrdering::SeqCst),
        released: store.released.load(AtomicOrdering::SeqCst),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_batch_is_followed_by_a_claim_while_it_is_published() {
    use outbox_engine::{DeadHead, MessageOrder};
    let (quick, lease) = (Duration::from_millis(20), Duration::from_secs(10));
    // Batches 1 to 4 are full: the claim after each runs before it is completed (the
    // last of those claims finds nothing).
    let ahead = claims_ahead(true, MessageOrder::Unordered, quick, lease).await;
    assert_eq!(
        ahead,
        Ahead {
            overlapped: 4,
            released: 0
        }
    );
    // Not where the store declares it would only wait, nor with per-key ordering,
    // where the completion unblocks the next claim.
    let ahead = claims_ahead(false, MessageOrder::Unordered, quick, lease).await;
    assert_eq!(
        ahead,
        Ahead {
            overlapped: 0,
            released: 0
        }
    );
    let per_key = MessageOrder::PerKey(DeadHead::Skip);
    let ahead = claims_ahead(true, per_key, quick, lease).await;
    assert_eq!(
        ahead,
        Ahead {
            overlapped: 0,
            released: 0
        }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_claimed_ahead_without_a_publish_timeout_of_lease_left_is_given_back() {
    use outbox_engine::MessageOrder;
    // Each publish takes 200 ms of a 600 ms lease: a batch claimed while the one before
    // it was published has at most 400 ms left, less than the 450 ms publish timeout. Its
    // rows are given back and claimed afresh, never published on a lease that could lapse.
    let (slow, lease) = (Duration::from_millis(200), Duration::from_millis(600));
    let ahead = claims_ahead(true, MessageOrder::Unordered, slow, lease).await;
    assert_eq!(ahead.overlapped, 4, "{ahead:?}");
    assert_eq!(
        ahead.released, 15,
        "batches 2 to 4 were given back: {ahead:?}"
    );
}

#[tokio::test]
async fn a_store_call_that_never_answers_is_given_up_after_the_lease() {
    /// Its first claim and first completion never answer, as on a connection that fell
    /// silent; later calls reach the memory store.
    #[derive(Clone)]
    struct Silent(MemoryStore, Arc<AtomicUsize>, Arc<AtomicUsize>);
    impl outbox_engine::Store for Silent {
        fn capabilities(&self) -> outbox_engine::Capabilities {
            self.0.capabilities()
        }
        async fn claim(
            &self,
            r: &outbox_engine::ClaimRequest,
        ) -> Result<outbox_engine::Claim, outbox_engine::StoreError> {
            if self.1.fetch_add(1, AtomicOrdering::SeqCst) == 0 {
                std::future::pending::<()>().await;
            }
            self.0.claim(r).await
        }
        async fn complete(
            &self,
            t: outbox_engine::LeaseToken,
            c: &[outbox_engine::Completion],
        ) -> Result<outbox_engine::CompleteReport, outbox_engine::StoreError> {
            if self.2.fetch_add(1, AtomicOrdering::SeqCst) == 0 {
                std::future::pending::<()>().await;
            }
            self.0.complete(t, c).await
        }
        async fn release(
            &self,
            t: outbox_engine::LeaseToken,
            ids: &[outbox_engine::MessageId],
        ) -> Result<outbox_engine::CompleteReport, outbox_engine::StoreError> {
            self.0.release(t, ids).await
        }
    }
    let store = MemoryStore::new();
    let id = store.enqueue(msg("orders", "e")).unwrap();
    let sink = RecordingSink::new();
    let relay = Relay::builder(Silent(store.clone(), Arc::default(), Arc::default()))
        .route("orders", sink.clone())
        .lease(Duration::from_millis(300))
        .build()
        .unwrap();
    let limit = Duration::from_secs(10);
    let first = tokio::time::timeout(limit, relay.run_once())
        .await
        .expect("the relay gives up on a claim that never answers");
    let error = first.expect_err("a claim that never answered is an error");
    assert_eq!(
        error.kind(),
        outbox_engine::StoreErrorKind::Timeout,
        "{error}"
    );
    assert!(error.is_retryable(), "{error}");
    // The next claim answers; its completion first never answers, and is retried.
    let report = tokio::time::timeout(limit, relay.run_once())
        .await
        .expect("the relay gives up on a completion that never answers")
        .expect("the retried completion is recorded");
    assert_eq!((report.claimed, report.published), (1, 1));
    assert_eq!(status(&store, id), Status::Published);
    assert_eq!(sink.messages().len(), 1);
}

#[test]
fn bad_settings_are_named() {
    let build = |f: fn(
        outbox_engine::RelayBuilder<MemoryStore>,
    ) -> outbox_engine::RelayBuilder<MemoryStore>| {
        f(Relay::builder(MemoryStore::new()).route("x", RecordingSink::new()))
            .build()
            .err()
            .map(|e| e.to_string())
    };
    assert!(build(|b| b.batch_size(0)).unwrap().contains("batch_size"));
    assert!(build(|b| b.concurrency(0)).unwrap().contains("concurrency"));
    assert!(
        build(|b| b
            .lease(Duration::from_secs(1))
            .publish_timeout(Duration::from_secs(2)))
        .unwrap()
        .contains("publish_timeout")
    );
    assert!(
        build(|b| b.poll_interval(Duration::ZERO))
            .unwrap()
            .contains("poll_interval")
    );
    assert!(build(|b| b).is_none());
    let no_routes = Relay::builder(MemoryStore::new()).build().err().unwrap();
    assert!(no_routes.to_string().contains("no routes"));
    // A route no row can name: refused, with the characters a name may use.
    let bad_name = Relay::builder(MemoryStore::new())
        .route("bad name!", RecordingSink::new())
        .build()
        .err()
        .unwrap();
    assert_eq!(
        bad_name.to_string(),
        r#"invalid route name "bad name!": character ' ' not allowed (use A-Z a-z 0-9 _ - . : /)"#
    );
    let _ = FailureClass::Timeout;
}

struct NeverSent;
impl Sink for NeverSent {
    async fn publish(
        &self,
        batch: &[Message],
        _cx: &outbox_engine::PublishContext,
    ) -> Result<Vec<Outcome>, Failure> {
        let failure = Failure::retryable(FailureClass::Unavailable, "circuit open, not sent")
            .with_retry_after(Duration::from_secs(60))
            .deferred();
        Ok(vec![failure.into(); batch.len()])
    }
}

#[tokio::test]
async fn max_age_is_judged_by_the_stores_clock_not_a_skewed_relays() {
    // The relay's wall clock runs two hours ahead of the store's; the message is a moment
    // old by the store's clock, which measured its wait at the claim.
    let store = MemoryStore::new();
    let id = store.enqueue(msg("orders", "e")).unwrap();
    let ahead = ManualClock::starting_at(chrono::Utc::now() + chrono::Duration::hours(2));
    let sink = FlakySink::new(RecordingSink::new()).retryable_rate(1.0);
    let relay = Relay::builder(store.clone())
        .route("orders", sink)
        .clock(ahead)
        .retry(RetryPolicy::default().max_age(Some(Duration::from_secs(3600))))
        .build()
        .unwrap();
    let report = relay.run_once().await.unwrap();
    assert_eq!(
        (report.retried, report.dead),
        (1, 0),
        "a failed attempt of a fresh message is retried, whatever the relay's clock says"
    );
    assert_eq!(status(&store, id), Status::Pending);
}

#[tokio::test]
async fn deferred_failures_wait_without_using_up_attempts_until_max_age() {
    let clock = ManualClock::new();
    let store = MemoryStore::with_clock(clock.clone());
    let id = store.enqueue(msg("hooks", "e")).unwrap();
    let relay = Relay::builder(store.clone())
        .route("hooks", NeverSent)
        .clock(clock.clone())
        .retry(
            RetryPolicy::default()
                .max_attempts(2)
                .max_age(Some(Duration::from_secs(3600))),
        )
        .build()
        .unwrap();
    for _ in 0..10 {
        assert_eq!(relay.run_once().await.unwrap().retried, 1);
        let row = store.row(id).unwrap().row;
        assert_eq!(
            (row.status(), row.attempts),
            (Status::Pending, 0),
            "a deferral does not count"
        );
        assert_eq!(
            row.due_at().unwrap() - clock.now(),
            chrono::Duration::seconds(60)
        );
        clock.advance(Duration::from_secs(60));
    }
    clock.advance(Duration::from_secs(3000)); // past max_age
    assert_eq!(
        relay.run_once().await.unwrap().dead,
        1,
        "max_age still bounds waiting"
    );
    assert!(
        store
            .row(id)
            .unwrap()
            .row
            .last_error
            .unwrap()
            .contains("max age")
    );
}

/// Log lines captured in memory.
#[derive(Clone, Default)]
struct Captured(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    /// Captures the log lines at `level` and above until the guard is dropped.
    fn at(level: tracing::Level) -> (Self, tracing::subscriber::DefaultGuard) {
        let logs = Self::default();
        let writer = logs.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_max_level(level)
            .with_ansi(false)
            .finish();
        (logs, tracing::subscriber::set_default(subscriber))
    }

    fn line(&self, containing: &str) -> String {
        let text = String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned();
        text.lines()
            .find(|l| l.contains(containing))
            .unwrap_or_else(|| panic!("no log line with {containing:?} in:\n{text}"))
            .to_owned()
    }
}

/// A retry and a dead letter each log the message id, destination, attempt, failure class
/// and the sink's error.
#[tokio::test]
async fn retries_and_dead_letters_log_the_message_and_the_cause() {
    let (logs, _logging) = Captured::at(tracing::Level::DEBUG);

    let clock = ManualClock::new();
    let store = MemoryStore::with_clock(clock.clone());
    let id = store.enqueue(msg("api", "x")).unwrap();
    let relay = Relay::builder(store.clone())
        .route(
            "api",
            FlakySink::new(RecordingSink::new()).retryable_rate(1.0),
        )
        .clock(clock.clone())
        .retry(RetryPolicy::default().max_attempts(2))
        .build()
        .unwrap();
    assert_eq!(relay.run_once().await.unwrap().retried, 1);
    let retry = logs.line("publish failed; retrying");
    for part in [
        &id.to_string(),
        "api",
        "attempt=1",
        "retryable unavailable",
        "retry_in=",
    ] {
        assert!(retry.contains(part), "{part:?} in {retry}");
    }
    clock.advance(Duration::from_secs(3600));
    assert_eq!(relay.run_once().await.unwrap().dead, 1);
    let dead = logs.line("dead-lettered");
    for part in [&id.to_string(), "api", "attempt=2", "retryable unavailable"] {
        assert!(dead.contains(part), "{part:?} in {dead}");
    }
}

/// A sink that fails every publish (the broker is down) until it is switched on.
#[derive(Clone, Default)]
struct Switch(Arc<std::sync::atomic::AtomicBool>);

impl Sink for Switch {
    async fn publish(
        &self,
        batch: &[Message],
        _cx: &outbox_engine::PublishContext,
    ) -> Result<Vec<Outcome>, Failure> {
        let outcome = if self.0.load(AtomicOrdering::SeqCst) {
            Outcome::published()
        } else {
            Failure::retryable(FailureClass::Connection, "connection refused").into()
        };
        Ok(vec![outcome; batch.len()])
    }
}

/// A broker outage shows at the default log level once (not once per retry), and its end
/// once; the objective is missed while no publish of the route gets through for
/// `max_failing`, and readiness with it when the objective gates readiness.
#[tokio::test]
async fn a_failing_route_is_logged_once_and_makes_the_relay_not_ready() {
    let (logs, _logging) = Captured::at(tracing::Level::WARN);

    let clock = ManualClock::new();
    let store = MemoryStore::with_clock(clock.clone());
    for i in 0..5 {
        store.enqueue(msg("events", &format!("e{i}"))).unwrap();
    }
    let broker = Switch::default();
    let relay = Relay::builder(store.clone())
        .route("events", broker.clone())
        .clock(clock.clone())
        .build()
        .unwrap();
    let health = relay.health();
    let objective = outbox_engine::LagObjective::new()
        .max_failing(Duration::from_millis(1))
        .gates_readiness(true);
    assert!(health.objective(&objective).is_ok());
    for _ in 0..4 {
        assert_eq!(relay.run_once().await.unwrap().retried, 5);
        clock.advance(Duration::from_secs(3600));
    }
    tokio::time::sleep(Duration::from_millis(5)).await;
    let unready = health.ready(&objective).unwrap_err().to_string();
    assert!(
        unready.contains("destination events: no publish got through")
            && unready.contains("20 failed attempts"),
        "{unready}"
    );
    let text = || String::from_utf8_lossy(&logs.0.lock().unwrap()).into_owned();
    assert_eq!(text().matches("route failing").count(), 1, "{}", text());
    assert!(logs.line("route failing").contains("connection refused"));

    broker.0.store(true, AtomicOrdering::SeqCst);
    assert_eq!(relay.run_once().await.unwrap().published, 5);
    assert_eq!(text().matches("route recovered").count(), 1, "{}", text());
    assert!(logs.line("route recovered").contains("failures=20"));
    assert!(
        health.ready(&objective).is_ok(),
        "ready again once a publish got through"
    );
}
