//! The consumer's side: the identity of a message this sink appended, read back from a
//! stream entry, for deduplication in an inbox.

use std::collections::BTreeMap;

use outbox_engine::receive::fields;
use outbox_engine::{NotAnOutboxMessage, Received};
use redis::Value;
use redis::streams::StreamId;

use crate::config::{FieldLayout, HeaderLayout, METADATA_FIELDS};

impl FieldLayout {
    /// Reads a stream entry's `(field, value)` pairs (from `XREADGROUP`, `XRANGE`, …)
    /// that a [`RedisSink`](crate::RedisSink) with this layout appended.
    ///
    /// Record [`idempotency_key`](Received::idempotency_key) in an inbox inside the
    /// transaction that handles the entry, and `XACK` it after that transaction commits;
    /// a redelivery then finds the key and is skipped. Fields the layout does not name are
    /// left out.
    ///
    /// ```
    /// use outbox_sink_redis::FieldLayout;
    ///
    /// let entry: [(&str, &[u8]); 6] = [
    ///     ("id", b"0190f2c4-58a3-7c3e-9a3b-3e1f2d4c5b6a"),
    ///     ("idempotency_key", b"order-42:paid"),
    ///     ("event_type", b"order.paid"),
    ///     ("content_type", b"application/json"),
    ///     ("h:traceparent", b"00-4bf9-01"),
    ///     ("payload", b"{\"order\":42}"),
    /// ];
    /// let received = FieldLayout::default().read_entry(entry)?;
    /// assert_eq!(received.idempotency_key, "order-42:paid");
    /// assert_eq!(received.headers["traceparent"], "00-4bf9-01");
    /// assert_eq!(received.payload, b"{\"order\":42}");
    ///
    /// assert!(FieldLayout::default().read_entry([("payload", &b"{}"[..])]).is_err());
    /// # Ok::<(), outbox_engine::NotAnOutboxMessage>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`NotAnOutboxMessage`] when the id, idempotency key or event type is missing or not
    /// UTF-8, the id is not a UUID, there is no payload field, or the JSON headers field
    /// does not decode.
    pub fn read_entry<'a>(
        &self,
        entry: impl IntoIterator<Item = (&'a str, &'a [u8])>,
    ) -> Result<Received, NotAnOutboxMessage> {
        let own = [
            (self.id.as_str(), fields::ID),
            (self.idempotency_key.as_str(), fields::IDEMPOTENCY_KEY),
            (self.event_type.as_str(), fields::EVENT_TYPE),
            (self.content_type.as_str(), fields::CONTENT_TYPE),
        ];
        let metadata = [
            fields::PARTITION_KEY,
            fields::TENANT_ID,
            fields::AGGREGATE_TYPE,
            fields::AGGREGATE_ID,
        ];
        let mut found: Vec<(&str, Option<&str>)> = Vec::new();
        let mut headers = BTreeMap::new();
        let mut payload = None;
        for (name, value) in entry {
            let text = std::str::from_utf8(value).ok();
            if name == self.payload {
                payload = Some(value.to_vec());
            } else if let Some((_, canonical)) = own.iter().find(|(n, _)| *n == name) {
                found.push((canonical, text));
            } else if let Some(i) = METADATA_FIELDS.iter().position(|n| *n == name)
                && self.metadata
            {
                found.push((metadata[i], text));
            } else {
                match &self.headers {
                    HeaderLayout::Prefixed { prefix } => {
                        if let (Some(header), Some(text)) =
                            (name.strip_prefix(prefix.as_str()), text)
                        {
                            headers.insert(header.to_owned(), text.to_owned());
                        }
                    }
                    HeaderLayout::Json { field } if name == field => {
                        let json: BTreeMap<String, String> = text
                            .and_then(|t| serde_json::from_str(t).ok())
                            .ok_or_else(|| {
                                NotAnOutboxMessage::new(format!(
                                    "field {field:?} is not a JSON object of strings"
                                ))
                            })?;
                        headers.extend(json);
                    }
                    HeaderLayout::Json { .. } => {}
                }
            }
        }
        let payload = payload
            .ok_or_else(|| NotAnOutboxMessage::new(format!("no {:?} field", self.payload)))?;
        let mut received = Received::from_fields(found, payload)?;
        received.headers = headers;
        Ok(received)
    }
}

/// Reads an entry that a [`RedisSink`](crate::RedisSink) with the default
/// [`FieldLayout`] appended, as the `redis` client returns it (`StreamReadReply`,
/// `StreamRangeReply`): one call from `XREADGROUP` to an inbox. With another layout, use
/// [`FieldLayout::read_stream_entry`].
///
/// ```no_run
/// use outbox_sink_redis::client::AsyncCommands;
/// use outbox_sink_redis::client::streams::{StreamReadOptions, StreamReadReply};
///
/// # async fn consume(mut conn: outbox_sink_redis::client::aio::MultiplexedConnection)
/// # -> Result<(), Box<dyn std::error::Error>> {
/// let options = StreamReadOptions::default().group("billing", "worker-1").count(100);
/// let reply: StreamReadReply = conn.xread_options(&["orders"], &[">"], &options).await?;
/// for entry in reply.keys.iter().flat_map(|key| &key.ids) {
///     let received = outbox_sink_redis::read_stream_entry(entry)?;
///     // record received.idempotency_key in an inbox, handle, commit, then XACK entry.id
/// }
/// # Ok(())
/// # }
/// ```
///
/// # Errors
///
/// As for [`FieldLayout::read_entry`]; also when a field's value is not a string.
pub fn read_stream_entry(entry: &StreamId) -> Result<Received, NotAnOutboxMessage> {
    FieldLayout::default().read_stream_entry(entry)
}

impl FieldLayout {
    /// Reads an entry as the `redis` client returns it (a [`StreamId`] of
    /// `StreamReadReply` or `StreamRangeReply`), appended by a sink with this layout.
    ///
    /// # Errors
    ///
    /// As for [`read_entry`](Self::read_entry); also when a field's value is not a string.
    pub fn read_stream_entry(&self, entry: &StreamId) -> Result<Received, NotAnOutboxMessage> {
        let mut pairs = Vec::with_capacity(entry.map.len());
        for (name, value) in &entry.map {
            let bytes = match value {
                Value::BulkString(bytes) => bytes.as_slice(),
                Value::SimpleString(text) => text.as_bytes(),
                _ => {
                    return Err(NotAnOutboxMessage::new(format!(
                        "field {name:?} of entry {} is not a string",
                        entry.id
                    )));
                }
            };
            pairs.push((name.as_str(), bytes));
        }
        self.read_entry(pairs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &[u8] = b"0190f2c4-58a3-7c3e-9a3b-3e1f2d4c5b6a";

    #[test]
    fn a_json_header_layout_with_renamed_fields_reads_back() {
        let layout = FieldLayout {
            payload: "data".into(),
            event_type: "type".into(),
            headers: HeaderLayout::Json {
                field: "headers".into(),
            },
            ..FieldLayout::default()
        };
        let entry: [(&str, &[u8]); 7] = [
            ("id", ID),
            ("idempotency_key", b"k"),
            ("type", b"t"),
            ("tenant_id", b"acme"),
            ("headers", br#"{"traceparent":"00-1"}"#),
            ("h:ignored", b"x"),
            ("data", &[0xff, 0x00]),
        ];
        let received = layout.read_entry(entry).unwrap();
        assert_eq!(received.event_type, "t");
        assert_eq!(received.tenant_id.as_deref(), Some("acme"));
        assert_eq!(received.headers.len(), 1);
        assert_eq!(received.headers["traceparent"], "00-1");
        assert_eq!(
            received.payload,
            [0xff, 0x00],
            "binary payloads read back as they are"
        );

        let bad_json: [(&str, &[u8]); 5] = [
            ("id", ID),
            ("idempotency_key", b"k"),
            ("type", b"t"),
            ("headers", b"[1]"),
            ("data", b"{}"),
        ];
        assert!(layout.read_entry(bad_json).is_err());
        let not_text: [(&str, &[u8]); 4] = [
            ("id", ID),
            ("idempotency_key", &[0xff]),
            ("type", b"t"),
            ("data", b""),
        ];
        assert!(layout.read_entry(not_text).is_err());
    }

    #[test]
    fn a_client_stream_entry_reads_back_and_a_non_string_field_is_refused() {
        let mut entry = StreamId {
            id: "1-0".into(),
            ..StreamId::default()
        };
        for (name, value) in [
            ("id", ID),
            ("idempotency_key", b"order-7"),
            ("event_type", b"order.paid"),
            ("payload", &[0xff, 0x01]),
        ] {
            entry
                .map
                .insert(name.to_owned(), Value::BulkString(value.to_vec()));
        }
        let received = read_stream_entry(&entry).unwrap();
        assert_eq!(received.idempotency_key, "order-7");
        assert_eq!(received.payload, [0xff, 0x01]);

        entry.map.insert("event_type".into(), Value::Int(3));
        let error = read_stream_entry(&entry).unwrap_err();
        assert!(error.to_string().contains("event_type"), "{error}");
    }
}
