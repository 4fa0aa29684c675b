//! One message larger than the server's `proto-max-bulk-len` must fail alone: sent, it
//! makes Redis drop the connection and fails every other message of the pipeline. And the
//! connection's other limit: one that falls silent is replaced.

use std::time::Duration;

use chrono::Utc;
use outbox_engine::{FailureClass, Message, MessageId, Outcome, Sink};
use outbox_sink_redis::client as redis;
use outbox_sink_redis::{RedisSink, RedisSinkConfig};

mod common;
use common::{OwnRedis, reader, xrange};
use outbox_engine::testkit::publish;

const MIB: usize = 1024 * 1024;

/// A claimed message as the sink sees it (the builder's own 1 MiB limit is the
/// application's choice; rows written by other programs can be larger).
fn message(payload: Vec<u8>) -> Message {
    let id = MessageId::new();
    Message::from_parts(
        id,
        "events".into(),
        "blob.stored".into(),
        payload,
        "application/octet-stream".into(),
        id.to_string(),
        1,
        Utc::now(),
    )
}

fn config(server: &OwnRedis, dedupe: bool) -> RedisSinkConfig {
    let config = RedisSinkConfig::new(server.url())
        .stream("events")
        .max_payload_bytes(16 * MIB);
    if dedupe {
        config
    } else {
        config.dedupe_window(None)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_over_the_servers_bulk_limit_fails_alone() {
    for dedupe in [true, false] {
        let server = OwnRedis::start(&["--proto-max-bulk-len", "1mb"]).await;
        let sink = RedisSink::connect(config(&server, dedupe)).await.unwrap();
        let batch = [
            message(b"small one".to_vec()),
            message(vec![7; 2 * MIB]),
            message(b"small two".to_vec()),
        ];
        let outcomes = publish(&sink, &batch).await;
        assert!(
            outcomes[0].is_published(),
            "dedupe={dedupe}: {:?}",
            outcomes[0]
        );
        assert!(
            outcomes[2].is_published(),
            "dedupe={dedupe}: {:?}",
            outcomes[2]
        );
        match &outcomes[1] {
            Outcome::Failed(f) => {
                assert!(!f.retryable && f.class == FailureClass::TooLarge, "{f}");
                assert!(f.message.contains("proto-max-bulk-len"), "{f}");
            }
            other => panic!("dedupe={dedupe}: the big one must fail: {other:?}"),
        }
        let mut conn = reader(&server.url()).await;
        let entries = xrange(&mut conn, "events").await;
        assert_eq!(
            entries.len(),
            2,
            "dedupe={dedupe}: each small message appended once"
        );
    }
}

/// When the connection drops half-way through a pipeline (here: the limit was lowered
/// after the sink connected), the messages appended before the drop are found through
/// their dedupe keys and reported published, so a retry does not count against them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_dropped_connection_what_was_appended_is_published() {
    let server = OwnRedis::start(&[]).await;
    let sink = RedisSink::connect(config(&server, true)).await.unwrap();
    let mut admin = reader(&server.url()).await;
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("proto-max-bulk-len")
        .arg("1mb")
        .query_async(&mut admin)
        .await
        .unwrap();
    let batch = [
        message(b"before".to_vec()),
        message(vec![7; 2 * MIB]),
        message(b"after".to_vec()),
    ];
    let outcomes = tokio::time::timeout(
        Duration::from_secs(30),
        sink.publish(&batch, &outbox_engine::PublishContext::default()),
    )
    .await
    .expect("publish returns")
    .unwrap();
    assert!(
        outcomes[0].is_published(),
        "appended before the drop: {:?}",
        outcomes[0]
    );
    for outcome in &outcomes[1..] {
        assert!(
            matches!(outcome, Outcome::Failed(f) if f.retryable),
            "not appended: retried, {outcome:?}"
        );
    }
    let entries = xrange(&mut admin, "events").await;
    assert_eq!(entries.len(), 1, "only the first was appended");
}

/// A connection that falls silent for good (no reset, no FIN: a vanished peer, a NAT
/// that forgot the flow) is replaced after a round trip goes unanswered, instead of
/// holding every later batch until the operating system gives up on it (minutes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_falls_silent_is_replaced() {
    use outbox_test_support::proxy::{self, Net};

    let server = OwnRedis::start(&[]).await;
    let mut url = server.url();
    let proxy = proxy::in_front(&mut url).await;
    let sink = RedisSink::connect(
        RedisSinkConfig::new(url)
            .stream("events")
            .response_timeout(Duration::from_millis(500)),
    )
    .await
    .unwrap();
    let publish = |body: &'static [u8]| {
        let sink = sink.clone();
        async move {
            let cx = outbox_engine::PublishContext::timeout(Duration::from_secs(3));
            let batch = [message(body.to_vec())];
            match tokio::time::timeout(Duration::from_secs(10), sink.publish(&batch, &cx))
                .await
                .expect("publish returns by its deadline")
            {
                Ok(mut outcomes) => outcomes.remove(0),
                Err(failure) => Outcome::Failed(failure),
            }
        }
    };
    assert!(publish(b"before").await.is_published());

    proxy.set(Net::Silence);
    let outcome = publish(b"while silent").await;
    assert!(
        matches!(&outcome, Outcome::Failed(f) if f.retryable && f.class == FailureClass::Timeout),
        "no reply: a retryable timeout, {outcome:?}"
    );

    proxy.set(Net::Pass);
    let outcome = publish(b"after").await;
    assert!(
        outcome.is_published(),
        "a fresh connection carries the next batch: {outcome:?}"
    );
    let mut admin = reader(&server.url()).await;
    let bodies: Vec<String> = xrange(&mut admin, "events")
        .await
        .iter()
        .filter_map(|entry| entry.text("payload"))
        .collect();
    assert_eq!(
        bodies,
        ["before", "after"],
        "the silenced batch never arrived"
    );
}
