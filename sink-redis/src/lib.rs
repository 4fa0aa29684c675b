//! Redis Streams sink for the outbox relay.
//!
//! A [`RedisSink`] appends each outbox message to a Redis stream with `XADD`, a whole
//! batch in one pipelined round trip, and answers one [`Outcome`](outbox_engine::Outcome)
//! per message from that message's own reply. The stream entry id is the receipt.
//!
//! ```no_run
//! use std::time::Duration;
//! use outbox_engine::{MemoryStore, NewMessage, Relay};
//! use outbox_sink_redis::{RedisSink, RedisSinkConfig};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let sink = RedisSink::connect(
//!     RedisSinkConfig::from_url("redis://127.0.0.1:6379/?stream=shop.{event_type}&maxlen=100000")?
//!         .dedupe_window(Some(Duration::from_secs(600))),
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
//! relay.drain().await?; // one entry in the stream `shop.order.paid`
//! # Ok(())
//! # }
//! ```
//!
//! # What it guarantees
//!
//! | capability | |
//! |---|---|
//! | one outcome per message, from that message's reply | ✅ |
//! | published only after Redis replied with an entry id (and the durability wait was met) | ✅ |
//! | one round trip per batch (pipelined) | ✅ |
//! | id and idempotency key in every entry, unchanged across attempts | ✅ |
//! | binary payloads byte for byte | ✅ |
//! | a re-sent message is not appended twice within the dedupe window | ✅ (default 5 min) |
//! | `MAXLEN ~` trimming | ✅ (optional) |
//! | `WAIT` / `WAITAOF` durability; refuses to start when the server cannot honour it | ✅ (optional) |
//! | reconnects after a server restart or a dropped connection, and replaces a connection after an unanswered round trip (one that fell silent) | ✅ |
//! | errors classified retryable / permanent ([`error`] has the table) | ✅ |
//! | `rediss://` (TLS, a private CA, client certificates) and ACL users / passwords | ✅ (TLS behind a feature) |
//! | Redis Cluster | ❌ (one server or a primary behind a proxy) |
//! | Sentinel discovery | ❌ |
//! | per-key ordering across batches | relay's concern; one batch keeps its order in the stream |
//!
//! # Entry layout
//!
//! Fields, in order (names configurable, see [`FieldLayout`]): `id`, `idempotency_key`,
//! `event_type`, `content_type`; then `partition_key`, `tenant_id`, `aggregate_type`,
//! `aggregate_id` when the message has them; then one `h:<name>` field per header (or one
//! JSON `headers` field, see [`HeaderLayout`]); and last `payload`, the raw payload bytes.
//! Consumers read an entry back as an [`outbox_engine::Received`], for deduplication in
//! an inbox, with [`read_stream_entry`] (the `redis` client's [`StreamId`](client::streams::StreamId))
//! or [`FieldLayout::read_entry`] (any `(field, value)` pairs).
//!
//! ```text
//! XADD shop.order.paid * id 0190f2c4-… idempotency_key 0190f2c4-… event_type order.paid
//!      content_type application/json h:traceparent 00-4bf9…-01 payload {"order":1042}
//! ```
//!
//! # Deduplication window
//!
//! With the window on (the default), each message goes through a small Lua script that
//! checks a dedupe key for (stream, idempotency key): if the key exists, the message was
//! appended within the window and the script returns that first entry id without
//! appending; otherwise it appends and sets the key with the window as its TTL, atomically.
//! So a relay that crashed after the append but before marking the row published, or a
//! publish whose reply was lost to a timeout, does not produce a second entry when the
//! message is re-sent within the window. After the window a re-send appends again:
//! consumers still deduplicate on `idempotency_key` (delivery is at-least-once). Choose a
//! window longer than the relay's lease plus its retry delays; each key costs about
//! 100 bytes of Redis memory for the window's length. `dedupe_window: None` sends plain
//! `XADD`s instead.
//!
//! # Durability
//!
//! By default the `XADD` reply is the acknowledgement: the entry is in Redis's memory and
//! is as durable as the server's persistence settings make it. [`Durability::Wait`] adds
//! `WAIT` (replicas received it) and [`Durability::WaitAof`] adds `WAITAOF` (fsynced to the
//! append-only file, Redis 7.2+) to the batch's pipeline. A route whose server cannot
//! honour the setting fails in [`RedisSink::connect`]; it never falls back to a weaker
//! acknowledgement.
//!
//! # Features
//!
//! - `tls-rustls`: `rediss://` through rustls (install a rustls `CryptoProvider` in the
//!   application).
//! - `tls-native-tls`: `rediss://` through the platform TLS library.
//!
//! Without either, a `rediss://` URL fails with [`RedisSinkError::TlsNotEnabled`]. The
//! server is verified against the system roots, or against
//! [`tls_ca_file`](RedisSinkConfig::tls_ca_file); a client certificate for servers with
//! `tls-auth-clients yes` is set with [`tls_client_cert`](RedisSinkConfig::tls_client_cert).

#![cfg_attr(docsrs, feature(doc_cfg))]

mod config;
pub mod error;
mod receive;
mod sink;

pub use config::{
    Durability, FieldLayout, HeaderLayout, MAX_STREAM_KEY_BYTES, METADATA_FIELDS, RedisSinkConfig,
    StreamTemplate,
};
pub use error::{RedisSinkError, classify, classify_reply};
pub use receive::read_stream_entry;
pub use sink::RedisSink;

outbox_engine::route_sink!(
    RedisSink,
    ["redis", "rediss"],
    RedisSinkConfig,
    RedisSinkError,
    url_options
);

/// The `redis` client crate this sink is built on (with its `streams` commands and
/// reply types, and the Tokio connections), for consumers at the version the sink is
/// tested with.
pub use redis as client;
