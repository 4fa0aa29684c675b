//! `kafka`: the relay publishing to a Kafka-protocol broker against a raw rdkafka producer
//! loop with the same producer settings (idempotent, `acks=all`, 5 in flight, linger 1 ms,
//! murmur2 partitioning), the same records (key, the sink's headers, payload), batch size
//! and number of concurrent publishers.
//!
//! Throughput: the relay drains a PostgreSQL backlog (delete on publish) and an in-memory
//! one; the raw loop sends prebuilt records and awaits each batch's delivery reports.
//! Latency: messages offered at a fixed rate; for the relay, commit → the sink's
//! acknowledgement (PostgreSQL store, wakeups on); for the raw loop, the moment a record
//! is due → its delivery report.

use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox_engine::Relay;
use outbox_sink_kafka::client::ClientConfig;
use outbox_sink_kafka::client::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use outbox_sink_kafka::client::client::DefaultClientContext;
use outbox_sink_kafka::client::message::{Header, OwnedHeaders};
use outbox_sink_kafka::client::producer::{FutureProducer, FutureRecord};
use outbox_sink_kafka::{KafkaSink, KafkaSinkConfig};
use outbox_sqlx::PublishedRows;

use crate::Scale;
use crate::latency::{commit_at_rate, latencies_ms};
use crate::report::{Report, median, percentile};
use crate::setup::{Bench, BoxError, NoopSink, SharedBatches};
use crate::sinks::{Acks, BATCH, Counting, PUBLISHERS, drain_rate};

const PARTITIONS: i32 = 3;
const LATENCY_RATE: u64 = 1_000;

pub(crate) async fn run(bench: &Bench, scale: Scale, report: &mut Report) -> Result<(), BoxError> {
    let brokers =
        std::env::var("OUTBOX_TEST_KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".to_owned());
    let topic = format!("outbox-bench.{:016x}", fastrand::u64(..));
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .create()?;
    admin
        .inner()
        .fetch_metadata(None, Duration::from_secs(10))
        .map_err(|e| format!("cannot reach Kafka at {brokers} ({e}); run scripts/services.sh or set OUTBOX_TEST_KAFKA_BROKERS"))?;
    for result in admin
        .create_topics(
            [&NewTopic::new(
                &topic,
                PARTITIONS,
                TopicReplication::Fixed(1),
            )],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
        )
        .await?
    {
        result.map_err(|(topic, code)| format!("create topic {topic}: {code}"))?;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let config = KafkaSinkConfig::new(format!("kafka://{brokers}")).topic(topic.clone());
    let raw_producer = producer(&brokers)?;
    let sink = KafkaSink::connect(config).await?;
    // Both producers are connected and hold their idempotent producer id before anything
    // is timed: a new producer's first batch waits for that handshake.
    raw_throughput(&raw_producer, &topic, BATCH).await?;
    drain_rate(bench, sink.clone(), BATCH, true, true).await?;

    let n = scale.drain_rows / 2;
    let (mut raw_rates, mut relay_rates, mut memory_rates) = (Vec::new(), Vec::new(), Vec::new());
    let mut noop_rates = Vec::new();
    for _ in 0..scale.rounds.max(2) {
        raw_rates.push(raw_throughput(&raw_producer, &topic, n).await?);
        noop_rates.push(drain_rate(bench, NoopSink::default(), n, false, true).await?);
        relay_rates.push(drain_rate(bench, sink.clone(), n, false, true).await?);
        memory_rates.push(drain_rate(bench, sink.clone(), n, true, true).await?);
    }
    let (raw, relay, memory, noop) = (
        median(&raw_rates),
        median(&relay_rates),
        median(&memory_rates),
        median(&noop_rates),
    );

    let raw_latency = raw_latency(&raw_producer, &topic, scale.latency_time).await?;
    let relay_latency = relay_latency(bench, sink, scale.latency_time).await?;
    let p = |l: &[f64], q| percentile(l, q);

    report.section(
        "kafka",
        &format!(
            "{n} records to one {PARTITIONS}-partition topic on tansu (in memory), idempotent producer, acks=all, batch {BATCH}, {PUBLISHERS} concurrent publishers, messages/s (median of {} interleaved rounds); then {LATENCY_RATE} messages/s offered for {} s, latency in ms. Relay = `KafkaSink` fed by the relay from PostgreSQL (delete on publish; the same drain into a no-op sink shows the store's own rate in this run; for latency, one commit per message and wakeups) or the in-memory store; raw = an rdkafka `FutureProducer` with the same settings sending the same records, awaiting each batch's delivery reports (latency: from the moment a record is due to its report). The broker, PostgreSQL and the benchmark share the machine's cores.",
            relay_rates.len(),
            scale.latency_time.as_secs()
        ),
        &["raw msg/s", "relay msg/s (PostgreSQL, no-op sink)", "relay msg/s (PostgreSQL)", "relay / raw", "relay msg/s (in-memory)", "relay / raw", "raw p50 / p99", "relay p50 / p99 (commit→ack)", "p99 relay / raw"],
        vec![vec![
            format!("{raw:.0}"),
            format!("{noop:.0}"),
            format!("{relay:.0}"),
            format!("{:.2}", relay / raw),
            format!("{memory:.0}"),
            format!("{:.2}", memory / raw),
            format!("{:.1} / {:.1}", p(&raw_latency, 0.5), p(&raw_latency, 0.99)),
            format!("{:.1} / {:.1}", p(&relay_latency, 0.5), p(&relay_latency, 0.99)),
            format!("{:.2}", p(&relay_latency, 0.99) / p(&raw_latency, 0.99)),
        ]],
        serde_json::json!({
            "messages": n, "raw": raw, "relay_postgres_noop_sink": noop, "relay_postgres": relay, "relay_postgres_over_raw": relay / raw,
            "relay_memory": memory, "relay_memory_over_raw": memory / raw,
            "raw_rounds": raw_rates, "relay_postgres_noop_sink_rounds": noop_rates, "relay_postgres_rounds": relay_rates, "relay_memory_rounds": memory_rates,
            "latency_rate": LATENCY_RATE,
            "raw_p50_ms": p(&raw_latency, 0.5), "raw_p99_ms": p(&raw_latency, 0.99),
            "relay_p50_ms": p(&relay_latency, 0.5), "relay_p99_ms": p(&relay_latency, 0.99),
        }),
    );
    Ok(())
}

/// A producer with the settings the sink uses by default.
fn producer(brokers: &str) -> Result<FutureProducer, BoxError> {
    Ok(ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("max.in.flight.requests.per.connection", "5")
        .set("message.timeout.ms", "10000")
        .set("partitioner", "murmur2_random")
        .set("linger.ms", "1")
        .create()?)
}

/// A record as the sink lays it out: key, the sink's headers, JSON payload.
struct RawRecord {
    id: String,
    key: String,
    payload: Vec<u8>,
}

impl RawRecord {
    fn new(i: usize) -> Self {
        Self {
            id: uuid::Uuid::now_v7().to_string(),
            key: format!("key-{}", i % 1_000),
            payload: serde_json::to_vec(&serde_json::json!({ "n": i })).expect("json"),
        }
    }

    fn headers(&self) -> OwnedHeaders {
        [
            ("outbox-id", self.id.as_str()),
            ("outbox-idempotency-key", self.id.as_str()),
            ("outbox-event-type", "bench.event"),
            ("outbox-content-type", "application/json"),
            ("outbox-partition-key", self.key.as_str()),
        ]
        .into_iter()
        .fold(OwnedHeaders::new(), |h, (key, value)| {
            h.insert(Header {
                key,
                value: Some(value),
            })
        })
    }

    fn record<'a>(&'a self, topic: &'a str) -> FutureRecord<'a, str, [u8]> {
        FutureRecord::to(topic)
            .key(self.key.as_str())
            .payload(self.payload.as_slice())
            .headers(self.headers())
    }

    async fn send(&self, producer: &FutureProducer, topic: &str) -> Result<(), String> {
        let delivery = producer
            .send_result(self.record(topic))
            .map_err(|(e, _)| format!("raw send: {e}"))?;
        delivery
            .await
            .map_err(|e| e.to_string())?
            .map_err(|(e, _)| format!("raw delivery: {e}"))?;
        Ok(())
    }
}

async fn raw_throughput(producer: &FutureProducer, topic: &str, n: usize) -> Result<f64, BoxError> {
    let records = SharedBatches::new((0..n).map(RawRecord::new).collect(), BATCH);
    records
        .publish_rate(PUBLISHERS, |records| {
            let (producer, topic) = (producer.clone(), topic.to_owned());
            async move {
                while let Some(batch) = records.take() {
                    let mut reports = Vec::with_capacity(batch.len());
                    for record in batch {
                        reports.push(
                            producer
                                .send_result(record.record(&topic))
                                .map_err(|(e, _)| format!("raw send: {e}"))?,
                        );
                    }
                    for report in reports {
                        report
                            .await
                            .map_err(|e| e.to_string())?
                            .map_err(|(e, _)| format!("raw delivery: {e}"))?;
                    }
                }
                Ok(())
            }
        })
        .await
}

/// Records due at `LATENCY_RATE` per second for `time`: due → delivery report, ms, sorted.
async fn raw_latency(
    producer: &FutureProducer,
    topic: &str,
    time: Duration,
) -> Result<Vec<f64>, BoxError> {
    let mut ticks = tokio::time::interval(Duration::from_secs_f64(1.0 / LATENCY_RATE as f64));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let started = Instant::now();
    let mut sends = tokio::task::JoinSet::new();
    let mut i = 0;
    while started.elapsed() < time {
        ticks.tick().await;
        let due = Instant::now();
        let (producer, topic, record) = (producer.clone(), topic.to_owned(), RawRecord::new(i));
        i += 1;
        sends.spawn(async move {
            record.send(&producer, &topic).await?;
            Ok::<f64, String>(due.elapsed().as_secs_f64() * 1000.0)
        });
    }
    let mut latencies = Vec::with_capacity(i);
    while let Some(done) = sends.join_next().await {
        latencies.push(done??);
    }
    latencies.sort_by(f64::total_cmp);
    Ok(latencies)
}

/// Messages committed one per transaction at `LATENCY_RATE` per second for `time`:
/// commit → the sink's acknowledgement, ms, sorted.
async fn relay_latency(
    bench: &Bench,
    sink: KafkaSink,
    time: Duration,
) -> Result<Vec<f64>, BoxError> {
    let outbox = bench
        .fresh_outbox("bench_kafka_latency", PublishedRows::Delete)
        .await?;
    let acks: Acks = Arc::default();
    let sink = Counting {
        inner: sink,
        published: Arc::default(),
        acks: Some(acks.clone()),
    };
    let listener = outbox.listen().await?.ok_or("PostgreSQL listens")?;
    let relay = Relay::builder(outbox.clone())
        .route("bench", sink)
        .batch_size(BATCH)
        .concurrency(PUBLISHERS)
        .poll_interval(Duration::from_millis(250))
        .wakeup(listener.wakeup())
        .build()?;
    let running = tokio::spawn(relay.run(std::future::pending()));
    tokio::time::sleep(Duration::from_millis(300)).await;

    let commits = commit_at_rate(
        bench,
        &outbox,
        Some(outbox.notifier()),
        LATENCY_RATE,
        time,
        true,
    )
    .await?;
    let latencies = latencies_ms(&commits, &acks).await;
    running.abort();
    latencies
}
