//! The database under test and helpers shared by the scenarios.

use std::time::Duration;

use outbox_engine::{Failure, Message, NewMessage, Outcome, Sink};
use outbox_sqlx::postgres::PgOutbox;
use outbox_sqlx::{PublishedRows, TableNames};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

/// Connection to the benchmark database.
pub(crate) struct Bench {
    pub(crate) pool: PgPool,
    pub(crate) url: String,
}

pub(crate) type BoxError = Box<dyn std::error::Error>;

/// Accounts in the enqueue scenarios' business table.
pub(crate) const ACCOUNTS: i32 = 10_000;

impl Bench {
    pub(crate) async fn connect() -> Result<Self, BoxError> {
        let url = std::env::var("OUTBOX_BENCH_POSTGRES_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
        let pool = PgPoolOptions::new()
            .max_connections(24)
            .acquire_timeout(Duration::from_secs(10))
            .connect(&url)
            .await
            .map_err(|e| format!("cannot reach PostgreSQL at {url} ({e}); run scripts/services.sh or set OUTBOX_BENCH_POSTGRES_URL"))?;
        Ok(Self { pool, url })
    }

    /// A fresh, migrated outbox table named `name`.
    pub(crate) async fn fresh_outbox(
        &self,
        name: &str,
        rows: PublishedRows,
    ) -> Result<PgOutbox, BoxError> {
        sqlx::query(&format!(
            "DROP TABLE IF EXISTS {name}, {name}_keys, {name}_slots CASCADE"
        ))
        .execute(&self.pool)
        .await?;
        sqlx::query("DELETE FROM outbox_migrations WHERE id LIKE $1")
            .bind(format!("{name}/%"))
            .execute(&self.pool)
            .await
            .ok();
        let outbox = PgOutbox::with_names(self.pool.clone(), TableNames::default().outbox(name)?)
            .published_rows(rows);
        outbox.migrate().await?;
        Ok(outbox)
    }

    /// Enqueues [`bench_batches`] of `n` messages into `outbox`, a transaction per batch.
    pub(crate) async fn enqueue_bench(&self, outbox: &PgOutbox, n: usize) -> Result<(), BoxError> {
        for messages in bench_batches(n) {
            let mut tx = self.pool.begin().await?;
            outbox.enqueue_all(&mut tx, &messages).await?;
            tx.commit().await?;
        }
        Ok(())
    }

    /// A fresh `table` of [`ACCOUNTS`] accounts, each at balance 0: what the enqueue
    /// scenarios' business transaction updates.
    pub(crate) async fn fresh_accounts(&self, table: &str) -> Result<(), BoxError> {
        sqlx::query(&format!("DROP TABLE IF EXISTS {table}"))
            .execute(&self.pool)
            .await?;
        sqlx::query(&format!(
            "CREATE TABLE {table} (id int PRIMARY KEY, balance bigint NOT NULL)"
        ))
        .execute(&self.pool)
        .await?;
        sqlx::query(&format!(
            "INSERT INTO {table} SELECT g, 0 FROM generate_series(1, $1) g"
        ))
        .bind(ACCOUNTS)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Adds `n` published rows to `table` as the relay leaves them (available_at NULL),
    /// a day old, in bulk statements of a million rows. Their ids are UUIDv7 of that
    /// time, as the SDK writes them, so they sort before the ids of new messages. `slots`: the table is in the
    /// rotate layout, and the rows go to its three slots in turn.
    pub(crate) async fn fill_published(
        &self,
        table: &str,
        n: usize,
        slots: bool,
    ) -> Result<(), BoxError> {
        let (slot_column, slot) = if slots {
            (", slot", ", (g % 3)::smallint")
        } else {
            ("", "")
        };
        for start in (0..n).step_by(1_000_000) {
            let end = (start + 1_000_000).min(n);
            sqlx::query(&format!(
                "INSERT INTO {table} (id, destination, event_type, idempotency_key, payload, content_type, status, attempts, available_at, created_at, published_at{slot_column}) \
                 SELECT (lpad(to_hex((extract(epoch FROM now() - interval '1 day') * 1000)::bigint + g / 1000), 12, '0') || '7' || substr(md5(g::text), 1, 3) || '8' || substr(md5(g::text), 4, 15))::uuid, 'bench', 'bench.event', g::text, convert_to('{{\"n\":' || g || '}}', 'UTF8'), 'application/json', 'published', 1, NULL, \
                        now() - interval '1 day', now() - interval '1 day'{slot} FROM generate_series($1::bigint, $2::bigint) g"
            ))
            .bind(start as i64)
            .bind(end as i64 - 1)
            .execute(&self.pool)
            .await?;
        }
        Ok(())
    }
}

/// A pool of `connections` to the MariaDB server of `OUTBOX_BENCH_MYSQL_URL` (by default
/// the one `scripts/services.sh` starts).
pub(crate) async fn mysql_pool(connections: u32) -> Result<sqlx::MySqlPool, BoxError> {
    let url = std::env::var("OUTBOX_BENCH_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_owned());
    Ok(sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(connections)
        .connect(&url)
        .await
        .map_err(|e| format!("MariaDB is not reachable at {url} ({e}); run scripts/services.sh or set OUTBOX_BENCH_MYSQL_URL"))?)
}

/// Ticks for one of `producers` producers that share `rate` commits per second; a tick
/// missed while a commit ran is skipped, not made up.
pub(crate) fn producer_ticks(producers: u64, rate: u64) -> tokio::time::Interval {
    let period = Duration::from_secs_f64(producers as f64 / rate as f64);
    let mut ticks = tokio::time::interval(period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    ticks
}

/// Enqueues `message` in a transaction of its own, and commits.
pub(crate) async fn commit_one(
    pool: &PgPool,
    outbox: &PgOutbox,
    message: &NewMessage,
) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin().await?;
    outbox
        .enqueue(&mut tx, message)
        .await
        .map_err(|e| sqlx::Error::Protocol(e.to_string()))?;
    tx.commit().await
}

/// Acknowledges everything at once and counts; the relay's own cost is what is measured.
#[derive(Clone, Default)]
pub(crate) struct NoopSink {
    pub(crate) count: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Sink for NoopSink {
    async fn publish(
        &self,
        batch: &[Message],
        _cx: &outbox_engine::PublishContext,
    ) -> Result<Vec<Outcome>, Failure> {
        self.count
            .fetch_add(batch.len(), std::sync::atomic::Ordering::Relaxed);
        Ok(vec![Outcome::published(); batch.len()])
    }
}

/// CPU time spent so far, in seconds: by this process, and by every PostgreSQL process
/// of the machine (the database under test shares its cores). Read from /proc at the
/// kernel's 100 ticks per second, so it suits runs of a second or more.
#[derive(Clone, Copy)]
pub(crate) struct Cpu {
    client: f64,
    database: f64,
}

impl Cpu {
    pub(crate) fn now() -> Self {
        let ticks = |stat: &str| {
            // The fields after the command name, which is in parentheses and may hold spaces.
            let fields: Vec<&str> = stat
                .rsplit_once(')')
                .map_or("", |(_, rest)| rest)
                .split_whitespace()
                .collect();
            let field = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok());
            // utime and stime are the 14th and 15th fields; the state (3rd) is fields[0].
            field(11).unwrap_or(0.0) + field(12).unwrap_or(0.0)
        };
        let own = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
        let mut database = 0.0;
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let path = entry.path();
            let is_postgres = std::fs::read_to_string(path.join("comm"))
                .is_ok_and(|comm| comm.trim() == "postgres");
            if is_postgres && let Ok(stat) = std::fs::read_to_string(path.join("stat")) {
                database += ticks(&stat);
            }
        }
        Self {
            client: ticks(&own) / 100.0,
            database: database / 100.0,
        }
    }

    /// The CPU spent since `self`, in microseconds per message of `n`.
    pub(crate) fn per_message_since(self, n: usize) -> (f64, f64) {
        let now = Self::now();
        let per = |seconds: f64| seconds * 1e6 / n as f64;
        (
            per(now.client - self.client),
            per(now.database - self.database),
        )
    }
}

/// Peak and current resident memory of this process, in MiB (from /proc).
pub(crate) fn memory_mib() -> (f64, f64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<f64>().ok())
            .map_or(0.0, |kb| kb / 1024.0)
    };
    (field("VmHWM:"), field("VmRSS:"))
}

/// Runs a relay over `store` until `n` messages went through a no-op sink; messages/s.
pub(crate) async fn timed_drain<S: outbox_engine::Store>(
    store: S,
    n: usize,
    batch: usize,
    workers: usize,
) -> Result<f64, BoxError> {
    timed_drain_checking(store, n, batch, workers, Duration::from_millis(5)).await
}

/// [`timed_drain`], checking the sink's count every `check` (the drain's end is seen up to
/// that much late).
pub(crate) async fn timed_drain_checking<S: outbox_engine::Store>(
    store: S,
    n: usize,
    batch: usize,
    workers: usize,
    check: Duration,
) -> Result<f64, BoxError> {
    let sink = NoopSink::default();
    let relay = outbox_engine::Relay::builder(store)
        .route("bench", sink.clone())
        .batch_size(batch)
        .concurrency(workers)
        .poll_interval(std::time::Duration::from_millis(20))
        .build()?;
    let count = sink.count.clone();
    let started = std::time::Instant::now();
    relay
        .run(async move {
            while count.load(std::sync::atomic::Ordering::Relaxed) < n {
                tokio::time::sleep(check).await;
            }
        })
        .await;
    Ok(n as f64 / started.elapsed().as_secs_f64())
}

/// The benchmark's messages `{"n": i}` for each `i` of `range`, to destination `bench`.
pub(crate) fn bench_messages(range: std::ops::Range<usize>) -> Vec<NewMessage> {
    range
        .map(|i| {
            NewMessage::builder("bench", "bench.event")
                .json(&serde_json::json!({ "n": i }))
                .build()
                .expect("valid")
        })
        .collect()
}

/// [`bench_messages`] `0..n`, in lists of 1,000 (one transaction each).
pub(crate) fn bench_batches(n: usize) -> impl Iterator<Item = Vec<NewMessage>> {
    (0..n)
        .step_by(1000)
        .map(move |start| bench_messages(start..(start + 1000).min(n)))
}

/// Prebuilt items that concurrent publishers take `batch` at a time, each batch once.
pub(crate) struct SharedBatches<T> {
    items: std::sync::Arc<Vec<T>>,
    next: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    batch: usize,
}

impl<T> Clone for SharedBatches<T> {
    fn clone(&self) -> Self {
        Self {
            items: self.items.clone(),
            next: self.next.clone(),
            batch: self.batch,
        }
    }
}

impl<T> SharedBatches<T> {
    pub(crate) fn new(items: Vec<T>, batch: usize) -> Self {
        Self {
            items: std::sync::Arc::new(items),
            next: std::sync::Arc::default(),
            batch,
        }
    }

    /// Messages per second while `publishers` tasks, each made by `publisher` from these
    /// batches, publish every item (each task takes batches until none is left).
    pub(crate) async fn publish_rate<F, Fut>(
        self,
        publishers: usize,
        publisher: F,
    ) -> Result<f64, BoxError>
    where
        F: Fn(Self) -> Fut,
        Fut: std::future::Future<Output = Result<(), String>> + Send + 'static,
    {
        let n = self.items.len();
        let started = std::time::Instant::now();
        let tasks: Vec<_> = (0..publishers)
            .map(|_| tokio::spawn(publisher(self.clone())))
            .collect();
        for task in tasks {
            task.await??;
        }
        Ok(n as f64 / started.elapsed().as_secs_f64())
    }

    /// The next batch no publisher took yet; `None` once all are taken.
    pub(crate) fn take(&self) -> Option<&[T]> {
        let start = self
            .next
            .fetch_add(self.batch, std::sync::atomic::Ordering::Relaxed);
        let end = (start + self.batch).min(self.items.len());
        (start < self.items.len()).then(|| &self.items[start..end])
    }
}
