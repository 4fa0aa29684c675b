//! Consumers that record every delivery's message id in arrival order, duplicates
//! included: a webhook receiver, and readers of a Redis stream, a RabbitMQ queue, a Kafka
//! topic, an SQS queue, a NATS JetStream stream and an MQTT topic on the test servers.
//! Shared by the battery and the CLI tests.

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
    app: axum::Router,
    addr: std::net::SocketAddr,
    server: Arc<Mutex<Option<Server>>>,
}

/// A receiver's server: its own runtime on its own thread, so that stopping it drops
/// every connection at once, as a crashed process would.
#[derive(Debug)]
struct Server {
    stop: tokio::sync::oneshot::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

impl Server {
    fn start(listener: std::net::TcpListener, app: axum::Router) -> Self {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("the receiver's runtime");
            runtime.block_on(async move {
                listener
                    .set_nonblocking(true)
                    .expect("a non-blocking listener");
                let listener = tokio::net::TcpListener::from_std(listener).expect("a listener");
                // Only a restart stops it: a receiver whose handle was dropped (only its
                // URL and record kept) serves on.
                tokio::select! {
                    _ = axum::serve(listener, app) => {}
                    Ok(()) = stopped => {}
                }
            });
            // Dropping the runtime drops the listener and every open connection.
        });
        Self { stop, thread }
    }
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
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        Self {
            url: format!("http://{addr}/hook"),
            received,
            behaviour,
            server: Arc::new(Mutex::new(Some(Server::start(listener, app.clone())))),
            app,
            addr,
        }
    }

    /// Answers the requests that arrive from now on as `behaviour` says.
    pub fn behave(&self, behaviour: Behaviour) {
        self.behaviour.store(behaviour as u8, Ordering::SeqCst);
    }

    /// Stops the receiver as a crash would (its listener and every connection closed,
    /// requests in flight unanswered), and starts it again on the same port after `down`.
    /// What it recorded stays: a receiver that stores a delivery before answering.
    pub async fn restart(&self, down: Duration) {
        let server = self.server.lock().unwrap().take();
        if let Some(server) = server {
            let _ = server.stop.send(());
            tokio::task::spawn_blocking(move || server.thread.join())
                .await
                .expect("join the receiver's thread")
                .expect("the receiver's thread panicked");
        }
        tokio::time::sleep(down).await;
        let addr = self.addr;
        let listener = outbox_test_support::wait_for(
            &format!("the receiver's port {addr} to be free again"),
            Duration::from_secs(10),
            || async move { std::net::TcpListener::bind(addr).ok() },
        )
        .await;
        *self.server.lock().unwrap() = Some(Server::start(listener, self.app.clone()));
    }
}

/// Starts a [`Receiver`] that answers 204 after a random delay in `delay_ms`; returns its
/// URL and what it records.
pub async fn recording_receiver(delay_ms: Range<u64>) -> (String, Received) {
    let receiver = Receiver::start(delay_ms).await;
    (receiver.url, receiver.received)
}

/// A reader of Redis stream `stream` on `url` from its start, recording each entry's
/// `id` field (the message id, in the Redis sink's default layout) on arrival. It
/// reconnects when the server goes away, and reads on from the last entry it recorded.
pub async fn redis_consumer(url: &str, stream: &str) -> Received {
    let client = redis::Client::open(url).unwrap_or_else(|e| panic!("Redis URL: {e}"));
    let connect = |client: redis::Client| async move {
        tokio::time::timeout(
            Duration::from_secs(10),
            client.get_multiplexed_async_connection(),
        )
        .await
        .map_err(|_| "timeout".to_owned())?
        .map_err(|e| e.to_string())
    };
    let mut redis = match connect(client.clone()).await {
        Ok(c) => c,
        Err(e) => outbox_test_support::no_server(
            "Redis",
            "OUTBOX_TEST_REDIS_URL",
            &outbox::redact::url(url),
            e,
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
                if let Ok(fresh) = connect(client.clone()).await {
                    redis = fresh;
                }
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

/// A `redis-server` of the battery's own on a free loopback port, with an AOF fsynced
/// before each write is acknowledged, in a private directory: a restarted server still
/// holds every entry it acknowledged, so a message a restart loses is the relay's fault.
/// Killed when dropped.
#[derive(Debug)]
pub struct RedisServer {
    /// `redis://127.0.0.1:<port>/`.
    pub url: String,
    port: u16,
    dir: std::path::PathBuf,
    process: Mutex<Option<outbox_test_support::ChildGuard>>,
}

impl RedisServer {
    /// Starts a server with its data in `dir`.
    ///
    /// # Panics
    ///
    /// If `redis-server` is not installed or does not answer within 10 s.
    pub async fn start(dir: &std::path::Path) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let server = Self {
            url: format!("redis://127.0.0.1:{port}/"),
            port,
            dir: dir.join("redis"),
            process: Mutex::new(None),
        };
        std::fs::create_dir_all(&server.dir).expect("the Redis directory");
        server.spawn().await;
        server
    }

    /// Stops the server, by SIGKILL when `crash`, else by SIGTERM (a clean shutdown), and
    /// starts it again on the same port and data after `down`.
    pub async fn restart(&self, down: Duration, crash: bool) {
        let process = self.process.lock().unwrap().take();
        if let Some(mut process) = process {
            tokio::task::spawn_blocking(move || {
                if crash {
                    process.kill();
                } else {
                    process.terminate(Duration::from_secs(10));
                }
            })
            .await
            .expect("stop redis-server");
        }
        tokio::time::sleep(down).await;
        self.spawn().await;
    }

    async fn spawn(&self) {
        let program = "/usr/bin/redis-server";
        assert!(
            std::path::Path::new(program).exists(),
            "the battery starts its own Redis and found no {program} \
             (run scripts/services.sh, which installs redis-server)"
        );
        let process = outbox_test_support::ChildGuard::spawn(
            format!("redis-server on port {}", self.port),
            std::process::Command::new(program)
                .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
                .args([
                    "--save",
                    "",
                    "--appendonly",
                    "yes",
                    "--appendfsync",
                    "always",
                ])
                .args(["--dir", &self.dir.display().to_string()])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null()),
        );
        *self.process.lock().unwrap() = Some(process);
        let client = redis::Client::open(self.url.as_str()).unwrap();
        outbox_test_support::wait_until(
            &format!("redis-server on port {} to answer", self.port),
            Duration::from_secs(10),
            || {
                let client = client.clone();
                async move {
                    let Ok(mut redis) = client.get_multiplexed_async_connection().await else {
                        return false;
                    };
                    redis::cmd("PING")
                        .query_async::<String>(&mut redis)
                        .await
                        .is_ok()
                }
            },
        )
        .await;
    }
}

/// A fresh durable queue on the test RabbitMQ (`OUTBOX_TEST_AMQP_URL`) and a consumer
/// that records each delivery's `message_id` on arrival. It reconnects when the broker
/// closes its connection (a restart). Returns the broker URL, the queue's name and the
/// record.
pub async fn amqp_consumer() -> (String, String, Received) {
    use outbox::amqp::client::options::{BasicAckOptions, BasicGetOptions, QueueDeclareOptions};
    use outbox::amqp::client::types::FieldTable;
    use outbox::amqp::client::{Channel, Connection, ConnectionProperties};

    async fn open(url: &str) -> Result<(Connection, Channel), String> {
        let connection = tokio::time::timeout(
            Duration::from_secs(10),
            Connection::connect(url, ConnectionProperties::default()),
        )
        .await
        .map_err(|_| "timeout".to_owned())?
        .map_err(|e| e.to_string())?;
        let channel = tokio::time::timeout(Duration::from_secs(10), connection.create_channel())
            .await
            .map_err(|_| "timeout".to_owned())?
            .map_err(|e| e.to_string())?;
        Ok((connection, channel))
    }

    let url = outbox_test_support::server_url(
        "OUTBOX_TEST_AMQP_URL",
        "amqp://guest:guest@127.0.0.1:5672/outbox-test",
    );
    let (connection, channel) = match open(&url).await {
        Ok(opened) => opened,
        Err(e) => outbox_test_support::no_server(
            "RabbitMQ",
            "OUTBOX_TEST_AMQP_URL",
            &outbox::redact::url(&url),
            e,
        ),
    };
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
    let (name, address) = (queue.clone(), url.clone());
    tokio::spawn(async move {
        let mut open_channel = Some((connection, channel));
        loop {
            let Some((_connection, channel)) = open_channel.take() else {
                tokio::time::sleep(Duration::from_millis(200)).await;
                open_channel = open(&address).await.ok();
                continue;
            };
            // Every call has a deadline: a call on a connection the broker's restart
            // left half-open would otherwise wait for good.
            let within = Duration::from_secs(5);
            loop {
                let got = tokio::time::timeout(
                    within,
                    channel.basic_get(name.as_str().into(), BasicGetOptions { no_ack: false }),
                )
                .await;
                match got {
                    // Acknowledged once recorded: a message whose acknowledgement a
                    // restart lost comes again, as a duplicate, never as a loss.
                    Ok(Ok(Some(message))) => {
                        let id = message
                            .delivery
                            .properties
                            .message_id()
                            .as_ref()
                            .map(|id| id.as_str().to_owned())
                            .unwrap_or_default();
                        record.lock().unwrap().push(id);
                        let acked =
                            tokio::time::timeout(within, message.ack(BasicAckOptions::default()))
                                .await;
                        if !matches!(acked, Ok(Ok(_))) {
                            break;
                        }
                    }
                    Ok(Ok(None)) => tokio::time::sleep(Duration::from_millis(5)).await,
                    _ => break,
                }
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

/// A fresh JetStream stream (file storage, a two-minute duplicate window, messages kept
/// for an hour, so that a run that ends early leaves nothing for good) binding `NAME.>`
/// on the NATS server at `url`, and a durable pull consumer that records each
/// message's `outbox-id` header on arrival and acknowledges it after. It carries on
/// through server restarts (the client reconnects; a broken fetch is started again).
/// Returns the stream's name (also the first token of its subjects) and the record.
pub async fn nats_consumer(url: &str) -> (String, Received) {
    use futures_util::StreamExt;
    use outbox::nats::client::jetstream::{self, consumer, stream};

    let client =
        match tokio::time::timeout(Duration::from_secs(10), outbox::nats::client::connect(url))
            .await
        {
            Ok(Ok(client)) => client,
            Ok(Err(e)) => outbox_test_support::no_server("NATS", "OUTBOX_TEST_NATS_URL", url, e),
            Err(_) => {
                outbox_test_support::no_server("NATS", "OUTBOX_TEST_NATS_URL", url, "timeout")
            }
        };
    let js = jetstream::new(client);
    let name = format!("BATTERY_{:016X}", fastrand::u64(..));
    js.create_stream(stream::Config {
        name: name.clone(),
        subjects: vec![format!("{name}.>")],
        storage: stream::StorageType::File,
        duplicate_window: Duration::from_secs(120),
        max_age: Duration::from_secs(3600),
        ..Default::default()
    })
    .await
    .expect("create the battery's stream");
    let consumer: consumer::PullConsumer = js
        .create_consumer_on_stream(
            consumer::pull::Config {
                durable_name: Some("battery".to_owned()),
                ack_policy: consumer::AckPolicy::Explicit,
                ..Default::default()
            },
            &name,
        )
        .await
        .expect("create the battery's consumer");
    let got: Received = Arc::default();
    let record = got.clone();
    tokio::spawn(async move {
        loop {
            let Ok(mut messages) = consumer.messages().await else {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            };
            while let Some(Ok(message)) = messages.next().await {
                let id = message
                    .headers
                    .as_ref()
                    .and_then(|h| h.get("outbox-id"))
                    .map(|v| v.as_str().to_owned())
                    .unwrap_or_default();
                record.lock().unwrap().push(id);
                // Acknowledged once recorded: a lost acknowledgement makes a duplicate.
                let _ = message.ack().await;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    (name, got)
}

/// Deletes a stream made by [`nats_consumer`].
pub async fn delete_nats_stream(url: &str, stream: &str) {
    if let Ok(client) = outbox::nats::client::connect(url).await {
        let _ = outbox::nats::client::jetstream::new(client)
            .delete_stream(stream)
            .await;
    }
}

/// A QoS 1 subscriber of `TOPIC/#` on the MQTT broker at `url` (MQTT 5, a persistent
/// session, so that what is published while the broker restarts waits for it) that
/// records each message's `outbox-id` user property on arrival. Returns the topic
/// prefix and the record.
pub async fn mqtt_consumer(url: &str) -> (String, Received) {
    use outbox::mqtt::client::v5::mqttbytes::QoS;
    use outbox::mqtt::client::v5::mqttbytes::v5::Packet;
    use outbox::mqtt::client::v5::{AsyncClient, Event, MqttOptions};

    let address = url::Url::parse(url).expect("an mqtt:// URL");
    let topic = format!("battery/{:016x}", fastrand::u64(..));
    let mut options = MqttOptions::new(
        format!("outbox-battery-{:x}", fastrand::u64(..)),
        address.host_str().unwrap_or("127.0.0.1"),
        address.port().unwrap_or(1883),
    );
    options
        .set_keep_alive(Duration::from_secs(5))
        .set_clean_start(false)
        .set_session_expiry_interval(Some(3600))
        // Many messages in flight to it at once, so that it keeps up with a fast relay.
        .set_receive_maximum(Some(1000));
    let (client, mut events) = AsyncClient::new(options, 100);
    match tokio::time::timeout(Duration::from_secs(10), events.poll()).await {
        Ok(Ok(Event::Incoming(Packet::ConnAck(_)))) => {}
        Ok(other) => outbox_test_support::no_server(
            "an MQTT broker",
            "OUTBOX_TEST_MQTT_URL",
            url,
            format!("{other:?}"),
        ),
        Err(_) => outbox_test_support::no_server(
            "an MQTT broker",
            "OUTBOX_TEST_MQTT_URL",
            url,
            "no CONNACK within 10 s",
        ),
    }
    client
        .subscribe(format!("{topic}/#"), QoS::AtLeastOnce)
        .await
        .expect("subscribe");
    loop {
        match tokio::time::timeout(Duration::from_secs(10), events.poll()).await {
            Ok(Ok(Event::Incoming(Packet::SubAck(_)))) => break,
            Ok(Ok(_)) => {}
            other => panic!("no SUBACK from the MQTT broker: {other:?}"),
        }
    }
    let got: Received = Arc::default();
    let record = got.clone();
    tokio::spawn(async move {
        // Keeps the client (and its request channel) alive as long as the loop runs.
        let _client = client;
        loop {
            match events.poll().await {
                Ok(Event::Incoming(Packet::Publish(publish))) => {
                    let id = outbox::mqtt::read_publish(&publish)
                        .map(|received| received.id.to_string())
                        .unwrap_or_default();
                    record.lock().unwrap().push(id);
                }
                Ok(_) => {}
                // The broker is away: the next poll reconnects, resuming the session.
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    });
    (topic, got)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    /// Posts a delivery with message id `id` on `stream`; returns the status line.
    async fn post(stream: &mut TcpStream, id: &str) -> std::io::Result<String> {
        let request = format!(
            "POST /hook HTTP/1.1\r\nhost: receiver\r\noutbox-message-id: {id}\r\ncontent-length: 0\r\n\r\n"
        );
        stream.write_all(request.as_bytes()).await?;
        let mut answer = Vec::new();
        let mut chunk = [0; 512];
        while !answer.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = stream.read(&mut chunk).await?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            answer.extend_from_slice(&chunk[..n]);
        }
        let text = String::from_utf8_lossy(&answer).into_owned();
        Ok(text.lines().next().unwrap_or_default().to_owned())
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_restarted_receiver_drops_its_connections_and_then_answers_again() {
        tokio::time::timeout(Duration::from_secs(30), async {
            let receiver = Receiver::start(0..0).await;
            let addr = receiver.addr;
            let mut kept = TcpStream::connect(addr).await.unwrap();
            assert_eq!(
                post(&mut kept, "a").await.unwrap(),
                "HTTP/1.1 204 No Content"
            );

            let restarting = receiver.clone();
            let restart = tokio::spawn(async move {
                restarting.restart(Duration::from_millis(500)).await;
            });
            tokio::time::sleep(Duration::from_millis(200)).await;
            assert!(
                TcpStream::connect(addr).await.is_err(),
                "a connection was accepted while the receiver was down"
            );
            assert!(
                post(&mut kept, "lost").await.is_err(),
                "a connection opened before the restart still answered"
            );

            restart.await.unwrap();
            let mut fresh = TcpStream::connect(addr).await.unwrap();
            assert_eq!(
                post(&mut fresh, "b").await.unwrap(),
                "HTTP/1.1 204 No Content"
            );
            assert_eq!(*receiver.received.lock().unwrap(), ["a", "b"]);
        })
        .await
        .expect("the test took over 30 s");
    }
}
