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
//!   commit, as above, or call the store's [`notify`](MySqlOutbox::notify), which
//!   wakes the relays that listen to it (`outbox::Outbox` does).
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

mod admin;
mod enqueue;
mod relay;

use std::time::Duration;

use chrono::{DateTime, NaiveDateTime, Utc};
use outbox_engine::{MessageId, StoreError, StoreErrorKind};
use outbox_sql::mysql::{
    ID_CHUNK, MAX_FILTER_VALUES, MAX_INTERVAL_MS, MIGRATION_LOCK, MIGRATION_LOCK_TIMEOUT_S,
    RELAY_ISOLATION, Statements, clip_bytes, clip_chars, db_time, insert_chunks, interval_ms,
    padded,
};
use outbox_sql::{Dialect, Migration, Shared, TableNames};
use sqlx::mysql::{MySql, MySqlArguments, MySqlPool, MySqlQueryResult, MySqlRow};
use sqlx::query::Query;
use sqlx::{Row, Transaction};

use crate::SqlInbox;
use crate::common::{stored_id, undecodable};
use crate::dialect::{Column, SqlDialect, Tables, get, sealed};
use crate::error::classify;
use crate::store::SqlOutbox;

pub use outbox_sql::mysql::{MAX_ERROR_BYTES, MAX_OWNER_CHARS};

/// The outbox on MySQL 8 or MariaDB ≥ 10.6: enqueue in your transaction
/// ([`enqueue`](MySqlOutbox::enqueue), [`enqueue_all`](MySqlOutbox::enqueue_all)) and the
/// relay's [`Store`](outbox_engine::Store); see the [module documentation](self) for how
/// it maps onto MySQL. A schema in the table names is a MySQL database.
pub type MySqlOutbox = SqlOutbox<MySql>;

/// The receiver-side inbox on MySQL / MariaDB: deduplicates deliveries inside the
/// receiver's own transaction.
///
/// Keys compare byte for byte (the columns are `VARBINARY`). InnoDB may resolve
/// concurrent inserts of the same key with a deadlock, rolling back one transaction:
/// that error has kind `Conflict`
/// ([`is_retryable`](outbox_engine::StoreErrorKind::is_retryable)); run the whole
/// delivery transaction again.
pub type MySqlInbox = SqlInbox<MySql>;

impl sealed::Sealed for MySql {}

impl SqlDialect for MySql {
    type Statements = Statements;
    const DIALECT: Dialect = Dialect::MySql;

    fn statements(names: &TableNames, _: outbox_engine::PublishedRows) -> Statements {
        Statements::new(names)
    }

    fn shared(sql: &Statements) -> &Shared {
        &sql.shared
    }

    /// On one connection outside any transaction (MySQL commits each DDL statement at
    /// once), under the server's named lock; checks that an existing table of the name
    /// has every column before recording the migration.
    async fn migrate(
        pool: &MySqlPool,
        sql: &Statements,
        migrations: &[Migration],
        tables: Tables,
    ) -> Result<(), StoreError> {
        let checks = match tables {
            Tables::Outbox => [sql.check_outbox.as_str(), sql.check_keys.as_str()].to_vec(),
            Tables::Inbox => [sql.check_inbox.as_str()].to_vec(),
        };
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
        let result =
            crate::migrate::apply::<MySql>(&mut conn, &sql.shared, migrations, &checks).await;
        let unlocked = sqlx::query(&sql.migration_unlock)
            .bind(MIGRATION_LOCK)
            .execute(&mut *conn)
            .await
            .map_err(classify);
        result?;
        unlocked.map(|_| ())
    }

    /// Columns with a binary collation (`utf8mb4_bin`, `ascii_bin`) carry the `BINARY`
    /// flag, which sqlx's `String` type check refuses, so the check is skipped; the
    /// value is still validated as UTF-8.
    fn text(row: &MySqlRow, column: impl Into<Column>) -> Result<Option<String>, sqlx::Error> {
        row.try_get_unchecked(column.into())
    }

    fn attempts(row: &MySqlRow, column: impl Into<Column>) -> Result<i64, sqlx::Error> {
        get::<i32, _>(row, column).map(i64::from)
    }

    fn id(row: &MySqlRow, column: impl Into<Column>) -> Result<MessageId, String> {
        let column = column.into();
        let text = Self::text(row, column).map_err(|e| undecodable(column.name(), e))?;
        stored_id(text.as_deref().unwrap_or_default())
    }

    fn payload(row: &MySqlRow, column: impl Into<Column>) -> Result<Vec<u8>, sqlx::Error> {
        get(row, column)
    }

    fn raw_id(row: &MySqlRow) -> String {
        match Self::text(row, "id") {
            Ok(Some(id)) => id,
            _ => "<unreadable id>".to_owned(),
        }
    }

    /// Times are naive UTC `DATETIME(6)`.
    fn time(row: &MySqlRow, column: impl Into<Column>) -> Result<Option<DateTime<Utc>>, String> {
        let column = column.into();
        get::<Option<NaiveDateTime>, _>(row, column)
            .map(|t| t.map(|t| t.and_utc()))
            .map_err(|e| undecodable(column.name(), e))
    }

    fn count(row: &MySqlRow, column: impl Into<Column>) -> Result<i64, sqlx::Error> {
        get(row, column)
    }

    fn rows_affected(result: &MySqlQueryResult) -> u64 {
        result.rows_affected()
    }

    fn age_ms(age: Duration) -> i64 {
        interval_ms(age)
    }
}

impl MySqlOutbox {
    /// Starts a relay transaction at `READ COMMITTED`, in one round trip.
    pub(crate) async fn begin(&self) -> Result<Transaction<'static, MySql>, StoreError> {
        self.pool
            .begin_with(format!("{RELAY_ISOLATION}; START TRANSACTION"))
            .await
            .map_err(classify)
    }
}

/// Binds `ids`, then repeats the last one up to `n` placeholders (harmless in `IN`).
fn bind_ids<'q>(
    mut query: Query<'q, MySql, MySqlArguments>,
    ids: &[impl ToString],
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
