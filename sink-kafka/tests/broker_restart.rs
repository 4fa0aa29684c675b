//! The Kafka sink while its broker is killed (SIGKILL) and started again mid-run: a
//! private tansu broker keeping its topics in SQLite, a relay publishing while messages
//! are committed, and a reader that counts what the broker has afterwards. Prints
//! `kafka broker restart: committed=… published=… distinct=… duplicates=… lost=…`.
//!
//! tansu 0.6's SQLite engine sometimes loses an idempotent producer's state in the kill
//! and then panics ("more or less than one row", `idempotent_message_check`) on every
//! request of that producer, also after restarts. A real broker answers such a producer
//! with an error instead. The test then does what a supervisor would: it restarts the
//! broker and the relay (whose new sink gets a new producer id), and says so; the store
//! keeps every unpublished row across the relay restart.

use std::collections::HashSet;
use std::time::Duration;

use outbox_engine::{MemoryStore, NewMessage, Relay, RunningRelay, Status};
use outbox_sink_kafka::KafkaSinkConfig;
use outbox_sink_kafka::read_record;

mod common;
use common::{Kafka, PrivateBroker, sink};

const MESSAGES: usize = 2_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_killed_and_restarted_mid_run_loses_nothing() {
    let dir = std::env::temp_dir().join(format!("outbox-kafka-restart-{:016x}", fastrand::u64(..)));
    std::fs::create_dir_all(&dir).unwrap();
    let mut broker = PrivateBroker::start(&dir).await;
    let kafka = Kafka::at(&broker.address()).await;
    let topic = kafka.topic("restart", 3).await;
    let store = MemoryStore::new();
    let mut relay = start_relay(&store, &broker.address(), &topic).await;

    // Commit in small transactions while the relay runs; the broker dies halfway.
    let mut committed = HashSet::new();
    for chunk in 0..(MESSAGES / 50) {
        let batch: Vec<NewMessage> = (0..50)
            .map(|i| {
                NewMessage::builder("events", "order.paid")
                    .json(&(chunk * 50 + i))
                    .build()
                    .unwrap()
            })
            .collect();
        committed.extend(batch.iter().map(|m| m.id().to_string()));
        store.enqueue_all(batch).unwrap();
        if chunk == MESSAGES / 100 {
            outbox_test_support::wait_until(
                "the relay to publish before the broker is killed",
                Duration::from_secs(30),
                || async { !store.ids_with_status(Status::Published).is_empty() },
            )
            .await;
            broker.kill();
            tokio::time::sleep(Duration::from_secs(2)).await;
            broker.restart().await;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Wait for every row to be published. Like a supervisor, restart the broker again if
    // it broke itself (see `PrivateBroker::panics`), as often as it takes (on a slow machine
    // it broke itself three times in a row); the relay must carry on either way.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
    let mut supervisor_restarts = 0;
    while store.ids_with_status(Status::Published).len() < MESSAGES {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after 180 s waiting for every committed message published after the restart \
             ({} of {MESSAGES}; broker and relay restarted {supervisor_restarts} more times after panics)",
            store.ids_with_status(Status::Published).len()
        );
        if broker.panics() > supervisor_restarts && supervisor_restarts < 10 {
            supervisor_restarts += 1;
            eprintln!(
                "tansu panicked (its own bug); restarting it and the relay as a supervisor would"
            );
            stop_relay(relay).await;
            broker.restart().await;
            relay = start_relay(&store, &broker.address(), &topic).await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop_relay(relay).await;

    // Read until every committed id is there (or a minute passed): re-sends mean the
    // record count alone does not tell.
    let mut reader = Kafka::at(&broker.address()).await.reader(&topic);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let (ids, distinct) = loop {
        let ids: Vec<String> = reader
            .take(Duration::from_millis(500))
            .await
            .iter()
            .map(|r| read_record(r).unwrap().id.to_string())
            .collect();
        let distinct: HashSet<String> = ids.iter().cloned().collect();
        if committed.is_subset(&distinct) || tokio::time::Instant::now() > deadline {
            break (ids, distinct);
        }
    };
    let lost = committed.difference(&distinct).count();
    let unexpected = distinct.difference(&committed).count();
    eprintln!(
        "kafka broker restart: committed={} published={MESSAGES} records={} distinct={} duplicates={} lost={lost} supervisor_restarts={supervisor_restarts}",
        committed.len(),
        ids.len(),
        distinct.len(),
        ids.len() - distinct.len()
    );
    assert_eq!(
        lost, 0,
        "every message the relay marked published is on the broker"
    );
    assert_eq!(unexpected, 0);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A relay over the shared store with its own Kafka sink, running in a task of its own.
async fn start_relay(store: &MemoryStore, address: &str, topic: &str) -> RunningRelay {
    Relay::builder(store.clone())
        .route(
            "events",
            sink(KafkaSinkConfig::new(format!("kafka://{address}")).topic(topic.to_owned())).await,
        )
        .batch_size(50)
        .poll_interval(Duration::from_millis(20))
        .shutdown_grace(Duration::from_secs(2))
        .retry(
            outbox_engine::RetryPolicy::exponential(
                Duration::from_millis(100),
                Duration::from_secs(1),
            )
            .max_attempts(1_000),
        )
        .build()
        .unwrap()
        .spawn()
}

/// Stops claiming, lets batches in flight finish for the grace, releases the rest.
async fn stop_relay(relay: RunningRelay) {
    tokio::time::timeout(Duration::from_secs(60), relay.stop())
        .await
        .expect("the relay stopped within 60 s")
        .unwrap();
}
