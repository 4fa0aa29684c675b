//! A transactional outbox for Rust: write the message in the same database transaction as
//! your business change, and let a relay publish it after commit — to a webhook, Kafka,
//! SQS, RabbitMQ or Redis — marking it published only after the receiver acknowledged.
//!
//! This crate gathers the pieces behind Cargo features (none on by default):
//!
//! | feature | gives |
//! |---|---|
//! | `postgres`, `sqlite`, `mysql` | [`sqlx`](outbox_sqlx) stores: enqueue in your transaction, relay store, inbox |
//! | `diesel-postgres`, `diesel-sqlite`, `diesel-mysql`, `diesel-async` | [`diesel`]: enqueue in your diesel transaction (sync or diesel-async) and the inbox on your connection; the relay store of the same database |
//! | `http` | the HTTP / webhook sink |
//! | `receiver`, `receiver-axum` | the webhook receiver: verify, dedupe with any [`Inbox`]; an axum extractor. No HTTP client |
//! | `redis` | the Redis Streams sink |
//! | `amqp` | the RabbitMQ (AMQP 0-9-1) sink |
//! | `kafka` | the Kafka sink (librdkafka is built from source: a C compiler and `make`) |
//! | `sqs` | the Amazon SQS sink |
//! | `nats` | the NATS JetStream sink |
//! | `mqtt` | the MQTT sink |
//! | `tls` | `amqps://` and `rediss://` for the broker sinks that are on (rustls; install a `CryptoProvider` first) |
//! | `dashboard` | the web dashboard: backlog and lag per destination, dead letters to filter, replay or discard, lookup |
//! | `opentelemetry` | W3C trace context on messages: recorded at [`NewMessageBuilder::build`] from the current span, carried by every sink, linked from the relay's publish span; see `trace` |
//! | `full` | all of the above |
//! | `testkit` | in-memory store, recording and flaky sinks, conformance suites |
//!
//! and builds stores and sinks from URLs or a TOML file ([`Config`]), so switching a route
//! from HTTP to Redis is a configuration change, not a code change. A URL whose feature is
//! off fails with an error that names the feature.
//!
//! The core API ([`NewMessage`], [`Relay`], [`Store`], [`Sink`], [`Inbox`], [`Received`],
//! …) is re-exported at the crate root. Consumers of every sink deduplicate the same way:
//! read the message's [`Received`] identity (each broker sink's crate reads it from its
//! client's message type) and record its idempotency key in an [`Inbox`] inside their
//! own transaction.

#![cfg_attr(docsrs, feature(doc_cfg))]

pub use outbox_engine::*;

/// The README's examples, compiled (and the self-contained one run) as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;

pub mod config;
#[cfg(feature = "endpoints")]
pub mod endpoints;
mod error;
mod outbox;
pub mod registry;

pub use config::Config;
pub use error::Error;
pub use outbox::{Outbox, OutboxBuilder};
pub use registry::Registry;

/// The web dashboard (feature `dashboard`).
#[cfg(feature = "dashboard")]
pub use outbox_dashboard as dashboard;
/// Enqueue and the inbox on diesel connections (feature `diesel`).
#[cfg(feature = "diesel")]
pub use outbox_diesel as diesel;
/// The RabbitMQ (AMQP 0-9-1) sink (feature `amqp`).
#[cfg(feature = "amqp")]
pub use outbox_sink_amqp as amqp;
/// The HTTP / webhook sink (feature `http`).
#[cfg(feature = "http")]
pub use outbox_sink_http as http;
/// The Kafka sink (feature `kafka`).
#[cfg(feature = "kafka")]
pub use outbox_sink_kafka as kafka;
/// The MQTT sink (feature `mqtt`).
#[cfg(feature = "mqtt")]
pub use outbox_sink_mqtt as mqtt;
/// The NATS JetStream sink (feature `nats`).
#[cfg(feature = "nats")]
pub use outbox_sink_nats as nats;
/// The Amazon SQS sink (feature `sqs`).
#[cfg(feature = "sqs")]
pub use outbox_sink_sqs as sqs;

/// The receiving side of webhooks (feature `receiver`; `receiver-axum` adds the
/// extractor).
#[cfg(feature = "receiver")]
pub use outbox_receiver as receiver;
/// The Redis Streams sink (feature `redis`).
#[cfg(feature = "redis")]
pub use outbox_sink_redis as redis;
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
pub use outbox_sqlx::TableNames;
/// The MySQL / MariaDB store (feature `mysql`).
#[cfg(feature = "mysql")]
pub use outbox_sqlx::mysql;
/// The PostgreSQL store (feature `postgres`).
#[cfg(feature = "postgres")]
pub use outbox_sqlx::postgres;
/// The SQLite store (feature `sqlite`).
#[cfg(feature = "sqlite")]
pub use outbox_sqlx::sqlite;
/// The `sqlx` the stores are built on, for your pool and transactions (features
/// `postgres`, `sqlite`, `mysql`): `outbox::sqlx::PgPool`, `outbox::sqlx::query`.
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
pub use outbox_sqlx::sqlx;
