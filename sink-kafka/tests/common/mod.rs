//! Shared test helpers: where the Kafka-protocol broker is, an admin client and readers
//! built on rdkafka directly (independently of the sink's code), and private tansu
//! brokers that a test starts, stops and restarts itself.
#![allow(dead_code, unreachable_pub)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use outbox_engine::testkit::Delivered;
use outbox_sink_kafka::client as rdkafka;
use outbox_sink_kafka::{KafkaSink, KafkaSinkConfig, read_record};
use outbox_test_support::{ChildGuard, no_server, server_url};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::OwnedMessage;
use rdkafka::{ClientConfig, Message as _, Offset, TopicPartitionList};

pub const BROKERS_VAR: &str = "OUTBOX_TEST_KAFKA_BROKERS";
pub const DEFAULT_BROKERS: &str = "127.0.0.1:9092";

/// The test broker's address, from `OUTBOX_TEST_KAFKA_BROKERS` or the default
/// `scripts/services.sh` gives.
pub fn brokers() -> String {
    server_url(BROKERS_VAR, DEFAULT_BROKERS)
}

/// The sink URL for the test broker.
pub fn url() -> String {
    format!("kafka://{}", brokers())
}

/// A topic name no other test uses.
pub fn fresh_name(prefix: &str) -> String {
    format!("outbox-test.{prefix}.{:016x}", fastrand::u64(..))
}

/// A connected sink, failing the test with the error when it cannot start.
pub async fn sink(config: KafkaSinkConfig) -> KafkaSink {
    match KafkaSink::connect(config).await {
        Ok(sink) => sink,
        Err(e) => panic!("the Kafka sink did not start: {e}"),
    }
}

/// The test side of a broker: an admin client, failing loudly without a broker.
pub struct Kafka {
    pub brokers: String,
    admin: AdminClient<DefaultClientContext>,
}

impl Kafka {
    /// The shared test broker.
    pub async fn connect() -> Self {
        Self::at(&brokers()).await
    }

    /// The broker at `brokers`.
    pub async fn at(brokers: &str) -> Self {
        let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .create()
            .expect("an admin client");
        let probe = admin.inner().fetch_metadata(None, Duration::from_secs(10));
        if let Err(e) = probe {
            no_server("a Kafka-protocol broker (tansu)", BROKERS_VAR, brokers, e);
        }
        Self {
            brokers: brokers.to_owned(),
            admin,
        }
    }

    /// A fresh topic with `partitions` partitions, once the broker's metadata shows it.
    pub async fn topic(&self, prefix: &str, partitions: i32) -> String {
        let name = fresh_name(prefix);
        self.create_topic(&name, partitions).await;
        name
    }

    /// Creates the topic `name`.
    pub async fn create_topic(&self, name: &str, partitions: i32) {
        let topic = NewTopic::new(name, partitions, TopicReplication::Fixed(1));
        let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
        let results = tokio::time::timeout(
            Duration::from_secs(20),
            self.admin.create_topics([&topic], &options),
        )
        .await
        .expect("create_topics answered within 20 s")
        .expect("create_topics");
        for result in results {
            result.unwrap_or_else(|(topic, code)| panic!("create topic {topic}: {code}"));
        }
        outbox_test_support::wait_until(
            &format!("topic {name} in the broker's metadata"),
            Duration::from_secs(20),
            || async { self.partitions(name) == partitions as usize },
        )
        .await;
    }

    /// The number of partitions of `topic` (0 when it does not exist).
    pub fn partitions(&self, topic: &str) -> usize {
        self.admin
            .inner()
            .fetch_metadata(Some(topic), Duration::from_secs(5))
            .ok()
            .and_then(|m| {
                m.topics()
                    .first()
                    .filter(|t| t.error().is_none())
                    .map(|t| t.partitions().len())
            })
            .unwrap_or(0)
    }

    /// A reader of every partition of `topic` from the beginning.
    pub fn reader(&self, topic: &str) -> Reader {
        Reader::new(&self.brokers, topic, self.partitions(topic))
    }
}

/// Reads a topic from its first offset, assigned (no consumer group), independently of
/// the sink.
pub struct Reader {
    consumer: StreamConsumer,
    got: Vec<OwnedMessage>,
}

impl Reader {
    fn new(brokers: &str, topic: &str, partitions: usize) -> Self {
        assert!(partitions > 0, "topic {topic} has no partitions");
        let consumer: StreamConsumer = ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .set("group.id", fresh_name("reader"))
            .set("enable.auto.commit", "false")
            .set("enable.partition.eof", "false")
            .create()
            .expect("a consumer");
        let mut assignment = TopicPartitionList::new();
        for partition in 0..partitions as i32 {
            assignment
                .add_partition_offset(topic, partition, Offset::Beginning)
                .expect("assign");
        }
        consumer.assign(&assignment).expect("assign");
        Self {
            consumer,
            got: Vec::new(),
        }
    }

    /// Everything read so far, after reading what arrives within `quiet` of the last record.
    pub async fn take(&mut self, quiet: Duration) -> &[OwnedMessage] {
        while let Ok(next) = tokio::time::timeout(quiet, self.consumer.recv()).await {
            let record = next.expect("consume");
            self.got.push(record.detach());
        }
        &self.got
    }

    /// Reads until `n` records arrived, failing after `limit`.
    pub async fn read(&mut self, n: usize, limit: Duration) -> &[OwnedMessage] {
        let deadline = tokio::time::Instant::now() + limit;
        while self.got.len() < n {
            match tokio::time::timeout_at(deadline, self.consumer.recv()).await {
                Ok(next) => self.got.push(next.expect("consume").detach()),
                Err(_) => panic!(
                    "timed out after {limit:?} waiting for {n} records; got {}",
                    self.got.len()
                ),
            }
        }
        &self.got
    }
}

/// A record as the conformance suite compares it.
pub fn delivered(record: &OwnedMessage) -> Delivered {
    let received = read_record(record).expect("an outbox record");
    Delivered::from(received)
}

/// The record's key as text.
pub fn key(record: &OwnedMessage) -> Option<String> {
    record
        .key()
        .map(|k| String::from_utf8(k.to_vec()).expect("a UTF-8 key"))
}

/// The tansu binary `scripts/services.sh` built.
pub fn tansu_binary() -> PathBuf {
    let path = std::env::var("OUTBOX_TEST_TANSU")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            PathBuf::from(std::env::var("HOME").unwrap_or_default())
                .join(".cache/outbox-tools/bin/tansu")
        });
    if !path.exists() {
        no_server(
            "the tansu broker binary",
            "OUTBOX_TEST_TANSU",
            &path.display().to_string(),
            "not found",
        );
    }
    path
}

/// A tansu broker this test owns, on its own port, keeping its topics in a SQLite file
/// so that they survive a restart. Killed with the test.
pub struct PrivateBroker {
    pub port: u16,
    dir: PathBuf,
    process: Option<ChildGuard>,
}

impl PrivateBroker {
    /// Starts a broker whose data lives in `dir`.
    pub async fn start(dir: &Path) -> Self {
        let port = free_port();
        let mut broker = Self {
            port,
            dir: dir.to_owned(),
            process: None,
        };
        broker.spawn().await;
        broker
    }

    /// `127.0.0.1:port`.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    async fn spawn(&mut self) {
        let listener = format!("tcp://{}", self.address());
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("tansu.log"))
            .expect("broker log");
        let process = ChildGuard::spawn(
            format!("tansu on {}", self.port),
            Command::new(tansu_binary())
                .current_dir(&self.dir)
                .args(["broker", "--listener-url", &listener])
                .args(["--advertised-listener-url", &listener])
                .args(["--storage-engine", "sqlite://tansu.db"])
                .stdout(Stdio::from(log.try_clone().expect("log")))
                .stderr(Stdio::from(log)),
        );
        self.process = Some(process);
        let address = self.address();
        outbox_test_support::wait_until(
            &format!("tansu listening on {address}"),
            Duration::from_secs(30),
            || async { std::net::TcpStream::connect(&address).is_ok() },
        )
        .await;
    }

    /// How many times a thread of the broker panicked so far (from its log). tansu 0.6's
    /// SQLite engine can panic in its storage task after a restart ("more or less than one
    /// row"); the broker then answers every request with an error until it is restarted.
    pub fn panics(&self) -> usize {
        std::fs::read_to_string(self.dir.join("tansu.log"))
            .map(|log| log.matches("panicked at").count())
            .unwrap_or(0)
    }

    /// Kills the broker (SIGKILL: nothing is flushed on the way out).
    pub fn kill(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.kill();
        }
    }

    /// Starts the broker again on the same port and data.
    pub async fn restart(&mut self) {
        self.kill();
        self.spawn().await;
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}
