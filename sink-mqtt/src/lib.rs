//! MQTT sink for the outbox relay.
//!
//! An [`MqttSink`] publishes each outbox message with QoS 1 to a topic rendered from the
//! message, and answers one [`Outcome`](outbox_engine::Outcome) per message from that
//! message's own `PUBACK`.
//!
//! ```no_run
//! use outbox_engine::{MemoryStore, NewMessage, Relay};
//! use outbox_sink_mqtt::MqttSink;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let sink = MqttSink::from_url("mqtt://127.0.0.1:1883?topic=shop/{event_type}").await?;
//!
//! let store = MemoryStore::new();
//! store.enqueue(
//!     NewMessage::builder("orders", "order.paid")
//!         .json(&serde_json::json!({ "order": 1042 }))
//!         .build()?,
//! )?;
//! let relay = Relay::builder(store).route("orders", sink).build()?;
//! relay.drain().await?; // published on `shop/order.paid`
//! # Ok(())
//! # }
//! ```
//!
//! # What it guarantees
//!
//! | capability | |
//! |---|---|
//! | one outcome per message, from its own `PUBACK` | ✅ |
//! | QoS 1, published only after the broker's `PUBACK` (MQTT 5: with a success reason code) | ✅ |
//! | retained messages off | ✅ |
//! | a batch handed over in order on one connection | ✅ |
//! | id, idempotency key, event type, keys, tenant and `traceparent` carried, unchanged across attempts | ✅ (MQTT 5: user properties; 3.1.1: a JSON envelope) |
//! | binary payloads byte for byte | ✅ |
//! | reconnects after the broker restarts or the connection drops; nothing re-sent behind the relay's back | ✅ |
//! | a message the broker refuses (MQTT 5 reason codes), too large, or for a topic it cannot name fails alone ([`error`] has the table) | ✅ |
//! | `mqtts://` (a private CA, client certificates; rustls with ring, built in) | ✅ |
//! | per-key ordering across batches | relay's concern |
//!
//! # Message layout
//!
//! | MQTT 5 | from the message |
//! |---|---|
//! | topic | the route's template (`{destination}`, `{event_type}`, `{partition_key}`, `{tenant_id}`, `{aggregate_type}`) |
//! | user properties `outbox-id`, `outbox-idempotency-key`, `outbox-event-type`, `outbox-content-type` | id, idempotency key, event type, content type |
//! | user properties `outbox-partition-key`, `outbox-tenant-id`, `outbox-aggregate-type`, `outbox-aggregate-id` | when the message has them |
//! | other user properties | the message's headers as they are (e.g. `traceparent`) |
//! | content type property | content type |
//! | payload | payload bytes |
//!
//! MQTT 3.1.1 has no properties. With `protocol = "3.1.1"` the payload is a JSON envelope,
//! `{"fields": {…the user properties above…}, "payload": "<base64 of the payload>"}`, and
//! consumers read it with [`read_envelope`]; MQTT 5 consumers use [`read_publish`]. Both
//! give an [`outbox_engine::Received`] for deduplication in an inbox.
//!
//! # Order
//!
//! A broker forwards one client's QoS 1 messages on a topic in the order it received
//! them. With per-key ordering in the relay and `{partition_key}` in the topic (or a
//! fixed topic), a subscriber sees each key's messages in commit order, apart from
//! redeliveries after a reconnect.
//!
//! # After the `PUBACK`
//!
//! The outbox's guarantee ends where the broker takes the message over. What a broker does
//! next is its configuration: mosquitto, by default, keeps at most 1,000 QoS 1 messages
//! queued for each subscriber and drops the rest when a subscriber falls behind
//! (`max_queued_messages`), and loses what it has not yet written to disk when it is killed
//! (`persistence`, `autosave_interval`). Size those for the slowest subscriber, or use a
//! broker that stores before it acknowledges (JetStream, with `sink-nats`).

#![cfg_attr(docsrs, feature(doc_cfg))]

mod config;
pub mod error;
mod receive;
mod sink;

pub use config::{MAX_TOPIC_BYTES, MqttSinkConfig, Protocol};
pub use error::MqttSinkError;
pub use receive::{read_envelope, read_properties, read_publish};
pub use sink::MqttSink;

outbox_engine::route_sink!(
    MqttSink,
    ["mqtt", "mqtts"],
    MqttSinkConfig,
    MqttSinkError,
    url_options
);

/// The `rumqttc` client crate this sink is built on, for matching versions.
pub use rumqttc as client;
