//! The consumers of the SaaS event bus: one per transport, each keeping a view of the
//! events it handled, deduplicated by event id and checked for per-key order.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use outbox::amqp::client as amqp;
use outbox::amqp::read_delivery;
use outbox::kafka::client as kafka;
use outbox::receiver::WebhookReceiver;
use outbox::redis::client as redis;

use super::GROUP;
use crate::support::{self, Error};

/// One delivery as a consumer sees it, from either transport.
pub(super) struct Delivered {
    event_id: String,
    tenant: Option<String>,
    key: Option<String>,
    event_type: String,
    version: i64,
}

impl Delivered {
    /// An event as a consumer read it; the version comes from the JSON payload.
    fn new(
        event_id: String,
        tenant: Option<String>,
        key: Option<String>,
        event_type: String,
        payload: &[u8],
    ) -> Self {
        let payload: serde_json::Value = serde_json::from_slice(payload).unwrap_or_default();
        Self {
            event_id,
            tenant,
            key,
            event_type,
            version: payload["version"].as_i64().unwrap_or_default(),
        }
    }
}

/// What a consumer keeps: each event once (by event id), checked for per-key order.
#[derive(Default)]
pub(super) struct ConsumerView {
    pub(super) seen: HashSet<String>,
    pub(super) events: Vec<Delivered>,
    pub(super) duplicates: u64,
    pub(super) out_of_order: u64,
    pub(super) untenanted: u64,
    versions: HashMap<String, i64>,
}

impl ConsumerView {
    fn ingest(&mut self, delivered: Delivered) {
        // At-least-once delivery: a copy of an event already handled is dropped.
        if !self.seen.insert(delivered.event_id.clone()) {
            self.duplicates += 1;
            return;
        }
        if delivered.tenant.is_none() {
            self.untenanted += 1;
        }
        if let Some(key) = &delivered.key {
            let last = self.versions.entry(key.clone()).or_insert(0);
            if delivered.version != *last + 1 {
                self.out_of_order += 1;
            }
            *last = (*last).max(delivered.version);
        }
        self.events.push(delivered);
    }

    pub(super) fn print(&self, title: &str) {
        println!("{title}, deduplicated by event id:");
        let mut by_tenant: BTreeMap<&str, BTreeMap<&str, Vec<String>>> = BTreeMap::new();
        for e in &self.events {
            by_tenant
                .entry(e.tenant.as_deref().unwrap_or("(no tenant)"))
                .or_default()
                .entry(e.key.as_deref().unwrap_or("(no key)"))
                .or_default()
                .push(format!("v{} {}", e.version, e.event_type));
        }
        for (tenant, keys) in by_tenant {
            println!("  tenant {tenant}");
            for (key, events) in keys {
                println!("    {key:<28} {}", events.join(" → "));
            }
        }
        if self.duplicates > 0 {
            println!("  ({} duplicate delivery dropped)", self.duplicates);
        }
    }
}

type Entry = (String, HashMap<String, Vec<u8>>);

/// Reads the stream with a consumer group, acknowledging what it handled.
pub(super) async fn read_group(
    conn: &mut redis::aio::MultiplexedConnection,
    stream: &str,
    view: &mut ConsumerView,
) -> Result<(), Error> {
    loop {
        let reply: Option<Vec<(String, Vec<Entry>)>> = redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg(GROUP)
            .arg("reader-1")
            .arg("COUNT")
            .arg(100)
            .arg("STREAMS")
            .arg(stream)
            .arg(">")
            .query_async(conn)
            .await?;
        let entries: Vec<Entry> = reply.into_iter().flatten().flat_map(|(_, e)| e).collect();
        if entries.is_empty() {
            return Ok(());
        }
        for (_, fields) in &entries {
            let text = |name: &str| {
                fields
                    .get(name)
                    .map(|v| String::from_utf8_lossy(v).into_owned())
            };
            // The idempotency key is the event id (by default the message id).
            view.ingest(Delivered::new(
                text("idempotency_key").unwrap_or_default(),
                text("tenant_id"),
                text("partition_key"),
                text("event_type").unwrap_or_default(),
                fields.get("payload").map_or(&[][..], Vec::as_slice),
            ));
        }
        let ids: Vec<&str> = entries.iter().map(|(id, _)| id.as_str()).collect();
        let _: i64 = redis::cmd("XACK")
            .arg(stream)
            .arg(GROUP)
            .arg(&ids)
            .query_async(conn)
            .await?;
    }
}

/// Reads every message now in the queue, acknowledging each after handling it.
pub(super) async fn read_queue(
    channel: &amqp::Channel,
    queue: &str,
    view: &mut ConsumerView,
) -> Result<(), Error> {
    use amqp::options::{BasicAckOptions, BasicGetOptions};
    while let Some(message) = channel
        .basic_get(queue.into(), BasicGetOptions::default())
        .await?
    {
        let delivery = message.delivery;
        let received = read_delivery(&delivery)?;
        view.ingest(Delivered::new(
            received.idempotency_key,
            received.tenant_id,
            received.partition_key,
            received.event_type,
            &received.payload,
        ));
        delivery.ack(BasicAckOptions::default()).await?;
    }
    Ok(())
}

/// Reads the topic with a consumer group until it has read `expected` records (or 30 s
/// passed), committing offsets after handling each record.
pub(super) async fn read_topic(
    topic: &str,
    expected: usize,
    view: &mut ConsumerView,
) -> Result<(), Error> {
    use kafka::consumer::{CommitMode, Consumer, StreamConsumer};
    let consumer: StreamConsumer = kafka::ClientConfig::new()
        .set("bootstrap.servers", support::kafka_brokers())
        .set("group.id", "ledger")
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .create()?;
    consumer.subscribe(&[topic])?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut read = 0;
    while read < expected {
        let Ok(record) = tokio::time::timeout_at(deadline, consumer.recv()).await else {
            break;
        };
        let record = record?;
        let received = outbox::kafka::read_record(&record)?;
        view.ingest(Delivered::new(
            received.idempotency_key,
            received.tenant_id,
            received.partition_key,
            received.event_type,
            &received.payload,
        ));
        consumer.commit_message(&record, CommitMode::Sync)?;
        read += 1;
    }
    Ok(())
}

/// Receives from the SQS queue until `expected` messages arrived (or 30 s passed),
/// deleting each after handling it.
pub(super) async fn read_sqs(
    queue_url: &str,
    expected: usize,
    view: &mut ConsumerView,
) -> Result<(), Error> {
    let client = support::sqs_client();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut read = 0;
    while read < expected && tokio::time::Instant::now() < deadline {
        let answer = client
            .receive_message()
            .queue_url(queue_url)
            .max_number_of_messages(10)
            .message_attribute_names("All")
            .send()
            .await?;
        for message in answer.messages() {
            let received = outbox::sqs::read_message(message)?;
            view.ingest(Delivered::new(
                received.idempotency_key,
                received.tenant_id,
                received.partition_key,
                received.event_type,
                &received.payload,
            ));
            client
                .delete_message()
                .queue_url(queue_url)
                .set_receipt_handle(message.receipt_handle().map(str::to_owned))
                .send()
                .await?;
            read += 1;
        }
        if answer.messages().is_empty() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(())
}

/// The webhook consumer: verifies the signature, then hands the event to its view.
#[derive(Clone)]
pub(super) struct HttpConsumer {
    pub(super) receiver: WebhookReceiver,
    pub(super) view: Arc<Mutex<ConsumerView>>,
    /// Be unavailable for the first partial-payment notice (before handling it).
    pub(super) unavailable_once: Arc<AtomicBool>,
    /// Lose the answer to the first "invoice paid" (after handling it).
    pub(super) lose_ack_once: Arc<AtomicBool>,
}

pub(super) async fn receive_event(
    State(consumer): State<HttpConsumer>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> StatusCode {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let event_type = header("outbox-event-type").unwrap_or_default();
    // A deploy in progress: the relay retries this one later, and per-key ordering holds
    // the invoice's next event back until it went through.
    if event_type == "invoice.payment_received"
        && consumer
            .unavailable_once
            .swap(false, AtomicOrdering::SeqCst)
    {
        return StatusCode::SERVICE_UNAVAILABLE;
    }
    let webhook = match consumer.receiver.verify(&headers, &body) {
        Ok(webhook) => webhook,
        Err(error) => return error.status(),
    };
    let Ok(payload) = serde_json::from_slice::<serde_json::Value>(&body) else {
        return StatusCode::BAD_REQUEST;
    };
    consumer.view.lock().expect("view").ingest(Delivered {
        event_id: webhook.id,
        tenant: header("outbox-tenant-id"),
        key: header("outbox-partition-key"),
        event_type: event_type.clone(),
        version: payload["version"].as_i64().unwrap_or_default(),
    });
    if event_type == "invoice.paid" && consumer.lose_ack_once.swap(false, AtomicOrdering::SeqCst) {
        return StatusCode::BAD_GATEWAY; // handled, but the answer never arrives
    }
    StatusCode::NO_CONTENT
}
