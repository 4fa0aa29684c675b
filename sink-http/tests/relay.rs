//! The sink under the relay (with the in-memory store): dead letters, retries and
//! fan-out, message by message.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use chrono::Utc;
use common::{Reply, TestServer};
use outbox_core::state::RowState;
use outbox_core::{MemoryStore, MessageId, NewMessage, Relay, RetryPolicy, Status};
use outbox_sink_http::{CircuitConfig, EndpointConfig, fan_out, headers};

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
    let sink = common::sink_to("whatsapp", EndpointConfig::new(server.url("/v1/messages")));
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
    let relay = sink
        .register(Relay::builder(store.clone()))
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
    let sink = common::config()
        .route(
            "throttled",
            EndpointConfig::new(server.url("/throttled")).circuit(CircuitConfig::disabled()),
        )
        .route(
            "flaky",
            EndpointConfig::new(server.url("/flaky")).circuit(CircuitConfig::disabled()),
        )
        .build()
        .unwrap();
    let store = MemoryStore::new();
    let throttled = store
        .enqueue(NewMessage::builder("throttled", "e").build().unwrap())
        .unwrap();
    let flaky = store
        .enqueue(NewMessage::builder("flaky", "e").build().unwrap())
        .unwrap();
    let relay = sink
        .register(Relay::builder(store.clone()))
        .retry(
            RetryPolicy::default()
                .initial_delay(Duration::from_millis(50))
                .max_delay(Duration::from_millis(50)),
        )
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
    let sink = common::config()
        .route(
            "hooks/acme",
            EndpointConfig::new(server.url("/acme")).secret(common::SECRET),
        )
        .route(
            "hooks/globex",
            EndpointConfig::new(server.url("/globex")).secret(common::OLD_SECRET),
        )
        .route("hooks/down", EndpointConfig::new(server.url("/down")))
        .build()
        .unwrap();
    let rows = fan_out(subscribers, "invoice.paid", |m| {
        m.json(&serde_json::json!({ "invoice": 42 }))
            .tenant_id("t-9")
    })
    .unwrap();
    let key = rows[0].idempotency_key().to_owned();
    let ids: Vec<MessageId> = rows.iter().map(NewMessage::id).collect();
    let store = MemoryStore::new();
    store.enqueue_all(rows).unwrap();
    let relay = sink
        .register(Relay::builder(store.clone()))
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
