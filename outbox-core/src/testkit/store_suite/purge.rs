//! Purge: old finished rows leave, bounded per call; unfinished rows stay.

use std::time::Duration;

use super::{StoreHarness, counts, enqueue_n, expect, request};
use crate::registry::PublishedRows;
use crate::store::{Completion, Purge, PurgeRequest, Store, purge_all};

/// Purge deletes only old finished rows, at most a batch per call (with
/// [`PublishedRows::Rotate`], whole slots: see [`purge_retires_slots_and_keeps_unfinished`]).
pub async fn purge_is_bounded_and_keeps_unfinished<H: StoreHarness>(h: &H) {
    if h.store().capabilities().published_rows == PublishedRows::Rotate {
        return purge_retires_slots_and_keeps_unfinished(h).await;
    }
    finish_five_kill_one(h).await;
    let store = h.store();
    let hour = Duration::from_secs(3600);
    assert_eq!(
        store
            .purge(&PurgeRequest::published_older_than(hour))
            .await
            .expect("purge"),
        0,
        "too young"
    );
    h.advance(2 * hour).await;
    // A store that deletes published rows has none left to purge.
    let published = expect(h, (0, 0, 5, 0)).2;
    let request = PurgeRequest::published_older_than(hour).batch_size(2);
    assert_eq!(
        store.purge(&request).await.expect("purge"),
        published.min(2),
        "one bounded batch"
    );
    assert_eq!(
        purge_all(store, &request).await.expect("purge"),
        published.saturating_sub(2)
    );
    assert_eq!(
        counts(h, "orders").await,
        (1, 1, 0, 1),
        "dead, lapsed lease and pending kept"
    );
    let with_dead = request.dead_older_than(hour);
    assert_eq!(purge_all(store, &with_dead).await.expect("purge"), 1);
    assert_eq!(counts(h, "orders").await, (1, 1, 0, 0));
}

/// Of eight `orders` rows: five published, one dead, one left leased, one pending.
async fn finish_five_kill_one<H: StoreHarness>(h: &H) {
    let ids = enqueue_n(h, "orders", 8).await;
    let store = h.store();
    let claim = store.claim(&request(7)).await.expect("claim");
    let mut done: Vec<_> = ids[..5]
        .iter()
        .map(|id| Completion::published(*id))
        .collect();
    done.push(Completion::dead(ids[5], "bad"));
    store
        .complete(claim.lease.token, &done)
        .await
        .expect("complete"); // ids[6] stays leased
}

/// With [`PublishedRows::Rotate`] purge empties the oldest of three slots once the current
/// one is half the age old and the oldest holds nothing published more recently than the
/// age; the slot's pending, leased and dead rows move on first. So rows written now leave
/// at the third rotation, and every other row stays.
pub async fn purge_retires_slots_and_keeps_unfinished<H: StoreHarness>(h: &H) {
    finish_five_kill_one(h).await;
    let store = h.store();
    let hour = Duration::from_secs(3600);
    let request = PurgeRequest::published_older_than(hour);
    assert_eq!(store.purge(&request).await.expect("purge"), 0, "too young");
    let mut purged = Vec::new();
    for _ in 0..3 {
        h.advance(2 * hour).await;
        purged.push(store.purge(&request).await.expect("purge"));
    }
    assert_eq!(purged, [0, 0, 5], "two empty slots, then the rows' slot");
    assert_eq!(
        counts(h, "orders").await,
        (1, 1, 0, 1),
        "dead, lapsed lease and pending moved on"
    );
    let with_dead = request.dead_older_than(hour);
    let mut purged = 0;
    for _ in 0..3 {
        h.advance(2 * hour).await;
        purged += store.purge(&with_dead).await.expect("purge");
    }
    assert_eq!(purged, 1, "the old dead letter left with its slot");
    assert_eq!(counts(h, "orders").await, (1, 1, 0, 0));
}
