//! The SQLite store on a real database file (WAL, busy timeout, a pool of connections).
#![cfg(feature = "sqlite")]

mod common;

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use outbox_engine::testkit::{RecordingSink, StoreHarness, inbox_suite, store_suite};
use outbox_engine::{
    ClaimRequest, Completion, DeadLetterFilter, DeadLetters, NewMessage, Relay, Store, StoreError,
    StoreErrorKind, StoreStats, Wakeup,
};
use outbox_sql::Dialect;
use outbox_sqlx::sqlite::{SqliteInbox, SqliteOutbox};
use outbox_sqlx::{PublishedRows, TableNames};
use sqlx::SqlitePool;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};

const BUSINESS_TABLE: &str = "CREATE TABLE {table} (id INTEGER PRIMARY KEY)";
const BUSINESS_INSERT: &str = "INSERT INTO {table} (id) VALUES (?1)";

/// A database file in the temp directory, unique to one test, deleted on drop.
struct TestDb {
    pool: SqlitePool,
    path: PathBuf,
}

impl TestDb {
    async fn new() -> Self {
        let path = std::env::temp_dir().join(format!(
            "outbox-sqlx-test-{}-{:016x}.db",
            std::process::id(),
            fastrand::u64(..)
        ));
        let options = SqliteConnectOptions::new()
            .filename(&path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(10));
        let pool = SqlitePoolOptions::new()
            .max_connections(8)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(options)
            .await
            .unwrap_or_else(|e| panic!("open SQLite database {}: {e}", path.display()));
        Self { pool, path }
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm"] {
            let mut file = self.path.clone().into_os_string();
            file.push(suffix);
            let _ = std::fs::remove_file(file);
        }
    }
}

/// A fresh outbox table in the test's database file.
struct SqliteHarness {
    outbox: SqliteOutbox,
    /// The database file, where the harness has one of its own.
    _db: Option<TestDb>,
}

impl SqliteHarness {
    async fn new(pool: SqlitePool) -> Self {
        Self::with_mode(pool, PublishedRows::Keep).await
    }

    async fn with_mode(pool: SqlitePool, mode: PublishedRows) -> Self {
        let names = TableNames::default()
            .outbox(&common::fresh_table("outbox"))
            .unwrap();
        let outbox = SqliteOutbox::with_names(pool, names).published_rows(mode);
        outbox.migrate().await.expect("migrate");
        Self { outbox, _db: None }
    }

    fn table(&self) -> String {
        self.outbox.names().render(Dialect::Sqlite, "{outbox}")
    }

    async fn rows(&self) -> i64 {
        sqlx::query_scalar(&format!("SELECT count(*) FROM {}", self.table()))
            .fetch_one(self.outbox.pool())
            .await
            .unwrap()
    }

    /// The rows per destination and status.
    async fn by_status(&self) -> Vec<(String, String, i64)> {
        let sql = format!(
            "SELECT destination, status, count(*) FROM {} GROUP BY destination, status",
            self.table()
        );
        sqlx::query_as(&sql)
            .fetch_all(self.outbox.pool())
            .await
            .unwrap()
    }
}

/// A fresh outbox table holding only the schema's first two migrations, as an older
/// release left it, in a database file of its own, for the shared tests
/// ([`sqlx_tests!`]).
async fn older_harness() -> SqliteHarness {
    let db = TestDb::new().await;
    let names = TableNames::default()
        .outbox(&common::fresh_table("outbox"))
        .unwrap();
    common::older_table(&db.pool, Dialect::Sqlite, &names, 2).await;
    SqliteHarness {
        outbox: SqliteOutbox::with_names(db.pool.clone(), names),
        _db: Some(db),
    }
}

/// A fresh outbox table in a database file of its own, for the shared tests
/// ([`sqlx_tests!`]).
async fn harness(mode: PublishedRows) -> SqliteHarness {
    let db = TestDb::new().await;
    let h = SqliteHarness::with_mode(db.pool.clone(), mode).await;
    SqliteHarness { _db: Some(db), ..h }
}

impl StoreHarness for SqliteHarness {
    type Store = SqliteOutbox;

    fn store(&self) -> &SqliteOutbox {
        &self.outbox
    }

    async fn enqueue(&self, messages: Vec<NewMessage>) -> Result<(), StoreError> {
        let mut tx = self.outbox.pool().begin().await.unwrap();
        self.outbox.enqueue_all(&mut tx, &messages).await?;
        tx.commit().await.unwrap();
        Ok(())
    }

    async fn advance(&self, by: Duration) {
        let ms = i64::try_from(by.as_millis()).unwrap();
        let sql = format!(
            "UPDATE {} SET created_at = created_at - ?1, available_at = available_at - ?1, \
             lease_until = lease_until - ?1, published_at = published_at - ?1, \
             dead_at = dead_at - ?1",
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
async fn sqlite_passes_the_store_suite() {
    let db = TestDb::new().await;
    store_suite::run_all(|| SqliteHarness::new(db.pool.clone())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_passes_the_store_and_ordering_suites_in_delete_mode() {
    let db = TestDb::new().await;
    let h = || SqliteHarness::with_mode(db.pool.clone(), PublishedRows::Delete);
    store_suite::run_all(h).await;
    store_suite::run_ordering(h).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_enqueue_and_relay_deliver_with_all_fields() {
    let db = TestDb::new().await;
    let h = SqliteHarness::new(db.pool.clone()).await;
    common::delivers_every_field(&h).await;
    // SQLite keeps the payload as a BLOB and the times as unix milliseconds.
    let (payload_type, published_at, created_at): (String, i64, i64) = sqlx::query_as(&format!(
        "SELECT typeof(payload), published_at, created_at FROM {}",
        h.table()
    ))
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(payload_type, "blob", "payload is stored as a BLOB");
    assert!(published_at >= created_at);
    let now_ms = chrono::Utc::now().timestamp_millis();
    assert!(
        (now_ms - created_at).abs() < 60_000,
        "created_at is unix milliseconds: {created_at} vs {now_ms}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_payload_round_trips() {
    let db = TestDb::new().await;
    let h = SqliteHarness::new(db.pool.clone()).await;
    let message = NewMessage::builder("orders", "ping")
        .bytes(Vec::new(), "application/octet-stream")
        .build()
        .unwrap();
    h.enqueue(vec![message.clone()]).await.unwrap();
    let claim = h
        .outbox
        .claim(&ClaimRequest::new("t", 10, Duration::from_secs(30)))
        .await
        .unwrap();
    assert_eq!(claim.messages.len(), 1);
    assert!(claim.messages[0].payload.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_stays_in_the_callers_transaction() {
    let db = TestDb::new().await;
    let h = SqliteHarness::new(db.pool.clone()).await;

    // Not visible to other connections before commit; gone after rollback.
    let mut tx = db.pool.begin().await.unwrap();
    h.outbox
        .enqueue_all(
            &mut tx,
            &(0..3).map(|n| common::message("a", n)).collect::<Vec<_>>(),
        )
        .await
        .unwrap();
    let inside: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM {}", h.table()))
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    assert_eq!(inside, 3, "the transaction sees its own rows");
    assert_eq!(h.rows().await, 0, "other connections do not, before commit");
    tx.rollback().await.unwrap();
    assert_eq!(h.rows().await, 0, "rolled back with the transaction");

    // A batch with a duplicate id inserts nothing, and the transaction stays usable.
    let first = common::message("a", 1);
    let mut tx = db.pool.begin().await.unwrap();
    h.outbox.enqueue(&mut tx, &first).await.unwrap();
    let batch = vec![
        common::message("a", 2),
        common::message("a", 3),
        first.clone(),
    ];
    let error = h.outbox.enqueue_all(&mut tx, &batch).await.unwrap_err();
    assert_eq!(error.kind(), StoreErrorKind::Constraint, "{error}");
    let single = h.outbox.enqueue(&mut tx, &first).await.unwrap_err();
    assert_eq!(single.kind(), StoreErrorKind::Constraint, "{single}");
    tx.commit().await.unwrap();
    let ids: Vec<String> = sqlx::query_scalar(&format!("SELECT id FROM {}", h.table()))
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(
        ids,
        vec![first.id().to_string()],
        "only the message enqueued before the failed batch was committed"
    );

    // Without a transaction, a batch is still all-or-nothing.
    let mut conn = db.pool.acquire().await.unwrap();
    let batch = vec![common::message("b", 1), first.clone()];
    assert!(h.outbox.enqueue_all(&mut conn, &batch).await.is_err());
    let ok = vec![common::message("b", 2), common::message("b", 3)];
    assert_eq!(h.outbox.enqueue_all(&mut conn, &ok).await.unwrap(), 2);
    drop(conn);
    assert_eq!(h.rows().await, 3);
    assert_eq!(
        h.outbox
            .enqueue_all(&mut db.pool.acquire().await.unwrap(), &[])
            .await
            .unwrap(),
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_inbox_passes_the_inbox_suite() {
    let db = TestDb::new().await;
    inbox_suite::run_all(|| async {
        let names = TableNames::default()
            .inbox(&common::fresh_table("inbox"))
            .unwrap();
        let inbox = SqliteInbox::with_names(names.clone());
        inbox.migrate(&db.pool).await.unwrap();
        inbox
            .migrate(&db.pool)
            .await
            .expect("migrating twice is a no-op");
        common::SqlxInbox {
            pool: db.pool.clone(),
            inbox,
            // The recommended start for SQLite consumers: the write lock from the start.
            begin: Some("BEGIN IMMEDIATE"),
            age: names.render(
                Dialect::Sqlite,
                "UPDATE {inbox} SET received_at = received_at - ?1 * 1000",
            ),
            cleanup: None,
        }
    })
    .await;
}

/// Writer and relay share the process: an in-process wakeup after commit replaces
/// LISTEN/NOTIFY, and several relay workers deliver every message exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_process_wakeup_drives_a_relay_with_several_workers() {
    let db = TestDb::new().await;
    let h = SqliteHarness::new(db.pool.clone()).await;
    let wakeup = Wakeup::new();
    let sink = RecordingSink::new();
    let relay = Relay::builder(h.outbox.clone())
        .route("orders", sink.clone())
        .concurrency(4)
        .batch_size(20)
        .poll_interval(Duration::from_secs(3600))
        .wakeup(wakeup.clone())
        .build()
        .unwrap();
    let running = tokio::spawn(relay.run(std::future::pending()));
    tokio::time::sleep(Duration::from_millis(200)).await;

    let mut expected = Vec::new();
    for round in 0..10_u64 {
        let mut tx = db.pool.begin_with("BEGIN IMMEDIATE").await.unwrap();
        let batch: Vec<_> = (0..50)
            .map(|n| common::message("orders", round * 100 + n))
            .collect();
        expected.extend(batch.iter().map(NewMessage::id));
        h.outbox.enqueue_all(&mut tx, &batch).await.unwrap();
        tx.commit().await.unwrap();
        wakeup.notify();
    }
    assert!(
        sink.wait_for(500, Duration::from_secs(20)).await,
        "woken without polling; got {}",
        sink.messages().len()
    );
    // The sink sees a message before the relay records it: wait for the records.
    outbox_test_support::wait_until(
        "500 messages recorded as published",
        Duration::from_secs(20),
        || async {
            let stats = h.outbox.stats().await.unwrap();
            stats
                .destination("orders")
                .is_some_and(|d| d.published == 500)
        },
    )
    .await;
    running.abort();
    let got: Vec<_> = sink.messages().iter().map(|m| m.id).collect();
    assert_eq!(got.len(), 500, "no duplicates");
    assert_eq!(
        got.iter().copied().collect::<HashSet<_>>(),
        expected.into_iter().collect::<HashSet<_>>()
    );
}

/// Hostile names are either rejected or used exactly as quoted; a canary table survives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_identifiers_are_rejected_or_quoted_exactly() {
    let db = TestDb::new().await;
    let pool = db.pool.clone();
    let canary = common::fresh_table("canary");
    common::hostile_identifiers(common::Hostile {
        pool: &pool,
        canary: &canary,
        create_canary: "CREATE TABLE {canary} (x INTEGER)",
        fragments: &["?1", "[", "]"],
        tries: 700,
        exists: "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = ?1",
        store: &|names| SqliteOutbox::with_names(pool.clone(), names),
        enqueue: &|outbox, conn, message| {
            Box::pin(async move { outbox.enqueue(conn, &message).await })
        },
    })
    .await;

    // Names SQLite reserves fail cleanly.
    for reserved in ["sqlite_master", "sqlite_schema", "\"sqlite_x\""] {
        let names = TableNames::default().outbox(reserved).unwrap();
        let outbox = SqliteOutbox::with_names(pool.clone(), names);
        assert!(outbox.migrate().await.is_err(), "{reserved} is refused");
    }

    let canary_rows: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM {canary}"))
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(canary_rows, 1, "the canary table survived");
    let canary_columns: i64 = sqlx::query_scalar(&format!(
        "SELECT count(*) FROM pragma_table_info('{canary}')"
    ))
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(canary_columns, 1, "and was not altered");
    let canary_indexes: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM sqlite_master WHERE type = 'index' AND tbl_name = ?1",
    )
    .bind(&canary)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(canary_indexes, 0, "no index was left on the canary");
    let canary_keys: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?1 || '_keys'",
    )
    .bind(&canary)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(canary_keys, 0, "nothing was created next to the canary");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schema_qualified_names_work() {
    let db = TestDb::new().await;
    let names = TableNames::default()
        .schema("main")
        .unwrap()
        .outbox("\"Billing Events\"")
        .unwrap();
    let outbox = SqliteOutbox::with_names(db.pool.clone(), names);
    outbox.migrate().await.unwrap();
    outbox.migrate().await.unwrap();
    let applied: Vec<String> =
        sqlx::query_scalar("SELECT id FROM main.outbox_migrations ORDER BY id")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(
        applied,
        vec![
            "Billing Events/001_outbox".to_owned(),
            "Billing Events/002_ordering".to_owned(),
            "Billing Events/003_row_checks".to_owned(),
            "Billing Events/004_writers".to_owned(),
            "Billing Events/006_heads".to_owned()
        ]
    );
    let indexes: Vec<String> = sqlx::query_scalar(
        "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'Billing Events' AND sql IS NOT NULL ORDER BY name",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        indexes,
        vec![
            "Billing Events_dead_idx",
            "Billing Events_due_idx",
            "Billing Events_head_idx",
            "Billing Events_published_idx",
            "Billing Events_unkeyed_idx"
        ]
    );
    let keys: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'Billing Events_keys'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(keys, 1, "the key counters live next to the outbox");
    let mut conn = db.pool.acquire().await.unwrap();
    outbox
        .enqueue(&mut conn, &common::message("a", 1))
        .await
        .unwrap();
    drop(conn);
    assert_eq!(outbox.stats().await.unwrap().total().pending, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_uses_the_due_index() {
    let db = TestDb::new().await;
    let h = SqliteHarness::new(db.pool.clone()).await;
    let sql = outbox_sql::sqlite::Statements::new(h.outbox.names());
    let ordered = [
        sql.claim_ordered(false, false),
        sql.claim_ordered(true, false),
        sql.claim_ordered(false, true),
        sql.claim_ordered(true, true),
    ];
    for claim in [sql.claim.as_str(), sql.claim_filtered.as_str()]
        .into_iter()
        .chain(ordered)
    {
        let plan: Vec<String> = sqlx::query(&format!("EXPLAIN QUERY PLAN {claim}"))
            .bind(10_i64)
            .bind("o")
            .bind("t")
            .bind(1000_i64)
            .bind("[\"a\"]")
            .fetch_all(&db.pool)
            .await
            .unwrap()
            .iter()
            .map(|row| sqlx::Row::get::<String, _>(row, "detail"))
            .collect();
        assert!(
            plan.iter().any(|step| step.contains("_due_idx")),
            "claim searches the partial due index: {plan:?}"
        );
        if ordered.contains(&claim) {
            for (alias, index) in [
                ("p", "_head_idx"),
                ("k", "_head_idx"),
                ("x", "_head_idx"),
                ("f", "_unkeyed_idx"),
            ] {
                assert!(
                    plan.iter()
                        .any(|step| step.starts_with(&format!("SEARCH {alias} USING"))
                            && step.contains(index)),
                    "the ordered claim's {alias} searches the partial index {index}: {plan:?}"
                );
            }
        }
        // Scans of the claim's own row sets are fine; a scan of the table is not.
        let row_sets = ["json_each", "front", "pairs", "w", "q", "h", "(subquery"];
        assert!(
            !plan.iter().any(|step| step.starts_with("SCAN")
                && !row_sets
                    .iter()
                    .any(|set| step["SCAN ".len()..].starts_with(set))),
            "no full scan of the outbox: {plan:?}"
        );
    }
}

/// Dead-letter time filters agree with `DeadLetterFilter::matches` to the nanosecond.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letter_time_filter_matches_exact_boundaries() {
    let db = TestDb::new().await;
    let h = SqliteHarness::new(db.pool.clone()).await;
    let message = common::message("a", 1);
    h.enqueue(vec![message.clone()]).await.unwrap();
    let claim = h
        .outbox
        .claim(&ClaimRequest::new("t", 1, Duration::from_secs(30)))
        .await
        .unwrap();
    h.outbox
        .complete(claim.lease.token, &[Completion::dead(message.id(), "x")])
        .await
        .unwrap();
    let dead = h
        .outbox
        .list_dead(&DeadLetterFilter::all(), 10)
        .await
        .unwrap();
    assert_eq!(dead.len(), 1);
    let created = dead[0].message.created_at;
    assert!(dead[0].dead_at >= created);
    let ns = chrono::Duration::nanoseconds(1);
    for (after, before) in [
        (Some(created), None),
        (Some(created - ns), None),
        (Some(created + ns), None),
        (None, Some(created)),
        (None, Some(created + ns)),
        (None, Some(created - ns)),
    ] {
        let filter = DeadLetterFilter::all().created_between(after, before);
        let found = h.outbox.list_dead(&filter, 10).await.unwrap();
        assert_eq!(
            found.len() == 1,
            filter.matches(&dead[0].message, &dead[0].reason),
            "after {after:?} before {before:?}"
        );
    }
}

/// `NOW_MS` is SQLite's own millisecond clock, exactly (no off-by-one from the float).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn now_ms_is_sqlites_clock_to_the_millisecond() {
    let db = TestDb::new().await;
    let sql = format!(
        "SELECT {}, CAST(strftime('%s', 'now') AS INTEGER) * 1000 + CAST(substr(strftime('%f', 'now'), 4) AS INTEGER)",
        outbox_sql::sqlite::NOW_MS
    );
    for _ in 0..300 {
        let (now_ms, reference): (i64, i64) =
            sqlx::query_as(&sql).fetch_one(&db.pool).await.unwrap();
        assert_eq!(now_ms, reference);
        tokio::time::sleep(Duration::from_micros(300)).await;
    }
}

/// Concurrent migrations take turns on the write lock; the migration is recorded once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_migrations_are_safe() {
    let db = TestDb::new().await;
    let names = TableNames::default()
        .outbox(&common::fresh_table("outbox"))
        .unwrap()
        .inbox(&common::fresh_table("inbox"))
        .unwrap();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let (pool, names) = (db.pool.clone(), names.clone());
        tasks.spawn(async move {
            SqliteOutbox::with_names(pool.clone(), names.clone())
                .migrate()
                .await?;
            SqliteInbox::with_names(names).migrate(&pool).await
        });
    }
    while let Some(result) = tasks.join_next().await {
        result.unwrap().expect("every concurrent migrate succeeds");
    }
    let applied: Vec<String> = sqlx::query_scalar("SELECT id FROM outbox_migrations ORDER BY id")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(
        applied,
        vec![
            format!("{}/001_inbox", names.inbox_name().name()),
            format!("{}/001_outbox", names.outbox_name().name()),
            format!("{}/002_ordering", names.outbox_name().name()),
            format!("{}/003_row_checks", names.outbox_name().name()),
            format!("{}/004_writers", names.outbox_name().name()),
            format!("{}/006_heads", names.outbox_name().name()),
        ]
    );
}

/// An absolute availability is stored rounded up to the millisecond and waits until then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn available_at_is_never_early() {
    let db = TestDb::new().await;
    let h = SqliteHarness::new(db.pool.clone()).await;
    let at =
        chrono::DateTime::from_timestamp_millis(chrono::Utc::now().timestamp_millis() + 3_600_000)
            .unwrap()
            + chrono::Duration::microseconds(500);
    let message = NewMessage::builder("a", "later")
        .json(&1)
        .available_at(at)
        .build()
        .unwrap();
    h.enqueue(vec![message]).await.unwrap();
    let stored: i64 = sqlx::query_scalar(&format!("SELECT available_at FROM {}", h.table()))
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(stored, at.timestamp_millis() + 1, "rounded up, not down");
    let request = ClaimRequest::new("t", 10, Duration::from_secs(30));
    assert!(h.outbox.claim(&request).await.unwrap().messages.is_empty());
    h.advance(Duration::from_secs(3601)).await;
    assert_eq!(h.outbox.claim(&request).await.unwrap().messages.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_passes_the_ordering_suite() {
    let db = TestDb::new().await;
    store_suite::run_ordering(|| SqliteHarness::new(db.pool.clone())).await;
}

fn keyed(key: &str, n: u64) -> NewMessage {
    NewMessage::builder("orders", "order.changed")
        .json(&serde_json::json!({ "key": key, "n": n }))
        .partition_key(key)
        .build()
        .unwrap()
}

/// Starts a task that opens a transaction, enqueues `message` and commits; the flag turns
/// true once the enqueue returned.
fn enqueue_in_task(
    outbox: &SqliteOutbox,
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
        flag.store(true, std::sync::atomic::Ordering::SeqCst);
        tx.commit().await.unwrap();
    });
    (enqueued, task)
}

/// Transaction A enqueues for key K; B, enqueueing for K too, waits until A commits (on
/// SQLite: for the write lock A holds) and so is numbered after it, although B's message
/// was built (and its id assigned) first. A per-key relay publishes A, then B.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_key_writers_wait_and_publish_in_commit_order() {
    use outbox_engine::{DeadHead, MessageOrder};

    let db = TestDb::new().await;
    let h = SqliteHarness::new(db.pool.clone()).await;
    let b = keyed("order-7", 2);
    let a = keyed("order-7", 1);
    assert!(b.id() < a.id(), "B's id sorts first");

    let mut tx_a = db.pool.begin().await.unwrap();
    h.outbox.enqueue(&mut tx_a, &a).await.unwrap();
    let (b_enqueued, b_task) = enqueue_in_task(&h.outbox, b.clone());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !b_enqueued.load(std::sync::atomic::Ordering::SeqCst),
        "B waits while A is open"
    );
    tx_a.commit().await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), b_task)
        .await
        .expect("B finishes once A committed")
        .unwrap();

    let seqs: Vec<(String, i64)> =
        sqlx::query_as(&format!("SELECT id, seq FROM {} ORDER BY seq", h.table()))
            .fetch_all(&db.pool)
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
        .ordering(MessageOrder::PerKey(DeadHead::Skip))
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

/// SQLite has one writer: while A is open, B waits whatever it writes — a message of
/// another key, or one without a key, alike. Numbering adds no waiting of its own, and
/// each key counts on its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn different_keys_wait_only_for_sqlites_single_writer() {
    let db = TestDb::new().await;
    let h = SqliteHarness::new(db.pool.clone()).await;
    for other in [Some("k2"), None] {
        let mut tx_a = db.pool.begin().await.unwrap();
        h.outbox.enqueue(&mut tx_a, &keyed("k1", 1)).await.unwrap();
        let b = match other {
            Some(key) => keyed(key, 1),
            None => common::message("orders", 1),
        };
        let (b_enqueued, b_task) = enqueue_in_task(&h.outbox, b);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !b_enqueued.load(std::sync::atomic::Ordering::SeqCst),
            "B ({other:?}) waits for SQLite's write lock like any writer"
        );
        tx_a.commit().await.unwrap();
        tokio::time::timeout(Duration::from_secs(10), b_task)
            .await
            .expect("B finishes once A committed")
            .unwrap();
    }
    let seqs: Vec<(Option<String>, Option<i64>)> = sqlx::query_as(&format!(
        "SELECT partition_key, seq FROM {} ORDER BY rowid",
        h.table()
    ))
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        seqs,
        vec![
            (Some("k1".into()), Some(1)),
            (Some("k2".into()), Some(1)),
            (Some("k1".into()), Some(2)),
            (None, None),
        ],
        "each key numbered on its own; no key, no number"
    );
}

/// Batches number each key once, in slice order, and roll back with the transaction
/// (the counter too); a duplicate id inside a batch leaves no row and no number behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_number_keys_in_slice_order_atomically() {
    let db = TestDb::new().await;
    let h = SqliteHarness::new(db.pool.clone()).await;
    let batch = vec![
        keyed("b", 1),
        keyed("a", 1),
        common::message("orders", 0),
        keyed("b", 2),
        keyed("a", 2),
        keyed("b", 3),
    ];
    let mut tx = db.pool.begin().await.unwrap();
    h.outbox.enqueue_all(&mut tx, &batch).await.unwrap();
    tx.rollback().await.unwrap();
    let mut tx = db.pool.begin().await.unwrap();
    h.outbox.enqueue_all(&mut tx, &batch).await.unwrap();
    let duplicate = vec![keyed("a", 3), batch[0].clone()];
    assert!(h.outbox.enqueue_all(&mut tx, &duplicate).await.is_err());
    tx.commit().await.unwrap();
    let got: Vec<(String, Option<i64>)> =
        sqlx::query_as(&format!("SELECT id, seq FROM {}", h.table()))
            .fetch_all(&db.pool)
            .await
            .unwrap();
    let seq_of = |m: &NewMessage| {
        got.iter()
            .find(|(id, _)| *id == m.id().to_string())
            .unwrap()
            .1
    };
    let seqs: Vec<_> = batch.iter().map(seq_of).collect();
    assert_eq!(
        seqs,
        vec![Some(1), Some(1), None, Some(2), Some(2), Some(3)],
        "the rolled-back attempt took no numbers"
    );
    assert_eq!(got.len(), 6, "the failed batch left nothing");
    let last: i64 = sqlx::query_scalar(&format!(
        "SELECT last_seq FROM {} WHERE partition_key = 'a'",
        h.outbox.names().render(Dialect::Sqlite, "{outbox_keys}")
    ))
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(last, 2, "the failed batch's savepoint took its number back");
}

/// Many concurrent writers (deferred `BEGIN`, some rolling back) and several per-key
/// relays with a flaky sink: no writer fails on the lock, every key is numbered without
/// gaps or repeats, and every key is received in version order. Each transaction bumps
/// its key's version row before enqueueing (as a business aggregate would), so version
/// order is commit order, independent of the outbox's own numbering.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writers_and_relays_keep_every_key_in_commit_order() {
    use outbox_engine::testkit::FlakySink;
    use outbox_engine::{DeadHead, MessageOrder};

    const KEYS: usize = 20;
    const PER_KEY: i64 = 10;
    let db = TestDb::new().await;
    let h = SqliteHarness::new(db.pool.clone()).await;
    let versions = common::fresh_table("versions");
    sqlx::query(&format!(
        "CREATE TABLE {versions} (k TEXT PRIMARY KEY, v INTEGER NOT NULL)"
    ))
    .execute(&db.pool)
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
            .batch_size(8)
            .concurrency(2)
            .poll_interval(Duration::from_millis(5))
            .retry(common::backoff_ms(5, 20).max_attempts(1000))
            .ordering(MessageOrder::PerKey(DeadHead::Skip))
            .build()
            .unwrap();
        let mut stop = stop_rx.clone();
        relays.push(tokio::spawn(relay.run(async move {
            let _ = stop.wait_for(|s| *s).await;
        })));
    }

    let mut producers = tokio::task::JoinSet::new();
    for p in 0..4 {
        let (outbox, pool, versions) = (h.outbox.clone(), db.pool.clone(), versions.clone());
        producers.spawn(async move {
            let mut rng = fastrand::Rng::with_seed(p);
            let mut committed = 0;
            while committed < KEYS * PER_KEY as usize / 4 {
                let key = format!("k{}", rng.usize(..KEYS));
                // Built before the transaction: id order is not commit order.
                let draft = keyed(&key, 0);
                let mut tx = pool.begin().await.unwrap();
                let v: i64 = sqlx::query_scalar(&format!(
                    "INSERT INTO {versions} (k, v) VALUES (?1, 1) \
                     ON CONFLICT (k) DO UPDATE SET v = v + 1 RETURNING v"
                ))
                .bind(&key)
                .fetch_one(&mut *tx)
                .await
                .unwrap();
                if v > PER_KEY {
                    tx.rollback().await.unwrap();
                    continue;
                }
                let message = NewMessage::builder("orders", "order.changed")
                    .id(draft.id())
                    .json(&serde_json::json!({ "key": key, "v": v }))
                    .partition_key(&key)
                    .build()
                    .unwrap();
                outbox.enqueue(&mut tx, &message).await.unwrap();
                tokio::time::sleep(Duration::from_micros(rng.u64(0..500))).await;
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
    let total: i64 = sqlx::query_scalar(&format!("SELECT COALESCE(sum(v), 0) FROM {versions}"))
        .fetch_one(&db.pool)
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let stats = h.outbox.stats().await.unwrap().total();
        if stats.backlog() == 0 && stats.published as i64 == total {
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

    // Numbers per key: 1..=n, no gaps, no repeats (rollbacks took theirs back).
    let numbered: Vec<(String, i64, i64)> = sqlx::query_as(&format!(
        "SELECT partition_key, count(*), max(seq) FROM {} GROUP BY partition_key",
        h.table()
    ))
    .fetch_all(&db.pool)
    .await
    .unwrap();
    for (key, n, max) in &numbered {
        assert_eq!(n, max, "key {key} numbered 1..={n}");
    }
    // Received order per key (first delivery of each id) = version order = commit order.
    let mut seen = HashSet::new();
    let mut per_key: std::collections::BTreeMap<String, Vec<i64>> = Default::default();
    for m in sink.messages() {
        if seen.insert(m.id) {
            let body: serde_json::Value = serde_json::from_slice(&m.payload).unwrap();
            per_key
                .entry(body["key"].as_str().unwrap().to_owned())
                .or_default()
                .push(body["v"].as_i64().unwrap());
        }
    }
    assert_eq!(seen.len() as i64, total, "every committed message received");
    for (key, received) in &per_key {
        let expected: Vec<i64> = (1..=received.len() as i64).collect();
        assert_eq!(received, &expected, "key {key} received in commit order");
    }
    assert!(
        flaky.stats().retryable > 0,
        "the sink did fail some attempts"
    );
}

/// Inserts `rows` as another program would, in one transaction, straight into the table.
async fn insert_foreign(h: &SqliteHarness, rows: &[common::ForeignRow]) -> Result<(), sqlx::Error> {
    let mut tx = h.outbox.pool().begin().await?;
    for row in rows {
        sqlx::query(&format!(
            "INSERT INTO {} (id, destination, event_type, idempotency_key, payload, content_type, headers, available_at, created_at) \
             VALUES (?1, 'orders', 'foreign.event', ?1, X'7b7d', 'application/json', ?2, 0, 0)",
            h.table()
        ))
        .bind(&row.id)
        .bind(&row.headers)
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await
}

/// Drops the triggers that refuse unreadable rows, as on a table from an older version.
async fn drop_row_checks(h: &SqliteHarness) {
    for trigger in [
        "{outbox_trg:id_check}",
        "{outbox_trg:headers_check}",
        "{outbox_trg:update_check}",
    ] {
        let name = h.outbox.names().render(Dialect::Sqlite, trigger);
        sqlx::query(&format!("DROP TRIGGER {name}"))
            .execute(h.outbox.pool())
            .await
            .unwrap();
    }
}

/// The 200-row poison case on SQLite: rows whose headers are not a JSON object of strings
/// are dead-lettered one by one, naming the column; the rest of their batches is published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreadable_headers_dead_letter_their_row_not_the_batch() {
    let db = TestDb::new().await;
    let h = SqliteHarness::new(db.pool.clone()).await;
    drop_row_checks(&h).await;
    let rows = common::foreign_rows(
        200,
        &[
            (0, r#"{"x-n": 1}"#),
            (57, "[1,2]"),
            (150, "null"),
            (151, "not json"),
        ],
    );
    insert_foreign(&h, &rows).await.unwrap();
    let poisoned = [0, 57, 150, 151].map(|i| rows[i].id.clone());
    common::unreadable_rows_are_dead_lettered_alone(h.outbox.clone(), 200, &poisoned, "headers")
        .await;
}

/// Ids that are not the lowercase hyphenated UUID text the library writes (completions
/// find rows by that text) are dead-lettered alone, found by rowid; a BLOB id too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreadable_ids_dead_letter_their_row_not_the_batch() {
    let db = TestDb::new().await;
    let h = SqliteHarness::new(db.pool.clone()).await;
    drop_row_checks(&h).await;
    let mut rows = common::foreign_rows(150, &[]);
    rows[3].id = rows[3].id.to_uppercase();
    rows[90].id = "order-42".to_owned();
    insert_foreign(&h, &rows).await.unwrap();
    sqlx::query(&format!(
        "INSERT INTO {} (id, destination, event_type, idempotency_key, payload, content_type, available_at, created_at) \
         VALUES (randomblob(16), 'orders', 'foreign.event', 'k', X'7b7d', 'application/json', 0, 0)",
        h.table()
    ))
    .execute(h.outbox.pool())
    .await
    .unwrap();
    let poisoned = [
        rows[3].id.clone(),
        rows[90].id.clone(),
        "the BLOB id".to_owned(),
    ];
    common::unreadable_rows_are_dead_lettered_alone(h.outbox.clone(), 151, &poisoned, "id").await;
    let dead: i64 = sqlx::query_scalar(&format!(
        "SELECT count(*) FROM {} WHERE status = 'dead' AND last_error LIKE '%column id%'",
        h.table()
    ))
    .fetch_one(h.outbox.pool())
    .await
    .unwrap();
    assert_eq!(
        dead, 3,
        "each unreadable id is a dead letter with the reason"
    );
}

/// Once migrated, the table refuses what the relay could not read, naming the columns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_table_refuses_unreadable_ids_and_headers() {
    let db = TestDb::new().await;
    let h = SqliteHarness::new(db.pool.clone()).await;
    let insert = |rows: Vec<common::ForeignRow>| {
        let h = &h;
        async move { insert_foreign(h, &rows).await }
    };
    let bad = [r#"{"x-n": 1}"#, "[1,2]", "null", "not json"];
    common::refuses_unreadable_rows(insert, &bad, "column headers", Some("column id")).await;
}

// ---- Writers in other languages (004_writers): defaults, checks, numbering ----

/// Inserts one row for `orders` as a foreign writer would, with `column` set to the SQL
/// expression `value` and every other column left to the table.
async fn insert_with(h: &SqliteHarness, column: &str, value: &str) -> Result<(), sqlx::Error> {
    let sql = common::insert_sql(&h.table(), "X'7b7d'", column, value);
    sqlx::query(&sql).execute(h.outbox.pool()).await.map(|_| ())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_with_only_destination_event_type_and_payload_is_delivered() {
    let db = TestDb::new().await;
    let h = SqliteHarness::new(db.pool.clone()).await;
    insert_with(&h, "payload", "X'7b7d'").await.unwrap();
    // A payload written as text, as a Python `str` is.
    insert_with(&h, "payload", "'{}'").await.unwrap();
    insert_with(&h, "available_at", "NULL").await.unwrap();
    insert_with(&h, "headers", "'{}'").await.unwrap();
    // NULL written explicitly (a driver's None) means the default too.
    for column in ["id", "idempotency_key", "content_type", "headers"] {
        insert_with(&h, column, "NULL").await.unwrap();
    }
    common::minimal_rows_are_delivered(h.outbox.clone(), 8).await;
}

/// SQLite's GLOB and text `length` stop at a NUL, so a value with one could carry past the
/// checks what they refuse (here a line feed): every text column, the id and the headers
/// refuse it, naming the column, and nothing is inserted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_with_an_embedded_nul_is_refused() {
    let db = TestDb::new().await;
    let h = SqliteHarness::new(db.pool.clone()).await;
    let nul_then_line_feed = "CAST(x'6f6b000a58' AS TEXT)"; // "ok", NUL, "\n", "X"
    let columns = [
        "destination",
        "event_type",
        "aggregate_type",
        "aggregate_id",
        "partition_key",
        "tenant_id",
        "idempotency_key",
        "content_type",
    ];
    for column in columns {
        let error = insert_with(&h, column, nul_then_line_feed)
            .await
            .expect_err(column)
            .to_string();
        assert!(
            error.contains(&format!("column {column}")),
            "{column}: {error}"
        );
    }
    let uuid = outbox_engine::MessageId::new().to_string();
    let hex: String = uuid.bytes().map(|b| format!("{b:02x}")).collect();
    let id = format!("CAST(x'{}00' AS TEXT)", &hex[..70]); // 35 characters, NUL
    let error = insert_with(&h, "id", &id)
        .await
        .expect_err("id")
        .to_string();
    assert!(error.contains("column id"), "{error}");
    for headers in [r#"'{"x-a": "ok\u0000\nX"}'"#, r#"'{"x-a\u0000\n": "ok"}'"#] {
        let error = insert_with(&h, "headers", headers)
            .await
            .expect_err(headers)
            .to_string();
        assert!(error.contains("column headers"), "{headers}: {error}");
    }
    let rows: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM {}", h.table()))
        .fetch_one(h.outbox.pool())
        .await
        .unwrap();
    assert_eq!(rows, 0, "nothing was inserted");
}

/// A row written with an attempt count past the limit is dead-lettered at its first claim,
/// and the reason says how it arrived rather than blaming crashed relays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_written_past_the_attempt_limit_is_dead_lettered_saying_so() {
    let db = TestDb::new().await;
    let h = SqliteHarness::new(db.pool.clone()).await;
    insert_with(&h, "attempts", "1000").await.unwrap();
    let (report, sink) = outbox_engine::testkit::drain(h.outbox.clone(), "orders").await;
    assert_eq!((report.published, report.dead), (0, 1), "{report:?}");
    assert!(sink.messages().is_empty());
    let dead = h
        .outbox
        .list_dead(&DeadLetterFilter::all(), 10)
        .await
        .unwrap();
    let reason = &dead[0].reason;
    assert!(
        reason.ends_with(
            "the row arrived with attempts = 1000 (above the limit of 25): written so, or the limit was lowered since"
        ),
        "{reason}"
    );
}

/// Keyed rows a writer inserts without `seq` are numbered in commit order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_rows_written_without_seq_are_numbered() {
    let db = TestDb::new().await;
    let h = SqliteHarness::new(db.pool.clone()).await;
    for key in ["a", "b", "a", "a", "b"] {
        insert_with(&h, "partition_key", &format!("'{key}'"))
            .await
            .unwrap();
    }
    let seqs: Vec<(String, i64)> = sqlx::query_as(&format!(
        "SELECT partition_key, seq FROM {} ORDER BY rowid",
        h.table()
    ))
    .fetch_all(h.outbox.pool())
    .await
    .unwrap();
    let want: Vec<(String, i64)> = [("a", 1), ("b", 1), ("a", 2), ("a", 3), ("b", 2)]
        .map(|(k, n)| (k.to_owned(), n))
        .into();
    assert_eq!(seqs, want);
}

// The tests every dialect runs, and this one's refusals in its SQL.
crate::sqlx_tests! {
    refuses_control_characters_in_event_type: "event_type" = "'order' || char(10) || 'paid'";
    refuses_a_long_aggregate_type: "aggregate_type" = "printf('%.256c', 'a')";
    refuses_control_characters_in_aggregate_id: "aggregate_id" = "'42' || char(9)";
    refuses_a_long_tenant_id: "tenant_id" = "printf('%.256c', 't')";
    refuses_a_payload_over_one_mebibyte: "payload" = "zeroblob(1048577)";
    refuses_more_than_64_headers: "headers" = "(WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < 65) SELECT json_group_object('h' || n, 'v') FROM g)";
    refuses_header_values_over_8_kib: "headers" = "json_object('h', printf('%.8193c', 'v'))";
    refuses_an_id_that_is_not_a_lowercase_uuid: "id" = "'0190A0B1-0000-7000-8000-000000000000'";
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotate_is_refused_with_a_reason_and_nothing_created() {
    let db = TestDb::new().await;
    let outbox = SqliteOutbox::new(db.pool.clone()).published_rows(PublishedRows::Rotate);
    let error = outbox.migrate().await.unwrap_err().to_string();
    assert!(error.contains("\"rotate\" needs PostgreSQL"), "{error}");
    let tables: i64 = sqlx::query_scalar("SELECT count(*) FROM sqlite_master WHERE type = 'table'")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(tables, 0, "migrate created nothing");
}
