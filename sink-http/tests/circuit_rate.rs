//! The circuit breaker and the rate limit against a real server, measured on the
//! server's side.

mod common;

use std::time::Duration;

use common::{Reply, TestServer, message};
use outbox_core::{FailureClass, Message, Outcome, Sink};
use outbox_sink_http::{CircuitConfig, CircuitState, EndpointConfig, HttpSink, RateLimit};

fn failures(outcomes: &[Outcome]) -> Vec<(FailureClass, bool, String)> {
    outcomes
        .iter()
        .map(|o| match o {
            Outcome::Failed(f) => (f.class, f.retryable, f.message.clone()),
            other => panic!("expected a failure, got {other:?}"),
        })
        .collect()
}

fn state(sink: &HttpSink) -> CircuitState {
    sink.health("api").unwrap().circuit
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn circuit_opens_half_opens_and_closes() {
    let server = TestServer::with(|_, _| Reply::status(500)).await;
    // Long enough that the open-circuit checks below finish before it ends.
    let cool_down = Duration::from_secs(2);
    let sink = common::sink_to(
        "api",
        EndpointConfig::new(server.url("/"))
            .circuit(CircuitConfig::default().failures(3).cool_down(cool_down)),
    );

    // Closed: three failures in a row reach the server, then the circuit opens.
    for n in 0..3 {
        assert_eq!(state(&sink), CircuitState::Closed);
        let f = failures(
            &sink
                .publish(
                    &[message("api", n)],
                    &outbox_core::PublishContext::default(),
                )
                .await
                .unwrap(),
        );
        assert_eq!((f[0].0, f[0].1), (FailureClass::Unavailable, true));
        assert!(f[0].2.starts_with("HTTP 500"), "{}", f[0].2);
    }
    assert_eq!(server.count(), 3);
    let health = sink.health("api").unwrap();
    assert_eq!(
        (health.circuit, health.consecutive_failures),
        (CircuitState::Open, 3)
    );

    // Open: messages fail fast, retryably, without a request.
    let batch: Vec<Message> = (10..15).map(|n| message("api", n)).collect();
    let outcomes = sink
        .publish(&batch, &outbox_core::PublishContext::default())
        .await
        .unwrap();
    for (outcome, f) in outcomes.iter().zip(failures(&outcomes)) {
        assert_eq!((f.0, f.1), (FailureClass::Unavailable, true));
        assert!(f.2.contains("circuit breaker"), "{}", f.2);
        let Outcome::Failed(failure) = outcome else {
            unreachable!()
        };
        assert!(failure.retry_after.unwrap() <= cool_down);
    }
    assert_eq!(server.count(), 3, "an open circuit sends nothing");

    // Half-open after the cool-down: one probe goes; it fails and the circuit reopens.
    tokio::time::sleep(cool_down + Duration::from_millis(50)).await;
    assert_eq!(state(&sink), CircuitState::HalfOpen);
    let batch: Vec<Message> = (20..24).map(|n| message("api", n)).collect();
    let f = failures(
        &sink
            .publish(&batch, &outbox_core::PublishContext::default())
            .await
            .unwrap(),
    );
    assert_eq!(server.count(), 4, "exactly one probe");
    assert_eq!(f.iter().filter(|f| f.2.starts_with("HTTP 500")).count(), 1);
    assert_eq!(
        f.iter().filter(|f| f.2.contains("circuit breaker")).count(),
        3
    );
    assert_eq!(state(&sink), CircuitState::Open);

    // The endpoint recovers: the next probe succeeds and the circuit closes.
    server.set(|_, _| Reply::status(204));
    tokio::time::sleep(cool_down + Duration::from_millis(50)).await;
    let outcomes = sink
        .publish(
            &[message("api", 30)],
            &outbox_core::PublishContext::default(),
        )
        .await
        .unwrap();
    assert!(outcomes[0].is_published());
    let health = sink.health("api").unwrap();
    assert_eq!(
        (health.circuit, health.consecutive_failures),
        (CircuitState::Closed, 0)
    );
    let batch: Vec<Message> = (40..50).map(|n| message("api", n)).collect();
    assert!(
        sink.publish(&batch, &outbox_core::PublishContext::default())
            .await
            .unwrap()
            .iter()
            .all(Outcome::is_published)
    );
    assert_eq!(server.count(), 15);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permanent_refusals_and_connection_errors_count_as_they_should() {
    // A 4xx means the endpoint works: it does not open the circuit.
    let server = TestServer::with(|_, _| Reply::status(400)).await;
    let sink = common::sink_to(
        "api",
        EndpointConfig::new(server.url("/")).circuit(CircuitConfig::default().failures(2)),
    );
    let batch: Vec<Message> = (0..6).map(|n| message("api", n)).collect();
    sink.publish(&batch, &outbox_core::PublishContext::default())
        .await
        .unwrap();
    assert_eq!(server.count(), 6);
    assert_eq!(state(&sink), CircuitState::Closed);

    // A refused connection is a failure of the endpoint.
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let dead = common::sink_to(
        "api",
        EndpointConfig::new(format!("http://127.0.0.1:{port}/"))
            .concurrency(1)
            .circuit(CircuitConfig::default().failures(2)),
    );
    let batch: Vec<Message> = (0..4).map(|n| message("api", n)).collect();
    let f = failures(
        &dead
            .publish(&batch, &outbox_core::PublishContext::default())
            .await
            .unwrap(),
    );
    assert_eq!(f[0].0, FailureClass::Connection);
    assert_eq!(f[1].0, FailureClass::Connection);
    assert!(
        f[2].2.contains("circuit breaker") && f[3].2.contains("circuit breaker"),
        "{f:?}"
    );
    assert_eq!(state(&dead), CircuitState::Open);
}

/// Requests per second between the `from`-th request and the last, server side.
fn measured_rate(server: &TestServer, from: usize) -> (f64, usize, Duration) {
    let mut times: Vec<_> = server.requests().iter().map(|r| r.at).collect();
    times.sort();
    let span = times[times.len() - 1] - times[from];
    let intervals = times.len() - 1 - from;
    (intervals as f64 / span.as_secs_f64(), intervals, span)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rate_limit_holds_over_seconds() {
    let server = TestServer::start().await;
    let rate = 40.0;
    let burst = 4;
    let sink = common::config()
        .publish_deadline(Duration::from_secs(20))
        .route(
            "api",
            EndpointConfig::new(server.url("/"))
                .concurrency(16)
                .rate_limit(
                    RateLimit::per_second(rate)
                        .burst(burst)
                        .max_wait(Duration::from_secs(10)),
                ),
        )
        .build()
        .unwrap();
    // 124 requests: a burst of 4, then 120 at 40/s, about 3 s.
    let batch: Vec<Message> = (0..124).map(|n| message("api", n)).collect();
    let started = tokio::time::Instant::now();
    let outcomes = sink
        .publish(&batch, &outbox_core::PublishContext::default())
        .await
        .unwrap();
    assert!(outcomes.iter().all(Outcome::is_published));
    assert_eq!(server.count(), 124);

    let (measured, intervals, span) = measured_rate(&server, burst as usize - 1);
    eprintln!("{intervals} intervals in {span:?}: {measured:.2} requests/s (limit {rate})");
    // Only bounds a scheduler stall cannot break: a stall delays requests, so the rate
    // measured on arrival can look low and overdue requests can arrive bunched.
    // The last slot is (124 - burst) / rate = 3 s after the first; no request goes early.
    let times: Vec<_> = server.requests().iter().map(|r| r.at).collect();
    let last = *times.iter().max().unwrap();
    assert!(
        last - started >= Duration::from_millis(2950),
        "the last request arrived {:?} after the start",
        last - started
    );
    assert!(started.elapsed() < Duration::from_secs(15));

    // Within any one second, at most burst + rate requests started, plus the requests
    // holding concurrency permits (16): after a stall, those that were waiting for their
    // slots go at once.
    for &start in &times {
        let window = times
            .iter()
            .filter(|&&t| t >= start && t < start + Duration::from_secs(1))
            .count();
        assert!(
            window <= burst as usize + rate as usize + 16,
            "{window} requests in one second"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_beyond_max_wait_are_not_sent_and_retry_later() {
    let server = TestServer::start().await;
    let sink = common::sink_to(
        "api",
        EndpointConfig::new(server.url("/"))
            .rate_limit(RateLimit::per_second(10.0).max_wait(Duration::from_millis(350))),
    );
    let batch: Vec<Message> = (0..10).map(|n| message("api", n)).collect();
    let outcomes = sink
        .publish(&batch, &outbox_core::PublishContext::default())
        .await
        .unwrap();
    // Slots at 0, 100, 200 and 300 ms fit in 350 ms; the others would wait longer.
    let sent = outcomes.iter().filter(|o| o.is_published()).count();
    assert_eq!(sent, 4);
    assert_eq!(server.count(), 4);
    for outcome in outcomes.iter().filter(|o| !o.is_published()) {
        let Outcome::Failed(f) = outcome else {
            unreachable!()
        };
        assert_eq!((f.class, f.retryable), (FailureClass::RateLimited, true));
        assert!(f.message.starts_with("not sent"), "{f}");
        assert!(f.retry_after.unwrap() > Duration::from_millis(350), "{f:?}");
    }
}
