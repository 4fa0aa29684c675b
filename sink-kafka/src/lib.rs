//! Kafka sink for the outbox relay.
//!
//! A [`KafkaSink`] publishes each outbox message as one Kafka record through librdkafka's
//! idempotent producer (`acks=all`), the batch handed over in order, and answers one
//! [`Outcome`](outbox_engine::Outcome) per message from that message's own delivery
//! report.
//!
//! ```no_run
//! use outbox_engine::{MemoryStore, NewMessage, Relay};
//! use outbox_sink_kafka::KafkaSink;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let sink = KafkaSink::from_url("kafka://127.0.0.1:9092/billing.{event_type}").await?;
//!
//! let store = MemoryStore::new();
//! store.enqueue(
//!     NewMessage::builder("invoices", "invoice.paid")
//!         .partition_key("tenant-7")
//!         .json(&serde_json::json!({ "invoice": 1042 }))
//!         .build()?,
//! )?;
//! let relay = Relay::builder(store).route("invoices", sink).build()?;
//! relay.drain().await?; // topic `billing.invoice.paid`, key `tenant-7`
//! # Ok(())
//! # }
//! ```
//!
//! # What it guarantees
//!
//! | capability | |
//! |---|---|
//! | one outcome per message, from its own delivery report (never from a flush of the batch) | ✅ |
//! | published only once every in-sync replica has it (`acks=all`; weaker settings are refused) | ✅ |
//! | idempotent producer: a retry inside librdkafka writes no duplicate and keeps partition order | ✅ |
//! | receipt `topic/partition@offset` | ✅ |
//! | key = partition key, so one key's messages share a partition, in commit order under per-key ordering | ✅ |
//! | same partition for a key as Java clients (`murmur2_random`) | ✅ (default) |
//! | id and idempotency key (headers) on every record, unchanged across attempts | ✅ |
//! | binary payloads byte for byte | ✅ |
//! | a missing topic fails its messages alone (checked once per topic) | ✅ |
//! | a new producer after a fatal idempotence error | ✅ |
//! | any librdkafka producer property (compression, SASL, TLS, …) from configuration, secrets hidden | ✅ (TLS needs the `ssl` feature) |
//! | topics created by the sink | ❌ (the cluster's topics are yours; a fixed topic is checked at start-up) |
//! | transactional producer | ❌ (decision 0022: the store's commit cannot join a Kafka transaction) |
//!
//! # Record layout
//!
//! | Kafka | from the message |
//! |---|---|
//! | topic | the route's template (`{destination}`, `{event_type}`, `{partition_key}`, `{tenant_id}`, `{aggregate_type}`) |
//! | key | partition key; without one, no key or the id ([`Unkeyed`]) |
//! | header `outbox-id` | id (UUIDv7) |
//! | header `outbox-idempotency-key` | idempotency key |
//! | headers `outbox-event-type`, `outbox-content-type` | event type, content type |
//! | headers `outbox-partition-key`, `outbox-tenant-id`, `outbox-aggregate-type`, `outbox-aggregate-id` | when the message has them |
//! | other headers | the message's headers as they are (e.g. `traceparent`) |
//! | value | payload bytes |
//! | timestamp | the producer's (time of sending) |
//!
//! Consumers read these back with [`read_record`] as an [`outbox_engine::Received`], for
//! deduplication in an inbox.
//!
//! # Features
//!
//! - `ssl`: `security.protocol=ssl` and `sasl_ssl` through the system's OpenSSL.
//!
//! librdkafka is built from source (bundled with `rdkafka-sys`; a C compiler and `make`
//! are needed, no system Kafka library).

#![cfg_attr(docsrs, feature(doc_cfg))]

mod config;
pub mod error;
mod receive;
mod sink;

pub use config::{KafkaSinkConfig, MAX_TOPIC_BYTES, Unkeyed};
pub use error::{KafkaSinkError, classify};
pub use receive::{read_parts, read_record};
pub use sink::KafkaSink;

outbox_engine::route_sink!(KafkaSink, ["kafka"], KafkaSinkConfig, KafkaSinkError);

/// The `rdkafka` client crate this sink is built on, for matching versions.
pub use rdkafka as client;
