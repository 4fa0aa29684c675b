//! Per-key ordering under stress on PostgreSQL, with relays in separate OS processes.
//!
//! Eight producers commit 1,000 keys × 20 messages with random delays; each transaction
//! bumps its key's version row (as a business aggregate would) and enqueues a message
//! carrying that version, with a message id taken *before* the transaction, so id order
//! and commit order differ. Four relay processes with per-key ordering publish through a
//! sink that fails 10% of attempts, and are SIGKILLed and restarted at random. For every
//! key the received versions (first delivery of each id) must be exactly 1, 2, …, 20.
//!
//! Its own harness (`harness = false`): with `OUTBOX_ORDER_CHILD` set it is a relay child.

use std::process::Command;
use std::time::{Duration, Instant};

use outbox_engine::{
    DeadHead, Failure, FailureClass, Message, MessageId, MessageOrder, NewMessage, Outcome, Relay,
    Sink, StoreStats,
};
use outbox_sqlx::TableNames;
use outbox_sqlx::postgres::PgOutbox;
use outbox_test_support::ChildGuard;
use sqlx::PgPool;

#[path = "common/mod.rs"]
mod common;

use common::relay_process::{self, drop_tables, pool, record};

const KEYS: usize = 1_000;
const PER_KEY: usize = 20;
const PRODUCERS: usize = 8;
const RELAYS: usize = 4;

/// Records deliveries in arrival order; fails 10% of attempts before recording.
struct FlakyTableSink {
    pool: PgPool,
    received: String,
}

impl Sink for FlakyTableSink {
    async fn publish(
        &self,
        batch: &[Message],
        _cx: &outbox_engine::PublishContext,
    ) -> Result<Vec<Outcome>, Failure> {
        let mut outcomes = Vec::with_capacity(batch.len());
        let mut ids = Vec::new();
        for m in batch {
            if fastrand::f64() < 0.1 {
                outcomes.push(Outcome::retryable(FailureClass::Unavailable, "flaky"));
            } else {
                ids.push(*m.id.as_uuid());
                outcomes.push(Outcome::published());
            }
        }
        record(&self.pool, &self.received, ids).await?;
        Ok(outcomes)
    }
}

/// A relay; `args` names the outbox, the received table and the relay.
async fn child(args: String) {
    let [table, received, owner]: [&str; 3] = args
        .split(' ')
        .collect::<Vec<_>>()
        .try_into()
        .expect("three names");
    let pool = pool(6).await;
    let names = TableNames::default().outbox(table).expect("name");
    let outbox = PgOutbox::with_names(pool.clone(), names);
    let received = received.to_owned();
    let relay = Relay::builder(outbox)
        .owner(owner)
        .route("orders", FlakyTableSink { pool, received })
        .ordering(MessageOrder::PerKey(DeadHead::Skip))
        .batch_size(200)
        .concurrency(2)
        .lease(Duration::from_secs(2))
        .poll_interval(Duration::from_millis(20))
        .retry(common::backoff_ms(5, 50).max_attempts(10_000))
        .build()
        .expect("relay");
    // A backstop only, past the parent's 600 s deadline so no relay stops while the
    // parent still waits; the parent's guards and `exit_with_parent` end children sooner.
    relay
        .run(tokio::time::sleep(Duration::from_secs(900)))
        .await;
}

fn spawn_relay(table: &str, received: &str, n: usize) -> ChildGuard {
    ChildGuard::spawn(
        format!("relay-{n}"),
        Command::new(std::env::current_exe().unwrap()).env(
            "OUTBOX_ORDER_CHILD",
            format!("{table} {received} relay-{n}"),
        ),
    )
}

async fn produce(pool: PgPool, outbox: PgOutbox, versions: String, mut keys: Vec<usize>) {
    fastrand::shuffle(&mut keys);
    for key in keys {
        let id = MessageId::new(); // taken before the transaction: id order ≠ commit order
        tokio::time::sleep(Duration::from_micros(fastrand::u64(0..2_000))).await;
        let mut tx = pool.begin().await.unwrap();
        let version: i32 = sqlx::query_scalar(&format!(
            "UPDATE {versions} SET v = v + 1 WHERE k = $1 RETURNING v"
        ))
        .bind(key as i32)
        .fetch_one(&mut *tx)
        .await
        .unwrap();
        let message = NewMessage::builder("orders", "order.changed")
            .id(id)
            .json(&serde_json::json!({ "key": key, "version": version }))
            .partition_key(format!("order-{key}"))
            .build()
            .unwrap();
        outbox.enqueue(&mut tx, &message).await.unwrap();
        tokio::time::sleep(Duration::from_micros(fastrand::u64(0..2_000))).await;
        tx.commit().await.unwrap();
    }
}

async fn parent() {
    let pool = pool(16).await;
    let table = common::fresh_table("order_outbox");
    let received = common::fresh_table("order_received");
    let versions = common::fresh_table("order_versions");
    let outbox = PgOutbox::with_names(pool.clone(), TableNames::default().outbox(&table).unwrap());
    outbox.migrate().await.unwrap();
    sqlx::query(&format!(
        "CREATE TABLE {received} (arrival bigserial PRIMARY KEY, id uuid NOT NULL)"
    ))
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query(&format!(
        "CREATE TABLE {versions} (k int PRIMARY KEY, v int NOT NULL)"
    ))
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query(&format!(
        "INSERT INTO {versions} SELECT g, 0 FROM generate_series(0, {}) g",
        KEYS - 1
    ))
    .execute(&pool)
    .await
    .unwrap();

    let mut relays: Vec<ChildGuard> = (0..RELAYS)
        .map(|n| spawn_relay(&table, &received, n))
        .collect();
    // Each producer owns a share of the work: every key appears PER_KEY times overall.
    let work: Vec<usize> = (0..KEYS)
        .flat_map(|k| std::iter::repeat_n(k, PER_KEY))
        .collect();
    let mut producers = tokio::task::JoinSet::new();
    for share in work.chunks(work.len() / PRODUCERS) {
        producers.spawn(produce(
            pool.clone(),
            outbox.clone(),
            versions.clone(),
            share.to_vec(),
        ));
    }

    let total = (KEYS * PER_KEY) as u64;
    let mut kills = 0;
    let mut spawned = RELAYS;
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        tokio::time::sleep(Duration::from_millis(fastrand::u64(200..800))).await;
        let stats = outbox.stats().await.unwrap().total();
        if stats.published == total {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "stress did not finish: {stats:?}"
        );
        if stats.leased > 0 && kills < 12 {
            let victim = fastrand::usize(..RELAYS);
            relays[victim].kill();
            kills += 1;
            relays[victim] = spawn_relay(&table, &received, spawned);
            spawned += 1;
        }
    }
    while let Some(done) = producers.join_next().await {
        done.expect("producer");
    }
    drop(relays); // kills and reaps every relay process

    // First delivery of each id, in arrival order, grouped by key.
    let rows: Vec<(serde_json::Value,)> = sqlx::query_as(&format!(
        "SELECT convert_from(o.payload, 'UTF8')::jsonb FROM (SELECT DISTINCT ON (id) id, arrival FROM {received} ORDER BY id, arrival) r \
         JOIN {table} o ON o.id = r.id ORDER BY r.arrival"
    ))
    .fetch_all(&pool)
    .await
    .unwrap();
    let mut per_key: Vec<Vec<i64>> = vec![Vec::new(); KEYS];
    for (payload,) in &rows {
        per_key[payload["key"].as_u64().unwrap() as usize]
            .push(payload["version"].as_i64().unwrap());
    }
    let (deliveries, distinct): (i64, i64) = sqlx::query_as(&format!(
        "SELECT count(*), count(DISTINCT id) FROM {received}"
    ))
    .fetch_one(&pool)
    .await
    .unwrap();
    eprintln!(
        "ordering stress: kills={kills} deliveries={deliveries} distinct={distinct} duplicates={}",
        deliveries - distinct
    );
    assert!(
        kills >= 3,
        "relay processes were killed while holding leases"
    );
    assert_eq!(distinct, total as i64, "lost = 0");
    let expected: Vec<i64> = (1..=PER_KEY as i64).collect();
    for (key, versions) in per_key.iter().enumerate() {
        assert_eq!(versions, &expected, "key {key}: received in commit order");
    }
    drop_tables(&pool, &[&table, &received, &versions]).await;
}

fn main() {
    relay_process::main(
        "OUTBOX_ORDER_CHILD",
        child,
        vec![("per_key_order_under_stress", || Box::pin(parent()))],
    );
}
