//! `nats`: the relay publishing to NATS JetStream against a raw async-nats loop with the
//! same acknowledgement settings (each message waits for its `PubAck` from a file-backed
//! stream with a duplicate window), the same messages (`Nats-Msg-Id` and the sink's
//! headers, payload), batch size and number of concurrent publishers on one connection.
//! The relay drains a PostgreSQL backlog (delete on publish) and an in-memory one.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering as Atomic};
use std::time::{Duration, Instant};

use outbox_sink_nats::client::jetstream::{self, stream};
use outbox_sink_nats::client::{HeaderMap, jetstream::context::PublishAckFuture};
use outbox_sink_nats::{NatsSink, NatsSinkConfig};

use crate::Scale;
use crate::report::Report;
use crate::setup::{Bench, BoxError};
use crate::sinks::{BATCH, PUBLISHERS, SinkRounds, drain_rate};

pub(crate) async fn run(bench: &Bench, scale: Scale, report: &mut Report) -> Result<(), BoxError> {
    let url = std::env::var("OUTBOX_TEST_NATS_URL")
        .unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned());
    let client = outbox_sink_nats::client::connect(url.as_str())
        .await
        .map_err(|e| format!("cannot reach NATS at {url} ({e}); run scripts/services.sh or set OUTBOX_TEST_NATS_URL"))?;
    let js = jetstream::new(client);
    let name = format!("OUTBOX_BENCH_{:016X}", fastrand::u64(..));
    let stream = js
        .create_stream(stream::Config {
            name: name.clone(),
            subjects: vec![format!("{name}.>")],
            storage: stream::StorageType::File,
            duplicate_window: Duration::from_secs(120),
            ..Default::default()
        })
        .await?;
    let subject = format!("{name}.events");
    let sink = NatsSink::connect(NatsSinkConfig::new(&url).subject(subject.clone())).await?;

    let n = scale.drain_rows / 2;
    let mut rounds = SinkRounds::default();
    for _ in 0..scale.rounds.max(2) {
        rounds.raw.push(raw(&js, &subject, n).await?);
        stream.purge().await?;
        rounds
            .relay
            .push(drain_rate(bench, sink.clone(), n, false, false).await?);
        stream.purge().await?;
        rounds
            .memory
            .push(drain_rate(bench, sink.clone(), n, true, false).await?);
        stream.purge().await?;
    }
    js.delete_stream(&name).await?;
    report.section(
        "nats",
        &format!("{n} messages to one file-backed JetStream stream with a two-minute duplicate window, each marked on its PubAck, batch {BATCH}, {PUBLISHERS} concurrent publishers on one connection, messages/s (median of {} interleaved rounds). Relay = a backlog drained by the relay through `NatsSink`, from PostgreSQL (delete on publish) or from the in-memory store; raw = an async-nats loop publishing the same prebuilt messages with the same headers, each batch pipelined and then its PubAcks awaited. NATS, PostgreSQL and the benchmark share the machine's cores.", rounds.relay.len()),
        &["raw async-nats loop", "relay, PostgreSQL store", "relay / raw", "relay, in-memory store", "relay / raw"],
        vec![rounds.row()],
        rounds.json(n),
    );
    Ok(())
}

/// The same messages the relay sends (`Nats-Msg-Id` and the sink's headers, the payload),
/// published in pipelined batches, each message's `PubAck` awaited.
async fn raw(js: &jetstream::Context, subject: &str, n: usize) -> Result<f64, BoxError> {
    let messages: Arc<Vec<(HeaderMap, bytes::Bytes)>> = Arc::new(
        (0..n)
            .map(|i| {
                let id = uuid::Uuid::now_v7().to_string();
                let mut headers = HeaderMap::new();
                headers.insert("Nats-Msg-Id", id.as_str());
                headers.insert("outbox-id", id.as_str());
                headers.insert("outbox-idempotency-key", id.as_str());
                headers.insert("outbox-event-type", "bench.event");
                headers.insert("outbox-content-type", "application/json");
                let payload = serde_json::to_vec(&serde_json::json!({ "n": i })).expect("json");
                (headers, payload.into())
            })
            .collect(),
    );
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..PUBLISHERS {
        let (js, messages, next, subject) = (
            js.clone(),
            messages.clone(),
            next.clone(),
            subject.to_owned(),
        );
        tasks.push(tokio::spawn(async move {
            loop {
                let start = next.fetch_add(BATCH, Atomic::Relaxed);
                if start >= messages.len() {
                    return Ok::<_, String>(());
                }
                let mut acks: Vec<PublishAckFuture> = Vec::with_capacity(BATCH);
                for (headers, payload) in &messages[start..(start + BATCH).min(messages.len())] {
                    let sent = js
                        .publish_with_headers(subject.clone(), headers.clone(), payload.clone())
                        .await;
                    acks.push(sent.map_err(|e| e.to_string())?);
                }
                for ack in acks {
                    ack.await.map_err(|e| e.to_string())?;
                }
            }
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok(n as f64 / started.elapsed().as_secs_f64())
}
