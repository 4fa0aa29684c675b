//! The operator's look-ups: messages by id or key, and the rows still waiting.

use std::time::Duration;

use super::{StoreHarness, deletes, message, request};
use crate::message::NewMessage;
use crate::state::Status;
use crate::store::{Completion, DeadLetterFilter, FindMessages, Store};

/// An operator finds messages by id or by idempotency key, whatever their state, with
/// their failure and finish times.
pub async fn find_messages_by_id_or_key<H: StoreHarness>(h: &H) {
    let key = "invoice-7:'paid'";
    let keyed = |n: i32| {
        NewMessage::builder("billing", "invoice.paid")
            .json(&n)
            .idempotency_key(key)
            .build()
            .expect("valid")
    };
    // The same transition enqueued twice shares its deterministic key.
    let (first, twin, other) = (keyed(1), keyed(2), message("billing", 3));
    let ids = [first.id(), twin.id(), other.id()];
    h.enqueue(vec![first, twin, other]).await.expect("enqueue");
    let store = h.store();
    let claim = store.claim(&request(10)).await.expect("claim");
    let done = [
        Completion::published(ids[0]),
        Completion::dead(ids[1], "410 gone"),
    ];
    store
        .complete(claim.lease.token, &done)
        .await
        .expect("complete");

    let by_key = store.find_messages(key, 10).await.expect("find by key");
    let expected: Vec<_> = if deletes(h) {
        vec![(ids[1], Status::Dead)]
    } else {
        vec![(ids[0], Status::Published), (ids[1], Status::Dead)]
    };
    assert_eq!(
        by_key
            .iter()
            .map(|f| (f.message.id, f.status))
            .collect::<Vec<_>>(),
        expected,
        "both messages of the key, in id order"
    );
    let dead = by_key.last().expect("the dead twin");
    assert_eq!(dead.last_error.as_deref(), Some("410 gone"));
    assert!(dead.dead_at.is_some() && dead.published_at.is_none());
    if let [published, _] = by_key.as_slice() {
        assert!(published.published_at.is_some() && published.dead_at.is_none());
        assert_eq!(published.message.payload, b"1");
    }

    let by_id = store
        .find_messages(&ids[2].to_string(), 10)
        .await
        .expect("find by id");
    assert_eq!(by_id.len(), 1);
    assert_eq!(
        (by_id[0].message.id, by_id[0].status),
        (ids[2], Status::Leased)
    );
    assert_eq!(
        store.find_messages(key, 1).await.expect("find").len(),
        1,
        "limit applies"
    );
    for absent in ["no-such-key", "", "00000000-0000-7000-8000-000000000000"] {
        assert!(
            store
                .find_messages(absent, 10)
                .await
                .expect("find")
                .is_empty(),
            "{absent:?} finds nothing"
        );
    }
}

/// An operator lists the rows still waiting (pending, retrying, leased) with the dead-letter
/// filter: each with its status, attempts, last error and next attempt; finished rows are
/// not listed.
pub async fn waiting_rows_are_listed_with_their_error_and_next_attempt<H: StoreHarness>(h: &H) {
    let ids: Vec<_> = (0..4)
        .map(|n| message(if n == 3 { "sms" } else { "billing" }, n))
        .collect();
    let id = |n: usize| ids[n].id();
    h.enqueue(ids.clone()).await.expect("enqueue");
    let store = h.store();
    let claim = store.claim(&request(10)).await.expect("claim");
    let done = [
        Completion::published(id(0)),
        Completion::retry(id(1), Duration::from_secs(60), "503 busy: try later"),
    ];
    store
        .complete(claim.lease.token, &done)
        .await
        .expect("complete");
    store
        .release(claim.lease.token, &[id(3)])
        .await
        .expect("release");

    let all = store
        .list_waiting(&DeadLetterFilter::all(), 10)
        .await
        .expect("list");
    assert_eq!(
        all.iter()
            .map(|f| (f.message.id, f.status))
            .collect::<Vec<_>>(),
        [
            (id(1), Status::Pending),
            (id(2), Status::Leased),
            (id(3), Status::Pending)
        ],
        "the unfinished rows, in id order"
    );
    let retrying = &all[0];
    assert_eq!(retrying.last_error.as_deref(), Some("503 busy: try later"));
    assert_eq!(retrying.message.attempts, 1);
    let next = retrying.next_attempt.expect("a retry has its next attempt");
    let leased_until = all[1].next_attempt.expect("a lease has its end");
    assert!(
        next > leased_until,
        "the retry (in 60 s) is due after the lease (30 s) ends: {next}, {leased_until}"
    );

    let by_error = DeadLetterFilter::all().error_contains("503");
    let found = store.list_waiting(&by_error, 10).await.expect("list");
    assert_eq!(
        found.iter().map(|f| f.message.id).collect::<Vec<_>>(),
        [id(1)]
    );
    let sms = DeadLetterFilter::all().destination("sms");
    let found = store.list_waiting(&sms, 10).await.expect("list");
    assert_eq!(
        found.iter().map(|f| f.message.id).collect::<Vec<_>>(),
        [id(3)]
    );
    let page = DeadLetterFilter::all().after_id(id(1));
    let found = store.list_waiting(&page, 1).await.expect("list");
    assert_eq!(
        found.iter().map(|f| f.message.id).collect::<Vec<_>>(),
        [id(2)],
        "after an id, limited"
    );
}
