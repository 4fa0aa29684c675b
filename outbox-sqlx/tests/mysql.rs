//! The MySQL / MariaDB store against a real server.
#![cfg(feature = "mysql")]

mod common;

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use outbox_engine::testkit::{RecordingSink, StoreHarness, inbox_suite, store_suite};
use outbox_engine::{
    ClaimRequest, Completion, DeadLetterFilter, DeadLetters, NewMessage, Relay, Store, StoreError,
    StoreStats,
};
use outbox_sql::Dialect;
use outbox_sqlx::mysql::{MySqlInbox, MySqlOutbox};
use outbox_sqlx::{PublishedRows, TableNames};
use outbox_test_support::proxy::Net;
use sqlx::MySqlPool;
use sqlx::mysql::MySqlPoolOptions;

const URL_VAR: &str = "OUTBOX_TEST_MYSQL_URL";
const DEFAULT_URL: &str = "mysql://root@127.0.0.1:3306/test";
const BUSINESS_TABLE: &str = "CREATE TABLE {table} (id BIGINT PRIMARY KEY) ENGINE = InnoDB";
const BUSINESS_INSERT: &str = "INSERT INTO {table} (id) VALUES (?)";

async fn pool() -> MySqlPool {
    let url = common::url(URL_VAR, DEFAULT_URL);
    match MySqlPoolOptions::new()
        .max_connections(16)
        .acquire_timeout(Duration::from_secs(10))
        .connect(&url)
        .await
    {
        Ok(pool) => pool,
        Err(e) => common::no_server("MySQL/MariaDB", URL_VAR, &url, e),
    }
}

/// Drops `tables` (rendered, quoted names) and forgets their migration records.
async fn drop_tables(pool: &MySqlPool, tables: &[(String, String)]) {
    for (quoted, name) in tables {
        sqlx::query(&format!("DROP TABLE IF EXISTS {quoted}"))
            .execute(pool)
            .await
            .unwrap_or_else(|e| panic!("drop {quoted}: {e}"));
        // The writers' routines of an outbox table (004_writers) outlive its DROP TABLE.
        let table = outbox_sql::Ident::parse(&format!("\"{}\"", name.replace('"', "\"\"")))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let derived = |suffix: &str| table.derived(suffix).name().to_owned();
        let routines: Vec<(String, String, String)> = sqlx::query_as(
            "SELECT CAST(routine_type AS CHAR), CAST(routine_schema AS CHAR), CAST(routine_name AS CHAR) \
             FROM information_schema.routines WHERE routine_name IN (?, ?, ?)",
        )
        .bind(derived("_uuidv7"))
        .bind(derived("_enqueue"))
        .bind(derived("_key"))
        .fetch_all(pool)
        .await
        .unwrap();
        for (kind, schema, routine) in routines {
            let quote = |s: &str| format!("`{}`", s.replace('`', "``"));
            let (schema, routine) = (quote(&schema), quote(&routine));
            sqlx::query(&format!("DROP {kind} IF EXISTS {schema}.{routine}"))
                .execute(pool)
                .await
                .unwrap_or_else(|e| panic!("drop {kind} {routine}: {e}"));
        }
        sqlx::query("DELETE FROM outbox_migrations WHERE id LIKE CONCAT(?, '/%')")
            .bind(name)
            .execute(pool)
            .await
            .unwrap();
    }
}

fn outbox_table(names: &TableNames) -> (String, String) {
    (
        names.render(Dialect::MySql, "{outbox}"),
        names.outbox_name().name().to_owned(),
    )
}

/// The key counters next to an outbox table.
fn keys_table(names: &TableNames) -> (String, String) {
    (
        names.render(Dialect::MySql, "{outbox_keys}"),
        names.outbox_name().derived("_keys").name().to_owned(),
    )
}

fn inbox_table(names: &TableNames) -> (String, String) {
    (
        names.render(Dialect::MySql, "{inbox}"),
        names.inbox_name().name().to_owned(),
    )
}

/// Names for a fresh outbox table on `pool`, and the guard that drops it.
fn fresh_outbox(pool: &MySqlPool) -> (TableNames, Cleanup) {
    let names = TableNames::default()
        .outbox(&common::fresh_table("outbox"))
        .unwrap();
    let mut cleanup = Cleanup::new(pool);
    cleanup.outbox(&names);
    (names, cleanup)
}

/// Tables a test created, dropped when the guard goes (also when the test fails).
struct Cleanup {
    pool: MySqlPool,
    tables: Vec<(String, String)>,
}

impl Cleanup {
    fn new(pool: &MySqlPool) -> Self {
        Self {
            pool: pool.clone(),
            tables: Vec::new(),
        }
    }

    /// Adds an outbox table and its key counters.
    fn outbox(&mut self, names: &TableNames) {
        self.tables.push(outbox_table(names));
        self.tables.push(keys_table(names));
    }

    /// Adds a plain table name created by the test itself.
    fn table(&mut self, name: &str) {
        self.tables.push((format!("`{name}`"), name.to_owned()));
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let (pool, tables) = (self.pool.clone(), std::mem::take(&mut self.tables));
        // Runs on the multi-threaded test runtime, also while a failed test unwinds.
        tokio::task::block_in_place(|| {
            tokio::runtime::Handle::current().block_on(drop_tables(&pool, &tables));
        });
    }
}

/// A fresh outbox table on the test server, dropped with the harness.
struct MySqlHarness {
    outbox: MySqlOutbox,
    _cleanup: Cleanup,
}

impl MySqlHarness {
    async fn new() -> Self {
        Self::with_mode(PublishedRows::Keep).await
    }

    async fn with_mode(mode: PublishedRows) -> Self {
        let pool = pool().await;
        let (names, cleanup) = fresh_outbox(&pool);
        let outbox = MySqlOutbox::with_names(pool, names).published_rows(mode);
        outbox.migrate().await.expect("migrate");
        Self {
            outbox,
            _cleanup: cleanup,
        }
    }

    fn table(&self) -> String {
        outbox_table(self.outbox.names()).0
    }

    async fn rows(&self) -> i64 {
        sqlx::query_scalar(&format!("SELECT COUNT(*) FROM {}", self.table()))
            .fetch_one(self.outbox.pool())
            .await
            .unwrap()
    }

    /// The rows per destination and status.
    async fn by_status(&self) -> Vec<(String, String, i64)> {
        let sql = format!(
            "SELECT CAST(destination AS CHAR), CAST(status AS CHAR), COUNT(*) FROM {} \
             GROUP BY destination, status",
            self.table()
        );
        sqlx::query_as(&sql)
            .fetch_all(self.outbox.pool())
            .await
            .unwrap()
    }
}

/// A fresh outbox table holding only the schema's first two migrations, as an older
/// release left it, for the shared tests ([`sqlx_tests!`]).
async fn older_harness() -> MySqlHarness {
    let pool = pool().await;
    let (names, cleanup) = fresh_outbox(&pool);
    common::older_table(&pool, Dialect::MySql, &names, 2).await;
    MySqlHarness {
        outbox: MySqlOutbox::with_names(pool, names),
        _cleanup: cleanup,
    }
}

/// A fresh outbox table, for the shared tests ([`sqlx_tests!`]).
async fn harness(mode: PublishedRows) -> MySqlHarness {
    MySqlHarness::with_mode(mode).await
}

impl StoreHarness for MySqlHarness {
    type Store = MySqlOutbox;

    fn store(&self) -> &MySqlOutbox {
        &self.outbox
    }

    async fn enqueue(&self, messages: Vec<NewMessage>) -> Result<(), StoreError> {
        let mut tx = self.outbox.pool().begin().await.unwrap();
        self.outbox.enqueue_all(&mut tx, &messages).await?;
        tx.commit().await.unwrap();
        Ok(())
    }

    async fn advance(&self, by: Duration) {
        let us = i64::try_from(by.as_micros()).unwrap();
        let sql = format!(
            "UPDATE {} SET created_at = created_at - INTERVAL ? MICROSECOND, \
             available_at = available_at - INTERVAL ? MICROSECOND, \
             lease_until = lease_until - INTERVAL ? MICROSECOND, \
             published_at = published_at - INTERVAL ? MICROSECOND, \
             dead_at = dead_at - INTERVAL ? MICROSECOND",
            self.table()
        );
        sqlx::query(&sql)
            .bind(us)
            .bind(us)
            .bind(us)
            .bind(us)
            .bind(us)
            .execute(self.outbox.pool())
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_passes_the_store_suite() {
    store_suite::run_all(MySqlHarness::new).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_passes_the_store_and_ordering_suites_in_delete_mode() {
    let h = || MySqlHarness::with_mode(PublishedRows::Delete);
    store_suite::run_all(h).await;
    store_suite::run_ordering(h).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_enqueue_and_relay_deliver_with_all_fields() {
    common::delivers_every_field(&MySqlHarness::new().await).await;
}

/// InnoDB may answer concurrent inserts of one key with a deadlock; the suite's
/// consumers then retry the whole delivery transaction, as `MySqlInbox::record`
/// documents.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_inbox_passes_the_inbox_suite() {
    let pool = pool().await;
    inbox_suite::run_all(|| async {
        let names = TableNames::default()
            .inbox(&common::fresh_table("inbox"))
            .unwrap();
        let mut cleanup = Cleanup::new(&pool);
        cleanup.tables.push(inbox_table(&names));
        let inbox = MySqlInbox::with_names(names.clone());
        inbox.migrate(&pool).await.unwrap();
        inbox.migrate(&pool).await.expect("migrating twice is fine");
        common::SqlxInbox {
            pool: pool.clone(),
            inbox,
            begin: None,
            age: names.render(
                Dialect::MySql,
                "UPDATE {inbox} SET received_at = received_at - INTERVAL ? SECOND",
            ),
            cleanup: Some(Box::new(cleanup)),
        }
    })
    .await;
}

/// Hostile names are either rejected or used exactly as quoted; a canary table survives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_identifiers_are_rejected_or_quoted_exactly() {
    let pool = pool().await;
    let canary = common::fresh_table("canary");
    let mut cleanup = Cleanup::new(&pool);
    cleanup.table(&canary);
    let drop_canary = format!("`; DROP TABLE {canary}; -- ");
    let created = common::hostile_identifiers(common::Hostile {
        pool: &pool,
        canary: &canary,
        create_canary: "CREATE TABLE {canary} (x INT) ENGINE = InnoDB",
        fragments: &["#", "``", "?", &drop_canary, "ß", "VALUES ,", "@0022", "/", ".", "X"],
        tries: 900,
        exists: "SELECT COUNT(*) FROM information_schema.tables \
                 WHERE table_schema = DATABASE() AND CAST(table_name AS BINARY) = CAST(? AS BINARY)",
        store: &|names| MySqlOutbox::with_names(pool.clone(), names),
        enqueue: &|outbox, conn, message| Box::pin(async move { outbox.enqueue(conn, &message).await }),
    })
    .await;
    for names in &created {
        cleanup.outbox(names);
    }
    let applied: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM outbox_migrations WHERE id = CONCAT(?, '/001_outbox')",
    )
    .bind(&canary)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(applied, 0, "the failed migration was not recorded");
    let canary_keys: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM information_schema.tables \
         WHERE table_schema = DATABASE() AND table_name = CONCAT(?, '_keys')",
    )
    .bind(&canary)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(canary_keys, 0, "nothing was created next to the canary");
    let created: Vec<_> = cleanup.tables.drain(1..).collect();
    drop_tables(&pool, &created).await;
    for (_, name) in &created {
        let left: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM information_schema.tables \
             WHERE table_schema = DATABASE() AND CAST(table_name AS BINARY) = CAST(? AS BINARY)",
        )
        .bind(name)
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(left, 0, "{name:?} dropped");
    }
}

/// Values at the edges of what the columns hold are clamped or cut, never an error that
/// would wedge a relay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extreme_values_are_clamped_not_fatal() {
    let h = MySqlHarness::new().await;
    let far = NewMessage::builder("orders", "far")
        .json(&1)
        .available_at(chrono::DateTime::<chrono::Utc>::MAX_UTC)
        .build()
        .unwrap();
    let forever = NewMessage::builder("orders", "forever")
        .json(&1)
        .delay(Duration::MAX)
        .build()
        .unwrap();
    let past = NewMessage::builder("orders", "past")
        .json(&1)
        .available_at(chrono::DateTime::<chrono::Utc>::MIN_UTC)
        .build()
        .unwrap();
    let now: Vec<NewMessage> = (0..3).map(|n| common::message("orders", n)).collect();
    let mut batch = vec![far, forever, past.clone()];
    batch.extend(now.clone());
    h.enqueue(batch).await.unwrap();
    let owner = "relay-".repeat(100);
    let claim = h
        .outbox
        .claim(&ClaimRequest::new(owner, 10, Duration::MAX))
        .await
        .unwrap();
    let mut expected: Vec<_> = now.iter().map(NewMessage::id).collect();
    expected.push(past.id());
    expected.sort();
    assert_eq!(
        claim.messages.iter().map(|m| m.id).collect::<Vec<_>>(),
        expected,
        "due rows only; the far future waits"
    );
    let long_reason = "é".repeat(40_000); // 80,000 bytes
    let report = h
        .outbox
        .complete(
            claim.lease.token,
            &[
                Completion::retry(expected[0], Duration::MAX, "later"),
                Completion::dead(expected[1], long_reason.clone()),
                Completion::published(expected[2]),
                Completion::published(expected[2]),
            ],
        )
        .await
        .unwrap();
    assert_eq!(report.applied, 3);
    assert_eq!(report.stale, vec![expected[2]], "a repeated id counts once");
    let dead = h
        .outbox
        .list_dead(&DeadLetterFilter::all(), 10)
        .await
        .unwrap();
    assert_eq!(dead.len(), 1);
    assert!(dead[0].reason.len() <= 65_535 && long_reason.starts_with(&dead[0].reason));
    assert!(dead[0].reason.len() > 65_000);
    let nothing = h
        .outbox
        .claim(&ClaimRequest::new("r", 10, Duration::from_secs(1)))
        .await
        .unwrap();
    assert!(
        nothing.messages.is_empty(),
        "the retried row is far in the future"
    );
    let none = h
        .outbox
        .claim(&ClaimRequest::new("r", 10, Duration::from_secs(1)).destinations(vec![]))
        .await
        .unwrap();
    assert!(none.messages.is_empty());
    let release = h
        .outbox
        .release(claim.lease.token, &[expected[3]])
        .await
        .unwrap();
    assert_eq!(release.applied, 1);
}

/// Many relays migrate at once: one creates, the others wait on the lock and see it done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_migrations_agree() {
    let pool = pool().await;
    let (names, _cleanup) = fresh_outbox(&pool);
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..6 {
        let outbox = MySqlOutbox::with_names(pool.clone(), names.clone());
        tasks.spawn(async move { outbox.migrate().await });
    }
    while let Some(result) = tasks.join_next().await {
        result.unwrap().expect("migrate");
    }
    let recorded: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM outbox_migrations WHERE id = CONCAT(?, '/001_outbox')",
    )
    .bind(names.outbox_name().name())
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(recorded, 1);
}

/// `enqueue_all` cuts huge batches into several statements on the caller's connection:
/// they still commit or roll back together with the caller's transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_all_chunks_large_batches_in_the_callers_transaction() {
    let h = MySqlHarness::new().await;
    let mut rng = fastrand::Rng::with_seed(7);
    let big: Vec<NewMessage> = (0..20)
        .map(|_| {
            let payload: Vec<u8> = std::iter::repeat_with(|| rng.u8(..))
                .take(1024 * 1024)
                .collect();
            NewMessage::builder("blobs", "blob")
                .bytes(payload, "application/octet-stream")
                .build()
                .unwrap()
        })
        .collect();
    let many: Vec<NewMessage> = (0..1203).map(|n| common::message("many", n)).collect();

    let mut tx = h.outbox.pool().begin().await.unwrap();
    assert_eq!(h.outbox.enqueue_all(&mut tx, &many).await.unwrap(), 1203);
    assert_eq!(h.outbox.enqueue_all(&mut tx, &big).await.unwrap(), 20);
    tx.rollback().await.unwrap();
    assert_eq!(
        h.rows().await,
        0,
        "a rolled-back transaction leaves nothing"
    );

    let mut tx = h.outbox.pool().begin().await.unwrap();
    h.outbox.enqueue_all(&mut tx, &many).await.unwrap();
    h.outbox.enqueue_all(&mut tx, &big).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(h.rows().await, 1223);

    let sink = RecordingSink::new();
    let relay = Relay::builder(h.outbox.clone())
        .route("blobs", sink.clone())
        .route("many", RecordingSink::new())
        .batch_size(500)
        .build()
        .unwrap();
    assert_eq!(relay.drain().await.unwrap().published, 1223);
    let got = sink.messages();
    assert_eq!(got.len(), 20);
    for (sent, received) in big.iter().zip(&got) {
        assert_eq!(received.id, sent.id(), "claimed in enqueue order");
        assert!(received.payload == sent.payload(), "1 MiB payload intact");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_passes_the_ordering_suite() {
    store_suite::run_ordering(MySqlHarness::new).await;
}

fn keyed(key: &str, n: u64) -> NewMessage {
    NewMessage::builder("orders", "order.changed")
        .json(&serde_json::json!({ "key": key, "n": n }))
        .partition_key(key)
        .build()
        .unwrap()
}

fn per_key(halt: bool) -> outbox_engine::MessageOrder {
    outbox_engine::MessageOrder::PerKey(if halt {
        outbox_engine::DeadHead::Halt
    } else {
        outbox_engine::DeadHead::Skip
    })
}

/// Starts a task that opens a transaction, enqueues `message` and commits; the flag turns
/// true once the enqueue returned.
fn enqueue_in_task(
    outbox: &MySqlOutbox,
    message: NewMessage,
) -> (
    Arc<std::sync::atomic::AtomicBool>,
    tokio::task::JoinHandle<()>,
) {
    let enqueued = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (outbox, flag) = (outbox.clone(), enqueued.clone());
    let task = tokio::spawn(async move {
        let mut tx = outbox.pool().begin().await.unwrap();
        outbox.enqueue(&mut tx, &message).await.unwrap();
        flag.store(true, Ordering::SeqCst);
        tx.commit().await.unwrap();
    });
    (enqueued, task)
}

/// Transaction A enqueues for key K; B, enqueueing for K too, waits on the key's counter
/// row until A commits, and so is numbered after it, although B's message was built (and
/// its id assigned) first. A per-key relay publishes A, then B.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_key_writers_wait_and_publish_in_commit_order() {
    let h = MySqlHarness::new().await;
    let pool = h.outbox.pool();
    let b = keyed("order-7", 2);
    let a = keyed("order-7", 1);
    assert!(b.id() < a.id(), "B's id sorts first");

    let mut tx_a = pool.begin().await.unwrap();
    h.outbox.enqueue(&mut tx_a, &a).await.unwrap();
    let (b_enqueued, b_task) = enqueue_in_task(&h.outbox, b.clone());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !b_enqueued.load(Ordering::SeqCst),
        "B waits while A is open"
    );
    tx_a.commit().await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), b_task)
        .await
        .expect("B finishes once A committed")
        .unwrap();

    let seqs: Vec<(String, i64)> = sqlx::query_as(&format!(
        "SELECT CAST(id AS CHAR), seq FROM {} ORDER BY seq",
        h.table()
    ))
    .fetch_all(pool)
    .await
    .unwrap();
    assert_eq!(
        seqs,
        vec![(a.id().to_string(), 1), (b.id().to_string(), 2)],
        "numbered in commit order"
    );

    let sink = RecordingSink::new();
    let relay = Relay::builder(h.outbox.clone())
        .route("orders", sink.clone())
        .ordering(per_key(false))
        .build()
        .unwrap();
    relay.drain().await.unwrap();
    let order: Vec<_> = sink.messages().iter().map(|m| m.id).collect();
    assert_eq!(
        order,
        vec![a.id(), b.id()],
        "published in commit order, not id order"
    );
}

/// While A holds one key, writers of other keys — new keys next to it, existing ones,
/// messages without a key — enqueue and commit without waiting. The application's
/// transactions run at the server default (REPEATABLE READ), where gap locks could make
/// neighbouring new keys wait; the counter is the table's primary key, so they do not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn different_keys_do_not_block_each_other_at_enqueue() {
    let h = MySqlHarness::new().await;
    let pool = h.outbox.pool();
    // Existing counters: k1, k3, k5.
    h.enqueue(vec![keyed("k1", 0), keyed("k3", 0), keyed("k5", 0)])
        .await
        .unwrap();
    let cases: [(&str, Option<&str>); 7] = [
        ("k3", Some("k2")),  // existing held, new key in the gap before it
        ("k3", Some("k4")),  // existing held, new key in the gap after it
        ("k3", Some("k1")),  // existing held, another existing key
        ("k6", Some("k7")),  // new held, new key after it
        ("k6", Some("k55")), // new held, new key before it
        ("k9", Some("k5")),  // new held, existing key
        ("k1", None),        // no key
    ];
    for (held, other) in cases {
        let mut tx_a = pool.begin().await.unwrap();
        h.outbox.enqueue(&mut tx_a, &keyed(held, 1)).await.unwrap();
        let b = match other {
            Some(key) => keyed(key, 1),
            None => common::message("orders", 1),
        };
        let mut tx_b = pool.begin().await.unwrap();
        tokio::time::timeout(Duration::from_secs(3), async {
            h.outbox.enqueue(&mut tx_b, &b).await.unwrap();
            tx_b.commit().await.unwrap();
        })
        .await
        .unwrap_or_else(|_| panic!("B ({other:?}) waited for A ({held})"));
        tx_a.commit().await.unwrap();
    }
    let numbered: Vec<(String, i64)> = sqlx::query_as(&format!(
        "SELECT CAST(partition_key AS CHAR), MAX(seq) FROM {} WHERE partition_key IS NOT NULL \
         GROUP BY partition_key ORDER BY partition_key",
        h.table()
    ))
    .fetch_all(pool)
    .await
    .unwrap();
    let expected: Vec<(String, i64)> = [
        ("k1", 3),
        ("k2", 1),
        ("k3", 4),
        ("k4", 1),
        ("k5", 2),
        ("k55", 1),
        ("k6", 2),
        ("k7", 1),
        ("k9", 1),
    ]
    .iter()
    .map(|(k, n)| ((*k).to_owned(), *n))
    .collect();
    assert_eq!(numbered, expected, "each key counts on its own");
}

/// A head that another relay has locked mid-claim is skipped by the outer scan but still
/// seen by the head check, so the key's next message is not claimed past it; the claim
/// does not wait for that lock either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordered_claim_sees_a_head_another_relay_is_claiming() {
    let h = MySqlHarness::new().await;
    let (head, next, other) = (keyed("k", 1), keyed("k", 2), keyed("j", 1));
    h.enqueue(vec![head.clone(), next.clone(), other.clone()])
        .await
        .unwrap();
    for halt in [false, true] {
        let mut locker = h
            .outbox
            .pool()
            .begin_with("SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION")
            .await
            .unwrap();
        sqlx::query(&format!(
            "SELECT id FROM {} WHERE id = ? FOR UPDATE",
            h.table()
        ))
        .bind(head.id().to_string())
        .fetch_all(&mut *locker)
        .await
        .unwrap();
        let request = ClaimRequest::new("r", 10, Duration::from_secs(30)).ordering(per_key(halt));
        let claim = tokio::time::timeout(Duration::from_secs(3), h.outbox.claim(&request))
            .await
            .expect("the claim does not wait for the locked head")
            .unwrap();
        let got: Vec<_> = claim.messages.iter().map(|m| m.id).collect();
        assert_eq!(
            got,
            vec![other.id()],
            "k's head is skipped, and k's next is held back (halt: {halt})"
        );
        locker.rollback().await.unwrap();
        h.outbox.release(claim.lease.token, &got).await.unwrap();
    }
    let claim = h
        .outbox
        .claim(&ClaimRequest::new("r", 10, Duration::from_secs(30)).ordering(per_key(false)))
        .await
        .unwrap();
    let mut got: Vec<_> = claim.messages.iter().map(|m| m.id).collect();
    got.sort();
    let mut expected = vec![head.id(), other.id()];
    expected.sort();
    assert_eq!(got, expected, "once unlocked, the head is claimed");
}

/// The ordered claim's head check and the halted-keys count read the head index, by key,
/// destination and status, not the key's whole history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordered_statements_use_the_head_index() {
    let h = MySqlHarness::new().await;
    // A few keys with a long published history and some dead and pending rows.
    let messages: Vec<NewMessage> = (0..400).map(|n| keyed(&format!("k{}", n % 4), n)).collect();
    h.enqueue(messages.clone()).await.unwrap();
    sqlx::query(&format!(
        "UPDATE {} SET status = 'published', available_at = NULL, published_at = UTC_TIMESTAMP(6) \
         WHERE seq <= 90",
        h.table()
    ))
    .execute(h.outbox.pool())
    .await
    .unwrap();
    sqlx::query(&format!(
        "UPDATE {} SET status = 'dead', available_at = NULL, dead_at = UTC_TIMESTAMP(6) \
         WHERE seq = 91",
        h.table()
    ))
    .execute(h.outbox.pool())
    .await
    .unwrap();
    sqlx::query(&format!("ANALYZE TABLE {}", h.table()))
        .execute(h.outbox.pool())
        .await
        .unwrap();
    let sql = outbox_sql::mysql::Statements::new(h.outbox.names());
    let head_index = h.outbox.names().outbox_name().derived("_head_idx");
    let ids: Vec<String> = messages[380..].iter().map(|m| m.id().to_string()).collect();
    for (statement, binds) in [
        (
            sql.claim_select_ordered(0, false, false),
            vec!["10".to_owned()],
        ),
        (
            sql.claim_select_ordered(2, true, true),
            ["orders", "x", "9999-01-01", "9999-01-01", "f", "10"]
                .map(str::to_owned)
                .to_vec(),
        ),
        (sql.heads(ids.len(), false), ids.clone()),
        (sql.heads(ids.len(), true), ids.clone()),
        (sql.shared.halted_keys.clone(), Vec::new()),
    ] {
        let explain = format!("EXPLAIN {statement}");
        let mut query = sqlx::query(&explain).persistent(false);
        for value in binds {
            query = query.bind(value);
        }
        let plan = query.fetch_all(h.outbox.pool()).await.unwrap();
        let column = |row: &sqlx::mysql::MySqlRow, name: &str| {
            sqlx::Row::try_get_unchecked::<Option<String>, _>(row, name).unwrap()
        };
        let subquery: Vec<(Option<String>, Option<String>)> = plan
            .iter()
            .filter(|row| column(row, "table").as_deref() == Some("p"))
            .map(|row| (column(row, "key"), column(row, "ref")))
            .collect();
        assert_eq!(
            subquery.len(),
            statement.matches("LIMIT 1").count(),
            "one subquery step per status: {statement}\n{subquery:?}"
        );
        for (key, reference) in &subquery {
            assert!(
                key.as_deref() == Some(head_index.name())
                    && reference.as_deref().is_some_and(|r| {
                        r.contains(".d.partition_key,") && r.ends_with(".d.destination,const")
                    }),
                "by key, destination and status: {statement}\n{subquery:?}"
            );
        }
    }
}

/// An ordered claim whose earliest due rows all wait behind leased heads reads a window
/// of them, not the whole backlog (decision 0034): the free heads and the unkeyed rows
/// past the window come from their own indexes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordered_claims_read_a_window_not_the_held_back_backlog() {
    let h = MySqlHarness::new().await;
    h.enqueue(
        (0..500)
            .flat_map(|n| (0..20).map(move |key| keyed(&format!("k{key}"), n)))
            .collect(),
    )
    .await
    .unwrap();
    let ordered =
        |batch| ClaimRequest::new("relay", batch, Duration::from_secs(60)).ordering(per_key(true));
    let held = h.outbox.claim(&ordered(20)).await.unwrap();
    assert_eq!(held.messages.len(), 20, "one head per key");
    let free = vec![
        keyed("k20", 0),
        keyed("k21", 0),
        common::message("orders", 0),
    ];
    h.enqueue(free.clone()).await.unwrap();
    // Statistics as InnoDB keeps them for a table that has grown (it recomputes them in
    // the background); without them the optimizer may not choose the loose index scan.
    sqlx::query(&format!("ANALYZE TABLE {}", h.table()))
        .execute(h.outbox.pool())
        .await
        .unwrap();

    // One connection, so its session counters count the claim's reads alone.
    let url = common::url(URL_VAR, DEFAULT_URL);
    let pool = MySqlPoolOptions::new()
        .max_connections(1)
        .connect(&url)
        .await
        .unwrap();
    let single = MySqlOutbox::with_names(pool.clone(), h.outbox.names().clone());
    let index_reads = || async {
        let counters: Vec<(String, String)> =
            sqlx::query_as("SHOW SESSION STATUS LIKE 'Handler_read%'")
                .fetch_all(&pool)
                .await
                .unwrap();
        counters
            .iter()
            .filter(|(name, _)| {
                [
                    "Handler_read_key",
                    "Handler_read_next",
                    "Handler_read_first",
                ]
                .contains(&name.as_str())
            })
            .map(|(_, value)| value.parse::<u64>().unwrap())
            .sum::<u64>()
    };
    let mut expected: Vec<_> = free.iter().map(NewMessage::id).collect();
    expected.sort();
    // The first claim finds the two free heads and the unkeyed row past the window; the
    // second, with every head held, finds nothing. Neither reads the backlog (the former
    // claim tested each waiting row, with a dive into the key index per holding status).
    for (round, expected) in [expected, Vec::new()].into_iter().enumerate() {
        let before = index_reads().await;
        let claim = single.claim(&ordered(10)).await.unwrap();
        let read = index_reads().await - before;
        let mut got: Vec<_> = claim.messages.iter().map(|m| m.id).collect();
        got.sort();
        assert_eq!(got, expected, "claim {round}");
        eprintln!("claim {round}: {read} index reads");
        assert!(
            read < 1_000,
            "claim {round} made {read} index reads; 9,980 rows wait behind the held heads, its window is 40"
        );
    }
}

/// Batches number each key with one counter bump, in slice order; a rolled-back batch
/// gives its numbers back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_number_keys_in_slice_order() {
    let h = MySqlHarness::new().await;
    let batch = vec![
        keyed("b", 1),
        keyed("a", 1),
        common::message("orders", 0),
        keyed("b", 2),
        keyed("a", 2),
        keyed("b", 3),
    ];
    let mut tx = h.outbox.pool().begin().await.unwrap();
    h.outbox.enqueue_all(&mut tx, &batch).await.unwrap();
    tx.rollback().await.unwrap();
    h.enqueue(batch.clone()).await.unwrap();
    let got: Vec<(String, Option<i64>)> =
        sqlx::query_as(&format!("SELECT CAST(id AS CHAR), seq FROM {}", h.table()))
            .fetch_all(h.outbox.pool())
            .await
            .unwrap();
    let seqs: Vec<_> = batch
        .iter()
        .map(|m| {
            got.iter()
                .find(|(id, _)| *id == m.id().to_string())
                .unwrap()
                .1
        })
        .collect();
    assert_eq!(
        seqs,
        vec![Some(1), Some(1), None, Some(2), Some(2), Some(3)]
    );
}

/// Halted keys are counted per destination of the dead row, once per key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn halted_keys_count_each_key_once() {
    let h = MySqlHarness::new().await;
    let messages: Vec<NewMessage> = (0..3)
        .map(|n| keyed("k", n))
        .chain([keyed("j", 0)])
        .collect();
    h.enqueue(messages.clone()).await.unwrap();
    let request = ClaimRequest::new("r", 10, Duration::from_secs(30)).ordering(per_key(false));
    for _ in 0..2 {
        // Kill k's first two and j's only message.
        let claim = h.outbox.claim(&request).await.unwrap();
        let deaths: Vec<_> = claim
            .messages
            .iter()
            .map(|m| Completion::dead(m.id, "400"))
            .collect();
        h.outbox.complete(claim.lease.token, &deaths).await.unwrap();
    }
    let stats = h.outbox.stats().await.unwrap();
    let orders = stats.destination("orders").unwrap();
    assert_eq!((orders.dead, orders.pending), (3, 1));
    assert_eq!(
        orders.halted_keys, 1,
        "k is halted once; j has nothing behind it"
    );
}

/// Concurrent writers (some rolling back, random commit delays) and several per-key relays
/// with a flaky sink: every key is received in commit order. Each transaction bumps its
/// key's version row before enqueueing, as a business aggregate would, so version order is
/// commit order, independent of the outbox's own numbering; ids are taken before the
/// transaction, so id order differs from it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writers_and_relays_keep_every_key_in_commit_order() {
    use outbox_engine::testkit::FlakySink;

    const KEYS: usize = 40;
    const PER_KEY: u64 = 10;
    const PRODUCERS: usize = 4;
    let h = MySqlHarness::new().await;
    let pool = h.outbox.pool().clone();
    let versions = common::fresh_table("versions");
    let mut cleanup = Cleanup::new(&pool);
    cleanup.table(&versions);
    sqlx::query(&format!(
        "CREATE TABLE {versions} (k VARCHAR(64) PRIMARY KEY, v BIGINT NOT NULL) ENGINE = InnoDB"
    ))
    .execute(&pool)
    .await
    .unwrap();

    let sink = RecordingSink::new();
    let flaky = FlakySink::new(sink.clone()).retryable_rate(0.1).seed(5);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut relays = Vec::new();
    for r in 0..3 {
        let relay = Relay::builder(h.outbox.clone())
            .route("orders", flaky.clone())
            .owner(format!("relay-{r}"))
            .batch_size(16)
            .concurrency(2)
            .poll_interval(Duration::from_millis(5))
            .retry(common::backoff_ms(5, 20).max_attempts(1000))
            .ordering(per_key(r == 0))
            .build()
            .unwrap();
        let mut stop = stop_rx.clone();
        relays.push(tokio::spawn(relay.run(async move {
            let _ = stop.wait_for(|s| *s).await;
        })));
    }

    let mut producers = tokio::task::JoinSet::new();
    for p in 0..PRODUCERS {
        let (outbox, pool, versions) = (h.outbox.clone(), pool.clone(), versions.clone());
        producers.spawn(async move {
            let mut rng = fastrand::Rng::with_seed(p as u64);
            let mut committed = 0;
            while committed < KEYS * PER_KEY as usize / PRODUCERS {
                let key = format!("k{}", rng.usize(..KEYS));
                let id = keyed(&key, 0).id();
                let mut tx = pool.begin().await.unwrap();
                let bumped = sqlx::query(&format!(
                    "INSERT INTO {versions} (k, v) VALUES (?, LAST_INSERT_ID(1)) \
                     ON DUPLICATE KEY UPDATE v = LAST_INSERT_ID(v + 1)"
                ))
                .bind(&key)
                .execute(&mut *tx)
                .await;
                // InnoDB may pick this transaction as a deadlock's victim (two writers'
                // upserts on neighbouring keys); it rolled back, and a writer tries again.
                let v = match bumped {
                    Ok(done) => done.last_insert_id(),
                    Err(e) if is_deadlock(&e) => continue,
                    Err(e) => panic!("bump the key's version: {e}"),
                };
                if v > PER_KEY {
                    tx.rollback().await.unwrap();
                    continue;
                }
                let message = NewMessage::builder("orders", "order.changed")
                    .id(id)
                    .json(&serde_json::json!({ "key": key, "v": v }))
                    .partition_key(&key)
                    .build()
                    .unwrap();
                outbox.enqueue(&mut tx, &message).await.unwrap();
                tokio::time::sleep(Duration::from_micros(rng.u64(0..2000))).await;
                if rng.f64() < 0.2 {
                    tx.rollback().await.unwrap();
                } else {
                    tx.commit().await.unwrap();
                    committed += 1;
                }
            }
        });
    }
    while let Some(done) = producers.join_next().await {
        done.unwrap();
    }
    let total = KEYS as u64 * PER_KEY;
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let stats = h.outbox.stats().await.unwrap().total();
        if stats.backlog() == 0 && stats.published == total {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "relays drained everything: {stats:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop_tx.send(true).unwrap();
    for relay in relays {
        relay.await.unwrap();
    }

    let mut seen = HashSet::new();
    let mut per_key_received: std::collections::BTreeMap<String, Vec<u64>> = Default::default();
    for m in sink.messages() {
        if seen.insert(m.id) {
            let body: serde_json::Value = serde_json::from_slice(&m.payload).unwrap();
            per_key_received
                .entry(body["key"].as_str().unwrap().to_owned())
                .or_default()
                .push(body["v"].as_u64().unwrap());
        }
    }
    assert_eq!(seen.len() as u64, total, "every committed message received");
    for (key, received) in &per_key_received {
        let expected: Vec<u64> = (1..=PER_KEY).collect();
        assert_eq!(received, &expected, "key {key} received in commit order");
    }
    assert!(
        flaky.stats().retryable > 0,
        "the sink did fail some attempts"
    );
}

/// The ordered claim's head check reads one snapshot, opened early in its scan, while the
/// scan locks the newest committed rows. Here a head H and its successor R (scheduled in
/// the past, so it sorts at the end of the due range) both commit while a long claim scan
/// is under way: the scan reaches R, but H is not in its snapshot. The second check,
/// after the candidates are locked, must keep R back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_committed_during_the_claim_scan_still_holds_its_key() {
    let h = MySqlHarness::new().await;
    let pool = h.outbox.pool().clone();
    let table = h.table();
    // A long due range nobody may claim: key "blocker" behind a leased head.
    h.enqueue(vec![keyed("blocker", 0)]).await.unwrap();
    sqlx::query(&format!(
        "UPDATE {table} SET status = 'leased', lease_token = UUID(), \
         available_at = UTC_TIMESTAMP(6) + INTERVAL 1 HOUR"
    ))
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query(&format!(
        "INSERT INTO {table} (id, destination, event_type, partition_key, idempotency_key, payload, \
         content_type, headers, available_at, created_at, seq) \
         SELECT UUID(), 'orders', 'blocked', 'blocker', UUID(), '', 'text/plain', '{{}}', \
         UTC_TIMESTAMP(6) - INTERVAL 2 HOUR, UTC_TIMESTAMP(6), 2 FROM {table}"
    ))
    .execute(&pool)
    .await
    .unwrap();
    for _ in 0..17 {
        sqlx::query(&format!(
            "INSERT INTO {table} (id, destination, event_type, partition_key, idempotency_key, \
             payload, content_type, headers, available_at, created_at, seq) \
             SELECT UUID(), destination, event_type, partition_key, UUID(), payload, content_type, \
             headers, available_at, created_at, seq FROM {table} WHERE seq = 2"
        ))
        .execute(&pool)
        .await
        .unwrap();
    }
    // A batch whose window (four times it) spans the whole blocked range, so the walk
    // crosses all of it before it reaches R.
    let request = ClaimRequest::new("r", 1 << 16, Duration::from_secs(30)).ordering(per_key(false));
    let started = std::time::Instant::now();
    assert!(h.outbox.claim(&request).await.unwrap().messages.is_empty());
    let scan = started.elapsed();

    // An attempt is conclusive when the claim was still scanning after both commits;
    // try until three were, within bounds.
    let mut conclusive = 0;
    let trying = std::time::Instant::now();
    let mut attempts = 0;
    for attempt in 0..40u64 {
        if conclusive >= 3 || trying.elapsed() >= Duration::from_secs(60) {
            break;
        }
        attempts += 1;
        let key = format!("k{attempt}");
        let head = NewMessage::builder("orders", "head")
            .json(&attempt)
            .partition_key(&key)
            .delay(Duration::from_secs(3600))
            .build()
            .unwrap();
        let next = NewMessage::builder("orders", "next")
            .json(&attempt)
            .partition_key(&key)
            .available_at(chrono::Utc::now() - chrono::Duration::hours(1))
            .build()
            .unwrap();
        let claimer = {
            let (outbox, request) = (h.outbox.clone(), request.clone());
            tokio::spawn(async move {
                let claim = outbox.claim(&request).await.unwrap();
                (claim, std::time::Instant::now())
            })
        };
        tokio::time::sleep(scan / 5).await;
        h.enqueue(vec![head.clone()]).await.unwrap();
        h.enqueue(vec![next.clone()]).await.unwrap();
        let committed = std::time::Instant::now();
        let (claim, finished) = claimer.await.unwrap();
        let got: Vec<_> = claim.messages.iter().map(|m| m.id).collect();
        assert!(
            !got.contains(&next.id()),
            "R was claimed while its head H is pending (attempt {attempt}, scan {scan:?})"
        );
        if !got.is_empty() {
            h.outbox.release(claim.lease.token, &got).await.unwrap();
        }
        if finished > committed {
            conclusive += 1;
        }
        // Out of the way for the next attempt.
        sqlx::query(&format!(
            "UPDATE {table} SET status = 'published', available_at = NULL WHERE partition_key = ?"
        ))
        .bind(&key)
        .execute(&pool)
        .await
        .unwrap();
    }
    assert!(
        conclusive >= 3,
        "waited for 3 attempts whose claim scan ({scan:?}) outlasted the commits; \
         got {conclusive} in {attempts} attempts ({:?})",
        trying.elapsed()
    );
}

/// Inserts `rows` as another program would, in one transaction, straight into the table.
async fn insert_foreign(h: &MySqlHarness, rows: &[common::ForeignRow]) -> Result<(), sqlx::Error> {
    let mut tx = h.outbox.pool().begin().await?;
    for row in rows {
        sqlx::query(&format!(
            "INSERT INTO {} (id, destination, event_type, idempotency_key, payload, content_type, headers, available_at, created_at) \
             VALUES (?, 'orders', 'foreign.event', ?, X'7b7d', 'application/json', ?, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))",
            h.table()
        ))
        .bind(&row.id)
        .bind(&row.id)
        .bind(&row.headers)
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await
}

/// Drops the checks that refuse unreadable rows (the constraints of a new table and the
/// writers' trigger), as on a table created by an older version.
async fn drop_row_checks(h: &MySqlHarness) {
    let render = |t: &str| h.outbox.names().render(outbox_sql::Dialect::MySql, t);
    let mut statements = vec![render("DROP TRIGGER {outbox_trg:fill_trg}")];
    for check in ["{outbox_headers_check}", "{outbox_id_check}"] {
        statements.push(render(&format!(
            "ALTER TABLE {{outbox}} DROP CONSTRAINT {check}"
        )));
    }
    for statement in statements {
        sqlx::query(&statement)
            .execute(h.outbox.pool())
            .await
            .unwrap();
    }
}

/// The 200-row poison case on MySQL: rows whose headers are not a JSON object of strings
/// are dead-lettered one by one, naming the column; the rest of their batches is
/// published. The table refuses such rows, so the checks are dropped first, as on a table
/// created by an older version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreadable_rows_dead_letter_their_row_not_the_batch() {
    let h = MySqlHarness::new().await;
    drop_row_checks(&h).await;
    let rows = common::foreign_rows(200, &[(0, r#"{"x-n": 1}"#), (57, "[1,2]"), (150, "null")]);
    insert_foreign(&h, &rows).await.unwrap();
    let poisoned = [0, 57, 150].map(|i| rows[i].id.clone());
    common::unreadable_rows_are_dead_lettered_alone(h.outbox.clone(), 200, &poisoned, "headers")
        .await;

    let h = MySqlHarness::new().await;
    drop_row_checks(&h).await;
    let mut rows = common::foreign_rows(120, &[]);
    rows[5].id = rows[5].id.to_uppercase();
    rows[6].id = "order-42".to_owned();
    insert_foreign(&h, &rows).await.unwrap();
    let poisoned = [rows[5].id.clone(), rows[6].id.clone()];
    common::unreadable_rows_are_dead_lettered_alone(h.outbox.clone(), 120, &poisoned, "id").await;
}

/// A new table refuses what the relay could not read, naming the check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_table_refuses_unreadable_ids_and_headers() {
    let h = MySqlHarness::new().await;
    let insert = |rows: Vec<common::ForeignRow>| {
        let h = &h;
        async move { insert_foreign(h, &rows).await }
    };
    let bad = ["[1,2]", "null", "not json", r#""text""#];
    common::refuses_unreadable_rows(insert, &bad, "column headers", Some("column id")).await;
}

// ---- Writers in other languages (004_writers): defaults, checks, enqueue, key ----

/// Inserts one row for `orders` as a foreign writer would, with `column` set to the SQL
/// expression `value` and every other column left to the table.
async fn insert_with(h: &MySqlHarness, column: &str, value: &str) -> Result<(), sqlx::Error> {
    let sql = common::insert_sql(&h.table(), "'{}'", column, value);
    sqlx::query(&sql).execute(h.outbox.pool()).await.map(|_| ())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_with_only_destination_event_type_and_payload_is_delivered() {
    let h = MySqlHarness::new().await;
    insert_with(&h, "payload", "'{}'").await.unwrap();
    insert_with(&h, "payload", "X'7b7d'").await.unwrap();
    insert_with(&h, "available_at", "NULL").await.unwrap();
    insert_with(&h, "headers", "'{}'").await.unwrap();
    // NULL written explicitly (a driver's None) means the default too.
    for column in ["id", "idempotency_key", "content_type", "headers"] {
        insert_with(&h, column, "NULL").await.unwrap();
    }
    common::minimal_rows_are_delivered(h.outbox.clone(), 8).await;
}

/// Keyed rows a writer inserts without `seq` are numbered in commit order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_rows_written_without_seq_are_numbered() {
    let h = MySqlHarness::new().await;
    for key in ["a", "b", "a", "a", "b"] {
        insert_with(&h, "partition_key", &format!("'{key}'"))
            .await
            .unwrap();
    }
    let seqs: Vec<(String, i64)> = sqlx::query_as(&format!(
        "SELECT CAST(partition_key AS CHAR), seq FROM {} ORDER BY partition_key, seq",
        h.table()
    ))
    .fetch_all(h.outbox.pool())
    .await
    .unwrap();
    let want: Vec<(String, i64)> = [("a", 1), ("a", 2), ("a", 3), ("b", 1), ("b", 2)]
        .map(|(k, n)| (k.to_owned(), n))
        .into();
    assert_eq!(seqs, want);
}

// The tests every dialect runs, and this one's refusals in its SQL.
crate::sqlx_tests! {
    refuses_control_characters_in_event_type: "event_type" = "CONCAT('order', CHAR(10), 'paid')";
    refuses_a_long_aggregate_type: "aggregate_type" = "REPEAT('a', 256)";
    refuses_control_characters_in_aggregate_id: "aggregate_id" = "CONCAT('42', CHAR(9))";
    refuses_a_long_tenant_id: "tenant_id" = "REPEAT('t', 256)";
    refuses_a_payload_over_one_mebibyte: "payload" = "REPEAT('a', 1048577)";
    refuses_more_than_64_headers: "headers" = "(SELECT JSON_OBJECTAGG(CONCAT('h', seq), 'v') FROM seq_1_to_65)";
    refuses_header_values_over_8_kib: "headers" = "JSON_OBJECT('h', REPEAT('v', 8193))";
    refuses_an_id_that_is_not_a_lowercase_uuid: "id" = "'0190A0B1-0000-7000-8000-000000000000'";
}

/// One CALL enqueues: defaults filled, keyed rows numbered, the new id returned; a
/// rolled-back call leaves nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_enqueue_procedure_fills_defaults_and_numbers_keys() {
    let h = MySqlHarness::new().await;
    let pool = h.outbox.pool();
    let call = h
        .outbox
        .names()
        .render(Dialect::MySql, "CALL {outbox_fn:enqueue}(?, ?, ?, ?, ?, ?)");
    let enqueue = |event: &'static str, key: Option<&'static str>| {
        sqlx::query_scalar::<_, String>(&call)
            .bind("orders")
            .bind(event)
            .bind(b"{}".as_slice())
            .bind(key)
            .bind(None::<String>)
            .bind(None::<String>)
    };
    let first = enqueue("order.paid", Some("order-1"))
        .fetch_one(pool)
        .await
        .unwrap();
    let mut tx = pool.begin().await.unwrap();
    enqueue("order.lost", Some("order-1"))
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    let second = enqueue("order.shipped", Some("order-1"))
        .fetch_one(pool)
        .await
        .unwrap();
    let rows: Vec<(String, String, String, Option<i64>)> = sqlx::query_as(&format!(
        "SELECT CAST(id AS CHAR), CAST(idempotency_key AS CHAR), CAST(content_type AS CHAR), seq FROM {} ORDER BY seq",
        h.table()
    ))
    .fetch_all(pool)
    .await
    .unwrap();
    let json = "application/json".to_owned();
    assert_eq!(rows.len(), 2, "the rolled-back call left nothing: {rows:?}");
    assert_eq!(
        rows[0],
        (first.clone(), first.clone(), json.clone(), rows[0].3)
    );
    assert_eq!(rows[1], (second.clone(), second.clone(), json, rows[1].3));
    assert!(
        rows[0].3 < rows[1].3,
        "keyed rows numbered in commit order: {rows:?}"
    );
    assert!(first < second, "ids are time-ordered");
    let id: uuid::Uuid = first.parse().unwrap();
    assert_eq!(id.get_version_num(), 7);
}

/// The SQL `<outbox>_key(namespace, JSON_ARRAY(parts...))` equals the Rust
/// `deterministic_key`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sql_deterministic_key_equals_the_rust_one() {
    let h = MySqlHarness::new().await;
    let sql = h
        .outbox
        .names()
        .render(Dialect::MySql, "SELECT {outbox_fn:key}(?, ?)");
    for (namespace, parts) in common::random_key_inputs(1000) {
        let from_sql: String = sqlx::query_scalar(&sql)
            .bind(namespace.to_string())
            .bind(serde_json::to_string(&parts).unwrap())
            .fetch_one(h.outbox.pool())
            .await
            .unwrap();
        let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
        assert_eq!(
            from_sql,
            outbox_engine::deterministic_key(namespace, &parts).to_string(),
            "{namespace} {parts:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_database_costs_the_relay_a_lease_not_its_pool() {
    let url = common::url(URL_VAR, DEFAULT_URL);
    let pool = pool().await;
    let mut cleanup = Cleanup::new(&pool);
    let table = common::fresh_table("outbox_silent");
    let names = TableNames::default().outbox(&table).unwrap();
    cleanup.outbox(&names);
    let direct = MySqlOutbox::with_names(pool, names);
    direct.migrate().await.expect("migrate");
    let mut tx = direct.pool().begin().await.unwrap();
    direct
        .enqueue(&mut tx, &common::message("orders", 1))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let (settings, proxy) = common::behind_proxy(&url, &table).await;
    let store = (outbox_sqlx::MYSQL.connect)(&settings)
        .await
        .expect("the driver opens the store through the proxy");
    let mut lock = direct.pool().acquire().await.unwrap();
    sqlx::query(&format!("LOCK TABLES `{table}` WRITE"))
        .execute(&mut *lock)
        .await
        .unwrap();
    let unlock = async move {
        sqlx::query("UNLOCK TABLES")
            .execute(&mut *lock)
            .await
            .unwrap();
    };
    let silence = async {
        proxy.set(Net::Silence);
        unlock.await;
    };
    store_suite::silent_database_costs_a_lease_not_the_pool(store, silence, || {
        proxy.set(Net::Pass);
    })
    .await;
}

/// Whether `error` is MariaDB choosing this transaction as a deadlock's victim (it rolled
/// the transaction back; trying again is what a writer does).
fn is_deadlock(error: &sqlx::Error) -> bool {
    error
        .as_database_error()
        .and_then(|e| e.code())
        .is_some_and(|code| code == "40001")
}
