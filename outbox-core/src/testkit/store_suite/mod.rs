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

mod claims;
mod completions;
mod dead_letters;
mod find_messages;
mod ordering;
mod purge;
mod relays;
mod stats;

use std::future::Future;
use std::time::Duration;

pub use claims::{
    claim_filters_destinations, claim_is_exclusive_under_concurrency, claims_due_rows_oldest_first,
    fields_round_trip, lapsed_lease_is_reclaimed, scheduled_rows_wait,
};
pub use completions::{
    claims_overlap_completions, completion_is_batched, deferral_waits_and_gives_the_attempt_back,
    partly_stale_completion_is_reported_per_id, release_does_not_count_an_attempt,
    retry_respects_available_at, stale_token_is_fenced,
};
pub use dead_letters::dead_letters_list_replay_discard;
pub use find_messages::{
    find_messages_by_id_or_key, waiting_rows_are_listed_with_their_error_and_next_attempt,
};
pub use ordering::{
    a_failing_head_holds_back_only_its_key, dead_heads_skip_or_halt,
    heads_behind_a_held_back_backlog, keys_are_scoped_per_destination,
    order_is_commit_order_not_id_order, per_key_claims_only_heads, unordered_claims_ignore_keys,
};
pub use purge::{purge_is_bounded_and_keeps_unfinished, purge_retires_slots_and_keeps_unfinished};
pub use relays::{
    max_age_follows_the_stores_clock, max_attempts_dead_letters,
    relays_with_disjoint_routes_share_the_table, silent_database_costs_a_lease_not_the_pool,
};
pub use stats::{gauges_match_the_table, stats_count_each_state};

use crate::clock::ManualClock;
use crate::error::StoreError;
use crate::memory::MemoryStore;
use crate::message::{MessageId, NewMessage};
use crate::registry::PublishedRows;
use crate::store::{Claim, ClaimRequest, DeadLetters, FindMessages, Purge, Store, StoreStats};

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

/// Runs every per-key ordering check, each on a fresh harness, for stores that support
/// [`MessageOrder::PerKey`](crate::MessageOrder::PerKey).
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

async fn counts<H: StoreHarness>(h: &H, destination: &str) -> (u64, u64, u64, u64) {
    let stats = h.store().stats().await.expect("stats");
    stats
        .destination(destination)
        .map_or((0, 0, 0, 0), |d| (d.pending, d.leased, d.published, d.dead))
}
