//! The store conformance suite: every [`Store`] must pass every check here.
//!
//! Each check is a plain async function taking a fresh [`StoreHarness`]; it panics with a
//! message saying which part of the contract broke. The checks read the store's
//! [`Capabilities`](crate::Capabilities) and hold it to what it declares (with
//! [`PublishedRows::Delete`] a published row must be gone, with `Keep` it must be
//! counted), and [`run_all`] and [`run_ordering`] print one matrix line per check: the
//! store, its capabilities, and whether the check ran or why not.
//!
//! ```
//! # tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap().block_on(async {
//! use outbox_engine::testkit::{MemoryHarness, store_suite};
//!
//! store_suite::run_all(|| async { MemoryHarness::new() }).await;
//! store_suite::run_ordering(|| async { MemoryHarness::new() }).await;
//! # });
//! ```

use std::collections::HashSet;
use std::future::Future;
use std::time::Duration;

use crate::clock::ManualClock;
use crate::error::StoreError;
use crate::memory::MemoryStore;
use crate::message::{MessageId, NewMessage};
use crate::registry::PublishedRows;
use crate::relay::Relay;
use crate::retry::RetryPolicy;
use crate::state::{LeaseToken, Status};
use crate::store::{
    Claim, ClaimRequest, Completion, DeadHead, DeadLetterFilter, DeadLetters, FindMessages,
    MessageOrder, Purge, PurgeRequest, Store, StoreStats, purge_all,
};
use crate::testkit::{FlakySink, RecordingSink};

/// What the suite needs from a backend besides the [`Store`] traits: a way to enqueue
/// (each backend does that inside its own transactions), a way to make time pass for
/// the store (SQL harnesses shift the row timestamps back instead of sleeping), and what
/// the store declares it does.
pub trait StoreHarness: Send + Sync {
    /// The store under test.
    type Store: Store + StoreStats + DeadLetters + FindMessages + Purge + Clone;

    /// The store under test, over an empty outbox.
    fn store(&self) -> &Self::Store;

    /// A short name for the matrix the runners print; by default the store's own, such
    /// as `postgres`.
    fn name(&self) -> String {
        self.store().capabilities().store.to_owned()
    }

    /// Commits `messages` to the outbox in one transaction.
    fn enqueue(
        &self,
        messages: Vec<NewMessage>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Makes `by` pass on the store's clock.
    fn advance(&self, by: Duration) -> impl Future<Output = ()> + Send;
}

/// The in-memory store on a [`ManualClock`].
#[derive(Debug, Clone)]
pub struct MemoryHarness {
    store: MemoryStore,
    clock: ManualClock,
}

impl MemoryHarness {
    /// A fresh empty store that keeps published rows.
    pub fn new() -> Self {
        Self::with_mode(PublishedRows::Keep)
    }

    /// A fresh empty store that keeps or deletes published rows.
    pub fn with_mode(mode: PublishedRows) -> Self {
        let clock = ManualClock::new();
        Self {
            store: MemoryStore::with_clock(clock.clone())
                .delete_on_publish(mode == PublishedRows::Delete),
            clock,
        }
    }
}

impl Default for MemoryHarness {
    fn default() -> Self {
        Self::new()
    }
}

impl StoreHarness for MemoryHarness {
    type Store = MemoryStore;

    fn store(&self) -> &MemoryStore {
        &self.store
    }

    async fn enqueue(&self, messages: Vec<NewMessage>) -> Result<(), StoreError> {
        self.store.enqueue_all(messages).map(|_| ())
    }

    async fn advance(&self, by: Duration) {
        self.clock.advance(by);
    }
}

/// Runs every check, each on a fresh harness from `factory`, printing each name.
pub async fn run_all<H: StoreHarness>(factory: impl AsyncFn() -> H) {
    run_checks!(factory, |h: &H, name| matrix_line(h, name, None);
        fields_round_trip,
        claims_due_rows_oldest_first,
        claim_is_exclusive_under_concurrency,
        claim_filters_destinations,
        relays_with_disjoint_routes_share_the_table,
        scheduled_rows_wait,
        lapsed_lease_is_reclaimed,
        stale_token_is_fenced,
        partly_stale_completion_is_reported_per_id,
        retry_respects_available_at,
        completion_is_batched,
        release_does_not_count_an_attempt,
        deferral_waits_and_gives_the_attempt_back,
        max_attempts_dead_letters,
        max_age_follows_the_stores_clock,
        dead_letters_list_replay_discard,
        find_messages_by_id_or_key,
        waiting_rows_are_listed_with_their_error_and_next_attempt,
        stats_count_each_state,
        purge_is_bounded_and_keeps_unfinished,
    );
    let h = factory().await;
    if h.store().capabilities().overlapped_claims {
        matrix_line(&h, "claims_overlap_completions", None);
        claims_overlap_completions(&h).await;
    } else {
        matrix_line(
            &h,
            "claims_overlap_completions",
            Some("declares no overlapped claims"),
        );
    }
    let h = factory().await;
    if h.store().capabilities().gauges {
        matrix_line(&h, "gauges_match_the_table", None);
        gauges_match_the_table(&h).await;
    } else {
        matrix_line(&h, "gauges_match_the_table", Some("declares no gauges"));
    }
}

/// Whether the store declares it deletes published rows.
fn deletes<H: StoreHarness>(h: &H) -> bool {
    h.store().capabilities().published_rows == PublishedRows::Delete
}

/// Prints `store | capabilities | check | ran or why not`.
fn matrix_line<H: StoreHarness>(h: &H, check: &str, skipped: Option<&str>) {
    let outcome = skipped.map_or_else(|| "run".to_owned(), |why| format!("skipped: {why}"));
    eprintln!(
        "store suite | {} | {} | {check} | {outcome}",
        h.name(),
        h.store().capabilities()
    );
}

/// `(pending, leased, published, dead)` as the store must count them: a store that
/// deletes published rows counts none.
fn expect<H: StoreHarness>(
    h: &H,
    (pending, leased, published, dead): (u64, u64, u64, u64),
) -> (u64, u64, u64, u64) {
    let published = if deletes(h) { 0 } else { published };
    (pending, leased, published, dead)
}

/// Pending plus leased rows for `destination`: what is left to publish.
async fn unfinished<H: StoreHarness>(h: &H, destination: &str) -> u64 {
    let (pending, leased, _, _) = counts(h, destination).await;
    pending + leased
}

const LEASE: Duration = Duration::from_secs(30);

fn request(batch: usize) -> ClaimRequest {
    ClaimRequest::new("suite-relay", batch, LEASE)
}

fn message(destination: &str, n: usize) -> NewMessage {
    NewMessage::builder(destination, "suite.event")
        .json(&serde_json::json!({ "n": n }))
        .build()
        .expect("valid message")
}

async fn enqueue_n<H: StoreHarness>(h: &H, destination: &str, n: usize) -> Vec<MessageId> {
    let messages: Vec<NewMessage> = (0..n).map(|i| message(destination, i)).collect();
    let ids = messages.iter().map(NewMessage::id).collect();
    h.enqueue(messages).await.expect("enqueue");
    ids
}

/// A claim of up to `batch` rows.
async fn claim<H: StoreHarness>(h: &H, batch: usize) -> Claim {
    h.store().claim(&request(batch)).await.expect("claim")
}

/// Asserts that a claim now leases nothing, saying `why`.
async fn claims_nothing<H: StoreHarness>(h: &H, why: &str) {
    let claim = claim(h, 10).await;
    let ids: Vec<_> = claim.messages.iter().map(|m| m.id).collect();
    assert!(ids.is_empty(), "{why}: claimed {ids:?}");
}

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

async fn counts<H: StoreHarness>(h: &H, destination: &str) -> (u64, u64, u64, u64) {
    let stats = h.store().stats().await.expect("stats");
    stats
        .destination(destination)
        .map_or((0, 0, 0, 0), |d| (d.pending, d.leased, d.published, d.dead))
}

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

/// A message that keeps failing is dead-lettered after the policy's attempts, by a relay.
pub async fn max_attempts_dead_letters<H: StoreHarness>(h: &H) {
    let ids = enqueue_n(h, "orders", 2).await;
    let always_failing = FlakySink::new(RecordingSink::new()).retryable_rate(1.0);
    let relay = Relay::builder(h.store().clone())
        .route("orders", always_failing)
        .retry(
            RetryPolicy::default()
                .initial_delay(Duration::from_secs(1))
                .max_delay(Duration::from_secs(1))
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

/// Dead letters can be listed, counted, replayed and discarded by filter; only matches are touched.
pub async fn dead_letters_list_replay_discard<H: StoreHarness>(h: &H) {
    let specs = [
        ("sms", "order.paid", "400 bad phone"),
        ("sms", "order.shipped", "400 unknown template"),
        ("email", "order.paid", "550 mailbox unavailable"),
        ("email", "order.paid", "400 bad address"),
    ];
    let messages: Vec<NewMessage> = specs
        .iter()
        .map(|(d, e, _)| NewMessage::builder(*d, *e).json(&1).build().expect("valid"))
        .collect();
    let ids: Vec<_> = messages.iter().map(NewMessage::id).collect();
    h.enqueue(messages).await.expect("enqueue");
    let store = h.store();
    let claim = store.claim(&request(10)).await.expect("claim");
    let deaths: Vec<_> = ids
        .iter()
        .zip(specs)
        .map(|(id, (_, _, why))| Completion::dead(*id, why))
        .collect();
    store
        .complete(claim.lease.token, &deaths)
        .await
        .expect("complete");

    let all = store
        .list_dead(&DeadLetterFilter::all(), 10)
        .await
        .expect("list");
    assert_eq!(
        all.iter().map(|d| d.message.id).collect::<Vec<_>>(),
        ids,
        "oldest first"
    );
    let limited = store
        .list_dead(&DeadLetterFilter::all(), 2)
        .await
        .expect("list");
    assert_eq!(limited.len(), 2, "limit applies");
    let next_page = DeadLetterFilter::all().after_id(limited[1].message.id);
    assert_eq!(
        store
            .list_dead(&next_page, 10)
            .await
            .expect("list")
            .iter()
            .map(|d| d.message.id)
            .collect::<Vec<_>>(),
        ids[2..],
        "the next page starts after the last id listed"
    );
    let sms = DeadLetterFilter::all().destination("sms");
    assert_eq!(store.list_dead(&sms, 10).await.expect("list").len(), 2);
    let paid_email = DeadLetterFilter::all()
        .destination("email")
        .event_type("order.paid")
        .error_contains("400");
    let found = store.list_dead(&paid_email, 10).await.expect("list");
    assert_eq!(
        found.iter().map(|d| d.message.id).collect::<Vec<_>>(),
        vec![ids[3]]
    );
    let by_id = DeadLetterFilter::all().ids([ids[1]]);
    assert_eq!(
        store.list_dead(&by_id, 10).await.expect("list")[0]
            .message
            .id,
        ids[1]
    );
    let future = DeadLetterFilter::all()
        .created_between(Some(chrono::Utc::now() + chrono::Duration::days(365)), None);
    assert!(
        store.list_dead(&future, 10).await.expect("list").is_empty(),
        "time range applies"
    );
    let everything = DeadLetterFilter::all();
    for (filter, listed) in [
        (&everything, 4),
        (&sms, 2),
        (&paid_email, 1),
        (&by_id, 1),
        (&future, 0),
        (&next_page, 2),
    ] {
        assert_eq!(
            store.count_dead(filter).await.expect("count"),
            listed,
            "count_dead counts what list_dead lists: {filter:?}"
        );
    }

    assert_eq!(
        store.replay_dead(&sms).await.expect("replay"),
        2,
        "replay moves exactly the matches"
    );
    assert_eq!(counts(h, "sms").await, (2, 0, 0, 0));
    assert_eq!(counts(h, "email").await, (0, 0, 0, 2));
    let replayed = store.claim(&request(10)).await.expect("claim");
    assert_eq!(
        replayed.messages.iter().map(|m| m.id).collect::<Vec<_>>(),
        ids[..2]
    );
    assert!(
        replayed.messages.iter().all(|m| m.attempts == 1),
        "replay starts the attempts over"
    );

    assert_eq!(
        store.count_dead(&everything).await.expect("count"),
        2,
        "replayed rows are no longer counted"
    );
    let discard = DeadLetterFilter::all().error_contains("550");
    assert_eq!(store.discard_dead(&discard).await.expect("discard"), 1);
    assert_eq!(counts(h, "email").await, (0, 0, 0, 1));
    assert_eq!(
        store.discard_dead(&discard).await.expect("discard"),
        0,
        "nothing left to discard"
    );
}

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

/// Runs every per-key ordering check, each on a fresh harness, for stores that support
/// [`MessageOrder::PerKey`].
pub async fn run_ordering<H: StoreHarness>(factory: impl AsyncFn() -> H) {
    let probe = factory().await;
    if !probe.store().capabilities().per_key_ordering {
        matrix_line(
            &probe,
            "ordering checks",
            Some("the store declares no per-key ordering"),
        );
        return;
    }
    drop(probe);
    run_checks!(factory, |h: &H, name| matrix_line(h, name, None);
        per_key_claims_only_heads,
        a_failing_head_holds_back_only_its_key,
        dead_heads_skip_or_halt,
        order_is_commit_order_not_id_order,
        unordered_claims_ignore_keys,
        keys_are_scoped_per_destination,
        heads_behind_a_held_back_backlog,
    );
}

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
