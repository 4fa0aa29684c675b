//! The Kafka sink against a real Kafka-protocol broker (tansu, `OUTBOX_TEST_KAFKA_BROKERS`,
//! default `127.0.0.1:9092`): the sink conformance suite, every header, key and payload
//! read back by a consumer group, per-key order across two relays, a failed head of a key
//! under `DeadHead::Halt` and `Skip`, a missing topic failing alone, refusals before
//! sending, the consumer's inbox, and typed start-up errors.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::Utc;
use outbox_engine::testkit::{BinaryPayloads, Delivered, SinkHarness, sink_suite};
use outbox_engine::{
    DeadHead, DeadLetterFilter, DeadLetters, FailureClass, MemoryStore, MessageId, MessageOrder,
    NewMessage, Outcome, PublishContext, Relay, Status,
};
use outbox_sink_kafka::client::consumer::{Consumer, StreamConsumer};
use outbox_sink_kafka::client::{ClientConfig, Message as _};
use outbox_sink_kafka::{KafkaSink, KafkaSinkConfig, KafkaSinkError, Unkeyed, read_record};

mod common;
use common::{Kafka, Reader, delivered, key, sink, url};
use outbox_engine::testkit::publish;

// ---------------------------------------------------------------------------------------
// Conformance suite
// ---------------------------------------------------------------------------------------

struct Harness {
    sink: KafkaSink,
    reader: tokio::sync::Mutex<Reader>,
}

impl SinkHarness for Harness {
    type Sink = KafkaSink;

    fn sink(&self) -> &KafkaSink {
        &self.sink
    }

    async fn received(&self) -> Vec<Delivered> {
        let mut reader = self.reader.lock().await;
        reader
            .take(Duration::from_millis(200))
            .await
            .iter()
            .map(delivered)
            .collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_suite_on_a_three_partition_topic() {
    sink_suite::run_all(|| async {
        let kafka = Kafka::connect().await;
        let topic = kafka.topic("suite", 3).await;
        Harness {
            sink: sink(KafkaSinkConfig::new(url()).topic(topic.clone())).await,
            reader: tokio::sync::Mutex::new(kafka.reader(&topic)),
        }
    })
    .await;
}

// ---------------------------------------------------------------------------------------
// What a consumer reads
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_group_reads_every_record_with_exact_key_headers_and_payload() {
    let kafka = Kafka::connect().await;
    let topic = kafka.topic("layout", 3).await;
    let sink = sink(KafkaSinkConfig::new(url()).topic(topic.clone())).await;
    let full = sink_suite::full_message(BinaryPayloads::Exact);
    let bare = sink_suite::bare_message();
    let outcomes = publish(&sink, &[full.clone(), bare.clone()]).await;
    let receipts: Vec<String> = outcomes
        .iter()
        .map(|o| match o {
            Outcome::Published { receipt: Some(r) } => r.clone(),
            other => panic!("published with a receipt: {other:?}"),
        })
        .collect();

    // A consumer group (subscribe, not assign), as a receiving service would run it.
    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", &kafka.brokers)
        .set("group.id", common::fresh_name("group"))
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    consumer.subscribe(&[&topic]).unwrap();
    let mut got = Vec::new();
    while got.len() < 2 {
        let record = tokio::time::timeout(Duration::from_secs(30), consumer.recv())
            .await
            .expect("the consumer group read both records within 30 s")
            .unwrap();
        got.push(record.detach());
    }
    let by_id = |id: &str| {
        got.iter()
            .find(|r| read_record(*r).unwrap().id.to_string() == id)
            .unwrap_or_else(|| panic!("record {id} consumed"))
    };

    let record = by_id(&full.id.to_string());
    assert_eq!(
        receipts[0],
        format!("{topic}/{}@{}", record.partition(), record.offset()),
        "the receipt is where the consumer found it"
    );
    assert_eq!(
        key(record).as_deref(),
        Some("invoice-7"),
        "key = partition key"
    );
    let first = read_record(record).unwrap();
    assert_eq!(first.idempotency_key, "invoice-7:paid");
    assert_eq!(first.event_type, "invoice.paid");
    assert_eq!(
        first.content_type.as_deref(),
        Some("application/octet-stream")
    );
    assert_eq!(first.partition_key.as_deref(), Some("invoice-7"));
    assert_eq!(first.tenant_id.as_deref(), Some("acme"));
    assert_eq!(first.aggregate_type.as_deref(), Some("invoice"));
    assert_eq!(first.aggregate_id.as_deref(), Some("7"));
    assert_eq!(first.payload, full.payload, "payload byte for byte");
    assert_eq!(
        first.headers, full.headers,
        "every message header, traceparent included"
    );

    let record = by_id(&bare.id.to_string());
    assert_eq!(
        receipts[1],
        format!("{topic}/{}@{}", record.partition(), record.offset())
    );
    assert_eq!(
        key(record),
        None,
        "an unkeyed message has no key by default"
    );
    let second = read_record(record).unwrap();
    assert_eq!(
        second.idempotency_key,
        bare.id.to_string(),
        "the default key is the id"
    );
    assert_eq!(second.content_type.as_deref(), Some("application/json"));
    assert_eq!((second.partition_key, second.tenant_id), (None, None));
    assert!(second.headers.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unkeyed_messages_can_be_keyed_by_their_id() {
    let kafka = Kafka::connect().await;
    let topic = kafka.topic("unkeyed", 3).await;
    let sink = sink(
        KafkaSinkConfig::new(url())
            .topic(topic.clone())
            .unkeyed(Unkeyed::Id),
    )
    .await;
    let batch = sink_suite::messages("events", 6)
        .into_iter()
        .map(|mut m| {
            m.partition_key = None;
            m
        })
        .collect::<Vec<_>>();
    let outcomes = publish(&sink, &batch).await;
    assert!(outcomes.iter().all(Outcome::is_published), "{outcomes:?}");
    let mut reader = kafka.reader(&topic);
    for record in reader.read(6, Duration::from_secs(20)).await {
        let received = read_record(record).unwrap();
        assert_eq!(key(record), Some(received.id.to_string()));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivered_message_is_a_duplicate_in_the_consumers_inbox() {
    use outbox_sqlx::postgres::PgInbox;
    use outbox_sqlx::{Delivery, Inbox};

    let pool = outbox_test_support::postgres_pool().await;
    let table = format!("kafka_inbox_{:016x}", fastrand::u64(..));
    let inbox = PgInbox::with_names(outbox_sqlx::TableNames::default().inbox(&table).unwrap());
    inbox.migrate(&pool).await.unwrap();

    let kafka = Kafka::connect().await;
    let topic = kafka.topic("inbox", 1).await;
    let sink = sink(KafkaSinkConfig::new(url()).topic(topic.clone())).await;
    let message = NewMessage::builder("billing", "invoice.paid")
        .idempotency_key("invoice-9:paid")
        .build()
        .unwrap()
        .into_message(Utc::now());
    // The relay re-sends after a lost acknowledgement: the same message twice.
    for _ in 0..2 {
        let outcomes = publish(&sink, std::slice::from_ref(&message)).await;
        assert!(outcomes[0].is_published(), "{outcomes:?}");
    }
    let mut reader = kafka.reader(&topic);
    let mut seen = Vec::new();
    for record in reader.read(2, Duration::from_secs(20)).await {
        let received = read_record(record).unwrap();
        let mut tx = pool.begin().await.unwrap();
        seen.push(
            inbox
                .record(&mut tx, "billing", &received.idempotency_key)
                .await
                .unwrap(),
        );
        tx.commit().await.unwrap();
    }
    assert_eq!(seen, [Delivery::New, Delivery::Duplicate]);
    sqlx::query(&format!("DROP TABLE {table}"))
        .execute(&pool)
        .await
        .unwrap();
}

// ---------------------------------------------------------------------------------------
// Per-key order
// ---------------------------------------------------------------------------------------

fn per_key_relay(
    store: &MemoryStore,
    sink: KafkaSink,
    owner: &str,
    dead: DeadHead,
) -> Relay<MemoryStore> {
    Relay::builder(store.clone())
        .route("orders", sink)
        .owner(owner)
        .ordering(MessageOrder::PerKey(dead))
        .batch_size(7)
        .concurrency(2)
        .poll_interval(Duration::from_millis(20))
        .build()
        .unwrap()
}

/// Runs `relays` until `done` holds, then stops them.
async fn run_until<F, Fut>(relays: Vec<Relay<MemoryStore>>, what: &str, done: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let running: Vec<_> = relays
        .into_iter()
        .map(|relay| {
            let mut stop = stop.clone();
            tokio::spawn(async move {
                relay
                    .run(async move {
                        let _ = stop.wait_for(|s| *s).await;
                    })
                    .await
            })
        })
        .collect();
    outbox_test_support::wait_until(what, Duration::from_secs(60), done).await;
    stop_tx.send(true).unwrap();
    for relay in running {
        relay.await.unwrap();
    }
}

/// The `n` of each record's JSON payload, per record key, in offset order.
fn ns_per_key(
    records: &[outbox_sink_kafka::client::message::OwnedMessage],
) -> BTreeMap<String, Vec<u64>> {
    let mut records: Vec<_> = records.iter().collect();
    records.sort_by_key(|r| (r.partition(), r.offset()));
    let mut per_key: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for record in records {
        let body: serde_json::Value = serde_json::from_slice(record.payload().unwrap()).unwrap();
        per_key
            .entry(key(record).expect("a keyed record"))
            .or_default()
            .push(body["n"].as_u64().unwrap());
    }
    per_key
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_key_offsets_follow_commit_order_across_two_relays() {
    const KEYS: usize = 20;
    const PER_KEY: usize = 25;
    let kafka = Kafka::connect().await;
    let topic = kafka.topic("ordered", 4).await;
    let store = MemoryStore::new();
    // Commit order: message `n` of every key in turn, one transaction each.
    for n in 0..PER_KEY {
        for key in 0..KEYS {
            store
                .enqueue(
                    NewMessage::builder("orders", "order.changed")
                        .json(&serde_json::json!({ "key": key, "n": n }))
                        .partition_key(format!("order-{key}"))
                        .build()
                        .unwrap(),
                )
                .unwrap();
        }
    }
    let config = KafkaSinkConfig::new(url()).topic(topic.clone());
    let relays = vec![
        per_key_relay(
            &store,
            sink(config.clone()).await,
            "relay-a",
            DeadHead::Halt,
        ),
        per_key_relay(&store, sink(config).await, "relay-b", DeadHead::Halt),
    ];
    run_until(relays, "every row published", || async {
        store.ids_with_status(Status::Published).len() == KEYS * PER_KEY
    })
    .await;

    let mut reader = kafka.reader(&topic);
    let records = reader.read(KEYS * PER_KEY, Duration::from_secs(30)).await;
    let per_key = ns_per_key(records);
    assert_eq!(per_key.len(), KEYS);
    let expected: Vec<u64> = (0..PER_KEY as u64).collect();
    for (key, ns) in &per_key {
        assert_eq!(
            ns, &expected,
            "key {key}: offsets in commit order, once each"
        );
    }
}

/// Key `K`'s first message is too large for the producer (`message.max.bytes`), its
/// second and third and two other keys' messages are fine, all in one claim.
fn enqueue_with_a_bad_head(store: &MemoryStore) -> MessageId {
    let message = |key: &str, n: u64, size: usize| {
        NewMessage::builder("orders", "order.changed")
            .json(&serde_json::json!({ "n": n, "pad": "x".repeat(size) }))
            .partition_key(key)
            .build()
            .unwrap()
    };
    let head = message("K", 1, 8_000);
    let head_id = head.id();
    store
        .enqueue_all(vec![
            head,
            message("A", 1, 10),
            message("K", 2, 10),
            message("B", 1, 10),
            message("K", 3, 10),
        ])
        .unwrap();
    head_id
}

/// On a fresh three-partition topic named after `name`: enqueues the rows of
/// [`enqueue_with_a_bad_head`] and runs a per-key relay with `dead` whose producer refuses
/// records over 4,000 bytes (librdkafka's own `MessageSizeTooLarge`) until `published`
/// rows are published and K's head is dead. Returns the broker, the topic, the store and
/// the head's id.
async fn run_into_the_bad_head(
    name: &str,
    dead: DeadHead,
    published: usize,
) -> (Kafka, String, MemoryStore, MessageId) {
    let kafka = Kafka::connect().await;
    let topic = kafka.topic(name, 3).await;
    let store = MemoryStore::new();
    let head = enqueue_with_a_bad_head(&store);
    let small = sink(
        KafkaSinkConfig::new(url())
            .topic(topic.clone())
            .property("message.max.bytes", "4000"),
    )
    .await;
    let relay = per_key_relay(&store, small, &format!("relay-{name}"), dead);
    let what = format!("{published} rows published, K's head dead");
    run_until(vec![relay], &what, || async {
        store.ids_with_status(Status::Published).len() == published
            && store.row(head).unwrap().row.status() == Status::Dead
    })
    .await;
    (kafka, topic, store, head)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_head_holds_its_key_until_replayed_then_the_key_arrives_in_order() {
    let (kafka, topic, store, head) = run_into_the_bad_head("halt", DeadHead::Halt, 2).await;
    let dead = store.row(head).unwrap();
    let error = dead.row.last_error.clone().unwrap_or_default();
    assert!(error.contains("MessageSizeTooLarge"), "{error}");
    assert_eq!(
        store.ids_with_status(Status::Pending).len(),
        2,
        "K's 2 and 3 wait behind their dead head"
    );
    let mut reader = kafka.reader(&topic);
    reader.read(2, Duration::from_secs(20)).await;
    let before = ns_per_key(reader.take(Duration::from_secs(1)).await);
    assert_eq!(
        before.keys().collect::<Vec<_>>(),
        ["A", "B"],
        "nothing of K was sent"
    );

    // The fix: a route whose producer takes the message; then the operator replays it.
    let fixed = sink(KafkaSinkConfig::new(url()).topic(topic.clone())).await;
    assert_eq!(
        store
            .replay_dead(&DeadLetterFilter::all().ids([head]))
            .await
            .unwrap(),
        1
    );
    let relay = per_key_relay(&store, fixed, "relay-fixed", DeadHead::Halt);
    run_until(vec![relay], "every row published", || async {
        store.ids_with_status(Status::Published).len() == 5
    })
    .await;
    let after = ns_per_key(reader.read(5, Duration::from_secs(20)).await);
    assert_eq!(after["K"], [1, 2, 3], "K in commit order after the replay");
    assert_eq!((after["A"].len(), after["B"].len()), (1, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_dead_head_skip_the_rest_of_the_key_goes_on_without_it() {
    let (kafka, topic, _, _) = run_into_the_bad_head("skip", DeadHead::Skip, 4).await;
    let mut reader = kafka.reader(&topic);
    let got = ns_per_key(reader.read(4, Duration::from_secs(20)).await);
    assert_eq!(
        got["K"],
        [2, 3],
        "K's 2 and 3, in order, without the dead head"
    );
}

// ---------------------------------------------------------------------------------------
// Failures of one message
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_for_a_missing_topic_fails_alone() {
    let kafka = Kafka::connect().await;
    let existing = kafka.topic("tenant", 1).await;
    let prefix = existing.trim_end_matches(|c: char| c.is_ascii_hexdigit());
    let tenant_of_good = existing[prefix.len()..].to_owned();
    let sink = sink(KafkaSinkConfig::new(url()).topic(format!("{prefix}{{tenant_id}}"))).await;
    let batch: Vec<_> = (0..6)
        .map(|i| {
            let tenant = if i == 2 {
                "missing"
            } else {
                tenant_of_good.as_str()
            };
            NewMessage::builder("events", "order.paid")
                .json(&serde_json::json!({ "n": i }))
                .tenant_id(tenant)
                .build()
                .unwrap()
                .into_message(Utc::now())
        })
        .collect();
    let outcomes = publish(&sink, &batch).await;
    for (i, outcome) in outcomes.iter().enumerate() {
        if i == 2 {
            let Outcome::Failed(failure) = outcome else {
                panic!("the message to a missing topic failed: {outcome:?}")
            };
            assert_eq!(failure.class, FailureClass::Rejected, "{failure}");
            assert!(!failure.retryable, "{failure}");
            assert!(failure.message.contains("does not exist"), "{failure}");
        } else {
            assert!(outcome.is_published(), "message {i}: {outcome:?}");
        }
    }
    let mut reader = kafka.reader(&existing);
    let got = reader.read(5, Duration::from_secs(20)).await;
    assert_eq!(got.len(), 5);
    assert_eq!(
        kafka.partitions(&format!("{prefix}missing")),
        0,
        "the sink created nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_before_sending_reserved_headers_and_unrenderable_or_illegal_topics() {
    let kafka = Kafka::connect().await;
    let topic = kafka.topic("refused", 1).await;
    let sink = sink(KafkaSinkConfig::new(url()).topic("{partition_key}")).await;
    let build = |b: outbox_engine::NewMessageBuilder| b.build().unwrap().into_message(Utc::now());
    let batch = vec![
        build(NewMessage::builder("e", "t").partition_key(&topic)),
        build(
            NewMessage::builder("e", "t")
                .partition_key("x")
                .header("outbox-id", "forged"),
        ),
        build(NewMessage::builder("e", "t")),
        build(NewMessage::builder("e", "t").partition_key("has space")),
    ];
    let outcomes = publish(&sink, &batch).await;
    assert!(outcomes[0].is_published(), "{:?}", outcomes[0]);
    let classes: Vec<_> = outcomes[1..]
        .iter()
        .map(|o| match o {
            Outcome::Failed(f) if !f.retryable => f.class,
            other => panic!("refused permanently: {other:?}"),
        })
        .collect();
    assert_eq!(
        classes,
        [
            FailureClass::Serialization,
            FailureClass::Config,
            FailureClass::Config
        ]
    );
    let mut reader = kafka.reader(&topic);
    reader.read(1, Duration::from_secs(20)).await;
    assert_eq!(
        reader.take(Duration::from_secs(1)).await.len(),
        1,
        "only the first was sent"
    );
}

// ---------------------------------------------------------------------------------------
// Start-up
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_up_refuses_a_missing_topic_bad_properties_and_unreachable_brokers() {
    let missing = KafkaSink::connect(KafkaSinkConfig::new(url()).topic(common::fresh_name("nope")))
        .await
        .unwrap_err();
    assert!(
        matches!(missing, KafkaSinkError::TopicNotFound { .. }),
        "{missing}"
    );
    assert!(!missing.is_retryable());

    let bad = KafkaSink::connect(
        KafkaSinkConfig::new(url())
            .property("sasl.password", "hunter2")
            .property("compression.type", "hunter3"),
    )
    .await
    .unwrap_err();
    assert!(matches!(bad, KafkaSinkError::Client { .. }), "{bad}");
    let text = bad.to_string();
    assert!(
        text.contains("compression.type"),
        "names the property: {text}"
    );
    assert!(!text.contains("hunter"), "never quotes a value: {text}");

    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let started = std::time::Instant::now();
    let down = KafkaSink::connect(
        KafkaSinkConfig::new(format!("kafka://127.0.0.1:{port}"))
            .connect_timeout(Duration::from_secs(1)),
    )
    .await
    .unwrap_err();
    assert!(matches!(down, KafkaSinkError::Connect { .. }), "{down}");
    assert!(down.is_retryable(), "{down}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "bounded by connect_timeout"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_driver_builds_a_route_from_its_settings() {
    let kafka = Kafka::connect().await;
    let topic = kafka.topic("driver", 1).await;
    let route = outbox_engine::registry::RouteSettings {
        route: "events".to_owned(),
        settings: serde_json::json!({
            "url": format!("{}/{topic}?linger.ms=1", url()),
            "unkeyed": "id",
            "properties": { "compression.type": "lz4" },
        }),
    };
    let sink =
        (outbox_engine::registry::SinkDriver::of::<outbox_sink_kafka::KafkaSink>().build)(&route)
            .await
            .expect("the route starts");
    let message = sink_suite::messages("events", 1);
    let outcomes = sink
        .publish_dyn(&message, &PublishContext::default())
        .await
        .unwrap();
    assert!(outcomes[0].is_published(), "{outcomes:?}");
    let mut reader = kafka.reader(&topic);
    assert_eq!(reader.read(1, Duration::from_secs(20)).await.len(), 1);
}
