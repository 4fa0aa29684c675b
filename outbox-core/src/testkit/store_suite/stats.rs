//! Stats and gauges: what the table holds, per state and destination.

use std::time::Duration;

use super::{LEASE, StoreHarness, counts, enqueue_n, expect, request};
use crate::store::{Completion, Store, StoreStats};

/// Stats count rows per state and destination and report the oldest unfinished row.
pub async fn stats_count_each_state<H: StoreHarness>(h: &H) {
    let a = enqueue_n(h, "a", 5).await;
    h.advance(Duration::from_secs(10)).await;
    enqueue_n(h, "b", 1).await;
    let store = h.store();
    let claim = store
        .claim(&request(4).destinations(vec!["a".into()]))
        .await
        .expect("claim");
    store
        .complete(
            claim.lease.token,
            &[
                Completion::published(a[0]),
                Completion::dead(a[1], "bad"),
                Completion::retry(a[2], LEASE, "e"),
            ],
        )
        .await
        .expect("complete");
    assert_eq!(
        counts(h, "a").await,
        expect(h, (2, 1, 1, 1)),
        "pending, leased, published, dead"
    );
    let stats = store.stats().await.expect("stats");
    let sa = stats.destination("a").expect("a");
    let sb = stats.destination("b").expect("b");
    assert_eq!(sa.backlog(), 3);
    assert_eq!((sb.pending, sb.leased, sb.published, sb.dead), (1, 0, 0, 0));
    let (oa, ob) = (
        sa.oldest_pending_created_at.expect("a"),
        sb.oldest_pending_created_at.expect("b"),
    );
    assert!(oa < ob, "a's rows are older than b's");
    assert_eq!(stats.total().backlog(), 4);
    assert_eq!(stats.total().oldest_pending_created_at, Some(oa));
}

/// The gauges count what the table holds per destination — pending, leased, dead, the
/// oldest unfinished row's age — leave out destinations with only published rows, and
/// say so when a count stopped at the limit.
pub async fn gauges_match_the_table<H: StoreHarness>(h: &H) {
    let a = enqueue_n(h, "a", 5).await;
    let c = enqueue_n(h, "c", 1).await;
    let d = enqueue_n(h, "d", 1).await;
    h.advance(Duration::from_secs(600)).await;
    enqueue_n(h, "b", 2).await;
    let store = h.store();
    let claim = store
        .claim(&request(10).destinations(vec!["a".into(), "c".into(), "d".into()]))
        .await
        .expect("claim");
    assert_eq!(claim.messages.len(), 7, "claimed a, c and d");
    store
        .complete(
            claim.lease.token,
            &[
                Completion::published(a[0]),
                Completion::dead(a[1], "bad"),
                Completion::retry(a[2], LEASE, "e"),
                Completion::retry(a[3], LEASE, "e"),
                Completion::dead(c[0], "bad"),
                Completion::published(d[0]),
            ],
        )
        .await
        .expect("complete"); // a[4] stays leased
    let gauges = store
        .gauges(1000)
        .await
        .expect("gauges")
        .expect("the store declares gauges");
    assert!(!gauges.truncated, "nothing reached the limit: {gauges:?}");
    let figures = |name: &str| {
        gauges
            .destination(name)
            .map(|g| (g.pending, g.leased, g.dead))
    };
    assert_eq!(figures("a"), Some((2, 1, 1)), "a: pending, leased, dead");
    assert_eq!(figures("b"), Some((2, 0, 0)), "b: pending, leased, dead");
    assert_eq!(figures("c"), Some((0, 0, 1)), "c: pending, leased, dead");
    assert_eq!(figures("d"), None, "d has only a published row");
    let stats = store.stats().await.expect("stats");
    for g in &gauges.destinations {
        let s = stats.destination(&g.destination).expect("in the stats");
        assert_eq!(
            (g.pending, g.leased, g.dead),
            (s.pending, s.leased, s.dead),
            "gauges and stats of {} agree",
            g.destination
        );
    }
    let age = |name: &str| gauges.destination(name).and_then(|g| g.oldest_pending_age);
    let (age_a, age_b) = (age("a").expect("a's age"), age("b").expect("b's age"));
    assert!(
        (Duration::from_secs(600)..Duration::from_secs(3600)).contains(&age_a),
        "a's oldest row was enqueued 10 minutes ago, the gauge says {age_a:?}"
    );
    assert!(
        age_b < Duration::from_secs(600),
        "b's rows are new: {age_b:?}"
    );
    assert_eq!(age("c"), None, "c has no unfinished row");

    let bounded = store.gauges(2).await.expect("gauges").expect("gauges");
    assert!(bounded.truncated, "5 unfinished rows, limit 2: {bounded:?}");
    let read: u64 = bounded.destinations.iter().map(|g| g.backlog()).sum();
    assert!(read <= 2, "at most the limit is counted: {bounded:?}");
}
