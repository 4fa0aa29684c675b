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
//! Relays built with [`MessageOrder::PerKey`](outbox_engine::MessageOrder::PerKey) publish the messages of one partition key one
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
//! [`DeadHead::Halt`](outbox_engine::DeadHead::Halt)); messages without a partition key are never held back.
//!
//! # Wakeups
//!
//! SQLite has no LISTEN/NOTIFY. With SQLite the writer and the relay share a process (and
//! a database file), so the store's wakeup is in-process: a relay that listens (as
//! `outbox::Outbox` does, through [`listen`](SqliteOutbox::listen)) wakes when you call
//! [`notify`](SqliteOutbox::notify) **after** your transaction committed. The relay's
//! poll interval remains the fallback.
//!
//! ```no_run
//! # async fn example(pool: sqlx::SqlitePool) -> Result<(), Box<dyn std::error::Error>> {
//! use outbox_engine::{NewMessage, Relay};
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

mod admin;
mod enqueue;
mod relay;

use chrono::{DateTime, Utc};
use outbox_engine::{MessageId, StoreError};
use outbox_sql::sqlite::{Statements, ceil_ms};
use outbox_sql::{Dialect, Migration, Shared, TableNames};
use sqlx::Row;
use sqlx::sqlite::{Sqlite, SqlitePool, SqliteQueryResult, SqliteRow};

use crate::SqlInbox;
use crate::common::{stored_id, undecodable};
use crate::dialect::{Column, SqlDialect, Tables, get, sealed};
use crate::error::classify;
use crate::store::SqlOutbox;

/// The outbox on SQLite: enqueue in your transaction ([`enqueue`](SqliteOutbox::enqueue),
/// [`enqueue_all`](SqliteOutbox::enqueue_all)) and the relay's
/// [`Store`](outbox_engine::Store). See the [module documentation](self) for the
/// recommended pool settings, write transactions, per-key ordering and wakeups.
///
/// A schema in the table names names an attached database (`main`, or one attached on
/// every connection of the pool). SQLite compares ASCII letters in names
/// case-insensitively, so two names that differ only in ASCII case name the same table.
pub type SqliteOutbox = SqlOutbox<Sqlite>;

/// The receiver-side inbox on SQLite: deduplicates deliveries inside the receiver's own
/// transaction.
///
/// Open the transaction with `BEGIN IMMEDIATE` (or make [`record`](outbox_engine::Inbox::record)
/// its first statement) so it holds SQLite's write lock from the start; see the
/// [module documentation](self#write-transactions).
pub type SqliteInbox = SqlInbox<Sqlite>;

impl sealed::Sealed for Sqlite {}

impl SqlDialect for Sqlite {
    type Statements = Statements;
    const DIALECT: Dialect = Dialect::Sqlite;

    fn statements(names: &TableNames, _: outbox_engine::PublishedRows) -> Statements {
        Statements::new(names)
    }

    fn shared(sql: &Statements) -> &Shared {
        &sql.shared
    }

    /// In one `BEGIN IMMEDIATE` transaction: it takes the write lock before the first
    /// read, so two migrating processes take turns (waiting up to the busy timeout)
    /// instead of failing on a stale snapshot, and a failure leaves nothing half-made.
    async fn migrate(
        pool: &SqlitePool,
        sql: &Statements,
        migrations: &[Migration],
        _: Tables,
    ) -> Result<(), StoreError> {
        let mut tx = pool.begin_with("BEGIN IMMEDIATE").await.map_err(classify)?;
        crate::migrate::apply::<Sqlite>(&mut tx, &sql.shared, migrations, &[]).await?;
        tx.commit().await.map_err(classify)
    }

    /// SQLite types each value, not each column: every value's type is checked.
    const TYPED_COLUMNS: bool = false;

    fn text(row: &SqliteRow, column: impl Into<Column>) -> Result<Option<String>, sqlx::Error> {
        get(row, column)
    }

    fn payload(row: &SqliteRow, column: impl Into<Column>) -> Result<Vec<u8>, sqlx::Error> {
        get(row, column)
    }

    /// Ids are stored as text; only the lowercase hyphenated form is read.
    fn id(row: &SqliteRow, column: impl Into<Column>) -> Result<MessageId, String> {
        let column = column.into();
        let text: &str = get(row, column).map_err(|e| undecodable(column.name(), e))?;
        stored_id(text)
    }

    fn raw_id(row: &SqliteRow) -> String {
        match row.try_get_unchecked::<Vec<u8>, _>("id") {
            Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
            Err(_) => "<unreadable id>".to_owned(),
        }
    }

    fn count(row: &SqliteRow, column: impl Into<Column>) -> Result<i64, sqlx::Error> {
        get(row, column)
    }

    fn attempts(row: &SqliteRow, column: impl Into<Column>) -> Result<i64, sqlx::Error> {
        get(row, column)
    }

    /// Times are unix milliseconds.
    fn time(row: &SqliteRow, column: impl Into<Column>) -> Result<Option<DateTime<Utc>>, String> {
        let column = column.into();
        let name = column.name();
        let Some(ms) = get::<Option<i64>, _>(row, column).map_err(|e| undecodable(name, e))? else {
            return Ok(None);
        };
        DateTime::from_timestamp_millis(ms)
            .map(Some)
            .ok_or_else(|| undecodable(name, format!("{ms} is not unix milliseconds in range")))
    }

    fn rows_affected(result: &SqliteQueryResult) -> u64 {
        result.rows_affected()
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
