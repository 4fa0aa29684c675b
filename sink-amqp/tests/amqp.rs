//! The AMQP sink against a real RabbitMQ (`OUTBOX_TEST_AMQP_URL`, default
//! `amqp://guest:guest@127.0.0.1:5672/outbox-test`): the sink conformance suite on the
//! default exchange and on a topic exchange, unroutable messages dead-lettered, every
//! property read back by a consumer, per-key order across two relays, a message for a
//! missing exchange failing alone, and typed start-up errors.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use outbox_engine::testkit::{BinaryPayloads, Delivered, SinkHarness, sink_suite};
use outbox_engine::{
    DeadHead, FailureClass, MemoryStore, MessageOrder, NewMessage, Outcome, Relay, Status,
};
use outbox_sink_amqp::{AmqpSink, AmqpSinkConfig, AmqpSinkError, read_delivery};

mod common;
use common::{Broker, delivered, header, sink, url};
use outbox_engine::testkit::publish;

// ---------------------------------------------------------------------------------------
// Conformance suite
// ---------------------------------------------------------------------------------------

struct Harness {
    sink: AmqpSink,
    broker: Broker,
    queue: String,
    got: Mutex<Vec<Delivered>>,
}

impl SinkHarness for Harness {
    type Sink = AmqpSink;

    fn sink(&self) -> &AmqpSink {
        &self.sink
    }

    async fn received(&self) -> Vec<Delivered> {
        let new: Vec<Delivered> = self
            .broker
            .take(&self.queue)
            .await
            .iter()
            .map(delivered)
            .collect();
        let mut got = self.got.lock().unwrap();
        got.extend(new);
        got.clone()
    }
}

/// Runs the suite with a fresh queue per check: on the default exchange (routing key =
/// queue name), or through a topic exchange bound to the queue with `#`.
async fn run_suite(topic: bool) {
    let made = Arc::new(Mutex::new((Vec::new(), Vec::new())));
    sink_suite::run_all(|| {
        let made = Arc::clone(&made);
        async move {
            let broker = Broker::connect().await;
            let queue = broker.queue("suite").await;
            let config = if topic {
                let exchange = broker.exchange("suite", Some((&queue, "#"))).await;
                made.lock().unwrap().1.push(exchange.clone());
                AmqpSinkConfig::new(url())
                    .exchange(exchange)
                    .routing_key("{destination}.{event_type}")
            } else {
                AmqpSinkConfig::new(url()).routing_key(queue.clone())
            };
            made.lock().unwrap().0.push(queue.clone());
            Harness {
                sink: sink(config).await,
                broker,
                queue,
                got: Mutex::new(Vec::new()),
            }
        }
    })
    .await;
    let (queues, exchanges) = made.lock().unwrap().clone();
    Broker::connect().await.cleanup(&queues, &exchanges).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_on_the_default_exchange() {
    run_suite(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_through_a_topic_exchange() {
    run_suite(true).await;
}

// ---------------------------------------------------------------------------------------
// Unroutable messages
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_no_queue_receives_is_dead_lettered_not_published() {
    let broker = Broker::connect().await;
    let queue = broker.queue("routed").await;
    // Only `order.*` reaches the queue; `invoice.paid` is acked by the broker and returned.
    let exchange = broker
        .exchange("unroutable", Some((&queue, "order.*")))
        .await;
    let sink = sink(
        AmqpSinkConfig::new(url())
            .exchange(exchange.clone())
            .routing_key("{event_type}"),
    )
    .await;
    let store = MemoryStore::new();
    let routed = NewMessage::builder("events", "order.paid").build().unwrap();
    let unroutable = NewMessage::builder("events", "invoice.paid")
        .build()
        .unwrap();
    let (routed_id, unroutable_id) = (routed.id(), unroutable.id());
    store.enqueue_all(vec![routed, unroutable]).unwrap();
    let relay = Relay::builder(store.clone())
        .route("events", sink)
        .build()
        .unwrap();
    relay.drain().await.unwrap();

    assert_eq!(
        store.row(routed_id).unwrap().row.status(),
        Status::Published
    );
    let dead = store.row(unroutable_id).unwrap().row;
    assert_eq!(
        dead.status(),
        Status::Dead,
        "an unroutable message is not published"
    );
    let reason = dead.last_error.unwrap_or_default();
    assert!(
        reason.contains("312") && reason.contains("NO_ROUTE") && reason.contains("invoice.paid"),
        "the reason names the reply and the routing key: {reason}"
    );
    let got = broker.take(&queue).await;
    assert_eq!(got.len(), 1);
    assert_eq!(delivered(&got[0]).id, routed_id.to_string());

    // An exchange with no queue bound at all: the broker acks, the sink does not publish.
    let unbound = broker.exchange("unbound", None).await;
    let outcomes = publish(
        &common::sink(AmqpSinkConfig::new(url()).exchange(unbound.clone())).await,
        &sink_suite::messages("events", 3),
    )
    .await;
    for outcome in &outcomes {
        let Outcome::Failed(failure) = outcome else {
            panic!("published to an exchange with no queue: {outcome:?}")
        };
        assert_eq!(failure.class, FailureClass::Unroutable, "{failure}");
        assert!(!failure.retryable, "{failure}");
    }
    broker.cleanup(&[queue], &[exchange, unbound]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn returns_are_matched_to_their_own_messages_in_mixed_batches() {
    // Transient messages to a non-durable queue are confirmed fast, so the broker merges
    // confirms (`multiple`) across routed and returned messages.
    let broker = Broker::connect().await;
    let queue = common::fresh_name("mixed");
    broker.declare_queue(&queue, Default::default()).await;
    let exchange = broker.exchange("mixed", Some((&queue, "routed"))).await;
    let sink = sink(
        AmqpSinkConfig::new(url())
            .exchange(exchange.clone())
            .routing_key("{event_type}")
            .persistent(false),
    )
    .await;
    for round in 0..5 {
        let batch: Vec<_> = (0..200)
            .map(|i| {
                let kind = if fastrand::bool() {
                    "routed"
                } else {
                    "dropped"
                };
                NewMessage::builder("events", kind)
                    .json(&i)
                    .build()
                    .unwrap()
                    .into_message(Utc::now())
            })
            .collect();
        let outcomes = publish(&sink, &batch).await;
        for (message, outcome) in batch.iter().zip(&outcomes) {
            match (message.event_type.as_str(), outcome) {
                ("routed", o) => assert!(o.is_published(), "round {round}: {o:?}"),
                (_, Outcome::Failed(f)) => {
                    assert_eq!(f.class, FailureClass::Unroutable, "round {round}: {f}")
                }
                (_, o) => panic!("round {round}: an unroutable message got {o:?}"),
            }
        }
        let got: std::collections::BTreeSet<String> = broker
            .take(&queue)
            .await
            .iter()
            .map(|d| delivered(d).id)
            .collect();
        let routed: std::collections::BTreeSet<String> = batch
            .iter()
            .filter(|m| m.event_type == "routed")
            .map(|m| m.id.to_string())
            .collect();
        assert_eq!(
            got, routed,
            "round {round}: exactly the routed ones arrived"
        );
    }
    broker.cleanup(&[queue], &[exchange]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quorum_queue_is_a_matter_of_the_queue_not_the_sink() {
    let broker = Broker::connect().await;
    let queue = common::fresh_name("quorum");
    let mut arguments = outbox_sink_amqp::client::types::FieldTable::default();
    arguments.insert(
        "x-queue-type".into(),
        outbox_sink_amqp::client::types::AMQPValue::LongString("quorum".into()),
    );
    broker
        .channel
        .queue_declare(
            queue.as_str().into(),
            outbox_sink_amqp::client::options::QueueDeclareOptions::durable(),
            arguments,
        )
        .await
        .unwrap();
    let sink = sink(AmqpSinkConfig::new(url()).routing_key(queue.clone())).await;
    let batch = sink_suite::messages("quorum", 20);
    let outcomes = publish(&sink, &batch).await;
    assert!(outcomes.iter().all(Outcome::is_published), "{outcomes:?}");
    let got: Vec<Delivered> = broker.take(&queue).await.iter().map(delivered).collect();
    let expected: Vec<Delivered> = batch.iter().map(Delivered::expected).collect();
    assert_eq!(got, expected, "every message, in order, exactly");
    broker.cleanup(&[queue], &[]).await;
}

// ---------------------------------------------------------------------------------------
// A consumer reads every property
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_reads_back_every_property_exactly() {
    let broker = Broker::connect().await;
    let queue = broker.queue("props").await;
    let sink = sink(AmqpSinkConfig::new(url()).routing_key(queue.clone())).await;
    let full = sink_suite::full_message(BinaryPayloads::Exact);
    let bare = sink_suite::bare_message();
    let outcomes = publish(&sink, &[full.clone(), bare.clone()]).await;
    assert!(outcomes.iter().all(Outcome::is_published), "{outcomes:?}");

    let got = broker.take(&queue).await;
    assert_eq!(got.len(), 2);
    let first = read_delivery(&got[0]).unwrap();
    assert_eq!(first.id, full.id);
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
    assert_eq!(first.payload, full.payload);
    assert_eq!(first.headers, full.headers);
    let props = &got[0].properties;
    assert_eq!(*props.delivery_mode(), Some(2), "persistent by default");
    assert_eq!(
        *props.timestamp(),
        Some(full.created_at.timestamp() as u64),
        "timestamp is the creation time"
    );
    assert_eq!(
        header(&got[0], "traceparent").as_deref(),
        Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
    );

    let second = read_delivery(&got[1]).unwrap();
    assert_eq!(second.id, bare.id);
    assert_eq!(
        second.idempotency_key,
        bare.id.to_string(),
        "the default key is the id"
    );
    assert_eq!(second.partition_key, None);
    assert_eq!(second.tenant_id, None);
    assert_eq!(second.content_type.as_deref(), Some("application/json"));
    assert!(second.headers.is_empty());
    broker.cleanup(&[queue], &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivered_message_is_a_duplicate_in_the_consumers_inbox() {
    use outbox_sqlx::postgres::PgInbox;
    use outbox_sqlx::{Delivery, Inbox};

    let pool = outbox_test_support::postgres_pool().await;
    let table = format!("amqp_inbox_{:016x}", fastrand::u64(..));
    let inbox = PgInbox::with_names(outbox_sqlx::TableNames::default().inbox(&table).unwrap());
    inbox.migrate(&pool).await.unwrap();

    let broker = Broker::connect().await;
    let queue = broker.queue("inbox").await;
    let sink = sink(AmqpSinkConfig::new(url()).routing_key(queue.clone())).await;
    let message = NewMessage::builder("billing", "invoice.paid")
        .idempotency_key("invoice-9:paid")
        .build()
        .unwrap()
        .into_message(Utc::now());
    // The relay re-sends after a lost acknowledgement: the same message twice.
    for _ in 0..2 {
        let outcomes = publish(&sink, std::slice::from_ref(&message)).await;
        assert!(outcomes[0].is_published());
    }
    let mut seen = Vec::new();
    for delivery in broker.take(&queue).await {
        let received = read_delivery(&delivery).unwrap();
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
    broker.cleanup(&[queue], &[]).await;
}

// ---------------------------------------------------------------------------------------
// Per-key order across two relays
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_key_order_in_one_queue_equals_commit_order_across_two_relays() {
    const KEYS: usize = 20;
    const PER_KEY: usize = 25;
    let broker = Broker::connect().await;
    let queue = broker.queue("ordered").await;
    let exchange = broker.exchange("ordered", Some((&queue, "#"))).await;
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
    let relay = |name: &str| {
        let store = store.clone();
        let name = name.to_owned();
        let exchange = exchange.clone();
        async move {
            let sink = sink(
                AmqpSinkConfig::new(url())
                    .exchange(exchange)
                    .routing_key("{partition_key}"),
            )
            .await;
            Relay::builder(store)
                .route("orders", sink)
                .owner(name)
                .ordering(MessageOrder::PerKey(DeadHead::Halt))
                .batch_size(7)
                .concurrency(2)
                .poll_interval(Duration::from_millis(20))
                .build()
                .unwrap()
        }
    };
    let (a, b) = (relay("relay-a").await, relay("relay-b").await);
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let run = |relay: Relay<MemoryStore>| {
        let mut stop = stop.clone();
        tokio::spawn(async move {
            relay
                .run(async move {
                    let _ = stop.wait_for(|s| *s).await;
                })
                .await
        })
    };
    let (ra, rb) = (run(a), run(b));
    let got = Mutex::new(Vec::new());
    outbox_test_support::wait_until(
        "every message in the queue",
        Duration::from_secs(60),
        || async {
            let new = broker.take(&queue).await;
            let mut got = got.lock().unwrap();
            got.extend(new);
            got.len() >= KEYS * PER_KEY
        },
    )
    .await;
    let got = got.into_inner().unwrap();
    stop_tx.send(true).unwrap();
    ra.await.unwrap();
    rb.await.unwrap();

    let mut per_key: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for delivery in &got {
        let body: serde_json::Value = serde_json::from_slice(&delivery.data).unwrap();
        per_key
            .entry(delivery.routing_key.as_str().to_owned())
            .or_default()
            .push(body["n"].as_u64().unwrap());
    }
    assert_eq!(per_key.len(), KEYS);
    for (key, ns) in &per_key {
        let expected: Vec<u64> = (0..PER_KEY as u64).collect();
        assert_eq!(
            ns, &expected,
            "key {key} arrived in commit order, once each"
        );
    }
    broker.cleanup(&[queue], &[exchange]).await;
}

// ---------------------------------------------------------------------------------------
// Failures of one message
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_for_a_missing_exchange_fails_alone() {
    let broker = Broker::connect().await;
    let queue = broker.queue("isolated").await;
    let exchange = broker.exchange("isolated", Some((&queue, "#"))).await;
    // The exchange comes from the tenant: tenant `missing` names one that does not exist.
    let prefix = exchange.trim_end_matches(|c: char| c.is_ascii_hexdigit());
    let tenant_of_good = exchange[prefix.len()..].to_owned();
    let sink = sink(
        AmqpSinkConfig::new(url())
            .exchange(format!("{prefix}{{tenant_id}}"))
            .routing_key("{event_type}"),
    )
    .await;
    let batch: Vec<_> = (0..6)
        .map(|i| {
            let tenant = if i == 2 {
                "missing"
            } else {
                tenant_of_good.as_str()
            };
            NewMessage::builder("events", "order.paid")
                .json(&i)
                .tenant_id(tenant)
                .build()
                .unwrap()
                .into_message(Utc::now())
        })
        .collect();
    for round in 0..2 {
        let outcomes = publish(&sink, &batch).await;
        for (i, outcome) in outcomes.iter().enumerate() {
            if i == 2 {
                let Outcome::Failed(failure) = outcome else {
                    panic!("the message to a missing exchange failed: {outcome:?}")
                };
                assert_eq!(failure.class, FailureClass::Config, "{failure}");
                assert!(
                    failure.retryable,
                    "a missing exchange can be declared: {failure}"
                );
                assert!(failure.message.contains("404"), "{failure}");
            } else {
                assert!(
                    outcome.is_published(),
                    "round {round}, message {i}: {outcome:?}"
                );
            }
        }
    }
    // Checked before sending, so the batch's channel never closed: each once per round.
    let mut ids: Vec<String> = broker
        .take(&queue)
        .await
        .iter()
        .map(|d| delivered(d).id)
        .collect();
    ids.sort();
    let mut expected: Vec<String> = [0, 1, 3, 4, 5, 0, 1, 3, 4, 5]
        .iter()
        .map(|&i| batch[i].id.to_string())
        .collect();
    expected.sort();
    assert_eq!(ids, expected, "the other five arrived once per round");
    broker.cleanup(&[queue], &[exchange]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_before_sending_oversize_reserved_headers_and_unrenderable_names() {
    let broker = Broker::connect().await;
    let queue = broker.queue("refused").await;
    // Where a message keyed `p` would go, had it been sent.
    let routed = format!("{queue}p");
    broker.declare_queue(&routed, Default::default()).await;
    let sink = sink(
        AmqpSinkConfig::new(url())
            .routing_key(format!("{queue}{{partition_key}}"))
            .max_payload_bytes(1_000),
    )
    .await;
    let make = |b: outbox_engine::NewMessageBuilder| b.build().unwrap().into_message(Utc::now());
    let batch = vec![
        make(
            NewMessage::builder("e", "big")
                .bytes(vec![7; 1_001], "x/y")
                .partition_key("p"),
        ),
        make(
            NewMessage::builder("e", "reserved")
                .header("outbox-idempotency-key", "x")
                .partition_key("p"),
        ),
        make(NewMessage::builder("e", "no-key")),
        make(NewMessage::builder("e", "long").partition_key("k".repeat(255))),
    ];
    let outcomes = publish(&sink, &batch).await;
    let failure = |i: usize| match &outcomes[i] {
        Outcome::Failed(f) => {
            assert!(!f.retryable, "message {i} fails permanently: {f}");
            f.class
        }
        other => panic!("message {i} should fail: {other:?}"),
    };
    assert_eq!(failure(0), FailureClass::TooLarge);
    assert_eq!(failure(1), FailureClass::Serialization);
    assert_eq!(failure(2), FailureClass::Config);
    assert_eq!(failure(3), FailureClass::Config);
    assert!(broker.take(&routed).await.is_empty(), "nothing was sent");
    broker.cleanup(&[queue, routed], &[]).await;
}

/// Headers travel in one frame: 64 headers of 8 KiB (inside the table's limits) are over
/// RabbitMQ's frame size, which would make it close the whole connection. The sink refuses
/// that message alone and at once, naming the frame size; a message just under the frame
/// size and the rest of the batch go through on the same connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_over_the_frame_size_fail_alone_before_sending() {
    let broker = Broker::connect().await;
    let queue = broker.queue("frame").await;
    let sink = sink(AmqpSinkConfig::new(url()).routing_key(queue.clone())).await;
    let with_headers = |n: usize| {
        let mut builder = NewMessage::builder("e", "wide").json(&n);
        for i in 0..n {
            builder = builder.header(format!("x-h{i:02}"), "v".repeat(8 * 1024));
        }
        builder.build().unwrap().into_message(Utc::now())
    };
    let batch = vec![
        with_headers(0),
        with_headers(64),
        with_headers(15),
        with_headers(1),
    ];
    for round in 0..2 {
        let outcomes = publish(&sink, &batch).await;
        let Outcome::Failed(failure) = &outcomes[1] else {
            panic!(
                "round {round}: 64 headers of 8 KiB must fail: {:?}",
                outcomes[1]
            );
        };
        assert_eq!(failure.class, FailureClass::TooLarge, "{failure}");
        assert!(!failure.retryable, "{failure}");
        assert!(failure.message.contains("frame_max"), "{failure}");
        for i in [0, 2, 3] {
            assert!(
                outcomes[i].is_published(),
                "round {round}, message {i}: {:?}",
                outcomes[i]
            );
        }
    }
    let got = broker.take(&queue).await;
    assert_eq!(got.len(), 6, "three messages, twice");
    broker.cleanup(&[queue], &[]).await;
}

// ---------------------------------------------------------------------------------------
// Start-up errors
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_up_refuses_a_missing_exchange_bad_credentials_and_an_unknown_vhost() {
    let missing =
        AmqpSink::connect(AmqpSinkConfig::new(url()).exchange("outbox-test.no-such-exchange"))
            .await
            .unwrap_err();
    assert!(
        matches!(missing, AmqpSinkError::ExchangeNotFound { .. }),
        "{missing}"
    );
    assert!(!missing.is_retryable());

    let mut wrong = url::Url::parse(&url()).unwrap();
    wrong.set_password(Some("not-the-password")).unwrap();
    let refused = AmqpSink::connect(AmqpSinkConfig::new(wrong.as_str()).routing_key("q"))
        .await
        .unwrap_err();
    let text = refused.to_string();
    assert!(matches!(refused, AmqpSinkError::Connect { .. }), "{text}");
    assert!(
        !text.contains("not-the-password"),
        "the password is hidden: {text}"
    );

    let mut vhost = url::Url::parse(&url()).unwrap();
    vhost.set_path("/no-such-vhost");
    let unknown = AmqpSink::connect(AmqpSinkConfig::new(vhost.as_str()).routing_key("q"))
        .await
        .unwrap_err();
    assert!(
        matches!(unknown, AmqpSinkError::Connect { .. }),
        "{unknown}"
    );

    let closed = AmqpSink::connect(
        AmqpSinkConfig::new("amqp://guest:guest@127.0.0.1:1/%2f")
            .routing_key("q")
            .connect_timeout(Duration::from_secs(2)),
    )
    .await
    .unwrap_err();
    assert!(
        closed.is_retryable(),
        "a broker that is down may come up: {closed}"
    );
}
