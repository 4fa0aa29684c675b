//! `amqp`: the relay publishing to RabbitMQ against a raw lapin loop, same messages, same
//! durability (persistent, publisher confirms, `mandatory`), same batch size and number of
//! concurrent publishers. The relay drains a PostgreSQL backlog (delete on publish), and
//! an in-memory one (the relay and the sink without the database's CPU on the same two
//! cores); the raw loop publishes prebuilt messages and does nothing else.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering as Atomic};
use std::time::{Duration, Instant};

use outbox_engine::{
    MemoryStore, Message, NewMessage, Outcomes, PublishContext, Relay, ReportingSink, Sink,
};
use outbox_sink_amqp::client::options::{
    BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions, QueuePurgeOptions,
};
use outbox_sink_amqp::client::types::{AMQPValue, FieldTable};
use outbox_sink_amqp::client::{BasicProperties, Connection, ConnectionProperties};
use outbox_sink_amqp::{AmqpSink, AmqpSinkConfig};
use outbox_sqlx::PublishedRows;

use crate::Scale;
use crate::drain::preload;
use crate::report::{Report, median};
use crate::setup::{Bench, BoxError};

pub(crate) const BATCH: usize = 100;
pub(crate) const PUBLISHERS: usize = 2;

/// When each message id was acknowledged.
pub(crate) type Acks = Arc<std::sync::Mutex<Vec<(outbox_engine::MessageId, Instant)>>>;

/// Counts what the wrapped sink published, and records when each id was acknowledged.
pub(crate) struct Counting<S> {
    pub(crate) inner: S,
    pub(crate) published: Arc<AtomicUsize>,
    pub(crate) acks: Option<Acks>,
}

impl<S: Sink> ReportingSink for Counting<S> {
    /// Passes the sink's reports through, counting the published ones.
    async fn publish_each(&self, batch: &[Message], cx: &PublishContext, outcomes: &Outcomes) {
        let (published, parent, acks) =
            (self.published.clone(), outcomes.clone(), self.acks.clone());
        let ids: Vec<_> = batch.iter().map(|m| m.id).collect();
        let counted = Outcomes::new(move |index, outcome| {
            if outcome.is_published() {
                published.fetch_add(1, Atomic::Relaxed);
                if let Some(acks) = &acks {
                    acks.lock()
                        .expect("lock")
                        .push((ids[index], Instant::now()));
                }
            }
            parent.report(index, outcome);
        });
        self.inner.publish_reporting(batch, cx, &counted).await;
    }
}

/// The rates of a sink scenario's rounds: the raw client loop's, and the relay's draining
/// PostgreSQL and the in-memory store into the sink.
#[derive(Default)]
pub(crate) struct SinkRounds {
    pub(crate) raw: Vec<f64>,
    pub(crate) relay: Vec<f64>,
    pub(crate) memory: Vec<f64>,
}

impl SinkRounds {
    /// The medians of the raw loop, the relay from PostgreSQL and the relay from memory.
    fn medians(&self) -> (f64, f64, f64) {
        (median(&self.raw), median(&self.relay), median(&self.memory))
    }

    /// The table's row: raw, relay from PostgreSQL, its ratio to raw, relay from memory,
    /// its ratio to raw.
    pub(crate) fn row(&self) -> Vec<String> {
        let (raw, relay, memory) = self.medians();
        vec![
            format!("{raw:.0}"),
            format!("{relay:.0}"),
            format!("{:.2}", relay / raw),
            format!("{memory:.0}"),
            format!("{:.2}", memory / raw),
        ]
    }

    /// The figures for `n` messages per measurement: medians, ratios, and every round.
    pub(crate) fn json(&self, n: usize) -> serde_json::Value {
        let (raw, relay, memory) = self.medians();
        serde_json::json!({
            "messages": n, "raw": raw, "relay_postgres": relay, "relay_postgres_over_raw": relay / raw,
            "relay_memory": memory, "relay_memory_over_raw": memory / raw,
            "raw_rounds": self.raw, "relay_postgres_rounds": self.relay, "relay_memory_rounds": self.memory,
        })
    }
}

pub(crate) async fn amqp(bench: &Bench, scale: Scale, report: &mut Report) -> Result<(), BoxError> {
    let url = std::env::var("OUTBOX_TEST_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/outbox-test".to_owned());
    let n = scale.drain_rows / 2;
    let connection = Connection::connect(&url, ConnectionProperties::default())
        .await
        .map_err(|e| format!("cannot reach RabbitMQ at {} ({e}); run scripts/services.sh or set OUTBOX_TEST_AMQP_URL", outbox_engine::redact::url(&url)))?;
    let channel = connection.create_channel().await?;
    let queue = format!("outbox-bench.{:016x}", fastrand::u64(..));
    channel
        .queue_declare(
            queue.as_str().into(),
            QueueDeclareOptions::durable(),
            FieldTable::default(),
        )
        .await?;

    let mut rounds = SinkRounds::default();
    let purge = || channel.queue_purge(queue.as_str().into(), QueuePurgeOptions::default());
    for _ in 0..scale.rounds.max(2) {
        rounds.raw.push(raw(&connection, &queue, n).await?);
        purge().await?;
        rounds
            .relay
            .push(relay(bench, &url, &queue, n, false).await?);
        purge().await?;
        rounds
            .memory
            .push(relay(bench, &url, &queue, n, true).await?);
        purge().await?;
    }
    channel
        .queue_delete(queue.as_str().into(), Default::default())
        .await?;
    report.section(
        "amqp",
        &format!("{n} persistent messages to one durable RabbitMQ queue with publisher confirms and `mandatory`, batch {BATCH}, {PUBLISHERS} concurrent publishers, messages/s (median of {} interleaved rounds). Relay = a backlog drained by the relay through `AmqpSink`, from PostgreSQL (delete on publish) or from the in-memory store; raw = a lapin loop publishing the same prebuilt messages, each batch pipelined on its channel and then its confirms awaited. RabbitMQ, PostgreSQL and the benchmark share the machine's cores.", rounds.relay.len()),
        &["raw lapin loop", "relay, PostgreSQL store", "relay / raw", "relay, in-memory store", "relay / raw"],
        vec![rounds.row()],
        rounds.json(n),
    );
    Ok(())
}

async fn relay(
    bench: &Bench,
    url: &str,
    queue: &str,
    n: usize,
    in_memory: bool,
) -> Result<f64, BoxError> {
    let sink = AmqpSink::connect(AmqpSinkConfig::new(url).routing_key(queue)).await?;
    drain_rate(bench, sink, n, in_memory, false).await
}

/// Messages per second while the relay drains a backlog of `n` messages (keyed over 1,000
/// keys when `keyed`) into `sink`, from the in-memory store or from PostgreSQL (delete on
/// publish).
pub(crate) async fn drain_rate<K: Sink>(
    bench: &Bench,
    sink: K,
    n: usize,
    in_memory: bool,
    keyed: bool,
) -> Result<f64, BoxError> {
    let published = Arc::new(AtomicUsize::new(0));
    let sink = Counting {
        inner: sink,
        published: published.clone(),
        acks: None,
    };
    let done = async move {
        while published.load(Atomic::Relaxed) < n {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    };
    if in_memory {
        let store = MemoryStore::new().delete_on_publish(true);
        for i in 0..n {
            let message =
                NewMessage::builder("bench", "bench.event").json(&serde_json::json!({ "n": i }));
            let message = if keyed {
                message.partition_key(format!("key-{}", i % 1_000))
            } else {
                message
            };
            store.enqueue(message.build()?)?;
        }
        timed_drain(store, sink, n, done).await
    } else {
        let outbox = bench
            .fresh_outbox("bench_sink_outbox", PublishedRows::Delete)
            .await?;
        preload(&outbox, &bench.pool, n, keyed).await?;
        timed_drain(outbox, sink, n, done).await
    }
}

/// Messages per second while the relay drains `store` into `sink` until `done`.
async fn timed_drain<S: outbox_engine::Store, K: Sink>(
    store: S,
    sink: Counting<K>,
    n: usize,
    done: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<f64, BoxError> {
    let relay = Relay::builder(store)
        .route("bench", sink)
        .batch_size(BATCH)
        .concurrency(PUBLISHERS)
        .poll_interval(Duration::from_millis(20))
        .build()?;
    let started = Instant::now();
    relay.run(done).await;
    Ok(n as f64 / started.elapsed().as_secs_f64())
}

/// The same messages the relay sends (id, type, content type, timestamp, persistent, the
/// idempotency-key header, the payload), published in batches with confirms.
async fn raw(connection: &Connection, queue: &str, n: usize) -> Result<f64, BoxError> {
    let messages: Arc<Vec<(Vec<u8>, BasicProperties)>> = Arc::new(
        (0..n)
            .map(|i| {
                let id = uuid::Uuid::now_v7().to_string();
                let mut headers = FieldTable::default();
                headers.insert(
                    "outbox-idempotency-key".into(),
                    AMQPValue::LongString(id.as_str().into()),
                );
                let properties = BasicProperties::default()
                    .with_message_id(id.into())
                    .with_type("bench.event".into())
                    .with_timestamp(chrono::Utc::now().timestamp() as u64)
                    .with_headers(headers)
                    .with_content_type("application/json".into())
                    .with_delivery_mode(2);
                (
                    serde_json::to_vec(&serde_json::json!({ "n": i })).expect("json"),
                    properties,
                )
            })
            .collect(),
    );
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..PUBLISHERS {
        let channel = connection.create_channel().await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        let (messages, next, queue) = (messages.clone(), next.clone(), queue.to_owned());
        tasks.push(tokio::spawn(async move {
            loop {
                let start = next.fetch_add(BATCH, Atomic::Relaxed);
                if start >= messages.len() {
                    return Ok::<_, outbox_sink_amqp::client::Error>(());
                }
                let mut confirms = Vec::with_capacity(BATCH);
                for (payload, properties) in &messages[start..(start + BATCH).min(messages.len())] {
                    confirms.push(
                        channel
                            .basic_publish(
                                "".into(),
                                queue.as_str().into(),
                                BasicPublishOptions {
                                    mandatory: true,
                                    ..Default::default()
                                },
                                payload,
                                properties.clone(),
                            )
                            .await?,
                    );
                }
                for confirm in confirms {
                    let confirmation = confirm.await?;
                    assert!(confirmation.is_ack(), "raw publish acked");
                }
            }
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok(n as f64 / started.elapsed().as_secs_f64())
}
