//! Crash recovery of the diesel store with real processes: a relay on the diesel
//! PostgreSQL store, running in a separate OS process, is killed with SIGKILL while it
//! holds leased rows; another diesel relay finishes the job. Nothing may be lost, and
//! duplicates are bounded by the rows leased at the kill. (The "broker" records
//! deliveries through sqlx; the store under test is diesel's.)
//!
//! This file is its own test harness (`harness = false`): run without arguments it is the
//! test; with `OUTBOX_CRASH_CHILD` set it is the child relay that gets killed.

use std::process::Command;
use std::time::{Duration, Instant};

use diesel::PgConnection;
use diesel::r2d2::{ConnectionManager, Pool};
use outbox_diesel::TableNames;
use outbox_diesel::postgres::PgOutbox;
use outbox_engine::{Failure, Message, Outcome, Relay, RetryPolicy, Sink, StoreStats};
use outbox_test_support::ChildGuard;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

const URL_VAR: &str = "OUTBOX_TEST_POSTGRES_URL";
const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";
const MESSAGES: u64 = 2_000;
const CHILD_LEASE: Duration = Duration::from_secs(3);

/// The "broker": records every delivery in a table, then acknowledges after a pause, so
/// a kill lands between a delivery and its completion for some rows.
struct TableSink {
    pool: PgPool,
    received: String,
    pause: Duration,
}

impl Sink for TableSink {
    async fn publish(
        &self,
        batch: &[Message],
        _cx: &outbox_engine::PublishContext,
    ) -> Result<Vec<Outcome>, Failure> {
        let ids: Vec<uuid::Uuid> = batch.iter().map(|m| *m.id.as_uuid()).collect();
        sqlx::query(&format!(
            "INSERT INTO {} (id) SELECT * FROM UNNEST($1::uuid[])",
            self.received
        ))
        .bind(ids)
        .execute(&self.pool)
        .await
        .map_err(|e| Failure::retryable(outbox_engine::FailureClass::Connection, e.to_string()))?;
        tokio::time::sleep(self.pause).await;
        Ok(vec![Outcome::published(); batch.len()])
    }
}

async fn pool() -> PgPool {
    let url = outbox_test_support::server_url(URL_VAR, DEFAULT_URL);
    match PgPoolOptions::new().max_connections(8).connect(&url).await {
        Ok(pool) => pool,
        Err(e) => outbox_test_support::no_server("PostgreSQL", URL_VAR, &url, e),
    }
}

/// The diesel store on `table`, over an r2d2 pool sized for the relay's workers.
fn store(table: &str) -> PgOutbox {
    let url = outbox_test_support::server_url(URL_VAR, DEFAULT_URL);
    let pool = Pool::builder()
        .max_size(6)
        .build(ConnectionManager::<PgConnection>::new(&url))
        .unwrap_or_else(|e| outbox_test_support::no_server("PostgreSQL", URL_VAR, &url, e));
    PgOutbox::with_names(
        pool,
        TableNames::default().outbox(table).expect("table name"),
    )
}

fn relay(outbox: PgOutbox, sink: TableSink, owner: &str, lease: Duration) -> Relay<PgOutbox> {
    Relay::builder(outbox)
        .owner(owner)
        .route("orders", sink)
        .batch_size(25)
        .concurrency(3)
        .lease(lease)
        // A publish that timed out after its insert committed is re-sent: a duplicate of a
        // row that need not be leased at the kill. Allow publishes nearly the whole lease.
        .publish_timeout(lease - Duration::from_millis(100))
        .poll_interval(Duration::from_millis(50))
        .retry(RetryPolicy::default().initial_delay(Duration::from_millis(10)))
        .build()
        .expect("relay")
}

async fn child(table: String, received: String) {
    let pool = pool().await;
    let outbox = store(&table);
    let sink = TableSink {
        pool,
        received,
        pause: Duration::from_millis(150),
    };
    relay(outbox, sink, "doomed-child", CHILD_LEASE)
        .run(std::future::pending())
        .await;
}

async fn leased_by(pool: &PgPool, table: &str, owner: &str) -> i64 {
    sqlx::query_scalar(&format!(
        "SELECT count(*) FROM {table} WHERE status = 'leased' AND lease_owner = $1"
    ))
    .bind(owner)
    .fetch_one(pool)
    .await
    .expect("count leased")
}

async fn parent() {
    let pool = pool().await;
    let table = format!("diesel_crash_outbox_{:016x}", fastrand::u64(..));
    let received = format!("diesel_crash_received_{:016x}", fastrand::u64(..));
    let outbox = store(&table);
    outbox.migrate().await.expect("migrate");
    sqlx::query(&format!("CREATE TABLE {received} (id uuid NOT NULL)"))
        .execute(&pool)
        .await
        .unwrap();
    let messages: Vec<_> = (0..MESSAGES)
        .map(|n| {
            outbox_engine::NewMessage::builder("orders", "order.placed")
                .json(&n)
                .build()
                .unwrap()
        })
        .collect();
    let writer = outbox.clone();
    tokio::task::spawn_blocking(move || {
        let mut conn = writer.pool().get().expect("a connection");
        diesel::Connection::transaction(&mut *conn, |conn| {
            writer.enqueue_all(conn, &messages).expect("enqueue");
            Ok::<_, diesel::result::Error>(())
        })
        .expect("commit");
    })
    .await
    .unwrap();

    let mut child = ChildGuard::spawn(
        "child relay",
        Command::new(std::env::current_exe().unwrap())
            .env("OUTBOX_CRASH_CHILD", format!("{table} {received}")),
    );
    // Wait until the child has published some rows and holds leases on others.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let delivered: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM {received}"))
            .fetch_one(&pool)
            .await
            .unwrap();
        if delivered >= 200 && leased_by(&pool, &table, "doomed-child").await > 0 {
            break;
        }
        assert!(Instant::now() < deadline, "child relay made no progress");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let status = child.kill(); // SIGKILL
    assert!(!status.success(), "the child died by the signal");
    let leased_at_kill = leased_by(&pool, &table, "doomed-child").await;
    assert!(
        leased_at_kill > 0,
        "rows were leased by the killed relay at the kill"
    );

    let sink = TableSink {
        pool: pool.clone(),
        received: received.clone(),
        pause: Duration::ZERO,
    };
    let survivor = relay(outbox.clone(), sink, "survivor", Duration::from_secs(30));
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        survivor.drain().await.expect("drain");
        let total = outbox.stats().await.unwrap().total();
        if total.published == MESSAGES {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "survivor did not finish: {total:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await; // until the dead child's leases lapse
    }

    let (deliveries, distinct, lost): (i64, i64, i64) = sqlx::query_as(&format!(
        "SELECT (SELECT count(*) FROM {received}), (SELECT count(DISTINCT id) FROM {received}), \
         (SELECT count(*) FROM {table} o WHERE NOT EXISTS (SELECT 1 FROM {received} r WHERE r.id = o.id))"
    ))
    .fetch_one(&pool)
    .await
    .unwrap();
    let duplicates = deliveries - distinct;
    eprintln!(
        "crash: leased_at_kill={leased_at_kill} deliveries={deliveries} distinct={distinct} duplicates={duplicates} lost={lost}"
    );
    assert_eq!(lost, 0, "every message reached the sink");
    assert_eq!(distinct, MESSAGES as i64);
    assert!(
        duplicates <= leased_at_kill,
        "duplicates ({duplicates}) ≤ rows leased at the kill ({leased_at_kill})"
    );
    sqlx::query(&format!("DROP TABLE {table}, {received}"))
        .execute(&pool)
        .await
        .unwrap();
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    if let Ok(tables) = std::env::var("OUTBOX_CRASH_CHILD") {
        outbox_test_support::exit_with_parent();
        let (table, received) = tables.split_once(' ').expect("two table names");
        runtime.block_on(child(table.to_owned(), received.to_owned()));
        return;
    }
    outbox_test_support::run_single_test("diesel_relay_crash_recovery_after_sigkill", move || {
        runtime.block_on(parent())
    });
}
