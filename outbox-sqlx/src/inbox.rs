//! The receiver-side inbox, written once for the three dialects.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use outbox_engine::receive::check_key;
use outbox_engine::{Delivery, Inbox, StoreError};
use outbox_sql::TableNames;

use crate::common::limit;
use crate::dialect::{SqlDialect, Tables};
use crate::error::classify;

/// The inbox on one dialect: deduplicates deliveries inside the receiver's own
/// transaction. Use it through its dialect's name: `postgres::PgInbox`,
/// `sqlite::SqliteInbox`, `mysql::MySqlInbox`, and record with the [`Inbox`] trait.
///
/// ```no_run
/// # async fn handle(pool: sqlx::PgPool, message_id: &str) -> Result<(), Box<dyn std::error::Error>> {
/// use outbox_sqlx::Inbox;
/// use outbox_sqlx::postgres::PgInbox;
///
/// let inbox = PgInbox::new();
/// let mut tx = pool.begin().await?;
/// if inbox.record(&mut tx, "billing-service", message_id).await?.is_new() {
///     // apply the side effect with `&mut *tx`
/// }
/// tx.commit().await?;
/// # Ok(())
/// # }
/// ```
///
/// Cheap to clone; clones share the rendered statements.
pub struct SqlInbox<DB> {
    names: TableNames,
    /// The record and purge statements.
    sql: Arc<(String, String)>,
    dialect: PhantomData<fn() -> DB>,
}

impl<DB: SqlDialect> SqlInbox<DB> {
    /// The inbox in table `outbox_inbox`.
    pub fn new() -> Self {
        Self::with_names(TableNames::default())
    }

    /// The inbox in the table `names` gives.
    pub fn with_names(names: TableNames) -> Self {
        Self {
            sql: Arc::new({
                let sql = DB::statements(&names, Default::default());
                let shared = DB::shared(&sql);
                (shared.inbox_record.clone(), shared.inbox_purge.clone())
            }),
            names,
            dialect: PhantomData,
        }
    }

    /// Creates the inbox table if missing. Idempotent and safe to run from several
    /// processes at once, like the outbox's migrations.
    ///
    /// # Errors
    ///
    /// A [`StoreError`] if a statement fails, of kind `Schema` if a table of that name
    /// exists but is not an inbox (MySQL).
    pub async fn migrate(&self, pool: &sqlx::Pool<DB>) -> Result<(), StoreError> {
        // The layout of published rows concerns the outbox table only.
        let migrations = Tables::Inbox.migrations::<DB>(&self.names, Default::default());
        DB::migrate(
            pool,
            &DB::statements(&self.names, Default::default()),
            &migrations,
            Tables::Inbox,
        )
        .await
    }
}

impl<DB: SqlDialect> Default for SqlInbox<DB> {
    fn default() -> Self {
        Self::new()
    }
}

impl<DB> Clone for SqlInbox<DB> {
    fn clone(&self) -> Self {
        Self {
            names: self.names.clone(),
            sql: Arc::clone(&self.sql),
            dialect: PhantomData,
        }
    }
}

impl<DB> fmt::Debug for SqlInbox<DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlInbox")
            .field("names", &self.names)
            .finish_non_exhaustive()
    }
}

impl<DB> Inbox for SqlInbox<DB>
where
    DB: SqlDialect,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
{
    type Connection = DB::Connection;

    /// Records `(consumer, key)` on `conn` (your transaction). Concurrent deliveries of
    /// the same key wait for each other: exactly one sees [`Delivery::New`] once its
    /// transaction commits; if it rolls back, the next one does. Keys compare byte for
    /// byte.
    ///
    /// # Errors
    ///
    /// `InvalidInput` for a consumer or key that [`check_key`] refuses; the database's
    /// error, of kind `Conflict` (retry the whole transaction) for a deadlock, a lock
    /// wait timeout or `SQLITE_BUSY`.
    async fn record(
        &self,
        conn: &mut DB::Connection,
        consumer: &str,
        key: &str,
    ) -> Result<Delivery, StoreError> {
        check_key("consumer", consumer)?;
        check_key("key", key)?;
        let done = sqlx::query(&self.sql.0)
            .bind(consumer)
            .bind(key)
            .execute(conn)
            .await
            .map_err(classify)?;
        Ok(if DB::rows_affected(&done) == 1 {
            Delivery::New
        } else {
            Delivery::Duplicate
        })
    }

    async fn purge(
        &self,
        conn: &mut DB::Connection,
        older_than: Duration,
        batch_size: usize,
    ) -> Result<u64, StoreError> {
        let done = sqlx::query(&self.sql.1)
            .bind(DB::age_ms(older_than))
            .bind(limit(batch_size))
            .execute(conn)
            .await
            .map_err(classify)?;
        Ok(DB::rows_affected(&done))
    }
}
