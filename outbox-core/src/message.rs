//! The message model: what an application enqueues ([`NewMessage`]) and what a relay
//! hands to a sink ([`Message`]).

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::error::MessageError;

/// The identity of one outbox message: a UUIDv7, so ids sort by creation time.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct MessageId(Uuid);

impl MessageId {
    /// A fresh UUIDv7 id.
    pub fn new() -> Self {
        Self(Uuid::now_v7())
    }

    /// Wraps an existing UUID (for example one read back from a database).
    pub const fn from_uuid(uuid: Uuid) -> Self {
        Self(uuid)
    }

    /// The underlying UUID.
    pub const fn as_uuid(&self) -> &Uuid {
        &self.0
    }
}

impl Default for MessageId {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MessageId({})", self.0)
    }
}

impl fmt::Display for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl From<Uuid> for MessageId {
    fn from(uuid: Uuid) -> Self {
        Self(uuid)
    }
}

/// Message headers: lowercase-insensitive names are kept as given, in sorted order.
pub type Headers = BTreeMap<String, String>;

/// Size and shape limits applied when a [`NewMessage`] is built.
///
/// The defaults fit every sink we ship (the smallest broker limit is SQS at 256 KiB per
/// message including attributes; sinks check their own limit again at publish time).
/// The SQL stores' tables enforce the defaults too, for writers in other languages
/// (decision 0020): raising a limit here also needs the matching table constraint relaxed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Limits {
    /// Largest payload in bytes. Default 1 MiB.
    pub max_payload_bytes: usize,
    /// Most headers on one message. Default 64.
    pub max_headers: usize,
    /// Longest header name in bytes. Default 128.
    pub max_header_name_bytes: usize,
    /// Longest header value in bytes. Default 8 KiB.
    pub max_header_value_bytes: usize,
    /// Longest destination, event type, aggregate type, partition key, tenant id or
    /// idempotency key, in bytes. Default 255.
    pub max_field_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_payload_bytes: 1024 * 1024,
            max_headers: 64,
            max_header_name_bytes: 128,
            max_header_value_bytes: 8 * 1024,
            max_field_bytes: 255,
        }
    }
}

/// When a new message becomes due for publishing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Availability {
    /// As soon as the enqueuing transaction commits.
    Now,
    /// This long after the store's clock reads the row (the database's `now()` at insert).
    After(Duration),
    /// At an absolute instant.
    At(DateTime<Utc>),
}

/// A message to enqueue, validated. Build one with [`NewMessage::builder`].
///
/// ```
/// use outbox_engine::NewMessage;
///
/// let msg = NewMessage::builder("billing", "invoice.paid")
///     .json(&serde_json::json!({ "invoice": 42, "amount_cents": 1999 }))
///     .partition_key("invoice-42")
///     .tenant_id("acme")
///     .header("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
///     .build()?;
/// assert_eq!(msg.content_type(), "application/json");
/// assert_eq!(msg.idempotency_key(), msg.id().to_string());
/// # Ok::<(), outbox_engine::MessageError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewMessage {
    id: MessageId,
    destination: String,
    event_type: String,
    aggregate_type: Option<String>,
    aggregate_id: Option<String>,
    partition_key: Option<String>,
    tenant_id: Option<String>,
    idempotency_key: String,
    payload: Vec<u8>,
    content_type: String,
    headers: Headers,
    availability: Availability,
}

impl NewMessage {
    /// Starts a message for `destination` (a configured route name) of type `event_type`.
    pub fn builder(
        destination: impl Into<String>,
        event_type: impl Into<String>,
    ) -> NewMessageBuilder {
        NewMessageBuilder::new(destination.into(), event_type.into())
    }

    /// The message id (UUIDv7).
    pub fn id(&self) -> MessageId {
        self.id
    }
    /// The route name the relay publishes to.
    pub fn destination(&self) -> &str {
        &self.destination
    }
    /// The event type, e.g. `order.paid`.
    pub fn event_type(&self) -> &str {
        &self.event_type
    }
    /// The aggregate type, e.g. `order`.
    pub fn aggregate_type(&self) -> Option<&str> {
        self.aggregate_type.as_deref()
    }
    /// The aggregate id, e.g. the order number.
    pub fn aggregate_id(&self) -> Option<&str> {
        self.aggregate_id.as_deref()
    }
    /// The ordering key: with per-key ordering, messages sharing it publish in commit order.
    pub fn partition_key(&self) -> Option<&str> {
        self.partition_key.as_deref()
    }
    /// The tenant this message belongs to.
    pub fn tenant_id(&self) -> Option<&str> {
        self.tenant_id.as_deref()
    }
    /// The key receivers deduplicate on; stable across every delivery attempt.
    pub fn idempotency_key(&self) -> &str {
        &self.idempotency_key
    }
    /// The payload bytes.
    pub fn payload(&self) -> &[u8] {
        &self.payload
    }
    /// The payload's media type.
    pub fn content_type(&self) -> &str {
        &self.content_type
    }
    /// Headers carried to the receiver.
    pub fn headers(&self) -> &Headers {
        &self.headers
    }
    /// When the message becomes due.
    pub fn availability(&self) -> Availability {
        self.availability
    }

    /// Resolves the availability against `now` (the store's clock at insert).
    pub fn available_at(&self, now: DateTime<Utc>) -> DateTime<Utc> {
        match self.availability {
            Availability::Now => now,
            Availability::After(delay) => now + chrono_duration(delay),
            Availability::At(at) => at,
        }
    }

    /// Turns this new message into the claimed form, as if inserted at `now`.
    pub fn into_message(self, now: DateTime<Utc>) -> Message {
        Message {
            id: self.id,
            destination: self.destination,
            event_type: self.event_type,
            aggregate_type: self.aggregate_type,
            aggregate_id: self.aggregate_id,
            partition_key: self.partition_key,
            tenant_id: self.tenant_id,
            idempotency_key: self.idempotency_key,
            payload: self.payload,
            content_type: self.content_type,
            headers: self.headers,
            attempts: 0,
            created_at: now,
            waited: None,
        }
    }
}

/// Builds a [`NewMessage`]; every check runs in [`build`](Self::build).
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct NewMessageBuilder {
    id: MessageId,
    destination: String,
    event_type: String,
    aggregate_type: Option<String>,
    aggregate_id: Option<String>,
    partition_key: Option<String>,
    tenant_id: Option<String>,
    idempotency_key: Option<String>,
    payload: Result<Vec<u8>, String>,
    content_type: String,
    headers: Vec<(String, String)>,
    availability: Availability,
    limits: Limits,
}

impl NewMessageBuilder {
    fn new(destination: String, event_type: String) -> Self {
        Self {
            id: MessageId::new(),
            destination,
            event_type,
            aggregate_type: None,
            aggregate_id: None,
            partition_key: None,
            tenant_id: None,
            idempotency_key: None,
            payload: Ok(Vec::new()),
            content_type: "application/json".to_owned(),
            headers: Vec::new(),
            availability: Availability::Now,
            limits: Limits::default(),
        }
    }

    /// Serialises `value` as the JSON payload (`application/json`).
    pub fn json<T: Serialize + ?Sized>(mut self, value: &T) -> Self {
        self.payload = serde_json::to_vec(value).map_err(|e| e.to_string());
        self.content_type = "application/json".to_owned();
        self
    }

    /// Uses raw bytes as the payload, with their media type.
    pub fn bytes(mut self, payload: impl Into<Vec<u8>>, content_type: impl Into<String>) -> Self {
        self.payload = Ok(payload.into());
        self.content_type = content_type.into();
        self
    }

    /// Sets the aggregate this event is about, e.g. `("order", "1042")`.
    pub fn aggregate(mut self, aggregate_type: impl Into<String>, id: impl Into<String>) -> Self {
        self.aggregate_type = Some(aggregate_type.into());
        self.aggregate_id = Some(id.into());
        self
    }

    /// Sets the ordering key.
    pub fn partition_key(mut self, key: impl Into<String>) -> Self {
        self.partition_key = Some(key.into());
        self
    }

    /// Sets the tenant id.
    pub fn tenant_id(mut self, tenant: impl Into<String>) -> Self {
        self.tenant_id = Some(tenant.into());
        self
    }

    /// Adds a header; a later header with the same name replaces the earlier one.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Uses an explicit idempotency key instead of the message id.
    pub fn idempotency_key(mut self, key: impl Into<String>) -> Self {
        self.idempotency_key = Some(key.into());
        self
    }

    /// Derives the idempotency key from a namespace and parts (see [`deterministic_key`]),
    /// so a replayed state transition produces the same key and the receiver drops it.
    pub fn deterministic_key(mut self, namespace: Uuid, parts: &[&str]) -> Self {
        self.idempotency_key = Some(deterministic_key(namespace, parts).to_string());
        self
    }

    /// Publishes no earlier than `delay` after the insert.
    pub fn delay(mut self, delay: Duration) -> Self {
        self.availability = Availability::After(delay);
        self
    }

    /// Publishes no earlier than `at`.
    pub fn available_at(mut self, at: DateTime<Utc>) -> Self {
        self.availability = Availability::At(at);
        self
    }

    /// Uses a specific id (it must be unique); normally a fresh UUIDv7 is used.
    pub fn id(mut self, id: MessageId) -> Self {
        self.id = id;
        self
    }

    /// Replaces the default [`Limits`].
    pub fn limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// Validates every field and returns the message.
    ///
    /// # Errors
    ///
    /// A [`MessageError`] naming the first field that is empty, too long, contains
    /// control characters, or (for the payload) failed to serialise or exceeds the limit.
    ///
    /// With the `opentelemetry` feature, the current trace context becomes the message's
    /// `traceparent` and `tracestate` headers first (see `trace`), counted in the limits.
    #[cfg_attr(not(feature = "opentelemetry"), allow(unused_mut))]
    pub fn build(mut self) -> Result<NewMessage, MessageError> {
        #[cfg(feature = "opentelemetry")]
        crate::trace::record_current(&mut self.headers);
        let limits = &self.limits;
        check_destination(&self.destination, limits)?;
        check_text("event_type", &self.event_type, limits.max_field_bytes)?;
        for (field, value) in [
            ("aggregate_type", &self.aggregate_type),
            ("aggregate_id", &self.aggregate_id),
            ("partition_key", &self.partition_key),
            ("tenant_id", &self.tenant_id),
            ("idempotency_key", &self.idempotency_key),
        ] {
            if let Some(value) = value {
                check_text(field, value, limits.max_field_bytes)?;
            }
        }
        let payload = self.payload.map_err(MessageError::Serialization)?;
        if payload.len() > limits.max_payload_bytes {
            return Err(MessageError::PayloadTooLarge {
                size: payload.len(),
                limit: limits.max_payload_bytes,
            });
        }
        check_text("content_type", &self.content_type, limits.max_field_bytes)?;
        let mut headers = Headers::new();
        for (name, value) in self.headers {
            check_header(&name, &value, limits)?;
            headers.insert(name, value);
        }
        if headers.len() > limits.max_headers {
            return Err(MessageError::TooManyHeaders {
                count: headers.len(),
                limit: limits.max_headers,
            });
        }
        let idempotency_key = self.idempotency_key.unwrap_or_else(|| self.id.to_string());
        Ok(NewMessage {
            id: self.id,
            destination: self.destination,
            event_type: self.event_type,
            aggregate_type: self.aggregate_type,
            aggregate_id: self.aggregate_id,
            partition_key: self.partition_key,
            tenant_id: self.tenant_id,
            idempotency_key,
            payload,
            content_type: self.content_type,
            headers,
            availability: self.availability,
        })
    }
}

/// A deterministic UUIDv5 from a namespace and parts.
///
/// The name hashed is each part written as `<byte length>:<part>` and joined with nothing,
/// so `["a:b", "c"]` and `["a", "b:c"]` give different keys. Any language can compute
/// the same key: `uuid5(namespace, "8:order-42" + "4:paid")` for `["order-42", "paid"]`.
///
/// ```
/// use outbox_engine::deterministic_key;
/// use uuid::Uuid;
///
/// let ns = Uuid::from_u128(0x6ba7b811_9dad_11d1_80b4_00c04fd430c8);
/// assert_eq!(deterministic_key(ns, &["order-42", "paid"]), deterministic_key(ns, &["order-42", "paid"]));
/// assert_ne!(deterministic_key(ns, &["a:b", "c"]), deterministic_key(ns, &["a", "b:c"]));
/// ```
pub fn deterministic_key(namespace: Uuid, parts: &[&str]) -> Uuid {
    let mut name = String::new();
    for part in parts {
        name.push_str(&part.len().to_string());
        name.push(':');
        name.push_str(part);
    }
    Uuid::new_v5(&namespace, name.as_bytes())
}

/// Checks that `name` can be a destination: what [`NewMessage`] and the table accept
/// (1–255 bytes of `A-Z a-z 0-9 _ - . : /`). A route whose name fails this could never
/// match a row, so relays refuse it.
///
/// ```
/// assert!(outbox_engine::check_destination_name("billing.v2").is_ok());
/// assert!(outbox_engine::check_destination_name("bad name!").is_err());
/// ```
///
/// # Errors
///
/// [`MessageError::InvalidField`] saying what is wrong.
pub fn check_destination_name(name: &str) -> Result<(), MessageError> {
    check_destination(name, &Limits::default())
}

fn check_destination(value: &str, limits: &Limits) -> Result<(), MessageError> {
    check_text("destination", value, limits.max_field_bytes)?;
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':' | '/');
    if let Some(bad) = value.chars().find(|c| !allowed(*c)) {
        return Err(MessageError::InvalidField {
            field: "destination",
            reason: format!("character {bad:?} not allowed (use A-Z a-z 0-9 _ - . : /)"),
        });
    }
    Ok(())
}

fn check_text(field: &'static str, value: &str, max: usize) -> Result<(), MessageError> {
    if value.is_empty() {
        return Err(MessageError::InvalidField {
            field,
            reason: "must not be empty".to_owned(),
        });
    }
    if value.len() > max {
        return Err(MessageError::InvalidField {
            field,
            reason: format!("{} bytes, limit is {max}", value.len()),
        });
    }
    if value.chars().any(char::is_control) {
        return Err(MessageError::InvalidField {
            field,
            reason: "must not contain control characters".to_owned(),
        });
    }
    Ok(())
}

fn check_header(name: &str, value: &str, limits: &Limits) -> Result<(), MessageError> {
    let invalid = |reason: String| MessageError::InvalidHeader {
        name: name.chars().take(64).collect(),
        reason,
    };
    // RFC 9110 token characters, which every broker's header model also accepts.
    let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
    if name.is_empty() || !name.chars().all(token) {
        return Err(invalid("name must be a non-empty HTTP token".to_owned()));
    }
    if name.len() > limits.max_header_name_bytes {
        return Err(invalid(format!(
            "name is {} bytes, limit is {}",
            name.len(),
            limits.max_header_name_bytes
        )));
    }
    if value.len() > limits.max_header_value_bytes {
        return Err(invalid(format!(
            "value is {} bytes, limit is {}",
            value.len(),
            limits.max_header_value_bytes
        )));
    }
    if value.chars().any(|c| c.is_control() && c != '\t') {
        return Err(invalid(
            "value must not contain control characters".to_owned(),
        ));
    }
    Ok(())
}

pub(crate) fn chrono_duration(d: Duration) -> chrono::Duration {
    chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX)
}

/// A stored message as a relay sees it after claiming it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Message {
    /// The message id.
    pub id: MessageId,
    /// The route name.
    pub destination: String,
    /// The event type.
    pub event_type: String,
    /// The aggregate type.
    pub aggregate_type: Option<String>,
    /// The aggregate id.
    pub aggregate_id: Option<String>,
    /// The ordering key.
    pub partition_key: Option<String>,
    /// The tenant id.
    pub tenant_id: Option<String>,
    /// The key receivers deduplicate on.
    pub idempotency_key: String,
    /// The payload bytes.
    pub payload: Vec<u8>,
    /// The payload's media type.
    pub content_type: String,
    /// Headers carried to the receiver.
    pub headers: Headers,
    /// How many times the message was claimed, counting the current claim.
    pub attempts: u32,
    /// When the row was inserted (the store's clock).
    pub created_at: DateTime<Utc>,
    /// How long it had waited when claimed, where the store measures that.
    pub waited: Option<Waited>,
}

/// How long a claimed message had waited for the relay, by the store's clock (so a relay
/// with a skewed clock measures it right).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Waited {
    /// From [`since`](Self::since) to the claim.
    pub duration: Duration,
    /// What the wait is measured from.
    pub since: WaitedSince,
}

/// What a [`Waited`] is measured from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum WaitedSince {
    /// The commit of the transaction that enqueued the message (PostgreSQL with
    /// `track_commit_timestamp = on`; the in-memory store, whose enqueue is its commit).
    Commit,
    /// The start of that transaction (PostgreSQL without commit timestamps).
    TransactionStart,
    /// The insert statement (SQLite, MySQL), or the row's `created_at` where the store
    /// says nothing.
    Insert,
}

impl WaitedSince {
    /// The name used as the `since` label of `outbox_commit_to_publish_seconds`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Commit => "commit",
            Self::TransactionStart => "transaction_start",
            Self::Insert => "insert",
        }
    }
}

impl Message {
    /// Builds a claimed message from its parts; stores use this when reading rows back.
    #[allow(clippy::too_many_arguments)]
    pub fn from_parts(
        id: MessageId,
        destination: String,
        event_type: String,
        payload: Vec<u8>,
        content_type: String,
        idempotency_key: String,
        attempts: u32,
        created_at: DateTime<Utc>,
    ) -> Self {
        Self {
            id,
            destination,
            event_type,
            aggregate_type: None,
            aggregate_id: None,
            partition_key: None,
            tenant_id: None,
            idempotency_key,
            payload,
            content_type,
            headers: Headers::new(),
            attempts,
            created_at,
            waited: None,
        }
    }

    /// The payload as UTF-8 text, when it is.
    pub fn payload_str(&self) -> Option<&str> {
        std::str::from_utf8(&self.payload).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok() -> NewMessageBuilder {
        NewMessage::builder("orders", "order.paid").json(&serde_json::json!({"a": 1}))
    }

    #[test]
    fn defaults_idempotency_key_to_id_and_ids_are_v7() {
        let m = ok().build().unwrap();
        assert_eq!(m.idempotency_key(), m.id().to_string());
        assert_eq!(m.id().as_uuid().get_version_num(), 7);
        assert_eq!(m.payload(), br#"{"a":1}"#);
    }

    #[test]
    fn ids_are_time_ordered() {
        let a = MessageId::new();
        let b = MessageId::new();
        assert!(a < b);
    }

    #[test]
    fn deterministic_keys_repeat_and_distinguish_parts() {
        let ns = Uuid::NAMESPACE_OID;
        let a = ok()
            .deterministic_key(ns, &["order-1", "paid"])
            .build()
            .unwrap();
        let b = ok()
            .deterministic_key(ns, &["order-1", "paid"])
            .build()
            .unwrap();
        let c = ok()
            .deterministic_key(ns, &["order-1", "shipped"])
            .build()
            .unwrap();
        assert_ne!(a.id(), b.id());
        assert_eq!(a.idempotency_key(), b.idempotency_key());
        assert_ne!(a.idempotency_key(), c.idempotency_key());
        assert_eq!(
            deterministic_key(ns, &["order-1", "paid"]),
            Uuid::new_v5(&ns, b"7:order-14:paid")
        );
    }

    #[test]
    fn rejects_bad_fields_with_the_field_name() {
        let cases: Vec<(NewMessageBuilder, &str)> = vec![
            (NewMessage::builder("", "e"), "destination"),
            (NewMessage::builder("bad dest", "e"), "destination"),
            (NewMessage::builder("d", ""), "event_type"),
            (NewMessage::builder("d", "e\n"), "event_type"),
            (ok().partition_key("x".repeat(256)), "partition_key"),
            (ok().tenant_id(""), "tenant_id"),
            (ok().idempotency_key("k\0"), "idempotency_key"),
            (ok().aggregate("order", ""), "aggregate_id"),
        ];
        for (builder, field) in cases {
            let err = builder.build().unwrap_err();
            assert!(
                matches!(&err, MessageError::InvalidField { field: f, .. } if *f == field),
                "{field}: {err}"
            );
            assert!(err.to_string().contains(field), "{err}");
        }
    }

    #[test]
    fn validates_headers() {
        for (name, value) in [
            ("", "v"),
            ("bad name", "v"),
            ("x-a\r\nInjected", "v"),
            ("x-ok", "line\r\nbreak"),
            ("x-ok", "nul\0"),
        ] {
            let err = ok().header(name, value).build().unwrap_err();
            assert!(
                matches!(err, MessageError::InvalidHeader { .. }),
                "{name:?} {value:?}"
            );
        }
        let many = (0..65).fold(ok(), |b, i| b.header(format!("x-{i}"), "v"));
        assert!(matches!(
            many.build(),
            Err(MessageError::TooManyHeaders { count: 65, .. })
        ));
        let tabbed = ok().header("x-tab", "a\tb").build().unwrap();
        assert_eq!(tabbed.headers()["x-tab"], "a\tb");
    }

    #[test]
    fn enforces_payload_limit_and_reports_serialization_errors() {
        let limits = Limits {
            max_payload_bytes: 4,
            ..Limits::default()
        };
        let err = ok()
            .bytes(vec![0u8; 5], "application/octet-stream")
            .limits(limits.clone());
        assert!(matches!(
            err.build(),
            Err(MessageError::PayloadTooLarge { size: 5, limit: 4 })
        ));
        assert!(
            ok().bytes(vec![0xff; 4], "application/octet-stream")
                .limits(limits)
                .build()
                .is_ok()
        );

        let mut map = std::collections::HashMap::new();
        map.insert(vec![1u8], 1); // JSON object keys must be strings
        let err = ok().json(&map).build().unwrap_err();
        assert!(matches!(err, MessageError::Serialization(_)), "{err}");
    }

    #[test]
    fn availability_resolves_against_store_clock() {
        let now = Utc::now();
        let m = ok().delay(Duration::from_secs(60)).build().unwrap();
        assert_eq!(m.available_at(now), now + chrono::Duration::seconds(60));
        let at = now + chrono::Duration::hours(1);
        let m = ok().available_at(at).build().unwrap();
        assert_eq!(m.available_at(now), at);
        let stored = m.into_message(now);
        assert_eq!(stored.created_at, now);
        assert_eq!(stored.attempts, 0);
    }
}
