//! The consumer's side: the identity of a message this sink appended, read back from a
//! stream entry, for deduplication in an inbox.

use std::collections::BTreeMap;

use outbox_engine::receive::fields;
use outbox_engine::{NotAnOutboxMessage, Received};

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
}
