//! The [`KafkaSink`]: a batch enqueued in order on an idempotent producer, each message
//! marked from its own delivery report.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox_engine::receive::{fields::PREFIX as HEADER_PREFIX, metadata_fields};
use outbox_engine::{Failure, FailureClass, Message, Outcome, PublishContext, Sink};
use rdkafka::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord, Producer};
use tokio::time::Instant;
use tracing::warn;

use crate::config::{Checked, KafkaSinkConfig, Unkeyed, check_topic_name};
use crate::error::{KafkaSinkError, classify, config_error};

/// How long to wait before offering a message again when the producer's local queue is
/// full.
const QUEUE_FULL_PAUSE: Duration = Duration::from_millis(5);

/// Publishes outbox messages to Kafka through librdkafka's idempotent producer.
///
/// Build one with [`connect`](Self::connect) (or [`from_url`](Self::from_url)), which
/// validates the configuration, makes the producer, and reads the cluster's metadata
/// (and, for a fixed topic, checks that it exists), so a misconfigured route fails at
/// start-up instead of at the first batch. Clones share one producer.
///
/// Each [`publish`](Sink::publish) hands the batch to the producer in batch order (a
/// message meeting a full local queue waits for room before the next one is offered, so
/// order within a partition is batch order), then waits for every message's delivery
/// report. A message is published only when its own report carries a partition and an
/// offset — with the default `acks=all`, once every in-sync replica has it; the receipt
/// is `topic/partition@offset`. A message with no report by the publish deadline fails
/// retryably as a timeout (librdkafka may still write it: at-least-once). After the
/// producer reports a fatal error (the idempotent producer lost its sequence state), the
/// sink makes a new producer for the next batch; nothing is marked from the old one.
///
/// ```no_run
/// use outbox_engine::{MemoryStore, Relay};
/// use outbox_sink_kafka::{KafkaSink, KafkaSinkConfig};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let sink = KafkaSink::connect(KafkaSinkConfig::new("kafka://127.0.0.1:9092").topic("billing")).await?;
/// let relay = Relay::builder(MemoryStore::new()).route("invoices", sink).build()?;
/// relay.drain().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct KafkaSink {
    inner: Arc<Inner>,
}

struct Inner {
    config: KafkaSinkConfig,
    checked: Checked,
    producer: Mutex<FutureProducer>,
    /// Topics known to exist (checked once each).
    topics: Mutex<HashSet<String>>,
}

impl fmt::Debug for KafkaSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaSink")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl KafkaSink {
    /// Validates `config`, makes the producer, and checks the cluster.
    ///
    /// Start-up checks: librdkafka accepts every property; a broker answers a metadata
    /// request within `connect_timeout`; a fixed topic exists (nothing is created).
    ///
    /// # Errors
    ///
    /// A [`KafkaSinkError`] saying what is wrong; the route must not start.
    pub async fn connect(config: KafkaSinkConfig) -> Result<Self, KafkaSinkError> {
        let checked = config.check()?;
        let producer = make_producer(&checked)?;
        let fixed = checked.topic.fixed();
        let brokers = checked.brokers.clone();
        let state = topic_state(&producer, fixed.as_deref(), checked.connect_timeout).await;
        let mut topics = HashSet::new();
        match (state, fixed) {
            (Ok(TopicState::Exists), Some(topic)) => {
                topics.insert(topic);
            }
            (Ok(TopicState::Exists), None) => {}
            (Ok(TopicState::Missing), topic) => {
                return Err(KafkaSinkError::TopicNotFound {
                    topic: topic.unwrap_or_default(),
                    brokers,
                });
            }
            (Ok(TopicState::Unavailable(code)), topic) => {
                return Err(KafkaSinkError::Connect {
                    brokers,
                    reason: format!(
                        "topic {:?} is not available: {code}",
                        topic.unwrap_or_default()
                    ),
                    retryable: true,
                });
            }
            (Err(error), _) => {
                let failure = classify(&error);
                return Err(KafkaSinkError::Connect {
                    brokers,
                    reason: error.to_string(),
                    retryable: failure.class != FailureClass::Config,
                });
            }
        }
        Ok(Self {
            inner: Arc::new(Inner {
                config,
                checked,
                producer: Mutex::new(producer),
                topics: Mutex::new(topics),
            }),
        })
    }

    /// [`connect`](Self::connect)s with the configuration in one URL
    /// (`kafka://host:port,host:port/topic?options`).
    ///
    /// # Errors
    ///
    /// As for [`KafkaSinkConfig::from_url`] and [`connect`](Self::connect).
    pub async fn from_url(url: &str) -> Result<Self, KafkaSinkError> {
        Self::connect(KafkaSinkConfig::from_url(url)?).await
    }

    /// The configuration this sink was built from.
    pub fn config(&self) -> &KafkaSinkConfig {
        &self.inner.config
    }
}

/// What the cluster's metadata says of one topic.
enum TopicState {
    Exists,
    Missing,
    /// The topic is there but not usable now (e.g. `LeaderNotAvailable` while it is made).
    Unavailable(RDKafkaErrorCode),
}

/// Asks the cluster about `topic` (all topics when `None`, which only checks that a broker
/// answers), off the async threads.
async fn topic_state(
    producer: &FutureProducer,
    topic: Option<&str>,
    timeout: Duration,
) -> Result<TopicState, KafkaError> {
    let probe = producer.clone();
    let name = topic.map(str::to_owned);
    let answer = tokio::task::spawn_blocking(move || {
        probe
            .client()
            .fetch_metadata(name.as_deref(), timeout)
            .map(|m| {
                m.topics()
                    .first()
                    .map(|t| (t.error().map(RDKafkaErrorCode::from), t.partitions().len()))
            })
    })
    .await
    .map_err(|_| KafkaError::Canceled)??;
    Ok(match (topic, answer) {
        (None, _) => TopicState::Exists,
        (Some(_), Some((None, partitions))) if partitions > 0 => TopicState::Exists,
        (Some(_), None | Some((None, _)))
        | (Some(_), Some((Some(RDKafkaErrorCode::UnknownTopicOrPartition), _))) => {
            TopicState::Missing
        }
        (Some(_), Some((Some(code), _))) => TopicState::Unavailable(code),
    })
}

fn make_producer(checked: &Checked) -> Result<FutureProducer, KafkaSinkError> {
    let mut client = ClientConfig::new();
    client.set("bootstrap.servers", &checked.brokers);
    for (name, value) in &checked.properties {
        client.set(name, value);
    }
    client.create().map_err(|e| KafkaSinkError::Client {
        reason: config_error(&e),
    })
}

/// One message on its way: where it goes and the key it carries.
struct Prepared {
    index: usize,
    topic: String,
    key: Option<String>,
    headers: OwnedHeaders,
}

impl Inner {
    fn producer(&self) -> FutureProducer {
        self.producer.lock().expect("producer lock").clone()
    }

    /// Replaces `used` with a new producer (a new producer id) when it reported a fatal
    /// error or the broker refused its idempotence state (`broken`); the old one is
    /// dropped off the async threads (dropping purges and flushes for up to half a
    /// second).
    fn replace_if_broken(&self, used: &FutureProducer, broken: Option<RDKafkaErrorCode>) {
        let reason = match used.client().fatal_error() {
            Some((code, reason)) => format!("fatal error {code:?}: {reason}"),
            None => match broken {
                Some(code) => format!("the broker refused its producer state ({code:?})"),
                None => return,
            },
        };
        let mut current = self.producer.lock().expect("producer lock");
        if current.client().native_ptr() != used.client().native_ptr() {
            return; // another publish replaced it already
        }
        match make_producer(&self.checked) {
            Ok(fresh) => {
                warn!(%reason, "replacing the Kafka producer");
                let old = std::mem::replace(&mut *current, fresh);
                tokio::task::spawn_blocking(move || drop(old));
            }
            Err(e) => warn!(%reason, error = %e, "the Kafka producer could not be replaced"),
        }
    }

    /// The message's topic, key and headers, or why it cannot be sent.
    fn prepare(&self, index: usize, message: &Message) -> Result<Prepared, Failure> {
        let topic = self.checked.topic.render(message).map_err(|reason| {
            Failure::permanent(FailureClass::Config, format!("topic: {reason}"))
        })?;
        check_topic_name(&topic)
            .map_err(|reason| Failure::permanent(FailureClass::Config, reason))?;
        if let Some(name) = message
            .headers
            .keys()
            .find(|n| n.starts_with(HEADER_PREFIX))
        {
            return Err(Failure::permanent(
                FailureClass::Serialization,
                format!(
                    "header {name:?} uses the prefix {HEADER_PREFIX:?}, which the sink reserves for its own headers"
                ),
            ));
        }
        let id = message.id.to_string();
        let mut headers = OwnedHeaders::new_with_capacity(8 + message.headers.len());
        for (name, value) in metadata_fields(message, &id) {
            headers = headers.insert(Header {
                key: name,
                value: Some(value),
            });
        }
        for (name, value) in &message.headers {
            headers = headers.insert(Header {
                key: name,
                value: Some(value),
            });
        }
        let key = match (&message.partition_key, self.checked.unkeyed) {
            (Some(key), _) => Some(key.clone()),
            (None, Unkeyed::Id) => Some(id),
            (None, Unkeyed::Null) => None,
        };
        Ok(Prepared {
            index,
            topic,
            key,
            headers,
        })
    }

    /// Checks that every topic not yet known exists; the answer for each topic is `None`
    /// (it exists) or the failure of its messages.
    async fn check_topics(
        &self,
        producer: &FutureProducer,
        names: Vec<String>,
        cx: &PublishContext,
    ) -> HashMap<String, Failure> {
        let unknown: Vec<String> = {
            let known = self.topics.lock().expect("topics lock");
            names.into_iter().filter(|t| !known.contains(t)).collect()
        };
        let mut failed = HashMap::new();
        for topic in unknown {
            let timeout = cx.remaining().min(self.checked.connect_timeout);
            let failure = match topic_state(producer, Some(&topic), timeout).await {
                Ok(TopicState::Exists) => {
                    self.topics.lock().expect("topics lock").insert(topic);
                    continue;
                }
                Ok(TopicState::Missing) => Failure::permanent(
                    FailureClass::Rejected,
                    format!(
                        "topic {topic:?} does not exist (create it, then replay the dead letters)"
                    ),
                ),
                Ok(TopicState::Unavailable(code)) => Failure::retryable(
                    FailureClass::Unavailable,
                    format!("topic {topic:?} is not available: {code}"),
                ),
                Err(error) => classify(&error),
            };
            failed.insert(topic, failure);
        }
        failed
    }

    async fn publish(&self, batch: &[Message], cx: &PublishContext) -> Vec<Outcome> {
        let producer = self.producer();
        let mut outcomes: Vec<Option<Outcome>> = vec![None; batch.len()];
        let mut prepared = Vec::with_capacity(batch.len());
        for (index, message) in batch.iter().enumerate() {
            match self.prepare(index, message) {
                Ok(p) => prepared.push(p),
                Err(failure) => outcomes[index] = Some(failure.into()),
            }
        }
        let mut topics: Vec<String> = prepared.iter().map(|p| p.topic.clone()).collect();
        topics.sort_unstable();
        topics.dedup();
        let missing = self.check_topics(&producer, topics, cx).await;

        let mut in_flight: Vec<(usize, String, DeliveryFuture)> =
            Vec::with_capacity(prepared.len());
        for p in prepared {
            if let Some(failure) = missing.get(&p.topic) {
                outcomes[p.index] = Some(failure.clone().into());
                continue;
            }
            if let Some(reason) = cx.stopped() {
                outcomes[p.index] = Some(
                    Failure::retryable(FailureClass::Unavailable, reason.to_owned())
                        .deferred()
                        .into(),
                );
                continue;
            }
            let message = &batch[p.index];
            let mut headers = Some(p.headers);
            loop {
                let mut record = FutureRecord::<str, [u8]>::to(&p.topic)
                    .payload(message.payload.as_slice())
                    .headers(headers.take().expect("headers for this attempt"));
                if let Some(key) = &p.key {
                    record = record.key(key.as_str());
                }
                match producer.send_result(record) {
                    Ok(delivery) => {
                        in_flight.push((p.index, p.topic, delivery));
                        break;
                    }
                    Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), record))
                        if Instant::now() + QUEUE_FULL_PAUSE < cx.deadline() =>
                    {
                        // Wait for room rather than offer the next message first, so the
                        // partition keeps batch order.
                        headers = record.headers;
                        tokio::time::sleep(QUEUE_FULL_PAUSE).await;
                    }
                    Err((error, _)) => {
                        outcomes[p.index] = Some(classify(&error).into());
                        break;
                    }
                }
            }
        }

        let mut broken = None;
        for (index, topic, delivery) in in_flight {
            let outcome = match tokio::time::timeout_at(cx.deadline(), delivery).await {
                Ok(Ok(Ok(delivery))) => Outcome::published_with(format!(
                    "{topic}/{}@{}",
                    delivery.partition, delivery.offset
                )),
                Ok(Ok(Err((error, _)))) => {
                    if let Some(code) = error.rdkafka_error_code().filter(breaks_the_producer) {
                        broken = Some(code);
                    }
                    classify(&error).into()
                }
                Ok(Err(_canceled)) => Outcome::retryable(
                    FailureClass::Unavailable,
                    "the producer was dropped before the delivery report",
                ),
                Err(_elapsed) => Outcome::retryable(
                    FailureClass::Timeout,
                    "no delivery report by the publish deadline; the message may have been written",
                ),
            };
            outcomes[index] = Some(outcome);
        }
        self.replace_if_broken(&producer, broken);
        outcomes
            .into_iter()
            .map(|o| o.expect("every message has an outcome"))
            .collect()
    }
}

/// Delivery errors after which the producer's idempotence state is of no use: the broker
/// lost or refuses the producer id or its sequence numbers (a broker restarted without its
/// producer state answers with an error code the client does not know), or librdkafka
/// declared the producer failed. A new producer starts with a new id.
fn breaks_the_producer(code: &RDKafkaErrorCode) -> bool {
    use RDKafkaErrorCode as C;
    matches!(
        code,
        C::Fatal
            | C::Unknown
            | C::OutOfOrderSequenceNumber
            | C::UnknownProducerId
            | C::InvalidProducerEpoch
            | C::InvalidProducerIdMapping
            | C::ProducerFenced
    )
}

impl Sink for KafkaSink {
    async fn publish(
        &self,
        batch: &[Message],
        cx: &PublishContext,
    ) -> Result<Vec<Outcome>, Failure> {
        Ok(self.inner.publish(batch, cx).await)
    }
}
