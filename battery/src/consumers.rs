//! Consumers that record every delivery's message id in arrival order, duplicates
//! included: a webhook receiver, and readers of a Redis stream, a RabbitMQ queue, a Kafka
//! topic and an SQS queue on the test servers. Shared by the battery and the CLI tests.

use std::ops::Range;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Every message id received, in arrival order (duplicates included).
pub type Received = Arc<Mutex<Vec<String>>>;

/// How a [`Receiver`] answers; switched while it runs to inject receiver faults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Behaviour {
    /// Records the delivery and answers 204.
    Accept = 0,
    /// Answers 503 and records nothing: the message was not taken.
    Unavailable = 1,
    /// Records the delivery, then answers 204 only after 3 s, longer than a sender with a
    /// short request timeout waits: the sender sees a timeout for a message that arrived.
    Slow = 2,
}

/// A webhook receiver on loopback; see [`Receiver::start`].
#[derive(Debug, Clone)]
pub struct Receiver {
    /// Its URL (`http://127.0.0.1:<port>/hook`).
    pub url: String,
    /// What it accepted.
    pub received: Received,
    behaviour: Arc<AtomicU8>,
}

impl Receiver {
    /// Starts a receiver that records each accepted request's `outbox-message-id` on
    /// arrival and answers after a random delay in `delay_ms`.
    pub async fn start(delay_ms: Range<u64>) -> Self {
        let received: Received = Arc::default();
        let behaviour = Arc::new(AtomicU8::new(Behaviour::Accept as u8));
        let record = received.clone();
        let mode = behaviour.clone();
        let app = axum::Router::new().route(
            "/hook",
            axum::routing::post(move |headers: axum::http::HeaderMap| {
                let record = record.clone();
                let delay = delay_ms.clone();
                let mode = mode.load(Ordering::SeqCst);
                async move {
                    if mode == Behaviour::Unavailable as u8 {
                        return axum::http::StatusCode::SERVICE_UNAVAILABLE;
                    }
                    let id = headers
                        .get("outbox-message-id")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("")
                        .to_owned();
                    record.lock().unwrap().push(id);
                    if mode == Behaviour::Slow as u8 {
                        tokio::time::sleep(Duration::from_secs(3)).await;
                    } else if !delay.is_empty() {
                        tokio::time::sleep(Duration::from_millis(fastrand::u64(delay))).await;
                    }
                    axum::http::StatusCode::NO_CONTENT
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self {
            url,
            received,
            behaviour,
        }
    }

    /// Answers the requests that arrive from now on as `behaviour` says.
    pub fn behave(&self, behaviour: Behaviour) {
        self.behaviour.store(behaviour as u8, Ordering::SeqCst);
    }
}

/// Starts a [`Receiver`] that answers 204 after a random delay in `delay_ms`; returns its
/// URL and what it records.
pub async fn recording_receiver(delay_ms: Range<u64>) -> (String, Received) {
    let receiver = Receiver::start(delay_ms).await;
    (receiver.url, receiver.received)
}

/// A reader of Redis stream `stream` on `url` from its start, recording each entry's
/// `id` field (the message id, in the Redis sink's default layout) on arrival.
pub async fn redis_consumer(url: &str, stream: &str) -> Received {
    let client = redis::Client::open(url).unwrap_or_else(|e| panic!("Redis URL: {e}"));
    let mut redis = match tokio::time::timeout(
        Duration::from_secs(10),
        client.get_multiplexed_async_connection(),
    )
    .await
    {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => outbox_test_support::no_server(
            "Redis",
            "OUTBOX_TEST_REDIS_URL",
            &outbox::redact::url(url),
            e,
        ),
        Err(_) => outbox_test_support::no_server(
            "Redis",
            "OUTBOX_TEST_REDIS_URL",
            &outbox::redact::url(url),
            "timeout",
        ),
    };
    let received: Received = Arc::default();
    let record = received.clone();
    let stream = stream.to_owned();
    tokio::spawn(async move {
        type Reply = Option<Vec<(String, Vec<(String, Vec<(String, Vec<u8>)>)>)>>;
        let mut last = "0".to_owned();
        loop {
            let reply: Result<Reply, _> = redis::cmd("XREAD")
                .arg("COUNT")
                .arg(1000)
                .arg("BLOCK")
                .arg(200)
                .arg("STREAMS")
                .arg(&stream)
                .arg(&last)
                .query_async(&mut redis)
                .await;
            let Ok(reply) = reply else {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            };
            for (_, entries) in reply.unwrap_or_default() {
                for (entry, fields) in entries {
                    let id = fields
                        .iter()
                        .find(|(name, _)| name == "id")
                        .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
                        .unwrap_or_default();
                    record.lock().unwrap().push(id);
                    last = entry;
                }
            }
        }
    });
    received
}

/// A fresh durable queue on the test RabbitMQ (`OUTBOX_TEST_AMQP_URL`) and a consumer
/// that records each delivery's `message_id` on arrival. Returns the broker URL, the
/// queue's name and the record.
pub async fn amqp_consumer() -> (String, String, Received) {
    use outbox::amqp::client::options::{BasicGetOptions, QueueDeclareOptions};
    use outbox::amqp::client::types::FieldTable;
    use outbox::amqp::client::{Connection, ConnectionProperties};

    let url = outbox_test_support::server_url(
        "OUTBOX_TEST_AMQP_URL",
        "amqp://guest:guest@127.0.0.1:5672/outbox-test",
    );
    let connection = match tokio::time::timeout(
        Duration::from_secs(10),
        Connection::connect(&url, ConnectionProperties::default()),
    )
    .await
    {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => outbox_test_support::no_server(
            "RabbitMQ",
            "OUTBOX_TEST_AMQP_URL",
            &outbox::redact::url(&url),
            e,
        ),
        Err(_) => outbox_test_support::no_server(
            "RabbitMQ",
            "OUTBOX_TEST_AMQP_URL",
            &outbox::redact::url(&url),
            "timeout",
        ),
    };
    let channel = connection.create_channel().await.unwrap();
    let queue = format!("outbox-test.cli.{:016x}", fastrand::u64(..));
    channel
        .queue_declare(
            queue.as_str().into(),
            QueueDeclareOptions::durable(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let got: Received = Arc::default();
    let record = got.clone();
    let name = queue.clone();
    tokio::spawn(async move {
        let _connection = connection;
        loop {
            match channel
                .basic_get(name.as_str().into(), BasicGetOptions { no_ack: true })
                .await
            {
                Ok(Some(message)) => {
                    let id = message
                        .delivery
                        .properties
                        .message_id()
                        .as_ref()
                        .map(|id| id.as_str().to_owned())
                        .unwrap_or_default();
                    record.lock().unwrap().push(id);
                }
                Ok(None) => tokio::time::sleep(Duration::from_millis(5)).await,
                Err(_) => return,
            }
        }
    });
    (url, queue, got)
}

/// Deletes a test queue made by [`amqp_consumer`].
pub async fn delete_amqp_queue(url: &str, queue: &str) {
    use outbox::amqp::client::{Connection, ConnectionProperties};
    let connection = Connection::connect(url, ConnectionProperties::default())
        .await
        .unwrap();
    let channel = connection.create_channel().await.unwrap();
    channel
        .queue_delete(queue.into(), Default::default())
        .await
        .unwrap();
}

/// A fresh 3-partition topic on the test Kafka broker (`OUTBOX_TEST_KAFKA_BROKERS`) and a
/// consumer reading every partition from the start that records each record's
/// `outbox-id` header on arrival. Returns the brokers, the topic and the record.
pub async fn kafka_consumer() -> (String, String, Received) {
    use outbox::kafka::client::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use outbox::kafka::client::client::DefaultClientContext;
    use outbox::kafka::client::consumer::{Consumer, StreamConsumer};
    use outbox::kafka::client::message::Headers as _;
    use outbox::kafka::client::{ClientConfig, Message as _, Offset, TopicPartitionList};

    let brokers = outbox_test_support::server_url("OUTBOX_TEST_KAFKA_BROKERS", "127.0.0.1:9092");
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .create()
        .unwrap();
    if let Err(e) = admin.inner().fetch_metadata(None, Duration::from_secs(10)) {
        outbox_test_support::no_server(
            "a Kafka-protocol broker (tansu)",
            "OUTBOX_TEST_KAFKA_BROKERS",
            &brokers,
            e,
        );
    }
    let topic = format!("outbox-test.cli.{:016x}", fastrand::u64(..));
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    for result in admin
        .create_topics(
            [&NewTopic::new(&topic, 3, TopicReplication::Fixed(1))],
            &options,
        )
        .await
        .unwrap()
    {
        result.unwrap();
    }
    outbox_test_support::wait_until(
        "the topic in the metadata",
        Duration::from_secs(20),
        || async {
            admin
                .inner()
                .fetch_metadata(Some(&topic), Duration::from_secs(5))
                .is_ok_and(|m| {
                    m.topics()
                        .first()
                        .is_some_and(|t| t.error().is_none() && t.partitions().len() == 3)
                })
        },
    )
    .await;
    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .set(
            "group.id",
            format!("outbox-test.cli.{:016x}", fastrand::u64(..)),
        )
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let mut assignment = TopicPartitionList::new();
    for partition in 0..3 {
        assignment
            .add_partition_offset(&topic, partition, Offset::Beginning)
            .unwrap();
    }
    consumer.assign(&assignment).unwrap();
    let got: Received = Arc::default();
    let record = got.clone();
    tokio::spawn(async move {
        while let Ok(message) = consumer.recv().await {
            let id = message
                .headers()
                .and_then(|h| {
                    h.iter()
                        .find(|h| h.key == "outbox-id")
                        .and_then(|h| h.value)
                })
                .map(|v| String::from_utf8_lossy(v).into_owned())
                .unwrap_or_default();
            record.lock().unwrap().push(id);
        }
    });
    (brokers, topic, got)
}

/// An SQS emulator of this test's own (moto_server on a free port, ended with the guard),
/// one queue on it, and a consumer that records the `outbox-id` of every message it
/// receives and deletes it. A private emulator, because the shared one slows down with
/// every other test's queues and traffic (moto scans a queue per request).
pub async fn sqs_consumer() -> (outbox_test_support::ChildGuard, String, Received) {
    use outbox::sqs::client::config::{BehaviorVersion, Credentials, Region};
    use outbox::sqs::client::types::DeleteMessageBatchRequestEntry;
    use outbox::sqs::client::{Client, Config};

    let moto = std::env::var("OUTBOX_TEST_MOTO").unwrap_or_else(|_| {
        let home = std::env::var("HOME").unwrap_or_default();
        format!("{home}/.cache/outbox-tools/moto-venv/bin/moto_server")
    });
    assert!(
        std::path::Path::new(&moto).exists(),
        "this test starts its own SQS emulator and found no moto_server at {moto} \
         (set OUTBOX_TEST_MOTO, or run scripts/services.sh, which installs it)"
    );
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let guard = outbox_test_support::ChildGuard::spawn(
        "moto_server",
        std::process::Command::new(&moto)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null()),
    );
    let endpoint = format!("http://127.0.0.1:{port}");
    let client = Client::from_conf(
        Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new("us-east-1"))
            .endpoint_url(&endpoint)
            .credentials_provider(Credentials::new("test", "test", None, None, "tests"))
            .build(),
    );
    let queue_url = outbox_test_support::wait_for(
        &format!("moto_server on {endpoint} to create a queue"),
        Duration::from_secs(30),
        || {
            let client = client.clone();
            async move {
                let created = tokio::time::timeout(
                    Duration::from_secs(5),
                    client.create_queue().queue_name("outbox-test-cli").send(),
                )
                .await;
                match created {
                    Ok(Ok(created)) => created.queue_url().map(str::to_owned),
                    _ => None,
                }
            }
        },
    )
    .await;
    let got: Received = Arc::default();
    let record = got.clone();
    let url = queue_url.clone();
    tokio::spawn(async move {
        loop {
            let Ok(answer) = client
                .receive_message()
                .queue_url(&url)
                .max_number_of_messages(10)
                .message_attribute_names("outbox-id")
                .send()
                .await
            else {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            };
            let messages = answer.messages();
            if messages.is_empty() {
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
            let mut entries = Vec::new();
            for (i, message) in messages.iter().enumerate() {
                let id = message
                    .message_attributes()
                    .and_then(|a| a.get("outbox-id"))
                    .and_then(|v| v.string_value())
                    .unwrap_or_default()
                    .to_owned();
                record.lock().unwrap().push(id);
                entries.push(
                    DeleteMessageBatchRequestEntry::builder()
                        .id(i.to_string())
                        .set_receipt_handle(message.receipt_handle().map(str::to_owned))
                        .build()
                        .unwrap(),
                );
            }
            let _ = client
                .delete_message_batch()
                .queue_url(&url)
                .set_entries(Some(entries))
                .send()
                .await;
        }
    });
    (guard, queue_url, got)
}
