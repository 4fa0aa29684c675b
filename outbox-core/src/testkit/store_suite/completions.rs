//! Completions: fenced by the lease token, batched, and what each kind does to a row.

use std::collections::HashSet;
use std::time::Duration;

use super::{LEASE, StoreHarness, claim, claims_nothing, counts, enqueue_n, expect, request};
use crate::message::MessageId;
use crate::state::LeaseToken;
use crate::store::{Claim, Completion, DeadLetterFilter, DeadLetters, Store};

/// How many of `completions` the store applied under `token`.
async fn applied<H: StoreHarness>(h: &H, token: LeaseToken, completions: &[Completion]) -> usize {
    let report = h.store().complete(token, completions).await;
    report.expect("complete").applied
}

/// Lets a 30 s backoff run: 25 s later nothing is due (`why`), 6 s more and a claim gets
/// the rows back.
async fn after_the_backoff<H: StoreHarness>(h: &H, why: &str) -> Claim {
    h.advance(Duration::from_secs(25)).await;
    claims_nothing(h, why).await;
    h.advance(Duration::from_secs(6)).await;
    claim(h, 10).await
}

/// A relay whose lease was reclaimed changes nothing, and is told which rows were stale.
pub async fn stale_token_is_fenced<H: StoreHarness>(h: &H) {
    let ids = enqueue_n(h, "orders", 3).await;
    let store = h.store();
    let old = store.claim(&request(10)).await.expect("claim");
    h.advance(LEASE + Duration::from_secs(1)).await;
    let new = store.claim(&request(10)).await.expect("claim");
    assert_eq!(new.messages.len(), 3);

    let before = counts(h, "orders").await;
    let stale_publish: Vec<_> = ids.iter().map(|id| Completion::published(*id)).collect();
    let report = store
        .complete(old.lease.token, &stale_publish)
        .await
        .expect("complete");
    assert_eq!(report.applied, 0, "a fenced completion changes no row");
    assert_eq!(
        report.stale.iter().copied().collect::<HashSet<_>>(),
        ids.iter().copied().collect()
    );
    let stale_dead: Vec<_> = ids
        .iter()
        .map(|id| Completion::dead(*id, "stale"))
        .collect();
    assert_eq!(
        store
            .complete(old.lease.token, &stale_dead)
            .await
            .expect("complete")
            .applied,
        0
    );
    assert_eq!(
        store
            .release(old.lease.token, &ids)
            .await
            .expect("release")
            .applied,
        0
    );
    assert_eq!(
        counts(h, "orders").await,
        before,
        "fenced calls left every row as it was"
    );

    let report = store
        .complete(new.lease.token, &stale_publish)
        .await
        .expect("complete");
    assert_eq!(report.applied, 3, "the current holder completes");
    assert!(report.stale.is_empty());
    let again = store
        .complete(new.lease.token, &stale_publish)
        .await
        .expect("complete");
    assert_eq!(
        (again.applied, again.stale.len()),
        (0, 3),
        "completing twice is fenced too"
    );
    assert_eq!(counts(h, "orders").await, expect(h, (0, 0, 3, 0)));
}

/// A completion of rows of which another relay reclaimed some applies to the others and
/// names each stale one; an id given twice counts once, its repeat stale.
pub async fn partly_stale_completion_is_reported_per_id<H: StoreHarness>(h: &H) {
    let ids = enqueue_n(h, "orders", 4).await;
    let store = h.store();
    let old = store.claim(&request(10)).await.expect("claim");
    assert_eq!(old.messages.len(), 4);
    h.advance(LEASE + Duration::from_secs(1)).await;
    let new = store.claim(&request(2)).await.expect("claim");
    let reclaimed: Vec<_> = new.messages.iter().map(|m| m.id).collect();
    assert_eq!(reclaimed, ids[..2], "the oldest lapsed rows are reclaimed");

    // Published and retried rows on both sides, so that a store with one statement per
    // kind of completion has stale and current rows in each.
    let retry = |id| Completion::retry(id, Duration::from_secs(60), "suite: retry");
    let completions = [
        Completion::published(ids[0]),
        retry(ids[1]),
        Completion::published(ids[2]),
        retry(ids[3]),
        Completion::published(ids[2]),
    ];
    let report = store
        .complete(old.lease.token, &completions)
        .await
        .expect("complete");
    assert_eq!(report.applied, 2, "the rows the old lease still holds");
    let mut stale = report.stale.clone();
    stale.sort();
    let mut expected = vec![ids[0], ids[1], ids[2]];
    expected.sort();
    assert_eq!(stale, expected, "each reclaimed id, and the repeat");
    assert_eq!(counts(h, "orders").await, expect(h, (1, 2, 1, 0)));
}

/// A retried row waits for its backoff.
pub async fn retry_respects_available_at<H: StoreHarness>(h: &H) {
    let ids = enqueue_n(h, "orders", 1).await;
    let first = claim(h, 10).await;
    let retry = [Completion::retry(
        ids[0],
        Duration::from_secs(30),
        "503 from receiver",
    )];
    assert_eq!(applied(h, first.lease.token, &retry).await, 1);
    assert_eq!(counts(h, "orders").await, (1, 0, 0, 0));
    let again = after_the_backoff(h, "backoff not over").await;
    assert_eq!(again.messages.len(), 1, "due after the backoff");
    assert_eq!(again.messages[0].attempts, 2);
}

/// One completion call can publish, retry and dead-letter different rows.
pub async fn completion_is_batched<H: StoreHarness>(h: &H) {
    let ids = enqueue_n(h, "orders", 4).await;
    let store = h.store();
    let claim = store.claim(&request(10)).await.expect("claim");
    let completions = [
        Completion::published(ids[0]),
        Completion::published(ids[1]),
        Completion::retry(ids[2], Duration::from_secs(60), "timeout"),
        Completion::dead(ids[3], "400 unknown template"),
    ];
    let report = store
        .complete(claim.lease.token, &completions)
        .await
        .expect("complete");
    assert_eq!(report.applied, 4);
    assert_eq!(counts(h, "orders").await, expect(h, (1, 0, 2, 1)));
    let dead = store
        .list_dead(&DeadLetterFilter::all(), 10)
        .await
        .expect("list");
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].message.id, ids[3]);
    assert_eq!(dead[0].reason, "400 unknown template");
}

/// A store that declares overlapped claims claims the next rows while the previous
/// batch's completion is written, as a relay draining full batches does: each claim gets
/// the next rows in order, each completion applies in full.
pub async fn claims_overlap_completions<H: StoreHarness>(h: &H) {
    let ids = enqueue_n(h, "orders", 12).await;
    let store = h.store();
    let three = request(3);
    let mut batch = claim(h, 3).await;
    for (n, expected) in ids.chunks(3).enumerate() {
        let claimed: Vec<_> = batch.messages.iter().map(|m| m.id).collect();
        assert_eq!(
            claimed, expected,
            "batch {n} holds the next rows, oldest first"
        );
        let completions: Vec<_> = claimed
            .iter()
            .map(|&id| Completion::published(id))
            .collect();
        let (report, next) = tokio::join!(
            store.complete(batch.lease.token, &completions),
            store.claim(&three)
        );
        assert_eq!(
            report.expect("complete").applied,
            3,
            "batch {n} completed in full"
        );
        batch = next.expect("claim");
    }
    assert!(batch.messages.is_empty(), "nothing left to claim");
    assert_eq!(counts(h, "orders").await, expect(h, (0, 0, 12, 0)));
}

/// Released rows are claimable at once and the release does not count as an attempt.
pub async fn release_does_not_count_an_attempt<H: StoreHarness>(h: &H) {
    let ids = enqueue_n(h, "orders", 2).await;
    let store = h.store();
    let claim = store.claim(&request(10)).await.expect("claim");
    let report = store
        .release(claim.lease.token, &ids)
        .await
        .expect("release");
    assert_eq!(report.applied, 2);
    let again = store.claim(&request(10)).await.expect("claim");
    assert_eq!(again.messages.len(), 2, "released rows are due now");
    assert!(
        again.messages.iter().all(|m| m.attempts == 1),
        "a release gives the attempt back"
    );
}

/// A deferred completion (the message was never sent) waits like a retry but gives the
/// attempt back.
pub async fn deferral_waits_and_gives_the_attempt_back<H: StoreHarness>(h: &H) {
    let ids = enqueue_n(h, "orders", 2).await;
    let first = claim(h, 10).await;
    let completions = [
        Completion::defer(ids[0], Duration::from_secs(30), "circuit open, not sent"),
        Completion::retry(ids[1], Duration::from_secs(30), "503"),
    ];
    assert_eq!(applied(h, first.lease.token, &completions).await, 2);
    assert_eq!(counts(h, "orders").await, (2, 0, 0, 0));
    let again = after_the_backoff(h, "a deferral waits").await;
    let attempts: Vec<(MessageId, u32)> =
        again.messages.iter().map(|m| (m.id, m.attempts)).collect();
    assert_eq!(
        attempts,
        vec![(ids[0], 1), (ids[1], 2)],
        "the deferred claim did not count"
    );
}
