//! The PostgreSQL store against a real server.
#![cfg(feature = "postgres")]

mod common;

use std::sync::Arc;
use std::time::Duration;

use outbox_engine::testkit::{RecordingSink, StoreHarness, inbox_suite, store_suite};
use outbox_engine::{NewMessage, Relay, StoreError, StoreStats};
use outbox_sql::Dialect;
use outbox_sqlx::postgres::{PgInbox, PgOutbox};
use outbox_sqlx::{PublishedRows, TableNames};
use outbox_test_support::proxy::Net;
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

const URL_VAR: &str = "OUTBOX_TEST_POSTGRES_URL";
const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";
const BUSINESS_TABLE: &str = "CREATE TABLE {table} (id bigint PRIMARY KEY)";
const BUSINESS_INSERT: &str = "INSERT INTO {table} (id) VALUES ($1)";

async fn pool() -> PgPool {
    let url = common::url(URL_VAR, DEFAULT_URL);
    // Named per process (nextest runs each test in its own), so a test can tell its own
    // connections from those of tests running alongside.
    let options = url
        .parse::<PgConnectOptions>()
        .unwrap_or_else(|e| panic!("{URL_VAR}: {e}"))
        .application_name(&format!("outbox-test-{}", std::process::id()));
    // Enough for the suite's eight concurrent claimers.
    match PgPoolOptions::new()
        .max_connections(10)
        .acquire_timeout(Duration::from_secs(10))
        .connect_with(options)
        .await
    {
        Ok(pool) => pool,
        Err(e) => common::no_server("PostgreSQL", URL_VAR, &url, e),
    }
}

/// A fresh outbox table on the test server.
struct PgHarness {
    outbox: PgOutbox,
    mode: PublishedRows,
}

impl PgHarness {
    async fn new() -> Self {
        Self::with_mode(PublishedRows::Keep).await
    }

    async fn with_mode(mode: PublishedRows) -> Self {
        let names = TableNames::default()
            .outbox(&common::fresh_table("outbox"))
            .unwrap();
        let outbox = PgOutbox::with_names(pool().await, names).published_rows(mode);
        outbox.migrate().await.expect("migrate");
        Self { outbox, mode }
    }

    fn table(&self) -> String {
        self.outbox
            .names()
            .render(outbox_sql::Dialect::Postgres, "{outbox}")
    }

    /// Drops the outbox table by hand (a `rotate` layout's slots table stays).
    async fn drop_table(&self) {
        let sql = format!("DROP TABLE {}", self.table());
        sqlx::query(&sql).execute(self.outbox.pool()).await.unwrap();
    }

    /// The store's LISTEN connection.
    async fn listen(&self) -> outbox_engine::Listener {
        let listener = self.outbox.listen().await.unwrap();
        listener.expect("PostgreSQL listens")
    }

    async fn rows(&self) -> i64 {
        let sql = format!("SELECT count(*) FROM {}", self.table());
        let count = sqlx::query_scalar(&sql).fetch_one(self.outbox.pool());
        count.await.unwrap()
    }

    /// The rows per destination and status.
    async fn by_status(&self) -> Vec<(String, String, i64)> {
        let sql = format!(
            "SELECT destination, status::text, count(*) FROM {} GROUP BY destination, status",
            self.table()
        );
        sqlx::query_as(&sql)
            .fetch_all(self.outbox.pool())
            .await
            .unwrap()
    }
}

/// Each check of a suite builds a harness with a pool of its own: closing it when the
/// check ends keeps the server's connection count flat over the whole suite (up to 10
/// connections per check would otherwise linger until the test ends).
impl Drop for PgHarness {
    fn drop(&mut self) {
        let pool = self.outbox.pool().clone();
        tokio::spawn(async move { pool.close().await });
    }
}

/// A fresh outbox table holding only the schema's first two migrations, as an older
/// release left it, for the shared tests ([`sqlx_tests!`]).
async fn older_harness() -> PgHarness {
    let pool = pool().await;
    let names = TableNames::default()
        .outbox(&common::fresh_table("outbox"))
        .unwrap();
    common::older_table(&pool, Dialect::Postgres, &names, 2).await;
    PgHarness {
        outbox: PgOutbox::with_names(pool, names),
        mode: PublishedRows::Keep,
    }
}

/// A fresh outbox table, for the shared tests ([`sqlx_tests!`]).
async fn harness(mode: PublishedRows) -> PgHarness {
    PgHarness::with_mode(mode).await
}

impl StoreHarness for PgHarness {
    type Store = PgOutbox;

    fn store(&self) -> &PgOutbox {
        &self.outbox
    }

    async fn enqueue(&self, messages: Vec<NewMessage>) -> Result<(), StoreError> {
        let mut tx = self.outbox.pool().begin().await.unwrap();
        self.outbox.enqueue_all(&mut tx, &messages).await?;
        tx.commit().await.unwrap();
        Ok(())
    }

    async fn advance(&self, by: Duration) {
        let ms = by.as_millis() as i64;
        if self.mode == PublishedRows::Rotate {
            let slots = self
                .outbox
                .names()
                .render(Dialect::Postgres, "{outbox_fn:slots}");
            sqlx::query(&format!(
                "UPDATE {slots} SET since = since - $1 * interval '1 millisecond'"
            ))
            .bind(ms)
            .execute(self.outbox.pool())
            .await
            .unwrap();
        }
        let sql = format!(
            "UPDATE {} SET created_at = created_at - $1 * interval '1 millisecond', \
             available_at = available_at - $1 * interval '1 millisecond', \
             lease_until = lease_until - $1 * interval '1 millisecond', \
             published_at = published_at - $1 * interval '1 millisecond', \
             dead_at = dead_at - $1 * interval '1 millisecond'",
            self.table()
        );
        sqlx::query(&sql)
            .bind(ms)
            .execute(self.outbox.pool())
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_passes_the_store_suite() {
    store_suite::run_all(PgHarness::new).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_passes_the_store_and_ordering_suites_in_delete_mode() {
    let h = || PgHarness::with_mode(PublishedRows::Delete);
    store_suite::run_all(h).await;
    store_suite::run_ordering(h).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_passes_the_store_and_ordering_suites_in_rotate_mode() {
    let h = || PgHarness::with_mode(PublishedRows::Rotate);
    store_suite::run_all(h).await;
    store_suite::run_ordering(h).await;
}

/// Relays publish keyed messages as a producer writes them while a purger rotates the
/// slots as fast as it can (age zero: every call empties the oldest slot). Nothing
/// committed may be lost, each key must arrive in order (the rows a rotation moves keep
/// their numbers), and dead letters written before the first rotation must outlive every
/// slot they were in, listed and replayable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotation_while_relays_run_loses_no_pending_or_dead_row() {
    use std::collections::{HashMap, HashSet};
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    use outbox_engine::testkit::FlakySink;
    use outbox_engine::{
        ClaimRequest, Completion, DeadHead, DeadLetterFilter, DeadLetters, MessageOrder, Purge,
        PurgeRequest, Store,
    };

    const MESSAGES: u64 = 2_000;
    let h = PgHarness::with_mode(PublishedRows::Rotate).await;
    let store = h.outbox.clone();

    h.enqueue((0..5).map(|n| common::message("audit", n)).collect())
        .await
        .unwrap();
    let claim = store
        .claim(&ClaimRequest::new("setup", 5, Duration::from_secs(30)))
        .await
        .unwrap();
    let dead: HashSet<_> = claim.messages.iter().map(|m| m.id).collect();
    let completions: Vec<_> = dead
        .iter()
        .map(|id| Completion::dead(*id, "refused"))
        .collect();
    store
        .complete(claim.lease.token, &completions)
        .await
        .unwrap();
    assert_eq!(dead.len(), 5, "five dead letters to begin with");

    // A backlog in two slots before any relay runs; the third rotation moves the older
    // half (and the dead letters) into the current slot, behind rows of the same keys
    // committed later, whose numbers must still say who comes first.
    let mut written = HashSet::new();
    let now = PurgeRequest::published_older_than(Duration::ZERO);
    let backlog = MESSAGES / 4;
    let mut n = 0;
    while n < backlog {
        n = write_keyed(&h, n, backlog, &mut written).await;
    }
    store.purge(&now).await.unwrap();
    while n < 2 * backlog {
        n = write_keyed(&h, n, 2 * backlog, &mut written).await;
    }
    store.purge(&now).await.unwrap();
    assert_eq!(
        store.purge(&now).await.unwrap(),
        0,
        "the first slot held no published row"
    );

    let orders = RecordingSink::new();
    let audit = RecordingSink::new();
    let mut relays = Vec::new();
    for _ in 0..2 {
        let relay = Relay::builder(store.clone())
            .route("orders", FlakySink::new(orders.clone()).retryable_rate(0.1))
            .route("audit", audit.clone())
            .ordering(MessageOrder::PerKey(DeadHead::Skip))
            .batch_size(20)
            .poll_interval(Duration::from_millis(5))
            .retry(common::backoff_ms(2, 10).max_attempts(10_000))
            .build()
            .unwrap();
        relays.push(relay.spawn());
    }

    let rotating = Arc::new(AtomicBool::new(true));
    let rotations = Arc::new(AtomicU64::new(0));
    let rotator = tokio::spawn({
        let (store, rotating, rotations) = (store.clone(), rotating.clone(), rotations.clone());
        async move {
            while rotating.load(Ordering::Relaxed) {
                store.purge(&now).await.expect("rotate");
                rotations.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(fastrand::u64(5..30))).await;
            }
        }
    });

    while n < MESSAGES {
        n = write_keyed(&h, n, MESSAGES, &mut written).await;
        tokio::time::sleep(Duration::from_micros(fastrand::u64(0..1_000))).await;
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let seen: HashSet<_> = orders.messages().iter().map(|m| m.id).collect();
        if written.is_subset(&seen) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "waited 60 s for every committed message: {} of {MESSAGES} delivered",
            written.intersection(&seen).count()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    rotating.store(false, Ordering::Relaxed);
    rotator.await.expect("rotator");
    let rotations = rotations.load(Ordering::Relaxed);
    eprintln!("rotation under load: {MESSAGES} messages, {rotations} rotations");
    assert!(
        rotations >= 9,
        "every slot emptied three times over: {rotations} rotations"
    );

    let mut next: HashMap<u64, u64> = HashMap::new();
    let mut seen = HashSet::new();
    for m in orders.messages() {
        if !seen.insert(m.id) {
            continue;
        }
        let v: serde_json::Value = serde_json::from_slice(&m.payload).unwrap();
        let (key, n) = (v["key"].as_u64().unwrap(), v["n"].as_u64().unwrap());
        let expected = next.entry(key).or_default();
        assert_eq!(n, *expected, "key {key} out of order");
        *expected += 1;
    }

    let audit_only = DeadLetterFilter::all().destination("audit");
    let listed: HashSet<_> = store
        .list_dead(&audit_only, 10)
        .await
        .unwrap()
        .iter()
        .map(|d| d.message.id)
        .collect();
    assert_eq!(listed, dead, "the dead letters outlived their slots");
    assert_eq!(store.replay_dead(&audit_only).await.unwrap(), 5);
    assert!(
        audit.wait_for(5, Duration::from_secs(30)).await,
        "waited 30 s for the five replayed dead letters, saw {}",
        audit.len()
    );
    for relay in relays {
        relay.stop().await.unwrap();
    }
}

/// A rotation must hold no row lock while it waits for the slot. A session that holds
/// the oldest slot (any statement on the outbox locks every slot) and then updates a row
/// the rotation would move, such as an operator's dead-letter replay, or a relay's
/// completion of a row the rotation's `FOR UPDATE` kept locked after it was leased,
/// must go on; with the moves and the wait in one transaction the two deadlocked, and
/// PostgreSQL failed one of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotation_waits_for_the_slot_without_holding_rows() {
    use outbox_engine::{ClaimRequest, Completion, Purge, PurgeRequest, Store};

    let h = PgHarness::with_mode(PublishedRows::Rotate).await;
    let (pool, table) = (h.outbox.pool().clone(), h.table());
    h.enqueue(vec![
        common::message("orders", 1),
        common::message("orders", 2),
    ])
    .await
    .unwrap();
    let claim = h
        .outbox
        .claim(&ClaimRequest::new("relay", 2, Duration::from_secs(60)))
        .await
        .unwrap();
    let (dead, leased) = (claim.messages[0].id, claim.messages[1].id);
    h.outbox
        .complete(claim.lease.token, &[Completion::dead(dead, "refused")])
        .await
        .unwrap();
    // Two rotations empty the other slots; the one holding both rows is now the oldest.
    let now = PurgeRequest::published_older_than(Duration::ZERO);
    for _ in 0..2 {
        h.outbox.purge(&now).await.unwrap();
    }
    let oldest = table.trim_matches('"').to_owned() + "_slot_0";

    let mut holder = pool.begin().await.unwrap();
    sqlx::query(&format!(
        "UPDATE {table} SET lease_until = lease_until WHERE id = $1"
    ))
    .bind(leased.as_uuid())
    .execute(&mut *holder)
    .await
    .unwrap();
    let rotation = tokio::spawn({
        let store = h.outbox.clone();
        async move { store.purge(&now).await }
    });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_locks WHERE NOT granted AND mode = 'AccessExclusiveLock' \
             AND relation = to_regclass($1)",
        )
        .bind(&oldest)
        .fetch_one(&pool)
        .await
        .unwrap();
        if waiting > 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "waited 10 s for the rotation to wait for {oldest}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let replay = format!(
        "UPDATE {table} SET status = 'pending', available_at = now() WHERE id = $1 AND status = 'dead'"
    );
    let replay = sqlx::query(&replay)
        .bind(dead.as_uuid())
        .execute(&mut *holder);
    let replayed = tokio::time::timeout(Duration::from_secs(10), replay)
        .await
        .expect("the replay waited 10 s")
        .expect("the replay, while the rotation waits for the slot");
    assert_eq!(replayed.rows_affected(), 1, "the dead letter was replayed");
    holder.commit().await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), rotation)
        .await
        .expect("the rotation ended within 10 s of the holder's commit")
        .unwrap()
        .expect("the rotation, once the holder committed");

    let left: Vec<(uuid::Uuid, String, String)> = sqlx::query_as(&format!(
        "SELECT id, status, tableoid::regclass::text FROM {table} ORDER BY id"
    ))
    .fetch_all(&pool)
    .await
    .unwrap();
    let mut expected = vec![*dead.as_uuid(), *leased.as_uuid()];
    expected.sort();
    assert_eq!(
        left.iter().map(|(id, ..)| *id).collect::<Vec<_>>(),
        expected,
        "both rows outlived the rotation: {left:?}"
    );
    assert!(
        left.iter()
            .all(|(_, _, part)| part.trim_matches('"') != oldest),
        "nothing is left in the emptied slot: {left:?}"
    );
}

/// Commits messages `from..` (at most five, below `to`) in one transaction, each of key
/// `i % 10` with its place in the key; returns where the next write starts.
async fn write_keyed(
    h: &PgHarness,
    from: u64,
    to: u64,
    written: &mut std::collections::HashSet<outbox_engine::MessageId>,
) -> u64 {
    let end = to.min(from + fastrand::u64(1..6));
    let batch: Vec<_> = (from..end)
        .map(|i| {
            NewMessage::builder("orders", "order.changed")
                .json(&serde_json::json!({ "key": i % 10, "n": i / 10 }))
                .partition_key(format!("order-{}", i % 10))
                .build()
                .unwrap()
        })
        .collect();
    written.extend(batch.iter().map(NewMessage::id));
    h.enqueue(batch).await.unwrap();
    end
}

/// A slot that drained is analyzed as holding published rows only; the planner must still
/// claim from it through the due index, and complete without a per-row scan, when a
/// backlog arrives. (Searched as one partitioned table, the claim sorted every due row; with an
/// `(id, slot)` key, each completion combined the key index with a whole partial index.
/// Both made every call cost the backlog.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotate_plans_stay_index_probes_under_stale_statistics() {
    let h = PgHarness::with_mode(PublishedRows::Rotate).await;
    let (pool, table) = (h.outbox.pool(), h.table());
    for statement in [
        format!(
            "INSERT INTO {table} (destination, event_type, payload, status, available_at, published_at) \
             SELECT 'orders', 'e', '\\x7b7d', 'published', NULL, now() FROM generate_series(1, 5000)"
        ),
        format!("ANALYZE {table}"),
    ] {
        sqlx::query(&statement).execute(pool).await.unwrap();
    }
    for batch in 0..5 {
        h.enqueue(
            (0..1000)
                .map(|n| common::message("orders", batch * 1000 + n))
                .collect(),
        )
        .await
        .unwrap();
    }
    let sql = outbox_sql::postgres::Statements::for_rows(h.outbox.names(), PublishedRows::Rotate);
    let plan = |rows: Vec<(String,)>| {
        rows.into_iter()
            .map(|(line,)| line)
            .collect::<Vec<_>>()
            .join("\n")
    };
    let claim = plan(
        sqlx::query_as(&format!("EXPLAIN {}", sql.claim))
            .bind(100_i64)
            .bind("planner")
            .bind(uuid::Uuid::new_v4())
            .bind(30_000_i64)
            .fetch_all(pool)
            .await
            .unwrap(),
    );
    let slot = table.trim_matches('"').to_owned() + "_slot_0";
    assert!(
        claim.contains(&format!(
            "Index Scan using {slot}_available_at_id_idx on {slot}"
        )),
        "the claim reads the due index of the slot with the backlog:\n{claim}"
    );
    let ids: Vec<uuid::Uuid> = sqlx::query_scalar(&format!(
        "SELECT id FROM {table} WHERE status = 'pending' LIMIT 100"
    ))
    .fetch_all(pool)
    .await
    .unwrap();
    let n = ids.len();
    let complete = plan(
        sqlx::query_as(&format!("EXPLAIN {}", sql.complete))
            .bind(uuid::Uuid::new_v4())
            .bind(ids)
            .bind(vec!["published"; n])
            .bind(vec![0_i64; n])
            .bind(vec![None::<String>; n])
            .fetch_all(pool)
            .await
            .unwrap(),
    );
    // One pass over the slot (a hash join) or one id probe per row; never another index
    // combined into each probe, or read whole once per row.
    let per_row = complete.contains("Nested Loop");
    assert!(
        !complete.contains("BitmapAnd")
            && (!per_row || complete.contains(&format!("using {slot}_id on {slot}"))),
        "completed rows are found through the slot's id index or in one pass:\n{complete}"
    );
}

/// An ordered claim reads a bounded window of the due index, whatever the backlog held
/// back behind leased heads: with every key's head leased, 1,980 rows wait, and the claim
/// must find the two free heads without testing each waiting row. (It tested each one, a
/// key-index probe per row, until the battery's drain stalled on such a backlog.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordered_claims_read_a_window_not_the_held_back_backlog() {
    use outbox_engine::{ClaimRequest, DeadHead, MessageOrder, Store};
    for mode in [PublishedRows::Keep, PublishedRows::Rotate] {
        let h = PgHarness::with_mode(mode).await;
        let keyed = |key: usize, n: usize| {
            NewMessage::builder("orders", "order.updated")
                .json(&serde_json::json!({ "key": key, "n": n }))
                .partition_key(format!("k{key}"))
                .build()
                .unwrap()
        };
        h.enqueue(
            (0..100)
                .flat_map(|n| (0..20).map(move |key| keyed(key, n)))
                .collect(),
        )
        .await
        .unwrap();
        let ordered = |batch| {
            ClaimRequest::new("relay", batch, Duration::from_secs(60))
                .ordering(MessageOrder::PerKey(DeadHead::Halt))
        };
        let held = h.outbox.claim(&ordered(20)).await.unwrap();
        assert_eq!(held.messages.len(), 20, "one head per key");
        h.enqueue(vec![keyed(20, 0), keyed(21, 0)]).await.unwrap();

        let (pool, table) = (h.outbox.pool(), h.table());
        sqlx::query(&format!("ANALYZE {table}"))
            .execute(pool)
            .await
            .unwrap();
        let sql = outbox_sql::postgres::Statements::for_rows(h.outbox.names(), mode);
        let mut tx = pool.begin().await.unwrap();
        let plan: Vec<String> = sqlx::query_scalar(&format!(
            "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) {}",
            sql.claim_ordered(false, true)
        ))
        .bind(10_i64)
        .bind("planner")
        .bind(uuid::Uuid::new_v4())
        .bind(60_000_i64)
        .fetch_all(&mut *tx)
        .await
        .unwrap();
        tx.rollback().await.unwrap();
        let plan = plan.join("\n");
        // Entries a due-index scan yields, and those its own filter dropped.
        let mut due_rows = 0;
        let mut in_due_scan = false;
        for line in plan.lines() {
            let number = |after: &str| -> u64 {
                let rest = line.split(after).nth(1).unwrap();
                rest.split([' ', ')']).next().unwrap().parse().unwrap()
            };
            if line.contains("->") {
                in_due_scan = line.contains("_due_idx") || line.contains("available_at_id_idx");
                if in_due_scan {
                    due_rows += number("actual rows=");
                }
            } else if in_due_scan && line.contains("Rows Removed by Filter:") {
                due_rows += number("Rows Removed by Filter: ");
            }
        }
        assert!(
            (1..=40).contains(&due_rows),
            "{mode:?}: the claim read {due_rows} due-index entries; its window is 4 × 10:\n{plan}"
        );
        let update = plan
            .lines()
            .find(|line| line.trim_start().starts_with("Update on"));
        assert!(
            update.is_some_and(|line| line.contains("actual rows=2 loops=1")),
            "{mode:?}: the claim leased the two free heads:\n{plan}"
        );
    }
}

/// The relay's claims and completions commit without waiting for the WAL flush, by a
/// setting local to their own transaction: the connection they ran on, handed to the
/// next statement, still commits synchronously.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn asynchronous_commits_stay_inside_the_relay_statements() {
    use outbox_engine::{ClaimRequest, Completion, Store};
    let h = PgHarness::new().await;
    h.enqueue(vec![
        NewMessage::builder("orders", "order.placed")
            .json(&serde_json::json!({ "n": 1 }))
            .build()
            .unwrap(),
    ])
    .await
    .unwrap();
    let single = PgPoolOptions::new()
        .max_connections(1)
        .connect_with(h.outbox.pool().connect_options().as_ref().clone())
        .await
        .unwrap();
    let outbox = PgOutbox::with_names(single.clone(), h.outbox.names().clone());
    let setting = || async {
        sqlx::query_scalar::<_, String>("SHOW synchronous_commit")
            .fetch_one(&single)
            .await
            .unwrap()
    };
    let server = setting().await;
    let claim = outbox
        .claim(&ClaimRequest::new("relay", 10, Duration::from_secs(60)))
        .await
        .unwrap();
    assert_eq!(claim.messages.len(), 1);
    assert_eq!(setting().await, server, "after a claim");
    let done = [Completion::published(claim.messages[0].id)];
    let report = outbox.complete(claim.lease.token, &done).await.unwrap();
    assert_eq!(report.applied, 1);
    assert_eq!(setting().await, server, "after a completion");
}

/// The slots table outlives a hand-dropped outbox; `migrate` recreates the partitions and
/// points the slots at them, so rotation goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotate_layout_is_recreated_after_the_table_is_dropped() {
    use outbox_engine::{Purge, PurgeRequest};

    let h = PgHarness::with_mode(PublishedRows::Rotate).await;
    let now = PurgeRequest::published_older_than(Duration::ZERO);
    h.outbox.purge(&now).await.unwrap();
    h.drop_table().await;
    h.outbox.migrate().await.unwrap();
    h.enqueue(vec![common::message("orders", 1)]).await.unwrap();
    let relay = Relay::builder(h.outbox.clone())
        .route("orders", RecordingSink::new())
        .build()
        .unwrap();
    assert_eq!(relay.drain().await.unwrap().published, 1);
    let mut emptied = 0;
    for _ in 0..3 {
        emptied += h.outbox.purge(&now).await.unwrap();
    }
    assert_eq!(emptied, 1, "the published row left with its slot");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotate_refuses_a_table_created_without_slots() {
    let h = PgHarness::new().await;
    let rotating = PgOutbox::with_names(h.outbox.pool().clone(), h.outbox.names().clone())
        .published_rows(PublishedRows::Rotate);
    let error = rotating.migrate().await.unwrap_err().to_string();
    assert!(
        error.contains("exists without slots") && error.contains("rotate"),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_enqueue_and_relay_deliver_with_all_fields() {
    common::delivers_every_field(&PgHarness::new().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_inbox_passes_the_inbox_suite() {
    let pool = pool().await;
    inbox_suite::run_all(|| async {
        let names = TableNames::default()
            .inbox(&common::fresh_table("inbox"))
            .unwrap();
        let inbox = PgInbox::with_names(names.clone());
        inbox.migrate(&pool).await.unwrap();
        inbox
            .migrate(&pool)
            .await
            .expect("migrating twice is a no-op");
        common::SqlxInbox {
            pool: pool.clone(),
            inbox,
            begin: None,
            age: names.render(
                Dialect::Postgres,
                "UPDATE {inbox} SET received_at = received_at - $1 * interval '1 second'",
            ),
            cleanup: None,
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notify_wakes_a_listening_relay_and_survives_backend_termination() {
    let h = PgHarness::new().await;
    let listener = h.listen().await;
    let sink = RecordingSink::new();
    let relay = Relay::builder(h.outbox.clone())
        .route("orders", sink.clone())
        .poll_interval(Duration::from_secs(3600))
        .wakeup(listener.wakeup())
        .build()
        .unwrap();
    let running = tokio::spawn(relay.run(std::future::pending()));
    tokio::time::sleep(Duration::from_millis(300)).await;

    let notifier = h.outbox.notifier();
    // A NOTIFY sent while no listener is LISTENing is lost: wait for a LISTEN backend
    // of this test that is not one of those killed.
    let listening_anew = |killed: &[i32]| {
        let pool = h.outbox.pool().clone();
        let killed = killed.to_vec();
        async move {
            outbox_test_support::wait_until(
                "the listener to LISTEN on a new connection",
                Duration::from_secs(20),
                || async {
                    sqlx::query_scalar::<_, i64>(
                        "SELECT count(*) FROM pg_stat_activity WHERE query ILIKE 'LISTEN%' AND pid <> ALL($1) \
                         AND application_name = current_setting('application_name')",
                    )
                    .bind(&killed)
                    .fetch_one(&pool)
                    .await
                    .unwrap()
                        > 0
                },
            )
            .await;
        }
    };
    let mut killed: Vec<i32> = Vec::new();
    for round in 1..=2 {
        listening_anew(&killed).await;
        h.enqueue(vec![common::message("orders", round)])
            .await
            .unwrap();
        notifier.notify();
        assert!(
            sink.wait_for(round as usize, Duration::from_secs(10)).await,
            "NOTIFY woke the relay"
        );
        // Kill this test's LISTEN connections: the listener must reconnect and keep working.
        let terminated: Vec<(i32, bool)> = sqlx::query_as(
            "SELECT pid, pg_terminate_backend(pid) FROM pg_stat_activity WHERE query ILIKE 'LISTEN%' AND pid <> pg_backend_pid() \
             AND application_name = current_setting('application_name')",
        )
        .fetch_all(h.outbox.pool())
        .await
        .unwrap();
        assert!(
            !terminated.is_empty(),
            "a LISTEN connection was found and terminated"
        );
        killed.extend(terminated.into_iter().map(|(pid, _)| pid));
    }
    // No listener connection is ever idle inside a transaction.
    let idle_in_tx: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE query ILIKE 'LISTEN%' AND state LIKE 'idle in transaction%'",
    )
    .fetch_one(h.outbox.pool())
    .await
    .unwrap();
    assert_eq!(idle_in_tx, 0);
    listening_anew(&killed).await;
    h.enqueue(vec![common::message("orders", 3)]).await.unwrap();
    notifier.notify();
    assert!(
        sink.wait_for(3, Duration::from_secs(10)).await,
        "woken after reconnect"
    );
    running.abort();
}

/// A notifier dropped right after `notify` still sends that NOTIFY: its task ends only
/// after the NOTIFY it owes, so a writer that notifies and exits wakes the relay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_notifier_sends_the_notify_it_owes() {
    let h = PgHarness::new().await;
    let listener = h.listen().await;
    let mut woken = listener.wakeup().subscribe();
    let notifier = h.outbox.notifier();
    notifier.notify();
    tokio::time::timeout(Duration::from_secs(10), woken.wait())
        .await
        .expect("the first NOTIFY reached the listener within 10 s");
    notifier.notify();
    drop(notifier);
    tokio::time::timeout(Duration::from_secs(10), woken.wait())
        .await
        .expect("the NOTIFY owed by the dropped notifier reached the listener within 10 s");
}

/// Hostile names are either rejected or used exactly as quoted; a canary table survives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_identifiers_are_rejected_or_quoted_exactly() {
    let pool = pool().await;
    let canary = common::fresh_table("canary");
    let created = common::hostile_identifiers(common::Hostile {
        pool: &pool,
        canary: &canary,
        create_canary: "CREATE TABLE {canary} (x int)",
        fragments: &["$$", "$2"],
        tries: 1000,
        exists: "SELECT COUNT(*) FROM pg_class WHERE relname = $1 AND relkind IN ('r', 'p')",
        store: &|names| PgOutbox::with_names(pool.clone(), names),
        enqueue: &|outbox, conn, message| {
            Box::pin(async move { outbox.enqueue(conn, &message).await })
        },
    })
    .await;
    for names in created {
        sqlx::query(&names.render(Dialect::Postgres, "DROP TABLE IF EXISTS {outbox} CASCADE"))
            .execute(&pool)
            .await
            .unwrap();
    }
    sqlx::query(&format!("DROP TABLE {canary}"))
        .execute(&pool)
        .await
        .unwrap();
}

/// A relay stalls after publishing until its lease lapsed and another relay reclaimed the
/// rows: its late completion changes nothing and is reported as stale.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_that_lost_its_lease_changes_nothing() {
    use outbox_engine::{
        Claim, ClaimRequest, CompleteReport, Completion, LeaseToken, MessageId, Store,
    };

    /// Completes only once the test releases it: a GC pause, a network partition...
    #[derive(Clone)]
    struct StallBeforeComplete(PgOutbox, Arc<tokio::sync::Notify>);
    impl Store for StallBeforeComplete {
        fn capabilities(&self) -> outbox_engine::Capabilities {
            self.0.capabilities()
        }
        async fn claim(&self, r: &ClaimRequest) -> Result<Claim, StoreError> {
            self.0.claim(r).await
        }
        async fn complete(
            &self,
            t: LeaseToken,
            c: &[Completion],
        ) -> Result<CompleteReport, StoreError> {
            self.1.notified().await;
            self.0.complete(t, c).await
        }
        async fn release(
            &self,
            t: LeaseToken,
            ids: &[MessageId],
        ) -> Result<CompleteReport, StoreError> {
            self.0.release(t, ids).await
        }
    }

    let h = PgHarness::new().await;
    h.enqueue((0..5).map(|n| common::message("orders", n)).collect())
        .await
        .unwrap();
    let resume = Arc::new(tokio::sync::Notify::new());
    let slow = Relay::builder(StallBeforeComplete(h.outbox.clone(), Arc::clone(&resume)))
        .route("orders", RecordingSink::new())
        .owner("slow")
        .lease(Duration::from_secs(1))
        .build()
        .unwrap();
    let stalled = tokio::spawn(async move { slow.run_once().await });
    let slow_rows = |condition: &'static str| {
        let sql = format!(
            "SELECT count(*) FROM {} WHERE status = 'leased' AND lease_owner = 'slow' {condition}",
            h.table()
        );
        let pool = h.outbox.pool().clone();
        async move {
            sqlx::query_scalar::<_, i64>(&sql)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    outbox_test_support::wait_until(
        "the slow relay to hold its 5 rows leased",
        Duration::from_secs(10),
        || async { slow_rows("").await == 5 },
    )
    .await;
    outbox_test_support::wait_until(
        "the slow relay's leases to lapse",
        Duration::from_secs(10),
        || async { slow_rows("AND lease_until < now()").await == 5 },
    )
    .await;
    let healthy = Relay::builder(h.outbox.clone())
        .route("orders", RecordingSink::new())
        .build()
        .unwrap();
    let report = healthy.run_once().await.unwrap();
    assert_eq!(
        (report.claimed, report.published),
        (5, 5),
        "the lapsed rows were reclaimed"
    );

    let states = || async {
        let sql = format!("SELECT id, status, attempts FROM {} ORDER BY id", h.table());
        let rows = sqlx::query_as::<_, (uuid::Uuid, String, i32)>(&sql);
        rows.fetch_all(h.outbox.pool()).await.unwrap()
    };
    let before = states().await;
    resume.notify_one();
    let late = stalled.await.unwrap().unwrap();
    assert_eq!(
        (late.claimed, late.published, late.stale),
        (5, 0, 5),
        "the late completion is reported stale"
    );
    let after = states().await;
    assert_eq!(before, after, "0 rows changed");
    assert!(
        after
            .iter()
            .all(|(_, status, attempts)| status == "published" && *attempts == 2)
    );
}

/// Migrations are idempotent and re-run: a table dropped by hand comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_is_idempotent_and_recreates_a_dropped_table() {
    let h = PgHarness::new().await;
    h.outbox.migrate().await.unwrap();
    h.drop_table().await;
    h.outbox.migrate().await.unwrap();
    h.enqueue(vec![common::message("orders", 1)]).await.unwrap();
    assert_eq!(h.outbox.stats().await.unwrap().total().pending, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_passes_the_ordering_suite() {
    store_suite::run_ordering(PgHarness::new).await;
}

/// Transaction A enqueues for key K first and commits last; B enqueues for K after A and
/// commits first. The relay publishes B's message, then A's: commit order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_order_commits_publish_in_commit_order() {
    use outbox_engine::{DeadHead, MessageOrder};

    let h = PgHarness::new().await;
    let pool = h.outbox.pool();
    let keyed = |n: u64| {
        NewMessage::builder("orders", "order.changed")
            .json(&n)
            .partition_key("order-7")
            .build()
            .unwrap()
    };
    let (a, b) = (keyed(1), keyed(2));
    let mut tx_a = pool.begin().await.unwrap();
    h.outbox.enqueue(&mut tx_a, &a).await.unwrap();
    let mut tx_b = pool.begin().await.unwrap();
    // B's enqueue does not wait for A: the key is numbered at commit.
    tokio::time::timeout(Duration::from_secs(5), h.outbox.enqueue(&mut tx_b, &b))
        .await
        .expect("B not blocked")
        .unwrap();
    tx_b.commit().await.unwrap();
    tx_a.commit().await.unwrap();
    assert!(a.id() < b.id(), "A's id was assigned first");

    let sink = RecordingSink::new();
    let relay = Relay::builder(h.outbox.clone())
        .route("orders", sink.clone())
        .ordering(MessageOrder::PerKey(DeadHead::Skip))
        .build()
        .unwrap();
    relay.drain().await.unwrap();
    let order: Vec<_> = sink.messages().iter().map(|m| m.id).collect();
    assert_eq!(
        order,
        vec![b.id(), a.id()],
        "published in commit order, not id order"
    );
}

/// Inserts `rows` as another program would, in one transaction, straight into the table.
async fn insert_foreign(h: &PgHarness, rows: &[common::ForeignRow]) -> Result<(), sqlx::Error> {
    let mut tx = h.outbox.pool().begin().await?;
    for row in rows {
        sqlx::query(&format!(
            "INSERT INTO {} (id, destination, event_type, idempotency_key, payload, content_type, headers, available_at) \
             VALUES ($1::uuid, 'orders', 'foreign.event', $1, '\\x7b7d'::bytea, 'application/json', $2::jsonb, now())",
            h.table()
        ))
        .bind(&row.id)
        .bind(&row.headers)
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await
}

/// The 200-row poison case: rows whose headers are valid JSON but not an object of
/// strings are dead-lettered one by one, naming the column, and the rest of their batches
/// is published. The table refuses such rows once migrated, so the check is dropped
/// first, as on a table migrated by an older version or by the user's own tool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreadable_headers_dead_letter_their_row_not_the_batch() {
    let h = PgHarness::new().await;
    let drop = h.outbox.names().render(
        outbox_sql::Dialect::Postgres,
        "DROP TRIGGER {outbox_trg:refuse_trg} ON {outbox}",
    );
    sqlx::query(&drop).execute(h.outbox.pool()).await.unwrap();
    let rows = common::foreign_rows(200, &[(0, r#"{"x-n": 1}"#), (57, "[1,2]"), (150, "null")]);
    insert_foreign(&h, &rows).await.unwrap();
    let poisoned = [
        rows[0].id.clone(),
        rows[57].id.clone(),
        rows[150].id.clone(),
    ];
    common::unreadable_rows_are_dead_lettered_alone(h.outbox.clone(), 200, &poisoned, "headers")
        .await;
}

/// Once migrated, the table refuses headers the relay could not read, naming the check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_table_refuses_headers_that_are_not_an_object_of_strings() {
    let h = PgHarness::new().await;
    let insert = |rows: Vec<common::ForeignRow>| {
        let h = &h;
        async move { insert_foreign(h, &rows).await }
    };
    let bad = [
        r#"{"x-n": 1}"#,
        "[1,2]",
        "null",
        r#""text""#,
        r#"{"a": {"b": "c"}}"#,
    ];
    common::refuses_unreadable_rows(insert, &bad, "column headers", None).await;
}

// ---- Writers in other languages (004_writers): defaults, checks, enqueue(), key() ----

/// Inserts one row for `orders` as a foreign writer would, with `column` set to the SQL
/// expression `value` and every other column left to the table.
async fn insert_with(h: &PgHarness, column: &str, value: &str) -> Result<(), sqlx::Error> {
    let sql = common::insert_sql(&h.table(), "'\\x7b7d'::bytea", column, value);
    sqlx::query(&sql).execute(h.outbox.pool()).await.map(|_| ())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_with_only_destination_event_type_and_payload_is_delivered() {
    let h = PgHarness::new().await;
    for _ in 0..3 {
        insert_with(&h, "destination", "'orders'").await.unwrap();
    }
    // Written with available_at NULL on purpose: due now, not never.
    insert_with(&h, "available_at", "NULL").await.unwrap();
    // NULL written explicitly (a driver's None) means the default too.
    for column in ["id", "idempotency_key", "content_type", "headers"] {
        insert_with(&h, column, "NULL").await.unwrap();
    }
    common::minimal_rows_are_delivered(h.outbox.clone(), 8).await;
}

// The tests every dialect runs, and this one's refusals in its SQL.
crate::sqlx_tests! {
    refuses_control_characters_in_event_type: "event_type" = "E'order\\npaid'";
    refuses_a_long_aggregate_type: "aggregate_type" = "repeat('a', 256)";
    refuses_control_characters_in_aggregate_id: "aggregate_id" = "E'42\\t'";
    refuses_a_long_tenant_id: "tenant_id" = "repeat('t', 256)";
    refuses_a_payload_over_one_mebibyte: "payload" = "convert_to(repeat('a', 1048577), 'UTF8')";
    refuses_more_than_64_headers: "headers" = "(SELECT jsonb_object_agg('h' || g, 'v') FROM generate_series(1, 65) g)";
    refuses_header_values_over_8_kib: "headers" = "jsonb_build_object('h', repeat('v', 8193))";
}

/// One statement enqueues: defaults filled, keyed rows numbered in commit order, and the
/// wakeup reaches a listener only once the transaction commits (never on rollback).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_enqueue_function_fills_defaults_and_wakes_relays_after_commit() {
    let h = PgHarness::new().await;
    let pool = h.outbox.pool();
    let enqueue = h
        .outbox
        .names()
        .render(outbox_sql::Dialect::Postgres, "{outbox_fn:enqueue}");
    let label = h.table();
    let mut listener = sqlx::postgres::PgListener::connect_with(pool)
        .await
        .unwrap();
    listener.listen("outbox_wakeup").await.unwrap();
    let ours = |n: &sqlx::postgres::PgNotification| n.payload() == label;

    let mut tx = pool.begin().await.unwrap();
    let first: uuid::Uuid = sqlx::query_scalar(&format!(
        "SELECT {enqueue}('orders', 'order.paid', '\\x7b7d', partition_key => 'order-1')"
    ))
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    let early = tokio::time::timeout(Duration::from_millis(300), async {
        loop {
            let n = listener.recv().await.unwrap();
            if ours(&n) {
                return n;
            }
        }
    })
    .await;
    assert!(early.is_err(), "no wakeup before COMMIT");
    tx.commit().await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), async {
        while !ours(&listener.recv().await.unwrap()) {}
    })
    .await
    .expect("the wakeup after COMMIT, within 10 s");

    let mut tx = pool.begin().await.unwrap();
    sqlx::query(&format!(
        "SELECT {enqueue}('orders', 'order.paid', '\\x7b7d')"
    ))
    .execute(&mut *tx)
    .await
    .unwrap();
    tx.rollback().await.unwrap();
    let second: uuid::Uuid = sqlx::query_scalar(&format!(
        "SELECT {enqueue}('orders', 'order.shipped', '\\x7b7d', 'order-1', headers => '{{\"x-trace\": \"t1\"}}')"
    ))
    .fetch_one(pool)
    .await
    .unwrap();

    let rows: Vec<(uuid::Uuid, String, String, Option<i64>)> = sqlx::query_as(&format!(
        "SELECT id, idempotency_key, content_type, seq FROM {label} ORDER BY seq"
    ))
    .fetch_all(pool)
    .await
    .unwrap();
    assert_eq!(
        rows,
        vec![
            (
                first,
                first.to_string(),
                "application/json".to_owned(),
                Some(1)
            ),
            (
                second,
                second.to_string(),
                "application/json".to_owned(),
                Some(2)
            ),
        ],
        "the rolled-back call left nothing; keyed rows numbered 1, 2"
    );
    assert!(first < second, "ids are time-ordered");
}

/// The SQL `<outbox>_key(namespace, parts...)` equals the Rust `deterministic_key`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sql_deterministic_key_equals_the_rust_one() {
    let h = PgHarness::new().await;
    let key = h
        .outbox
        .names()
        .render(outbox_sql::Dialect::Postgres, "{outbox_fn:key}");
    let sql = format!("SELECT {key}($1, VARIADIC $2::text[])");
    for (namespace, parts) in common::random_key_inputs(1000) {
        let from_sql: uuid::Uuid = sqlx::query_scalar(&sql)
            .bind(namespace)
            .bind(&parts)
            .fetch_one(h.outbox.pool())
            .await
            .unwrap();
        let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
        assert_eq!(
            from_sql,
            outbox_engine::deterministic_key(namespace, &parts),
            "{namespace} {parts:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_database_costs_the_relay_a_lease_not_its_pool() {
    let url = common::url(URL_VAR, DEFAULT_URL);
    let table = common::fresh_table("outbox_silent");
    let direct = PgOutbox::with_names(pool().await, TableNames::default().outbox(&table).unwrap());
    direct.migrate().await.expect("migrate");
    let mut tx = direct.pool().begin().await.unwrap();
    direct
        .enqueue(&mut tx, &common::message("orders", 1))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let (settings, proxy) = common::behind_proxy(&url, &table).await;
    let store = (outbox_sqlx::POSTGRES.connect)(&settings)
        .await
        .expect("the driver opens the store through the proxy");
    let mut lock = direct.pool().begin().await.unwrap();
    sqlx::query(&format!("LOCK TABLE \"{table}\" IN ACCESS EXCLUSIVE MODE"))
        .execute(&mut *lock)
        .await
        .unwrap();
    let unlock = async move { lock.commit().await.unwrap() };
    let silence = async {
        proxy.set(Net::Silence);
        unlock.await;
    };
    store_suite::silent_database_costs_a_lease_not_the_pool(store, silence, || {
        proxy.set(Net::Pass);
    })
    .await;
}
