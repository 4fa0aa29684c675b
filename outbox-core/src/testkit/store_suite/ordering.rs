//! Per-key ordering: only a key's head is claimable, per destination, and what a
//! failing or dead head holds back.

use std::time::Duration;

use super::{StoreHarness, message, request};
use crate::message::{MessageId, NewMessage};
use crate::store::{
    ClaimRequest, Completion, DeadHead, DeadLetterFilter, DeadLetters, MessageOrder, Store,
    StoreStats,
};

fn keyed(key: &str, n: usize) -> NewMessage {
    NewMessage::builder("ordered", "suite.keyed")
        .json(&serde_json::json!({ "key": key, "n": n }))
        .partition_key(key)
        .build()
        .expect("valid message")
}

fn per_key(batch: usize, policy: DeadHead) -> ClaimRequest {
    request(batch).ordering(MessageOrder::PerKey(policy))
}

async fn claim_ids<H: StoreHarness>(
    h: &H,
    request: &ClaimRequest,
) -> (crate::LeaseToken, Vec<MessageId>) {
    let claim = h.store().claim(request).await.expect("claim");
    (
        claim.lease.token,
        claim.messages.iter().map(|m| m.id).collect(),
    )
}

fn sorted(mut ids: Vec<MessageId>) -> Vec<MessageId> {
    ids.sort();
    ids
}

/// Per key, only the oldest unfinished message is claimable; keys and unkeyed messages
/// proceed in parallel.
pub async fn per_key_claims_only_heads<H: StoreHarness>(h: &H) {
    let a: Vec<_> = (0..3).map(|n| keyed("a", n)).collect();
    let b: Vec<_> = (0..2).map(|n| keyed("b", n)).collect();
    let free = message("ordered", 9);
    let ids = |v: &[NewMessage]| v.iter().map(NewMessage::id).collect::<Vec<_>>();
    let (a_ids, b_ids) = (ids(&a), ids(&b));
    h.enqueue(a.into_iter().chain(b).chain([free.clone()]).collect())
        .await
        .expect("enqueue");
    let policy = per_key(100, DeadHead::Skip);
    let (token, got) = claim_ids(h, &policy).await;
    assert_eq!(
        sorted(got),
        sorted(vec![a_ids[0], b_ids[0], free.id()]),
        "heads and unkeyed only"
    );
    assert!(
        claim_ids(h, &policy).await.1.is_empty(),
        "later messages wait for their head"
    );
    let done = [Completion::published(a_ids[0])];
    assert_eq!(
        h.store()
            .complete(token, &done)
            .await
            .expect("complete")
            .applied,
        1
    );
    assert_eq!(
        claim_ids(h, &policy).await.1,
        vec![a_ids[1]],
        "the next of key a, nothing else"
    );
}

/// A head that failed and waits for its backoff holds back its own key only.
pub async fn a_failing_head_holds_back_only_its_key<H: StoreHarness>(h: &H) {
    let a: Vec<_> = (0..2).map(|n| keyed("a", n)).collect();
    let b: Vec<_> = (0..2).map(|n| keyed("b", n)).collect();
    let (a_ids, b_ids): (Vec<_>, Vec<_>) = (
        a.iter().map(NewMessage::id).collect(),
        b.iter().map(NewMessage::id).collect(),
    );
    h.enqueue(a.into_iter().chain(b).collect())
        .await
        .expect("enqueue");
    let policy = per_key(100, DeadHead::Skip);
    let (token, got) = claim_ids(h, &policy).await;
    assert_eq!(sorted(got), sorted(vec![a_ids[0], b_ids[0]]));
    let outcome = [
        Completion::retry(a_ids[0], Duration::from_secs(60), "503"),
        Completion::published(b_ids[0]),
    ];
    h.store().complete(token, &outcome).await.expect("complete");
    let (token, got) = claim_ids(h, &policy).await;
    assert_eq!(got, vec![b_ids[1]], "key b flows while a's head backs off");
    h.store()
        .complete(token, &[Completion::published(b_ids[1])])
        .await
        .expect("complete");
    h.advance(Duration::from_secs(61)).await;
    assert_eq!(
        claim_ids(h, &policy).await.1,
        vec![a_ids[0]],
        "a's head again, never a's second"
    );
}

/// Under [`DeadHead::Skip`] a dead head lets its key go on; under [`DeadHead::Halt`] the key
/// waits until the dead letter is replayed or discarded, and stats show it halted.
pub async fn dead_heads_skip_or_halt<H: StoreHarness>(h: &H) {
    let s: Vec<_> = (0..2).map(|n| keyed("s", n)).collect();
    let k: Vec<_> = (0..2).map(|n| keyed("k", n)).collect();
    let (s_ids, k_ids): (Vec<_>, Vec<_>) = (
        s.iter().map(NewMessage::id).collect(),
        k.iter().map(NewMessage::id).collect(),
    );
    h.enqueue(s.into_iter().chain(k).collect())
        .await
        .expect("enqueue");
    let (token, got) = claim_ids(h, &per_key(100, DeadHead::Skip)).await;
    assert_eq!(sorted(got), sorted(vec![s_ids[0], k_ids[0]]));
    let deaths = [
        Completion::dead(s_ids[0], "400"),
        Completion::dead(k_ids[0], "400"),
    ];
    h.store().complete(token, &deaths).await.expect("complete");

    let halt = per_key(100, DeadHead::Halt);
    assert!(
        claim_ids(h, &halt).await.1.is_empty(),
        "halt: dead heads hold their keys"
    );
    let stats = h.store().stats().await.expect("stats");
    assert_eq!(
        stats.destination("ordered").expect("stats").halted_keys,
        2,
        "halted keys are visible"
    );

    assert_eq!(
        h.store()
            .replay_dead(&DeadLetterFilter::all().ids([k_ids[0]]))
            .await
            .expect("replay"),
        1
    );
    let (token, got) = claim_ids(h, &halt).await;
    assert_eq!(got, vec![k_ids[0]], "a replayed head is the head again");
    h.store()
        .complete(token, &[Completion::published(k_ids[0])])
        .await
        .expect("complete");
    assert_eq!(
        h.store()
            .discard_dead(&DeadLetterFilter::all().ids([s_ids[0]]))
            .await
            .expect("discard"),
        1
    );
    let (_, got) = claim_ids(h, &halt).await;
    assert_eq!(
        sorted(got),
        sorted(vec![s_ids[1], k_ids[1]]),
        "both keys go on once resolved"
    );
    assert_eq!(
        h.store()
            .stats()
            .await
            .expect("stats")
            .destination("ordered")
            .expect("stats")
            .halted_keys,
        0
    );
}

/// Order follows commit order even when ids were assigned in the other order.
pub async fn order_is_commit_order_not_id_order<H: StoreHarness>(h: &H) {
    let first_built = keyed("k", 1);
    let second_built = keyed("k", 2);
    assert!(first_built.id() < second_built.id());
    // The message built (and id'd) later commits first.
    h.enqueue(vec![second_built.clone()])
        .await
        .expect("enqueue");
    h.enqueue(vec![first_built.clone()]).await.expect("enqueue");
    let policy = per_key(100, DeadHead::Skip);
    let (token, got) = claim_ids(h, &policy).await;
    assert_eq!(got, vec![second_built.id()], "the first commit is the head");
    h.store()
        .complete(token, &[Completion::published(second_built.id())])
        .await
        .expect("complete");
    assert_eq!(claim_ids(h, &policy).await.1, vec![first_built.id()]);
}

/// Without ordering, keyed messages are claimed together.
pub async fn unordered_claims_ignore_keys<H: StoreHarness>(h: &H) {
    let a: Vec<_> = (0..3).map(|n| keyed("a", n)).collect();
    let ids: Vec<_> = a.iter().map(NewMessage::id).collect();
    h.enqueue(a).await.expect("enqueue");
    assert_eq!(sorted(claim_ids(h, &request(100)).await.1), sorted(ids));
}

/// A head is claimed however many held-back rows come before it: when the earliest due
/// rows all wait behind a head that is leased or dead, the heads and unkeyed rows after
/// them are still found, on every destination.
pub async fn heads_behind_a_held_back_backlog<H: StoreHarness>(h: &H) {
    let hot: Vec<_> = (0..40).map(|n| keyed("hot", n)).collect();
    let hot_ids: Vec<_> = hot.iter().map(NewMessage::id).collect();
    h.enqueue(hot).await.expect("enqueue");
    let halt = per_key(3, DeadHead::Halt);
    let (hot_token, got) = claim_ids(h, &halt).await;
    assert_eq!(got, vec![hot_ids[0]], "only the head of a single key");

    let on_other = |n: usize| {
        NewMessage::builder("other", "suite.keyed")
            .json(&serde_json::json!({ "n": n }))
            .partition_key("hot")
            .build()
            .expect("valid message")
    };
    let later = vec![
        keyed("cold", 0),
        keyed("cold", 1),
        message("ordered", 7),
        on_other(0),
        on_other(1),
    ];
    let later_ids: Vec<_> = later.iter().map(NewMessage::id).collect();
    h.enqueue(later).await.expect("enqueue");
    let only_ordered = per_key(3, DeadHead::Halt).destinations(vec!["ordered".into()]);
    let (ordered_token, got) = claim_ids(h, &only_ordered).await;
    assert_eq!(
        sorted(got),
        sorted(vec![later_ids[0], later_ids[2]]),
        "the head and the unkeyed row of the destination asked for, behind 39 rows that \
         wait for a leased head"
    );
    let (other_token, got) = claim_ids(h, &halt).await;
    assert_eq!(
        got,
        vec![later_ids[3]],
        "the other destination's head of the busy key"
    );
    let done = [later_ids[0], later_ids[2]].map(Completion::published);
    h.store()
        .complete(ordered_token, &done)
        .await
        .expect("complete");
    h.store()
        .complete(other_token, &[Completion::published(later_ids[3])])
        .await
        .expect("complete");
    h.store()
        .complete(hot_token, &[Completion::dead(hot_ids[0], "400")])
        .await
        .expect("complete");

    let (token, got) = claim_ids(h, &halt).await;
    assert_eq!(
        sorted(got),
        sorted(vec![later_ids[1], later_ids[4]]),
        "halt: the dead head holds back its key and destination, nothing else"
    );
    let done = [later_ids[1], later_ids[4]].map(Completion::published);
    h.store().complete(token, &done).await.expect("complete");
    let skip = per_key(3, DeadHead::Skip).destinations(vec!["ordered".into()]);
    assert_eq!(
        claim_ids(h, &skip).await.1,
        vec![hot_ids[1]],
        "skip: the key goes on past its dead head"
    );
}

/// A key's order is owed per destination: the same key on another destination is another
/// sequence, so a row of a destination nobody serves, or a dead one, holds back only its
/// own destination's rows of that key.
pub async fn keys_are_scoped_per_destination<H: StoreHarness>(h: &H) {
    let on = |destination: &str, n: usize| {
        NewMessage::builder(destination, "suite.keyed")
            .json(&serde_json::json!({ "n": n }))
            .partition_key("shared-key")
            .build()
            .expect("valid message")
    };
    let (a1, b1, a2, b2) = (on("a", 1), on("b", 1), on("a", 2), on("b", 2));
    h.enqueue(vec![a1.clone(), b1.clone(), a2.clone(), b2.clone()])
        .await
        .expect("enqueue");
    let only_b = per_key(100, DeadHead::Halt).destinations(vec!["b".into()]);
    let (token, got) = claim_ids(h, &only_b).await;
    assert_eq!(
        got,
        vec![b1.id()],
        "b's head is claimable while a's older row of the same key waits"
    );
    h.store()
        .complete(token, &[Completion::published(b1.id())])
        .await
        .expect("complete");
    let everything = per_key(100, DeadHead::Halt);
    let (token, got) = claim_ids(h, &everything).await;
    assert_eq!(
        sorted(got),
        sorted(vec![a1.id(), b2.id()]),
        "one head per destination"
    );
    let done = [
        Completion::dead(a1.id(), "400"),
        Completion::published(b2.id()),
    ];
    h.store().complete(token, &done).await.expect("complete");
    let stats = h.store().stats().await.expect("stats");
    let halted = |d: &str| stats.destination(d).map_or(0, |d| d.halted_keys);
    assert_eq!(
        (halted("a"), halted("b")),
        (1, 0),
        "a's dead head halts a's key only"
    );
    assert!(
        claim_ids(h, &everything).await.1.is_empty(),
        "halt: a2 waits behind the dead a1"
    );
}
