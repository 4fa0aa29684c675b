//! The Redis sink against a real Redis (`OUTBOX_TEST_REDIS_URL`, default
//! `redis://127.0.0.1:6379/`): the sink conformance suite in three layouts, a consumer
//! group reading everything back exactly, the dedupe window, durability start-up checks,
//! per-message failures and typed configuration errors.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use outbox_engine::testkit::{Delivered, SinkHarness, sink_suite};
use outbox_engine::{
    ClaimRequest, FailureClass, ManualClock, MemoryStore, Message, NewMessage, Outcome, Relay,
    RetryPolicy, Status, Store,
};
use outbox_sink_redis::client::{self as redis, Value, aio::MultiplexedConnection};
use outbox_sink_redis::{
    Durability, FieldLayout, HeaderLayout, RedisSink, RedisSinkConfig, RedisSinkError,
};

mod common;
use common::{Entry, del, fresh_name, reader, server_info, sink, url, xlen, xrange};
use outbox_engine::testkit::publish;

// ---------------------------------------------------------------------------------------
// Conformance suite
// ---------------------------------------------------------------------------------------

struct Harness {
    sink: RedisSink,
    reader: MultiplexedConnection,
    destination: String,
    stream: String,
    /// `Some(payload field)` for the JSON header layout.
    json: Option<&'static str>,
}

impl SinkHarness for Harness {
    type Sink = RedisSink;

    fn sink(&self) -> &RedisSink {
        &self.sink
    }

    fn destination(&self) -> &str {
        &self.destination
    }

    async fn received(&self) -> Vec<Delivered> {
        let mut conn = self.reader.clone();
        xrange(&mut conn, &self.stream)
            .await
            .iter()
            .map(|e| match self.json {
                Some(payload) => e.delivered_json(payload),
                None => e.delivered(),
            })
            .collect()
    }
}

/// Runs the suite with a fresh stream per check; `configure` gets the default config with
/// a fixed stream name and may change it; `templated` makes the stream
/// `outbox-test:tpl:{destination}` with a fresh destination instead.
async fn run_suite(
    configure: impl Fn(RedisSinkConfig) -> RedisSinkConfig,
    templated: bool,
    json: Option<&'static str>,
) {
    let url = url();
    let streams = Arc::new(Mutex::new(Vec::new()));
    sink_suite::run_all(|| {
        let streams = Arc::clone(&streams);
        let url = url.clone();
        let configure = &configure;
        async move {
            let (destination, stream, template) = if templated {
                let destination = format!("suite-{:016x}", fastrand::u64(..));
                let stream = format!("outbox-test:tpl:{destination}");
                (
                    destination,
                    stream,
                    "outbox-test:tpl:{destination}".to_owned(),
                )
            } else {
                let stream = fresh_name("suite");
                ("suite".to_owned(), stream.clone(), stream)
            };
            streams.lock().unwrap().push(stream.clone());
            let config = configure(RedisSinkConfig::new(url.clone()).stream(template));
            Harness {
                sink: sink(config).await,
                reader: reader(&url).await,
                destination,
                stream,
                json,
            }
        }
    })
    .await;
    let keys = streams.lock().unwrap().clone();
    del(&mut reader(&url).await, &keys).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_with_dedupe_and_header_fields() {
    run_suite(|c| c, false, None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_with_plain_xadd_and_maxlen() {
    run_suite(|c| c.dedupe_window(None).maxlen(Some(10_000)), false, None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_with_json_headers_and_templated_stream() {
    let mut fields = FieldLayout::default();
    fields.payload = "data".into();
    fields.headers = HeaderLayout::Json {
        field: "headers".into(),
    };
    run_suite(move |c| c.fields(fields.clone()), true, Some("data")).await;
}

// ---------------------------------------------------------------------------------------
// A consumer group reads exactly what was enqueued
// ---------------------------------------------------------------------------------------

fn varied_messages(destination: &str, n: usize) -> Vec<NewMessage> {
    (0..n)
        .map(|i| {
            let builder = NewMessage::builder(destination, format!("kind.{}", i % 4));
            let builder = match i % 3 {
                0 => builder.json(&serde_json::json!({ "n": i, "text": "ünïcødé \"quoted\"\n" })),
                // Every byte value, so no encoding step can hide behind UTF-8.
                1 => builder.bytes(
                    (0..=255u8).cycle().skip(i).take(300).collect::<Vec<u8>>(),
                    "application/octet-stream",
                ),
                _ => builder.bytes(vec![0xff, 0xfe, 0x00, b'\r', b'\n', 0x80], "x-binary/test"),
            };
            let mut builder = builder.header("x-index", i.to_string()).header(
                "traceparent",
                format!("00-{:032x}-{:016x}-01", i + 1, i + 7),
            );
            if i % 2 == 0 {
                builder = builder
                    .partition_key(format!("order-{}", i % 5))
                    .tenant_id("acme")
                    .aggregate("order", format!("{}", 1000 + i))
                    .header("x-tab", "a\tb");
            }
            if i % 5 == 0 {
                builder = builder.idempotency_key(format!("business-key-{i}"));
            }
            builder.build().expect("valid message")
        })
        .collect()
}

fn assert_entry_matches(entry: &Entry, m: &NewMessage) {
    assert_eq!(
        entry.text("id").as_deref(),
        Some(m.id().to_string().as_str())
    );
    assert_eq!(
        entry.text("idempotency_key").as_deref(),
        Some(m.idempotency_key())
    );
    assert_eq!(entry.text("event_type").as_deref(), Some(m.event_type()));
    assert_eq!(
        entry.text("content_type").as_deref(),
        Some(m.content_type())
    );
    assert_eq!(entry.get("payload"), Some(m.payload()), "payload bytes");
    assert_eq!(entry.text("partition_key").as_deref(), m.partition_key());
    assert_eq!(entry.text("tenant_id").as_deref(), m.tenant_id());
    assert_eq!(entry.text("aggregate_type").as_deref(), m.aggregate_type());
    assert_eq!(entry.text("aggregate_id").as_deref(), m.aggregate_id());
    let headers: Vec<(String, String)> = entry.headers().collect();
    let want: Vec<(String, String)> = m
        .headers()
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    assert_eq!(headers, want, "headers, exactly and nothing else");
    // Nothing beyond the documented layout.
    let known = [
        "id",
        "idempotency_key",
        "event_type",
        "content_type",
        "payload",
        "partition_key",
        "tenant_id",
        "aggregate_type",
        "aggregate_id",
    ];
    for (name, _) in &entry.fields {
        assert!(
            known.contains(&name.as_str()) || name.starts_with("h:"),
            "unexpected field {name}"
        );
    }
    assert_eq!(
        entry.fields.last().map(|(n, _)| n.as_str()),
        Some("payload"),
        "payload is the last field"
    );
}

/// The consumer's one call: the client's typed `XREADGROUP` reply, each entry read as a
/// `Received` with `read_stream_entry`, equal to what was enqueued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_reads_received_from_the_clients_stream_entries() {
    use outbox_sink_redis::client::AsyncCommands;
    use outbox_sink_redis::client::streams::{StreamReadOptions, StreamReadReply};

    let url = url();
    let mut conn = reader(&url).await;
    let stream = fresh_name("typed");
    let store = MemoryStore::new();
    let enqueued = varied_messages("billing", 24);
    store.enqueue_all(enqueued.clone()).unwrap();
    let sink = sink(RedisSinkConfig::new(url.clone()).stream(stream.clone())).await;
    let relay = Relay::builder(store)
        .route("billing", sink)
        .build()
        .unwrap();
    assert_eq!(relay.drain().await.unwrap().published, 24);

    let _: () = conn
        .xgroup_create(&stream, "readers", "0")
        .await
        .expect("XGROUP CREATE");
    let options = StreamReadOptions::default()
        .group("readers", "r1")
        .count(100);
    let reply: StreamReadReply = conn
        .xread_options(&[&stream], &[">"], &options)
        .await
        .expect("XREADGROUP");
    let entries: Vec<_> = reply.keys.iter().flat_map(|key| &key.ids).collect();
    assert_eq!(entries.len(), enqueued.len(), "every entry read");
    for (entry, message) in entries.into_iter().zip(&enqueued) {
        let received = outbox_sink_redis::read_stream_entry(entry).expect("an outbox entry");
        assert_eq!(received.id, message.id());
        assert_eq!(received.idempotency_key, message.idempotency_key());
        assert_eq!(received.event_type, message.event_type());
        assert_eq!(
            received.content_type.as_deref(),
            Some(message.content_type())
        );
        assert_eq!(received.partition_key.as_deref(), message.partition_key());
        assert_eq!(received.tenant_id.as_deref(), message.tenant_id());
        assert_eq!(&received.headers, message.headers());
        assert_eq!(received.payload, message.payload(), "payload bytes");
    }
    del(&mut conn, &[stream]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_group_reads_every_message_exactly_as_enqueued() {
    let url = url();
    let mut conn = reader(&url).await;
    let stream = fresh_name("group");
    let _: () = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(&stream)
        .arg("workers")
        .arg("$")
        .arg("MKSTREAM")
        .query_async(&mut conn)
        .await
        .unwrap();

    let store = MemoryStore::new();
    let enqueued = varied_messages("billing", 60);
    store.enqueue_all(enqueued.clone()).unwrap();
    let sink = sink(RedisSinkConfig::new(url.clone()).stream(stream.clone())).await;
    let relay = Relay::builder(store.clone())
        .route("billing", sink)
        .batch_size(16)
        .build()
        .unwrap();
    let report = relay.drain().await.unwrap();
    assert_eq!(report.published, 60, "{report:?}");

    // Two consumers of one group share the entries; each entry goes to exactly one.
    let mut seen: Vec<Entry> = Vec::new();
    for round in 0.. {
        let consumer = if round % 2 == 0 { "c1" } else { "c2" };
        let reply: Value = redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg("workers")
            .arg(consumer)
            .arg("COUNT")
            .arg(7)
            .arg("STREAMS")
            .arg(&stream)
            .arg(">")
            .query_async(&mut conn)
            .await
            .unwrap();
        let entries: Vec<Entry> = match reply {
            Value::Nil => break,
            Value::Array(streams) => {
                let [Value::Array(pair)] = streams.as_slice() else {
                    panic!("one stream expected: {streams:?}")
                };
                let Value::Array(entries) = &pair[1] else {
                    panic!("{pair:?}")
                };
                entries.iter().map(common::entry).collect()
            }
            other => panic!("unexpected XREADGROUP reply {other:?}"),
        };
        if entries.is_empty() {
            break;
        }
        let ids: Vec<&str> = entries.iter().map(|e| e.id.as_str()).collect();
        let acked: i64 = redis::cmd("XACK")
            .arg(&stream)
            .arg("workers")
            .arg(&ids)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(acked as usize, entries.len());
        seen.extend(entries);
        assert!(round < 100, "consumer never drained the group");
    }

    assert_eq!(seen.len(), enqueued.len(), "every message, once");
    // One relay worker, batches in claim order: the stream keeps the enqueue order.
    for (entry, message) in seen.iter().zip(&enqueued) {
        assert_entry_matches(entry, message);
    }
    let pending: Value = redis::cmd("XPENDING")
        .arg(&stream)
        .arg("workers")
        .query_async(&mut conn)
        .await
        .unwrap();
    let Value::Array(summary) = pending else {
        panic!("{pending:?}")
    };
    assert_eq!(summary[0], Value::Int(0), "everything acknowledged");
    assert!(
        store.ids_with_status(Status::Published).len() == 60,
        "every row marked published"
    );
    del(&mut conn, &[stream]).await;
}

// ---------------------------------------------------------------------------------------
// Dedupe window
// ---------------------------------------------------------------------------------------

fn claimed(destination: &str, n: usize) -> Vec<Message> {
    outbox_engine::testkit::numbered(destination, "dedupe.test", n)
        .into_iter()
        .map(|m| m.into_message(Utc::now()))
        .collect()
}

fn receipts(outcomes: &[Outcome]) -> Vec<String> {
    outcomes
        .iter()
        .map(|o| match o {
            Outcome::Published {
                receipt: Some(receipt),
            } => receipt.clone(),
            other => panic!("expected a published outcome with a receipt, got {other:?}"),
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn republishing_inside_the_window_adds_nothing_and_after_it_appends_again() {
    let url = url();
    let mut conn = reader(&url).await;
    let stream = fresh_name("dedupe");
    // Long enough that a slow machine on a shared Redis still re-sends inside it.
    let window = Duration::from_secs(10);
    let sink = sink(
        RedisSinkConfig::new(url.clone())
            .stream(stream.clone())
            .dedupe_window(Some(window)),
    )
    .await;
    let batch = claimed("orders", 5);

    let first = receipts(&publish(&sink, &batch).await);
    assert_eq!(xlen(&mut conn, &stream).await, 5);
    let entries = xrange(&mut conn, &stream).await;
    assert_eq!(
        first,
        entries.iter().map(|e| e.id.clone()).collect::<Vec<_>>(),
        "the receipt is the entry id"
    );

    // The relay crashed after the append and before marking: the same batch again.
    let again = receipts(&publish(&sink, &batch).await);
    assert_eq!(again, first, "a duplicate answers with the first entry id");
    assert_eq!(xlen(&mut conn, &stream).await, 5, "no second entry");

    // A batch mixing a re-sent message with a new one appends only the new one.
    let mut mixed = vec![batch[2].clone()];
    mixed.extend(claimed("orders", 1));
    let mixed_receipts = receipts(&publish(&sink, &mixed).await);
    assert_eq!(mixed_receipts[0], first[2]);
    assert_eq!(xlen(&mut conn, &stream).await, 6);

    // The dedupe key lives for the window, no longer.
    let key = dedupe_key(&stream, &batch[0].idempotency_key);
    let ttl: i64 = redis::cmd("PTTL")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(ttl > 0 && ttl <= window.as_millis() as i64, "PTTL {ttl}");

    // After the window it appends again: a sink with a short window, on new messages.
    let short = Duration::from_secs(1);
    let short_sink = common::sink(
        RedisSinkConfig::new(url.clone())
            .stream(stream.clone())
            .dedupe_window(Some(short)),
    )
    .await;
    let later = claimed("orders", 5);
    let before = receipts(&publish(&short_sink, &later).await);
    assert_eq!(xlen(&mut conn, &stream).await, 11);
    tokio::time::sleep(short + Duration::from_millis(300)).await;
    let after = receipts(&publish(&short_sink, &later).await);
    assert_eq!(
        xlen(&mut conn, &stream).await,
        16,
        "after the window it appends again"
    );
    for (old, new) in before.iter().zip(&after) {
        assert_ne!(old, new);
    }
    let entries = xrange(&mut conn, &stream).await;
    let copies = entries
        .iter()
        .filter(|e| e.text("id") == Some(later[0].id.to_string()))
        .count();
    assert_eq!(copies, 2, "one copy per window, same id in both");
    let mut keys: Vec<String> = batch
        .iter()
        .chain(&mixed)
        .chain(&later)
        .map(|m| dedupe_key(&stream, &m.idempotency_key))
        .collect();
    keys.push(stream);
    del(&mut conn, &keys).await;
}

/// The documented dedupe key: `<prefix><stream byte length>:<stream>:<idempotency key>`.
fn dedupe_key(stream: &str, idempotency_key: &str) -> String {
    format!("outbox:dedupe:{}:{stream}:{idempotency_key}", stream.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_crash_between_append_and_mark_does_not_duplicate() {
    let url = url();
    let mut conn = reader(&url).await;
    let stream = fresh_name("crash");
    let sink = sink(RedisSinkConfig::new(url.clone()).stream(stream.clone())).await;
    let clock = ManualClock::new();
    let store = MemoryStore::with_clock(clock.clone());
    let messages: Vec<NewMessage> = outbox_engine::testkit::numbered("orders", "order.paid", 20);
    store.enqueue_all(messages).unwrap();

    // A relay claims, publishes... and dies before completing.
    let lease = Duration::from_secs(30);
    let claim = store
        .claim(&ClaimRequest::new("doomed", 100, lease))
        .await
        .unwrap();
    assert_eq!(claim.messages.len(), 20);
    let outcomes = publish(&sink, &claim.messages).await;
    assert!(outcomes.iter().all(Outcome::is_published));
    assert_eq!(xlen(&mut conn, &stream).await, 20);

    // The lease lapses; another relay reclaims and publishes the same rows.
    clock.advance(lease + Duration::from_secs(1));
    let relay = Relay::builder(store.clone())
        .route("orders", sink.clone())
        .build()
        .unwrap();
    let report = relay.drain().await.unwrap();
    assert_eq!(report.published, 20, "{report:?}");
    assert_eq!(
        xlen(&mut conn, &stream).await,
        20,
        "the re-sent messages were found in the dedupe window"
    );
    assert_eq!(store.ids_with_status(Status::Published).len(), 20);
    del(&mut conn, &[stream]).await;
}

// ---------------------------------------------------------------------------------------
// Durability
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waitaof_that_the_server_cannot_honour_fails_the_route_at_start() {
    let url = url();
    let mut conn = reader(&url).await;
    let version = server_info(&mut conn, "server", "redis_version").await;
    let aof = server_info(&mut conn, "persistence", "aof_enabled").await;
    let config = RedisSinkConfig::new(url.clone())
        .stream(fresh_name("aof"))
        .durability(Durability::wait_aof(true, 0, Duration::from_millis(500)));
    let err = RedisSink::connect(config)
        .await
        .expect_err("WAITAOF must not start on this server");
    let text = err.to_string();
    let (major, minor) = {
        let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap());
        (parts.next().unwrap(), parts.next().unwrap())
    };
    assert!(
        matches!(err, RedisSinkError::DurabilityUnavailable { .. }),
        "{err:?}"
    );
    if (major, minor) < (7, 2) {
        assert!(
            text.contains("7.2") && text.contains(&version),
            "names the needed and the actual version: {text}"
        );
    } else {
        assert_eq!(aof, "0", "the test server runs without AOF");
        assert!(text.contains("appendonly yes"), "{text}");
    }
    assert!(
        text.contains("WAITAOF 1 0 500"),
        "names the setting: {text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_for_more_replicas_than_connected_fails_at_start() {
    let url = url();
    let mut conn = reader(&url).await;
    let connected: u32 = server_info(&mut conn, "replication", "connected_slaves")
        .await
        .parse()
        .unwrap_or(0);
    let config = RedisSinkConfig::new(url.clone())
        .stream(fresh_name("wait"))
        .durability(Durability::wait(connected + 1, Duration::from_millis(200)));
    let err = RedisSink::connect(config)
        .await
        .expect_err("must not start");
    assert!(
        matches!(err, RedisSinkError::DurabilityUnavailable { .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("replica"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_zero_replicas_runs_in_the_same_round_trip_and_publishes() {
    let url = url();
    let mut conn = reader(&url).await;
    for dedupe in [Some(Duration::from_secs(60)), None] {
        let stream = fresh_name("wait0");
        let sink = sink(
            RedisSinkConfig::new(url.clone())
                .stream(stream.clone())
                .dedupe_window(dedupe)
                .durability(Durability::wait(0, Duration::from_millis(100))),
        )
        .await;
        let batch = claimed("orders", 10);
        let outcomes = publish(&sink, &batch).await;
        let ids = receipts(&outcomes);
        let entries = xrange(&mut conn, &stream).await;
        assert_eq!(
            entries.iter().map(|e| e.id.clone()).collect::<Vec<_>>(),
            ids
        );
        if dedupe.is_some() {
            // A duplicate under durability is still acknowledged with the first id.
            assert_eq!(receipts(&publish(&sink, &batch).await), ids);
            assert_eq!(xlen(&mut conn, &stream).await, 10);
        }
        del(&mut conn, &[stream]).await;
    }
}

// ---------------------------------------------------------------------------------------
// Per-message failures, typed errors, script cache
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_message_failures_are_classified_and_hold_up_nothing() {
    let url = url();
    let mut conn = reader(&url).await;
    let prefix = fresh_name("per-message");
    for dedupe in [Some(Duration::from_secs(60)), None] {
        let sink = sink(
            RedisSinkConfig::new(url.clone())
                .stream(format!("{prefix}.{{partition_key}}"))
                .dedupe_window(dedupe)
                .max_payload_bytes(1024),
        )
        .await;
        // `<prefix>.taken` is an ordinary string, not a stream.
        let taken = format!("{prefix}.taken");
        let _: () = redis::cmd("SET")
            .arg(&taken)
            .arg("not a stream")
            .query_async(&mut conn)
            .await
            .unwrap();
        let m = |key: Option<&str>, size: usize| {
            let b = NewMessage::builder("orders", "e").bytes(vec![b'x'; size], "text/plain");
            let b = match key {
                Some(k) => b.partition_key(k),
                None => b,
            };
            b.build().unwrap().into_message(Utc::now())
        };
        let batch = vec![
            m(Some("good"), 10),
            m(None, 10),            // the template needs a partition key
            m(Some("taken"), 10),   // WRONGTYPE
            m(Some("good"), 2_000), // over max_payload_bytes
            m(Some("good"), 20),
        ];
        let outcomes = publish(&sink, &batch).await;
        assert_eq!(outcomes.len(), 5);
        assert!(outcomes[0].is_published() && outcomes[4].is_published());
        let failure = |o: &Outcome| match o {
            Outcome::Failed(f) => f.clone(),
            other => panic!("expected a failure, got {other:?}"),
        };
        let missing = failure(&outcomes[1]);
        assert_eq!(
            (missing.class, missing.retryable),
            (FailureClass::Config, false)
        );
        assert!(missing.message.contains("partition_key"), "{missing}");
        let wrong = failure(&outcomes[2]);
        assert_eq!(
            (wrong.class, wrong.retryable),
            (FailureClass::Config, false)
        );
        assert!(wrong.message.starts_with("WRONGTYPE"), "{wrong}");
        let large = failure(&outcomes[3]);
        assert_eq!(
            (large.class, large.retryable),
            (FailureClass::TooLarge, false)
        );
        let good = format!("{prefix}.good");
        let entries = xrange(&mut conn, &good).await;
        assert_eq!(entries.len(), 2, "only the two good messages");
        assert_eq!(entries[0].get("payload"), Some(&batch[0].payload[..]));
        assert_eq!(entries[1].get("payload"), Some(&batch[4].payload[..]));
        if dedupe.is_some() {
            // No dedupe key was left for the message whose append failed, so it is
            // appended once the key is fixed.
            del(&mut conn, std::slice::from_ref(&taken)).await;
            let retry = publish(&sink, &batch[2..3]).await;
            assert!(retry[0].is_published(), "{retry:?}");
            assert_eq!(xlen(&mut conn, &taken).await, 1);
        }
        del(&mut conn, &[good, taken]).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flushed_script_cache_is_reloaded_without_losing_or_duplicating() {
    let url = url();
    let mut conn = reader(&url).await;
    let stream = fresh_name("noscript");
    let sink = sink(RedisSinkConfig::new(url.clone()).stream(stream.clone())).await;
    let batch = claimed("orders", 8);
    let first = receipts(&publish(&sink, &batch[..4]).await);
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut conn)
        .await
        .unwrap();
    // Half re-sent, half new, after the flush.
    let outcomes = receipts(&publish(&sink, &batch).await);
    assert_eq!(&outcomes[..4], &first[..]);
    assert_eq!(xlen(&mut conn, &stream).await, 8);
    del(&mut conn, &[stream]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_configuration_gives_typed_errors_before_anything_is_sent() {
    let url = url();
    let mut conn = reader(&url).await;
    let bad_template = RedisSink::connect(RedisSinkConfig::new(url.clone()).stream("a.{nope}"))
        .await
        .unwrap_err();
    assert!(
        matches!(bad_template, RedisSinkError::InvalidTemplate { .. }),
        "{bad_template:?}"
    );
    let unclosed = RedisSink::from_url(&format!("{url}?stream=a.%7Bevent_type"))
        .await
        .unwrap_err();
    assert!(
        matches!(unclosed, RedisSinkError::InvalidTemplate { .. }),
        "{unclosed:?}"
    );
    for bad in [
        "redis//127.0.0.1",
        "mysql://127.0.0.1/",
        "redis://127.0.0.1/x",
    ] {
        let err = RedisSink::from_url(bad).await.unwrap_err();
        assert!(
            matches!(err, RedisSinkError::InvalidUrl { .. }),
            "{bad}: {err:?}"
        );
    }
    let err = RedisSink::from_url("redis://127.0.0.1/?strem=x")
        .await
        .unwrap_err();
    assert!(err.to_string().contains("unknown option `strem`"), "{err}");
    #[cfg(not(any(feature = "tls-rustls", feature = "tls-native-tls")))]
    assert!(matches!(
        RedisSink::from_url("rediss://127.0.0.1/")
            .await
            .unwrap_err(),
        RedisSinkError::TlsNotEnabled
    ));

    // Nothing listens on a freshly released port: a Connect error that hides the password.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let err = RedisSink::connect(
        RedisSinkConfig::new(format!("redis://:hunter2@127.0.0.1:{port}/"))
            .connect_timeout(Duration::from_millis(300)),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, RedisSinkError::Connect { .. }), "{err:?}");
    assert!(
        !err.to_string().contains("hunter2") && err.to_string().contains("***"),
        "{err}"
    );

    // A fixed stream key that holds something else refuses to start.
    let key = fresh_name("taken");
    let _: () = redis::cmd("SET")
        .arg(&key)
        .arg("x")
        .query_async(&mut conn)
        .await
        .unwrap();
    let err = RedisSink::connect(RedisSinkConfig::new(url.clone()).stream(key.clone()))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, RedisSinkError::WrongType { found, .. } if found == "string"),
        "{err:?}"
    );
    del(&mut conn, &[key]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_templated_route_dead_letters_only_the_messages_of_a_broken_key() {
    // One tenant's stream key holds a string: its messages fail permanently (WRONGTYPE)
    // and are dead-lettered with the reason; every other tenant's messages go through.
    let url = url();
    let mut conn = reader(&url).await;
    let prefix = fresh_name("route");
    let sink =
        sink(RedisSinkConfig::new(url.clone()).stream(format!("{prefix}.{{tenant_id}}"))).await;
    let store = MemoryStore::new();
    let broken = format!("{prefix}.broken");
    let _: () = redis::cmd("SET")
        .arg(&broken)
        .arg("x")
        .query_async(&mut conn)
        .await
        .unwrap();
    for i in 0..30 {
        let tenant = if i % 3 == 0 { "broken" } else { "fine" };
        store
            .enqueue(
                NewMessage::builder("events", "e")
                    .tenant_id(tenant)
                    .json(&i)
                    .build()
                    .unwrap(),
            )
            .unwrap();
    }
    let relay = Relay::builder(store.clone())
        .route("events", sink)
        .retry(RetryPolicy::default().initial_delay(Duration::from_millis(1)))
        .build()
        .unwrap();
    let report = relay.drain().await.unwrap();
    assert_eq!((report.published, report.dead), (20, 10), "{report:?}");
    assert_eq!(xlen(&mut conn, &format!("{prefix}.fine")).await, 20);
    let dead = store.ids_with_status(Status::Dead);
    let reason = store
        .row(dead[0])
        .unwrap()
        .row
        .last_error
        .clone()
        .unwrap_or_default();
    assert!(reason.contains("WRONGTYPE"), "{reason}");
    del(&mut conn, &[format!("{prefix}.fine"), broken]).await;
}
