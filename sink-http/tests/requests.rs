//! What goes over the wire and how every answer is classified, against a real server.

mod common;

use std::time::Duration;

use chrono::Utc;
use common::config;
use common::{Canary, OLD_SECRET, Reply, SECRET, TestServer, message};
use outbox_engine::layers::{CircuitConfig, SinkExt};
use outbox_engine::testkit::publish;
use outbox_engine::webhooks::{Secret, Verifier, idempotency_key};
use outbox_engine::{
    Failure, FailureClass, Message, MessageId, NewMessage, Outcome, PublishContext, Sink,
};
use outbox_sink_http::{HttpSinkConfig, headers};
use tokio::time::Instant;

fn failure(outcome: &Outcome) -> &Failure {
    match outcome {
        Outcome::Failed(f) => f,
        other => panic!("expected a failure, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_carries_identity_signatures_and_route_headers() {
    let server = TestServer::start().await;
    let sink = common::sink(
        config(server.url("/hooks?tenant=1"))
            .method("put")
            .secret(SECRET)
            .secret(OLD_SECRET)
            .header("authorization", "Bearer route-token"),
    );
    let mut m = NewMessage::builder("orders", "order.paid")
        .json(&serde_json::json!({ "order": 7 }))
        .idempotency_key("order-7:paid")
        .partition_key("order-7")
        .tenant_id("acme")
        .aggregate("order", "7")
        .header(
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        )
        .header("authorization", "Bearer message-token")
        .header("x-custom", "héllo")
        .build()
        .unwrap()
        .into_message(Utc::now());
    m.attempts = 3;
    let outcomes = publish(&sink, std::slice::from_ref(&m)).await;
    assert_eq!(outcomes, [Outcome::published_with("HTTP 200")]);

    let r = &server.requests()[0];
    assert_eq!(r.method, "PUT");
    assert_eq!(r.uri.to_string(), "/hooks?tenant=1");
    assert_eq!(r.body.as_ref(), br#"{"order":7}"#);
    let expect = [
        ("content-type", "application/json"),
        (headers::IDEMPOTENCY_KEY, "order-7:paid"),
        (headers::MESSAGE_ID, &m.id.to_string()),
        (headers::EVENT_TYPE, "order.paid"),
        (headers::ATTEMPT, "3"),
        (headers::PARTITION_KEY, "order-7"),
        (headers::TENANT_ID, "acme"),
        (headers::AGGREGATE_TYPE, "order"),
        (headers::AGGREGATE_ID, "7"),
        (headers::WEBHOOK_ID, "order-7:paid"),
        (
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ),
        // The route's header wins over the message's.
        ("authorization", "Bearer route-token"),
    ];
    for (name, value) in expect {
        assert_eq!(r.header(name), Some(value), "header {name}");
    }
    assert_eq!(r.headers["x-custom"].as_bytes(), "héllo".as_bytes());
    assert!(
        r.header("user-agent")
            .unwrap()
            .starts_with("outbox-sink-http/")
    );
    let timestamp: i64 = r
        .header(headers::WEBHOOK_TIMESTAMP)
        .unwrap()
        .parse()
        .unwrap();
    assert!((Utc::now().timestamp() - timestamp).abs() <= 5);

    // One signature per secret: a receiver holding either secret accepts the request,
    // one holding neither does not.
    let signatures = r.header(headers::WEBHOOK_SIGNATURE).unwrap();
    assert_eq!(signatures.split(' ').count(), 2, "{signatures}");
    let lookup = |name: &str| r.header(name);
    for secret in [SECRET, OLD_SECRET] {
        let verifier = Verifier::new(vec![Secret::parse(secret).unwrap()]);
        let webhook = verifier.verify(lookup, &r.body, timestamp).unwrap();
        assert_eq!(webhook.id, "order-7:paid");
    }
    let stranger = Verifier::new(vec![
        Secret::from_bytes(b"another key, long enough").unwrap(),
    ]);
    assert!(stranger.verify(lookup, &r.body, timestamp).is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsigned_routes_send_no_webhook_headers() {
    let server = TestServer::start().await;
    let sink = common::sink(config(server.url("/")));
    publish(&sink, &[message("plain", 1)]).await;
    let r = &server.requests()[0];
    for name in [
        headers::WEBHOOK_ID,
        headers::WEBHOOK_TIMESTAMP,
        headers::WEBHOOK_SIGNATURE,
    ] {
        assert!(r.header(name).is_none(), "{name}");
    }
    assert!(r.header(headers::IDEMPOTENCY_KEY).is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsendable_messages_fail_permanently_without_a_request() {
    let server = TestServer::start().await;
    let sink = common::sink(config(server.url("/")));
    let reserved = NewMessage::builder("orders", "e")
        .header("content-length", "5")
        .build()
        .unwrap()
        .into_message(Utc::now());
    // A row written by another program can hold what the builder would refuse.
    let broken_key = Message::from_parts(
        MessageId::new(),
        "orders".to_owned(),
        "e".to_owned(),
        b"{}".to_vec(),
        "application/json".to_owned(),
        "line\nbreak".to_owned(),
        1,
        Utc::now(),
    );
    // Routing is the relay's job: the sink serves one route and sends every message it
    // is given, whatever its destination (no `UnknownDestination` from the sink).
    let elsewhere = message("elsewhere", 1);
    let ok = message("orders", 2);
    let outcomes = publish(&sink, &[reserved, broken_key, elsewhere, ok]).await;
    let f = failure(&outcomes[0]);
    assert_eq!((f.class, f.retryable), (FailureClass::Serialization, false));
    assert!(f.message.contains("content-length"), "{f}");
    let f = failure(&outcomes[1]);
    assert_eq!((f.class, f.retryable), (FailureClass::Serialization, false));
    assert!(f.message.contains(headers::IDEMPOTENCY_KEY), "{f}");
    assert!(outcomes[2].is_published(), "{:?}", outcomes[2]);
    assert!(outcomes[3].is_published());
    assert_eq!(server.count(), 2, "only the sendable messages were sent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statuses_are_classified() {
    // The message's payload says which status to answer.
    let server = TestServer::with(|r, _| {
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        let status = v["status"].as_u64().unwrap() as u16;
        Reply::status(status).body(format!("answer {status}"))
    })
    .await;
    let sink = common::sink(config(server.url("/")));
    let cases: &[(u16, Option<(FailureClass, bool)>)] = &[
        (200, None),
        (201, None),
        (202, None),
        (204, None),
        (400, Some((FailureClass::Rejected, false))),
        (401, Some((FailureClass::Rejected, false))),
        (404, Some((FailureClass::Rejected, false))),
        (409, Some((FailureClass::Rejected, false))),
        (413, Some((FailureClass::TooLarge, false))),
        (422, Some((FailureClass::Rejected, false))),
        (408, Some((FailureClass::Timeout, true))),
        (425, Some((FailureClass::Unavailable, true))),
        (429, Some((FailureClass::RateLimited, true))),
        (500, Some((FailureClass::Unavailable, true))),
        (502, Some((FailureClass::Unavailable, true))),
        (503, Some((FailureClass::Unavailable, true))),
        (504, Some((FailureClass::Unavailable, true))),
    ];
    let batch: Vec<Message> = cases
        .iter()
        .map(|(status, _)| {
            NewMessage::builder("s", "e")
                .json(&serde_json::json!({ "status": status }))
                .build()
                .unwrap()
                .into_message(Utc::now())
        })
        .collect();
    let outcomes = publish(&sink, &batch).await;
    assert_eq!(outcomes.len(), cases.len());
    for ((status, want), outcome) in cases.iter().zip(&outcomes) {
        match want {
            None => assert_eq!(outcome, &Outcome::published_with(format!("HTTP {status}"))),
            Some((class, retryable)) => {
                let f = failure(outcome);
                assert_eq!(
                    (f.class, f.retryable),
                    (*class, *retryable),
                    "{status}: {f}"
                );
                assert!(f.message.starts_with(&format!("HTTP {status}")), "{f}");
                if !retryable {
                    assert!(
                        f.message.ends_with(&format!("answer {status}")),
                        "reason carries the body: {f}"
                    );
                }
            }
        }
    }
    assert_eq!(server.count(), cases.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_seconds_is_reported_and_the_circuit_breaker_pauses_the_route() {
    let server = TestServer::with(|_, _| Reply::status(429).header("retry-after", "2")).await;

    // The sink alone reports the Retry-After and keeps sending: pausing is the circuit
    // breaker layer's job.
    let bare = common::sink(config(server.url("/")));
    let outcomes = publish(&bare, &[message("api", 1), message("api", 2)]).await;
    for outcome in &outcomes {
        let f = failure(outcome);
        assert_eq!((f.class, f.retryable), (FailureClass::RateLimited, true));
        assert_eq!(f.retry_after, Some(Duration::from_secs(2)));
        assert!(!f.deferred, "it was sent: {f}");
    }
    assert_eq!(server.count(), 2);

    // Behind the breaker, one request at a time: the 429 pauses the route and stops the
    // call, so the rest of the batch is not sent.
    let sink = common::sink(config(server.url("/")).max_in_flight(1))
        .circuit_breaker(CircuitConfig::default());
    let batch: Vec<Message> = (3..7).map(|n| message("api", n)).collect();
    let outcomes = publish(&sink, &batch).await;
    let (sent, held): (Vec<&Failure>, Vec<&Failure>) = outcomes
        .iter()
        .map(failure)
        .partition(|f| f.message.starts_with("HTTP 429"));
    assert_eq!(sent.len(), 1, "{outcomes:?}");
    assert_eq!(sent[0].retry_after, Some(Duration::from_secs(2)));
    for f in &held {
        assert!(f.retryable && f.deferred, "{f}");
        assert!(
            f.message
                .starts_with("not sent: the receiver asked to wait"),
            "{f}"
        );
    }
    assert_eq!(server.count(), 3);

    // The next call, within the pause: nothing is sent.
    let paused = publish(&sink, &[message("api", 7), message("api", 8)]).await;
    for outcome in &paused {
        let f = failure(outcome);
        assert_eq!(
            (f.class, f.retryable, f.deferred),
            (FailureClass::RateLimited, true, true),
            "{f}"
        );
        assert!(f.message.contains("asked to wait"), "{f}");
        let wait = f.retry_after.unwrap();
        assert!(
            wait > Duration::ZERO && wait <= Duration::from_secs(2),
            "{wait:?}"
        );
    }
    assert_eq!(server.count(), 3);
    assert!(sink.health().paused_for.is_some());

    tokio::time::sleep(Duration::from_millis(2100)).await;
    server.set(|_, _| Reply::ok());
    assert_eq!(sink.health().paused_for, None);
    assert!(publish(&sink, &[message("api", 9)]).await[0].is_published());
    assert_eq!(server.count(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_http_date_is_honoured_and_capped() {
    let date = httpdate::fmt_http_date(std::time::SystemTime::now() + Duration::from_secs(90));
    let server =
        TestServer::with(move |_, _| Reply::status(503).header("retry-after", &date)).await;
    let sink = common::sink(config(server.url("/")));
    let outcomes = publish(&sink, &[message("api", 1)]).await;
    let wait = failure(&outcomes[0]).retry_after.unwrap();
    assert!(
        wait > Duration::from_secs(85) && wait <= Duration::from_secs(90),
        "{wait:?}"
    );

    let capped = common::sink(config(server.url("/")).max_retry_after(Duration::from_secs(30)));
    let outcomes = publish(&capped, &[message("api", 2)]).await;
    assert_eq!(
        failure(&outcomes[0]).retry_after,
        Some(Duration::from_secs(30))
    );

    // A date in the past means "now": no wait.
    let past = httpdate::fmt_http_date(std::time::SystemTime::now() - Duration::from_secs(60));
    server.set(move |_, _| Reply::status(503).header("retry-after", &past));
    let fresh = common::sink(config(server.url("/")));
    let outcomes = publish(&fresh, &[message("api", 3), message("api", 4)]).await;
    for outcome in &outcomes {
        let f = failure(outcome);
        assert_eq!(f.retry_after, Some(Duration::ZERO), "{f}");
        assert!(f.message.starts_with("HTTP 503"), "both were sent: {f}");
    }
    // Nor a pause behind a breaker: the next call is sent. (One message per call: the
    // breaker currently stops the rest of a call even on a zero retry-after.)
    let breaker = common::sink(config(server.url("/"))).circuit_breaker(CircuitConfig::default());
    for n in [5, 6] {
        let outcomes = publish(&breaker, &[message("api", n)]).await;
        let f = failure(&outcomes[0]);
        assert!(f.message.starts_with("HTTP 503"), "sent: {f}");
        assert_eq!(breaker.health().paused_for, None);
    }
    assert_eq!(server.count(), 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirect_to_loopback_is_not_followed() {
    let canary = Canary::start().await;
    // 127.0.0.1 is allow-listed, so only the disabled redirect policy stands between the
    // 302 and the canary.
    let target = format!("http://127.0.0.1:{}/internal/admin?token=x", canary.port);
    let server = TestServer::with(move |r, _| {
        let status = match r.uri.path() {
            "/moved" => 301,
            "/temp" => 307,
            _ => 302,
        };
        Reply::status(status).header("location", &target)
    })
    .await;
    // One route (one sink) per path.
    for (n, (path, code, retryable)) in [
        ("/found", 302, true),
        ("/moved", 301, false),
        ("/temp", 307, true),
    ]
    .into_iter()
    .enumerate()
    {
        let sink = common::sink(config(server.url(path)));
        let outcomes = publish(&sink, &[message("r", n as u64)]).await;
        let f = failure(&outcomes[0]);
        assert!(f.message.starts_with(&format!("HTTP {code}")), "{f}");
        assert!(f.message.contains("not followed"), "{f}");
        assert!(
            !f.message.contains("token"),
            "the location's query is not logged: {f}"
        );
        assert_eq!(f.retryable, retryable, "{f}");
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(server.count(), 3);
    assert_eq!(canary.connections(), 0, "a redirect was followed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_bodies_are_read_with_a_cap() {
    let huge = vec![b'x'; 8 * 1024 * 1024];
    let server = TestServer::with(move |r, _| {
        let status = if r.body.as_ref() == b"\"ok\"" {
            200
        } else {
            400
        };
        Reply::status(status).body(huge.clone())
    })
    .await;
    let sink = common::sink(
        config(server.url("/"))
            .max_response_body(4096)
            .max_error_body(100),
    );
    let bad = message("big", 1);
    let good = NewMessage::builder("big", "e")
        .json("ok")
        .build()
        .unwrap()
        .into_message(Utc::now());
    let started = Instant::now();
    let outcomes = publish(&sink, &[bad, good]).await;
    let f = failure(&outcomes[0]);
    assert!(!f.retryable);
    assert!(f.message.ends_with("… (truncated)"), "{f}");
    assert!(f.message.len() < 200, "{}", f.message.len());
    assert!(
        outcomes[1].is_published(),
        "a 2xx with a huge body is still an acknowledgement"
    );
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_endpoints_time_out_retryably() {
    let server = TestServer::with(|_, _| Reply::ok().delay(Duration::from_secs(3))).await;
    let sink = common::sink(config(server.url("/")).request_timeout(Duration::from_millis(300)));
    let started = Instant::now();
    let outcomes = publish(&sink, &[message("slow", 1)]).await;
    let f = failure(&outcomes[0]);
    assert_eq!((f.class, f.retryable), (FailureClass::Timeout, true), "{f}");
    assert!(f.message.starts_with("request timed out"), "{f}");
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_publish_deadline_bounds_a_batch() {
    // The first request is answered at once; the next is held far beyond the deadline.
    let server = TestServer::with(|_, index| {
        if index == 0 {
            Reply::ok()
        } else {
            Reply::ok().delay(Duration::from_secs(60))
        }
    })
    .await;
    let sink = common::sink(config(server.url("/")).max_in_flight(1));
    let batch: Vec<Message> = (0..5).map(|n| message("slow", n)).collect();
    let started = Instant::now();
    // The deadline is the context's (the relay's publish timeout).
    let outcomes = sink
        .publish(
            &batch,
            &PublishContext::timeout(Duration::from_millis(1500)),
        )
        .await
        .unwrap();
    let elapsed = started.elapsed();
    assert!(elapsed < Duration::from_secs(5), "{elapsed:?}");
    assert!(outcomes[0].is_published());
    let cut = failure(&outcomes[1]);
    assert_eq!((cut.class, cut.retryable), (FailureClass::Timeout, true));
    assert!(cut.message.contains("may have been delivered"), "{cut}");
    assert!(!cut.deferred, "it was sent: {cut}");
    for outcome in &outcomes[2..] {
        let f = failure(outcome);
        assert_eq!((f.class, f.retryable), (FailureClass::Timeout, true));
        assert!(f.message.starts_with("not sent"), "{f}");
        assert!(f.deferred, "never sent: {f}");
    }
    assert_eq!(server.count(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_errors_are_retryable_and_do_not_leak_the_url() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let sink = common::sink(config(format!(
        "http://user:pw@127.0.0.1:{port}/T000/secret-token"
    )));
    let outcomes = publish(&sink, &[message("gone", 1)]).await;
    let f = failure(&outcomes[0]);
    assert_eq!(
        (f.class, f.retryable),
        (FailureClass::Connection, true),
        "{f}"
    );
    for secret in ["secret-token", "pw", "T000"] {
        assert!(!f.message.contains(secret), "{f}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn url_credentials_are_sent_as_basic_auth() {
    let server = TestServer::start().await;
    let url = format!("http://user:pa%20ss@{}/", server.addr);
    let sink = common::sink(config(url));
    publish(&sink, &[message("auth", 1)]).await;
    // base64("user:pa ss")
    assert_eq!(
        server.requests()[0].header("authorization"),
        Some("Basic dXNlcjpwYSBzcw==")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_in_flight_are_limited_per_route() {
    let server = TestServer::with(|_, _| Reply::ok().delay(Duration::from_millis(150))).await;
    let sink = common::sink(config(server.url("/")).max_in_flight(3));
    let batch: Vec<Message> = (0..12).map(|n| message("c", n)).collect();
    let started = Instant::now();
    let outcomes = publish(&sink, &batch).await;
    assert!(outcomes.iter().all(Outcome::is_published));
    assert_eq!(server.max_in_flight(), 3);
    // 12 requests, 3 at a time, 150 ms each: at least 4 rounds.
    assert!(
        started.elapsed() >= Duration::from_millis(590),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_sharing_a_partition_key_go_in_batch_order() {
    // Earlier messages answer more slowly; sent concurrently they would arrive reversed.
    let server = TestServer::with(|r, _| {
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        let n = v["n"].as_u64().unwrap();
        Reply::ok().delay(Duration::from_millis(10 * (8 - n % 8)))
    })
    .await;
    let sink = common::sink(config(server.url("/")));
    let batch: Vec<Message> = (0..16)
        .map(|n| {
            NewMessage::builder("k", "e")
                .json(&serde_json::json!({ "n": n }))
                .partition_key(if n % 2 == 0 { "even" } else { "odd" })
                .build()
                .unwrap()
                .into_message(Utc::now())
        })
        .collect();
    assert!(
        publish(&sink, &batch)
            .await
            .iter()
            .all(Outcome::is_published)
    );
    let arrivals = |key: &str| -> Vec<u64> {
        server
            .requests()
            .iter()
            .filter(|r| r.header(headers::PARTITION_KEY) == Some(key))
            .map(|r| {
                serde_json::from_slice::<serde_json::Value>(&r.body).unwrap()["n"]
                    .as_u64()
                    .unwrap()
            })
            .collect()
    };
    assert_eq!(arrivals("even"), [0, 2, 4, 6, 8, 10, 12, 14]);
    assert_eq!(arrivals("odd"), [1, 3, 5, 7, 9, 11, 13, 15]);
    assert_eq!(server.max_in_flight(), 2, "the two keys went in parallel");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_config_deserializes_and_builds() {
    let server = TestServer::start().await;
    // One route's table, as in `[routes.orders]` of a config file.
    let json = serde_json::json!({
        "url": server.url("/o"),
        "secrets": [SECRET],
        "request_timeout": "1500ms",
        "max_in_flight": 2,
        "allow": ["127.0.0.1/32"],
        "headers": { "authorization": "Bearer t" }
    });
    let config: HttpSinkConfig = serde_json::from_value(json).unwrap();
    assert_eq!(config.request_timeout, Duration::from_millis(1500));
    assert_eq!(config.max_in_flight, 2);
    assert_eq!(config.method, "POST", "defaults fill the rest");
    let sink = config.build().unwrap();
    assert!(publish(&sink, &[message("orders", 1)]).await[0].is_published());
    let r = &server.requests()[0];
    assert!(r.header(headers::WEBHOOK_SIGNATURE).is_some());
    assert_eq!(r.header("authorization"), Some("Bearer t"));

    let route = |extra: serde_json::Value| {
        let mut table = serde_json::json!({ "url": "https://x.example/" });
        table
            .as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        serde_json::from_value::<HttpSinkConfig>(table)
            .err()
            .map(|e| e.to_string())
    };
    assert_eq!(
        route(serde_json::json!({})),
        None,
        "the URL alone is a route"
    );
    // Unknown keys are refused: a typo, the old names, and a whole multi-route table.
    for (key, value) in [
        ("request_timout", serde_json::json!("1s")),
        ("concurrency", serde_json::json!(4)),
        ("routes", serde_json::json!({})),
    ] {
        let err = route(serde_json::Value::Object(
            [(key.to_owned(), value)].into_iter().collect(),
        ))
        .expect(key);
        assert!(err.contains(&format!("unknown field `{key}`")), "{err}");
    }
    // Durations need a unit, and a bad one is not echoed (it may be a misplaced secret).
    for value in [serde_json::json!("10"), serde_json::json!(10)] {
        let err = route(serde_json::json!({ "request_timeout": value })).unwrap();
        assert!(err.contains("needs a unit"), "{err}");
    }
    let err = route(serde_json::json!({ "connect_timeout": "whsec_oops" })).unwrap();
    assert!(err.contains("not a duration"), "{err}");
    assert!(!err.contains("whsec_oops"), "{err}");
}

#[test]
fn invalid_configuration_names_the_setting() {
    let base = || HttpSinkConfig::new("https://hooks.example.com/");
    let mut unset_env = base();
    unset_env.secrets_env = Some("OUTBOX_TEST_SURELY_UNSET_SECRETS".into());
    let cases: Vec<(HttpSinkConfig, &str, &str)> = vec![
        (HttpSinkConfig::new("not a url"), "url", ""),
        (
            HttpSinkConfig::new("ftp://x.example/"),
            "url",
            "http or https",
        ),
        (
            HttpSinkConfig::new("http://x.example/").require_https(true),
            "url",
            "https",
        ),
        (HttpSinkConfig::new("http://10.0.0.1/"), "url", "SSRF"),
        (base().method("GET"), "method", "GET"),
        (
            base().header("content-length", "1"),
            "headers",
            "content-length",
        ),
        (base().header("bad name", "1"), "headers", "bad name"),
        (base().header("x-a", "a\nb"), "headers", "x-a"),
        (base().secret("whsec_???"), "secrets", "secret 1"),
        (base().secret("nope"), "secrets", "whsec_"),
        (unset_env, "secrets_env", "OUTBOX_TEST_SURELY_UNSET_SECRETS"),
        (base().max_in_flight(0), "max_in_flight", "1..=1024"),
        (base().max_in_flight(1025), "max_in_flight", "1..=1024"),
        (
            base().request_timeout(Duration::ZERO),
            "request_timeout",
            "zero",
        ),
        (
            base().connect_timeout(Duration::ZERO),
            "connect_timeout",
            "zero",
        ),
        (base().user_agent("a\nb"), "user_agent", "header value"),
        (base().allow("not a rule!"), "allow", "not a rule!"),
    ];
    for (config, setting, needle) in cases {
        let err = config.build().unwrap_err();
        assert_eq!(err.setting(), setting, "{err}");
        assert!(!err.is_retryable(), "{err}");
        assert!(
            err.to_string().contains(needle) && err.reason().contains(needle),
            "{err} should mention {needle}"
        );
    }
    // An allow entry for the route lets an internal literal through.
    assert!(
        HttpSinkConfig::new("http://10.0.0.1/")
            .allow("10.0.0.0/8")
            .build()
            .is_ok()
    );
}

#[test]
fn debug_output_hides_secrets() {
    let config =
        HttpSinkConfig::new("https://u:hunter2@hooks.example.com/T0/B0/XXXXsecret?sig=abc")
            .secret(SECRET)
            .header("authorization", "Bearer tok123");
    let sink = config.clone().build().unwrap();
    for shown in [format!("{config:?}"), format!("{sink:?}")] {
        assert!(shown.contains("hooks.example.com"), "{shown}");
        for secret in ["hunter2", "XXXXsecret", "sig=abc", "tok123", &SECRET[6..]] {
            assert!(!shown.contains(secret), "{secret} leaked: {shown}");
        }
    }
}

/// The signed content is `{id}.{timestamp}.{body}`, so a signed id may not contain a
/// `.` (verifiers refuse such ids as ambiguous): the sink sends the key percent-encoded in
/// `webhook-id`, which verifies, and as written in `idempotency-key`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_with_a_dot_is_signed_percent_encoded() {
    let server = TestServer::start().await;
    let sink = common::sink(config(server.url("/hook")).secret(SECRET));
    let mut message = message("t", 1);
    message.idempotency_key = "order.42.paid".into();
    let outcomes = publish(&sink, &[message]).await;
    assert!(outcomes[0].is_published(), "{outcomes:?}");
    let request = &server.requests()[0];
    assert_eq!(request.header("webhook-id"), Some("order%2E42%2Epaid"));
    assert_eq!(request.header("idempotency-key"), Some("order.42.paid"));
    let verifier = Verifier::new(vec![Secret::parse(SECRET).unwrap()]);
    let now = chrono::Utc::now().timestamp();
    let verified = verifier
        .verify(|name| request.header(name), &request.body, now)
        .expect("the request verifies");
    assert_eq!(idempotency_key(verified.id), "order.42.paid");
}
