//! The consumer's side: the identity of a message this sink published, read back from a
//! Kafka record, for deduplication in an inbox.

use outbox_engine::{Headers, Message, MessageId};
use rdkafka::message::Headers as _;

/// The prefix of the headers the sink writes itself; a message header may not use it.
pub const HEADER_PREFIX: &str = "outbox-";

/// The header holding the message id.
pub const ID_HEADER: &str = "outbox-id";

/// The header holding the idempotency key.
pub const IDEMPOTENCY_KEY_HEADER: &str = "outbox-idempotency-key";

/// The sink's own headers for `message`, in this order: `outbox-id`,
/// `outbox-idempotency-key`, `outbox-event-type`, `outbox-content-type`, then
/// `outbox-partition-key`, `outbox-tenant-id`, `outbox-aggregate-type`,
/// `outbox-aggregate-id` when the message has them.
pub(crate) fn metadata_headers<'a>(
    message: &'a Message,
    id: &'a str,
) -> Vec<(&'static str, &'a str)> {
    let mut headers = vec![
        (ID_HEADER, id),
        (IDEMPOTENCY_KEY_HEADER, message.idempotency_key.as_str()),
        ("outbox-event-type", message.event_type.as_str()),
        ("outbox-content-type", message.content_type.as_str()),
    ];
    for (name, value) in [
        ("outbox-partition-key", &message.partition_key),
        ("outbox-tenant-id", &message.tenant_id),
        ("outbox-aggregate-type", &message.aggregate_type),
        ("outbox-aggregate-id", &message.aggregate_id),
    ] {
        if let Some(value) = value {
            headers.push((name, value.as_str()));
        }
    }
    headers
}

/// A message as published by [`KafkaSink`](crate::KafkaSink), read back by a consumer.
///
/// The sink writes the id, idempotency key, event type and content type, and when
/// present the partition key, tenant and aggregate, as `outbox-…` headers; every other
/// header is one of the message's headers (`traceparent`, say). The record's key is the
/// partition key (or, for unkeyed messages, nothing or the id, as the route says).
///
/// Record [`idempotency_key`](Self::idempotency_key) in an inbox inside the transaction
/// that handles the message, and commit the consumer's offset after that transaction
/// commits; a redelivery then finds the key and is skipped.
///
/// ```no_run
/// use rdkafka::consumer::{Consumer, StreamConsumer};
/// use outbox_sink_kafka::Received;
/// use outbox_sqlx::postgres::PgInbox;
/// use outbox_sqlx::Delivery;
///
/// async fn handle(consumer: &StreamConsumer, pool: &sqlx::PgPool, inbox: &PgInbox) -> Result<(), Box<dyn std::error::Error>> {
///     let record = consumer.recv().await?;
///     let received = Received::from_record(&record)?;
///     let mut tx = pool.begin().await?;
///     if inbox.record(&mut tx, "billing", &received.idempotency_key).await? == Delivery::New {
///         // … apply `received.payload` in `tx` …
///     }
///     tx.commit().await?;
///     consumer.commit_message(&record, rdkafka::consumer::CommitMode::Async)?;
///     Ok(())
/// }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Received {
    /// The outbox message id.
    pub id: MessageId,
    /// The idempotency key: the same on every delivery of this message.
    pub idempotency_key: String,
    /// The event type.
    pub event_type: String,
    /// The content type, if the publisher set one.
    pub content_type: Option<String>,
    /// The partition key, if the message had one.
    pub partition_key: Option<String>,
    /// The tenant, if the message had one.
    pub tenant_id: Option<String>,
    /// The aggregate type, if the message had one.
    pub aggregate_type: Option<String>,
    /// The aggregate id, if the message had one.
    pub aggregate_id: Option<String>,
    /// The message's own headers: the sink's `outbox-…` headers and headers whose value
    /// is missing or not UTF-8 are left out.
    pub headers: Headers,
    /// The payload bytes (empty for a record without a value).
    pub payload: Vec<u8>,
}

/// Why a record is not a message of this sink.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not an outbox message: {0}")]
pub struct NotAnOutboxMessage(String);

impl Received {
    /// Reads a consumed record (a `BorrowedMessage` or an `OwnedMessage`).
    ///
    /// # Errors
    ///
    /// [`NotAnOutboxMessage`] when the record lacks the id, idempotency key or event type
    /// header, or one of the sink's `outbox-…` headers is not UTF-8.
    pub fn from_record<M: rdkafka::Message>(record: &M) -> Result<Self, NotAnOutboxMessage> {
        let headers = record.headers().map(|headers| {
            (0..headers.count())
                .map(|i| {
                    let header = headers.get(i);
                    (header.key, header.value)
                })
                .collect::<Vec<_>>()
        });
        Self::from_parts(
            headers.unwrap_or_default(),
            record.payload().unwrap_or_default(),
        )
    }

    /// Reads a message from its headers (name, value) and payload, for clients other
    /// than rdkafka.
    ///
    /// ```
    /// use outbox_sink_kafka::Received;
    ///
    /// let headers: [(&str, Option<&[u8]>); 4] = [
    ///     ("outbox-id", Some(b"0190f2c4-58a3-7c3e-9a3b-3e1f2d4c5b6a")),
    ///     ("outbox-idempotency-key", Some(b"order-42:paid")),
    ///     ("outbox-event-type", Some(b"order.paid")),
    ///     ("traceparent", Some(b"00-4bf9-01")),
    /// ];
    /// let received = Received::from_parts(headers, b"{}")?;
    /// assert_eq!(received.idempotency_key, "order-42:paid");
    /// assert_eq!(received.headers["traceparent"], "00-4bf9-01");
    ///
    /// assert!(Received::from_parts([], b"{}").is_err());
    /// # Ok::<(), outbox_sink_kafka::NotAnOutboxMessage>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As for [`from_record`](Self::from_record).
    pub fn from_parts<'a>(
        headers: impl IntoIterator<Item = (&'a str, Option<&'a [u8]>)>,
        payload: &[u8],
    ) -> Result<Self, NotAnOutboxMessage> {
        let missing = |what: &str| NotAnOutboxMessage(format!("no {what} header"));
        let (mut id, mut idempotency_key, mut event_type) = (None, None, None);
        let mut received = Self {
            id: MessageId::from_uuid(uuid::Uuid::nil()),
            idempotency_key: String::new(),
            event_type: String::new(),
            content_type: None,
            partition_key: None,
            tenant_id: None,
            aggregate_type: None,
            aggregate_id: None,
            headers: Headers::new(),
            payload: payload.to_vec(),
        };
        for (name, value) in headers {
            let text = value.and_then(|v| std::str::from_utf8(v).ok());
            let Some(text) = text.map(str::to_owned) else {
                if name.starts_with(HEADER_PREFIX) {
                    return Err(NotAnOutboxMessage(format!(
                        "header {name:?} is missing its value or is not UTF-8"
                    )));
                }
                continue;
            };
            match name {
                ID_HEADER => id = Some(text),
                IDEMPOTENCY_KEY_HEADER => idempotency_key = Some(text),
                "outbox-event-type" => event_type = Some(text),
                "outbox-content-type" => received.content_type = Some(text),
                "outbox-partition-key" => received.partition_key = Some(text),
                "outbox-tenant-id" => received.tenant_id = Some(text),
                "outbox-aggregate-type" => received.aggregate_type = Some(text),
                "outbox-aggregate-id" => received.aggregate_id = Some(text),
                _ if name.starts_with(HEADER_PREFIX) => {}
                _ => {
                    received.headers.insert(name.to_owned(), text);
                }
            }
        }
        let id = id.ok_or_else(|| missing(ID_HEADER))?;
        received.id = id
            .parse::<uuid::Uuid>()
            .map(MessageId::from_uuid)
            .map_err(|_| NotAnOutboxMessage(format!("{ID_HEADER} {id:?} is not a UUID")))?;
        received.idempotency_key =
            idempotency_key.ok_or_else(|| missing(IDEMPOTENCY_KEY_HEADER))?;
        received.event_type = event_type.ok_or_else(|| missing("outbox-event-type"))?;
        Ok(received)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &[u8] = b"0190f2c4-58a3-7c3e-9a3b-3e1f2d4c5b6a";

    #[test]
    fn foreign_headers_without_text_are_left_out_and_sink_headers_must_be_text() {
        let ok: [(&str, Option<&[u8]>); 6] = [
            (ID_HEADER, Some(ID)),
            (IDEMPOTENCY_KEY_HEADER, Some(b"k")),
            ("outbox-event-type", Some(b"t")),
            ("x-binary", Some(&[0xff, 0xfe])),
            ("x-null", None),
            ("x-suite-index", Some(b"3")),
        ];
        let received = Received::from_parts(ok, b"").unwrap();
        assert_eq!(
            received.headers.keys().collect::<Vec<_>>(),
            ["x-suite-index"]
        );

        let bad: [(&str, Option<&[u8]>); 4] = [
            (ID_HEADER, Some(ID)),
            (IDEMPOTENCY_KEY_HEADER, Some(b"k")),
            ("outbox-event-type", Some(b"t")),
            ("outbox-tenant-id", Some(&[0xff])),
        ];
        assert!(Received::from_parts(bad, b"").is_err());
        let bad_id: [(&str, Option<&[u8]>); 3] = [
            (ID_HEADER, Some(b"not-a-uuid")),
            (IDEMPOTENCY_KEY_HEADER, Some(b"k")),
            ("outbox-event-type", Some(b"t")),
        ];
        assert!(Received::from_parts(bad_id, b"").is_err());
    }
}
