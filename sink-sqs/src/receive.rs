//! The message layout on SQS — body and message attributes — and the consumer's side:
//! the identity of a message this sink published, read back for deduplication in an inbox.

use std::collections::BTreeMap;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use outbox_engine::receive::fields::PREFIX as ATTRIBUTE_PREFIX;
use outbox_engine::receive::metadata_fields;
use outbox_engine::{Failure, FailureClass, Message, NotAnOutboxMessage, Received};

use crate::config::Binary;

/// The attribute holding the message's headers as one JSON object, when they do not fit
/// one attribute each.
pub const HEADERS_ATTRIBUTE: &str = "outbox-headers";

/// The attribute saying the body is base64 (value `base64`).
pub const BODY_ENCODING_ATTRIBUTE: &str = "outbox-body-encoding";

/// How many message attributes SQS takes per message.
pub const MAX_ATTRIBUTES: usize = 10;

/// The data type of every attribute the sink writes.
const STRING: &str = "String";

/// A message laid out for SQS.
#[derive(Debug)]
pub(crate) struct Layout {
    pub(crate) body: String,
    pub(crate) attributes: Vec<(String, String)>,
    /// What SQS counts against `MaximumMessageSize`: the body, and each attribute's name,
    /// data type and value, in bytes.
    pub(crate) size: usize,
}

/// Whether SQS accepts `text` in a body or attribute value: tab, LF, CR, and U+0020 to
/// U+10FFFF without the surrogates, U+FFFE and U+FFFF.
pub(crate) fn is_sqs_text(text: &str) -> bool {
    text.chars().all(|c| {
        matches!(c, '\t' | '\n' | '\r' | ' '..='\u{D7FF}' | '\u{E000}'..='\u{FFFD}' | '\u{10000}'..)
    })
}

/// Whether `name` can be an attribute name: up to 256 ASCII letters, digits, `_`, `-`
/// and `.`, no `..`, not starting or ending with `.`, not starting with `AWS.` or
/// `Amazon.`.
fn is_attribute_name(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    (1..=256).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
        && !name.contains("..")
        && !name.starts_with('.')
        && !name.ends_with('.')
        && !lower.starts_with("aws.")
        && !lower.starts_with("amazon.")
}

fn unfit(what: &str) -> Failure {
    Failure::permanent(
        FailureClass::Serialization,
        format!("{what} holds characters SQS refuses (control characters, U+FFFE, U+FFFF)"),
    )
}

/// Lays `message` out: the body, the sink's attributes, then the message's headers — one
/// attribute each when they all fit in [`MAX_ATTRIBUTES`] and are legal names with
/// non-empty values, otherwise together in [`HEADERS_ATTRIBUTE`].
pub(crate) fn layout(message: &Message, binary: Binary) -> Result<Layout, Failure> {
    if message.idempotency_key.is_empty() || message.event_type.is_empty() {
        return Err(Failure::permanent(
            FailureClass::Serialization,
            "the idempotency key and the event type must not be empty",
        ));
    }
    if let Some(name) = message
        .headers
        .keys()
        .find(|n| n.to_ascii_lowercase().starts_with(ATTRIBUTE_PREFIX))
    {
        return Err(Failure::permanent(
            FailureClass::Serialization,
            format!(
                "header {name:?} uses the prefix {ATTRIBUTE_PREFIX:?}, which the sink reserves for its own attributes"
            ),
        ));
    }
    let id = message.id.to_string();
    let mut attributes: Vec<(String, String)> = metadata_fields(message, &id)
        .into_iter()
        .filter(|(_, value)| !value.is_empty())
        .map(|(name, value)| (name.to_owned(), value.to_owned()))
        .collect();
    if let Some((name, _)) = attributes.iter().find(|(_, v)| !is_sqs_text(v)) {
        return Err(unfit(&format!("attribute {name:?}")));
    }
    if message.payload.is_empty() {
        return Err(Failure::permanent(
            FailureClass::Serialization,
            "the payload is empty and SQS refuses an empty body",
        ));
    }
    let body = match std::str::from_utf8(&message.payload) {
        Ok(text) if is_sqs_text(text) => text.to_owned(),
        _ if binary == Binary::Base64 => {
            attributes.push((BODY_ENCODING_ATTRIBUTE.to_owned(), "base64".to_owned()));
            BASE64.encode(&message.payload)
        }
        _ => {
            return Err(Failure::permanent(
                FailureClass::Serialization,
                "the payload is not text SQS accepts (UTF-8 without control characters); set `binary = \"base64\"` on the route to send it encoded",
            ));
        }
    };
    let one_each = attributes.len() + message.headers.len() <= MAX_ATTRIBUTES
        && message
            .headers
            .iter()
            .all(|(name, value)| is_attribute_name(name) && !value.is_empty());
    if one_each {
        for (name, value) in &message.headers {
            if !is_sqs_text(value) {
                return Err(unfit(&format!("header {name:?}")));
            }
            attributes.push((name.clone(), value.clone()));
        }
    } else {
        let json = serde_json::to_string(&message.headers).expect("a string map is JSON");
        if !is_sqs_text(&json) {
            return Err(unfit("a header"));
        }
        attributes.push((HEADERS_ATTRIBUTE.to_owned(), json));
    }
    let size = body.len()
        + attributes
            .iter()
            .map(|(name, value)| name.len() + STRING.len() + value.len())
            .sum::<usize>();
    Ok(Layout {
        body,
        attributes,
        size,
    })
}

/// Reads a message that [`SqsSink`](crate::SqsSink) sent, from `ReceiveMessage` (asked
/// with `message_attribute_names("All")`).
///
/// The sink writes the id, idempotency key, event type and content type, and when
/// present the partition key, tenant and aggregate, as `outbox-…` String attributes (the
/// names in [`outbox_engine::receive::fields`]). The message's headers (`traceparent`,
/// say) are attributes of their own names when they fit SQS's limit of 10 attributes,
/// otherwise one JSON object in `outbox-headers`; a body sent as base64 is decoded.
///
/// Record [`idempotency_key`](Received::idempotency_key) in an inbox inside the
/// transaction that handles the message, and delete the SQS message after that
/// transaction commits; a redelivery then finds the key and is skipped.
///
/// ```no_run
/// use outbox_sqlx::postgres::PgInbox;
/// use outbox_sqlx::{Delivery, Inbox};
///
/// async fn handle(
///     sqs: &aws_sdk_sqs::Client,
///     queue_url: &str,
///     pool: &sqlx::PgPool,
///     inbox: &PgInbox,
/// ) -> Result<(), Box<dyn std::error::Error>> {
///     let answer = sqs
///         .receive_message()
///         .queue_url(queue_url)
///         .message_attribute_names("All")
///         .send()
///         .await?;
///     for message in answer.messages() {
///         let received = outbox_sink_sqs::read_message(message)?;
///         let mut tx = pool.begin().await?;
///         if inbox.record(&mut tx, "billing", &received.idempotency_key).await? == Delivery::New {
///             // … apply `received.payload` in `tx` …
///         }
///         tx.commit().await?;
///         sqs.delete_message()
///             .queue_url(queue_url)
///             .set_receipt_handle(message.receipt_handle().map(str::to_owned))
///             .send()
///             .await?;
///     }
///     Ok(())
/// }
/// ```
///
/// # Errors
///
/// [`NotAnOutboxMessage`] when the id, idempotency key or event type attribute is
/// missing, one of the sink's attributes is not a string, or the headers or base64 body
/// do not decode.
pub fn read_message(message: &aws_sdk_sqs::types::Message) -> Result<Received, NotAnOutboxMessage> {
    let attributes = message
        .message_attributes()
        .into_iter()
        .flatten()
        .map(|(name, value)| (name.as_str(), value.string_value()));
    read_parts(attributes, message.body().unwrap_or_default())
}

/// Reads a message from its attributes (name, String value; `None` for another data
/// type) and body, for other clients (a Lambda event's `messageAttributes`, say).
///
/// ```
/// use outbox_sink_sqs::read_parts;
///
/// let attributes = [
///     ("outbox-id", Some("0190f2c4-58a3-7c3e-9a3b-3e1f2d4c5b6a")),
///     ("outbox-idempotency-key", Some("order-42:paid")),
///     ("outbox-event-type", Some("order.paid")),
///     ("traceparent", Some("00-4bf9-01")),
/// ];
/// let received = read_parts(attributes, "{}")?;
/// assert_eq!(received.idempotency_key, "order-42:paid");
/// assert_eq!(received.headers["traceparent"], "00-4bf9-01");
///
/// assert!(read_parts([], "{}").is_err());
/// # Ok::<(), outbox_engine::NotAnOutboxMessage>(())
/// ```
///
/// # Errors
///
/// As for [`read_message`].
pub fn read_parts<'a>(
    attributes: impl IntoIterator<Item = (&'a str, Option<&'a str>)>,
    body: &str,
) -> Result<Received, NotAnOutboxMessage> {
    let attributes: Vec<_> = attributes.into_iter().collect();
    let mut received = Received::from_fields(attributes.iter().copied(), Vec::new())?;
    let mut base64 = false;
    for (name, value) in attributes {
        match (name, value) {
            (BODY_ENCODING_ATTRIBUTE, Some("base64")) => base64 = true,
            (BODY_ENCODING_ATTRIBUTE, other) => {
                return Err(NotAnOutboxMessage::new(format!(
                    "unknown body encoding {other:?}"
                )));
            }
            (HEADERS_ATTRIBUTE, Some(json)) => {
                let headers: BTreeMap<String, String> =
                    serde_json::from_str(json).map_err(|e| {
                        NotAnOutboxMessage::new(format!(
                            "{HEADERS_ATTRIBUTE} is not a JSON object of strings: {e}"
                        ))
                    })?;
                received.headers.extend(headers);
            }
            _ => {}
        }
    }
    received.payload = if base64 {
        BASE64
            .decode(body)
            .map_err(|e| NotAnOutboxMessage::new(format!("the base64 body does not decode: {e}")))?
    } else {
        body.as_bytes().to_vec()
    };
    Ok(received)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Utc;
    use outbox_engine::NewMessage;

    fn message(headers: usize) -> Message {
        let mut builder = NewMessage::builder("billing", "invoice.paid")
            .json(&serde_json::json!({ "n": 1 }))
            .partition_key("invoice-7")
            .tenant_id("acme")
            .aggregate("invoice", "7");
        for i in 0..headers {
            builder = builder.header(format!("x-h{i}"), format!("v{i}"));
        }
        builder.build().unwrap().into_message(Utc::now())
    }

    fn round_trip(layout: &Layout) -> Received {
        let attributes = layout
            .attributes
            .iter()
            .map(|(n, v)| (n.as_str(), Some(v.as_str())));
        read_parts(attributes, &layout.body).unwrap()
    }

    #[test]
    fn headers_take_the_free_attributes_or_go_together_as_json() {
        // 8 metadata attributes leave room for 2 headers.
        let two = message(2);
        let laid = layout(&two, Binary::Refuse).unwrap();
        assert_eq!(laid.attributes.len(), 10);
        assert!(
            laid.attributes
                .iter()
                .any(|(n, v)| n == "x-h1" && v == "v1")
        );
        assert_eq!(round_trip(&laid).headers, two.headers);

        let three = message(3);
        let laid = layout(&three, Binary::Refuse).unwrap();
        assert_eq!(laid.attributes.len(), 9);
        assert_eq!(laid.attributes.last().unwrap().0, HEADERS_ATTRIBUTE);
        let received = round_trip(&laid);
        assert_eq!(received.headers, three.headers);
        assert_eq!(received.tenant_id.as_deref(), Some("acme"));
        assert_eq!(received.aggregate_id.as_deref(), Some("7"));
        assert_eq!(received.payload, three.payload);

        let many = message(40);
        assert!(layout(&many, Binary::Refuse).unwrap().attributes.len() <= MAX_ATTRIBUTES);
    }

    #[test]
    fn header_names_sqs_refuses_go_into_the_json() {
        let mut m = message(0);
        m.headers.insert("AWS.trace".into(), "1".into());
        let laid = layout(&m, Binary::Refuse).unwrap();
        assert_eq!(laid.attributes.last().unwrap().0, HEADERS_ATTRIBUTE);
        assert_eq!(round_trip(&laid).headers, m.headers);
        m.headers.clear();
        m.headers.insert("x-empty".into(), String::new());
        let laid = layout(&m, Binary::Refuse).unwrap();
        assert_eq!(round_trip(&laid).headers, m.headers);
    }

    #[test]
    fn text_sqs_refuses_is_refused_or_encoded() {
        let mut m = message(0);
        m.payload = vec![0, 1, 2, 0xff];
        let refused = layout(&m, Binary::Refuse).unwrap_err();
        assert!(!refused.retryable && refused.class == FailureClass::Serialization);
        let encoded = layout(&m, Binary::Base64).unwrap();
        assert_eq!(round_trip(&encoded).payload, m.payload);

        m.payload = "bell \u{7} in text".into();
        assert!(layout(&m, Binary::Refuse).is_err());
        m.payload = "\u{FFFE}".into();
        assert!(layout(&m, Binary::Refuse).is_err());
        m.payload = "tab\tand ünïcødé 🎉\r\n".into();
        assert!(layout(&m, Binary::Refuse).is_ok());
        m.payload = Vec::new();
        for binary in [Binary::Refuse, Binary::Base64] {
            let empty = layout(&m, binary).unwrap_err();
            assert!(
                !empty.retryable && empty.message.contains("empty"),
                "{}",
                empty.message
            );
        }

        m.tenant_id = Some("acme\u{1}".into());
        let e = layout(&m, Binary::Refuse).unwrap_err();
        assert!(e.message.contains("outbox-tenant-id"), "{}", e.message);
    }

    #[test]
    fn reserved_header_names_are_refused() {
        let mut m = message(0);
        m.headers.insert("Outbox-Id".into(), "x".into());
        let e = layout(&m, Binary::Refuse).unwrap_err();
        assert!(e.message.contains("reserves"), "{}", e.message);
    }

    #[test]
    fn size_counts_body_names_types_and_values() {
        let m = message(0);
        let l = layout(&m, Binary::Refuse).unwrap();
        let expected = l.body.len()
            + l.attributes
                .iter()
                .map(|(n, v)| n.len() + 6 + v.len())
                .sum::<usize>();
        assert_eq!(l.size, expected);
    }

    #[test]
    fn foreign_messages_are_not_outbox_messages() {
        assert!(read_parts([("traceparent", Some("x"))], "{}").is_err());
        let bad_json = [
            (
                outbox_engine::receive::fields::ID,
                Some("0190f2c4-58a3-7c3e-9a3b-3e1f2d4c5b6a"),
            ),
            (outbox_engine::receive::fields::IDEMPOTENCY_KEY, Some("k")),
            ("outbox-event-type", Some("t")),
            (HEADERS_ATTRIBUTE, Some("[1]")),
        ];
        assert!(read_parts(bad_json, "{}").is_err());
    }
}
