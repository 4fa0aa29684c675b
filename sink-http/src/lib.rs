//! The HTTP sink of the outbox relay, for webhooks and HTTP APIs, plus a toolkit for
//! the receiving side.
//!
//! [`HttpSink`] sends each outbox message as one HTTP request to the endpoint of its
//! route and marks it published only on a 2xx answer. It serves two kinds of receivers:
//!
//! - **webhook endpoints** of your customers: requests signed with
//!   [Standard Webhooks](https://www.standardwebhooks.com/) (several secrets at once
//!   during a rotation), an SSRF guard on every connection, a circuit breaker per
//!   endpoint, and [`fan_out`] to write one row per subscribed endpoint;
//! - **third-party APIs** (a messaging API allowing 80–500 requests/s that answers 4xx
//!   for a bad recipient): a token-bucket rate limit and a concurrency limit per
//!   endpoint, `Idempotency-Key` on every request, `Retry-After` honoured, and permanent
//!   4xx answers dead-lettered at once with the response body as the reason.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use outbox_core::{MemoryStore, NewMessage, Relay};
//! use outbox_sink_http::{EndpointConfig, HttpSinkConfig, RateLimit};
//!
//! let sink = HttpSinkConfig::new()
//!     .route(
//!         "customer-webhooks/acme",
//!         EndpointConfig::new("https://hooks.acme.example/outbox")
//!             .secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
//!     )
//!     .route(
//!         "whatsapp",
//!         EndpointConfig::new("https://graph.example.com/v19.0/123/messages")
//!             .header("authorization", "Bearer …")
//!             .rate_limit(RateLimit::per_second(80.0).burst(10))
//!             .timeout(Duration::from_secs(5)),
//!     )
//!     .build()?;
//!
//! let store = MemoryStore::new(); // or a PostgreSQL store from `outbox-sqlx`
//! store.enqueue(NewMessage::builder("whatsapp", "order.confirmed")
//!     .json(&serde_json::json!({ "to": "+15550100", "template": "cod_confirm" }))
//!     .build()?)?;
//! let relay = sink.register(Relay::builder(store)).build()?;
//! relay.drain().await?;
//! # Ok(())
//! # }
//! ```
//!
//! # Guarantees and capabilities
//!
//! | | |
//! |---|---|
//! | acknowledgement | published only on a 2xx status; anything else is a failure |
//! | identity on the wire | `idempotency-key`, `outbox-message-id`, `outbox-event-type` and the message's headers (incl. `traceparent`) on every attempt; see [`headers`] |
//! | signing | Standard Webhooks `webhook-id` / `webhook-timestamp` / `webhook-signature`, one signature per secret |
//! | classification | 2xx published; 408/425/429/5xx, timeouts, connection errors retryable with `Retry-After`; other 4xx permanent with the body; redirects never followed; see [`error`] |
//! | SSRF guard | on by default; resolve once, check every address, connect only to checked addresses; no proxies; see [`ssrf`] |
//! | circuit breaker | per endpoint; open = retryable `Unavailable` without a request; see [`CircuitConfig`] |
//! | rate limit | per endpoint token bucket, waits within the publish up to `max_wait`; see [`RateLimit`] |
//! | concurrency | per endpoint limit on requests in flight; same-key messages of a batch go in order |
//! | bounded publish | every publish returns within `publish_deadline`, response bodies are read up to a cap |
//! | binary payloads | sent byte for byte with the message's content type |
//! | fan-out | [`fan_out`]: one row per endpoint, one shared event key |
//! | receiving | [`receiver`]: verify + inbox dedupe in one call; an axum extractor (feature `axum`) |
//!
//! Delivery is at-least-once: a request that timed out may have been processed, and is
//! sent again. Receivers deduplicate on the signed `webhook-id` (or `idempotency-key`)
//! with an inbox; [`receiver`] does this for you.
//!
//! # Features
//!
//! - `http2`: HTTP/2 to endpoints that offer it.
//! - `receiver-postgres`, `receiver-sqlite`, `receiver-mysql`: [`receiver::Inbox`] for
//!   the inboxes of `outbox-sqlx`.
//! - `axum`: [`receiver::WebhookRequest`], an extractor that verifies requests.

mod circuit;
mod config;
pub mod error;
mod fanout;
pub mod headers;
mod rate;
pub mod receiver;
mod sink;
pub mod ssrf;

pub use circuit::{CircuitConfig, CircuitState, EndpointHealth};
pub use config::{EndpointConfig, HttpSinkConfig};
pub use error::{ConfigError, parse_retry_after};
pub use fanout::{FanOutError, fan_out};
pub use rate::RateLimit;
pub use sink::HttpSink;
