//! `drain` and `ordered`: how fast a backlog empties.
//!
//! `drain` preloads N messages, then empties the table three ways at the same batch size
//! and worker count: the relay with a no-op sink (delete-on-publish), the raw SQL ceiling
//! (the same two statements a lease-based relay needs — claim with `FOR UPDATE SKIP
//! LOCKED`, then batch delete — and nothing else), and the peer (`pgmq.read` +
//! `pgmq.delete`). `ordered` preloads N messages over 1,000 partition keys and compares
//! the relay with per-key ordering against the same relay unordered.

use std::sync::atomic::Ordering as Atomic;
use std::time::{Duration, Instant};

use outbox_engine::{DeadHead, MessageOrder, NewMessage, Relay};
use outbox_sqlx::PublishedRows;
use outbox_sqlx::postgres::PgOutbox;
use sqlx::{PgPool, Row};

use crate::Scale;
use crate::report::Report;
use crate::setup::{Bench, BoxError, NoopSink, memory_mib};

const CONFIGS: [(usize, usize); 3] = [(100, 2), (500, 2), (1000, 1)];
const KEYS: usize = 1_000;

pub(crate) async fn install_pgmq(pool: &PgPool, queue: &str) -> Result<(), BoxError> {
    let ext = pgmq::PGMQueueExt::new_with_pool(pool.clone()).await;
    ext.install_sql_from_embedded()
        .await
        .map_err(|e| format!("installing pgmq SQL: {e}"))?;
    sqlx::query("SELECT pgmq.drop_queue($1)")
        .bind(queue)
        .execute(pool)
        .await
        .ok();
    sqlx::query("SELECT pgmq.create($1)")
        .bind(queue)
        .execute(pool)
        .await?;
    Ok(())
}

pub(crate) async fn run(
    bench: &Bench,
    scale: Scale,
    report: &mut Report,
    ordered: bool,
) -> Result<(), BoxError> {
    let n = scale.drain_rows;
    let mut rows = Vec::new();
    let mut json = serde_json::Map::new();
    if ordered {
        let (batch, workers) = (500, 2);
        let unordered =
            relay_drain(bench, n, batch, workers, Some(MessageOrder::Unordered)).await?;
        let per_key = relay_drain(
            bench,
            n,
            batch,
            workers,
            Some(MessageOrder::PerKey(DeadHead::Skip)),
        )
        .await?;
        rows.push(vec![
            batch.to_string(),
            workers.to_string(),
            "unordered".into(),
            format!("{unordered:.0}"),
            "1.00".into(),
        ]);
        rows.push(vec![
            batch.to_string(),
            workers.to_string(),
            "per-key".into(),
            format!("{per_key:.0}"),
            format!("{:.2}", per_key / unordered),
        ]);
        json.insert("keys".into(), KEYS.into());
        json.insert("unordered_msgs_per_s".into(), unordered.into());
        json.insert("ordered_msgs_per_s".into(), per_key.into());
        json.insert(
            "ordered_over_unordered".into(),
            (per_key / unordered).into(),
        );
        report.section(
            "ordered",
            &format!(
                "Relay drain of {n} messages over {KEYS} partition keys, no-op sink, messages/s."
            ),
            &["batch", "workers", "ordering", "messages/s", "vs unordered"],
            rows,
            serde_json::Value::Object(json),
        );
        return Ok(());
    }
    install_pgmq(&bench.pool, "bench_drain_q").await?;
    for (batch, workers) in CONFIGS {
        let relay = relay_drain(bench, n, batch, workers, None).await?;
        let raw = raw_drain(bench, n, batch, workers, false).await?;
        let raw_wide = raw_drain(bench, n, batch, workers, true).await?;
        let peer = pgmq_drain(bench, n, batch, workers).await?;
        let (peak, _) = memory_mib();
        rows.push(vec![
            batch.to_string(),
            workers.to_string(),
            format!("{relay:.0}"),
            format!("{raw:.0}"),
            format!("{:.2}", relay / raw),
            format!("{raw_wide:.0}"),
            format!("{:.2}", relay / raw_wide),
            format!("{peer:.0}"),
            format!("{:.2}", relay / peer),
            format!("{peak:.0}"),
        ]);
        json.insert(
            format!("b{batch}_w{workers}"),
            serde_json::json!({ "relay": relay, "raw": raw, "relay_over_raw": relay / raw, "raw_relay_columns": raw_wide, "relay_over_raw_relay_columns": relay / raw_wide, "pgmq": peer, "relay_over_pgmq": relay / peer, "peak_rss_mib": peak }),
        );
    }
    report.section(
        "drain",
        &format!("Emptying a backlog of {n} messages, messages/s. Raw = claim with SKIP LOCKED + batch delete, no application logic, returning id and payload; *raw, relay's columns* is the same SQL returning every column the relay reads (what a real relay must fetch), which splits the gap into data and relay logic. Peak RSS is the whole benchmark process."),
        &["batch", "workers", "relay", "raw SQL", "relay / raw", "raw, relay's columns", "relay / that", "pgmq", "relay / pgmq", "peak RSS MiB"],
        rows,
        serde_json::Value::Object(json),
    );
    Ok(())
}

/// `scale`: the same backlog drained by 1, 2 and 4 independent relays (each its own
/// pool, one worker, batch 500) sharing one table with no coordinator.
pub(crate) async fn scale(
    bench: &Bench,
    scale: Scale,
    report: &mut Report,
) -> Result<(), BoxError> {
    let n = scale.drain_rows;
    let mut rows = Vec::new();
    let mut json = serde_json::Map::new();
    let mut single = 0.0;
    for relays in [1usize, 2, 4] {
        let outbox = bench
            .fresh_outbox("bench_scale_outbox", PublishedRows::Delete)
            .await?;
        preload(&outbox, &bench.pool, n, false).await?;
        let sink = NoopSink::default();
        let mut running = Vec::new();
        for i in 0..relays {
            let pool = sqlx::postgres::PgPoolOptions::new()
                .max_connections(3)
                .connect(&bench.url)
                .await?;
            let own = outbox_sqlx::postgres::PgOutbox::with_names(pool, outbox.names().clone())
                .published_rows(PublishedRows::Delete);
            let relay = Relay::builder(own)
                .owner(format!("bench-scale-{i}"))
                .route("bench", sink.clone())
                .batch_size(500)
                .poll_interval(Duration::from_millis(20))
                .build()?;
            let count = sink.count.clone();
            running.push(tokio::spawn(relay.run(async move {
                while count.load(Atomic::Relaxed) < n {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            })));
        }
        let started = Instant::now();
        for r in running {
            r.await?;
        }
        let rate = n as f64 / started.elapsed().as_secs_f64();
        if relays == 1 {
            single = rate;
        }
        rows.push(vec![
            relays.to_string(),
            format!("{rate:.0}"),
            format!("{:.2}", rate / single),
        ]);
        json.insert(format!("relays_{relays}"), rate.into());
    }
    report.section(
        "scale",
        &format!("{n} messages drained by independent relays sharing one table (no coordinator), each with its own pool, one worker, batch 500, no-op sink; messages/s. The database runs on the same 2 cores."),
        &["relays", "messages/s", "vs one relay"],
        rows,
        serde_json::Value::Object(json),
    );
    Ok(())
}

pub(crate) async fn preload(
    outbox: &PgOutbox,
    pool: &PgPool,
    n: usize,
    keyed: bool,
) -> Result<(), BoxError> {
    for start in (0..n).step_by(1000) {
        let messages: Vec<NewMessage> = (start..(start + 1000).min(n))
            .map(|i| {
                let b = NewMessage::builder("bench", "bench.event")
                    .json(&serde_json::json!({ "n": i }));
                let b = if keyed {
                    b.partition_key(format!("key-{}", i % KEYS))
                } else {
                    b
                };
                b.build().expect("valid")
            })
            .collect();
        let mut tx = pool.begin().await?;
        outbox.enqueue_all(&mut tx, &messages).await?;
        tx.commit().await?;
    }
    sqlx::query("VACUUM ANALYZE").execute(pool).await.ok();
    Ok(())
}

/// Drains with the relay; `ordering` None means an unkeyed backlog, unordered.
async fn relay_drain(
    bench: &Bench,
    n: usize,
    batch: usize,
    workers: usize,
    ordering: Option<MessageOrder>,
) -> Result<f64, BoxError> {
    let outbox = bench
        .fresh_outbox("bench_drain_outbox", PublishedRows::Delete)
        .await?;
    preload(&outbox, &bench.pool, n, ordering.is_some()).await?;
    let sink = NoopSink::default();
    let relay = Relay::builder(outbox)
        .route("bench", sink.clone())
        .batch_size(batch)
        .concurrency(workers)
        .poll_interval(Duration::from_millis(20))
        .ordering(ordering.unwrap_or_default())
        .build()?;
    let count = sink.count.clone();
    let started = Instant::now();
    relay
        .run(async move {
            while count.load(Atomic::Relaxed) < n {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
    Ok(n as f64 / started.elapsed().as_secs_f64())
}

async fn raw_drain(
    bench: &Bench,
    n: usize,
    batch: usize,
    workers: usize,
    wide: bool,
) -> Result<f64, BoxError> {
    let columns = if wide {
        "t.id, t.destination, t.event_type, t.aggregate_type, t.aggregate_id, t.partition_key, t.tenant_id, t.idempotency_key, t.payload, t.content_type, t.headers::text, t.attempts, t.created_at"
    } else {
        "t.id, t.payload"
    };
    let outbox = bench
        .fresh_outbox("bench_drain_outbox", PublishedRows::Delete)
        .await?;
    preload(&outbox, &bench.pool, n, false).await?;
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..workers {
        let pool = bench.pool.clone();
        let claim = format!(
            "UPDATE bench_drain_outbox t SET status = 'leased', lease_token = $2, available_at = now() + interval '30 seconds' \
             WHERE t.id = ANY(ARRAY(SELECT id FROM bench_drain_outbox WHERE status IN ('pending', 'leased') AND available_at <= now() \
             ORDER BY available_at, id LIMIT $1 FOR UPDATE SKIP LOCKED)) RETURNING {columns}"
        );
        tasks.spawn(async move {
            loop {
                let claimed = sqlx::query(&claim)
                    .bind(batch as i64)
                    .bind(uuid::Uuid::new_v4())
                    .fetch_all(&pool)
                    .await?;
                if claimed.is_empty() {
                    return Ok::<(), sqlx::Error>(());
                }
                let ids: Vec<uuid::Uuid> = claimed.iter().map(|r| r.get(0)).collect();
                sqlx::query("DELETE FROM bench_drain_outbox WHERE id = ANY($1)")
                    .bind(ids)
                    .execute(&pool)
                    .await?;
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    Ok(n as f64 / started.elapsed().as_secs_f64())
}

async fn pgmq_drain(
    bench: &Bench,
    n: usize,
    batch: usize,
    workers: usize,
) -> Result<f64, BoxError> {
    let pool = &bench.pool;
    sqlx::query("SELECT pgmq.purge_queue('bench_drain_q')")
        .execute(pool)
        .await?;
    for start in (0..n).step_by(1000) {
        let msgs: Vec<String> = (start..(start + 1000).min(n))
            .map(|i| serde_json::json!({ "n": i }).to_string())
            .collect();
        sqlx::query("SELECT pgmq.send_batch('bench_drain_q', $1::jsonb[])")
            .bind(msgs)
            .execute(pool)
            .await?;
    }
    sqlx::query("VACUUM ANALYZE").execute(pool).await.ok();
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..workers {
        let pool = pool.clone();
        tasks.spawn(async move {
            loop {
                let ids: Vec<i64> =
                    sqlx::query_scalar("SELECT msg_id FROM pgmq.read('bench_drain_q', 30, $1)")
                        .bind(batch as i32)
                        .fetch_all(&pool)
                        .await?;
                if ids.is_empty() {
                    return Ok::<(), sqlx::Error>(());
                }
                sqlx::query("SELECT pgmq.delete('bench_drain_q', $1::bigint[])")
                    .bind(ids)
                    .execute(&pool)
                    .await?;
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    Ok(n as f64 / started.elapsed().as_secs_f64())
}
