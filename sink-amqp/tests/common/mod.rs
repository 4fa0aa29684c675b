//! Shared test helpers: where RabbitMQ is, a lapin connection for setting up topology and
//! reading back (independently of the sink's code), and `rabbitmqctl`.
#![allow(dead_code, unreachable_pub)]

use std::process::Command;
use std::time::Duration;

use lapin::options::{
    BasicGetOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};
use outbox_engine::testkit::Delivered;
use outbox_sink_amqp::client as lapin;
use outbox_sink_amqp::{AmqpSink, AmqpSinkConfig, AmqpSinkError, read_delivery};
use outbox_test_support::{no_server, output_within, server_url};

pub const URL_VAR: &str = "OUTBOX_TEST_AMQP_URL";
pub const DEFAULT_URL: &str = "amqp://guest:guest@127.0.0.1:5672/outbox-test";
pub const VHOST: &str = "outbox-test";

/// The test broker, from `OUTBOX_TEST_AMQP_URL` or the default `scripts/services.sh` gives.
pub fn url() -> String {
    server_url(URL_VAR, DEFAULT_URL)
}

/// A name no other test uses.
pub fn fresh_name(prefix: &str) -> String {
    format!("outbox-test.{prefix}.{:016x}", fastrand::u64(..))
}

/// The test side of the broker: one connection and channel, failing loudly without RabbitMQ.
pub struct Broker {
    pub connection: Connection,
    pub channel: Channel,
}

impl Broker {
    pub async fn connect() -> Self {
        let url = url();
        let properties =
            ConnectionProperties::default().with_connection_name("outbox-test-reader".into());
        let connection = match tokio::time::timeout(
            Duration::from_secs(10),
            Connection::connect(&url, properties),
        )
        .await
        {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => no_server("RabbitMQ", URL_VAR, &outbox_engine::redact::url(&url), e),
            Err(_) => no_server(
                "RabbitMQ",
                URL_VAR,
                &outbox_engine::redact::url(&url),
                "connection timed out",
            ),
        };
        let channel = connection.create_channel().await.expect("a channel");
        Self {
            connection,
            channel,
        }
    }

    /// A fresh durable queue (deleted by [`cleanup`](Self::cleanup)).
    pub async fn queue(&self, prefix: &str) -> String {
        let name = fresh_name(prefix);
        self.declare_queue(&name, QueueDeclareOptions::durable())
            .await;
        name
    }

    /// Declares the queue `name`.
    pub async fn declare_queue(&self, name: &str, options: QueueDeclareOptions) {
        self.channel
            .queue_declare(name.into(), options, FieldTable::default())
            .await
            .expect("declare queue");
    }

    /// A fresh topic exchange, bound to `queue` with `pattern` when given.
    pub async fn exchange(&self, prefix: &str, bind: Option<(&str, &str)>) -> String {
        let name = fresh_name(prefix);
        self.channel
            .exchange_declare(
                name.as_str().into(),
                ExchangeKind::Topic,
                ExchangeDeclareOptions {
                    durable: true,
                    ..ExchangeDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .expect("declare exchange");
        if let Some((queue, pattern)) = bind {
            self.channel
                .queue_bind(
                    queue.into(),
                    name.as_str().into(),
                    pattern.into(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await
                .expect("bind queue");
        }
        name
    }

    /// Takes every message now in `queue` (acknowledging each), in queue order.
    pub async fn take(&self, queue: &str) -> Vec<lapin::message::Delivery> {
        let mut got = Vec::new();
        while let Some(message) = self
            .channel
            .basic_get(queue.into(), BasicGetOptions { no_ack: true })
            .await
            .expect("basic.get")
        {
            got.push(message.delivery);
        }
        got
    }

    /// Deletes test queues and exchanges.
    pub async fn cleanup(&self, queues: &[String], exchanges: &[String]) {
        for queue in queues {
            let _ = self
                .channel
                .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
                .await;
        }
        for exchange in exchanges {
            let _ = self
                .channel
                .exchange_delete(exchange.as_str().into(), Default::default())
                .await;
        }
    }
}

/// A delivery as the sink suite compares it, decoded with the crate's consumer helper.
pub fn delivered(delivery: &lapin::message::Delivery) -> Delivered {
    let received = read_delivery(delivery).expect("an outbox message");
    Delivered::from(received)
}

/// A header of a delivery as text.
pub fn header(delivery: &lapin::message::Delivery, name: &str) -> Option<String> {
    let table = delivery.properties.headers().as_ref()?;
    match table.inner().get(name)? {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        other => panic!("header {name} is {other:?}"),
    }
}

/// Connects a sink; a missing server fails the test with instructions.
pub async fn sink(config: AmqpSinkConfig) -> AmqpSink {
    let url = config.url.clone();
    match AmqpSink::connect(config).await {
        Ok(sink) => sink,
        Err(e @ AmqpSinkError::Connect { .. }) => {
            no_server("RabbitMQ", URL_VAR, &outbox_engine::redact::url(&url), e)
        }
        Err(e) => panic!("sink did not start: {e}"),
    }
}

/// Runs `rabbitmqctl ARGS` (as root, which the test machines are), panicking on failure.
pub fn rabbitmqctl(args: &[&str]) -> String {
    let out = output_within(
        "rabbitmqctl",
        Duration::from_secs(60),
        Command::new("rabbitmqctl").args(args),
    );
    assert!(
        out.status.success(),
        "rabbitmqctl {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Closes, from the broker's side, every connection whose name starts with `prefix`;
/// returns how many it closed.
pub fn close_connections(prefix: &str) -> usize {
    let listing = rabbitmqctl(&[
        "-q",
        "list_connections",
        "--no-table-headers",
        "pid",
        "client_properties",
    ]);
    let mut closed = 0;
    for line in listing.lines() {
        // `<rabbit@host.1.2.3>` then the client properties, `{"connection_name","…"}` among them.
        let Some(end) = line.find('>') else {
            continue;
        };
        let (pid, properties) = (&line[..=end], &line[end + 1..]);
        if properties.contains(&format!("{{\"connection_name\",\"{prefix}")) {
            rabbitmqctl(&["close_connection", pid, "closed by the outbox test"]);
            closed += 1;
        }
    }
    assert!(closed > 0, "no connection named {prefix}… in:\n{listing}");
    closed
}
