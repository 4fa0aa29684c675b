//! The SQLite store, enqueue and inbox: the embedded outbox, no server needed.
//!
//! Times are unix milliseconds computed by SQLite, ids and lease tokens are UUID text, and
//! every relay operation (claim, completion, release) is one atomic statement, so the
//! relay never holds a transaction open.
//!
//! # Pool settings
//!
//! Open the database in WAL mode with a busy timeout. WAL lets readers run while one
//! connection writes; the busy timeout makes a writer wait for SQLite's single write lock
//! instead of failing at once with `SQLITE_BUSY`:
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
//!
//! let options = SqliteConnectOptions::new()
//!     .filename("app.db")
//!     .create_if_missing(true)
//!     .journal_mode(SqliteJournalMode::Wal)
//!     .busy_timeout(Duration::from_secs(5));
//! let pool = SqlitePoolOptions::new().max_connections(8).connect_with(options).await?;
//! # Ok(())
//! # }
//! ```
//!
//! sqlx leaves the journal mode as the file has it (a new file starts in rollback-journal
//! mode, where a writer blocks readers) and does not create a missing file unless asked;
//! its busy timeout is 5 s by default. Do not use `:memory:` with a pool: each connection
//! would get its own empty database. With WAL, `synchronous = NORMAL` is a common trade:
//! a commit survives a process crash but the last commits may be lost (never torn) on
//! power loss; SQLite's default, `FULL`, survives both.
//!
//! # Write transactions
//!
//! SQLite has one writer at a time. A transaction opened with a plain `BEGIN` that
//! *reads* first and writes later may fail with `SQLITE_BUSY` when another connection
//! wrote in between (the busy timeout cannot help: its snapshot is stale). Open business
//! transactions that read before they write with `pool.begin_with("BEGIN IMMEDIATE")`,
//! which takes the write lock up front (waiting up to the busy timeout). A transaction
//! whose first statement is a write behaves the same way.
//!
//! # Per-key ordering
//!
//! Relays built with [`MessageOrder::PerKey`] publish the messages of one partition key one
//! at a time, in commit order. The order is fixed when a message is enqueued:
//! [`SqliteOutbox::enqueue`] first bumps a counter row for the key (in the table
//! `<outbox>_keys`) and stores the number with the message, all in your transaction. A
//! second transaction enqueueing for the same key therefore waits until the first commits
//! or rolls back, and is numbered after it. On SQLite that wait is nothing new: the
//! database has one writer at a time, so your transaction holds the write lock from its
//! first write until it ends, and every other writer (of any key, or of no key) waits for
//! it anyway. Numbering adds no waiting of its own, and the numbers follow commit order.
//! (PostgreSQL numbers rows at commit instead; there, writers of one key wait only for
//! each other's commit.) A keyed message costs one extra statement (one per distinct key
//! in [`enqueue_all`](SqliteOutbox::enqueue_all)). An ordered claim leases a keyed message
//! only when no earlier message of its key is pending or leased (or dead, under
//! [`DeadHead::Halt`]); messages without a partition key are never held back.
//!
//! # Wakeups
//!
//! SQLite has no LISTEN/NOTIFY. With SQLite the writer and the relay share a process (and
//! a database file), so the store's wakeup is in-process: a relay that listens (as
//! `outbox::Outbox` does, through [`Backend::listen`](outbox_engine::Backend::listen))
//! wakes when you call [`Backend::notify`](outbox_engine::Backend::notify) **after** your
//! transaction committed. The relay's poll interval remains the fallback.
//!
//! ```no_run
//! # async fn example(pool: sqlx::SqlitePool) -> Result<(), Box<dyn std::error::Error>> {
//! use outbox_engine::{Backend, NewMessage, Relay};
//! use outbox_engine::testkit::RecordingSink;
//! use outbox_sqlx::sqlite::SqliteOutbox;
//!
//! let outbox = SqliteOutbox::new(pool.clone());
//! outbox.migrate().await?;
//!
//! // The relay, in the same process, woken by the store's in-process signal.
//! let listener = outbox.listen().await?.expect("SQLite has an in-process wakeup");
//! let relay = Relay::builder(outbox.clone())
//!     .route("billing", RecordingSink::new())
//!     .wakeup(listener.wakeup())
//!     .build()?;
//! tokio::spawn(relay.run(std::future::pending()));
//!
//! // A business transaction that enqueues a message.
//! let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
//! sqlx::query("UPDATE orders SET status = 'paid' WHERE id = ?1").bind(42_i64).execute(&mut *tx).await?;
//! outbox.enqueue(&mut tx, &NewMessage::builder("billing", "order.paid").json(&42).build()?).await?;
//! tx.commit().await?;
//! outbox.notify().await?; // after commit: the relay claims now instead of at its next poll
//! # Ok(())
//! # }
//! ```

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use outbox_engine::Wakeup;
use outbox_engine::{
    Availability, Claim, ClaimRequest, CompleteAction, CompleteReport, Completion, DeadHead,
    DeadLetter, DeadLetterFilter, DeadLetters, DestinationStats, Lease, LeaseToken, Message,
    MessageId, MessageOrder, NewMessage, Purge, PurgeRequest, Rejected, Stats, Store, StoreError,
    StoreErrorKind, StoreStats,
};
use outbox_sql::sqlite::Statements;
use outbox_sql::{Dialect, TableNames};
use sqlx::Row;
use sqlx::sqlite::{
    Sqlite, SqliteArguments, SqliteConnection, SqlitePool, SqliteQueryResult, SqliteRow,
};
use tracing::warn;
use uuid::Uuid;

use crate::PublishedRows;
use crate::common::{
    attempts, count, headers_json, limit, millis, read_headers, stored_id, undecodable,
};
use crate::error::classify;
use crate::inbox::{InboxDialect, SqlInbox};

/// The outbox on SQLite: enqueue in your transaction, and the relay's [`Store`].
///
/// Cheap to clone; clones share the pool and the rendered statements. See the
/// [module documentation](self) for the recommended pool settings and for wakeups.
#[derive(Debug, Clone)]
pub struct SqliteOutbox {
    pool: SqlitePool,
    inner: Arc<Inner>,
    /// Raised by [`Backend::notify`](outbox_engine::Backend::notify): relays in this process
    /// that listen wake up at once; others find the rows at their next poll.
    wakeup: Wakeup,
}

#[derive(Debug)]
struct Inner {
    names: TableNames,
    sql: Statements,
    published: PublishedRows,
}

impl SqliteOutbox {
    /// The outbox in table `outbox` (in the `main` database).
    pub fn new(pool: SqlitePool) -> Self {
        Self::with_names(pool, TableNames::default())
    }

    /// The outbox in the tables `names` gives. A schema names an attached database
    /// (`main`, or one attached on every connection of the pool).
    ///
    /// SQLite compares ASCII letters in names case-insensitively, so two names that differ
    /// only in ASCII case name the same table.
    pub fn with_names(pool: SqlitePool, names: TableNames) -> Self {
        Self {
            pool,
            wakeup: Wakeup::new(),
            inner: Arc::new(Inner {
                sql: Statements::new(&names),
                names,
                published: PublishedRows::Keep,
            }),
        }
    }

    /// Keeps or deletes rows once published (default: keep, purge later).
    pub fn published_rows(self, mode: PublishedRows) -> Self {
        let inner = Inner {
            names: self.inner.names.clone(),
            sql: self.inner.sql.clone(),
            published: mode,
        };
        Self {
            pool: self.pool,
            inner: Arc::new(inner),
            wakeup: self.wakeup,
        }
    }

    /// The pool the relay side uses.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// The table names.
    pub fn names(&self) -> &TableNames {
        &self.inner.names
    }

    /// Creates the outbox table and its indexes if missing, and records the migrations
    /// applied. Idempotent; everything runs in one `BEGIN IMMEDIATE` transaction, so
    /// concurrent callers take turns and a failure leaves nothing half-made.
    ///
    /// # Errors
    ///
    /// A [`StoreError`]; kind `Schema` if an unrelated table already has the name.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let migrations = outbox_sql::outbox_migrations(Dialect::Sqlite, &self.inner.names);
        run_migrations(&self.pool, &self.inner.sql, &migrations).await
    }

    /// Inserts `message` on `conn` — normally your open transaction (`&mut tx`). Runs one
    /// `INSERT`, preceded for a message with a partition key by one statement that
    /// numbers it (see [per-key ordering](self#per-key-ordering)); never commits and uses
    /// no other connection. (On a connection outside a transaction each statement commits
    /// by itself: the numbering and the insert then commit separately, so two enqueues of
    /// one key that overlap in time are ordered by their numbers, which need not be the
    /// order their rows became visible. Enqueue keyed messages inside a transaction.)
    ///
    /// # Errors
    ///
    /// [`StoreError`] of kind `Constraint` if the id exists, or the database's error. The
    /// failed insert inserted nothing (the key's counter may have moved on, which is
    /// harmless); roll your transaction back as for any failed statement.
    pub async fn enqueue(
        &self,
        conn: &mut SqliteConnection,
        message: &NewMessage,
    ) -> Result<(), StoreError> {
        let seq = match message.partition_key() {
            Some(key) => Some(self.next_seq(conn, key, 1).await?),
            None => None,
        };
        self.insert(conn, message, seq).await
    }

    /// Inserts `messages` on `conn`, one `INSERT` each (and one numbering statement per
    /// distinct partition key), inside a savepoint so that either all of them or none are
    /// inserted; see [`enqueue`](Self::enqueue). Messages of one key are numbered in the
    /// order of the slice. On a connection in a transaction the savepoint is only
    /// released, never committed: your commit decides. (On a connection outside any
    /// transaction, the savepoint is itself the transaction, as one multi-row statement
    /// would be.)
    ///
    /// Open your transaction through sqlx (`pool.begin()`, `begin_with(..)`), which
    /// tracks the nesting; a `BEGIN` sent as a plain query is invisible to it and makes
    /// this call fail.
    ///
    /// # Errors
    ///
    /// As [`enqueue`](Self::enqueue); no message of the batch is inserted if any fails.
    pub async fn enqueue_all(
        &self,
        conn: &mut SqliteConnection,
        messages: &[NewMessage],
    ) -> Result<u64, StoreError> {
        match messages {
            [] => Ok(0),
            [one] => self.enqueue(conn, one).await.map(|()| 1),
            many => {
                // A nested sqlx transaction is a SAVEPOINT; if this future is dropped or
                // a statement fails, sqlx rolls back to it, leaving the caller's
                // transaction as it was.
                let mut savepoint = sqlx::Connection::begin(conn).await.map_err(classify)?;
                let seqs = self.number(&mut savepoint, many).await?;
                for (message, seq) in many.iter().zip(seqs) {
                    self.insert(&mut savepoint, message, seq).await?;
                }
                savepoint.commit().await.map_err(classify)?;
                Ok(many.len() as u64)
            }
        }
    }

    /// Bumps the counter of `key` by `count`; returns the last of the `count` numbers.
    async fn next_seq(
        &self,
        conn: &mut SqliteConnection,
        key: &str,
        count: usize,
    ) -> Result<i64, StoreError> {
        sqlx::query_scalar(&self.inner.sql.next_seq)
            .bind(key)
            .bind(limit(count))
            .fetch_one(conn)
            .await
            .map_err(classify)
    }

    /// Numbers the keyed messages of a batch: one counter bump per distinct key, numbers
    /// handed out in slice order. `None` for messages without a key.
    async fn number(
        &self,
        conn: &mut SqliteConnection,
        messages: &[NewMessage],
    ) -> Result<Vec<Option<i64>>, StoreError> {
        let mut per_key: BTreeMap<&str, (usize, i64)> = BTreeMap::new();
        for key in messages.iter().filter_map(NewMessage::partition_key) {
            per_key.entry(key).or_default().0 += 1;
        }
        for (key, (count, next)) in &mut per_key {
            let last = self.next_seq(conn, key, *count).await?;
            *next = last - limit(*count) + 1;
        }
        Ok(messages
            .iter()
            .map(|m| {
                let (_, next) = per_key.get_mut(m.partition_key()?)?;
                *next += 1;
                Some(*next - 1)
            })
            .collect())
    }

    async fn insert(
        &self,
        conn: &mut SqliteConnection,
        message: &NewMessage,
        seq: Option<i64>,
    ) -> Result<(), StoreError> {
        let (at, delay_ms) = availability_ms(message);
        sqlx::query(&self.inner.sql.insert)
            .bind(message.id().to_string())
            .bind(message.destination())
            .bind(message.event_type())
            .bind(message.aggregate_type())
            .bind(message.aggregate_id())
            .bind(message.partition_key())
            .bind(message.tenant_id())
            .bind(message.idempotency_key())
            .bind(message.payload())
            .bind(message.content_type())
            .bind(headers_json(message.headers()))
            .bind(at)
            .bind(delay_ms)
            .bind(seq)
            .execute(conn)
            .await
            .map_err(classify)?;
        Ok(())
    }

    /// Reads a claimed or dead row; the error names the column that could not be read.
    /// With `strict_headers` off, headers that cannot be read are left empty (for listing
    /// the dead letters such rows became).
    fn message(row: &SqliteRow, strict_headers: bool) -> Result<Message, String> {
        fn get<'r, T: sqlx::Decode<'r, sqlx::Sqlite> + sqlx::Type<sqlx::Sqlite>>(
            row: &'r SqliteRow,
            column: &str,
        ) -> Result<T, String> {
            row.try_get(column).map_err(|e| undecodable(column, e))
        }
        let created_at = get(row, "created_at")?;
        let mut m = Message::from_parts(
            stored_id(&get::<String>(row, "id")?)?,
            get(row, "destination")?,
            get(row, "event_type")?,
            get(row, "payload")?,
            get(row, "content_type")?,
            get(row, "idempotency_key")?,
            attempts(get(row, "attempts")?),
            DateTime::from_timestamp_millis(created_at).ok_or_else(|| {
                undecodable(
                    "created_at",
                    format!("{created_at} is not unix milliseconds in range"),
                )
            })?,
        );
        m.aggregate_type = get(row, "aggregate_type")?;
        m.aggregate_id = get(row, "aggregate_id")?;
        m.partition_key = get(row, "partition_key")?;
        m.tenant_id = get(row, "tenant_id")?;
        read_headers(&mut m, &get::<String>(row, "headers")?, strict_headers)?;
        Ok(m)
    }

    fn dead_query<'q>(
        sql: &'q str,
        filter: &DeadLetterFilter,
    ) -> sqlx::query::Query<'q, sqlx::Sqlite, SqliteArguments<'q>> {
        let ids =
            (!filter.ids.is_empty()).then(|| json_list(filter.ids.iter().map(ToString::to_string)));
        let destinations =
            (!filter.destinations.is_empty()).then(|| json_list(filter.destinations.iter()));
        let event_types =
            (!filter.event_types.is_empty()).then(|| json_list(filter.event_types.iter()));
        sqlx::query(sql)
            .bind(ids)
            .bind(destinations)
            .bind(event_types)
            .bind(filter.created_after.map(ceil_ms))
            .bind(filter.created_before.map(ceil_ms))
            .bind(filter.error_contains.clone())
    }
}

/// When a new message is due, in the form the insert binds: absolute unix milliseconds,
/// or a delay from SQLite's now.
fn availability_ms(message: &NewMessage) -> (Option<i64>, i64) {
    match message.availability() {
        Availability::Now => (None, 0),
        Availability::After(delay) => (None, millis(delay)),
        // Rounded up, so the message is never claimed before `at`.
        Availability::At(at) => (Some(ceil_ms(at)), 0),
    }
}

/// `t` in unix milliseconds, rounded up. Stored times are whole milliseconds, so for a
/// stored `c`, `c >= t` exactly when `c >= ceil_ms(t)` (and likewise for `<`).
fn ceil_ms(t: DateTime<Utc>) -> i64 {
    let floor = t.timestamp_millis();
    if t.timestamp_subsec_nanos().is_multiple_of(1_000_000) {
        floor
    } else {
        floor.saturating_add(1)
    }
}

fn from_ms(ms: i64) -> Result<DateTime<Utc>, StoreError> {
    DateTime::from_timestamp_millis(ms).ok_or_else(|| {
        StoreError::new(
            StoreErrorKind::Schema,
            format!("time column holds {ms}, not unix milliseconds in range"),
        )
    })
}

fn uuid(text: &str) -> Result<Uuid, StoreError> {
    Uuid::parse_str(text).map_err(|e| {
        StoreError::new(
            StoreErrorKind::Schema,
            format!("id column holds {text:?}, not a UUID: {e}"),
        )
    })
}

/// A text column as far as it can be read, for naming a row that cannot be decoded.
fn raw_text(row: &SqliteRow, column: &str) -> String {
    match row.try_get_unchecked::<Vec<u8>, _>(column) {
        Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
        Err(_) => format!("<unreadable {column}>"),
    }
}

/// A JSON array of strings, as the statements read it with `json_each`.
fn json_list<S: AsRef<str>>(items: impl IntoIterator<Item = S>) -> String {
    let items: Vec<serde_json::Value> = items
        .into_iter()
        .map(|s| serde_json::Value::String(s.as_ref().to_owned()))
        .collect();
    serde_json::Value::Array(items).to_string()
}

async fn run_migrations(
    pool: &SqlitePool,
    sql: &Statements,
    migrations: &[outbox_sql::Migration],
) -> Result<(), StoreError> {
    // IMMEDIATE takes the write lock before the first read, so two migrating processes
    // take turns (waiting up to the busy timeout) instead of failing on a stale snapshot.
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await.map_err(classify)?;
    sqlx::query(&sql.create_migrations)
        .execute(&mut *tx)
        .await
        .map_err(classify)?;
    for migration in migrations {
        // Every statement is idempotent and runs on every call, so a table dropped by
        // hand is recreated even though its migration is recorded.
        for statement in &migration.statements {
            sqlx::query(statement)
                .execute(&mut *tx)
                .await
                .map_err(classify)?;
        }
        sqlx::query(&sql.record_migration)
            .bind(&migration.id)
            .execute(&mut *tx)
            .await
            .map_err(classify)?;
    }
    tx.commit().await.map_err(classify)
}

fn ids_of(rows: &[SqliteRow]) -> Result<HashSet<Uuid>, StoreError> {
    rows.iter()
        .map(|r| uuid(&r.try_get::<String, _>(0).map_err(classify)?))
        .collect()
}

fn report(requested: impl Iterator<Item = MessageId>, applied: &HashSet<Uuid>) -> CompleteReport {
    let mut report = CompleteReport::default();
    for id in requested {
        if applied.contains(id.as_uuid()) {
            report.applied += 1;
        } else {
            report.stale.push(id);
        }
    }
    report
}

/// The wakeup is in-process: call [`notify`](outbox_engine::Backend::notify) after a commit
/// to wake relays of this process at once; relays elsewhere poll.
impl outbox_engine::Backend for SqliteOutbox {
    async fn migrate(&self) -> Result<(), StoreError> {
        SqliteOutbox::migrate(self).await
    }

    async fn listen(&self) -> Result<Option<outbox_engine::Listener>, StoreError> {
        Ok(Some(outbox_engine::Listener::new(self.wakeup.clone(), ())))
    }

    async fn notify(&self) -> Result<(), StoreError> {
        self.wakeup.notify();
        Ok(())
    }
}

impl Store for SqliteOutbox {
    async fn claim(&self, request: &ClaimRequest) -> Result<Claim, StoreError> {
        let token = LeaseToken::new();
        let lease = Lease {
            owner: request.owner.clone(),
            token,
            until: Utc::now() + chrono::Duration::milliseconds(millis(request.lease)),
        };
        let sql = &self.inner.sql;
        let filtered = request.destinations.is_some();
        let statement = match request.ordering {
            MessageOrder::PerKey(policy) => sql.claim_ordered(filtered, policy == DeadHead::Halt),
            _ if filtered => &sql.claim_filtered,
            _ => &sql.claim,
        };
        let query = sqlx::query(statement)
            .bind(limit(request.batch_size))
            .bind(&request.owner)
            .bind(token.as_uuid().to_string())
            .bind(millis(request.lease));
        let query = match &request.destinations {
            None => query,
            Some(destinations) => query.bind(json_list(destinations)),
        };
        let rows = query.fetch_all(&self.pool).await.map_err(classify)?;
        let mut claim = Claim::new(lease, Vec::with_capacity(rows.len()));
        for row in &rows {
            match Self::message(row, true) {
                Ok(message) => claim.messages.push(message),
                Err(reason) => {
                    // By rowid, fenced by this claim's token: the id may be what is unreadable.
                    let rowid: i64 = row.try_get("rowid").map_err(classify)?;
                    sqlx::query(&sql.reject)
                        .bind(token.as_uuid().to_string())
                        .bind(rowid)
                        .bind(&reason)
                        .execute(&self.pool)
                        .await
                        .map_err(classify)?;
                    claim.rejected.push(Rejected {
                        id: raw_text(row, "id"),
                        destination: row.try_get("destination").ok(),
                        reason,
                    });
                }
            }
        }
        claim.messages.sort_by_key(|m| m.id);
        Ok(claim)
    }

    async fn complete(
        &self,
        token: LeaseToken,
        completions: &[Completion],
    ) -> Result<CompleteReport, StoreError> {
        let sql = &self.inner.sql;
        let token_text = token.as_uuid().to_string();
        let mut applied = HashSet::new();
        let (deleted, updated): (Vec<&Completion>, Vec<&Completion>) =
            completions.iter().partition(|c| {
                self.inner.published == PublishedRows::Delete
                    && c.action == CompleteAction::Published
            });
        if !deleted.is_empty() {
            let ids = json_list(deleted.iter().map(|c| c.id.to_string()));
            let rows = sqlx::query(&sql.delete_published)
                .bind(&token_text)
                .bind(ids)
                .fetch_all(&self.pool)
                .await
                .map_err(classify)?;
            applied.extend(ids_of(&rows)?);
        }
        if !updated.is_empty() {
            let items: Vec<serde_json::Value> = updated
                .iter()
                .map(|c| {
                    let (delay, error) = match &c.action {
                        CompleteAction::Published => (0, None),
                        CompleteAction::Retry { delay, error }
                        | CompleteAction::Defer { delay, error } => {
                            (millis(*delay), Some(error.as_str()))
                        }
                        CompleteAction::Dead { reason } => (0, Some(reason.as_str())),
                    };
                    serde_json::json!({
                        "id": c.id.to_string(),
                        "status": outbox_sql::completion_status(&c.action),
                        "delay_ms": delay,
                        "error": error,
                    })
                })
                .collect();
            let rows = sqlx::query(&sql.complete)
                .bind(&token_text)
                .bind(serde_json::Value::Array(items).to_string())
                .fetch_all(&self.pool)
                .await
                .map_err(classify)?;
            applied.extend(ids_of(&rows)?);
        }
        Ok(report(completions.iter().map(|c| c.id), &applied))
    }

    async fn release(
        &self,
        token: LeaseToken,
        ids: &[MessageId],
    ) -> Result<CompleteReport, StoreError> {
        let rows = sqlx::query(&self.inner.sql.release)
            .bind(token.as_uuid().to_string())
            .bind(json_list(ids.iter().map(ToString::to_string)))
            .fetch_all(&self.pool)
            .await
            .map_err(classify)?;
        Ok(report(ids.iter().copied(), &ids_of(&rows)?))
    }
}

impl StoreStats for SqliteOutbox {
    async fn stats(&self) -> Result<Stats, StoreError> {
        let rows = sqlx::query(&self.inner.sql.stats)
            .fetch_all(&self.pool)
            .await
            .map_err(classify)?;
        let mut destinations = rows
            .iter()
            .map(|row| {
                let mut d = DestinationStats::new(
                    row.try_get::<String, _>("destination").map_err(classify)?,
                );
                d.pending = count(row.try_get("pending").map_err(classify)?);
                d.leased = count(row.try_get("leased").map_err(classify)?);
                d.dead = count(row.try_get("dead").map_err(classify)?);
                d.published = count(row.try_get("published").map_err(classify)?);
                d.oldest_pending_created_at = row
                    .try_get::<Option<i64>, _>("oldest")
                    .map_err(classify)?
                    .map(from_ms)
                    .transpose()?;
                Ok(d)
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        let halted = sqlx::query(&self.inner.sql.halted_keys)
            .fetch_all(&self.pool)
            .await
            .map_err(classify)?;
        for row in halted {
            let destination: String = row.try_get("destination").map_err(classify)?;
            if let Some(d) = destinations
                .iter_mut()
                .find(|d| d.destination == destination)
            {
                d.halted_keys = count(row.try_get("halted").map_err(classify)?);
            }
        }
        Ok(Stats { destinations })
    }
}

impl DeadLetters for SqliteOutbox {
    async fn list_dead(
        &self,
        filter: &DeadLetterFilter,
        limit_rows: usize,
    ) -> Result<Vec<DeadLetter>, StoreError> {
        let rows = Self::dead_query(&self.inner.sql.list_dead, filter)
            .bind(limit(limit_rows))
            .fetch_all(&self.pool)
            .await
            .map_err(classify)?;
        let mut dead = Vec::with_capacity(rows.len());
        for row in &rows {
            match Self::message(row, false) {
                Ok(message) => dead.push(DeadLetter {
                    message,
                    reason: row
                        .try_get::<Option<String>, _>("last_error")
                        .map_err(classify)?
                        .unwrap_or_default(),
                    dead_at: from_ms(row.try_get("dead_at").map_err(classify)?)?,
                }),
                Err(reason) => warn!(%reason, "a dead letter cannot be listed"),
            }
        }
        Ok(dead)
    }

    async fn replay_dead(&self, filter: &DeadLetterFilter) -> Result<u64, StoreError> {
        let done = Self::dead_query(&self.inner.sql.replay_dead, filter)
            .execute(&self.pool)
            .await
            .map_err(classify)?;
        Ok(done.rows_affected())
    }

    async fn discard_dead(&self, filter: &DeadLetterFilter) -> Result<u64, StoreError> {
        let done = Self::dead_query(&self.inner.sql.discard_dead, filter)
            .execute(&self.pool)
            .await
            .map_err(classify)?;
        Ok(done.rows_affected())
    }
}

impl Purge for SqliteOutbox {
    async fn purge(&self, request: &PurgeRequest) -> Result<u64, StoreError> {
        let done = sqlx::query(&self.inner.sql.purge)
            .bind(millis(request.published_older_than))
            .bind(request.dead_older_than.map(millis))
            .bind(limit(request.batch_size))
            .execute(&self.pool)
            .await
            .map_err(classify)?;
        Ok(done.rows_affected())
    }
}

/// The receiver-side inbox on SQLite: deduplicates deliveries inside the receiver's own
/// transaction.
///
/// Open the transaction with `BEGIN IMMEDIATE` (or make [`record`](outbox_engine::Inbox::record)
/// its first statement) so it holds SQLite's write lock from the start; see the
/// [module documentation](self#write-transactions).
///
/// ```no_run
/// # async fn handle(pool: sqlx::SqlitePool, message_id: &str) -> Result<(), Box<dyn std::error::Error>> {
/// use outbox_sqlx::Inbox;
/// use outbox_sqlx::sqlite::SqliteInbox;
///
/// let inbox = SqliteInbox::new();
/// let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
/// if inbox.record(&mut tx, "billing-service", message_id).await?.is_new() {
///     // apply the side effect with `&mut *tx`
/// }
/// tx.commit().await?;
/// # Ok(())
/// # }
/// ```
pub type SqliteInbox = SqlInbox<Sqlite>;

impl crate::inbox::sealed::Sealed for Sqlite {}

impl InboxDialect for Sqlite {
    fn inbox_statements(names: &TableNames) -> (String, String) {
        let sql = Statements::new(names);
        (sql.inbox_record, sql.inbox_purge)
    }

    /// Runs in one `BEGIN IMMEDIATE` transaction.
    async fn migrate_inbox(pool: &SqlitePool, names: &TableNames) -> Result<(), StoreError> {
        let migrations = outbox_sql::inbox_migrations(Dialect::Sqlite, names);
        run_migrations(pool, &Statements::new(names), &migrations).await
    }

    fn rows_affected(result: &SqliteQueryResult) -> u64 {
        result.rows_affected()
    }
}
