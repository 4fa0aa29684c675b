//! The MQTT sink against a real broker (`OUTBOX_TEST_MQTT_URL`, default
//! `mqtt://127.0.0.1:1883`, mosquitto): the sink conformance suite over MQTT 5 and 3.1.1,
//! a subscriber reading every property back, an inbox on the consumer's side, messages
//! that fail alone (too large, topics and headers MQTT cannot carry, refused by the
//! broker's ACL), typed start-up errors, and broker restarts.

use std::time::Duration;

use chrono::Utc;
use outbox_engine::testkit::{BinaryPayloads, Delivered, SinkHarness, publish, sink_suite};
use outbox_engine::{FailureClass, MemoryStore, NewMessage, Outcome, Relay, Status};
use outbox_sink_mqtt::{MqttSink, MqttSinkConfig, MqttSinkError, Protocol, read_publish};
use outbox_test_support::servers::PrivateServer;
use outbox_test_support::wait_until;

mod common;
use common::{Subscriber, fresh_prefix, sink, url};

// ---------------------------------------------------------------------------------------
// Conformance suite
// ---------------------------------------------------------------------------------------

struct Harness {
    sink: MqttSink,
    subscriber: Subscriber,
    protocol: Protocol,
}

impl SinkHarness for Harness {
    type Sink = MqttSink;

    fn sink(&self) -> &MqttSink {
        &self.sink
    }

    async fn received(&self) -> Vec<Delivered> {
        self.subscriber.delivered(self.protocol)
    }
}

async fn run_suite(protocol: Protocol, template: bool) {
    sink_suite::run_all(|| async move {
        let prefix = fresh_prefix("suite");
        let subscriber = Subscriber::start(&url(), &format!("{prefix}/#")).await;
        let topic = if template {
            format!("{prefix}/{{destination}}/{{event_type}}")
        } else {
            format!("{prefix}/all")
        };
        Harness {
            sink: sink(MqttSinkConfig::new(url()).topic(topic).protocol(protocol)).await,
            subscriber,
            protocol,
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_over_mqtt_5_on_a_fixed_topic() {
    run_suite(Protocol::V5, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_over_mqtt_5_through_a_topic_template() {
    run_suite(Protocol::V5, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_over_mqtt_3_1_1_in_envelopes() {
    run_suite(Protocol::V311, true).await;
}

// ---------------------------------------------------------------------------------------
// The receiving side
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_reads_back_every_property_exactly() {
    let prefix = fresh_prefix("props");
    let subscriber = Subscriber::start(&url(), &format!("{prefix}/#")).await;
    let sink = sink(MqttSinkConfig::new(url()).topic(format!("{prefix}/{{event_type}}"))).await;
    let full = sink_suite::full_message(BinaryPayloads::Exact);
    let bare = sink_suite::bare_message();
    let outcomes = publish(&sink, &[full.clone(), bare.clone()]).await;
    assert_eq!(
        outcomes,
        [
            Outcome::published_with(format!("{prefix}/invoice.paid")),
            Outcome::published_with(format!("{prefix}/{}", bare.event_type)),
        ],
        "published, the receipt naming the topic"
    );
    let got = subscriber.wait_for(2).await;
    assert_eq!(got.len(), 2);
    assert!(!got[0].retain, "never retained");
    let first = read_publish(&got[0]).unwrap();
    assert_eq!(first.id, full.id);
    assert_eq!(first.idempotency_key, "invoice-7:paid");
    assert_eq!(first.event_type, "invoice.paid");
    assert_eq!(first.partition_key.as_deref(), Some("invoice-7"));
    assert_eq!(first.tenant_id.as_deref(), Some("acme"));
    assert_eq!(first.aggregate_type.as_deref(), Some("invoice"));
    assert_eq!(first.aggregate_id.as_deref(), Some("7"));
    assert_eq!(first.payload, full.payload, "payload byte for byte");
    assert_eq!(
        first.headers, full.headers,
        "every header, traceparent included"
    );
    let properties = got[0].properties.as_ref().unwrap();
    assert_eq!(
        properties.content_type.as_deref(),
        Some("application/octet-stream")
    );
    let second = read_publish(&got[1]).unwrap();
    assert_eq!(second.id, bare.id);
    assert!(second.headers.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivered_message_is_a_duplicate_in_the_consumers_inbox() {
    use outbox_sqlx::postgres::PgInbox;
    use outbox_sqlx::{Delivery, Inbox};

    let pool = outbox_test_support::postgres_pool().await;
    let table = format!("mqtt_inbox_{:016x}", fastrand::u64(..));
    let inbox = PgInbox::with_names(outbox_sqlx::TableNames::default().inbox(&table).unwrap());
    inbox.migrate(&pool).await.unwrap();

    let prefix = fresh_prefix("inbox");
    let subscriber = Subscriber::start(&url(), &format!("{prefix}/#")).await;
    let sink = sink(MqttSinkConfig::new(url()).topic(format!("{prefix}/billing"))).await;
    let message = NewMessage::builder("billing", "invoice.paid")
        .idempotency_key("invoice-9:paid")
        .build()
        .unwrap()
        .into_message(Utc::now());
    // The relay re-sends after a lost acknowledgement: the same message twice.
    for _ in 0..2 {
        assert!(publish(&sink, std::slice::from_ref(&message)).await[0].is_published());
    }
    let got = subscriber.wait_for(2).await;
    let mut deliveries = Vec::new();
    for publish in &got {
        let received = read_publish(publish).unwrap();
        let mut tx = pool.begin().await.unwrap();
        deliveries.push(
            inbox
                .record(&mut tx, "billing", &received.idempotency_key)
                .await
                .unwrap(),
        );
        tx.commit().await.unwrap();
    }
    assert_eq!(deliveries, [Delivery::New, Delivery::Duplicate]);
    sqlx::query(&format!("DROP TABLE {table}"))
        .execute(&pool)
        .await
        .unwrap();
}

// ---------------------------------------------------------------------------------------
// Messages that fail alone
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_mqtt_cannot_carry_fail_alone() {
    let prefix = fresh_prefix("hostile");
    let subscriber = Subscriber::start(&url(), &format!("{prefix}/#")).await;
    let sink = sink(
        MqttSinkConfig::new(url())
            .topic(format!("{prefix}/{{partition_key}}"))
            .max_payload_bytes(1024),
    )
    .await;
    // As rows written by another language may hold them: set past the builder's checks.
    let message = |key: &str, header: Option<(&str, &str)>| {
        let mut message = NewMessage::builder("events", "order.paid")
            .partition_key("k1")
            .build()
            .unwrap()
            .into_message(Utc::now());
        message.partition_key = Some(key.to_owned());
        if let Some((name, value)) = header {
            message.headers.insert(name.to_owned(), value.to_owned());
        }
        message
    };
    let mut large = message("k1", None);
    large.payload = vec![b'x'; 2048];
    // A packet over the sink's own limit would make rumqttc drop the whole connection.
    let huge_header = "h".repeat(300 * 1024);
    let batch = vec![
        large,
        message("k1", Some(("x-huge", &huge_header))),
        message("a/+", None),
        message("b/#", None),
        message("k1", Some(("x-nul", "a\0b"))),
        message("k1", Some(("outbox-id", "forged"))),
        message("k1", Some(("x-ok", "fine"))),
    ];
    let outcomes = publish(&sink, &batch).await;
    let expected = [
        FailureClass::TooLarge,
        FailureClass::TooLarge,
        FailureClass::Config,
        FailureClass::Config,
        FailureClass::Serialization,
        FailureClass::Serialization,
    ];
    for (i, class) in expected.iter().enumerate() {
        let Outcome::Failed(failure) = &outcomes[i] else {
            panic!("message {i} was published: {:?}", outcomes[i])
        };
        assert_eq!(failure.class, *class, "message {i}: {failure}");
        assert!(!failure.retryable, "message {i}: {failure}");
    }
    assert!(outcomes[6].is_published(), "{:?}", outcomes[6]);
    let got = subscriber.wait_for(1).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(got.len(), 1, "only the good message reached the broker");
    assert_eq!(read_publish(&got[0]).unwrap().id, batch[6].id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_the_acl_denies_is_dead_lettered_alone_over_mqtt_5() {
    let dir = tempfile::tempdir().unwrap();
    let acl = dir.path().join("acl");
    std::fs::write(&acl, "topic readwrite allowed/#\ntopic read denied/#\n").unwrap();
    let broker = PrivateServer::mosquitto(dir.path(), &format!("acl_file {}", acl.display()));
    let subscriber = Subscriber::start(&broker.url, "allowed/#").await;
    let sink = sink(MqttSinkConfig::new(&broker.url).topic("{destination}/events")).await;
    let mut batch = sink_suite::messages("allowed", 2);
    batch[1].destination = "denied".to_owned();
    let outcomes = publish(&sink, &batch).await;
    assert!(outcomes[0].is_published(), "{:?}", outcomes[0]);
    let Outcome::Failed(failure) = &outcomes[1] else {
        panic!("published to a denied topic: {:?}", outcomes[1])
    };
    assert_eq!(failure.class, FailureClass::Rejected, "{failure}");
    assert!(!failure.retryable, "{failure}");
    assert!(failure.message.contains("0x87"), "{failure}");
    assert_eq!(subscriber.wait_for(1).await.len(), 1);
}

// ---------------------------------------------------------------------------------------
// Start-up
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_up_errors_say_what_to_fix() {
    let dir = tempfile::tempdir().unwrap();
    let passwords = dir.path().join("passwords");
    // mosquitto_passwd's format: user:$7$… ; a user with no usable hash never logs in.
    std::fs::write(&passwords, "relay:$7$101$invalid$invalid\n").unwrap();
    let broker = PrivateServer::mosquitto(
        dir.path(),
        &format!(
            "allow_anonymous false\npassword_file {}",
            passwords.display()
        ),
    );
    let refused = MqttSink::connect(MqttSinkConfig::new(
        broker.url.replace("mqtt://", "mqtt://relay:hunter2@"),
    ))
    .await
    .unwrap_err();
    assert!(
        matches!(refused, MqttSinkError::Connect { .. }),
        "{refused}"
    );
    assert!(
        !refused.is_retryable(),
        "a refused login needs a change: {refused}"
    );
    assert!(!refused.to_string().contains("hunter2"), "{refused}");

    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let down = MqttSink::connect(
        MqttSinkConfig::new(format!("mqtt://127.0.0.1:{port}"))
            .connect_timeout(Duration::from_secs(2)),
    )
    .await
    .unwrap_err();
    assert!(
        down.is_retryable(),
        "a broker that is down may come up: {down}"
    );
}

// ---------------------------------------------------------------------------------------
// Broker restarts and connection cuts
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_loses_nothing_across_broker_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let mut broker = PrivateServer::mosquitto(dir.path(), "");
    let prefix = fresh_prefix("restart");
    // A persistent session: the broker keeps what arrives while the subscriber is away.
    let subscriber = Subscriber::start(&broker.url, &format!("{prefix}/#")).await;
    let sink = sink(MqttSinkConfig::new(&broker.url).topic(format!("{prefix}/events"))).await;
    let store = MemoryStore::new();
    let relay = Relay::builder(store.clone())
        .route("events", sink)
        .batch_size(50)
        .poll_interval(Duration::from_millis(20))
        .build()
        .unwrap();
    let running = relay.spawn();
    let mut ids = Vec::new();
    for _ in 0..3 {
        let messages = outbox_engine::testkit::numbered("events", "order.paid", 300);
        ids.extend(messages.iter().map(NewMessage::id));
        store.enqueue_all(messages).unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        // mosquitto writes its persistence file on a clean stop: a SIGKILL would lose
        // what it acknowledged since its last autosave, a broker matter, not the relay's.
        broker.stop();
        tokio::time::sleep(Duration::from_millis(500)).await;
        broker.restart();
    }
    wait_until(
        "every message published",
        Duration::from_secs(60),
        || async {
            ids.iter()
                .all(|id| store.row(*id).unwrap().row.status() == Status::Published)
        },
    )
    .await;
    tokio::time::timeout(Duration::from_secs(20), running.stop())
        .await
        .expect("the relay stopped within 20 s")
        .unwrap();
    let wanted: std::collections::HashSet<String> = ids.iter().map(ToString::to_string).collect();
    wait_until(
        "the subscriber to have every message",
        Duration::from_secs(30),
        || async {
            let got: std::collections::HashSet<String> = subscriber
                .delivered(Protocol::V5)
                .into_iter()
                .map(|d| d.id)
                .collect();
            wanted.is_subset(&got)
        },
    )
    .await;
}
