//! The AMQP sink while the broker misbehaves, driven with `rabbitmqctl`: the broker
//! closes the relay's connection, the broker app stops and starts again, a memory alarm
//! blocks publishers, and a message over the broker's size limit closes its channel. Nothing committed is lost, the relay resumes by itself, and
//! no publish outlives its deadline. These tests change the broker for everyone, so the
//! `rabbitmq` test group runs RabbitMQ tests one at a time (`.config/nextest.toml`).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use outbox_engine::{
    FailureClass, MemoryStore, NewMessage, Outcome, PublishContext, Relay, RetryPolicy, Sink,
    Status,
};
use outbox_sink_amqp::AmqpSinkConfig;
use outbox_test_support::wait_until;

mod common;
use common::{Broker, close_connections, delivered, rabbitmqctl, sink, url};

/// Starts the broker app again if a test stopped it and then failed.
struct AppGuard {
    stopped: bool,
}

impl AppGuard {
    fn stop(&mut self) {
        rabbitmqctl(&["stop_app"]);
        self.stopped = true;
    }

    fn start(&mut self) {
        rabbitmqctl(&["start_app"]);
        rabbitmqctl(&["await_startup"]);
        self.stopped = false;
    }
}

impl Drop for AppGuard {
    fn drop(&mut self) {
        if self.stopped {
            let _ = std::process::Command::new("rabbitmqctl")
                .arg("start_app")
                .status();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_closed_by_the_broker_and_app_restart_lose_nothing() {
    let broker = Broker::connect().await;
    let queue = broker.queue("faults").await;
    drop(broker);
    let store = MemoryStore::new();
    let relay = Relay::builder(store.clone())
        .route(
            "orders",
            sink(AmqpSinkConfig::new(url()).routing_key(queue.clone())).await,
        )
        .batch_size(50)
        .concurrency(2)
        .poll_interval(Duration::from_millis(20))
        .retry(
            RetryPolicy::exponential(Duration::from_millis(50), Duration::from_millis(500))
                .max_attempts(1_000),
        )
        .build()
        .unwrap();
    let (stop_tx, mut stop) = tokio::sync::watch::channel(false);
    let running = tokio::spawn(async move {
        relay
            .run(async move {
                let _ = stop.wait_for(|s| *s).await;
            })
            .await
    });
    // The writer: commits about a message per millisecond until the faults are over.
    let (writing_tx, writing) = tokio::sync::watch::channel(true);
    let writer = {
        let store = store.clone();
        tokio::spawn(async move {
            let mut ids = Vec::new();
            for i in 0.. {
                if !*writing.borrow() {
                    break;
                }
                let message = NewMessage::builder("orders", "order.paid")
                    .json(&i)
                    .build()
                    .unwrap();
                ids.push(message.id());
                store.enqueue(message).unwrap();
                if i % 10 == 0 {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
            ids
        })
    };
    let published = || store.ids_with_status(Status::Published).len();

    wait_until(
        "500 messages published",
        Duration::from_secs(30),
        || async { published() >= 500 },
    )
    .await;
    let closed = close_connections("outbox-relay-");
    assert!(closed >= 1, "the relay's connection was found and closed");
    let closed_at = Instant::now();
    let before = published();
    wait_until(
        "publishing to resume after the broker closed the connection",
        Duration::from_secs(30),
        || async { published() > before + 50 },
    )
    .await;
    let resumed_after_close = closed_at.elapsed();

    let mut app = AppGuard { stopped: false };
    app.stop();
    tokio::time::sleep(Duration::from_secs(2)).await;
    app.start();
    let started_at = Instant::now();
    let before = published();
    wait_until(
        "publishing to resume after the broker app restarted",
        Duration::from_secs(60),
        || async { published() > before + 50 },
    )
    .await;
    let resumed_after_restart = started_at.elapsed();

    writing_tx.send(false).unwrap();
    let ids = writer.await.unwrap();
    let committed = ids.len();
    wait_until(
        "every committed message published",
        Duration::from_secs(120),
        || async { published() == committed },
    )
    .await;
    stop_tx.send(true).unwrap();
    running.await.unwrap();

    let broker = Broker::connect().await;
    let got = broker.take(&queue).await;
    let mut copies: HashMap<String, usize> = HashMap::new();
    for delivery in &got {
        *copies.entry(delivered(delivery).id).or_default() += 1;
    }
    let lost = ids
        .iter()
        .filter(|id| !copies.contains_key(&id.to_string()))
        .count();
    let duplicates = got.len() - copies.len();
    eprintln!(
        "amqp faults: committed={committed} received={} duplicates={duplicates} lost={lost} \
         resumed_after_close={resumed_after_close:?} resumed_after_restart={resumed_after_restart:?}",
        got.len()
    );
    assert_eq!(lost, 0, "every committed message is in the queue");
    assert_eq!(copies.len(), committed, "nothing unexpected in the queue");
    broker.cleanup(&[queue], &[]).await;
}

/// Restores the memory watermark (the Debian default, 0.4) if the test fails midway.
struct WatermarkGuard;

impl Drop for WatermarkGuard {
    fn drop(&mut self) {
        let _ = std::process::Command::new("rabbitmqctl")
            .args(["set_vm_memory_high_watermark", "0.4"])
            .status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_alarm_never_holds_a_publish_past_its_deadline() {
    let broker = Broker::connect().await;
    let queue = broker.queue("alarm").await;
    let sink = sink(AmqpSinkConfig::new(url()).routing_key(queue.clone())).await;
    let batch = |n: usize| -> Vec<_> {
        (0..n)
            .map(|i| {
                NewMessage::builder("orders", "order.paid")
                    .json(&i)
                    .build()
                    .unwrap()
                    .into_message(chrono::Utc::now())
            })
            .collect()
    };
    let guard = WatermarkGuard;
    rabbitmqctl(&["set_vm_memory_high_watermark", "0"]);
    // The alarm blocks publishing connections as soon as they publish.
    for round in 0..2 {
        let started = Instant::now();
        let outcomes = sink
            .publish(&batch(5), &PublishContext::timeout(Duration::from_secs(2)))
            .await
            .unwrap();
        let took = started.elapsed();
        assert!(
            took < Duration::from_secs(4),
            "round {round}: the publish returned by its deadline ({took:?})"
        );
        for outcome in &outcomes {
            match outcome {
                Outcome::Failed(f) => {
                    assert!(f.retryable, "round {round}: {f}");
                    assert!(
                        matches!(f.class, FailureClass::Timeout | FailureClass::Unavailable),
                        "round {round}: {f}"
                    );
                }
                Outcome::Published { .. } => panic!("round {round}: published under an alarm"),
            }
        }
    }
    drop(guard);
    let messages = batch(3);
    wait_until(
        "publishing to work again once the alarm cleared",
        Duration::from_secs(30),
        || async {
            let outcomes = sink
                .publish(&messages, &PublishContext::timeout(Duration::from_secs(2)))
                .await
                .unwrap();
            outcomes.iter().all(Outcome::is_published)
        },
    )
    .await;
    broker.cleanup(&[queue], &[]).await;
}

/// Restores the broker's message size limit (its default, 128 MiB) when the test ends.
struct MaxSizeGuard;

impl Drop for MaxSizeGuard {
    fn drop(&mut self) {
        let _ = std::process::Command::new("rabbitmqctl")
            .args([
                "eval",
                "application:set_env(rabbit, max_message_size, 134217728).",
            ])
            .status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_the_broker_refuses_is_dead_lettered_alone() {
    let broker = Broker::connect().await;
    let queue = broker.queue("oversize").await;
    let _guard = MaxSizeGuard;
    // Channels opened from now on refuse messages over 4 KiB with `406 PRECONDITION_FAILED`,
    // which closes the channel under the rest of the batch.
    rabbitmqctl(&[
        "eval",
        "application:set_env(rabbit, max_message_size, 4096).",
    ]);
    let store = MemoryStore::new();
    let mut ids = Vec::new();
    for i in 0..10 {
        let payload = if i == 4 {
            vec![b'x'; 8_192]
        } else {
            vec![b'y'; 16]
        };
        let message = NewMessage::builder("orders", "order.paid")
            .bytes(payload, "application/octet-stream")
            .build()
            .unwrap();
        ids.push(message.id());
        store.enqueue(message).unwrap();
    }
    let relay = Relay::builder(store.clone())
        .route(
            "orders",
            sink(AmqpSinkConfig::new(url()).routing_key(queue.clone())).await,
        )
        .batch_size(10)
        .retry(
            RetryPolicy::exponential(Duration::from_millis(20), Duration::from_millis(200))
                .max_attempts(50),
        )
        .build()
        .unwrap();
    wait_until(
        "every message published or dead-lettered",
        Duration::from_secs(60),
        || async {
            relay.drain().await.unwrap();
            store.ids_with_status(Status::Published).len()
                + store.ids_with_status(Status::Dead).len()
                == ids.len()
        },
    )
    .await;
    let dead = store.row(ids[4]).unwrap().row;
    assert_eq!(
        dead.status(),
        Status::Dead,
        "the oversize message is dead-lettered"
    );
    let reason = dead.last_error.unwrap_or_default();
    assert!(
        reason.contains("406"),
        "the broker's reason is kept: {reason}"
    );
    for (i, id) in ids.iter().enumerate().filter(|(i, _)| *i != 4) {
        assert_eq!(
            store.row(*id).unwrap().row.status(),
            Status::Published,
            "message {i} went through"
        );
    }
    let got: std::collections::HashSet<String> = broker
        .take(&queue)
        .await
        .iter()
        .map(|d| delivered(d).id)
        .collect();
    assert_eq!(got.len(), 9, "the nine others are in the queue");
    assert!(!got.contains(&ids[4].to_string()));
    broker.cleanup(&[queue], &[]).await;
}
