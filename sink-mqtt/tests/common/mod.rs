//! Shared test helpers: where the broker is, a subscriber of its own (rumqttc's v5 client,
//! independently of the sink's code), and a sink that fails loudly without a broker.
#![allow(dead_code, unreachable_pub)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox_engine::testkit::Delivered;
use outbox_sink_mqtt::client::v5::mqttbytes::QoS;
use outbox_sink_mqtt::client::v5::mqttbytes::v5::{Packet, Publish};
use outbox_sink_mqtt::client::v5::{AsyncClient, Event, MqttOptions};
use outbox_sink_mqtt::{
    MqttSink, MqttSinkConfig, MqttSinkError, Protocol, read_envelope, read_publish,
};
use outbox_test_support::{no_server, server_url};

pub const URL_VAR: &str = "OUTBOX_TEST_MQTT_URL";
pub const DEFAULT_URL: &str = "mqtt://127.0.0.1:1883";

/// The test broker, from `OUTBOX_TEST_MQTT_URL` or the default `scripts/services.sh` gives.
pub fn url() -> String {
    server_url(URL_VAR, DEFAULT_URL)
}

/// A topic prefix no other test uses.
pub fn fresh_prefix(name: &str) -> String {
    format!("outbox-test/{name}/{:016x}", fastrand::u64(..))
}

/// A QoS 1 subscriber of `filter` on the broker at `url`, recording every publish it
/// gets (acknowledged on arrival), on a persistent session: after the broker restarts it
/// reconnects, and gets what was published meanwhile.
pub struct Subscriber {
    pub got: Arc<Mutex<Vec<Publish>>>,
    pub client: AsyncClient,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Subscriber {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Subscriber {
    pub async fn start(url: &str, filter: &str) -> Self {
        let address = url::Url::parse(url).unwrap();
        let mut options = MqttOptions::new(
            format!("outbox-test-sub-{:x}", fastrand::u64(..)),
            address.host_str().unwrap(),
            address.port().unwrap_or(1883),
        );
        options
            .set_keep_alive(Duration::from_secs(5))
            .set_clean_start(false)
            .set_session_expiry_interval(Some(600));
        let (client, mut events) = AsyncClient::new(options, 100);
        match tokio::time::timeout(Duration::from_secs(10), events.poll()).await {
            Ok(Ok(Event::Incoming(Packet::ConnAck(_)))) => {}
            Ok(other) => no_server("an MQTT broker", URL_VAR, url, format!("{other:?}")),
            Err(_) => no_server("an MQTT broker", URL_VAR, url, "no CONNACK within 10 s"),
        }
        client.subscribe(filter, QoS::AtLeastOnce).await.unwrap();
        loop {
            match tokio::time::timeout(Duration::from_secs(10), events.poll()).await {
                Ok(Ok(Event::Incoming(Packet::SubAck(_)))) => break,
                Ok(Ok(_)) => {}
                other => panic!("no SUBACK: {other:?}"),
            }
        }
        let got: Arc<Mutex<Vec<Publish>>> = Arc::default();
        let record = Arc::clone(&got);
        let task = tokio::spawn(async move {
            loop {
                match events.poll().await {
                    Ok(Event::Incoming(Packet::Publish(publish))) => {
                        record.lock().unwrap().push(publish);
                    }
                    Ok(_) => {}
                    Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            }
        });
        Self { got, client, task }
    }

    /// What arrived so far, decoded as the protocol's consumers decode it.
    pub fn delivered(&self, protocol: Protocol) -> Vec<Delivered> {
        self.got
            .lock()
            .unwrap()
            .iter()
            .map(|publish| delivered(publish, protocol))
            .collect()
    }

    /// Waits up to 10 s for at least `n` publishes.
    pub async fn wait_for(&self, n: usize) -> Vec<Publish> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let got = self.got.lock().unwrap().clone();
            if got.len() >= n || tokio::time::Instant::now() >= deadline {
                return got;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// A publish as the sink suite compares it.
pub fn delivered(publish: &Publish, protocol: Protocol) -> Delivered {
    let received = match protocol {
        Protocol::V311 => read_envelope(&publish.payload),
        _ => read_publish(publish),
    }
    .expect("an outbox message");
    Delivered::from(received)
}

/// Connects a sink; a missing broker fails the test with instructions.
pub async fn sink(config: MqttSinkConfig) -> MqttSink {
    let url = config.url.clone();
    match MqttSink::connect(config).await {
        Ok(sink) => sink,
        Err(
            e @ MqttSinkError::Connect {
                retryable: true, ..
            },
        ) => no_server("an MQTT broker", URL_VAR, &url, e),
        Err(e) => panic!("sink did not start: {e}"),
    }
}
