//! The consumer's side: the identity of a message this sink published, read back from an
//! AMQP delivery, for deduplication in an inbox.

use lapin::BasicProperties;
use lapin::types::AMQPValue;
use outbox_engine::receive::fields;
use outbox_engine::{NotAnOutboxMessage, Received};

/// Headers RabbitMQ itself adds on the way (quorum queues' delivery count, dead-lettering,
/// shovels and federation); [`read_delivery`] leaves them out of the message's headers.
const BROKER_HEADERS: &[&str] = &[
    "x-delivery-count",
    "x-death",
    "x-first-death-",
    "x-last-death-",
    "x-received-from",
    "x-shovelled",
];

/// Reads a consumed delivery that [`AmqpSink`](crate::AmqpSink) published.
///
/// The sink sets the AMQP `message_id` property to the message id, `type` to the event
/// type, `content_type`, `timestamp` (creation, unix seconds) and delivery mode; its own
/// headers carry the idempotency key and, when present, the partition key, tenant and
/// aggregate (the names in [`outbox_engine::receive::fields`]); every other header is one
/// of the message's headers (`traceparent`, say).
///
/// Record [`idempotency_key`](Received::idempotency_key) in an inbox inside the
/// transaction that handles the message, and acknowledge the delivery after it commits;
/// a redelivery then finds the key and is skipped.
///
/// ```no_run
/// use lapin::message::Delivery;
/// use lapin::options::BasicAckOptions;
/// use outbox_sqlx::postgres::PgInbox;
/// use outbox_sqlx::{Delivery as InboxDelivery, Inbox};
///
/// async fn handle(delivery: Delivery, pool: &sqlx::PgPool, inbox: &PgInbox) -> Result<(), Box<dyn std::error::Error>> {
///     let received = outbox_sink_amqp::read_delivery(&delivery)?;
///     let mut tx = pool.begin().await?;
///     if inbox.record(&mut tx, "billing", &received.idempotency_key).await? == InboxDelivery::New {
///         // … apply `received.payload` in `tx` …
///     }
///     tx.commit().await?;
///     delivery.ack(BasicAckOptions::default()).await?;
///     Ok(())
/// }
/// ```
///
/// # Errors
///
/// [`NotAnOutboxMessage`] when the delivery lacks the message id, the idempotency key or
/// the event type, or one of the sink's `outbox-…` headers is not a string.
pub fn read_delivery(delivery: &lapin::message::Delivery) -> Result<Received, NotAnOutboxMessage> {
    read_parts(&delivery.properties, &delivery.data)
}

/// Reads a message from its AMQP properties and body (for clients other than lapin's
/// `Delivery`, or a `basic.get`).
///
/// ```
/// use lapin::BasicProperties;
/// use lapin::types::{AMQPValue, FieldTable};
/// use outbox_sink_amqp::read_parts;
///
/// let mut headers = FieldTable::default();
/// headers.insert("outbox-idempotency-key".into(), AMQPValue::LongString("order-42:paid".into()));
/// headers.insert("traceparent".into(), AMQPValue::LongString("00-4bf9…-01".into()));
/// let properties = BasicProperties::default()
///     .with_message_id("0190f2c4-58a3-7c3e-9a3b-3e1f2d4c5b6a".into())
///     .with_type("order.paid".into())
///     .with_headers(headers);
/// let received = read_parts(&properties, b"{}")?;
/// assert_eq!(received.idempotency_key, "order-42:paid");
/// assert_eq!(received.headers["traceparent"], "00-4bf9…-01");
///
/// assert!(read_parts(&BasicProperties::default(), b"{}").is_err());
/// # Ok::<(), outbox_engine::NotAnOutboxMessage>(())
/// ```
///
/// # Errors
///
/// As for [`read_delivery`].
pub fn read_parts(
    properties: &BasicProperties,
    body: &[u8],
) -> Result<Received, NotAnOutboxMessage> {
    let property = |name: &'static str, value: &Option<lapin::types::ShortString>| {
        value.as_ref().map(|v| (name, Some(v.as_str().to_owned())))
    };
    let mut found: Vec<(&str, Option<String>)> = [
        property(fields::ID, properties.message_id()),
        property(fields::EVENT_TYPE, properties.kind()),
        property(fields::CONTENT_TYPE, properties.content_type()),
    ]
    .into_iter()
    .flatten()
    .collect();
    for (name, value) in properties.headers().iter().flat_map(|t| t.inner()) {
        let name = name.as_str();
        if BROKER_HEADERS.iter().any(|b| name.starts_with(b)) {
            continue;
        }
        let text = match value {
            AMQPValue::LongString(s) => String::from_utf8(s.as_bytes().to_vec()).ok(),
            AMQPValue::ShortString(s) => Some(s.as_str().to_owned()),
            _ => None,
        };
        found.push((name, text));
    }
    Received::from_fields(
        found.iter().map(|(name, value)| (*name, value.as_deref())),
        body.to_vec(),
    )
}

#[cfg(test)]
mod tests {
    use lapin::types::FieldTable;

    use super::*;

    /// The properties of a message with an id, a type, the idempotency key `k` and
    /// `headers`.
    fn properties<'a>(headers: impl IntoIterator<Item = (&'a str, AMQPValue)>) -> BasicProperties {
        let mut table = FieldTable::default();
        table.insert(
            fields::IDEMPOTENCY_KEY.into(),
            AMQPValue::LongString("k".into()),
        );
        for (name, value) in headers {
            table.insert(name.into(), value);
        }
        BasicProperties::default()
            .with_message_id("0190f2c4-58a3-7c3e-9a3b-3e1f2d4c5b6a".into())
            .with_type("order.paid".into())
            .with_headers(table)
    }

    #[test]
    fn broker_headers_and_foreign_values_are_left_out() {
        let headers = [
            ("x-delivery-count", AMQPValue::LongLongInt(2)),
            (
                "x-first-death-reason",
                AMQPValue::LongString("expired".into()),
            ),
            ("x-death", AMQPValue::FieldArray(Default::default())),
            ("x-app-flag", AMQPValue::Boolean(true)),
            ("x-suite-index", AMQPValue::LongString("3".into())),
        ];
        let received = read_parts(&properties(headers), b"").unwrap();
        assert_eq!(received.idempotency_key, "k");
        assert_eq!(
            received.headers.keys().collect::<Vec<_>>(),
            ["x-suite-index"],
            "only the message's own headers"
        );
    }

    #[test]
    fn a_sink_header_that_is_not_a_string_is_refused() {
        let headers = [("outbox-tenant-id", AMQPValue::LongInt(7))];
        assert!(read_parts(&properties(headers), b"").is_err());
        let bad_id = BasicProperties::default()
            .with_message_id("not-a-uuid".into())
            .with_type("t".into());
        assert!(read_parts(&bad_id, b"").is_err());
    }
}
