//! The receiving side, whatever the transport: the [`Inbox`] a consumer deduplicates
//! with, and the [`Received`] identity of a message an outbox sink delivered.
//!
//! Delivery is at-least-once: a relay that crashed after sending, a lost acknowledgement
//! or a consumer that failed after committing all lead to a second delivery. The recipe
//! for one side effect per message is the same for every sink:
//!
//! 1. read the message's identity ([`Received`] from a Kafka record, an SQS message, an
//!    AMQP delivery or a Redis stream entry, with the helper of that sink's crate; a
//!    verified webhook for HTTP);
//! 2. in one transaction of your own, [`Inbox::record`] the idempotency key under your
//!    consumer's name and apply the side effect only when it is [`Delivery::New`];
//! 3. commit, then acknowledge the delivery (commit the offset, delete the SQS message,
//!    ack the AMQP delivery, answer 2xx).
//!
//! A crash between 2 and 3 redelivers the message, and the inbox turns it into a no-op.
//! `outbox-sqlx` implements [`Inbox`] for PostgreSQL, SQLite and MySQL/MariaDB; the test
//! kit's `MemoryInbox` is for your tests, and `testkit::inbox_suite` checks any inbox.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use crate::error::{StoreError, StoreErrorKind};
use crate::message::{Headers, Message, MessageId};

/// Whether an inbox delivery is the first one for its `(consumer, key)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// First time: run the side effect, then commit.
    New,
    /// Recorded by an earlier delivery that committed: skip the side effect.
    Duplicate,
}

impl Delivery {
    /// `true` for [`Delivery::New`].
    pub fn is_new(self) -> bool {
        matches!(self, Self::New)
    }
}

/// The consumer's dedupe table, written inside the consumer's own transaction.
///
/// A record is part of the transaction that writes it: it is seen by other deliveries
/// only once that transaction commits, and rolling back forgets it. Two concurrent
/// deliveries of one key never both see [`Delivery::New`] and commit; the second waits
/// for the first, or fails with a retryable error that the consumer answers by retrying
/// the whole transaction (MySQL reports some such conflicts as deadlocks).
///
/// ```
/// # async fn demo<I: outbox_engine::Inbox>(inbox: &I, tx: &mut I::Connection) -> Result<(), outbox_engine::StoreError> {
/// use outbox_engine::Delivery;
///
/// if inbox.record(tx, "billing", "order-42:paid").await? == Delivery::New {
///     // apply the side effect on `tx`, then commit it
/// }
/// # Ok(())
/// # }
/// ```
pub trait Inbox: Send + Sync {
    /// What a record is written on: the connection your transaction runs on.
    type Connection: Send;

    /// Records `(consumer, key)` on `conn`: [`Delivery::New`] the first time.
    ///
    /// # Errors
    ///
    /// `InvalidInput` for a consumer or key that [`check_key`] refuses; the database's
    /// error otherwise.
    fn record(
        &self,
        conn: &mut Self::Connection,
        consumer: &str,
        key: &str,
    ) -> impl Future<Output = Result<Delivery, StoreError>> + Send;

    /// Forgets at most `batch_size` records older than `older_than`; returns how many.
    /// Keep records longer than any redelivery can arrive: a key forgotten too early is
    /// new again.
    ///
    /// # Errors
    ///
    /// The database's error.
    fn purge(
        &self,
        conn: &mut Self::Connection,
        older_than: Duration,
        batch_size: usize,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;
}

/// The longest consumer name or key an inbox holds, in bytes: the longest MySQL can
/// index in its primary key.
pub const MAX_KEY_LEN: usize = 191;

/// Checks a consumer name or key for an inbox: 1 to [`MAX_KEY_LEN`] bytes, no NUL (which
/// PostgreSQL text cannot hold). Every inbox applies this rule, so a key that one backend
/// takes is taken by all.
///
/// ```
/// use outbox_engine::receive::check_key;
///
/// assert!(check_key("key", "order-42:paid").is_ok());
/// assert!(check_key("key", "").is_err());
/// assert!(check_key("key", &"k".repeat(192)).is_err());
/// ```
///
/// # Errors
///
/// An `InvalidInput` [`StoreError`] naming `what`.
pub fn check_key(what: &str, value: &str) -> Result<(), StoreError> {
    if value.is_empty() || value.len() > MAX_KEY_LEN || value.contains('\0') {
        return Err(StoreError::new(
            StoreErrorKind::InvalidInput,
            format!("inbox {what} must be 1 to {MAX_KEY_LEN} bytes without NUL"),
        ));
    }
    Ok(())
}

/// The names of the metadata fields that the broker sinks (Kafka headers, SQS message
/// attributes, AMQP headers) write next to the payload.
pub mod fields {
    /// Every field the sinks write starts with this; a message header may not.
    pub const PREFIX: &str = "outbox-";
    /// The message id.
    pub const ID: &str = "outbox-id";
    /// The idempotency key.
    pub const IDEMPOTENCY_KEY: &str = "outbox-idempotency-key";
    /// The event type.
    pub const EVENT_TYPE: &str = "outbox-event-type";
    /// The payload's content type.
    pub const CONTENT_TYPE: &str = "outbox-content-type";
    /// The partition key, when the message has one.
    pub const PARTITION_KEY: &str = "outbox-partition-key";
    /// The tenant, when the message has one.
    pub const TENANT_ID: &str = "outbox-tenant-id";
    /// The aggregate type, when the message has one.
    pub const AGGREGATE_TYPE: &str = "outbox-aggregate-type";
    /// The aggregate id, when the message has one.
    pub const AGGREGATE_ID: &str = "outbox-aggregate-id";
}

/// The metadata fields for `message` whose id reads `id`, in this order: id, idempotency
/// key, event type, content type, then partition key, tenant, aggregate type and
/// aggregate id when the message has them.
///
/// ```
/// use outbox_engine::{NewMessage, receive};
///
/// let message = NewMessage::builder("orders", "order.paid")
///     .partition_key("42")
///     .json(&1)
///     .build()?
///     .into_message(chrono::Utc::now());
/// let id = message.id.to_string();
/// let fields = receive::metadata_fields(&message, &id);
/// assert_eq!(fields[0], ("outbox-id", id.as_str()));
/// assert_eq!(fields[4], ("outbox-partition-key", "42"));
/// assert_eq!(fields.len(), 5);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn metadata_fields<'a>(message: &'a Message, id: &'a str) -> Vec<(&'static str, &'a str)> {
    let mut out = vec![
        (fields::ID, id),
        (fields::IDEMPOTENCY_KEY, message.idempotency_key.as_str()),
        (fields::EVENT_TYPE, message.event_type.as_str()),
        (fields::CONTENT_TYPE, message.content_type.as_str()),
    ];
    for (name, value) in [
        (fields::PARTITION_KEY, &message.partition_key),
        (fields::TENANT_ID, &message.tenant_id),
        (fields::AGGREGATE_TYPE, &message.aggregate_type),
        (fields::AGGREGATE_ID, &message.aggregate_id),
    ] {
        if let Some(value) = value {
            out.push((name, value.as_str()));
        }
    }
    out
}

/// A message as an outbox sink delivered it, read back by a consumer.
///
/// Record [`idempotency_key`](Self::idempotency_key) in an [`Inbox`]: it is the same on
/// every delivery of the message, and also when a business transition was enqueued
/// twice with a deterministic key.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Received {
    /// The outbox message id.
    pub id: MessageId,
    /// The idempotency key: deduplicate on this.
    pub idempotency_key: String,
    /// The event type.
    pub event_type: String,
    /// The content type, if the sink carried one.
    pub content_type: Option<String>,
    /// The partition key, if the message had one.
    pub partition_key: Option<String>,
    /// The tenant, if the message had one.
    pub tenant_id: Option<String>,
    /// The aggregate type, if the message had one.
    pub aggregate_type: Option<String>,
    /// The aggregate id, if the message had one.
    pub aggregate_id: Option<String>,
    /// The message's own headers (`traceparent`, say): the sink's fields and values that
    /// are not text are left out.
    pub headers: Headers,
    /// The payload bytes.
    pub payload: Vec<u8>,
}

impl Received {
    /// The trace context the message carries (its `traceparent`), as the remote parent
    /// for the consumer's span; empty when it carries none. See [`crate::trace`].
    #[cfg(feature = "opentelemetry")]
    #[cfg_attr(docsrs, doc(cfg(feature = "opentelemetry")))]
    pub fn trace_context(&self) -> opentelemetry::Context {
        crate::trace::context_of(&self.headers)
    }

    /// Reads a message from the `(name, value)` fields a sink wrote with the names of
    /// [`fields`], and its payload. A value of `None` is a field that is present but not
    /// text: refused for the sink's own fields, left out for a header. Other fields under
    /// [`fields::PREFIX`] are left for the sink's helper to read.
    ///
    /// ```
    /// use outbox_engine::Received;
    ///
    /// let fields = [
    ///     ("outbox-id", Some("0190f2c4-58a3-7c3e-9a3b-3e1f2d4c5b6a")),
    ///     ("outbox-idempotency-key", Some("order-42:paid")),
    ///     ("outbox-event-type", Some("order.paid")),
    ///     ("traceparent", Some("00-4bf9-01")),
    ///     ("x-binary", None),
    /// ];
    /// let received = Received::from_fields(fields, b"{}".to_vec())?;
    /// assert_eq!(received.idempotency_key, "order-42:paid");
    /// assert_eq!(received.headers.len(), 1);
    ///
    /// assert!(Received::from_fields([], Vec::new()).is_err());
    /// # Ok::<(), outbox_engine::receive::NotAnOutboxMessage>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`NotAnOutboxMessage`] when the id, idempotency key or event type is missing, the
    /// id is not a UUID, or one of the sink's fields is not text.
    pub fn from_fields<'a>(
        fields: impl IntoIterator<Item = (&'a str, Option<&'a str>)>,
        payload: Vec<u8>,
    ) -> Result<Self, NotAnOutboxMessage> {
        let (mut id, mut idempotency_key, mut event_type) = (None, None, None);
        let mut received = Self {
            id: MessageId::from(uuid::Uuid::nil()),
            idempotency_key: String::new(),
            event_type: String::new(),
            content_type: None,
            partition_key: None,
            tenant_id: None,
            aggregate_type: None,
            aggregate_id: None,
            headers: Headers::new(),
            payload,
        };
        for (name, value) in fields {
            let Some(text) = value else {
                if name.starts_with(fields::PREFIX) {
                    return Err(NotAnOutboxMessage::new(format!(
                        "field {name:?} has no value or is not text"
                    )));
                }
                continue;
            };
            let text = text.to_owned();
            match name {
                fields::ID => id = Some(text),
                fields::IDEMPOTENCY_KEY => idempotency_key = Some(text),
                fields::EVENT_TYPE => event_type = Some(text),
                fields::CONTENT_TYPE => received.content_type = Some(text),
                fields::PARTITION_KEY => received.partition_key = Some(text),
                fields::TENANT_ID => received.tenant_id = Some(text),
                fields::AGGREGATE_TYPE => received.aggregate_type = Some(text),
                fields::AGGREGATE_ID => received.aggregate_id = Some(text),
                _ if name.starts_with(fields::PREFIX) => {}
                _ => {
                    received.headers.insert(name.to_owned(), text);
                }
            }
        }
        let missing = |name: &str| NotAnOutboxMessage::new(format!("no {name} field"));
        let id = id.ok_or_else(|| missing(fields::ID))?;
        received.id = id
            .parse::<uuid::Uuid>()
            .map(MessageId::from)
            .map_err(|_| NotAnOutboxMessage::new(format!("{} {id:?} is not a UUID", fields::ID)))?;
        received.idempotency_key =
            idempotency_key.ok_or_else(|| missing(fields::IDEMPOTENCY_KEY))?;
        received.event_type = event_type.ok_or_else(|| missing(fields::EVENT_TYPE))?;
        Ok(received)
    }
}

/// Why a delivery is not a message an outbox sink produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotAnOutboxMessage(String);

impl NotAnOutboxMessage {
    /// An error saying what is wrong with the delivery.
    pub fn new(reason: impl Into<String>) -> Self {
        Self(reason.into())
    }
}

impl fmt::Display for NotAnOutboxMessage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "not an outbox message: {}", self.0)
    }
}

impl std::error::Error for NotAnOutboxMessage {}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "0190f2c4-58a3-7c3e-9a3b-3e1f2d4c5b6a";

    #[test]
    fn sink_fields_must_be_text_and_headers_without_text_are_left_out() {
        let ok = [
            (fields::ID, Some(ID)),
            (fields::IDEMPOTENCY_KEY, Some("k")),
            (fields::EVENT_TYPE, Some("t")),
            (fields::TENANT_ID, Some("acme")),
            ("outbox-future-field", Some("ignored")),
            ("x-binary", None),
            ("x-suite-index", Some("3")),
        ];
        let received = Received::from_fields(ok, b"p".to_vec()).unwrap();
        assert_eq!(received.id.to_string(), ID);
        assert_eq!(received.tenant_id.as_deref(), Some("acme"));
        assert_eq!(
            received.headers.keys().collect::<Vec<_>>(),
            ["x-suite-index"]
        );
        assert_eq!(received.payload, b"p");

        let not_text = [
            (fields::ID, Some(ID)),
            (fields::IDEMPOTENCY_KEY, Some("k")),
            (fields::EVENT_TYPE, Some("t")),
            (fields::TENANT_ID, None),
        ];
        let e = Received::from_fields(not_text, Vec::new()).unwrap_err();
        assert!(e.to_string().contains("outbox-tenant-id"), "{e}");
        let bad_id = [
            (fields::ID, Some("not-a-uuid")),
            (fields::IDEMPOTENCY_KEY, Some("k")),
            (fields::EVENT_TYPE, Some("t")),
        ];
        assert!(Received::from_fields(bad_id, Vec::new()).is_err());
        for absent in [fields::ID, fields::IDEMPOTENCY_KEY, fields::EVENT_TYPE] {
            let fields = [
                (fields::ID, Some(ID)),
                (fields::IDEMPOTENCY_KEY, Some("k")),
                (fields::EVENT_TYPE, Some("t")),
            ]
            .into_iter()
            .filter(|(name, _)| *name != absent);
            let e = Received::from_fields(fields, Vec::new()).unwrap_err();
            assert!(e.to_string().contains(absent), "{e}");
        }
    }
}
