//! NATS JetStream sink for the outbox relay.
//!
//! A [`NatsSink`] publishes each outbox message to a JetStream subject, a whole batch
//! pipelined on one connection, and answers one [`Outcome`](outbox_engine::Outcome) per
//! message from that message's own `PubAck`.
//!
//! ```no_run
//! use outbox_engine::{MemoryStore, NewMessage, Relay};
//! use outbox_sink_nats::NatsSink;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! // A stream must bind the subjects, e.g. `nats stream add SHOP --subjects 'shop.>'`.
//! let sink = NatsSink::from_url("nats://127.0.0.1:4222?subject=shop.{event_type}").await?;
//!
//! let store = MemoryStore::new();
//! store.enqueue(
//!     NewMessage::builder("orders", "order.paid")
//!         .json(&serde_json::json!({ "order": 1042 }))
//!         .build()?,
//! )?;
//! let relay = Relay::builder(store).route("orders", sink).build()?;
//! relay.drain().await?; // stored by the stream on subject `shop.order.paid`
//! # Ok(())
//! # }
//! ```
//!
//! # What it guarantees
//!
//! | capability | |
//! |---|---|
//! | one outcome per message, from its own `PubAck` | ✅ |
//! | published only after JetStream stored the message (its `PubAck`) | ✅ |
//! | re-sends within the stream's duplicate window stored once (`Nats-Msg-Id` = idempotency key), counted as duplicates | ✅ |
//! | a batch sent in order on one connection, so a stream keeps a key's order | ✅ |
//! | id, event type, content type, keys, tenant and `traceparent` as headers, unchanged across attempts | ✅ |
//! | binary payloads byte for byte | ✅ |
//! | reconnects after the server restarts or the connection drops; nothing sent while down | ✅ |
//! | no stream for a subject, an oversize message, a denied subject: that message dead-lettered ([`error`] has the table) | ✅ |
//! | `nats+tls://`, credentials files, NKeys, user and password, tokens; none printed | ✅ |
//! | streams created by the sink | ❌ (the streams are yours; a fixed subject's stream is checked at start-up) |
//! | per-key ordering across batches | relay's concern |
//!
//! # Message layout
//!
//! | NATS | from the message |
//! |---|---|
//! | subject | the route's template (`{destination}`, `{event_type}`, `{partition_key}`, `{tenant_id}`, `{aggregate_type}`) |
//! | header `Nats-Msg-Id` | idempotency key |
//! | headers `outbox-id`, `outbox-idempotency-key`, `outbox-event-type`, `outbox-content-type` | id, idempotency key, event type, content type |
//! | headers `outbox-partition-key`, `outbox-tenant-id`, `outbox-aggregate-type`, `outbox-aggregate-id` | when the message has them |
//! | other headers | the message's headers as they are (e.g. `traceparent`) |
//! | payload | payload bytes |
//!
//! Consumers read these back with [`read_message`] as an [`outbox_engine::Received`],
//! for deduplication in an inbox.
//!
//! # Streams and order
//!
//! A stream stores messages in the order they arrive, across all its subjects. A consumer
//! that reads the whole stream (or a subject filter that keeps a key's messages
//! together, such as `{partition_key}` in the subject) sees each key's messages in
//! commit order when the relay runs with per-key ordering. Give the stream a duplicate
//! window (`duplicate_window`, two minutes by default) longer than the relay's lease, so
//! that a re-send after a crash is recognised.

#![cfg_attr(docsrs, feature(doc_cfg))]

mod config;
pub mod error;
mod receive;
mod sink;

pub use config::{MAX_SUBJECT_BYTES, NatsSinkConfig};
pub use error::{NatsSinkError, classify};
pub use receive::{read_message, read_parts};
pub use sink::NatsSink;

outbox_engine::route_sink!(
    NatsSink,
    ["nats", "nats+tls"],
    NatsSinkConfig,
    NatsSinkError,
    url_options
);

/// The `async-nats` client crate this sink is built on, for matching versions.
pub use async_nats as client;
