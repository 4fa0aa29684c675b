//! The consumer's side: the identity of a message this sink published, read back from an
//! AMQP delivery, for deduplication in an inbox.

use lapin::BasicProperties;
use lapin::types::AMQPValue;
use outbox_engine::{Headers, Message, MessageId};

/// The prefix of the headers the sink writes itself; a message header may not use it.
pub const HEADER_PREFIX: &str = "outbox-";

/// Headers RabbitMQ itself adds on the way (quorum queues' delivery count, dead-lettering,
/// shovels and federation); [`Received`] leaves them out of the message's headers.
const BROKER_HEADERS: &[&str] = &[
    "x-delivery-count",
    "x-death",
    "x-first-death-",
    "x-last-death-",
    "x-received-from",
    "x-shovelled",
];

/// The header holding the idempotency key.
pub const IDEMPOTENCY_KEY_HEADER: &str = "outbox-idempotency-key";

/// The sink's own headers for `message`, in this order: `outbox-idempotency-key`, then
/// `outbox-partition-key`, `outbox-tenant-id`, `outbox-aggregate-type`,
/// `outbox-aggregate-id` when the message has them.
pub(crate) fn metadata_headers(message: &Message) -> Vec<(&'static str, &str)> {
    let mut headers = vec![(IDEMPOTENCY_KEY_HEADER, message.idempotency_key.as_str())];
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

/// A message as published by [`AmqpSink`](crate::AmqpSink), read back by a consumer.
///
/// The sink sets the AMQP `message_id` property to the message id, `type` to the event
/// type, `content_type`, `timestamp` (creation, unix seconds) and delivery mode; its own
/// headers carry the idempotency key and, when present, the partition key, tenant and
/// aggregate; every other header is one of the message's headers (`traceparent`, say).
///
/// Record [`idempotency_key`](Self::idempotency_key) in an inbox inside the transaction
/// that handles the message, and acknowledge the delivery after it commits; a redelivery
/// then finds the key and is skipped.
///
/// ```no_run
/// use lapin::message::Delivery;
/// use lapin::options::BasicAckOptions;
/// use outbox_sink_amqp::Received;
/// use outbox_sqlx::postgres::PgInbox;
/// use outbox_sqlx::Delivery as InboxDelivery;
///
/// async fn handle(delivery: Delivery, pool: &sqlx::PgPool, inbox: &PgInbox) -> Result<(), Box<dyn std::error::Error>> {
///     let received = Received::from_delivery(&delivery)?;
///     let mut tx = pool.begin().await?;
///     if inbox.record(&mut tx, "billing", &received.idempotency_key).await? == InboxDelivery::New {
///         // … apply `received.payload` in `tx` …
///     }
///     tx.commit().await?;
///     delivery.ack(BasicAckOptions::default()).await?;
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
    /// The event type (AMQP `type`).
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
    /// The message's own headers: the sink's `outbox-…` headers, the broker's own
    /// (`x-delivery-count`, `x-death`, `x-first-death-…`, `x-last-death-…`,
    /// `x-received-from`, `x-shovelled…`) and any header whose value is not a string are
    /// left out.
    pub headers: Headers,
    /// The payload bytes.
    pub payload: Vec<u8>,
}

/// Why a delivery is not a message of this sink.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not an outbox message: {0}")]
pub struct NotAnOutboxMessage(String);

impl Received {
    /// Reads a consumed delivery.
    ///
    /// # Errors
    ///
    /// [`NotAnOutboxMessage`] when the delivery lacks the message id, the idempotency
    /// key or the event type, or one of the sink's `outbox-…` headers is not a string.
    pub fn from_delivery(delivery: &lapin::message::Delivery) -> Result<Self, NotAnOutboxMessage> {
        Self::from_parts(&delivery.properties, &delivery.data)
    }

    /// Reads a message from its AMQP properties and body (for clients other than lapin's
    /// `Delivery`, or a `basic.get`).
    ///
    /// ```
    /// use lapin::BasicProperties;
    /// use lapin::types::{AMQPValue, FieldTable};
    /// use outbox_sink_amqp::Received;
    ///
    /// let mut headers = FieldTable::default();
    /// headers.insert("outbox-idempotency-key".into(), AMQPValue::LongString("order-42:paid".into()));
    /// headers.insert("traceparent".into(), AMQPValue::LongString("00-4bf9…-01".into()));
    /// let properties = BasicProperties::default()
    ///     .with_message_id("0190f2c4-58a3-7c3e-9a3b-3e1f2d4c5b6a".into())
    ///     .with_type("order.paid".into())
    ///     .with_headers(headers);
    /// let received = Received::from_parts(&properties, b"{}")?;
    /// assert_eq!(received.idempotency_key, "order-42:paid");
    /// assert_eq!(received.headers["traceparent"], "00-4bf9…-01");
    ///
    /// assert!(Received::from_parts(&BasicProperties::default(), b"{}").is_err());
    /// # Ok::<(), outbox_sink_amqp::NotAnOutboxMessage>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As for [`from_delivery`](Self::from_delivery).
    pub fn from_parts(
        properties: &BasicProperties,
        body: &[u8],
    ) -> Result<Self, NotAnOutboxMessage> {
        let missing = |what: &str| NotAnOutboxMessage(format!("no {what}"));
        let id = properties
            .message_id()
            .as_ref()
            .ok_or_else(|| missing("message_id property"))?;
        let id = id
            .as_str()
            .parse::<uuid::Uuid>()
            .map(MessageId::from)
            .map_err(|_| {
                NotAnOutboxMessage(format!("message_id {:?} is not a UUID", id.as_str()))
            })?;
        let event_type = properties
            .kind()
            .as_ref()
            .ok_or_else(|| missing("type property"))?
            .as_str()
            .to_owned();
        let mut received = Self {
            id,
            idempotency_key: String::new(),
            event_type,
            content_type: properties
                .content_type()
                .as_ref()
                .map(|c| c.as_str().to_owned()),
            partition_key: None,
            tenant_id: None,
            aggregate_type: None,
            aggregate_id: None,
            headers: Headers::new(),
            payload: body.to_vec(),
        };
        let mut idempotency_key = None;
        if let Some(table) = properties.headers() {
            for (name, value) in table.inner() {
                let name = name.as_str();
                if BROKER_HEADERS.iter().any(|b| name.starts_with(b)) {
                    continue;
                }
                let text = match value {
                    AMQPValue::LongString(s) => String::from_utf8(s.as_bytes().to_vec()).ok(),
                    AMQPValue::ShortString(s) => Some(s.as_str().to_owned()),
                    _ => None,
                };
                let Some(text) = text else {
                    if name.starts_with(HEADER_PREFIX) {
                        return Err(NotAnOutboxMessage(format!(
                            "header {name:?} is not a string"
                        )));
                    }
                    // Not one the sink wrote (it writes every header as a string).
                    continue;
                };
                match name {
                    IDEMPOTENCY_KEY_HEADER => idempotency_key = Some(text),
                    "outbox-partition-key" => received.partition_key = Some(text),
                    "outbox-tenant-id" => received.tenant_id = Some(text),
                    "outbox-aggregate-type" => received.aggregate_type = Some(text),
                    "outbox-aggregate-id" => received.aggregate_id = Some(text),
                    _ => {
                        received.headers.insert(name.to_owned(), text);
                    }
                }
            }
        }
        received.idempotency_key =
            idempotency_key.ok_or_else(|| missing("outbox-idempotency-key header"))?;
        Ok(received)
    }
}

#[cfg(test)]
mod tests {
    use lapin::types::FieldTable;

    use super::*;

    fn properties(headers: FieldTable) -> BasicProperties {
        BasicProperties::default()
            .with_message_id("0190f2c4-58a3-7c3e-9a3b-3e1f2d4c5b6a".into())
            .with_type("order.paid".into())
            .with_headers(headers)
    }

    #[test]
    fn broker_headers_and_foreign_values_are_left_out() {
        let mut headers = FieldTable::default();
        headers.insert(
            IDEMPOTENCY_KEY_HEADER.into(),
            AMQPValue::LongString("k".into()),
        );
        headers.insert("x-delivery-count".into(), AMQPValue::LongLongInt(2));
        headers.insert(
            "x-first-death-reason".into(),
            AMQPValue::LongString("expired".into()),
        );
        headers.insert("x-death".into(), AMQPValue::FieldArray(Default::default()));
        headers.insert("x-app-flag".into(), AMQPValue::Boolean(true));
        headers.insert("x-suite-index".into(), AMQPValue::LongString("3".into()));
        let received = Received::from_parts(&properties(headers), b"").unwrap();
        assert_eq!(received.idempotency_key, "k");
        assert_eq!(
            received.headers.keys().collect::<Vec<_>>(),
            ["x-suite-index"],
            "only the message's own headers"
        );
    }

    #[test]
    fn a_sink_header_that_is_not_a_string_is_refused() {
        let mut headers = FieldTable::default();
        headers.insert(
            IDEMPOTENCY_KEY_HEADER.into(),
            AMQPValue::LongString("k".into()),
        );
        headers.insert("outbox-tenant-id".into(), AMQPValue::LongInt(7));
        assert!(Received::from_parts(&properties(headers), b"").is_err());
        let bad_id = BasicProperties::default()
            .with_message_id("not-a-uuid".into())
            .with_type("t".into());
        assert!(Received::from_parts(&bad_id, b"").is_err());
    }
}
