//! The NATS sink against a real JetStream server (`OUTBOX_TEST_NATS_URL`, default
//! `nats://127.0.0.1:4222`): the sink conformance suite on a fixed subject and through a
//! template, a consumer reading every header back, re-sends stored once by the duplicate
//! window, an inbox on the consumer's side, messages that fail alone (no stream, too
//! large, headers NATS cannot carry), typed start-up errors, and a server restart.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use futures_util::StreamExt;
use outbox_engine::testkit::{BinaryPayloads, Delivered, SinkHarness, publish, sink_suite};
use outbox_engine::{FailureClass, MemoryStore, NewMessage, Outcome, Relay, Status};
use outbox_sink_nats::client::jetstream::consumer::{self, pull};
use outbox_sink_nats::{NatsSink, NatsSinkConfig, NatsSinkError, read_message};
use outbox_test_support::servers::PrivateServer;
use outbox_test_support::wait_until;

mod common;
use common::{Server, delivered, sink, url};

// ---------------------------------------------------------------------------------------
// Conformance suite
// ---------------------------------------------------------------------------------------

struct Harness {
    sink: NatsSink,
    server: Server,
    stream: String,
}

impl SinkHarness for Harness {
    type Sink = NatsSink;

    fn sink(&self) -> &NatsSink {
        &self.sink
    }

    async fn received(&self) -> Vec<Delivered> {
        self.server
            .take(&self.stream)
            .await
            .iter()
            .map(delivered)
            .collect()
    }
}

/// Runs the suite with a fresh stream per check, on one fixed subject or on subjects
/// rendered from each message.
async fn run_suite(template: bool) {
    let made = Arc::new(Mutex::new(Vec::new()));
    sink_suite::run_all(|| {
        let made = Arc::clone(&made);
        async move {
            let server = Server::connect().await;
            let stream = server.stream("suite").await;
            made.lock().unwrap().push(stream.clone());
            let subject = if template {
                format!("{stream}.{{destination}}.{{event_type}}")
            } else {
                format!("{stream}.all")
            };
            Harness {
                sink: sink(NatsSinkConfig::new(url()).subject(subject)).await,
                server,
                stream,
            }
        }
    })
    .await;
    let streams = made.lock().unwrap().clone();
    Server::connect().await.delete(&streams).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_on_a_fixed_subject() {
    run_suite(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_through_a_subject_template() {
    run_suite(true).await;
}

// ---------------------------------------------------------------------------------------
// The receiving side
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pull_consumer_reads_back_every_header_exactly() {
    let server = Server::connect().await;
    let stream = server.stream("headers").await;
    let sink = sink(NatsSinkConfig::new(url()).subject(format!("{stream}.{{event_type}}"))).await;
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
    assert_eq!(receipts, [format!("{stream}/1"), format!("{stream}/2")]);

    let consumer: consumer::PullConsumer = server
        .jetstream
        .create_consumer_on_stream(
            pull::Config {
                ack_policy: consumer::AckPolicy::Explicit,
                ..Default::default()
            },
            &stream,
        )
        .await
        .unwrap();
    let mut messages = consumer.fetch().max_messages(2).messages().await.unwrap();
    let mut got = Vec::new();
    while let Some(message) = tokio::time::timeout(Duration::from_secs(10), messages.next())
        .await
        .expect("both messages within 10 s")
    {
        let message = message.unwrap();
        got.push(read_message(&message).unwrap());
        message.ack().await.unwrap();
    }
    assert_eq!(got.len(), 2);

    let first = &got[0];
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
    assert_eq!(first.payload, full.payload, "payload byte for byte");
    assert_eq!(
        first.headers, full.headers,
        "every message header, traceparent included, and no Nats-… header"
    );

    let second = &got[1];
    assert_eq!(second.id, bare.id);
    assert_eq!(second.idempotency_key, bare.id.to_string());
    assert_eq!(second.partition_key, None);
    assert!(second.headers.is_empty());

    let stored = server.take(&stream).await;
    assert_eq!(
        stored[0].subject.as_str(),
        format!("{stream}.invoice.paid"),
        "the subject rendered from the event type"
    );
    assert_eq!(
        stored[0].headers.get("Nats-Msg-Id").map(|v| v.as_str()),
        Some("invoice-7:paid"),
        "Nats-Msg-Id is the idempotency key"
    );
    server.delete(&[stream]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resend_is_stored_once_and_reported_as_a_duplicate() {
    let server = Server::connect().await;
    let stream = server.stream("dupes").await;
    let sink = sink(NatsSinkConfig::new(url()).subject(format!("{stream}.events"))).await;
    let batch = sink_suite::messages("events", 10);
    let first = publish(&sink, &batch).await;
    assert!(first.iter().all(Outcome::is_published), "{first:?}");
    // The relay sends the same messages again (it crashed before marking them).
    let again = publish(&sink, &batch).await;
    for (before, after) in first.iter().zip(&again) {
        let (
            Outcome::Published {
                receipt: Some(before),
            },
            Outcome::Published {
                receipt: Some(after),
            },
        ) = (before, after)
        else {
            panic!("published twice with receipts: {before:?} / {after:?}");
        };
        assert_eq!(
            after,
            &format!("{before} (duplicate)"),
            "the re-send names the first copy"
        );
    }
    let stored: Vec<Delivered> = server.take(&stream).await.iter().map(delivered).collect();
    let expected: Vec<Delivered> = batch.iter().map(Delivered::expected).collect();
    assert_eq!(stored, expected, "each message stored once, in order");
    server.delete(&[stream]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivered_message_is_a_duplicate_in_the_consumers_inbox() {
    use outbox_sqlx::postgres::PgInbox;
    use outbox_sqlx::{Delivery, Inbox};

    let pool = outbox_test_support::postgres_pool().await;
    let table = format!("nats_inbox_{:016x}", fastrand::u64(..));
    let inbox = PgInbox::with_names(outbox_sqlx::TableNames::default().inbox(&table).unwrap());
    inbox.migrate(&pool).await.unwrap();

    let server = Server::connect().await;
    let stream = server.stream("inbox").await;
    let sink = sink(NatsSinkConfig::new(url()).subject(format!("{stream}.billing"))).await;
    let message = NewMessage::builder("billing", "invoice.paid")
        .idempotency_key("invoice-9:paid")
        .build()
        .unwrap()
        .into_message(Utc::now());
    assert!(publish(&sink, &[message]).await[0].is_published());

    // The consumer handles the message but dies before acking it: JetStream delivers it
    // again after `ack_wait`, and the inbox recognises it.
    let consumer: consumer::PullConsumer = server
        .jetstream
        .create_consumer_on_stream(
            pull::Config {
                ack_policy: consumer::AckPolicy::Explicit,
                ack_wait: Duration::from_secs(1),
                ..Default::default()
            },
            &stream,
        )
        .await
        .unwrap();
    let mut deliveries = Vec::new();
    for attempt in 0..2 {
        let mut batch = consumer
            .fetch()
            .max_messages(1)
            .expires(Duration::from_secs(5))
            .messages()
            .await
            .unwrap();
        let message = tokio::time::timeout(Duration::from_secs(10), batch.next())
            .await
            .unwrap_or_else(|_| panic!("delivery {attempt} within 10 s"))
            .expect("a delivery")
            .unwrap();
        let received = read_message(&message).unwrap();
        let mut tx = pool.begin().await.unwrap();
        deliveries.push(
            inbox
                .record(&mut tx, "billing", &received.idempotency_key)
                .await
                .unwrap(),
        );
        tx.commit().await.unwrap();
        if attempt == 1 {
            message.ack().await.unwrap();
        }
    }
    assert_eq!(deliveries, [Delivery::New, Delivery::Duplicate]);
    sqlx::query(&format!("DROP TABLE {table}"))
        .execute(&pool)
        .await
        .unwrap();
    server.delete(&[stream]).await;
}

// ---------------------------------------------------------------------------------------
// Messages that fail alone
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subject_no_stream_binds_is_dead_lettered_and_the_rest_published() {
    let server = Server::connect().await;
    let stream = server.stream_with("routed", |c| c.subjects = vec![]).await;
    // Only `STREAM.order.*` is bound.
    let mut handle = server.jetstream.get_stream(&stream).await.unwrap();
    let mut config = handle.info().await.unwrap().config.clone();
    config.subjects = vec![format!("{stream}.order.*")];
    server.jetstream.update_stream(config).await.unwrap();

    let sink = sink(NatsSinkConfig::new(url()).subject(format!("{stream}.{{event_type}}"))).await;
    let store = MemoryStore::new();
    let routed = NewMessage::builder("events", "order.paid").build().unwrap();
    let unbound = NewMessage::builder("events", "invoice.paid")
        .build()
        .unwrap();
    let (routed_id, unbound_id) = (routed.id(), unbound.id());
    store.enqueue_all(vec![routed, unbound]).unwrap();
    let relay = Relay::builder(store.clone())
        .route("events", sink)
        .build()
        .unwrap();
    relay.drain().await.unwrap();

    assert_eq!(
        store.row(routed_id).unwrap().row.status(),
        Status::Published
    );
    let dead = store.row(unbound_id).unwrap().row;
    assert_eq!(dead.status(), Status::Dead, "no stream binds it");
    let reason = dead.last_error.unwrap_or_default();
    assert!(
        reason.contains("no JetStream stream binds") && reason.contains("invoice.paid"),
        "the reason names the subject: {reason}"
    );
    assert_eq!(server.take(&stream).await.len(), 1);
    server.delete(&[stream]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_too_large_for_the_server_or_the_stream_fail_alone() {
    let server = Server::connect().await;
    let stream = server
        .stream_with("large", |c| c.max_message_size = 4096)
        .await;
    let sink = sink(NatsSinkConfig::new(url()).subject(format!("{stream}.events"))).await;
    let max_payload = server.client.server_info().max_payload;
    let mut batch = sink_suite::messages("events", 3);
    batch[0].payload = vec![b'x'; max_payload + 1];
    batch[1].payload = vec![b'y'; 8192];
    let outcomes = publish(&sink, &batch).await;
    for (i, what) in [
        (0, "the server's max_payload"),
        (1, "the stream's max_msg_size"),
    ] {
        let Outcome::Failed(failure) = &outcomes[i] else {
            panic!("over {what}: {:?}", outcomes[i])
        };
        assert_eq!(
            failure.class,
            FailureClass::TooLarge,
            "over {what}: {failure}"
        );
        assert!(!failure.retryable, "over {what}: {failure}");
    }
    assert!(outcomes[2].is_published(), "{:?}", outcomes[2]);
    assert_eq!(server.take(&stream).await.len(), 1);
    server.delete(&[stream]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_nats_cannot_carry_fail_alone_without_a_panic() {
    let server = Server::connect().await;
    let stream = server.stream("hostile").await;
    let sink =
        sink(NatsSinkConfig::new(url()).subject(format!("{stream}.{{partition_key}}"))).await;
    // As rows written by another language may hold them: set on the claimed message,
    // past the builder's checks.
    let with = |header: (&str, &str)| {
        let mut message = NewMessage::builder("events", "order.paid")
            .partition_key("k1")
            .build()
            .unwrap()
            .into_message(Utc::now());
        message
            .headers
            .insert(header.0.to_owned(), header.1.to_owned());
        message
    };
    let mut broken_key = with(("x-ok", "1"));
    broken_key.idempotency_key = "order-1\r\nPUB evil 0".to_owned();
    let mut bad_subject = with(("x-ok", "1"));
    bad_subject.partition_key = Some("a b".to_owned());
    let batch = vec![
        with(("x-split", "a\r\nb")),
        with(("Nats-Expected-Stream", "OTHER")),
        with(("outbox-id", "forged")),
        broken_key,
        bad_subject,
        with(("x-ok", "fine")),
    ];
    let outcomes = publish(&sink, &batch).await;
    for (i, outcome) in outcomes.iter().enumerate().take(5) {
        let Outcome::Failed(failure) = outcome else {
            panic!("message {i} was published: {outcome:?}")
        };
        assert!(!failure.retryable, "message {i}: {failure}");
    }
    assert!(outcomes[5].is_published(), "{:?}", outcomes[5]);
    let stored = server.take(&stream).await;
    assert_eq!(
        stored.len(),
        1,
        "nothing but the good message reached the stream"
    );
    assert_eq!(delivered(&stored[0]).id, batch[5].id.to_string());
    server.delete(&[stream]).await;
}

// ---------------------------------------------------------------------------------------
// Start-up
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_up_errors_say_what_to_fix() {
    let _server = Server::connect().await;
    let missing = NatsSink::connect(NatsSinkConfig::new(url()).subject("OUTBOX_TEST_NO_STREAM.x"))
        .await
        .unwrap_err();
    assert!(
        matches!(missing, NatsSinkError::NoStream { .. }),
        "{missing}"
    );
    assert!(!missing.is_retryable());
    assert!(missing.to_string().contains("nats stream add"), "{missing}");

    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let down = NatsSink::connect(
        NatsSinkConfig::new(format!("nats://relay:hunter2@127.0.0.1:{port}"))
            .connect_timeout(Duration::from_secs(2)),
    )
    .await
    .unwrap_err();
    assert!(matches!(down, NatsSinkError::Connect { .. }), "{down}");
    assert!(down.is_retryable(), "a server that is down may come up");
    assert!(!down.to_string().contains("hunter2"), "{down}");

    let dir = tempfile::tempdir().unwrap();
    let seed = dir.path().join("relay.nk");
    std::fs::write(&seed, "not a seed").unwrap();
    let bad_seed = NatsSink::connect(NatsSinkConfig::new(url()).nkey_seed_file(&seed))
        .await
        .unwrap_err();
    assert!(
        matches!(
            bad_seed,
            NatsSinkError::File {
                setting: "nkey_seed_file",
                ..
            }
        ),
        "{bad_seed}"
    );
    assert!(!bad_seed.to_string().contains("not a seed"), "{bad_seed}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_jetstream_is_refused_at_start_up() {
    let dir = tempfile::tempdir().unwrap();
    // A server of its own with JetStream turned off.
    let server = PrivateServer::nats(dir.path(), "jetstream: disabled");
    let e = NatsSink::connect(NatsSinkConfig::new(&server.url).subject("orders"))
        .await
        .unwrap_err();
    assert!(matches!(e, NatsSinkError::NoJetStream { .. }), "{e}");
    assert!(e.to_string().contains("-js"), "says how to turn it on: {e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subject_the_user_may_not_publish_to_is_dead_lettered_alone() {
    let dir = tempfile::tempdir().unwrap();
    let server = PrivateServer::nats(
        dir.path(),
        r#"authorization { users = [ { user: relay, password: "s3cret", permissions: { publish: { deny: ["DENIED.>"] } } } ] }"#,
    );
    let admin = Server::of(
        outbox_sink_nats::client::ConnectOptions::with_user_and_password(
            "relay".to_owned(),
            "s3cret".to_owned(),
        )
        .connect(&server.url)
        .await
        .unwrap(),
    );
    for name in ["ALLOWED", "DENIED"] {
        admin
            .jetstream
            .create_stream(outbox_sink_nats::client::jetstream::stream::Config {
                name: name.to_owned(),
                subjects: vec![format!("{name}.>")],
                ..Default::default()
            })
            .await
            .unwrap();
    }
    let sink = sink(
        NatsSinkConfig::new(server.url.replace("nats://", "nats://relay:s3cret@"))
            .subject("{destination}.events")
            .ack_timeout(Duration::from_secs(2)),
    )
    .await;
    let mut batch = sink_suite::messages("ALLOWED", 2);
    batch[1].destination = "DENIED".to_owned();
    let outcomes = publish(&sink, &batch).await;
    assert!(outcomes[0].is_published(), "{:?}", outcomes[0]);
    let Outcome::Failed(failure) = &outcomes[1] else {
        panic!("published to a denied subject: {:?}", outcomes[1])
    };
    assert_eq!(failure.class, FailureClass::Rejected, "{failure}");
    assert!(!failure.retryable, "{failure}");
    assert!(failure.message.contains("DENIED.events"), "{failure}");
}

// ---------------------------------------------------------------------------------------
// Server restart
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_loses_nothing_across_server_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = PrivateServer::nats(dir.path(), "");
    let admin = Server::connect_to(&server.url).await;
    let stream = admin.stream("restart").await;
    drop(admin);
    let sink = sink(
        NatsSinkConfig::new(&server.url)
            .subject(format!("{stream}.events"))
            .ack_timeout(Duration::from_secs(1)),
    )
    .await;
    let store = MemoryStore::new();
    let relay = Relay::builder(store.clone())
        .route("events", sink)
        .batch_size(50)
        .poll_interval(Duration::from_millis(20))
        .build()
        .unwrap();
    let running = relay.spawn();
    let mut ids = Vec::new();
    for round in 0..3 {
        let messages = outbox_engine::testkit::numbered("events", "order.paid", 300);
        ids.extend(messages.iter().map(NewMessage::id));
        store.enqueue_all(messages).unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        server.kill();
        tokio::time::sleep(Duration::from_millis(500)).await;
        server.restart();
        eprintln!("restart {round} done");
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

    let admin = Server::connect_to(&server.url).await;
    let stored: Vec<String> = admin
        .take(&stream)
        .await
        .iter()
        .map(|m| delivered(m).id)
        .collect();
    let distinct: std::collections::HashSet<&String> = stored.iter().collect();
    assert_eq!(
        stored.len(),
        distinct.len(),
        "the duplicate window kept re-sends out"
    );
    for id in &ids {
        assert!(
            distinct.contains(&id.to_string()),
            "message {id} is in the stream"
        );
    }
}
