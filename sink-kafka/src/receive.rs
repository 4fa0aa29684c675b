//! The consumer's side: the identity of a message this sink published, read back from a
//! Kafka record, for deduplication in an inbox.

use outbox_engine::{NotAnOutboxMessage, Received};
use rdkafka::message::Headers as _;

/// Reads a consumed record (a `BorrowedMessage` or an `OwnedMessage`) that
/// [`KafkaSink`](crate::KafkaSink) published.
///
/// The sink writes the id, idempotency key, event type and content type, and when
/// present the partition key, tenant and aggregate, as `outbox-…` headers (the names in
/// [`outbox_engine::receive::fields`]); every other header is one of the message's
/// headers (`traceparent`, say). The record's key is the partition key (or, for unkeyed
/// messages, nothing or the id, as the route says).
///
/// Record [`idempotency_key`](Received::idempotency_key) in an inbox inside the
/// transaction that handles the message, and commit the consumer's offset after that
/// transaction commits; a redelivery then finds the key and is skipped.
///
/// ```no_run
/// use rdkafka::consumer::{Consumer, StreamConsumer};
/// use outbox_sqlx::postgres::PgInbox;
/// use outbox_sqlx::{Delivery, Inbox};
///
/// async fn handle(consumer: &StreamConsumer, pool: &sqlx::PgPool, inbox: &PgInbox) -> Result<(), Box<dyn std::error::Error>> {
///     let record = consumer.recv().await?;
///     let received = outbox_sink_kafka::read_record(&record)?;
///     let mut tx = pool.begin().await?;
///     if inbox.record(&mut tx, "billing", &received.idempotency_key).await? == Delivery::New {
///         // … apply `received.payload` in `tx` …
///     }
///     tx.commit().await?;
///     consumer.commit_message(&record, rdkafka::consumer::CommitMode::Async)?;
///     Ok(())
/// }
/// ```
///
/// # Errors
///
/// [`NotAnOutboxMessage`] when the record lacks the id, idempotency key or event type
/// header, or one of the sink's `outbox-…` headers is not UTF-8.
pub fn read_record<M: rdkafka::Message>(record: &M) -> Result<Received, NotAnOutboxMessage> {
    let headers = record.headers().map(|headers| {
        (0..headers.count())
            .map(|i| {
                let header = headers.get(i);
                (header.key, header.value)
            })
            .collect::<Vec<_>>()
    });
    read_parts(
        headers.unwrap_or_default(),
        record.payload().unwrap_or_default(),
    )
}

/// Reads a message from its headers (name, value) and payload, for clients other than
/// rdkafka.
///
/// ```
/// use outbox_sink_kafka::read_parts;
///
/// let headers: [(&str, Option<&[u8]>); 4] = [
///     ("outbox-id", Some(b"0190f2c4-58a3-7c3e-9a3b-3e1f2d4c5b6a")),
///     ("outbox-idempotency-key", Some(b"order-42:paid")),
///     ("outbox-event-type", Some(b"order.paid")),
///     ("traceparent", Some(b"00-4bf9-01")),
/// ];
/// let received = read_parts(headers, b"{}")?;
/// assert_eq!(received.idempotency_key, "order-42:paid");
/// assert_eq!(received.headers["traceparent"], "00-4bf9-01");
///
/// assert!(read_parts([], b"{}").is_err());
/// # Ok::<(), outbox_engine::NotAnOutboxMessage>(())
/// ```
///
/// # Errors
///
/// As for [`read_record`].
pub fn read_parts<'a>(
    headers: impl IntoIterator<Item = (&'a str, Option<&'a [u8]>)>,
    payload: &[u8],
) -> Result<Received, NotAnOutboxMessage> {
    let text = headers
        .into_iter()
        .map(|(name, value)| (name, value.and_then(|v| std::str::from_utf8(v).ok())));
    Received::from_fields(text, payload.to_vec())
}

#[cfg(test)]
mod tests {
    use outbox_engine::receive::fields;

    use super::*;

    const ID: &[u8] = b"0190f2c4-58a3-7c3e-9a3b-3e1f2d4c5b6a";

    #[test]
    fn foreign_headers_without_text_are_left_out_and_sink_headers_must_be_text() {
        let ok: [(&str, Option<&[u8]>); 6] = [
            (fields::ID, Some(ID)),
            (fields::IDEMPOTENCY_KEY, Some(b"k")),
            ("outbox-event-type", Some(b"t")),
            ("x-binary", Some(&[0xff, 0xfe])),
            ("x-null", None),
            ("x-suite-index", Some(b"3")),
        ];
        let received = read_parts(ok, b"").unwrap();
        assert_eq!(
            received.headers.keys().collect::<Vec<_>>(),
            ["x-suite-index"]
        );

        let bad: [(&str, Option<&[u8]>); 4] = [
            (fields::ID, Some(ID)),
            (fields::IDEMPOTENCY_KEY, Some(b"k")),
            ("outbox-event-type", Some(b"t")),
            ("outbox-tenant-id", Some(&[0xff])),
        ];
        assert!(read_parts(bad, b"").is_err());
        let bad_id: [(&str, Option<&[u8]>); 3] = [
            (fields::ID, Some(b"not-a-uuid")),
            (fields::IDEMPOTENCY_KEY, Some(b"k")),
            ("outbox-event-type", Some(b"t")),
        ];
        assert!(read_parts(bad_id, b"").is_err());
    }
}
