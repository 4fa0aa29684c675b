//! `gauges`: what the relay's gauges cost on a table full of finished rows (10 million in a
//! full run), on PostgreSQL, SQLite and MySQL/MariaDB. Baseline in the same run: the full
//! `stats` scan that the gauges replace, on the same table.

use std::time::{Duration, Instant};

use outbox_engine::{NewMessage, Store, StoreStats};
use outbox_sqlx::PublishedRows;
use outbox_sqlx::mysql::MySqlOutbox;
use outbox_sqlx::sqlite::SqliteOutbox;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};

use crate::Scale;
use crate::report::Report;
use crate::setup::{Bench, BoxError, bench_messages, mysql_pool};

/// Unfinished rows next to the finished ones, and dead letters.
const PENDING: usize = 1_000;
const DEAD: usize = 100;
const READS: usize = 21;
const LIMIT: usize = 50_000;

pub(crate) async fn run(bench: &Bench, scale: Scale, report: &mut Report) -> Result<(), BoxError> {
    let finished = scale.finished_rows;
    let postgres = postgres(bench, finished).await?;
    let sqlite = sqlite(finished).await?;
    let mysql = mysql(finished).await?;
    let mut rows = Vec::new();
    let mut json = serde_json::Map::new();
    for (store, (gauges, stats)) in [
        ("PostgreSQL", postgres),
        ("SQLite", sqlite),
        ("MariaDB", mysql),
    ] {
        rows.push(vec![
            store.to_owned(),
            finished.to_string(),
            format!("{:.2}", ms(gauges)),
            format!("{:.0}", ms(stats)),
            format!("{:.4}", gauges.as_secs_f64() / stats.as_secs_f64()),
        ]);
        json.insert(
            store.to_lowercase(),
            serde_json::json!({ "gauges_ms": ms(gauges), "stats_ms": ms(stats) }),
        );
    }
    json.insert("finished_rows".into(), finished.into());
    report.section(
        "gauges",
        &format!("The relay's gauges (`Store::gauges`, limit {LIMIT}: pending, leased, dead, halted keys, oldest age) on a table of finished rows plus {PENDING} pending rows and {DEAD} dead letters, median of {READS} reads, against the full `stats` scan of the same table. Target: < 50 ms."),
        &["store", "finished rows", "gauges ms", "stats ms", "gauges / stats"],
        rows,
        serde_json::Value::Object(json),
    );
    Ok(())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The [`PENDING`] messages next to the finished rows.
fn pending() -> Vec<NewMessage> {
    bench_messages(0..PENDING)
}

/// The median of [`READS`] gauge reads, and one stats read, checking the counts.
async fn measure<S: Store + StoreStats>(store: &S) -> Result<(Duration, Duration), BoxError> {
    let mut times = Vec::with_capacity(READS);
    for _ in 0..READS {
        let started = Instant::now();
        let gauges = store.gauges(LIMIT).await?.ok_or("the store has gauges")?;
        times.push(started.elapsed());
        let d = gauges.destination("bench").ok_or("bench gauges")?;
        if (d.pending, d.dead, gauges.truncated) != (PENDING as u64, DEAD as u64, false) {
            return Err(format!("gauges do not match the table: {gauges:?}").into());
        }
    }
    times.sort();
    let started = Instant::now();
    store.stats().await?;
    Ok((times[READS / 2], started.elapsed()))
}

async fn postgres(bench: &Bench, finished: usize) -> Result<(Duration, Duration), BoxError> {
    let outbox = bench
        .fresh_outbox("bench_gauges_outbox", PublishedRows::Keep)
        .await?;
    let pool = &bench.pool;
    bench
        .fill_published("bench_gauges_outbox", finished, false)
        .await?;
    let mut tx = pool.begin().await?;
    outbox.enqueue_all(&mut tx, &pending()).await?;
    tx.commit().await?;
    sqlx::query(&format!(
        "INSERT INTO bench_gauges_outbox (id, destination, event_type, idempotency_key, payload, content_type, status, attempts, created_at, dead_at, last_error) \
         SELECT gen_random_uuid(), 'bench', 'bench.event', 'dead' || g, '\\x7b7d', 'application/json', 'dead', 1, now(), now(), 'bench' FROM generate_series(1, {DEAD}) g"
    ))
    .execute(pool)
    .await?;
    sqlx::query("VACUUM ANALYZE bench_gauges_outbox")
        .execute(pool)
        .await?;
    let figures = measure(&outbox).await?;
    sqlx::query("DROP TABLE bench_gauges_outbox CASCADE")
        .execute(pool)
        .await?;
    Ok(figures)
}

async fn sqlite(finished: usize) -> Result<(Duration, Duration), BoxError> {
    let dir = std::env::temp_dir().join(format!("outbox-bench-gauges-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let options = SqliteConnectOptions::new()
        .filename(dir.join("outbox.db"))
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal);
    let pool = SqlitePoolOptions::new()
        .max_connections(2)
        .connect_with(options)
        .await?;
    let outbox = SqliteOutbox::new(pool.clone());
    outbox.migrate().await?;
    let now_ms = chrono::Utc::now().timestamp_millis();
    sqlx::query(
        "WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < ?1) \
         INSERT INTO outbox (id, destination, event_type, idempotency_key, payload, content_type, status, attempts, available_at, created_at, published_at) \
         SELECT printf('00000000-0000-7000-8000-%012d', n), 'bench', 'bench.event', n, CAST('{}' AS BLOB), 'application/json', 'published', 1, NULL, ?2, ?2 FROM g",
    )
    .bind(finished as i64)
    .bind(now_ms - 86_400_000)
    .execute(&pool)
    .await?;
    let mut tx = pool.begin().await?;
    outbox.enqueue_all(&mut tx, &pending()).await?;
    tx.commit().await?;
    sqlx::query(
        "WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < ?1) \
         INSERT INTO outbox (id, destination, event_type, idempotency_key, payload, content_type, status, attempts, created_at, dead_at, last_error) \
         SELECT printf('00000000-0000-7000-9000-%012d', n), 'bench', 'bench.event', 'dead' || n, CAST('{}' AS BLOB), 'application/json', 'dead', 1, ?2, ?2, 'bench' FROM g",
    )
    .bind(DEAD as i64)
    .bind(now_ms)
    .execute(&pool)
    .await?;
    sqlx::query("ANALYZE").execute(&pool).await?;
    let figures = measure(&outbox).await?;
    pool.close().await;
    std::fs::remove_dir_all(&dir)?;
    Ok(figures)
}

/// MariaDB (its `seq_1_to_N` sequence tables fill the finished rows). The table's writer
/// trigger, which checks rows written by other languages one by one, is dropped for the
/// bulk fill; the pending rows go through the SDK's enqueue, which does not need it.
async fn mysql(finished: usize) -> Result<(Duration, Duration), BoxError> {
    let pool = mysql_pool(2).await?;
    let table = "bench_gauges_outbox";
    drop_mysql(&pool, table).await?;
    let names = outbox_sqlx::TableNames::default().outbox(table)?;
    let outbox = MySqlOutbox::with_names(pool.clone(), names);
    outbox.migrate().await?;
    let triggers: Vec<String> = sqlx::query_scalar(
        "SELECT TRIGGER_NAME FROM information_schema.TRIGGERS WHERE EVENT_OBJECT_SCHEMA = DATABASE() AND EVENT_OBJECT_TABLE = ?",
    )
    .bind(table)
    .fetch_all(&pool)
    .await?;
    for trigger in triggers {
        sqlx::query(&format!("DROP TRIGGER `{trigger}`"))
            .execute(&pool)
            .await?;
    }
    for start in (0..finished).step_by(1_000_000) {
        let end = (start + 1_000_000).min(finished);
        sqlx::query(&format!(
            "INSERT INTO {table} (id, destination, event_type, idempotency_key, payload, content_type, headers, status, attempts, available_at, created_at, published_at) \
             SELECT CONCAT('00000000-0000-7000-8000-', LPAD(seq, 12, '0')), 'bench', 'bench.event', seq, '{{}}', 'application/json', '{{}}', 'published', 1, NULL, \
                    UTC_TIMESTAMP(6) - INTERVAL 1 DAY, UTC_TIMESTAMP(6) - INTERVAL 1 DAY FROM seq_{}_to_{end}",
            start + 1
        ))
        .execute(&pool)
        .await?;
    }
    let mut tx = pool.begin().await?;
    outbox.enqueue_all(&mut tx, &pending()).await?;
    tx.commit().await?;
    sqlx::query(&format!(
        "INSERT INTO {table} (id, destination, event_type, idempotency_key, payload, content_type, headers, status, attempts, created_at, dead_at, last_error) \
         SELECT CONCAT('00000000-0000-7000-9000-', LPAD(seq, 12, '0')), 'bench', 'bench.event', CONCAT('dead', seq), '{{}}', 'application/json', '{{}}', 'dead', 1, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), 'bench' FROM seq_1_to_{DEAD}"
    ))
    .execute(&pool)
    .await?;
    sqlx::query(&format!("ANALYZE TABLE {table}"))
        .execute(&pool)
        .await?;
    let figures = measure(&outbox).await?;
    drop_mysql(&pool, table).await?;
    pool.close().await;
    Ok(figures)
}

/// Drops a MySQL outbox table and forgets its migration records (the migrations table
/// may not exist yet).
async fn drop_mysql(pool: &sqlx::MySqlPool, table: &str) -> Result<(), BoxError> {
    sqlx::query(&format!("DROP TABLE IF EXISTS {table}, {table}_keys"))
        .execute(pool)
        .await?;
    let _ = sqlx::query("DELETE FROM outbox_migrations WHERE id LIKE CONCAT(?, '/%')")
        .bind(table)
        .execute(pool)
        .await;
    Ok(())
}
