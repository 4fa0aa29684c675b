//! The SQS sink against a real SQS emulator (moto_server, `OUTBOX_TEST_SQS_ENDPOINT`,
//! default `http://127.0.0.1:4566`): the sink conformance suite on a standard and a FIFO
//! queue, every attribute and body read back by a consumer, per-entry outcomes of a
//! partly failed batch (injected by a proxy, as moto never fails entries itself), what
//! AWS would refuse refused by the sink, sizes, FIFO order across two relays, the
//! consumer's inbox, and typed start-up errors.

use std::collections::BTreeMap;
use std::time::Duration;

use aws_sdk_sqs::types::{MessageSystemAttributeName, QueueAttributeName};
use chrono::Utc;
use outbox_engine::testkit::{BinaryPayloads, Delivered, SinkHarness, sink_suite};
use outbox_engine::{
    DeadHead, FailureClass, MemoryStore, Message, MessageOrder, NewMessage, Outcome,
    PublishContext, Relay, Status,
};
use outbox_sink_sqs::client as aws_sdk_sqs;
use outbox_sink_sqs::{Binary, SqsSink, SqsSinkConfig, SqsSinkError, read_message, sqs_id};

mod common;
use common::{Fault, FaultProxy, Reader, Sqs, config, config_via, delivered, sink, system};
use outbox_engine::testkit::publish;

// ---------------------------------------------------------------------------------------
// Conformance suite
// ---------------------------------------------------------------------------------------

struct Harness {
    sink: SqsSink,
    reader: tokio::sync::Mutex<Reader>,
    binary: BinaryPayloads,
}

impl SinkHarness for Harness {
    type Sink = SqsSink;

    fn sink(&self) -> &SqsSink {
        &self.sink
    }

    async fn received(&self) -> Vec<Delivered> {
        let mut reader = self.reader.lock().await;
        reader.poll().await;
        reader.got.iter().map(delivered).collect()
    }

    fn binary_payloads(&self) -> BinaryPayloads {
        self.binary
    }
}

/// The conformance suite, each check on a fresh queue (FIFO or standard) with the sink
/// `configure` sets up, held to what it does with binary payloads.
async fn run_suite(
    fifo: bool,
    configure: fn(SqsSinkConfig) -> SqsSinkConfig,
    binary: BinaryPayloads,
) {
    sink_suite::run_all(|| async {
        let sqs = Sqs::connect().await;
        let queue = sqs.queue("suite", fifo).await;
        let sink = sink(configure(config(&queue))).await;
        assert_eq!(sink.is_fifo(), fifo);
        Harness {
            sink,
            reader: tokio::sync::Mutex::new(sqs.reader(&queue)),
            binary,
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_suite_on_a_standard_queue_with_base64_bodies() {
    run_suite(false, |c| c.binary(Binary::Base64), BinaryPayloads::Exact).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_suite_on_a_fifo_queue() {
    // SQS carries text; without `binary = "base64"` the sink refuses bytes.
    run_suite(true, |c| c, BinaryPayloads::Refused).await;
}

// ---------------------------------------------------------------------------------------
// What a consumer reads
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_reads_every_message_with_exact_body_and_attributes() {
    let sqs = Sqs::connect().await;
    for fifo in [false, true] {
        let queue = sqs.queue("layout", fifo).await;
        let sink = sink(config(&queue)).await;
        let full = sink_suite::full_message(BinaryPayloads::Refused);
        // Five headers do not fit beside eight attributes: they travel as one JSON attribute.
        let mut crowded = full.clone();
        crowded.id = outbox_engine::MessageId::new();
        crowded.idempotency_key = "invoice-8:paid".into();
        crowded.partition_key = Some("invoice 8 (needs a hash)".into());
        for i in 0..5 {
            crowded
                .headers
                .insert(format!("x-extra-{i}"), format!("v{i}"));
        }
        let bare = sink_suite::bare_message();
        let batch = [full.clone(), crowded.clone(), bare.clone()];
        let outcomes = publish(&sink, &batch).await;
        let receipts: Vec<String> = outcomes
            .iter()
            .map(|o| match o {
                Outcome::Published { receipt: Some(r) } => r.clone(),
                other => panic!("published with a receipt: {other:?}"),
            })
            .collect();

        let mut reader = sqs.reader(&queue);
        let got = reader.read(3, Duration::from_secs(20)).await.to_vec();
        assert_eq!(got.len(), 3, "each message once");
        for (sent, receipt) in batch.iter().zip(&receipts) {
            let message = got
                .iter()
                .find(|m| read_message(m).unwrap().id == sent.id)
                .unwrap_or_else(|| panic!("message {} received", sent.id));
            let received = read_message(message).unwrap();
            assert_eq!(received.idempotency_key, sent.idempotency_key);
            assert_eq!(received.event_type, sent.event_type);
            assert_eq!(received.content_type.as_deref(), Some("application/json"));
            assert_eq!(received.partition_key, sent.partition_key);
            assert_eq!(received.tenant_id, sent.tenant_id);
            assert_eq!(received.aggregate_type, sent.aggregate_type);
            assert_eq!(received.aggregate_id, sent.aggregate_id);
            assert_eq!(
                received.headers, sent.headers,
                "every header, traceparent included"
            );
            assert_eq!(
                message.body().unwrap().as_bytes(),
                sent.payload,
                "body as sent"
            );
            assert_eq!(received.payload, sent.payload);
            let attributes = message.message_attributes().map_or(0, |a| a.len());
            assert!(attributes <= 10, "{attributes} attributes");
            let message_id = message.message_id().unwrap();
            if fifo {
                let sequence = system(message, MessageSystemAttributeName::SequenceNumber).unwrap();
                assert_eq!(receipt, &format!("{message_id}@{sequence}"));
                let group = system(message, MessageSystemAttributeName::MessageGroupId).unwrap();
                let key = sent
                    .partition_key
                    .as_deref()
                    .unwrap_or(outbox_sink_sqs::DEFAULT_GROUP);
                assert_eq!(group, sqs_id(key), "group = partition key");
                let dedupe =
                    system(message, MessageSystemAttributeName::MessageDeduplicationId).unwrap();
                assert_eq!(
                    dedupe, sent.idempotency_key,
                    "deduplication id = idempotency key"
                );
            } else {
                assert_eq!(receipt, message_id, "the receipt is the SQS message id");
            }
        }
        let crowded_in = got
            .iter()
            .find(|m| read_message(m).unwrap().id == crowded.id)
            .unwrap();
        assert!(
            crowded_in
                .message_attributes()
                .unwrap()
                .contains_key(outbox_sink_sqs::HEADERS_ATTRIBUTE),
            "the crowded headers went as one JSON attribute"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivered_message_is_a_duplicate_in_the_consumers_inbox() {
    use outbox_sqlx::postgres::PgInbox;
    use outbox_sqlx::{Delivery, Inbox};

    let pool = outbox_test_support::postgres_pool().await;
    let table = format!("sqs_inbox_{:016x}", fastrand::u64(..));
    let inbox = PgInbox::with_names(outbox_sqlx::TableNames::default().inbox(&table).unwrap());
    inbox.migrate(&pool).await.unwrap();

    let sqs = Sqs::connect().await;
    // A standard queue keeps both copies (a FIFO queue would drop the second itself).
    let queue = sqs.queue("inbox", false).await;
    let sink = sink(config(&queue)).await;
    let message = sink_suite::full_message(BinaryPayloads::Refused);
    for _ in 0..2 {
        let outcomes = publish(&sink, std::slice::from_ref(&message)).await;
        assert!(outcomes[0].is_published(), "{outcomes:?}");
    }
    let mut reader = sqs.reader(&queue);
    let mut seen = Vec::new();
    for m in reader.read(2, Duration::from_secs(20)).await {
        let received = read_message(m).unwrap();
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
// Per-entry outcomes
// ---------------------------------------------------------------------------------------

/// A fresh standard queue and a sink that reaches it through a [`FaultProxy`].
async fn behind_a_proxy(sqs: &Sqs, prefix: &str) -> (String, FaultProxy, SqsSink) {
    let queue = sqs.queue(prefix, false).await;
    let proxy = FaultProxy::start(&sqs.endpoint).await;
    let sink = sink(config_via(&queue, &proxy.endpoint)).await;
    (queue, proxy, sink)
}

fn marked(n: usize, fault: Option<Fault>) -> NewMessage {
    let text = match fault {
        Some(fault) => format!("message {n} {}", fault.marker()),
        None => format!("message {n}"),
    };
    NewMessage::builder("billing", "invoice.paid")
        .json(&serde_json::json!({ "n": n, "text": text }))
        .build()
        .unwrap()
}

/// Publishes messages `0..n` through `sink`, each [`marked`] with its fault from `faults`.
async fn publish_marked(
    sink: &SqsSink,
    n: usize,
    faults: impl Fn(usize) -> Option<Fault>,
) -> Vec<Outcome> {
    let batch: Vec<Message> = (0..n)
        .map(|i| marked(i, faults(i)).into_message(Utc::now()))
        .collect();
    publish(sink, &batch).await
}

/// How many messages `queue` holds, read by a fresh consumer.
async fn queued(sqs: &Sqs, queue: &str) -> usize {
    sqs.reader(queue)
        .drain(Duration::from_millis(500))
        .await
        .len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partly_failed_batch_marks_the_successes_dead_letters_sender_faults_and_retries_the_rest()
{
    let sqs = Sqs::connect().await;
    let (queue, proxy, sink) = behind_a_proxy(&sqs, "partial").await;

    // One batch of 10: entries 2 and 7 are the sender's fault, 4 and 5 fail on SQS's side once.
    let faults = |n: usize| match n {
        2 | 7 => Some(Fault::Sender),
        4 | 5 => Some(Fault::ServerOnce),
        _ => None,
    };
    let outcomes = publish_marked(&sink, 10, faults).await;
    for (n, outcome) in outcomes.iter().enumerate() {
        match (faults(n), outcome) {
            (None, Outcome::Published { receipt: Some(_) }) => {}
            (Some(Fault::Sender), Outcome::Failed(f)) => {
                assert!(
                    !f.retryable && f.class == FailureClass::Rejected,
                    "{n}: {f}"
                );
                assert!(f.message.contains("InvalidParameterValue"), "{n}: {f}");
            }
            (Some(Fault::ServerOnce), Outcome::Failed(f)) => {
                assert!(f.retryable, "{n}: {f}");
            }
            (fault, outcome) => panic!("entry {n} ({fault:?}): {outcome:?}"),
        }
    }
    assert_eq!(
        proxy.state.lock().unwrap().batches,
        [10],
        "one request for the batch"
    );
    let mut reader = sqs.reader(&queue);
    let ns = |reader: &Reader| -> Vec<u64> {
        let mut ns: Vec<u64> = reader
            .got
            .iter()
            .map(|m| {
                let body: serde_json::Value = serde_json::from_str(m.body().unwrap()).unwrap();
                body["n"].as_u64().unwrap()
            })
            .collect();
        ns.sort_unstable();
        ns
    };
    reader.drain(Duration::from_millis(500)).await;
    assert_eq!(
        ns(&reader),
        [0, 1, 3, 6, 8, 9],
        "exactly the successful entries are on the queue"
    );

    // Through the relay: the sender faults end dead, the rest published once retried.
    let store = MemoryStore::new();
    let ids: Vec<_> = (0..10)
        .map(|n| store.enqueue(marked(n, faults(n))).unwrap())
        .collect();
    let relay = Relay::builder(store.clone())
        .route("billing", sink)
        .retry(outbox_engine::RetryPolicy::exponential(
            Duration::from_millis(10),
            Duration::from_millis(50),
        ))
        .build()
        .unwrap();
    outbox_test_support::wait_until(
        "every row published or dead",
        Duration::from_secs(30),
        || {
            let (relay, store) = (&relay, &store);
            async move {
                relay.drain().await.unwrap();
                store.ids_with_status(Status::Published).len() == 8
                    && store.ids_with_status(Status::Dead).len() == 2
            }
        },
    )
    .await;
    let dead = store.ids_with_status(Status::Dead);
    assert!(dead.contains(&ids[2]) && dead.contains(&ids[7]), "{dead:?}");
    reader.got.clear();
    reader.drain(Duration::from_millis(500)).await;
    assert_eq!(
        ns(&reader),
        [0, 1, 3, 4, 5, 6, 8, 9],
        "the retried entries arrived, once each"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_the_answer_leaves_out_or_names_twice_is_retried_not_marked() {
    let sqs = Sqs::connect().await;
    let (queue, _proxy, sink) = behind_a_proxy(&sqs, "hostile").await;
    let faults = |n: usize| match n {
        1 => Some(Fault::Unanswered),
        3 => Some(Fault::Doubled),
        _ => None,
    };
    let outcomes = publish_marked(&sink, 5, faults).await;
    for (n, outcome) in outcomes.iter().enumerate() {
        match faults(n) {
            None => assert!(outcome.is_published(), "{n}: {outcome:?}"),
            Some(fault) => {
                let Outcome::Failed(f) = outcome else {
                    panic!("{n} ({fault:?}): {outcome:?}")
                };
                assert!(f.retryable, "{n} ({fault:?}): {f}");
            }
        }
    }
    // SQS took all five: the retries of 1 and 3 will be duplicates, never losses.
    assert_eq!(queued(&sqs, &queue).await, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_refused_whole_because_of_one_entry_is_split_until_that_entry_fails_alone() {
    let sqs = Sqs::connect().await;
    let (queue, proxy, sink) = behind_a_proxy(&sqs, "split").await;
    let outcomes = publish_marked(&sink, 10, |n| (n == 6).then_some(Fault::PoisonRequest)).await;
    for (n, outcome) in outcomes.iter().enumerate() {
        if n == 6 {
            let Outcome::Failed(f) = outcome else {
                panic!("{outcome:?}")
            };
            assert!(!f.retryable && f.class == FailureClass::Rejected, "{f}");
        } else {
            assert!(outcome.is_published(), "{n}: {outcome:?}");
        }
    }
    let batches = proxy.state.lock().unwrap().batches.clone();
    assert_eq!(batches[0], 10);
    assert!(batches.len() <= 1 + 2 * 4, "halving: {batches:?}");
    assert_eq!(queued(&sqs, &queue).await, 9);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_aws_would_refuse_is_refused_or_reshaped_by_the_sink_before_sending() {
    let sqs = Sqs::connect().await;
    let (queue, proxy, sink) = behind_a_proxy(&sqs, "strict").await;
    let now = Utc::now();
    let ok = NewMessage::builder("billing", "x")
        .json(&1)
        .build()
        .unwrap();
    // Twelve headers: with the sink's attributes that would be far over SQS's 10.
    let mut many = ok.clone().into_message(now);
    many.id = outbox_engine::MessageId::new();
    for i in 0..12 {
        many.headers.insert(format!("x-h{i}"), format!("v{i}"));
    }
    let mut control = ok.clone().into_message(now);
    control.id = outbox_engine::MessageId::new();
    control.payload = b"{\"bell\": \"\x07\"}".to_vec();
    let mut not_a_char = ok.clone().into_message(now);
    not_a_char.id = outbox_engine::MessageId::new();
    not_a_char.payload = "\u{FFFF}".as_bytes().to_vec();
    let mut bad_header = ok.clone().into_message(now);
    bad_header.id = outbox_engine::MessageId::new();
    bad_header.headers.insert("x-nul".into(), "a\u{0}b".into());
    let mut reserved = ok.clone().into_message(now);
    reserved.id = outbox_engine::MessageId::new();
    reserved.headers.insert("outbox-id".into(), "forged".into());
    let mut binary = ok.into_message(now);
    binary.id = outbox_engine::MessageId::new();
    binary.payload = vec![0xff, 0x00, 0x10];

    let batch = [
        many.clone(),
        control,
        not_a_char,
        bad_header,
        reserved,
        binary,
    ];
    let outcomes = publish(&sink, &batch).await;
    assert!(outcomes[0].is_published(), "{:?}", outcomes[0]);
    for (n, outcome) in outcomes.iter().enumerate().skip(1) {
        let Outcome::Failed(f) = outcome else {
            panic!("{n}: {outcome:?}")
        };
        assert!(
            !f.retryable && f.class == FailureClass::Serialization,
            "{n}: {f}"
        );
    }
    {
        let state = proxy.state.lock().unwrap();
        assert_eq!(state.batches, [1], "only the message SQS accepts was sent");
        assert!(
            state.refusable.is_empty(),
            "AWS would refuse: {:?}",
            state.refusable
        );
    }
    let mut reader = sqs.reader(&queue);
    let got = reader.read(1, Duration::from_secs(10)).await;
    assert_eq!(read_message(&got[0]).unwrap().headers, many.headers);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sizes_follow_the_queues_maximum_and_batches_stay_under_the_request_limit() {
    let sqs = Sqs::connect().await;
    let small = sqs
        .queue_with(
            "small",
            false,
            &[(QueueAttributeName::MaximumMessageSize, "2048")],
        )
        .await;
    let sink_small = sink(config(&small)).await;
    assert_eq!(sink_small.max_message_size(), 2048, "read from the queue");
    let message = |size: usize| {
        NewMessage::builder("billing", "blob")
            .json(&serde_json::json!({ "pad": "x".repeat(size) }))
            .build()
            .unwrap()
            .into_message(Utc::now())
    };
    let outcomes = publish(&sink_small, &[message(100), message(3000)]).await;
    assert!(outcomes[0].is_published(), "{:?}", outcomes[0]);
    let Outcome::Failed(f) = &outcomes[1] else {
        panic!("{:?}", outcomes[1])
    };
    assert!(!f.retryable && f.class == FailureClass::TooLarge, "{f}");
    assert!(f.message.contains("2048"), "{f}");

    // Ten messages of 300 KB: SQS refuses a request over 1 MiB, so the sink sends several.
    let (_big, proxy, sink_big) = behind_a_proxy(&sqs, "big").await;
    let batch: Vec<Message> = (0..10).map(|_| message(300_000)).collect();
    let outcomes = publish(&sink_big, &batch).await;
    assert!(outcomes.iter().all(Outcome::is_published), "{outcomes:?}");
    let batches = proxy.state.lock().unwrap().batches.clone();
    assert!(
        batches.iter().all(|&n| n <= 3),
        "at most 3 of 300 KB per request: {batches:?}"
    );
    assert_eq!(batches.iter().sum::<usize>(), 10);
}

// ---------------------------------------------------------------------------------------
// FIFO order
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifo_groups_arrive_in_commit_order_across_two_relays() {
    const KEYS: usize = 12;
    const PER_KEY: usize = 15;
    let sqs = Sqs::connect().await;
    let queue = sqs.queue("ordered", true).await;
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
    let relay = |sink: SqsSink, owner: &str| {
        Relay::builder(store.clone())
            .route("orders", sink)
            .owner(owner)
            .ordering(MessageOrder::PerKey(DeadHead::Halt))
            .batch_size(7)
            .concurrency(2)
            .poll_interval(Duration::from_millis(20))
            .build()
            .unwrap()
    };
    let relays = [
        relay(sink(config(&queue)).await, "relay-a"),
        relay(sink(config(&queue)).await, "relay-b"),
    ];
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
    // Read while the relays run, as a consumer would.
    let mut reader = sqs.reader(&queue);
    reader.read(KEYS * PER_KEY, Duration::from_secs(90)).await;
    stop_tx.send(true).unwrap();
    for relay in running {
        relay.await.unwrap();
    }
    assert_eq!(
        store.ids_with_status(Status::Published).len(),
        KEYS * PER_KEY
    );
    // Arrival order per group: SQS hands out a group's messages in the order it took them
    // (moto's sequence numbers are random, so they cannot be sorted on).
    let mut per_group: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for m in &reader.got {
        let body: serde_json::Value = serde_json::from_str(m.body().unwrap()).unwrap();
        per_group
            .entry(system(m, MessageSystemAttributeName::MessageGroupId).unwrap())
            .or_default()
            .push(body["n"].as_u64().unwrap());
    }
    assert_eq!(per_group.len(), KEYS);
    let expected: Vec<u64> = (0..PER_KEY as u64).collect();
    for (group, ns) in &per_group {
        assert_eq!(ns, &expected, "group {group}: commit order, once each");
    }
}

// ---------------------------------------------------------------------------------------
// Start-up
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_up_refuses_a_missing_queue_and_an_unreachable_endpoint() {
    let sqs = Sqs::connect().await;
    let by_name = SqsSinkConfig::new("sqs://us-east-1/outbox-test-no-such-queue")
        .endpoint(&sqs.endpoint)
        .credentials("test", "test");
    match SqsSink::connect(by_name).await {
        Err(e @ SqsSinkError::QueueNotFound { .. }) => assert!(!e.is_retryable()),
        other => panic!("{other:?}"),
    }
    let queue = sqs.queue("startup", false).await;
    let by_url = config(&queue.replace("outbox-test-startup", "outbox-test-gone"));
    match SqsSink::connect(by_url).await {
        Err(SqsSinkError::QueueNotFound { .. }) => {}
        other => panic!("{other:?}"),
    }
    // Found by name, the sink uses the URL SQS gives.
    let name = queue.rsplit('/').next().unwrap();
    let found = sink(
        SqsSinkConfig::new(format!("sqs://us-east-1/{name}"))
            .endpoint(&sqs.endpoint)
            .credentials("test", "test"),
    )
    .await;
    assert_eq!(found.queue_url(), queue);

    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let started = std::time::Instant::now();
    let unreachable = config_via(&queue, &format!("http://127.0.0.1:{port}"))
        .connect_timeout(Duration::from_secs(2));
    match SqsSink::connect(unreachable).await {
        Err(e @ SqsSinkError::Connect { .. }) => assert!(e.is_retryable(), "{e}"),
        other => panic!("{other:?}"),
    }
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "bounded by connect_timeout"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_driver_builds_a_route_from_its_settings() {
    let sqs = Sqs::connect().await;
    let queue = sqs.queue("driver", true).await;
    let name = queue.rsplit('/').next().unwrap();
    let route = outbox_engine::registry::RouteSettings {
        route: "events".to_owned(),
        settings: serde_json::json!({
            "url": format!("sqs://us-east-1/{name}?default_group=events"),
            "endpoint": sqs.endpoint,
            "access_key_id": "test",
            "secret_access_key": "test",
        }),
    };
    let sink =
        (outbox_engine::registry::SinkDriver::of::<outbox_sink_sqs::SqsSink>().build)(&route)
            .await
            .expect("the route starts");
    let mut message = sink_suite::messages("events", 1);
    message[0].partition_key = None;
    let outcomes = sink
        .publish_dyn(&message, &PublishContext::default())
        .await
        .unwrap();
    assert!(outcomes[0].is_published(), "{outcomes:?}");
    let mut reader = sqs.reader(&queue);
    let got = reader.read(1, Duration::from_secs(20)).await;
    assert_eq!(
        system(&got[0], MessageSystemAttributeName::MessageGroupId).as_deref(),
        Some("events"),
        "the default group from the route's URL"
    );
}
