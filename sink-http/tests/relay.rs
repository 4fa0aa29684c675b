//! The sink under the relay (with the in-memory store): dead letters, retries, fan-out,
//! and the circuit breaker layer around the sink, message by message.

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use common::{Reply, TestServer};
use outbox_engine::layers::{CircuitConfig, CircuitState, SinkExt};
use outbox_engine::state::RowState;
use outbox_engine::{MemoryStore, MessageId, NewMessage, Relay, RetryPolicy, Status};
use outbox_sink_http::{fan_out, headers};

fn body_text(r: &common::Recorded) -> String {
    String::from_utf8(r.body.to_vec()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permanent_4xx_dead_letters_its_message_while_the_others_flow() {
    // A messaging API: unknown recipients get a 422 with an explanation.
    let server = TestServer::with(|r, _| {
        if body_text(r).contains("+1555000") {
            Reply::status(422)
                .body(r#"{"error":{"code":131026,"message":"recipient phone number not valid"}}"#)
        } else {
            Reply::status(201).body(r#"{"messages":[{"id":"wamid.1"}]}"#)
        }
    })
    .await;
    let sink = common::sink(common::config(server.url("/v1/messages")));
    let store = MemoryStore::new();
    let mut bad = Vec::new();
    for n in 0..30 {
        let to = if n % 10 == 3 {
            format!("+1555000{n:02}")
        } else {
            format!("+4479460{n:05}")
        };
        let id = store
            .enqueue(
                NewMessage::builder("whatsapp", "order.confirmed")
                    .json(&serde_json::json!({ "to": to, "template": "cod_confirm" }))
                    .build()
                    .unwrap(),
            )
            .unwrap();
        if to.starts_with("+1555000") {
            bad.push(id);
        }
    }
    let relay = Relay::builder(store.clone())
        .route("whatsapp", sink)
        .batch_size(8)
        .build()
        .unwrap();
    let report = relay.drain().await.unwrap();
    assert_eq!(
        (report.published, report.dead, report.retried),
        (27, 3, 0),
        "{report:?}"
    );

    for id in &bad {
        let row = store.row(*id).unwrap();
        let RowState::Dead { reason, .. } = &row.row.state else {
            panic!("{id} is not dead: {:?}", row.row.state);
        };
        assert!(reason.contains("HTTP 422 Unprocessable Entity"), "{reason}");
        assert!(
            reason.contains("recipient phone number not valid"),
            "{reason}"
        );
        assert_eq!(row.row.attempts, 1, "dead-lettered at once");
    }
    assert_eq!(store.ids_with_status(Status::Published).len(), 27);
    // Each message was sent exactly once; the bad ones did not block anything.
    let mut sent: HashMap<String, usize> = HashMap::new();
    for r in server.requests() {
        *sent
            .entry(r.header(headers::MESSAGE_ID).unwrap().to_owned())
            .or_default() += 1;
    }
    assert_eq!(sent.len(), 30);
    assert!(sent.values().all(|&n| n == 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retryable_answers_are_retried_and_retry_after_reaches_the_row() {
    // The first attempt of every message gets a 503 asking to wait 30 s; the first
    // attempt of "flaky" messages gets a plain 500.
    let server = TestServer::with(|r, _| match (r.header(headers::ATTEMPT), r.uri.path()) {
        (Some("1"), "/throttled") => Reply::status(503).header("retry-after", "30"),
        (Some("1"), _) => Reply::status(500),
        _ => Reply::ok(),
    })
    .await;
    let store = MemoryStore::new();
    let throttled = store
        .enqueue(NewMessage::builder("throttled", "e").build().unwrap())
        .unwrap();
    let flaky = store
        .enqueue(NewMessage::builder("flaky", "e").build().unwrap())
        .unwrap();
    // One sink per route, no circuit breaker: every attempt reaches the server.
    let relay = Relay::builder(store.clone())
        .route(
            "throttled",
            common::sink(common::config(server.url("/throttled"))),
        )
        .route("flaky", common::sink(common::config(server.url("/flaky"))))
        .retry(RetryPolicy::exponential(
            Duration::from_millis(50),
            Duration::from_millis(50),
        ))
        .build()
        .unwrap();
    let before = Utc::now();
    // One batch holds both rows; `drain` could already take the flaky one again.
    let report = relay.run_once().await.unwrap();
    assert_eq!(report.retried, 2, "{report:?}");

    let row = store.row(throttled).unwrap();
    let RowState::Pending { available_at } = row.row.state else {
        panic!("{row:?}")
    };
    assert!(
        available_at >= before + chrono::Duration::seconds(29),
        "the retry waits for Retry-After"
    );
    let error = row.row.last_error.as_deref().unwrap();
    assert!(error.contains("HTTP 503"), "{error}");

    // The flaky one comes back after its short backoff (at most 50 ms) and is delivered.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let report = relay.drain().await.unwrap();
    assert_eq!(report.published, 1, "{report:?}");
    assert_eq!(store.row(flaky).unwrap().row.status(), Status::Published);
    let attempts: Vec<_> = server
        .requests()
        .iter()
        .filter(|r| r.uri.path() == "/flaky")
        .map(|r| r.header(headers::ATTEMPT).unwrap().to_owned())
        .collect();
    assert_eq!(attempts, ["1", "2"]);
    // Same identity on both attempts.
    let ids: Vec<_> = server
        .requests()
        .iter()
        .filter(|r| r.uri.path() == "/flaky")
        .map(|r| {
            (
                r.header(headers::MESSAGE_ID).unwrap().to_owned(),
                r.header(headers::IDEMPOTENCY_KEY).unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(ids[0], ids[1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fan_out_rows_are_delivered_and_tracked_on_their_own() {
    let server = TestServer::with(|r, _| {
        if r.uri.path() == "/down" {
            Reply::status(503)
        } else {
            Reply::status(204)
        }
    })
    .await;
    let subscribers = ["hooks/acme", "hooks/globex", "hooks/down"];
    let rows = fan_out(subscribers, "invoice.paid", |m| {
        m.json(&serde_json::json!({ "invoice": 42 }))
            .tenant_id("t-9")
    })
    .unwrap();
    let key = rows[0].idempotency_key().to_owned();
    let ids: Vec<MessageId> = rows.iter().map(NewMessage::id).collect();
    let store = MemoryStore::new();
    store.enqueue_all(rows).unwrap();
    // One sink per subscriber endpoint, each with its own secret (or none).
    let relay = Relay::builder(store.clone())
        .route(
            "hooks/acme",
            common::sink(common::config(server.url("/acme")).secret(common::SECRET)),
        )
        .route(
            "hooks/globex",
            common::sink(common::config(server.url("/globex")).secret(common::OLD_SECRET)),
        )
        .route(
            "hooks/down",
            common::sink(common::config(server.url("/down"))),
        )
        .build()
        .unwrap();
    // One batch: with `drain`, a short jittered backoff could bring the failed row back.
    let report = relay.run_once().await.unwrap();
    assert_eq!(
        (report.claimed, report.published, report.retried),
        (3, 2, 1),
        "{report:?}"
    );

    assert_eq!(store.row(ids[0]).unwrap().row.status(), Status::Published);
    assert_eq!(store.row(ids[1]).unwrap().row.status(), Status::Published);
    assert_eq!(store.row(ids[2]).unwrap().row.status(), Status::Pending);
    let requests = server.requests();
    for (path, id) in [("/acme", ids[0]), ("/globex", ids[1]), ("/down", ids[2])] {
        let got: Vec<_> = requests.iter().filter(|r| r.uri.path() == path).collect();
        assert_eq!(got.len(), 1, "{path}");
        assert_eq!(
            got[0].header(headers::IDEMPOTENCY_KEY),
            Some(key.as_str()),
            "one event key"
        );
        assert_eq!(
            got[0].header(headers::MESSAGE_ID),
            Some(&*id.to_string()),
            "own row"
        );
        assert_eq!(got[0].header(headers::TENANT_ID), Some("t-9"));
    }
    assert!(
        requests
            .iter()
            .find(|r| r.uri.path() == "/down")
            .unwrap()
            .header(headers::WEBHOOK_SIGNATURE)
            .is_none()
    );
}

/// Each row's attempts and last error, keyed by its id.
fn rows(store: &MemoryStore, ids: &[MessageId]) -> Vec<(u32, String)> {
    ids.iter()
        .map(|id| {
            let row = store.row(*id).unwrap().row;
            assert_eq!(row.status(), Status::Pending, "{row:?}");
            (row.attempts, row.last_error.unwrap_or_default())
        })
        .collect()
}

/// Waits until every row of `ids` can be claimed again.
async fn wait_until_due(store: &MemoryStore, ids: &[MessageId]) {
    outbox_test_support::wait_until("every row due again", Duration::from_secs(10), || async {
        ids.iter().all(|id| {
            matches!(store.row(*id).unwrap().row.state,
                RowState::Pending { available_at } if available_at <= Utc::now())
        })
    })
    .await;
}

fn enqueue(store: &MemoryStore, destination: &str, n: usize) -> Vec<MessageId> {
    (0..n)
        .map(|i| {
            store
                .enqueue(
                    NewMessage::builder(destination, "e")
                        .json(&serde_json::json!({ "n": i }))
                        .build()
                        .unwrap(),
                )
                .unwrap()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_500_storm_opens_the_circuit_and_the_rest_wait_without_using_attempts() {
    let server = TestServer::with(|_, _| Reply::status(500)).await;
    // One request at a time, so the breaker's stop is seen by every message after the
    // third failure.
    let sink = Arc::new(
        common::sink(common::config(server.url("/")).max_in_flight(1)).circuit_breaker(
            CircuitConfig::default()
                .failures(3)
                .cool_down(Duration::from_secs(60)),
        ),
    );
    let store = MemoryStore::new();
    let ids = enqueue(&store, "api", 12);
    let relay = Relay::builder(store.clone())
        .route("api", Arc::clone(&sink))
        .batch_size(12)
        .retry(RetryPolicy::exponential(
            Duration::from_millis(10),
            Duration::from_millis(10),
        ))
        .build()
        .unwrap();

    let before_first = Utc::now();
    let report = relay.run_once().await.unwrap();
    assert_eq!((report.claimed, report.retried), (12, 12), "{report:?}");
    // The breaker wraps the whole publish call: the third 500 opens it and stops the
    // call, and the sink sends none of the rest of the batch.
    assert_eq!(server.count(), 3, "requests after the circuit opened");
    let health = sink.health();
    assert_eq!(
        (health.circuit, health.consecutive_failures),
        (CircuitState::Open, 3)
    );
    let after_first = rows(&store, &ids);
    let sent: Vec<_> = after_first
        .iter()
        .filter(|(_, e)| e.contains("HTTP 500"))
        .collect();
    assert_eq!(sent.len(), 3, "{after_first:?}");
    assert!(sent.iter().all(|(attempts, _)| *attempts == 1), "{sent:?}");
    for (attempts, error) in after_first.iter().filter(|(_, e)| !e.contains("HTTP 500")) {
        assert_eq!(
            *attempts, 0,
            "a message never sent used no attempt: {error}"
        );
        assert!(
            error.contains("not sent: the circuit breaker opened"),
            "{error}"
        );
    }

    // The stopped messages wait for the cool-down at once; the three that were sent come
    // back after their short backoff, and the open circuit refuses them without a
    // request, asking for the rest of the cool-down too.
    let waits_for_the_cool_down = |id: &MessageId, since| {
        let RowState::Pending { available_at } = store.row(*id).unwrap().row.state else {
            unreachable!()
        };
        available_at >= since + chrono::Duration::seconds(50)
    };
    let (sent_ids, stopped_ids): (Vec<MessageId>, Vec<MessageId>) = ids
        .iter()
        .partition(|id| store.row(**id).unwrap().row.attempts == 1);
    assert!(
        stopped_ids
            .iter()
            .all(|id| waits_for_the_cool_down(id, before_first))
    );
    wait_until_due(&store, &sent_ids).await;
    let report = relay.run_once().await.unwrap();
    assert_eq!((report.claimed, report.retried), (3, 3), "{report:?}");
    assert_eq!(server.count(), 3, "an open circuit sends nothing");
    for id in &sent_ids {
        let row = store.row(*id).unwrap().row;
        assert_eq!(row.attempts, 1, "no attempt used: {row:?}");
        assert!(row.last_error.unwrap().contains("circuit breaker is open"));
        assert!(waits_for_the_cool_down(id, before_first));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_with_retry_after_pauses_the_route() {
    let server = TestServer::with(|_, _| Reply::status(429).header("retry-after", "30")).await;
    let sink = common::sink(common::config(server.url("/")).max_in_flight(1))
        .circuit_breaker(CircuitConfig::default());
    let sink = Arc::new(sink);
    let store = MemoryStore::new();
    let ids = enqueue(&store, "api", 5);
    let relay = Relay::builder(store.clone())
        .route("api", Arc::clone(&sink))
        .retry(RetryPolicy::exponential(
            Duration::from_millis(10),
            Duration::from_millis(10),
        ))
        .build()
        .unwrap();
    let before = Utc::now();
    let report = relay.run_once().await.unwrap();
    assert_eq!((report.claimed, report.retried), (5, 5), "{report:?}");
    assert_eq!(server.count(), 1, "one 429 stops the rest of the batch");
    assert!(sink.health().paused_for.is_some());
    assert_eq!(sink.health().circuit, CircuitState::Closed, "one failure");

    let after_first = rows(&store, &ids);
    let (throttled, rest): (Vec<_>, Vec<_>) = ids
        .iter()
        .zip(&after_first)
        .partition(|(_, (_, e))| e.contains("HTTP 429"));
    assert_eq!(throttled.len(), 1, "{after_first:?}");
    let RowState::Pending { available_at } = store.row(*throttled[0].0).unwrap().row.state else {
        unreachable!()
    };
    assert!(
        available_at >= before + chrono::Duration::seconds(29),
        "the throttled message waits for Retry-After"
    );
    // The breaker stopped the call: the rest were not sent, used no attempt, and wait out
    // the pause the receiver asked for.
    for (id, (attempts, error)) in &rest {
        assert_eq!(*attempts, 0, "{error}");
        assert!(
            error.contains("not sent: the receiver asked to wait"),
            "{error}"
        );
        let RowState::Pending { available_at } = store.row(**id).unwrap().row.state else {
            unreachable!()
        };
        assert!(
            available_at >= before + chrono::Duration::seconds(25),
            "waits for the pause: {available_at} vs {before}"
        );
    }
}
