//! The consumer's side: the identity of a message this sink published, read back from an
//! MQTT publish (MQTT 5 user properties, or the MQTT 3.1.1 envelope), for deduplication
//! in an inbox.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use outbox_engine::{NotAnOutboxMessage, Received};
use rumqttc::v5::mqttbytes::v5::{Publish, PublishProperties};

/// Reads an MQTT 5 publish that [`MqttSink`](crate::MqttSink) sent, as a subscriber
/// received it from rumqttc's v5 client.
///
/// The sink's user properties carry the message id, idempotency key, event type and
/// content type and, when present, the partition key, tenant and aggregate (the names in
/// [`outbox_engine::receive::fields`]); every other user property is one of the
/// message's headers (`traceparent`, say).
///
/// Subscribe with QoS 1 on a persistent session (`clean_start = false` and a session
/// expiry), so that messages published while the consumer is away wait for it; record
/// [`idempotency_key`](Received::idempotency_key) in an inbox inside the transaction that
/// handles the message, and acknowledge it after the commit (rumqttc's manual acks). A
/// redelivery then finds the key and is skipped.
///
/// ```no_run
/// use outbox_sink_mqtt::client::v5::{Event, EventLoop, mqttbytes::v5::Packet};
/// use outbox_sqlx::postgres::PgInbox;
/// use outbox_sqlx::{Delivery, Inbox};
///
/// async fn consume(
///     mut events: EventLoop,
///     client: outbox_sink_mqtt::client::v5::AsyncClient,
///     pool: &sqlx::PgPool,
///     inbox: &PgInbox,
/// ) -> Result<(), Box<dyn std::error::Error>> {
///     loop {
///         if let Event::Incoming(Packet::Publish(publish)) = events.poll().await? {
///             let received = outbox_sink_mqtt::read_publish(&publish)?;
///             let mut tx = pool.begin().await?;
///             if inbox.record(&mut tx, "billing", &received.idempotency_key).await? == Delivery::New {
///                 // … apply `received.payload` in `tx` …
///             }
///             tx.commit().await?;
///             client.ack(&publish).await?;
///         }
///     }
/// }
/// ```
///
/// # Errors
///
/// [`NotAnOutboxMessage`] when the publish lacks the id, the idempotency key or the event
/// type.
pub fn read_publish(publish: &Publish) -> Result<Received, NotAnOutboxMessage> {
    read_properties(publish.properties.as_ref(), &publish.payload)
}

/// Reads a message from its MQTT 5 properties and payload (for clients other than
/// rumqttc).
///
/// ```
/// use outbox_sink_mqtt::client::v5::mqttbytes::v5::PublishProperties;
/// use outbox_sink_mqtt::read_properties;
///
/// let properties = PublishProperties {
///     user_properties: vec![
///         ("outbox-id".into(), "0190f2c4-58a3-7c3e-9a3b-3e1f2d4c5b6a".into()),
///         ("outbox-idempotency-key".into(), "order-42:paid".into()),
///         ("outbox-event-type".into(), "order.paid".into()),
///         ("traceparent".into(), "00-4bf9…-01".into()),
///     ],
///     ..Default::default()
/// };
/// let received = read_properties(Some(&properties), b"{}")?;
/// assert_eq!(received.idempotency_key, "order-42:paid");
/// assert_eq!(received.headers["traceparent"], "00-4bf9…-01");
/// assert!(read_properties(None, b"{}").is_err());
/// # Ok::<(), outbox_engine::NotAnOutboxMessage>(())
/// ```
///
/// # Errors
///
/// As for [`read_publish`].
pub fn read_properties(
    properties: Option<&PublishProperties>,
    payload: &[u8],
) -> Result<Received, NotAnOutboxMessage> {
    let fields = properties
        .into_iter()
        .flat_map(|p| &p.user_properties)
        .map(|(name, value)| (name.as_str(), Some(value.as_str())));
    Received::from_fields(fields, payload.to_vec())
}

/// Reads a message from the JSON envelope the sink sends over MQTT 3.1.1, which has no
/// properties: `{"fields": {"outbox-id": …, …, "traceparent": …}, "payload": "<base64>"}`.
///
/// ```
/// let envelope = br#"{"fields":{"outbox-id":"0190f2c4-58a3-7c3e-9a3b-3e1f2d4c5b6a",
///     "outbox-idempotency-key":"order-42:paid","outbox-event-type":"order.paid"},
///     "payload":"e30="}"#;
/// let received = outbox_sink_mqtt::read_envelope(envelope)?;
/// assert_eq!(received.payload, b"{}");
/// assert!(outbox_sink_mqtt::read_envelope(b"{}").is_err());
/// # Ok::<(), outbox_engine::NotAnOutboxMessage>(())
/// ```
///
/// # Errors
///
/// [`NotAnOutboxMessage`] when the payload is not such an envelope, or lacks the id, the
/// idempotency key or the event type.
pub fn read_envelope(payload: &[u8]) -> Result<Received, NotAnOutboxMessage> {
    let not = |what: &str| NotAnOutboxMessage::new(format!("not an outbox envelope: {what}"));
    let envelope: serde_json::Value =
        serde_json::from_slice(payload).map_err(|e| not(&e.to_string()))?;
    let fields = envelope
        .get("fields")
        .and_then(serde_json::Value::as_object)
        .ok_or_else(|| not("no `fields` object"))?;
    let body = envelope
        .get("payload")
        .and_then(serde_json::Value::as_str)
        .ok_or_else(|| not("no `payload` string"))?;
    let body = STANDARD
        .decode(body)
        .map_err(|e| not(&format!("`payload` is not base64: {e}")))?;
    Received::from_fields(
        fields
            .iter()
            .map(|(name, value)| (name.as_str(), value.as_str())),
        body,
    )
}

/// The envelope of a message's `fields` and `payload`, as [`read_envelope`] reads it.
pub(crate) fn envelope(fields: &[(String, String)], payload: &[u8]) -> Vec<u8> {
    let fields: serde_json::Map<String, serde_json::Value> = fields
        .iter()
        .map(|(name, value)| (name.clone(), serde_json::Value::String(value.clone())))
        .collect();
    serde_json::to_vec(&serde_json::json!({
        "fields": fields,
        "payload": STANDARD.encode(payload),
    }))
    .expect("a JSON object of strings serialises")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_envelope_reads_back_byte_for_byte() {
        let payload: Vec<u8> = (0..=255).collect();
        let fields = [
            ("outbox-id", "0190f2c4-58a3-7c3e-9a3b-3e1f2d4c5b6a"),
            ("outbox-idempotency-key", "k\"1\n"),
            ("outbox-event-type", "order.paid"),
            ("traceparent", "00-x-01"),
        ]
        .map(|(n, v)| (n.to_owned(), v.to_owned()));
        let received = read_envelope(&envelope(&fields, &payload)).unwrap();
        assert_eq!(received.payload, payload);
        assert_eq!(received.idempotency_key, "k\"1\n");
        assert_eq!(received.headers["traceparent"], "00-x-01");
        assert!(read_envelope(b"not json").is_err());
        assert!(read_envelope(br#"{"fields":{},"payload":"!!"}"#).is_err());
    }
}
