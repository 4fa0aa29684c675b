//! The core layers around test sinks: what each lets through, what it holds back (as a
//! deferred, retryable failure), and what it tells the inner sink.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use chrono::Utc;
use outbox_engine::layers::{CircuitConfig, CircuitState, RateLimit, SinkExt};
use outbox_engine::testkit::RecordingSink;
use outbox_engine::{
    Failure, FailureClass, Message, Outcome, Outcomes, PublishContext, ReportingSink, Sink,
};

fn batch(n: usize) -> Vec<Message> {
    outbox_engine::testkit::numbered("r", "e", n)
        .into_iter()
        .map(|m| m.into_message(Utc::now()))
        .collect()
}

/// Publishes `n` messages through `sink` with the default deadline.
async fn publish(sink: &impl Sink, n: usize) -> Vec<Outcome> {
    outbox_engine::testkit::publish(sink, &batch(n)).await
}

fn deferred(outcome: &Outcome) -> bool {
    matches!(outcome, Outcome::Failed(f) if f.retryable && f.deferred)
}

/// Answers every message with `outcome`, one at a time, checking `stopped()` before each
/// like a sink that sends messages one by one; counts what it sent.
struct OneByOne {
    outcome: Outcome,
    sent: Arc<AtomicUsize>,
}

impl ReportingSink for OneByOne {
    async fn publish_each(&self, batch: &[Message], cx: &PublishContext, outcomes: &Outcomes) {
        for index in 0..batch.len() {
            if let Some(reason) = cx.stopped() {
                let failure =
                    Failure::retryable(FailureClass::Unavailable, format!("not sent: {reason}"));
                outcomes.report(index, failure.deferred().into());
                continue;
            }
            self.sent.fetch_add(1, Ordering::SeqCst);
            outcomes.report(index, self.outcome.clone());
        }
    }
}

#[tokio::test]
async fn rate_limit_sends_a_burst_then_defers_what_would_wait_too_long() {
    let inner = RecordingSink::new();
    let sink = inner.clone().rate_limited(
        RateLimit::per_second(10.0)
            .burst(3)
            .max_wait(Duration::from_millis(250)),
    );
    let started = Instant::now();
    let outcomes = publish(&sink, 8).await;
    // 3 at once, then one every 100 ms up to the 250 ms wait: 5 sent, 3 held back.
    let sent = outcomes.iter().filter(|o| o.is_published()).count();
    assert_eq!(sent, 5, "{outcomes:?}");
    assert_eq!(inner.messages().len(), 5);
    assert!(outcomes[5..].iter().all(deferred), "{outcomes:?}");
    match &outcomes[7] {
        Outcome::Failed(f) => {
            assert_eq!(f.class, FailureClass::RateLimited);
            assert!(
                f.retry_after
                    .is_some_and(|d| d > Duration::from_millis(250))
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(
        started.elapsed() >= Duration::from_millis(190),
        "the last sent waited for its slot"
    );
}

#[tokio::test]
async fn rate_limit_holds_back_what_the_deadline_cannot_wait_for() {
    let inner = RecordingSink::new();
    let sink = inner.clone().rate_limited(RateLimit::per_second(1.0));
    let cx = PublishContext::timeout(Duration::from_millis(100));
    let outcomes = sink.publish(&batch(3), &cx).await.unwrap();
    assert!(outcomes[0].is_published());
    assert!(outcomes[1..].iter().all(deferred), "{outcomes:?}");
}

#[tokio::test]
async fn circuit_opens_after_failures_stops_the_call_and_probes_after_the_cool_down() {
    let sent = Arc::new(AtomicUsize::new(0));
    let failing = OneByOne {
        outcome: Outcome::retryable(FailureClass::Unavailable, "503"),
        sent: Arc::clone(&sent),
    };
    let cool_down = Duration::from_millis(300);
    let sink = failing.circuit_breaker(CircuitConfig::default().failures(3).cool_down(cool_down));
    let outcomes = publish(&sink, 10).await;
    assert_eq!(
        sent.load(Ordering::SeqCst),
        3,
        "the third failure opened the circuit mid-call"
    );
    assert!(
        outcomes[3..].iter().all(deferred),
        "the rest were not sent: {outcomes:?}"
    );
    assert_eq!(sink.health().circuit, CircuitState::Open);

    let outcomes = publish(&sink, 4).await;
    assert_eq!(sent.load(Ordering::SeqCst), 3, "open: nothing is sent");
    assert!(outcomes.iter().all(deferred));
    // The refusal, which becomes the row's `last_error`, keeps the receiver's answer.
    match &outcomes[0] {
        Outcome::Failed(f) => assert!(
            f.message.contains("circuit breaker is open") && f.message.contains("503"),
            "{f}"
        ),
        other => panic!("{other:?}"),
    }

    tokio::time::sleep(cool_down + Duration::from_millis(50)).await;
    let outcomes = publish(&sink, 4).await;
    assert_eq!(sent.load(Ordering::SeqCst), 4, "half-open: one probe");
    assert!(outcomes[1..].iter().all(deferred));
    assert_eq!(
        sink.health().circuit,
        CircuitState::Open,
        "a failed probe opens it again"
    );
}

#[tokio::test]
async fn a_retry_after_pauses_the_route_and_a_success_closes_the_circuit() {
    let sent = Arc::new(AtomicUsize::new(0));
    let throttled = OneByOne {
        outcome: Failure::retryable(FailureClass::RateLimited, "429")
            .with_retry_after(Duration::from_millis(300))
            .into(),
        sent: Arc::clone(&sent),
    };
    let sink = throttled.circuit_breaker(CircuitConfig::default());
    let outcomes = publish(&sink, 5).await;
    assert_eq!(
        sent.load(Ordering::SeqCst),
        1,
        "one 429 stops the rest of the call"
    );
    assert!(outcomes[1..].iter().all(deferred));
    let health = sink.health();
    assert!(
        health
            .paused_for
            .is_some_and(|p| p <= Duration::from_millis(300))
    );

    // A 503 without Retry-After (overloaded) pauses the route too, for a second, even
    // in the pause-only layer every route from configuration gets.
    let sent = Arc::new(AtomicUsize::new(0));
    let unavailable = OneByOne {
        outcome: Failure::retryable(FailureClass::Unavailable, "503")
            .overloaded()
            .into(),
        sent: Arc::clone(&sent),
    };
    let sink = outbox_engine::layers::CircuitBreaker::pause_only(unavailable);
    let outcomes = publish(&sink, 5).await;
    assert_eq!(sent.load(Ordering::SeqCst), 1, "one 503 stops the rest");
    assert!(outcomes[1..].iter().all(deferred));
    assert!(
        sink.health()
            .paused_for
            .is_some_and(|p| p > Duration::ZERO && p <= Duration::from_secs(1))
    );

    let healthy = RecordingSink::new().circuit_breaker(CircuitConfig::default().failures(1));
    assert!(publish(&healthy, 2).await.iter().all(Outcome::is_published));
    assert_eq!(healthy.health().circuit, CircuitState::Closed);
}

#[tokio::test]
async fn concurrency_limit_defers_a_call_that_finds_no_slot_before_its_deadline() {
    struct Slow(RecordingSink);
    impl Sink for Slow {
        async fn publish(
            &self,
            batch: &[Message],
            cx: &PublishContext,
        ) -> Result<Vec<Outcome>, Failure> {
            tokio::time::sleep(Duration::from_millis(400)).await;
            self.0.publish(batch, cx).await
        }
    }
    let sink = Arc::new(Slow(RecordingSink::new()).concurrency_limit(1));
    let first = tokio::spawn({
        let sink = Arc::clone(&sink);
        async move { sink.publish(&batch(1), &PublishContext::default()).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let second = sink
        .publish(
            &batch(2),
            &PublishContext::timeout(Duration::from_millis(100)),
        )
        .await
        .unwrap();
    assert!(
        second.iter().all(deferred),
        "no slot within 100 ms: {second:?}"
    );
    assert!(first.await.unwrap().unwrap()[0].is_published());
}

#[tokio::test]
async fn timeout_narrows_the_deadline_and_fails_what_is_unanswered() {
    struct Never(Arc<std::sync::Mutex<Option<Duration>>>);
    impl Sink for Never {
        async fn publish(
            &self,
            _: &[Message],
            cx: &PublishContext,
        ) -> Result<Vec<Outcome>, Failure> {
            *self.0.lock().unwrap() = Some(cx.remaining());
            std::future::pending().await
        }
    }
    let seen = Arc::default();
    let sink = Never(Arc::clone(&seen)).timeout(Duration::from_millis(200));
    let outcomes = publish(&sink, 2).await;
    assert!(
        seen.lock()
            .unwrap()
            .is_some_and(|d| d <= Duration::from_millis(200))
    );
    for outcome in &outcomes {
        match outcome {
            Outcome::Failed(f) => {
                assert!(f.retryable && !f.deferred && f.class == FailureClass::Timeout)
            }
            other => panic!("{other:?}"),
        }
    }
}
