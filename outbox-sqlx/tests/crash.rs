//! Crash recovery with real processes: a relay running in a separate OS process is killed
//! with SIGKILL while it holds leased rows; another relay finishes the job. Nothing may be
//! lost, and duplicates are bounded by the rows leased at the kill.
//!
//! This file is its own test harness (`harness = false`): run without arguments it is the
//! test; with `OUTBOX_CRASH_CHILD` set it is the child relay that gets killed.

use std::process::Command;
use std::time::{Duration, Instant};

use outbox_engine::{Failure, Message, Outcome, Relay, RetryPolicy, Sink, StoreStats};
use outbox_sqlx::TableNames;
use outbox_sqlx::postgres::PgOutbox;
use outbox_test_support::ChildGuard;
use sqlx::PgPool;

#[path = "common/mod.rs"]
mod common;

use common::relay_process::{self, drop_tables, pool, record};

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
        record(&self.pool, &self.received, ids).await?;
        tokio::time::sleep(self.pause).await;
        Ok(vec![Outcome::published(); batch.len()])
    }
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

/// The relay that gets killed; `tables` names the outbox and the received table.
async fn child(tables: String) {
    let (table, received) = tables.split_once(' ').expect("two table names");
    let pool = pool(8).await;
    let names = TableNames::default().outbox(table).expect("table name");
    let outbox = PgOutbox::with_names(pool.clone(), names);
    let sink = TableSink {
        pool,
        received: received.to_owned(),
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
    let pool = pool(8).await;
    let table = common::fresh_table("crash_outbox");
    let received = common::fresh_table("crash_received");
    let names = TableNames::default().outbox(&table).expect("table name");
    let outbox = PgOutbox::with_names(pool.clone(), names);
    outbox.migrate().await.expect("migrate");
    sqlx::query(&format!("CREATE TABLE {received} (id uuid NOT NULL)"))
        .execute(&pool)
        .await
        .unwrap();
    let messages: Vec<_> = (0..MESSAGES)
        .map(|n| common::message("orders", n))
        .collect();
    let mut tx = pool.begin().await.unwrap();
    outbox.enqueue_all(&mut tx, &messages).await.unwrap();
    tx.commit().await.unwrap();

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
    // Until the dead child's leases lapse and the survivor has published every message.
    outbox_test_support::wait_until(
        "the survivor to publish every message",
        Duration::from_secs(120),
        || async {
            survivor.drain().await.expect("drain");
            outbox.stats().await.unwrap().total().published == MESSAGES
        },
    )
    .await;

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
    drop_tables(&pool, &[&table, &received]).await;
}

fn main() {
    relay_process::main(
        "OUTBOX_CRASH_CHILD",
        "crash_recovery_after_sigkill",
        child,
        parent,
    );
}
