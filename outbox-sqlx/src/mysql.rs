//! The MySQL 8 / MariaDB ≥ 10.6 store, enqueue and inbox.
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use outbox_engine::{NewMessage, Relay, Wakeup};
//! use outbox_sqlx::mysql::MySqlOutbox;
//! # let sink = outbox_engine::testkit::RecordingSink::new();
//!
//! let pool = sqlx::MySqlPool::connect("mysql://app@localhost/app").await?;
//! let outbox = MySqlOutbox::new(pool.clone());
//! outbox.migrate().await?;
//!
//! // Writer and relay in one process: share a wakeup so the relay claims at once.
//! let wakeup = Wakeup::new();
//! let relay = Relay::builder(outbox.clone())
//!     .route("billing", sink)
//!     .wakeup(wakeup.clone())
//!     .build()?;
//! tokio::spawn(relay.run(std::future::pending()));
//!
//! let mut tx = pool.begin().await?;
//! sqlx::query("UPDATE orders SET status = 'paid' WHERE id = ?").bind(42_i64).execute(&mut *tx).await?;
//! outbox.enqueue(&mut tx, &NewMessage::builder("billing", "order.paid").json(&42).build()?).await?;
//! tx.commit().await?;
//! wakeup.notify(); // after the commit; relays in other processes find the row by polling
//! # Ok(())
//! # }
//! ```
//!
//! # How it maps onto MySQL
//!
//! - **Wakeups**: MySQL has no LISTEN/NOTIFY. Relays poll (`poll_interval`); when the
//!   writer and the relay share a process, raise an in-process [`Wakeup`] after each
//!   commit, as above, or call the store's
//!   [`Backend::notify`](outbox_engine::Backend::notify), which wakes the relays that
//!   listen to it (`outbox::Outbox` does).
//! - **Time** is the server's `UTC_TIMESTAMP(6)`, stored as UTC `DATETIME(6)`, so the
//!   session `time_zone` does not matter and relays on skewed hosts agree.
//! - **Claim** is a short `READ COMMITTED` transaction: `SELECT … FOR UPDATE SKIP LOCKED`
//!   on the due index, then one `UPDATE` that leases the selected rows. `READ COMMITTED`
//!   keeps InnoDB from taking gap locks that would block concurrent enqueues.
//! - **Per-key ordering** ([`MessageOrder::PerKey`]): each message with a partition key is
//!   numbered when it is enqueued, by a counter row per key (table `<outbox>_keys`)
//!   that your transaction bumps and keeps locked until it ends. So **a second
//!   transaction enqueueing for the same key waits until the first commits or rolls
//!   back**, and the numbers follow commit order. Transactions enqueueing for different
//!   keys do not wait for each other. (PostgreSQL numbers rows at commit instead; there,
//!   writers of one key wait only for each other's commit.) Keep transactions that
//!   enqueue keyed messages short, and enqueue as late in them as you can: the key is
//!   held from the enqueue to the end of the transaction. A transaction that enqueues
//!   for several keys in separate calls can deadlock with another that takes the same
//!   keys in another order (InnoDB rolls one back; the error is a retryable `Conflict`);
//!   [`enqueue_all`](MySqlOutbox::enqueue_all) takes its keys in sorted order. A keyed
//!   message costs one extra statement (one per distinct key in a batch). An ordered
//!   claim leases a keyed row only when no earlier row of its key is pending or leased
//!   (or dead, under [`DeadHead::Halt`]).
//! - **Completion** locks the rows still leased with the token (`SELECT … FOR UPDATE`):
//!   those are applied, the others are reported stale. Then it marks, deletes or
//!   reschedules them and commits. A relay that lost its lease changes nothing.
//! - Id lists are sent as `?` placeholders, padded to a power of two by repeating an id,
//!   so the server keeps a handful of prepared statements per table.
//! - A `last_error` is cut to [`MAX_ERROR_BYTES`] and
//!   a lease owner to [`MAX_OWNER_CHARS`] (at a
//!   character boundary), which is what the columns hold.
//!
//! [`Wakeup`]: outbox_engine::Wakeup
//! [`MessageOrder::PerKey`]: outbox_engine::MessageOrder::PerKey
//! [`DeadHead::Halt`]: outbox_engine::DeadHead::Halt

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, NaiveDate, NaiveDateTime, Utc};
use outbox_engine::Wakeup;
use outbox_engine::{
    Claim, ClaimRequest, CompleteAction, CompleteReport, Completion, DeadHead, DeadLetter,
    DeadLetterFilter, DeadLetters, DestinationStats, Lease, LeaseToken, Message, MessageId,
    MessageOrder, NewMessage, Purge, PurgeRequest, Rejected, Stats, Store, StoreError,
    StoreErrorKind, StoreStats,
};
use outbox_sql::mysql::{
    DeadFilterShape, MAX_ERROR_BYTES, MAX_OWNER_CHARS, RELAY_ISOLATION, Statements,
};
use outbox_sql::{Dialect, TableNames};
use sqlx::mysql::{MySql, MySqlArguments, MySqlConnection, MySqlPool, MySqlQueryResult, MySqlRow};
use sqlx::query::Query;
use sqlx::{Row, Transaction};
use tracing::warn;

use crate::PublishedRows;
use crate::common::{
    attempts, availability, count, headers_json, limit, millis, read_headers, stored_id,
    undecodable,
};
use crate::error::classify;
use crate::inbox::{InboxDialect, SqlInbox};

/// The named lock (`GET_LOCK`) that serialises migrations on one server.
const MIGRATION_LOCK: &str = "outbox-sqlx.migrate";
/// How long a migration waits for another one to finish, in seconds.
const MIGRATION_LOCK_TIMEOUT_S: i64 = 120;
/// Most ids one list statement takes (the padded length never exceeds it).
const ID_CHUNK: usize = 4096;
/// Most rows one multi-row `INSERT` carries (14 parameters each; the protocol allows
/// 65,535 per statement).
const INSERT_CHUNK_ROWS: usize = 500;
/// Payload and header bytes after which a multi-row `INSERT` is cut, so one statement
/// stays well under the server's `max_allowed_packet` (16 MiB by default on MariaDB).
const INSERT_CHUNK_BYTES: usize = 4 * 1024 * 1024;
/// Longest interval bound into SQL, in milliseconds (about 1,000 years); longer ones are
/// clamped so date arithmetic never leaves the `DATETIME` range.
const MAX_INTERVAL_MS: i64 = 1000 * 366 * 24 * 3600 * 1000;
/// Most values a dead-letter filter may list in total.
const MAX_FILTER_VALUES: usize = 60_000;

/// The outbox on MySQL 8 or MariaDB ≥ 10.6: enqueue in your transaction, and the relay's
/// [`Store`].
///
/// Cheap to clone; clones share the pool and the rendered statements.
#[derive(Debug, Clone)]
pub struct MySqlOutbox {
    pool: MySqlPool,
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

impl MySqlOutbox {
    /// The outbox in table `outbox` of the connection's current database.
    pub fn new(pool: MySqlPool) -> Self {
        Self::with_names(pool, TableNames::default())
    }

    /// The outbox in the tables `names` gives (a schema in `names` is a MySQL database).
    pub fn with_names(pool: MySqlPool, names: TableNames) -> Self {
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
    pub fn pool(&self) -> &MySqlPool {
        &self.pool
    }

    /// The table names.
    pub fn names(&self) -> &TableNames {
        &self.inner.names
    }

    /// Creates the outbox table and its indexes if missing, and checks that the table has
    /// every outbox column. Idempotent; concurrent callers (any process) serialise on the
    /// server's named lock `outbox-sqlx.migrate`. MySQL commits each DDL statement at
    /// once, so this runs on one connection outside any transaction.
    ///
    /// # Errors
    ///
    /// A [`StoreError`] if a statement fails (for example, no permission to create
    /// tables), of kind `Schema` if a table of that name exists but is not an outbox, or
    /// `Timeout` if another migration held the lock for two minutes.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let sql = &self.inner.sql;
        let migrations = outbox_sql::outbox_migrations(Dialect::MySql, &self.inner.names);
        let checks = [sql.check_outbox.as_str(), sql.check_keys.as_str()];
        run_migrations(&self.pool, sql, &migrations, &checks).await
    }

    /// Inserts `message` on `conn` — normally your open transaction (`&mut tx`). Runs one
    /// `INSERT`, preceded for a message with a partition key by one statement that
    /// numbers it and holds the key until your transaction ends (see the
    /// [module documentation](self#how-it-maps-onto-mysql)). Never commits and uses no
    /// other connection. (On a connection outside a transaction each statement commits by
    /// itself, as any statement does in autocommit mode: the numbering and the insert
    /// then commit separately, so two enqueues of one key that overlap in time are
    /// ordered by their numbers, which need not be the order their rows became visible.
    /// Enqueue keyed messages inside a transaction.)
    ///
    /// # Errors
    ///
    /// [`StoreError`] of kind `Constraint` if the id exists, `Conflict` for a deadlock or
    /// lock wait timeout on the key, or the database's error; roll your transaction back
    /// then, as after any failed statement.
    pub async fn enqueue(
        &self,
        conn: &mut MySqlConnection,
        message: &NewMessage,
    ) -> Result<(), StoreError> {
        let seq = match message.partition_key() {
            Some(key) => Some(self.next_seq(conn, key, 1).await?),
            None => None,
        };
        bind_message(sqlx::query(&self.inner.sql.insert), message, seq)
            .execute(conn)
            .await
            .map_err(classify)?;
        Ok(())
    }

    /// Inserts `messages` on `conn` with one multi-row `INSERT` (several for very large
    /// batches, cut at 500 rows or about 4 MiB of payload), preceded by one numbering
    /// statement per distinct partition key, taken in sorted key order; see
    /// [`enqueue`](Self::enqueue). Messages of one key are numbered in the order of the
    /// slice. Returns how many rows were inserted.
    ///
    /// # Errors
    ///
    /// As [`enqueue`](Self::enqueue). Inside a transaction nothing is kept once you roll
    /// back after an error; outside one, statements that succeeded before the failing one
    /// stay.
    pub async fn enqueue_all(
        &self,
        conn: &mut MySqlConnection,
        messages: &[NewMessage],
    ) -> Result<u64, StoreError> {
        let seqs = self.number(conn, messages).await?;
        let mut inserted = 0;
        let mut rest = messages;
        let mut rest_seqs = seqs.as_slice();
        while !rest.is_empty() {
            let mut rows = 0;
            let mut bytes = 0;
            while rows < rest.len() && rows < INSERT_CHUNK_ROWS {
                let m = &rest[rows];
                let size = m.payload().len()
                    + m.headers()
                        .iter()
                        .map(|(k, v)| k.len() + v.len() + 8)
                        .sum::<usize>()
                    + 2048;
                if rows > 0 && bytes + size > INSERT_CHUNK_BYTES {
                    break;
                }
                bytes += size;
                rows += 1;
            }
            let (chunk, tail) = rest.split_at(rows);
            let (chunk_seqs, tail_seqs) = rest_seqs.split_at(rows);
            let sql = self.inner.sql.insert_batch(chunk.len());
            let mut query = sqlx::query(&sql).persistent(chunk.len() <= 16);
            for (m, seq) in chunk.iter().zip(chunk_seqs) {
                query = bind_message(query, m, *seq);
            }
            inserted += query
                .execute(&mut *conn)
                .await
                .map_err(classify)?
                .rows_affected();
            rest = tail;
            rest_seqs = tail_seqs;
        }
        Ok(inserted)
    }

    /// Bumps the counter of `key` by `count`, locking it until the transaction ends;
    /// returns the last of the `count` numbers (handed back as the last insert id).
    async fn next_seq(
        &self,
        conn: &mut MySqlConnection,
        key: &str,
        count: usize,
    ) -> Result<i64, StoreError> {
        let done = sqlx::query(&self.inner.sql.next_seq)
            .bind(key)
            .bind(limit(count))
            .bind(limit(count))
            .execute(conn)
            .await
            .map_err(classify)?;
        match i64::try_from(done.last_insert_id()) {
            Ok(last) if last >= limit(count) => Ok(last),
            _ => Err(StoreError::new(
                StoreErrorKind::Other,
                format!(
                    "numbering partition key {key:?} returned last insert id {}, expected at least {count}",
                    done.last_insert_id()
                ),
            )),
        }
    }

    /// Numbers the keyed messages of a batch: one counter bump per distinct key, in
    /// sorted key order (so two batches lock shared keys in the same order), numbers
    /// handed out in slice order. `None` for messages without a key.
    async fn number(
        &self,
        conn: &mut MySqlConnection,
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

    /// Starts a relay transaction at `READ COMMITTED`, in one round trip.
    async fn begin(&self) -> Result<Transaction<'static, MySql>, StoreError> {
        self.pool
            .begin_with(format!("{RELAY_ISOLATION}; START TRANSACTION"))
            .await
            .map_err(classify)
    }

    /// The ids of `ids` still leased with `token`, locked until the transaction ends.
    async fn lock_leased(
        &self,
        tx: &mut MySqlConnection,
        token: LeaseToken,
        ids: &[MessageId],
    ) -> Result<HashSet<MessageId>, StoreError> {
        let token = token.as_uuid().to_string();
        let mut held = HashSet::with_capacity(ids.len());
        for chunk in ids.chunks(ID_CHUNK) {
            let n = padded(chunk.len());
            let sql = self.inner.sql.lock_leased(n);
            let rows = bind_ids(sqlx::query(&sql), chunk, n)
                .bind(&token)
                .fetch_all(&mut *tx)
                .await
                .map_err(classify)?;
            for row in &rows {
                held.insert(message_id(&text(row, "id")?)?);
            }
        }
        Ok(held)
    }

    /// Drops the keyed candidates of an ordered claim that a fresh read shows are not the
    /// heads of their keys (see `outbox_sql::mysql`, "Per-key ordering": the claim's own
    /// check can miss a predecessor committed during its scan).
    async fn keep_heads(
        &self,
        tx: &mut MySqlConnection,
        messages: &mut Vec<Message>,
        halt: bool,
    ) -> Result<(), StoreError> {
        let keyed: Vec<MessageId> = messages
            .iter()
            .filter(|m| m.partition_key.is_some())
            .map(|m| m.id)
            .collect();
        if keyed.is_empty() {
            return Ok(());
        }
        let mut heads = HashSet::with_capacity(keyed.len());
        for chunk in keyed.chunks(ID_CHUNK) {
            let n = padded(chunk.len());
            let sql = self.inner.sql.heads(n, halt);
            let rows = bind_ids(sqlx::query(&sql), chunk, n)
                .fetch_all(&mut *tx)
                .await
                .map_err(classify)?;
            for row in &rows {
                heads.insert(message_id(&text(row, "id")?)?);
            }
        }
        messages.retain(|m| m.partition_key.is_none() || heads.contains(&m.id));
        Ok(())
    }

    /// Runs a list statement (`ids…, token`) over `ids` in padded chunks.
    async fn for_ids(
        &self,
        tx: &mut MySqlConnection,
        build: impl Fn(&Statements, usize) -> String,
        ids: &[MessageId],
        token: LeaseToken,
    ) -> Result<u64, StoreError> {
        let token = token.as_uuid().to_string();
        let mut changed = 0;
        for chunk in ids.chunks(ID_CHUNK) {
            let n = padded(chunk.len());
            let sql = build(&self.inner.sql, n);
            changed += bind_ids(sqlx::query(&sql), chunk, n)
                .bind(&token)
                .execute(&mut *tx)
                .await
                .map_err(classify)?
                .rows_affected();
        }
        Ok(changed)
    }

    /// Runs one dead-letter statement in a relay transaction.
    async fn dead_execute(
        &self,
        build: impl Fn(&Statements, DeadFilterShape) -> String,
        filter: &DeadLetterFilter,
    ) -> Result<u64, StoreError> {
        let shape = dead_shape(filter)?;
        let sql = build(&self.inner.sql, shape);
        let mut tx = self.begin().await?;
        let done = bind_dead_filter(sqlx::query(&sql).persistent(false), filter)
            .execute(&mut *tx)
            .await
            .map_err(classify)?;
        tx.commit().await.map_err(classify)?;
        Ok(done.rows_affected())
    }
}

/// Binds the fourteen `insert` parameters of one message.
fn bind_message<'q>(
    query: Query<'q, MySql, MySqlArguments>,
    m: &'q NewMessage,
    seq: Option<i64>,
) -> Query<'q, MySql, MySqlArguments> {
    let (at, delay_ms) = availability(m);
    let (at, delay_ms) = (at.map(db_time), delay_ms.min(MAX_INTERVAL_MS));
    query
        .bind(m.id().to_string())
        .bind(m.destination())
        .bind(m.event_type())
        .bind(m.aggregate_type())
        .bind(m.aggregate_id())
        .bind(m.partition_key())
        .bind(m.tenant_id())
        .bind(m.idempotency_key())
        .bind(m.payload())
        .bind(m.content_type())
        .bind(headers_json(m.headers()))
        .bind(at)
        .bind(delay_ms)
        .bind(seq)
}

/// The list length a statement is built for: the next power of two.
fn padded(n: usize) -> usize {
    n.max(1).next_power_of_two()
}

/// Binds `ids`, then repeats the last one up to `n` placeholders (harmless in `IN`).
fn bind_ids<'q>(
    mut query: Query<'q, MySql, MySqlArguments>,
    ids: &[MessageId],
    n: usize,
) -> Query<'q, MySql, MySqlArguments> {
    let last = ids.last().map(ToString::to_string).unwrap_or_default();
    for id in ids {
        query = query.bind(id.to_string());
    }
    for _ in ids.len()..n {
        query = query.bind(last.clone());
    }
    query
}

fn dead_shape(filter: &DeadLetterFilter) -> Result<DeadFilterShape, StoreError> {
    let values = filter.ids.len() + filter.destinations.len() + filter.event_types.len();
    if values > MAX_FILTER_VALUES {
        return Err(StoreError::new(
            StoreErrorKind::InvalidInput,
            format!(
                "a dead-letter filter may list at most {MAX_FILTER_VALUES} values, got {values}"
            ),
        ));
    }
    Ok(DeadFilterShape {
        ids: filter.ids.len(),
        destinations: filter.destinations.len(),
        event_types: filter.event_types.len(),
        after: filter.created_after.is_some(),
        before: filter.created_before.is_some(),
        error: filter.error_contains.is_some(),
    })
}

fn bind_dead_filter<'q>(
    mut query: Query<'q, MySql, MySqlArguments>,
    filter: &'q DeadLetterFilter,
) -> Query<'q, MySql, MySqlArguments> {
    for id in &filter.ids {
        query = query.bind(id.to_string());
    }
    for d in &filter.destinations {
        query = query.bind(d.as_str());
    }
    for e in &filter.event_types {
        query = query.bind(e.as_str());
    }
    if let Some(after) = filter.created_after {
        query = query.bind(db_time(after));
    }
    if let Some(before) = filter.created_before {
        query = query.bind(db_time(before));
    }
    if let Some(error) = &filter.error_contains {
        query = query.bind(error.as_str());
    }
    query
}

/// A duration as milliseconds for `INTERVAL` arithmetic, clamped to about 1,000 years.
fn interval_ms(d: Duration) -> i64 {
    millis(d).min(MAX_INTERVAL_MS)
}

/// An instant as the naive UTC `DATETIME(6)` the table stores, clamped into the range
/// the column holds (anything before 1970 is simply due; the far future stays far).
fn db_time(t: DateTime<Utc>) -> NaiveDateTime {
    let min = NaiveDate::from_ymd_opt(1970, 1, 1)
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .expect("valid date");
    let max = NaiveDate::from_ymd_opt(9999, 12, 31)
        .and_then(|d| d.and_hms_micro_opt(23, 59, 59, 999_999))
        .expect("valid date");
    t.naive_utc().clamp(min, max)
}

/// `s` cut to at most `max` bytes at a character boundary.
fn clip_bytes(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut cut = max;
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    &s[..cut]
}

/// `s` cut to at most `max` characters.
fn clip_chars(s: &str, max: usize) -> &str {
    match s.char_indices().nth(max) {
        Some((at, _)) => &s[..at],
        None => s,
    }
}

/// A text column. Columns with a binary collation (`utf8mb4_bin`, `ascii_bin`) carry the
/// `BINARY` flag, which sqlx's `String` type check refuses, so the check is skipped; the
/// value is still validated as UTF-8.
fn text(row: &MySqlRow, column: &str) -> Result<String, StoreError> {
    row.try_get_unchecked::<String, _>(column).map_err(classify)
}

fn optional_text(row: &MySqlRow, column: &str) -> Result<Option<String>, StoreError> {
    row.try_get_unchecked::<Option<String>, _>(column)
        .map_err(classify)
}

fn time(row: &MySqlRow, column: &str) -> Result<DateTime<Utc>, StoreError> {
    Ok(row
        .try_get::<NaiveDateTime, _>(column)
        .map_err(classify)?
        .and_utc())
}

fn message_id(text: &str) -> Result<MessageId, StoreError> {
    stored_id(text).map_err(|reason| StoreError::new(StoreErrorKind::Schema, reason))
}

/// Reads a claimed or dead row; the error names the column that could not be read. With
/// `strict_headers` off, headers that cannot be read are left empty (for listing the dead
/// letters such rows became).
fn message(row: &MySqlRow, strict_headers: bool) -> Result<Message, String> {
    fn get<T>(column: &str, value: Result<T, StoreError>) -> Result<T, String> {
        value.map_err(|e| undecodable(column, e))
    }
    let text = |column: &str| get(column, text(row, column));
    let optional = |column: &str| get(column, optional_text(row, column));
    let mut m = Message::from_parts(
        stored_id(&text("id")?)?,
        text("destination")?,
        text("event_type")?,
        get("payload", row.try_get("payload").map_err(classify))?,
        text("content_type")?,
        text("idempotency_key")?,
        attempts(i64::from(get(
            "attempts",
            row.try_get::<i32, _>("attempts").map_err(classify),
        )?)),
        get("created_at", time(row, "created_at"))?,
    );
    m.aggregate_type = optional("aggregate_type")?;
    m.aggregate_id = optional("aggregate_id")?;
    m.partition_key = optional("partition_key")?;
    m.tenant_id = optional("tenant_id")?;
    read_headers(&mut m, &text("headers")?, strict_headers)?;
    Ok(m)
}

/// Runs `migrations` under the named lock. `checks[i]`, if present, verifies what
/// migration `i` created before it is recorded; all checks run again at the end.
async fn run_migrations(
    pool: &MySqlPool,
    sql: &Statements,
    migrations: &[outbox_sql::Migration],
    checks: &[&str],
) -> Result<(), StoreError> {
    let mut conn = pool.acquire().await.map_err(classify)?;
    // The named lock belongs to the session: if this future is dropped half-way, the
    // connection is closed rather than returned to the pool still holding it.
    conn.close_on_drop();
    let locked: Option<i64> = sqlx::query_scalar(&sql.migration_lock)
        .bind(MIGRATION_LOCK)
        .bind(MIGRATION_LOCK_TIMEOUT_S)
        .fetch_one(&mut *conn)
        .await
        .map_err(classify)?;
    if locked != Some(1) {
        return Err(StoreError::new(
            StoreErrorKind::Timeout,
            format!(
                "another migration held the lock {MIGRATION_LOCK:?} for {MIGRATION_LOCK_TIMEOUT_S} s"
            ),
        ));
    }
    let result = apply(&mut conn, sql, migrations, checks).await;
    let unlocked = sqlx::query(&sql.migration_unlock)
        .bind(MIGRATION_LOCK)
        .execute(&mut *conn)
        .await
        .map_err(classify);
    result?;
    unlocked.map(|_| ())
}

async fn apply(
    conn: &mut MySqlConnection,
    sql: &Statements,
    migrations: &[outbox_sql::Migration],
    checks: &[&str],
) -> Result<(), StoreError> {
    sqlx::query(&sql.create_migrations)
        .execute(&mut *conn)
        .await
        .map_err(classify)?;
    for (i, migration) in migrations.iter().enumerate() {
        // Every statement is idempotent and runs on every call, so a table dropped by
        // hand is recreated even though its migration is recorded.
        for statement in &migration.statements {
            sqlx::query(statement)
                .persistent(false)
                .execute(&mut *conn)
                .await
                .map_err(classify)?;
        }
        if let Some(check) = checks.get(i) {
            // `CREATE TABLE IF NOT EXISTS` succeeds on any table of that name: make sure
            // it is ours before recording the migration or running the next one.
            check_table(conn, check).await?;
        }
        sqlx::query(&sql.record_migration)
            .bind(&migration.id)
            .execute(&mut *conn)
            .await
            .map_err(classify)?;
    }
    for check in checks {
        check_table(conn, check).await?;
    }
    Ok(())
}

async fn check_table(conn: &mut MySqlConnection, check: &str) -> Result<(), StoreError> {
    sqlx::query(check)
        .persistent(false)
        .execute(&mut *conn)
        .await
        .map_err(classify)?;
    Ok(())
}

/// One entry per completion: applied if it is the first for its id and the row was held.
fn report(requested: impl Iterator<Item = MessageId>, held: &HashSet<MessageId>) -> CompleteReport {
    let mut report = CompleteReport::default();
    let mut counted = HashSet::new();
    for id in requested {
        if held.contains(&id) && counted.insert(id) {
            report.applied += 1;
        } else {
            report.stale.push(id);
        }
    }
    report
}

/// The ids in order, each once.
fn unique(ids: impl Iterator<Item = MessageId>) -> Vec<MessageId> {
    let mut seen = HashSet::new();
    ids.filter(|id| seen.insert(*id)).collect()
}

/// The wakeup is in-process: call [`notify`](outbox_engine::Backend::notify) after a commit
/// to wake relays of this process at once; relays elsewhere poll.
impl outbox_engine::Backend for MySqlOutbox {
    async fn migrate(&self) -> Result<(), StoreError> {
        MySqlOutbox::migrate(self).await
    }

    async fn listen(&self) -> Result<Option<outbox_engine::Listener>, StoreError> {
        Ok(Some(outbox_engine::Listener::new(self.wakeup.clone(), ())))
    }

    async fn notify(&self) -> Result<(), StoreError> {
        self.wakeup.notify();
        Ok(())
    }
}

impl Store for MySqlOutbox {
    async fn claim(&self, request: &ClaimRequest) -> Result<Claim, StoreError> {
        let token = LeaseToken::new();
        let lease_ms = interval_ms(request.lease);
        let lease = Lease {
            owner: request.owner.clone(),
            token,
            until: Utc::now() + chrono::Duration::milliseconds(lease_ms),
        };
        let destinations = request.destinations.as_deref().unwrap_or_default();
        if request.batch_size == 0 || request.destinations.as_ref().is_some_and(Vec::is_empty) {
            return Ok(Claim::new(lease, Vec::new()));
        }
        let sql = &self.inner.sql;
        let halt = match request.ordering {
            MessageOrder::PerKey(policy) => Some(policy == DeadHead::Halt),
            _ => None,
        };
        let select = match halt {
            Some(halt) => sql.claim_select_ordered(destinations.len(), halt),
            None => sql.claim_select(destinations.len()),
        };
        let mut tx = self.begin().await?;
        let mut query = sqlx::query(&select);
        for d in destinations {
            query = query.bind(d.as_str());
        }
        let rows = query
            .bind(limit(request.batch_size))
            .fetch_all(&mut *tx)
            .await
            .map_err(classify)?;
        if rows.is_empty() {
            tx.commit().await.map_err(classify)?;
            return Ok(Claim::new(lease, Vec::new()));
        }
        let mut messages = Vec::with_capacity(rows.len());
        let mut rejected = Vec::new();
        for row in &rows {
            match message(row, true) {
                Ok(m) => messages.push(m),
                Err(reason) => {
                    // The row is locked by this transaction: dead-letter it in place.
                    let id = text(row, "id")?;
                    sqlx::query(&sql.reject)
                        .bind(clip_bytes(&reason, MAX_ERROR_BYTES))
                        .bind(&id)
                        .execute(&mut *tx)
                        .await
                        .map_err(classify)?;
                    rejected.push(Rejected {
                        id,
                        destination: optional_text(row, "destination").ok().flatten(),
                        reason,
                    });
                }
            }
        }
        if let Some(halt) = halt {
            self.keep_heads(&mut tx, &mut messages, halt).await?;
            if messages.is_empty() {
                tx.commit().await.map_err(classify)?;
                return Ok(Claim {
                    lease,
                    messages,
                    rejected,
                });
            }
        }
        let ids: Vec<MessageId> = messages.iter().map(|m| m.id).collect();
        let owner = clip_chars(&request.owner, MAX_OWNER_CHARS);
        let token_text = token.as_uuid().to_string();
        for chunk in ids.chunks(ID_CHUNK) {
            let n = padded(chunk.len());
            let lease_sql = sql.claim_lease(n);
            let query = sqlx::query(&lease_sql)
                .bind(owner)
                .bind(&token_text)
                .bind(lease_ms)
                .bind(lease_ms);
            let done = bind_ids(query, chunk, n)
                .execute(&mut *tx)
                .await
                .map_err(classify)?;
            if done.rows_affected() != chunk.len() as u64 {
                // Cannot happen while the rows are locked; refuse rather than hand out
                // rows that are not leased.
                return Err(StoreError::new(
                    StoreErrorKind::Other,
                    format!(
                        "leased {} of {} locked rows",
                        done.rows_affected(),
                        chunk.len()
                    ),
                ));
            }
        }
        tx.commit().await.map_err(classify)?;
        for m in &mut messages {
            m.attempts = m.attempts.saturating_add(1);
        }
        messages.sort_by_key(|m| m.id);
        Ok(Claim {
            lease,
            messages,
            rejected,
        })
    }

    async fn complete(
        &self,
        token: LeaseToken,
        completions: &[Completion],
    ) -> Result<CompleteReport, StoreError> {
        if completions.is_empty() {
            return Ok(CompleteReport::default());
        }
        let ids = unique(completions.iter().map(|c| c.id));
        let mut tx = self.begin().await?;
        let held = self.lock_leased(&mut tx, token, &ids).await?;
        if held.is_empty() {
            tx.rollback().await.map_err(classify)?;
            return Ok(report(completions.iter().map(|c| c.id), &held));
        }
        let token_text = token.as_uuid().to_string();
        let sql = &self.inner.sql;
        let mut published = Vec::new();
        let mut done = HashSet::new();
        for c in completions {
            if !held.contains(&c.id) || !done.insert(c.id) {
                continue;
            }
            match &c.action {
                CompleteAction::Published => published.push(c.id),
                CompleteAction::Retry { delay, error } => {
                    sqlx::query(&sql.retry)
                        .bind(interval_ms(*delay))
                        .bind(clip_bytes(error, MAX_ERROR_BYTES))
                        .bind(c.id.to_string())
                        .bind(&token_text)
                        .execute(&mut *tx)
                        .await
                        .map_err(classify)?;
                }
                CompleteAction::Defer { delay, error } => {
                    sqlx::query(&sql.defer)
                        .bind(interval_ms(*delay))
                        .bind(clip_bytes(error, MAX_ERROR_BYTES))
                        .bind(c.id.to_string())
                        .bind(&token_text)
                        .execute(&mut *tx)
                        .await
                        .map_err(classify)?;
                }
                CompleteAction::Dead { reason } => {
                    sqlx::query(&sql.dead)
                        .bind(clip_bytes(reason, MAX_ERROR_BYTES))
                        .bind(c.id.to_string())
                        .bind(&token_text)
                        .execute(&mut *tx)
                        .await
                        .map_err(classify)?;
                }
            }
        }
        if !published.is_empty() {
            match self.inner.published {
                PublishedRows::Keep => {
                    self.for_ids(&mut tx, Statements::publish, &published, token)
                        .await?
                }
                PublishedRows::Delete => {
                    self.for_ids(&mut tx, Statements::delete_published, &published, token)
                        .await?
                }
            };
        }
        tx.commit().await.map_err(classify)?;
        Ok(report(completions.iter().map(|c| c.id), &held))
    }

    async fn release(
        &self,
        token: LeaseToken,
        ids: &[MessageId],
    ) -> Result<CompleteReport, StoreError> {
        if ids.is_empty() {
            return Ok(CompleteReport::default());
        }
        let unique_ids = unique(ids.iter().copied());
        let mut tx = self.begin().await?;
        let held = self.lock_leased(&mut tx, token, &unique_ids).await?;
        if held.is_empty() {
            tx.rollback().await.map_err(classify)?;
        } else {
            let held_ids: Vec<MessageId> = unique_ids
                .iter()
                .copied()
                .filter(|id| held.contains(id))
                .collect();
            self.for_ids(&mut tx, Statements::release, &held_ids, token)
                .await?;
            tx.commit().await.map_err(classify)?;
        }
        Ok(report(ids.iter().copied(), &held))
    }
}

impl StoreStats for MySqlOutbox {
    async fn stats(&self) -> Result<Stats, StoreError> {
        let rows = sqlx::query(&self.inner.sql.stats)
            .fetch_all(&self.pool)
            .await
            .map_err(classify)?;
        let mut destinations = rows
            .iter()
            .map(|row| {
                let mut d = DestinationStats::new(text(row, "destination")?);
                d.pending = count(row.try_get("pending").map_err(classify)?);
                d.leased = count(row.try_get("leased").map_err(classify)?);
                d.dead = count(row.try_get("dead").map_err(classify)?);
                d.published = count(row.try_get("published").map_err(classify)?);
                d.oldest_pending_created_at = row
                    .try_get::<Option<NaiveDateTime>, _>("oldest")
                    .map_err(classify)?
                    .map(|t| t.and_utc());
                Ok(d)
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        let halted = sqlx::query(&self.inner.sql.halted_keys)
            .fetch_all(&self.pool)
            .await
            .map_err(classify)?;
        for row in &halted {
            let destination = text(row, "destination")?;
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

impl DeadLetters for MySqlOutbox {
    async fn list_dead(
        &self,
        filter: &DeadLetterFilter,
        limit_rows: usize,
    ) -> Result<Vec<DeadLetter>, StoreError> {
        let sql = self.inner.sql.list_dead(dead_shape(filter)?);
        let rows = bind_dead_filter(sqlx::query(&sql).persistent(false), filter)
            .bind(limit(limit_rows))
            .fetch_all(&self.pool)
            .await
            .map_err(classify)?;
        let mut dead = Vec::with_capacity(rows.len());
        for row in &rows {
            match message(row, false) {
                Ok(message) => dead.push(DeadLetter {
                    message,
                    reason: optional_text(row, "last_error")?.unwrap_or_default(),
                    dead_at: time(row, "dead_at")?,
                }),
                Err(reason) => warn!(%reason, "a dead letter cannot be listed"),
            }
        }
        Ok(dead)
    }

    async fn replay_dead(&self, filter: &DeadLetterFilter) -> Result<u64, StoreError> {
        self.dead_execute(Statements::replay_dead, filter).await
    }

    async fn discard_dead(&self, filter: &DeadLetterFilter) -> Result<u64, StoreError> {
        self.dead_execute(Statements::discard_dead, filter).await
    }
}

impl Purge for MySqlOutbox {
    async fn purge(&self, request: &PurgeRequest) -> Result<u64, StoreError> {
        let sql = &self.inner.sql;
        let batch = limit(request.batch_size);
        let mut tx = self.begin().await?;
        let mut deleted = sqlx::query(&sql.purge_published)
            .bind(interval_ms(request.published_older_than))
            .bind(batch)
            .execute(&mut *tx)
            .await
            .map_err(classify)?
            .rows_affected();
        if let Some(dead_age) = request.dead_older_than {
            let left = batch.saturating_sub(i64::try_from(deleted).unwrap_or(i64::MAX));
            if left > 0 {
                deleted += sqlx::query(&sql.purge_dead)
                    .bind(interval_ms(dead_age))
                    .bind(left)
                    .execute(&mut *tx)
                    .await
                    .map_err(classify)?
                    .rows_affected();
            }
        }
        tx.commit().await.map_err(classify)?;
        Ok(deleted)
    }
}

/// The receiver-side inbox on MySQL / MariaDB: deduplicates deliveries inside the
/// receiver's own transaction.
///
/// Keys compare byte for byte (the columns are `VARBINARY`). InnoDB may resolve
/// concurrent inserts of the same key with a deadlock, rolling back one transaction:
/// that error has kind `Conflict`
/// ([`is_retryable`](outbox_engine::StoreErrorKind::is_retryable)); run the whole
/// delivery transaction again.
///
/// ```no_run
/// # async fn handle(pool: sqlx::MySqlPool, message_id: &str) -> Result<(), Box<dyn std::error::Error>> {
/// use outbox_sqlx::Inbox;
/// use outbox_sqlx::mysql::MySqlInbox;
///
/// let inbox = MySqlInbox::new();
/// let mut tx = pool.begin().await?;
/// if inbox.record(&mut tx, "billing-service", message_id).await?.is_new() {
///     // apply the side effect with `&mut *tx`
/// }
/// tx.commit().await?;
/// # Ok(())
/// # }
/// ```
pub type MySqlInbox = SqlInbox<MySql>;

impl crate::inbox::sealed::Sealed for MySql {}

impl InboxDialect for MySql {
    fn inbox_statements(names: &TableNames) -> (String, String) {
        let sql = Statements::new(names);
        (sql.inbox_record, sql.inbox_purge)
    }

    /// Also checks the columns of an existing table; see [`MySqlOutbox::migrate`].
    async fn migrate_inbox(pool: &MySqlPool, names: &TableNames) -> Result<(), StoreError> {
        let sql = Statements::new(names);
        let migrations = outbox_sql::inbox_migrations(Dialect::MySql, names);
        run_migrations(pool, &sql, &migrations, &[sql.check_inbox.as_str()]).await
    }

    fn rows_affected(result: &MySqlQueryResult) -> u64 {
        result.rows_affected()
    }

    fn retention_ms(older_than: Duration) -> i64 {
        interval_ms(older_than)
    }
}
