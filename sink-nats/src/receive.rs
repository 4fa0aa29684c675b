//! The consumer's side: the identity of a message this sink published, read back from a
//! NATS message, for deduplication in an inbox.

use async_nats::HeaderMap;
use outbox_engine::{NotAnOutboxMessage, Received};

use crate::sink::NATS_PREFIX;

/// Reads a message that [`NatsSink`](crate::NatsSink) published, as a JetStream consumer
/// (or a core NATS subscriber) received it.
///
/// The sink's headers carry the message id, idempotency key, event type and content
/// type and, when present, the partition key, tenant and aggregate (the names in
/// [`outbox_engine::receive::fields`]); the headers JetStream and NATS set (`Nats-…`)
/// are left out; every other header is one of the message's headers (`traceparent`,
/// say).
///
/// Record [`idempotency_key`](Received::idempotency_key) in an inbox inside the
/// transaction that handles the message, and acknowledge the message after it commits;
/// a redelivery then finds the key and is skipped.
///
/// ```no_run
/// use futures_util::StreamExt;
/// use outbox_sink_nats::client::jetstream;
/// use outbox_sqlx::postgres::PgInbox;
/// use outbox_sqlx::{Delivery, Inbox};
///
/// async fn consume(
///     consumer: jetstream::consumer::PullConsumer,
///     pool: &sqlx::PgPool,
///     inbox: &PgInbox,
/// ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
///     let mut messages = consumer.messages().await?;
///     while let Some(message) = messages.next().await {
///         let message = message?;
///         let received = outbox_sink_nats::read_message(&message)?;
///         let mut tx = pool.begin().await?;
///         if inbox.record(&mut tx, "billing", &received.idempotency_key).await? == Delivery::New {
///             // … apply `received.payload` in `tx` …
///         }
///         tx.commit().await?;
///         message.ack().await?;
///     }
///     Ok(())
/// }
/// ```
///
/// # Errors
///
/// [`NotAnOutboxMessage`] when the message lacks the id, the idempotency key or the
/// event type.
pub fn read_message(message: &async_nats::Message) -> Result<Received, NotAnOutboxMessage> {
    read_parts(message.headers.as_ref(), &message.payload)
}

/// Reads a message from its NATS headers and payload (for a message fetched by sequence,
/// say).
///
/// ```
/// use outbox_sink_nats::client::HeaderMap;
/// use outbox_sink_nats::read_parts;
///
/// let mut headers = HeaderMap::new();
/// headers.insert("outbox-id", "0190f2c4-58a3-7c3e-9a3b-3e1f2d4c5b6a");
/// headers.insert("outbox-idempotency-key", "order-42:paid");
/// headers.insert("outbox-event-type", "order.paid");
/// headers.insert("Nats-Msg-Id", "order-42:paid");
/// headers.insert("traceparent", "00-4bf9…-01");
/// let received = read_parts(Some(&headers), b"{}")?;
/// assert_eq!(received.idempotency_key, "order-42:paid");
/// assert_eq!(received.headers.len(), 1, "only traceparent: Nats-… headers are NATS's own");
///
/// assert!(read_parts(None, b"{}").is_err());
/// # Ok::<(), outbox_engine::NotAnOutboxMessage>(())
/// ```
///
/// # Errors
///
/// As for [`read_message`].
pub fn read_parts(
    headers: Option<&HeaderMap>,
    payload: &[u8],
) -> Result<Received, NotAnOutboxMessage> {
    let fields = headers
        .into_iter()
        .flat_map(HeaderMap::iter)
        .filter_map(|(name, values)| {
            Some((AsRef::<str>::as_ref(name), Some(values.first()?.as_str())))
        })
        .filter(|(name, _)| {
            !name
                .get(..NATS_PREFIX.len())
                .is_some_and(|p| p.eq_ignore_ascii_case(NATS_PREFIX))
        });
    Received::from_fields(fields, payload.to_vec())
}
