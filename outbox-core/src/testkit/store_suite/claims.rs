//! Claims: which rows a claim hands out, to whom, and when.

use std::collections::HashSet;
use std::time::Duration;

use super::{LEASE, StoreHarness, claims_nothing, counts, enqueue_n, request};
use crate::message::NewMessage;
use crate::store::{ClaimRequest, Store};

/// Every field of a message survives the store byte for byte, binary payloads included.
pub async fn fields_round_trip<H: StoreHarness>(h: &H) {
    let ns = uuid::Uuid::NAMESPACE_URL;
    let original = NewMessage::builder("round.trip", "order.paid")
        .bytes(
            vec![0u8, 159, 146, 150, 255, b'\'', b'"', b'\\'],
            "application/octet-stream",
        )
        .aggregate("order", "o-1042")
        .partition_key("o-1042")
        .tenant_id("tenant-ü")
        .header(
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        )
        .header("x-quote", "it's \"quoted\"; DROP TABLE outbox; --")
        .deterministic_key(ns, &["o-1042", "paid"])
        .build()
        .expect("valid message");
    h.enqueue(vec![original.clone()]).await.expect("enqueue");
    let claim = h.store().claim(&request(10)).await.expect("claim");
    assert_eq!(claim.messages.len(), 1, "one message enqueued, one claimed");
    let m = &claim.messages[0];
    assert_eq!(m.id, original.id());
    assert_eq!(m.destination, original.destination());
    assert_eq!(m.event_type, original.event_type());
    assert_eq!(m.aggregate_type.as_deref(), original.aggregate_type());
    assert_eq!(m.aggregate_id.as_deref(), original.aggregate_id());
    assert_eq!(m.partition_key.as_deref(), original.partition_key());
    assert_eq!(m.tenant_id.as_deref(), original.tenant_id());
    assert_eq!(m.idempotency_key, original.idempotency_key());
    assert_eq!(
        m.payload,
        original.payload(),
        "payload bytes must round-trip"
    );
    assert_eq!(m.content_type, original.content_type());
    assert_eq!(&m.headers, original.headers());
    assert_eq!(m.attempts, 1, "a claim counts one attempt");
    assert_eq!(claim.lease.owner, "suite-relay");
}

/// Claims return due rows oldest first, never more than the batch size, each once.
pub async fn claims_due_rows_oldest_first<H: StoreHarness>(h: &H) {
    let ids = enqueue_n(h, "orders", 5).await;
    let store = h.store();
    let first = store.claim(&request(3)).await.expect("claim");
    let got: Vec<_> = first.messages.iter().map(|m| m.id).collect();
    assert_eq!(got, ids[..3], "first claim: three oldest rows in id order");
    let second = store.claim(&request(3)).await.expect("claim");
    let got: Vec<_> = second.messages.iter().map(|m| m.id).collect();
    assert_eq!(got, ids[3..], "second claim: the remaining rows");
    assert_ne!(
        first.lease.token, second.lease.token,
        "each claim gets its own token"
    );
    claims_nothing(h, "nothing left to claim").await;
    assert_eq!(counts(h, "orders").await, (0, 5, 0, 0));
}

/// Concurrent claimers never receive the same row.
pub async fn claim_is_exclusive_under_concurrency<H: StoreHarness>(h: &H) {
    let ids: HashSet<_> = enqueue_n(h, "orders", 300).await.into_iter().collect();
    let mut tasks = tokio::task::JoinSet::new();
    for worker in 0..8 {
        let store = h.store().clone();
        tasks.spawn(async move {
            let mut mine = Vec::new();
            loop {
                let claim = store
                    .claim(&ClaimRequest::new(format!("w{worker}"), 7, LEASE))
                    .await
                    .expect("claim");
                if claim.messages.is_empty() {
                    return mine;
                }
                mine.extend(claim.messages.into_iter().map(|m| m.id));
            }
        });
    }
    let mut seen = HashSet::new();
    let mut total = 0;
    while let Some(mine) = tasks.join_next().await {
        for id in mine.expect("claimer task") {
            total += 1;
            assert!(seen.insert(id), "row {id} was claimed twice");
        }
    }
    assert_eq!(total, 300);
    assert_eq!(seen, ids, "every row claimed exactly once");
}

/// A claim restricted to some destinations leaves the others alone.
pub async fn claim_filters_destinations<H: StoreHarness>(h: &H) {
    enqueue_n(h, "a", 3).await;
    let b = enqueue_n(h, "b", 2).await;
    let claim = h
        .store()
        .claim(&request(10).destinations(vec!["b".into(), "c".into()]))
        .await
        .expect("claim");
    let got: Vec<_> = claim.messages.iter().map(|m| m.id).collect();
    assert_eq!(got, b);
    assert_eq!(counts(h, "a").await, (3, 0, 0, 0));
}

/// A delayed message is not claimed before its time.
pub async fn scheduled_rows_wait<H: StoreHarness>(h: &H) {
    let later = NewMessage::builder("orders", "reminder")
        .json(&1)
        .delay(Duration::from_secs(60))
        .build()
        .expect("valid");
    h.enqueue(vec![later.clone()]).await.expect("enqueue");
    claims_nothing(h, "not due yet").await;
    h.advance(Duration::from_secs(61)).await;
    let claim = h.store().claim(&request(10)).await.expect("claim");
    assert_eq!(
        claim.messages.iter().map(|m| m.id).collect::<Vec<_>>(),
        vec![later.id()],
        "due now"
    );
}

/// A lease that lapsed is claimed again, with a new token and one more attempt.
pub async fn lapsed_lease_is_reclaimed<H: StoreHarness>(h: &H) {
    let ids = enqueue_n(h, "orders", 2).await;
    let store = h.store();
    let first = store.claim(&request(10)).await.expect("claim");
    assert_eq!(first.messages.len(), 2);
    h.advance(LEASE / 2).await;
    claims_nothing(h, "lease still held").await;
    h.advance(LEASE).await;
    let second = store.claim(&request(10)).await.expect("claim");
    let got: Vec<_> = second.messages.iter().map(|m| m.id).collect();
    assert_eq!(got, ids, "lapsed rows are reclaimed");
    assert!(
        second.messages.iter().all(|m| m.attempts == 2),
        "reclaim counts an attempt"
    );
    assert_ne!(first.lease.token, second.lease.token);
    assert!(second.lease.until > first.lease.until);
}
