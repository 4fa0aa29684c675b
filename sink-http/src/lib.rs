//! The HTTP sink of the outbox relay, for webhooks and HTTP APIs, plus a toolkit for
//! the receiving side.
//!
//! [`HttpSink`] sends each outbox message as one HTTP request to the endpoint of its
//! route and marks it published only on a 2xx answer. It serves two kinds of receivers:
//!
//! - **webhook endpoints** of your customers: requests signed with
//!   [Standard Webhooks](https://www.standardwebhooks.com/) (several secrets at once
//!   during a rotation), an SSRF guard on every connection, and [`fan_out`] to write one
//!   row per subscribed endpoint;
//! - **third-party APIs** (a messaging API allowing 80–500 requests/s that answers 4xx
//!   for a bad recipient): `Idempotency-Key` on every request, `Retry-After` reported,
//!   and permanent 4xx answers dead-lettered at once with the response body as the
//!   reason.
//!
//! One sink serves one route. Rate limits, circuit breakers (which also honour
//! `Retry-After`), concurrency caps and timeouts are `outbox_engine::layers` that wrap it,
//! as they wrap every sink.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use outbox_engine::layers::{RateLimit, SinkExt};
//! use outbox_engine::{MemoryStore, NewMessage, Relay};
//! use outbox_sink_http::{HttpSink, HttpSinkConfig};
//!
//! let webhooks = HttpSink::new(
//!     HttpSinkConfig::new("https://hooks.acme.example/outbox")
//!         .secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
//! )?;
//! let whatsapp = HttpSink::new(
//!     HttpSinkConfig::new("https://graph.example.com/v19.0/123/messages")
//!         .header("authorization", "Bearer …")
//!         .request_timeout(Duration::from_secs(5)),
//! )?
//! .rate_limited(RateLimit::per_second(80.0).burst(10));
//!
//! let store = MemoryStore::new(); // or a PostgreSQL store from `outbox-sqlx`
//! store.enqueue(NewMessage::builder("whatsapp", "order.confirmed")
//!     .json(&serde_json::json!({ "to": "+15550100", "template": "cod_confirm" }))
//!     .build()?)?;
//! let relay = Relay::builder(store)
//!     .route("customer-webhooks/acme", webhooks)
//!     .route("whatsapp", whatsapp)
//!     .build()?;
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
//! | policies | rate limit, circuit breaker, concurrency cap, timeout: `outbox_engine::layers` around the sink |
//! | requests in flight | at most `max_in_flight` per route; same-key messages of a batch go in order |
//! | bounded publish | every publish returns by the relay's deadline; a 2xx body is not waited for, an error body is read up to a cap for 1 s |
//! | binary payloads | sent byte for byte with the message's content type |
//! | fan-out | [`fan_out`]: one row per endpoint, one shared event key |
//! | receiving | the `outbox-receiver` crate (no HTTP client): verify + inbox dedupe in one call, an axum extractor |
//!
//! Delivery is at-least-once: a request that timed out may have been processed, and is
//! sent again. Receivers deduplicate on the signed `webhook-id` (or `idempotency-key`)
//! with an inbox; the `outbox-receiver` crate does this for you.
//!
//! # Features
//!
//! - `http2`: HTTP/2 to endpoints that offer it.

#![cfg_attr(docsrs, feature(doc_cfg))]

mod config;
pub mod error;
mod fanout;
pub mod headers;
mod sink;
pub mod ssrf;

pub use config::HttpSinkConfig;
pub use error::{HttpSinkError, parse_retry_after};
pub use fanout::{FanOutError, fan_out};
pub use sink::HttpSink;

impl outbox_engine::registry::RouteSink for HttpSink {
    const SCHEMES: &'static [&'static str] = &["http", "https"];
    type Config = HttpSinkConfig;
    type Error = HttpSinkError;

    async fn connect(config: HttpSinkConfig) -> Result<Self, HttpSinkError> {
        HttpSink::new(config)
    }

    /// Building checks the settings only (no request is sent), so a failure is the
    /// settings' and retrying does not help.
    fn is_retryable(_error: &HttpSinkError) -> bool {
        false
    }

    /// Offline: the sink is built (its client, secrets and SSRF guard), nothing is sent.
    fn check(config: &HttpSinkConfig) -> Result<(), HttpSinkError> {
        HttpSink::new(config.clone()).map(drop)
    }
}
