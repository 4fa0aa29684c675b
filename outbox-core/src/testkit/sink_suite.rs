//! The sink conformance suite: every [`Sink`] must pass every check here against a real
//! receiver (an HTTP server on loopback, a broker), read back through a [`SinkHarness`].
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! use outbox_engine::testkit::{RecordingSink, sink_suite};
//!
//! sink_suite::run_all(|| async { RecordingSink::new() }).await;
//! # });
//! ```

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use chrono::Utc;

use crate::message::{Headers, Message, NewMessage};
use crate::sink::{FailureClass, Outcome, PublishContext, Sink};
use crate::testkit::RecordingSink;

/// A message as the receiving side saw it, in the sink's own wire format translated back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivered {
    /// The message id as received.
    pub id: String,
    /// The idempotency key as received.
    pub idempotency_key: String,
    /// The event type as received.
    pub event_type: String,
    /// The payload bytes as received.
    pub payload: Vec<u8>,
    /// The message's own headers as received (transport headers left out).
    pub headers: Headers,
}

impl From<crate::receive::Received> for Delivered {
    /// What a consumer read back with the sink crate's reader (`read_delivery`, say).
    fn from(received: crate::receive::Received) -> Self {
        Self {
            id: received.id.to_string(),
            idempotency_key: received.idempotency_key,
            event_type: received.event_type,
            payload: received.payload,
            headers: received.headers,
        }
    }
}

impl Delivered {
    /// What a perfect receiver would see for `message`.
    pub fn expected(message: &Message) -> Self {
        Self {
            id: message.id.to_string(),
            idempotency_key: message.idempotency_key.clone(),
            event_type: message.event_type.clone(),
            payload: message.payload.clone(),
            headers: message.headers.clone(),
        }
    }
}

/// What a sink does with a payload that is not text (see
/// [`binary_payload_is_exact_or_refused`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinaryPayloads {
    /// It arrives byte for byte.
    Exact,
    /// It is refused permanently, before sending (the transport carries text only and the
    /// sink was not told how to encode bytes).
    Refused,
}

/// A sink plus a way to read what its receiver got.
pub trait SinkHarness: Send + Sync {
    /// The sink under test.
    type Sink: Sink;

    /// The sink under test.
    fn sink(&self) -> &Self::Sink;

    /// The destination (route name) to put on test messages.
    fn destination(&self) -> &str {
        "suite"
    }

    /// Everything the receiver got since the harness was made, in arrival order.
    fn received(&self) -> impl Future<Output = Vec<Delivered>> + Send;

    /// What the sink, as configured here, does with binary payloads (default: delivers
    /// them exactly). The suite holds it to what it declares.
    fn binary_payloads(&self) -> BinaryPayloads {
        BinaryPayloads::Exact
    }
}

impl SinkHarness for RecordingSink {
    type Sink = Self;

    fn sink(&self) -> &Self {
        self
    }

    async fn received(&self) -> Vec<Delivered> {
        self.messages().iter().map(Delivered::expected).collect()
    }
}

/// Runs every check, each on a fresh harness from `factory`, printing each name.
pub async fn run_all<H: SinkHarness>(factory: impl AsyncFn() -> H) {
    run_checks!(factory, |_: &H, name| eprintln!("sink conformance: {name}");
        empty_batch_publishes_nothing,
        one_outcome_per_message,
        delivers_identity_payload_and_headers,
        binary_payload_is_exact_or_refused,
        redelivery_keeps_identity,
        natural_keys_arrive_unchanged,
    );
}

/// A claimed message to `billing` with every field set, for a sink's own tests of what a
/// consumer reads: a payload of all 256 byte values (or, for a text-only transport, JSON
/// with non-ASCII text, quotes and a newline), an ordering key, tenant, aggregate,
/// idempotency key `invoice-7:paid`, a `traceparent` and a mixed-case non-ASCII header.
pub fn full_message(payload: BinaryPayloads) -> Message {
    let builder = NewMessage::builder("billing", "invoice.paid");
    let builder = match payload {
        BinaryPayloads::Exact => {
            builder.bytes((0..=255u8).collect::<Vec<u8>>(), "application/octet-stream")
        }
        BinaryPayloads::Refused => {
            builder.json(&serde_json::json!({ "invoice": 7, "text": "ünïcødé \"quoted\"\n" }))
        }
    };
    builder
        .partition_key("invoice-7")
        .tenant_id("acme")
        .aggregate("invoice", "7")
        .idempotency_key("invoice-7:paid")
        .header(
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        )
        .header("x-Mixed-Case", "ünïcødé")
        .build()
        .expect("valid message")
        .into_message(Utc::now())
}

/// A claimed message to `billing` with only what a message must have (a JSON payload),
/// next to [`full_message`].
pub fn bare_message() -> Message {
    NewMessage::builder("billing", "tenant.created")
        .json(&serde_json::json!({ "tenant": "acme" }))
        .build()
        .expect("valid message")
        .into_message(Utc::now())
}

/// Claimed-form test messages for `destination`.
pub fn messages(destination: &str, n: usize) -> Vec<Message> {
    (0..n)
        .map(|i| {
            NewMessage::builder(destination, "suite.event")
                .json(&serde_json::json!({ "n": i, "text": "héllo \"world\" \n" }))
                .partition_key(format!("key-{}", i % 3))
                .header("x-suite-index", i.to_string())
                .header(
                    "traceparent",
                    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                )
                .build()
                .expect("valid message")
                .into_message(Utc::now())
        })
        .collect()
}

async fn received_within<H: SinkHarness>(h: &H, at_least: usize) -> Vec<Delivered> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let got = h.received().await;
        if got.len() >= at_least || tokio::time::Instant::now() >= deadline {
            return got;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Publishes `batch`, which must all be published, and waits for the receiver to have it.
async fn publish_and_receive<H: SinkHarness>(h: &H, batch: &[Message]) -> Vec<Delivered> {
    let outcomes = h
        .sink()
        .publish(batch, &PublishContext::default())
        .await
        .expect("publish");
    assert!(outcomes.iter().all(Outcome::is_published), "{outcomes:?}");
    received_within(h, batch.len()).await
}

/// An empty batch returns no outcomes and sends nothing.
pub async fn empty_batch_publishes_nothing<H: SinkHarness>(h: &H) {
    let outcomes = h
        .sink()
        .publish(&[], &PublishContext::default())
        .await
        .expect("empty publish");
    assert!(outcomes.is_empty());
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        h.received().await.is_empty(),
        "an empty batch must send nothing"
    );
}

/// One outcome per message, all published for well-formed messages.
pub async fn one_outcome_per_message<H: SinkHarness>(h: &H) {
    let batch = messages(h.destination(), 25);
    let outcomes = h
        .sink()
        .publish(&batch, &PublishContext::default())
        .await
        .expect("publish");
    assert_eq!(outcomes.len(), batch.len(), "one outcome per message");
    for (m, o) in batch.iter().zip(&outcomes) {
        assert!(o.is_published(), "message {} not published: {o:?}", m.id);
    }
    assert_eq!(
        received_within(h, 25).await.len(),
        25,
        "every acknowledged message arrived"
    );
}

/// The receiver sees each message's id, idempotency key, event type, payload and headers.
pub async fn delivers_identity_payload_and_headers<H: SinkHarness>(h: &H) {
    let batch = messages(h.destination(), 5);
    let got = publish_and_receive(h, &batch).await;
    let by_id: BTreeMap<_, _> = got.iter().map(|d| (d.id.clone(), d)).collect();
    for m in &batch {
        let delivered = by_id
            .get(&m.id.to_string())
            .unwrap_or_else(|| panic!("message {} not received", m.id));
        let want = Delivered::expected(m);
        assert_eq!(
            delivered.idempotency_key, want.idempotency_key,
            "idempotency key"
        );
        assert_eq!(delivered.event_type, want.event_type, "event type");
        assert_eq!(delivered.payload, want.payload, "payload bytes");
        for (name, value) in &want.headers {
            assert_eq!(delivered.headers.get(name), Some(value), "header {name}");
        }
    }
}

/// Idempotency keys as applications write them, with dots, slashes, colons and percent
/// signs (`order-42.paid`), reach the receiver unchanged, whatever the sink has to do to
/// carry them (a Standard Webhooks `webhook-id` cannot hold a `.` as it is).
pub async fn natural_keys_arrive_unchanged<H: SinkHarness>(h: &H) {
    let keys = [
        "order-42.paid",
        "tenant.acme/invoice:7.v2",
        "coupon%2E50.applied",
    ];
    let batch: Vec<Message> = keys
        .iter()
        .map(|key| {
            NewMessage::builder(h.destination(), "suite.event")
                .json(&serde_json::json!({ "key": key }))
                .idempotency_key(*key)
                .build()
                .expect("valid message")
                .into_message(Utc::now())
        })
        .collect();
    let got = publish_and_receive(h, &batch).await;
    for m in &batch {
        let delivered = got
            .iter()
            .find(|d| d.id == m.id.to_string())
            .unwrap_or_else(|| panic!("message {} not received", m.id));
        assert_eq!(
            delivered.idempotency_key, m.idempotency_key,
            "idempotency key"
        );
    }
}

/// A non-UTF-8 payload arrives byte for byte, or is refused permanently as unencodable,
/// as the harness declares in [`SinkHarness::binary_payloads`].
pub async fn binary_payload_is_exact_or_refused<H: SinkHarness>(h: &H) {
    let message = NewMessage::builder(h.destination(), "suite.binary")
        .bytes(
            vec![0u8, 1, 2, 0xfe, 0xff, 0x80, b'\n'],
            "application/octet-stream",
        )
        .build()
        .expect("valid")
        .into_message(Utc::now());
    let outcomes = h
        .sink()
        .publish(std::slice::from_ref(&message), &PublishContext::default())
        .await
        .expect("publish");
    match (&outcomes[..], h.binary_payloads()) {
        ([Outcome::Published { .. }], BinaryPayloads::Exact) => {
            let got = received_within(h, 1).await;
            assert_eq!(got.len(), 1);
            assert_eq!(
                got[0].payload, message.payload,
                "binary payload must be exact"
            );
        }
        ([Outcome::Failed(f)], BinaryPayloads::Refused) => {
            assert!(
                !f.retryable,
                "an unencodable payload is a permanent failure: {f}"
            );
            assert!(
                matches!(
                    f.class,
                    FailureClass::Serialization | FailureClass::Rejected
                ),
                "{f}"
            );
        }
        (outcomes, declared) => {
            panic!("binary payloads declared {declared:?}, got the outcomes {outcomes:?}")
        }
    }
}

/// Publishing the same message again (a relay retry) carries the same id and key.
pub async fn redelivery_keeps_identity<H: SinkHarness>(h: &H) {
    let batch = messages(h.destination(), 1);
    for _ in 0..2 {
        let outcomes = h
            .sink()
            .publish(&batch, &PublishContext::default())
            .await
            .expect("publish");
        assert!(outcomes[0].is_published(), "{outcomes:?}");
    }
    let got = received_within(h, 1).await;
    assert!(!got.is_empty());
    assert!(
        got.iter()
            .all(|d| d.id == batch[0].id.to_string()
                && d.idempotency_key == batch[0].idempotency_key),
        "every copy carries the same id and key: {got:?}"
    );
}
