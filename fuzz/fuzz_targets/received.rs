//! A message as each sink's receiver reads it off its broker, with hostile headers,
//! attributes and fields: Kafka headers, SQS attributes, Redis stream fields, AMQP
//! properties, NATS headers, MQTT 5 user properties and MQTT 3.1.1 envelopes. Nothing may panic, and what is accepted carries the id it was given.
#![no_main]

use libfuzzer_sys::fuzz_target;
use outbox_engine::NotAnOutboxMessage;
use outbox_engine::receive::Received;
use outbox_fuzz::fields;
use outbox_sink_amqp::client::BasicProperties;
use outbox_sink_amqp::client::types::{AMQPValue, FieldTable, LongString, ShortString};

fuzz_target!(|data: &[u8]| {
    // Up to eight `name=value` pairs, then the payload.
    let parts = fields(data, 9);
    let (payload, pairs) = parts.split_last().expect("at least one field");
    let pairs: Vec<(&str, &str)> = pairs
        .iter()
        .map(|p| p.split_once('=').unwrap_or((p.as_str(), "")))
        .collect();
    let accepted = |result: Result<Received, NotAnOutboxMessage>| {
        if let Ok(received) = result {
            let id = received.id.to_string();
            assert!(
                pairs
                    .iter()
                    .any(|(_, v)| v.parse::<uuid::Uuid>().is_ok_and(|u| u.to_string() == id)),
                "accepted an id that no field gave: {id}"
            );
        }
    };

    accepted(outbox_sink_kafka::read_parts(
        pairs.iter().map(|(k, v)| (*k, Some(v.as_bytes()))),
        payload.as_bytes(),
    ));
    accepted(outbox_sink_sqs::read_parts(
        pairs.iter().map(|(k, v)| (*k, Some(*v))),
        payload,
    ));
    let entry = pairs
        .iter()
        .map(|(k, v)| (*k, v.as_bytes()))
        .chain([("payload", payload.as_bytes())]);
    accepted(outbox_sink_redis::FieldLayout::default().read_entry(entry));

    // AMQP short strings (header names, the message id) hold at most 255 bytes; a broker
    // delivers no longer ones.
    let short = |text: &str| ShortString::from(clip(text, 255).to_owned());
    let mut headers = FieldTable::default();
    for (k, v) in &pairs {
        headers.insert(
            short(k),
            AMQPValue::LongString(LongString::from(v.to_string())),
        );
    }
    let mut properties = BasicProperties::default().with_headers(headers);
    if let Some((_, id)) = pairs.first() {
        properties = properties.with_message_id(short(id));
    }
    accepted(outbox_sink_amqp::read_parts(
        &properties,
        payload.as_bytes(),
    ));

    // NATS headers: names a server would deliver (the client refuses others).
    let mut nats = outbox_sink_nats::client::HeaderMap::new();
    for (k, v) in &pairs {
        if let (Ok(name), Ok(value)) = (
            k.parse::<outbox_sink_nats::client::HeaderName>(),
            v.parse::<outbox_sink_nats::client::HeaderValue>(),
        ) {
            nats.append(name, value);
        }
    }
    accepted(outbox_sink_nats::read_parts(Some(&nats), payload.as_bytes()));

    let mqtt = outbox_sink_mqtt::client::v5::mqttbytes::v5::PublishProperties {
        user_properties: pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Default::default()
    };
    accepted(outbox_sink_mqtt::read_properties(
        Some(&mqtt),
        payload.as_bytes(),
    ));
    // An MQTT 3.1.1 envelope is the payload itself: it must not panic, whatever it holds.
    let _ = outbox_sink_mqtt::read_envelope(payload.as_bytes());
});

/// The longest prefix of `text` of at most `max` bytes that ends on a character boundary.
fn clip(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}
