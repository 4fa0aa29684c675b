//! The SQS sink while its emulator is killed (SIGKILL) and started again mid-run: a
//! private moto_server, a relay publishing while messages are committed, and a consumer
//! that receives and deletes throughout.
//!
//! What the emulator keeps: nothing — moto holds queues and messages in memory. So that a
//! restart looks like a durable SQS coming back, the private emulator records every
//! request, and after the restart the test replays the recorded queue creations and sends
//! (every message SQS acknowledged, and only those). Replayed messages the consumer had
//! already taken arrive again: duplicates, counted, never losses. Prints
//! `sqs emulator restart: committed=… received=… distinct=… duplicates=… lost=…`.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox_engine::{MemoryStore, NewMessage, Relay, Status};
use outbox_sink_sqs::read_message;

mod common;
use common::{PrivateMoto, Sqs, config_via, sink};

const MESSAGES: usize = 500;
const CHUNK: usize = 25;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_emulator_killed_and_restarted_mid_run_loses_nothing() {
    let mut moto = PrivateMoto::start().await;
    let sqs = Sqs::at(&moto.endpoint()).await;
    let queue = sqs.queue("restart", false).await;
    let store = MemoryStore::new();
    let relay = Relay::builder(store.clone())
        .route("events", sink(config_via(&queue, &moto.endpoint())).await)
        .batch_size(50)
        .poll_interval(Duration::from_millis(20))
        .retry(
            outbox_engine::RetryPolicy::exponential(
                Duration::from_millis(100),
                Duration::from_secs(1),
            )
            .max_attempts(1_000),
        )
        .build()
        .unwrap();
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let mut relay_stop = stop.clone();
    let running = tokio::spawn(relay.run(async move {
        let _ = relay_stop.wait_for(|s| *s).await;
    }));

    // A consumer that receives and deletes all along, and rides out the emulator's absence.
    let received = Arc::new(Mutex::new(Vec::<String>::new()));
    let consumer = {
        let (client, queue, received, stop) = (
            sqs.client.clone(),
            queue.clone(),
            Arc::clone(&received),
            stop.clone(),
        );
        tokio::spawn(async move {
            while !*stop.borrow() {
                let answer = client
                    .receive_message()
                    .queue_url(&queue)
                    .max_number_of_messages(10)
                    .message_attribute_names("All")
                    .send()
                    .await;
                let Ok(answer) = answer else {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                };
                for m in answer.messages() {
                    let id = read_message(m).unwrap().id.to_string();
                    received.lock().unwrap().push(id);
                }
                let _ = common::delete_all(&client, &queue, answer.messages()).await;
                if answer.messages().is_empty() {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        })
    };

    // Commit in small transactions while the relay runs; the emulator dies halfway.
    let started = tokio::time::Instant::now();
    let mut committed = HashSet::new();
    let mut replayed = 0;
    for chunk in 0..(MESSAGES / CHUNK) {
        let batch: Vec<NewMessage> = (0..CHUNK)
            .map(|i| {
                NewMessage::builder("events", "order.paid")
                    .json(&(chunk * CHUNK + i))
                    .build()
                    .unwrap()
            })
            .collect();
        committed.extend(batch.iter().map(|m| m.id().to_string()));
        store.enqueue_all(batch).unwrap();
        if chunk == MESSAGES / CHUNK / 2 {
            outbox_test_support::wait_until(
                "the relay to publish before the emulator is killed",
                Duration::from_secs(30),
                || async { !store.ids_with_status(Status::Published).is_empty() },
            )
            .await;
            moto.kill();
            tokio::time::sleep(Duration::from_secs(2)).await;
            replayed = moto.restart_and_replay().await;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    outbox_test_support::wait_until(
        "every committed message published after the restart",
        Duration::from_secs(120),
        || async { store.ids_with_status(Status::Published).len() == MESSAGES },
    )
    .await;
    let published_after = started.elapsed();
    // The consumer goes on until every committed id arrived, or until it has received
    // nothing at all for 30 s, or for 150 s in all. Moto slows down as its queue grows,
    // and the replayed duplicates come first: receiving only duplicates for a while is
    // slowness, not a stall.
    let waited = tokio::time::Instant::now();
    let (mut seen, mut progress_at) = (0, tokio::time::Instant::now());
    loop {
        let (total, distinct) = {
            let ids = received.lock().unwrap();
            (ids.len(), ids.iter().cloned().collect::<HashSet<String>>())
        };
        if committed.is_subset(&distinct) {
            break;
        }
        if total > seen {
            (seen, progress_at) = (total, tokio::time::Instant::now());
        } else if progress_at.elapsed() > Duration::from_secs(30) {
            break;
        }
        if waited.elapsed() > Duration::from_secs(150) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop_tx.send(true).unwrap();
    running.await.unwrap();
    consumer.await.unwrap();

    let ids = received.lock().unwrap().clone();
    let distinct: HashSet<String> = ids.iter().cloned().collect();
    let lost = committed.difference(&distinct).count();
    let unexpected = distinct.difference(&committed).count();
    eprintln!(
        "sqs emulator restart: committed={} received={} distinct={} duplicates={} lost={lost} replayed_requests={replayed} published_after={published_after:?} received_after={:?}",
        committed.len(),
        ids.len(),
        distinct.len(),
        ids.len() - distinct.len(),
        started.elapsed()
    );
    assert!(replayed > 1, "the recording held the queue and some sends");
    assert_eq!(lost, 0, "every committed message reached the consumer");
    assert_eq!(unexpected, 0);
}
