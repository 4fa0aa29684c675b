//! The PostgreSQL store, enqueue, wakeups (LISTEN/NOTIFY) and inbox.
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use outbox_engine::NewMessage;
//! use outbox_sqlx::postgres::PgOutbox;
//!
//! let pool = sqlx::PgPool::connect("postgres://localhost/app").await?;
//! let outbox = PgOutbox::new(pool.clone());
//! outbox.migrate().await?;
//!
//! let mut tx = pool.begin().await?;
//! sqlx::query("UPDATE orders SET status = 'paid' WHERE id = $1").bind(42_i64).execute(&mut *tx).await?;
//! outbox.enqueue(&mut tx, &NewMessage::builder("billing", "order.paid").json(&42).build()?).await?;
//! tx.commit().await?;
//! outbox.notify().await?; // optional: wake relays in other processes now
//! # Ok(())
//! # }
//! ```

mod admin;
mod enqueue;
mod relay;
mod wakeup;

use chrono::{DateTime, Utc};
use outbox_engine::{Listener, MessageId, StoreError};
use outbox_sql::postgres::Statements;
use outbox_sql::{Dialect, Migration, Shared, TableNames};
use sqlx::Row;
use sqlx::postgres::{PgPool, PgQueryResult, PgRow, Postgres};
use uuid::Uuid;

pub use self::wakeup::PgNotifier;
use crate::SqlInbox;
use crate::dialect::{Column, SqlDialect, Tables, get, sealed};
use crate::error::classify;
use crate::store::SqlOutbox;

/// A fixed advisory-lock key serialising migrations across processes.
const MIGRATION_LOCK: i64 = 0x6f75_7462_6f78_0001;

/// The outbox on PostgreSQL: enqueue in your transaction ([`enqueue`](PgOutbox::enqueue),
/// [`enqueue_all`](PgOutbox::enqueue_all)), wake relays in other processes
/// ([`notify`](PgOutbox::notify), [`Backend::listen`](outbox_engine::Backend::listen)), and the relay's
/// [`Store`](outbox_engine::Store). Per-key order is fixed at commit (a deferred trigger
/// numbers keyed rows), so writers of one key wait only for each other's commit.
pub type PgOutbox = SqlOutbox<Postgres>;

/// The receiver-side inbox on PostgreSQL: deduplicates deliveries inside the receiver's
/// own transaction.
pub type PgInbox = SqlInbox<Postgres>;

impl sealed::Sealed for Postgres {}

impl SqlDialect for Postgres {
    type Statements = Statements;
    const DIALECT: Dialect = Dialect::Postgres;

    fn statements(names: &TableNames, published: outbox_engine::PublishedRows) -> Statements {
        Statements::for_rows(names, published)
    }

    fn shared(sql: &Statements) -> &Shared {
        &sql.shared
    }

    /// In one transaction holding an advisory lock.
    async fn migrate(
        pool: &PgPool,
        sql: &Statements,
        migrations: &[Migration],
        _: Tables,
    ) -> Result<(), StoreError> {
        let mut tx = pool.begin().await.map_err(classify)?;
        sqlx::query(&sql.migration_lock)
            .bind(MIGRATION_LOCK)
            .execute(&mut *tx)
            .await
            .map_err(classify)?;
        crate::migrate::apply::<Postgres>(&mut tx, &sql.shared, migrations, &[]).await?;
        tx.commit().await.map_err(classify)
    }

    fn text(row: &PgRow, column: impl Into<Column>) -> Result<Option<String>, sqlx::Error> {
        get(row, column)
    }

    fn id(row: &PgRow, column: impl Into<Column>) -> Result<MessageId, String> {
        let column = column.into();
        get(row, column)
            .map(MessageId::from_uuid)
            .map_err(|e| crate::common::undecodable(column.name(), e))
    }

    fn count(row: &PgRow, column: impl Into<Column>) -> Result<i64, sqlx::Error> {
        get(row, column)
    }

    fn raw_id(row: &PgRow) -> String {
        row.try_get::<Uuid, _>("id")
            .map_or_else(|_| "<unreadable id>".to_owned(), |id| id.to_string())
    }

    fn payload(row: &PgRow, column: impl Into<Column>) -> Result<Vec<u8>, sqlx::Error> {
        get(row, column)
    }

    fn time(row: &PgRow, column: impl Into<Column>) -> Result<Option<DateTime<Utc>>, String> {
        let column = column.into();
        get(row, column).map_err(|e| crate::common::undecodable(column.name(), e))
    }

    fn attempts(row: &PgRow, column: impl Into<Column>) -> Result<i64, sqlx::Error> {
        get::<i32, _>(row, column).map(i64::from)
    }

    /// A LISTEN connection on this table's NOTIFY channel.
    async fn listen(store: &PgOutbox) -> Result<Option<Listener>, StoreError> {
        wakeup::listener(store).await.map(Some)
    }

    /// A NOTIFY to relays in every process.
    async fn notify(store: &PgOutbox) -> Result<(), StoreError> {
        wakeup::notify(store).await
    }

    fn rows_affected(result: &PgQueryResult) -> u64 {
        result.rows_affected()
    }
}
