//! Real relays over the store: routes that share a table, giving up by attempts and by
//! age, and a database that falls silent.

use std::collections::HashSet;
use std::future::Future;
use std::time::Duration;

use super::{StoreHarness, counts, enqueue_n, expect};
use crate::clock::ManualClock;
use crate::message::MessageId;
use crate::relay::Relay;
use crate::retry::RetryPolicy;
use crate::state::Status;
use crate::store::{DeadLetterFilter, DeadLetters, FindMessages, Store};
use crate::testkit::{FlakySink, RecordingSink};

/// Pending plus leased rows for `destination`: what is left to publish.
async fn unfinished<H: StoreHarness>(h: &H, destination: &str) -> u64 {
    let (pending, leased, _, _) = counts(h, destination).await;
    pending + leased
}

/// Two relays that route different destinations, draining one table at the same time,
/// each publish exactly their own messages and dead-letter none of the other's. (A
/// claim may come back short while the other relay's scan holds row locks, as with
/// `SKIP LOCKED` on MySQL; the relays drain again, as their poll loop would.)
pub async fn relays_with_disjoint_routes_share_the_table<H: StoreHarness>(h: &H) {
    let sms = enqueue_n(h, "sms", 30).await;
    let email = enqueue_n(h, "email", 30).await;
    let relay = |destination: &str, sink: &RecordingSink| {
        Relay::builder(h.store().clone())
            .route(destination, sink.clone())
            .batch_size(7)
            .build()
            .expect("relay")
    };
    let (to_sms, to_email) = (RecordingSink::new(), RecordingSink::new());
    let (a, b) = (relay("sms", &to_sms), relay("email", &to_email));
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut dead = 0;
    while unfinished(h, "sms").await > 0 || unfinished(h, "email").await > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "both relays finished within 30 s"
        );
        let (a, b) = tokio::join!(a.drain(), b.drain());
        dead += a.expect("drain").dead + b.expect("drain").dead;
    }
    assert_eq!(dead, 0, "no relay dead-lettered the other's messages");
    let ids = |sink: &RecordingSink| -> HashSet<MessageId> {
        sink.messages().iter().map(|m| m.id).collect()
    };
    assert_eq!(ids(&to_sms), sms.into_iter().collect());
    assert_eq!(ids(&to_email), email.into_iter().collect());
    assert_eq!(counts(h, "sms").await, expect(h, (0, 0, 30, 0)));
    assert_eq!(counts(h, "email").await, expect(h, (0, 0, 30, 0)));
}

/// A message that keeps failing is dead-lettered after the policy's attempts, by a relay.
pub async fn max_attempts_dead_letters<H: StoreHarness>(h: &H) {
    let ids = enqueue_n(h, "orders", 2).await;
    let always_failing = FlakySink::new(RecordingSink::new()).retryable_rate(1.0);
    let relay = Relay::builder(h.store().clone())
        .route("orders", always_failing)
        .retry(
            RetryPolicy::exponential(Duration::from_secs(1), Duration::from_secs(1))
                .max_attempts(3),
        )
        .build()
        .expect("relay");
    for attempt in 1..=3 {
        let report = relay.run_once().await.expect("batch");
        assert_eq!(report.claimed, 2, "attempt {attempt} claims both rows");
        h.advance(Duration::from_secs(2)).await;
    }
    assert_eq!(counts(h, "orders").await, (0, 0, 0, 2));
    let dead = h
        .store()
        .list_dead(&DeadLetterFilter::all().ids(ids), 10)
        .await
        .expect("list");
    assert_eq!(dead.len(), 2);
    assert!(
        dead.iter().all(|d| d.reason.contains("3 attempts")),
        "reason names the attempts: {dead:?}"
    );
}

/// A claim tells the relay how long each message waited, by the store's clock: a relay
/// whose wall clock runs two hours ahead must not take a fresh message for one past a
/// one-hour `max_age` and dead-letter it at its first failure.
pub async fn max_age_follows_the_stores_clock<H: StoreHarness>(h: &H) {
    let ids = enqueue_n(h, "orders", 1).await;
    let ahead = ManualClock::starting_at(chrono::Utc::now() + chrono::Duration::hours(2));
    let relay = Relay::builder(h.store().clone())
        .route(
            "orders",
            FlakySink::new(RecordingSink::new()).retryable_rate(1.0),
        )
        .clock(ahead)
        .retry(RetryPolicy::default().max_age(Some(Duration::from_secs(3600))))
        .build()
        .expect("relay");
    let report = relay.run_once().await.expect("batch");
    assert_eq!(
        (report.retried, report.dead),
        (1, 0),
        "the failed first attempt of a fresh message is retried, whatever the relay's clock says"
    );
    let found = h
        .store()
        .find_messages(&ids[0].to_string(), 1)
        .await
        .expect("find");
    assert_eq!(found.first().map(|m| m.status), Some(Status::Pending));
}

/// A database that falls silent (no reply, no reset: a vanished host, a hung server) in
/// the middle of a claim costs the relay one lease, not its pool.
///
/// `store` was opened with one pool connection and holds one due message for route
/// `orders`, in a table another connection holds locked, so that a claim reaches the
/// server and waits there. `silence` runs once the claim waits: it must make the
/// network silent and then release the lock, so that the answer never comes back. The
/// relay must give up on the claim within its 1 s lease with a
/// [`Timeout`](crate::StoreErrorKind::Timeout); after `heal` lets traffic through again,
/// it must publish the message within 60 s: the silent connection must not keep the
/// pool's only slot.
///
/// # Panics
///
/// When the relay waits on the claim, or never publishes the message.
pub async fn silent_database_costs_a_lease_not_the_pool<S: Store>(
    store: S,
    silence: impl Future<Output = ()>,
    heal: impl FnOnce(),
) {
    let sink = RecordingSink::new();
    let relay = Relay::builder(store)
        .route("orders", sink.clone())
        .lease(Duration::from_secs(1))
        .gauges(false)
        .build()
        .expect("relay settings");
    let silence = async {
        // The claim is on the server by then, waiting for the lock.
        tokio::time::sleep(Duration::from_millis(400)).await;
        silence.await;
    };
    let (claim, ()) = tokio::join!(
        tokio::time::timeout(Duration::from_secs(10), relay.run_once()),
        silence
    );
    let error = claim
        .expect("the relay gives up on a claim the database never answers")
        .expect_err("a claim that got no answer is an error");
    assert_eq!(error.kind(), crate::StoreErrorKind::Timeout, "{error}");
    heal();
    // Each `run_once` is bounded by the lease, so this loop ends by its deadline.
    // MySQL's server ends the claim's transaction, which the silence left holding the
    // row, after the 30 s its drivers' sessions may stay silent.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut last = None;
    while sink.messages().is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "waited 60 s for the message to be published once new connections got through; \
             the pool's only slot stayed taken (last error: {last:?})"
        );
        if let Err(error) = relay.run_once().await {
            last = Some(error.to_string());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    assert_eq!(sink.messages().len(), 1, "published once");
}
