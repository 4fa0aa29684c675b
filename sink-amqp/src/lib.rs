//! RabbitMQ (AMQP 0-9-1) sink for the outbox relay.
//!
//! An [`AmqpSink`] publishes each outbox message to an exchange with publisher confirms
//! and the `mandatory` flag, a whole batch pipelined on one channel, and answers one
//! [`Outcome`](outbox_engine::Outcome) per message from that message's own confirm.
//!
//! ```no_run
//! use outbox_engine::{MemoryStore, NewMessage, Relay};
//! use outbox_sink_amqp::AmqpSink;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let sink = AmqpSink::from_url(
//!     "amqp://guest:guest@127.0.0.1:5672/%2f?exchange=shop&routing_key={event_type}",
//! )
//! .await?;
//!
//! let store = MemoryStore::new();
//! store.enqueue(
//!     NewMessage::builder("orders", "order.paid")
//!         .json(&serde_json::json!({ "order": 1042 }))
//!         .build()?,
//! )?;
//! let relay = Relay::builder(store).route("orders", sink).build()?;
//! relay.drain().await?; // routed by exchange `shop` with routing key `order.paid`
//! # Ok(())
//! # }
//! ```
//!
//! # What it guarantees
//!
//! | capability | |
//! |---|---|
//! | one outcome per message, from its publisher confirm and any `basic.return` carrying its id | ✅ |
//! | published only after `basic.ack` **and** no `basic.return` (`mandatory` is always set) | ✅ |
//! | a message no queue receives is dead-lettered as unroutable, not marked published | ✅ |
//! | persistent delivery mode by default | ✅ |
//! | one channel per concurrent publish, the batch pipelined on it | ✅ |
//! | id (`message_id`) and idempotency key (header) on every delivery, unchanged across attempts | ✅ |
//! | binary payloads byte for byte | ✅ |
//! | reconnects after the broker restarts or closes the connection | ✅ |
//! | a blocked connection (memory or disk alarm) never holds a publish past its deadline | ✅ |
//! | one bad message on a batch's channel fails alone ([`error`] has the table) | ✅ |
//! | `amqps://` (a private CA, client certificates) | ✅ (behind a feature) |
//! | exchanges, queues and bindings declared by the sink | ❌ (the broker's topology is yours; a fixed exchange is checked at start-up) |
//! | per-key ordering across batches | relay's concern; one channel keeps a batch's order |
//!
//! # Message layout
//!
//! | AMQP | from the message |
//! |---|---|
//! | exchange, routing key | the route's templates (`{destination}`, `{event_type}`, `{partition_key}`, `{tenant_id}`, `{aggregate_type}`) |
//! | `message_id` property | id (UUIDv7) |
//! | `type` property | event type |
//! | `content_type` property | content type |
//! | `timestamp` property | created at (unix seconds) |
//! | `delivery_mode` | 2 (persistent) unless `persistent = false` |
//! | header `outbox-idempotency-key` | idempotency key |
//! | headers `outbox-partition-key`, `outbox-tenant-id`, `outbox-aggregate-type`, `outbox-aggregate-id` | when the message has them |
//! | other headers | the message's headers as they are (e.g. `traceparent`) |
//! | body | payload bytes |
//!
//! Consumers read these back with [`read_delivery`] as an [`outbox_engine::Received`],
//! for deduplication in an inbox.
//!
//! # Features
//!
//! - `tls-rustls`: `amqps://` through rustls (ring), verifying the broker against the
//!   system roots or [`tls_ca_file`](AmqpSinkConfig::tls_ca_file).
//! - `tls-native-tls`: `amqps://` through the platform TLS library.
//!
//! Without either, an `amqps://` URL fails with [`AmqpSinkError::TlsNotEnabled`].

#![cfg_attr(docsrs, feature(doc_cfg))]

mod config;
pub mod error;
mod receive;
mod sink;

pub use config::{AmqpSinkConfig, MAX_NAME_BYTES};
pub use error::{AmqpSinkError, classify};
pub use receive::{read_delivery, read_parts};
pub use sink::AmqpSink;

outbox_engine::route_sink!(
    AmqpSink,
    ["amqp", "amqps"],
    AmqpSinkConfig,
    AmqpSinkError,
    url_options
);

/// The `lapin` client crate this sink is built on, for matching versions.
pub use lapin as client;
