//! The headers the sink puts on every request, by their lowercase names.
//!
//! | header | value | when |
//! |---|---|---|
//! | `content-type` | the message's content type | always |
//! | `idempotency-key` | the message's idempotency key | always |
//! | `outbox-message-id` | the message id (a UUIDv7) | always |
//! | `outbox-event-type` | the event type | always |
//! | `outbox-attempt` | the attempt number, from 1 | always |
//! | `outbox-partition-key`, `outbox-tenant-id`, `outbox-aggregate-type`, `outbox-aggregate-id` | those fields | when the message has them |
//! | `webhook-id` | the idempotency key, with `.`, `%`, spaces, control and non-ASCII characters percent-encoded | the route has secrets |
//! | `webhook-timestamp` | unix seconds at send time | the route has secrets |
//! | `webhook-signature` | `v1,<base64>` per secret | the route has secrets |
//! | `user-agent` | `outbox-sink-http/<version>` unless configured | always |
//! | the message's own headers (e.g. `traceparent`) | as enqueued | always |
//! | the route's headers (e.g. `authorization`) | as configured | always |
//!
//! `webhook-id` is the idempotency key rather than the message id because it is the
//! signed identity receivers deduplicate on: a replayed business transition with a
//! deterministic key must look like the same webhook. With the default key (the id)
//! both are the same. The signed content is `{id}.{timestamp}.{body}`, so an id must not
//! contain `.`: `order-42.paid` is sent as `order-42%2Epaid`, which any Standard Webhooks
//! verifier accepts and deduplicates on, and which `outbox-receiver` decodes back to the
//! key (`outbox_engine::webhooks::webhook_id` and `idempotency_key`).
//!
//! HTTP header names are case-insensitive and arrive lowercased. A message header whose
//! name is one of the sink's own (listed above, plus framing headers such as `host` or
//! `content-length`) cannot be sent: the message fails permanently with a reason that
//! names the header. A route header replaces a message header of the same name.
//!
//! ```
//! use outbox_sink_http::headers;
//!
//! assert!(headers::is_reserved("Content-Length"));
//! assert!(headers::is_reserved("webhook-signature"));
//! assert!(!headers::is_reserved("traceparent"));
//! ```

/// The message's idempotency key.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
/// The partition key, when the message has one.
pub const PARTITION_KEY: &str = "outbox-partition-key";
/// The tenant id, when the message has one.
pub const TENANT_ID: &str = "outbox-tenant-id";
/// The aggregate type, when the message has one.
pub const AGGREGATE_TYPE: &str = "outbox-aggregate-type";
/// The aggregate id, when the message has one.
pub const AGGREGATE_ID: &str = "outbox-aggregate-id";

/// The message id, the event type, the attempt number (from 1), and the Standard
/// Webhooks headers: their names are shared with receivers.
pub use outbox_engine::webhooks::{
    HEADER_ATTEMPT as ATTEMPT, HEADER_EVENT_TYPE as EVENT_TYPE, HEADER_ID as WEBHOOK_ID,
    HEADER_MESSAGE_ID as MESSAGE_ID, HEADER_SIGNATURE as WEBHOOK_SIGNATURE,
    HEADER_TIMESTAMP as WEBHOOK_TIMESTAMP,
};

/// Headers that neither a message nor a route may set: the sink's own, and those that
/// frame the HTTP exchange.
pub const RESERVED: &[&str] = &[
    "content-type",
    IDEMPOTENCY_KEY,
    MESSAGE_ID,
    EVENT_TYPE,
    ATTEMPT,
    PARTITION_KEY,
    TENANT_ID,
    AGGREGATE_TYPE,
    AGGREGATE_ID,
    WEBHOOK_ID,
    WEBHOOK_TIMESTAMP,
    WEBHOOK_SIGNATURE,
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "te",
    "trailer",
    "upgrade",
    "expect",
    "proxy-authorization",
    "proxy-connection",
];

/// Whether `name` (any case) is in [`RESERVED`].
pub fn is_reserved(name: &str) -> bool {
    RESERVED.iter().any(|r| r.eq_ignore_ascii_case(name))
}
