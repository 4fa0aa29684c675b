//! `sqs`: the relay publishing to an SQS emulator (moto) against a raw `SendMessageBatch`
//! loop sending the same messages (body and the sink's attributes) in the same requests:
//! batches of 100 split into requests of 10, sent at once, by the same number of
//! concurrent publishers. Each measurement gets a fresh queue (moto slows down as its
//! queue grows, so both sides start empty).

use std::collections::HashMap;

use outbox_sink_sqs::client::config::{BehaviorVersion, Credentials, Region};
use outbox_sink_sqs::client::types::{MessageAttributeValue, SendMessageBatchRequestEntry};
use outbox_sink_sqs::client::{Client, Config};
use outbox_sink_sqs::{SqsSink, SqsSinkConfig};

use crate::Scale;
use crate::report::Report;
use crate::setup::{Bench, BoxError, SharedBatches};
use crate::sinks::{BATCH, PUBLISHERS, SinkRounds, drain_rate};

/// Messages per measurement: moto takes a few hundred a second.
const MESSAGES: usize = 2_000;

pub(crate) async fn run(bench: &Bench, scale: Scale, report: &mut Report) -> Result<(), BoxError> {
    let endpoint = std::env::var("OUTBOX_TEST_SQS_ENDPOINT")
        .unwrap_or_else(|_| "http://127.0.0.1:4566".to_owned());
    let client = Client::from_conf(
        Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new("us-east-1"))
            .endpoint_url(&endpoint)
            .credentials_provider(Credentials::new("test", "test", None, None, "bench"))
            .build(),
    );
    client.list_queues().send().await.map_err(|e| {
        format!("cannot reach SQS at {endpoint} ({e}); run scripts/services.sh or set OUTBOX_TEST_SQS_ENDPOINT")
    })?;
    let n = MESSAGES;
    let mut rounds = SinkRounds::default();
    for _ in 0..scale.rounds.max(2) {
        let queue = fresh_queue(&client).await?;
        rounds.raw.push(raw_throughput(&client, &queue, n).await?);
        delete_queue(&client, &queue).await?;
        for (in_memory, rates) in [(false, &mut rounds.relay), (true, &mut rounds.memory)] {
            let queue = fresh_queue(&client).await?;
            let path = queue
                .splitn(4, '/')
                .nth(3)
                .ok_or("a queue URL has a path")?;
            let config = SqsSinkConfig::new(format!("sqs+{endpoint}/{path}"))
                .region("us-east-1")
                .credentials("test", "test");
            let sink = SqsSink::connect(config).await?;
            rates.push(drain_rate(bench, sink, n, in_memory, false).await?);
            delete_queue(&client, &queue).await?;
        }
    }
    report.section(
        "sqs",
        &format!(
            "{n} messages to a fresh standard queue on moto_server (in memory) per measurement, batch {BATCH} split into requests of 10 sent at once, {PUBLISHERS} concurrent publishers, messages/s (median of {} interleaved rounds). Relay = `SqsSink` fed by the relay from PostgreSQL (delete on publish) or the in-memory store; raw = the SDK's `SendMessageBatch` with the same bodies and attributes in the same requests. moto, PostgreSQL and the benchmark share the machine's cores; moto is the bottleneck.",
            rounds.relay.len()
        ),
        &["raw msg/s", "relay msg/s (PostgreSQL)", "relay / raw", "relay msg/s (in-memory)", "relay / raw"],
        vec![rounds.row()],
        rounds.json(n),
    );
    Ok(())
}

async fn fresh_queue(client: &Client) -> Result<String, BoxError> {
    let name = format!("outbox-bench-{:016x}", fastrand::u64(..));
    let created = client.create_queue().queue_name(name).send().await?;
    Ok(created.queue_url().ok_or("a queue URL")?.to_owned())
}

async fn delete_queue(client: &Client, queue: &str) -> Result<(), BoxError> {
    client.delete_queue().queue_url(queue).send().await?;
    Ok(())
}

/// An entry as the sink lays it out: JSON body, the sink's attributes.
fn entry(i: usize) -> SendMessageBatchRequestEntry {
    let id = uuid::Uuid::now_v7().to_string();
    let attributes: HashMap<String, MessageAttributeValue> = [
        ("outbox-id", id.as_str()),
        ("outbox-idempotency-key", id.as_str()),
        ("outbox-event-type", "bench.event"),
        ("outbox-content-type", "application/json"),
    ]
    .into_iter()
    .map(|(name, value)| {
        let value = MessageAttributeValue::builder()
            .data_type("String")
            .string_value(value)
            .build()
            .expect("typed");
        (name.to_owned(), value)
    })
    .collect();
    SendMessageBatchRequestEntry::builder()
        .id("0")
        .message_body(serde_json::json!({ "n": i }).to_string())
        .set_message_attributes(Some(attributes))
        .build()
        .expect("id and body")
}

async fn raw_throughput(client: &Client, queue: &str, n: usize) -> Result<f64, BoxError> {
    let entries = SharedBatches::new((0..n).map(entry).collect(), BATCH);
    entries
        .publish_rate(PUBLISHERS, |entries| {
            let (client, queue) = (client.clone(), queue.to_owned());
            async move {
                while let Some(batch) = entries.take() {
                    let requests = batch.chunks(10).map(|chunk| {
                        let request: Vec<SendMessageBatchRequestEntry> = chunk
                            .iter()
                            .enumerate()
                            .map(|(p, e)| {
                                let mut e = e.clone();
                                e.id = p.to_string();
                                e
                            })
                            .collect();
                        client
                            .send_message_batch()
                            .queue_url(&queue)
                            .set_entries(Some(request))
                            .send()
                    });
                    for answer in futures_util::future::join_all(requests).await {
                        let answer = answer.map_err(|e| format!("raw send: {e}"))?;
                        if !answer.failed().is_empty() {
                            return Err(format!(
                                "raw send: {} entries failed",
                                answer.failed().len()
                            ));
                        }
                    }
                }
                Ok(())
            }
        })
        .await
}
