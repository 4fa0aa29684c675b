//! `sqlite` and `mysql`: the enqueue and drain figures of the other two SQL stores, each
//! against raw SQL on the same database in the same run.
//!
//! - enqueue: a business transaction (one `UPDATE`) alone, with a raw `INSERT` into the
//!   outbox table, and with the SDK's `enqueue`; modes interleaved round by round, medians.
//! - drain: a preloaded backlog emptied by the relay (no-op sink, delete on publish) and
//!   by the raw SQL a lease-based relay needs on that database, returning the columns the
//!   relay reads: SQLite's one-statement claim (`UPDATE … RETURNING`) and MySQL's
//!   `READ COMMITTED` transaction (`SELECT … FOR UPDATE SKIP LOCKED` on the due index,
//!   then `UPDATE`), then a batch `DELETE`.

use std::time::{Duration, Instant};

use outbox_engine::NewMessage;
use outbox_sqlx::PublishedRows;
use outbox_sqlx::mysql::MySqlOutbox;
use outbox_sqlx::sqlite::SqliteOutbox;
use sqlx::mysql::MySqlPool;
use sqlx::query::Query;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions};
use sqlx::{Executor, Row};

use crate::Scale;
use crate::report::{Report, added_cost, interleaved_medians};
use crate::setup::{ACCOUNTS, BoxError, bench_batches, mysql_pool, timed_drain};

const TABLE: &str = "bench_store_outbox";
const CONFIGS: [(usize, usize); 3] = [(100, 2), (500, 2), (1000, 1)];
const MODES: [&str; 3] = ["business only", "+ raw INSERT", "+ SDK enqueue"];
/// The columns the relay reads from a claimed row.
const RELAY_COLUMNS: &str = "id, destination, event_type, aggregate_type, aggregate_id, partition_key, tenant_id, idempotency_key, payload, content_type, headers, attempts, created_at";

/// An error that can leave a spawned task.
type TaskError = Box<dyn std::error::Error + Send + Sync>;

/// One of the two databases, with its outbox table.
#[derive(Clone)]
enum Db {
    Sqlite(SqlitePool, SqliteOutbox),
    MySql(MySqlPool, MySqlOutbox),
}

pub(crate) async fn sqlite(scale: Scale, report: &mut Report) -> Result<(), BoxError> {
    let dir = std::env::temp_dir().join(format!("outbox-bench-sqlite-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let options = SqliteConnectOptions::new()
        .filename(dir.join("outbox.db"))
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_secs(30));
    let pool = SqlitePoolOptions::new()
        .max_connections(4)
        .connect_with(options)
        .await?;
    let mut db = Db::sqlite(pool.clone());
    let result = run(&mut db, "SQLite", &[1], scale, report).await;
    pool.close().await;
    std::fs::remove_dir_all(&dir)?;
    result
}

pub(crate) async fn mysql(scale: Scale, report: &mut Report) -> Result<(), BoxError> {
    let pool = mysql_pool(8).await?;
    let version: String = sqlx::query_scalar("SELECT VERSION()")
        .fetch_one(&pool)
        .await?;
    let name = format!("MariaDB {version}");
    let mut db = Db::MySql(pool.clone(), MySqlOutbox::with_names(pool.clone(), names()));
    let result = run(&mut db, &name, &[1, 4], scale, report).await;
    db.drop_table().await?;
    pool.close().await;
    result
}

fn names() -> outbox_sqlx::TableNames {
    outbox_sqlx::TableNames::default()
        .outbox(TABLE)
        .expect("a valid table name")
}

async fn run(
    db: &mut Db,
    store: &str,
    client_counts: &[usize],
    scale: Scale,
    report: &mut Report,
) -> Result<(), BoxError> {
    let section = if matches!(db, Db::Sqlite(..)) {
        "sqlite"
    } else {
        "mysql"
    };
    let mut json = serde_json::Map::new();
    json.insert("store".into(), store.into());

    db.execute("DROP TABLE IF EXISTS bench_accounts").await?;
    db.execute("CREATE TABLE bench_accounts (id INT PRIMARY KEY, balance BIGINT NOT NULL)")
        .await?;
    for start in (1..=ACCOUNTS).step_by(1000) {
        let values: Vec<String> = (start..start + 1000).map(|i| format!("({i}, 0)")).collect();
        db.execute(&format!(
            "INSERT INTO bench_accounts VALUES {}",
            values.join(", ")
        ))
        .await?;
    }
    db.fresh().await?;
    let mut rows = Vec::new();
    for &clients in client_counts {
        let tps = interleaved_medians(MODES.len(), scale.rounds, async |mode| {
            enqueue_rate(db, mode, clients, scale.enqueue_time).await
        })
        .await?;
        let cost = |i: usize| added_cost(&tps, i) * 1e6 * clients as f64;
        for (i, mode) in MODES.iter().enumerate() {
            rows.push(vec![
                "enqueue".to_owned(),
                format!("{clients} client{}", if clients == 1 { "" } else { "s" }),
                (*mode).to_owned(),
                format!("{:.0} tx/s", tps[i]),
                if i == 0 {
                    "—".to_owned()
                } else {
                    format!("{:.0} µs added", cost(i))
                },
                if i == 2 {
                    format!(
                        "{:.2} × raw's added cost",
                        cost(2) / cost(1).max(f64::EPSILON)
                    )
                } else {
                    "—".to_owned()
                },
            ]);
        }
        json.insert(
            format!("enqueue_clients_{clients}"),
            serde_json::json!({
                "tps_business": tps[0], "tps_raw": tps[1], "tps_sdk": tps[2],
                "added_us_raw": cost(1), "added_us_sdk": cost(2),
                "sdk_over_raw_added_cost": cost(2) / cost(1).max(f64::EPSILON),
            }),
        );
    }
    let n = scale.drain_rows;
    for (batch, workers) in CONFIGS {
        db.fresh().await?;
        db.preload(n).await?;
        let relay = db.relay_drain(n, batch, workers).await?;
        db.fresh().await?;
        db.preload(n).await?;
        let raw = db.raw_drain(n, batch, workers).await?;
        rows.push(vec![
            "drain".to_owned(),
            format!("batch {batch} × {workers}"),
            "relay / raw SQL".to_owned(),
            format!("{relay:.0} / {raw:.0} msg/s"),
            "—".to_owned(),
            format!("{:.2} × raw", relay / raw),
        ]);
        json.insert(
            format!("drain_b{batch}_w{workers}"),
            serde_json::json!({ "relay": relay, "raw": raw, "relay_over_raw": relay / raw }),
        );
    }
    db.execute("DROP TABLE bench_accounts").await?;
    report.section(
        section,
        &format!(
            "{store}, same machine. Enqueue: a business transaction (one `UPDATE`) alone, with a raw `INSERT` into the outbox table, and with the SDK's `enqueue`; tx/s, median of interleaved rounds; *added* is the extra time per transaction over the business-only run, per client. Drain: {n} preloaded messages emptied by the relay (no-op sink, delete on publish) and by the raw SQL a lease-based relay needs on this database, returning the relay's columns (claim, lease, batch delete; no application logic)."
        ),
        &["measure", "setting", "mode", "rate", "added cost", "ratio"],
        rows,
        serde_json::Value::Object(json),
    );
    Ok(())
}

/// Transactions per second of `mode` from `clients` connections during `time`.
async fn enqueue_rate(
    db: &Db,
    mode: usize,
    clients: usize,
    time: Duration,
) -> Result<f64, BoxError> {
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for client in 0..clients {
        let db = db.clone();
        tasks.spawn(async move {
            let mut done = 0_u64;
            let mut n = client as i32;
            while started.elapsed() < time {
                n = n.wrapping_mul(1_103_515_245).wrapping_add(12_345) & 0x7fff_ffff;
                db.transaction(mode, n % ACCOUNTS + 1).await?;
                done += 1;
            }
            Ok::<u64, TaskError>(done)
        });
    }
    let mut total = 0;
    while let Some(done) = tasks.join_next().await {
        total += done
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
    }
    Ok(total as f64 / started.elapsed().as_secs_f64())
}

/// `?, ?, …` for `n` parameters.
fn params(n: usize) -> String {
    vec!["?"; n].join(", ")
}

/// The raw drain's batch delete of `n` ids.
fn delete_sql(n: usize) -> String {
    format!("DELETE FROM {TABLE} WHERE id IN ({})", params(n))
}

/// `query` with each of `ids` bound in turn (for its `IN (?, ?, …)` list).
fn with_ids<'q, DB: sqlx::Database>(
    query: Query<'q, DB, DB::Arguments<'q>>,
    ids: &'q [String],
) -> Query<'q, DB, DB::Arguments<'q>>
where
    &'q String: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    ids.iter().fold(query, |query, id| query.bind(id))
}

impl Db {
    fn sqlite(pool: SqlitePool) -> Self {
        let outbox = SqliteOutbox::with_names(pool.clone(), names());
        Self::Sqlite(pool, outbox)
    }

    async fn execute(&self, sql: &str) -> Result<(), sqlx::Error> {
        match self {
            Self::Sqlite(pool, _) => pool.execute(sql).await.map(drop),
            Self::MySql(pool, _) => pool.execute(sql).await.map(drop),
        }
    }

    async fn drop_table(&self) -> Result<(), BoxError> {
        self.execute(&format!("DROP TABLE IF EXISTS {TABLE}"))
            .await?;
        self.execute(&format!("DROP TABLE IF EXISTS {TABLE}_keys"))
            .await?;
        let forget = format!("DELETE FROM outbox_migrations WHERE id LIKE '{TABLE}/%'");
        // The migrations table does not exist before the first migrate.
        let _ = self.execute(&forget).await;
        Ok(())
    }

    /// An empty, migrated outbox table in delete-on-publish mode.
    async fn fresh(&mut self) -> Result<(), BoxError> {
        self.drop_table().await?;
        match self {
            Self::Sqlite(pool, outbox) => {
                *outbox = SqliteOutbox::with_names(pool.clone(), names())
                    .published_rows(PublishedRows::Delete);
                outbox.migrate().await?;
            }
            Self::MySql(pool, outbox) => {
                *outbox = MySqlOutbox::with_names(pool.clone(), names())
                    .published_rows(PublishedRows::Delete);
                outbox.migrate().await?;
            }
        }
        Ok(())
    }

    /// `n` messages through the SDK, 1,000 per transaction.
    async fn preload(&self, n: usize) -> Result<(), BoxError> {
        for messages in bench_batches(n) {
            match self {
                Self::Sqlite(pool, outbox) => {
                    let mut tx = pool.begin().await?;
                    outbox.enqueue_all(&mut tx, &messages).await?;
                    tx.commit().await?;
                }
                Self::MySql(pool, outbox) => {
                    let mut tx = pool.begin().await?;
                    outbox.enqueue_all(&mut tx, &messages).await?;
                    tx.commit().await?;
                }
            }
        }
        match self {
            Self::Sqlite(..) => self.execute("ANALYZE").await?,
            Self::MySql(..) => self.execute(&format!("ANALYZE TABLE {TABLE}")).await?,
        }
        Ok(())
    }

    /// One business transaction: the account update, then nothing (mode 0), a raw
    /// INSERT (1) or the SDK's enqueue (2).
    async fn transaction(&self, mode: usize, account: i32) -> Result<(), TaskError> {
        let payload = serde_json::to_vec(&serde_json::json!({ "account": account, "delta": 1 }))?;
        let message = || {
            NewMessage::builder("accounts", "account.credited")
                .json(&serde_json::json!({ "account": account, "delta": 1 }))
                .build()
                .expect("valid")
        };
        let id = uuid::Uuid::now_v7().to_string();
        match self {
            Self::Sqlite(pool, outbox) => {
                let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
                sqlx::query("UPDATE bench_accounts SET balance = balance + 1 WHERE id = ?1")
                    .bind(account)
                    .execute(&mut *tx)
                    .await?;
                match mode {
                    0 => {}
                    1 => {
                        sqlx::query(&format!(
                            "INSERT INTO {TABLE} (id, destination, event_type, idempotency_key, payload, content_type, available_at, created_at) \
                             VALUES (?1, 'accounts', 'account.credited', ?1, ?2, 'application/json', {now}, {now})",
                            now = outbox_sql::sqlite::NOW_MS
                        ))
                        .bind(&id)
                        .bind(payload)
                        .execute(&mut *tx)
                        .await?;
                    }
                    _ => outbox.enqueue(&mut tx, &message()).await?,
                }
                tx.commit().await?;
            }
            Self::MySql(pool, outbox) => {
                let mut tx = pool.begin().await?;
                sqlx::query("UPDATE bench_accounts SET balance = balance + 1 WHERE id = ?")
                    .bind(account)
                    .execute(&mut *tx)
                    .await?;
                match mode {
                    0 => {}
                    1 => {
                        sqlx::query(&format!(
                            "INSERT INTO {TABLE} (id, destination, event_type, idempotency_key, payload, content_type, headers, available_at, created_at) \
                             VALUES (?, 'accounts', 'account.credited', ?, ?, 'application/json', '{{}}', UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))"
                        ))
                        .bind(&id)
                        .bind(&id)
                        .bind(payload)
                        .execute(&mut *tx)
                        .await?;
                    }
                    _ => outbox.enqueue(&mut tx, &message()).await?,
                }
                tx.commit().await?;
            }
        }
        Ok(())
    }

    async fn relay_drain(&self, n: usize, batch: usize, workers: usize) -> Result<f64, BoxError> {
        match self {
            Self::Sqlite(_, outbox) => timed_drain(outbox.clone(), n, batch, workers).await,
            Self::MySql(_, outbox) => timed_drain(outbox.clone(), n, batch, workers).await,
        }
    }

    /// Empties the table with raw SQL from `workers` tasks, `batch` rows at a time.
    async fn raw_drain(&self, n: usize, batch: usize, workers: usize) -> Result<f64, BoxError> {
        let started = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..workers {
            let db = self.clone();
            tasks.spawn(async move {
                while db.raw_batch(batch).await? > 0 {}
                Ok::<(), TaskError>(())
            });
        }
        while let Some(done) = tasks.join_next().await {
            done.map_err(|e| e.to_string())?
                .map_err(|e| e.to_string())?;
        }
        Ok(n as f64 / started.elapsed().as_secs_f64())
    }

    /// Claims, leases and deletes one batch with raw SQL; returns how many rows it took.
    async fn raw_batch(&self, batch: usize) -> Result<usize, TaskError> {
        let token = uuid::Uuid::new_v4().to_string();
        let ids: Vec<String> = match self {
            Self::Sqlite(pool, _) => {
                let claim = format!(
                    "UPDATE {TABLE} SET status = 'leased', lease_token = ?2, available_at = {now} + 30000 \
                     WHERE id IN (SELECT id FROM {TABLE} WHERE status IN ('pending', 'leased') AND available_at <= {now} \
                     ORDER BY available_at, id LIMIT ?1) RETURNING {RELAY_COLUMNS}",
                    now = outbox_sql::sqlite::NOW_MS
                );
                let claimed = sqlx::query(&claim)
                    .bind(batch as i64)
                    .bind(&token)
                    .fetch_all(pool)
                    .await?;
                let ids: Vec<String> = claimed.iter().map(|r| r.get(0)).collect();
                if !ids.is_empty() {
                    with_ids(sqlx::query(&delete_sql(ids.len())), &ids)
                        .execute(pool)
                        .await?;
                }
                ids
            }
            Self::MySql(pool, _) => {
                let mut tx = pool
                    .begin_with(format!(
                        "{}; START TRANSACTION",
                        outbox_sql::mysql::RELAY_ISOLATION
                    ))
                    .await?;
                let claimed = sqlx::query(&format!(
                    "SELECT {RELAY_COLUMNS} FROM {TABLE} FORCE INDEX ({TABLE}_due_idx) \
                     WHERE status IN ('pending', 'leased') AND available_at <= UTC_TIMESTAMP(6) \
                     ORDER BY available_at, id LIMIT ? FOR UPDATE SKIP LOCKED"
                ))
                .bind(batch as i64)
                .fetch_all(&mut *tx)
                .await?;
                // The id is CHAR(36) in a binary collation, which sqlx reports as BINARY.
                let ids = claimed
                    .iter()
                    .map(|r| r.try_get_unchecked::<String, _>(0))
                    .collect::<Result<Vec<_>, _>>()?;
                if !ids.is_empty() {
                    let lease = format!(
                        "UPDATE {TABLE} SET status = 'leased', lease_token = ?, available_at = UTC_TIMESTAMP(6) + INTERVAL 30 SECOND WHERE id IN ({})",
                        params(ids.len())
                    );
                    with_ids(sqlx::query(&lease).bind(&token), &ids)
                        .execute(&mut *tx)
                        .await?;
                }
                tx.commit().await?;
                if !ids.is_empty() {
                    with_ids(sqlx::query(&delete_sql(ids.len())), &ids)
                        .execute(pool)
                        .await?;
                }
                ids
            }
        };
        Ok(ids.len())
    }
}
