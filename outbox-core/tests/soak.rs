//! Relay soak on the in-memory store: 10,000 messages, a sink failing 30% of attempts
//! retryably and 1% of messages permanently, four relays with short leases, relays
//! killed at random and replaced. Nothing may be lost.

use std::collections::HashSet;
use std::time::Duration;

use outbox_engine::testkit::{FlakySink, RecordingSink};
use outbox_engine::{MemoryStore, MessageId, NewMessage, Relay, RetryPolicy, Status, StoreStats};

const MESSAGES: usize = 10_000;
const RELAYS: usize = 4;

fn is_poison(n: u64) -> bool {
    n % 100 == 37 // exactly 1%
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_with_flaky_sink_and_killed_relays_loses_nothing() {
    let store = MemoryStore::new();
    let mut poison = HashSet::new();
    let mut all = HashSet::new();
    let messages: Vec<_> = (0..MESSAGES as u64)
        .map(|n| {
            let m = NewMessage::builder("events", if is_poison(n) { "poison" } else { "ok" })
                .json(&n)
                .build()
                .unwrap();
            all.insert(m.id());
            if is_poison(n) {
                poison.insert(m.id());
            }
            m
        })
        .collect();
    store.enqueue_all(messages).unwrap();

    let delivered = RecordingSink::new();
    let sink = FlakySink::new(delivered.clone())
        .retryable_rate(0.3)
        .permanent_when(|m| m.event_type == "poison")
        .delay(Duration::ZERO, Duration::from_millis(5))
        .seed(42);
    let relay = |i: usize| {
        Relay::builder(store.clone())
            .owner(format!("soak-{i}"))
            .route("events", sink.clone())
            .batch_size(50)
            .lease(Duration::from_millis(300))
            .poll_interval(Duration::from_millis(20))
            .wakeup(store.wakeup())
            .retry(
                RetryPolicy::exponential(Duration::from_millis(1), Duration::from_millis(20))
                    .max_attempts(1000),
            )
            .build()
            .unwrap()
    };

    let mut rng = fastrand::Rng::with_seed(7);
    let mut running: Vec<_> = (0..RELAYS)
        .map(|i| tokio::spawn(relay(i).run(std::future::pending())))
        .collect();
    let mut kills = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        tokio::time::sleep(Duration::from_millis(rng.u64(5..30))).await;
        let total = store.stats().await.unwrap().total();
        if total.published + total.dead == MESSAGES as u64 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "soak did not finish: {total:?}"
        );
        if total.leased > 0 && rng.f64() < 0.7 {
            // kill -9 one relay while rows are leased: its leases stay behind and lapse.
            let victim = rng.usize(..RELAYS);
            running[victim].abort();
            kills += 1;
            running[victim] = tokio::spawn(relay(RELAYS + kills).run(std::future::pending()));
        }
    }
    for r in running {
        r.abort();
    }

    let published: HashSet<MessageId> = store
        .ids_with_status(Status::Published)
        .into_iter()
        .collect();
    let dead: HashSet<MessageId> = store.ids_with_status(Status::Dead).into_iter().collect();
    let received: HashSet<MessageId> = delivered.messages().iter().map(|m| m.id).collect();
    let duplicates = delivered.len() - received.len();
    eprintln!(
        "soak: published={} dead={} kills={kills} flaky={:?} duplicates={duplicates}",
        published.len(),
        dead.len(),
        sink.stats()
    );
    assert!(
        kills >= 3,
        "the soak must actually kill relays holding leases"
    );
    assert_eq!(
        published.len() + dead.len(),
        MESSAGES,
        "published + dead = all"
    );
    assert_eq!(
        dead, poison,
        "dead letters are exactly the permanent failures"
    );
    assert!(
        published.is_subset(&received),
        "published only after the sink received it"
    );
    let lost: Vec<_> = all
        .difference(&received)
        .filter(|id| !poison.contains(id))
        .collect();
    assert!(lost.is_empty(), "lost {} messages", lost.len());
    assert!(
        received.is_disjoint(&poison),
        "no permanent failure was delivered"
    );
    assert!(
        sink.stats().retryable > 2_000,
        "about 30% of attempts failed retryably"
    );
}
