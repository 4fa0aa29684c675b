//! `mqtt`: the relay publishing to an MQTT broker (mosquitto) against a raw rumqttc loop
//! with the same acknowledgement settings (MQTT 5, QoS 1, each message's `PUBACK`
//! awaited), the same messages (the sink's user properties, payload) and the same number
//! of messages in flight (batch × concurrent publishers) on one connection. The relay
//! drains a PostgreSQL backlog (delete on publish) and an in-memory one.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering as Atomic};
use std::time::{Duration, Instant};

use outbox_sink_mqtt::client::v5::mqttbytes::QoS;
use outbox_sink_mqtt::client::v5::mqttbytes::v5::{Packet, PublishProperties};
use outbox_sink_mqtt::client::v5::{AsyncClient, Event, MqttOptions};
use outbox_sink_mqtt::{MqttSink, MqttSinkConfig};

use crate::Scale;
use crate::report::Report;
use crate::setup::{Bench, BoxError};
use crate::sinks::{BATCH, PUBLISHERS, SinkRounds, drain_rate};

pub(crate) async fn run(bench: &Bench, scale: Scale, report: &mut Report) -> Result<(), BoxError> {
    let url = std::env::var("OUTBOX_TEST_MQTT_URL")
        .unwrap_or_else(|_| "mqtt://127.0.0.1:1883".to_owned());
    let topic = format!("outbox-bench/{:016x}", fastrand::u64(..));
    let sink = MqttSink::connect(MqttSinkConfig::new(&url).topic(topic.clone()))
        .await
        .map_err(|e| format!("{e}; run scripts/services.sh or set OUTBOX_TEST_MQTT_URL"))?;

    let n = scale.drain_rows / 2;
    let mut rounds = SinkRounds::default();
    for _ in 0..scale.rounds.max(2) {
        rounds.raw.push(raw(&url, &topic, n).await?);
        rounds
            .relay
            .push(drain_rate(bench, sink.clone(), n, false, false).await?);
        rounds
            .memory
            .push(drain_rate(bench, sink.clone(), n, true, false).await?);
    }
    report.section(
        "mqtt",
        &format!("{n} messages over MQTT 5 with QoS 1 to one mosquitto topic with no subscriber, each marked on its PUBACK, batch {BATCH}, {PUBLISHERS} concurrent publishers on one connection, messages/s (median of {} interleaved rounds). Relay = a backlog drained by the relay through `MqttSink`, from PostgreSQL (delete on publish) or from the in-memory store; raw = a rumqttc v5 loop publishing the same prebuilt messages with the same user properties, at most {} unacknowledged at a time, until every PUBACK arrived. mosquitto, PostgreSQL and the benchmark share the machine's cores.", rounds.relay.len(), BATCH * PUBLISHERS),
        &["raw rumqttc loop", "relay, PostgreSQL store", "relay / raw", "relay, in-memory store", "relay / raw"],
        vec![rounds.row()],
        rounds.json(n),
    );
    Ok(())
}

/// The same messages the relay sends, published with QoS 1 on one connection with at
/// most `BATCH × PUBLISHERS` unacknowledged; messages per second until the last `PUBACK`.
async fn raw(url: &str, topic: &str, n: usize) -> Result<f64, BoxError> {
    let address = url::Url::parse(url)?;
    let mut options = MqttOptions::new(
        format!("outbox-bench-raw-{:x}", fastrand::u64(..)),
        address.host_str().unwrap_or("127.0.0.1"),
        address.port().unwrap_or(1883),
    );
    options.set_keep_alive(Duration::from_secs(30));
    let (client, mut events) = AsyncClient::new(options, 1_000);
    // One permit per message in flight; each PUBACK gives one back.
    let window = Arc::new(tokio::sync::Semaphore::new(BATCH * PUBLISHERS));
    let acked = Arc::new(AtomicUsize::new(0));
    let (counting, freed) = (Arc::clone(&acked), Arc::clone(&window));
    let driver = tokio::spawn(async move {
        loop {
            match events.poll().await {
                Ok(Event::Incoming(Packet::PubAck(_))) => {
                    counting.fetch_add(1, Atomic::Relaxed);
                    freed.add_permits(1);
                }
                Ok(_) => {}
                Err(e) => return Err::<(), String>(e.to_string()),
            }
        }
    });
    let messages: Vec<(PublishProperties, bytes::Bytes)> = (0..n)
        .map(|i| {
            let id = uuid::Uuid::now_v7().to_string();
            let properties = PublishProperties {
                content_type: Some("application/json".to_owned()),
                user_properties: vec![
                    ("outbox-id".to_owned(), id.clone()),
                    ("outbox-idempotency-key".to_owned(), id),
                    ("outbox-event-type".to_owned(), "bench.event".to_owned()),
                    (
                        "outbox-content-type".to_owned(),
                        "application/json".to_owned(),
                    ),
                ],
                ..PublishProperties::default()
            };
            let payload = serde_json::to_vec(&serde_json::json!({ "n": i })).expect("json");
            (properties, payload.into())
        })
        .collect();
    let started = Instant::now();
    for (properties, payload) in messages {
        window.acquire().await?.forget();
        client
            .publish_with_properties(topic, QoS::AtLeastOnce, false, payload, properties)
            .await?;
    }
    while acked.load(Atomic::Relaxed) < n {
        if driver.is_finished() {
            return Err(format!("the raw MQTT connection failed: {:?}", driver.await).into());
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let rate = n as f64 / started.elapsed().as_secs_f64();
    driver.abort();
    Ok(rate)
}
