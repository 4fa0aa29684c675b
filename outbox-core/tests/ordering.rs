//! Per-key ordering through the relay, on the in-memory store: several relays, a sink that
//! fails 10% of attempts, relays killed at random. Every key must be received in commit
//! order, nothing lost.

use std::collections::HashMap;
use std::time::Duration;

use outbox_engine::testkit::{FlakySink, RecordingSink};
use outbox_engine::{
    DeadHead, MemoryStore, MessageId, MessageOrder, NewMessage, Relay, RetryPolicy, StoreStats,
};

const KEYS: usize = 200;
const PER_KEY: usize = 10;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_arrive_in_commit_order_through_failures_and_kills() {
    let store = MemoryStore::new();
    let mut expected: HashMap<String, Vec<MessageId>> = HashMap::new();
    let mut rng = fastrand::Rng::with_seed(3);
    // Interleave keys and commit in a shuffled order, one message per "transaction".
    let mut order: Vec<(usize, usize)> = (0..KEYS)
        .flat_map(|k| (0..PER_KEY).map(move |i| (k, i)))
        .collect();
    rng.shuffle(&mut order);
    let mut next = vec![0; KEYS];
    for (k, _) in order {
        let key = format!("key-{k}");
        let m = NewMessage::builder("events", "e")
            .json(&next[k])
            .partition_key(key.clone())
            .build()
            .unwrap();
        next[k] += 1;
        expected.entry(key).or_default().push(m.id());
        store.enqueue(m).unwrap();
    }

    let delivered = RecordingSink::new();
    let sink = FlakySink::new(delivered.clone())
        .retryable_rate(0.1)
        .delay(Duration::ZERO, Duration::from_millis(5))
        .seed(5);
    let relay = |i: usize| {
        Relay::builder(store.clone())
            .owner(format!("ordered-{i}"))
            .route("events", sink.clone())
            .ordering(MessageOrder::PerKey(DeadHead::Skip))
            .batch_size(50)
            .concurrency(2)
            .lease(Duration::from_millis(300))
            .poll_interval(Duration::from_millis(10))
            .wakeup(store.wakeup())
            .retry(
                RetryPolicy::exponential(Duration::from_millis(1), Duration::from_millis(10))
                    .max_attempts(1000),
            )
            .build()
            .unwrap()
    };
    let mut running: Vec<_> = (0..4)
        .map(|i| tokio::spawn(relay(i).run(std::future::pending())))
        .collect();
    let mut kills = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        tokio::time::sleep(Duration::from_millis(rng.u64(2..15))).await;
        let total = store.stats().await.unwrap().total();
        if total.published == (KEYS * PER_KEY) as u64 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "did not finish: {total:?}"
        );
        if total.leased > 0 && rng.f64() < 0.5 {
            let victim = rng.usize(..running.len());
            running[victim].abort();
            kills += 1;
            running[victim] = tokio::spawn(relay(10 + kills).run(std::future::pending()));
        }
    }
    for r in running {
        r.abort();
    }

    // Received order per key, first delivery of each id only.
    let mut received: HashMap<String, Vec<MessageId>> = HashMap::new();
    let mut seen = std::collections::HashSet::new();
    for m in delivered.messages() {
        if seen.insert(m.id) {
            received
                .entry(m.partition_key.clone().unwrap())
                .or_default()
                .push(m.id);
        }
    }
    assert!(
        kills >= 3,
        "relays were killed while holding leases: {kills}"
    );
    assert!(sink.stats().retryable > 100, "failures happened");
    assert_eq!(received.len(), KEYS, "every key arrived");
    for (key, ids) in &expected {
        assert_eq!(
            received.get(key),
            Some(ids),
            "key {key} arrived in commit order, complete"
        );
    }
}

/// A key's next row becomes claimable only when its head is finished, long after that
/// row's own wakeup was spent on a claim that had to skip it: the relay must claim again
/// by itself instead of leaving the rest of the key to the next poll (an hour here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rest_of_a_key_does_not_wait_for_the_poll() {
    let store = MemoryStore::new();
    let ids: Vec<MessageId> = (0..3)
        .map(|i| {
            let m = NewMessage::builder("events", "e")
                .json(&i)
                .partition_key("k")
                .build()
                .unwrap();
            store.enqueue(m).unwrap()
        })
        .collect();
    let sink = RecordingSink::new();
    let relay = Relay::builder(store.clone())
        .route("events", sink.clone())
        .ordering(MessageOrder::PerKey(DeadHead::Halt))
        .poll_interval(Duration::from_secs(3600))
        .wakeup(store.wakeup())
        .build()
        .unwrap();
    let running = relay.spawn();
    assert!(
        sink.wait_for(3, Duration::from_secs(5)).await,
        "all three messages of key k delivered within 5 s (got {})",
        sink.messages().len()
    );
    assert_eq!(
        sink.messages().iter().map(|m| m.id).collect::<Vec<_>>(),
        ids,
        "in commit order"
    );
    running.stop().await.unwrap();
}
