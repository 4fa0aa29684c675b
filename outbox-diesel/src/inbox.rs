//! The receiver-side inbox: deduplicates deliveries inside the receiver's own diesel
//! transaction. The same table and statements as the sqlx inbox.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use diesel::sql_types::{BigInt, Text};
use outbox_engine::receive::check_key;
use outbox_engine::{Delivery, StoreError};
use outbox_sql::TableNames;
use outbox_sql::values::limit;

use crate::dialect::DieselDialect;

/// The inbox of the receiver that uses diesel: [`record`](Self::record) inside your
/// `conn.transaction(|conn| …)`, and apply the side effect only for [`Delivery::New`].
///
/// ```no_run
/// # fn demo(conn: &mut diesel::PgConnection, message_key: &str) -> Result<(), Box<dyn std::error::Error>> {
/// use diesel::Connection;
/// use outbox_diesel::postgres::PgInbox;
///
/// let inbox = PgInbox::new();
/// conn.transaction(|conn| {
///     if inbox.record(conn, "billing-service", message_key)?.is_new() {
///         // apply the side effect on `conn`
///     }
///     Ok::<_, Box<dyn std::error::Error>>(())
/// })?;
/// # Ok(())
/// # }
/// ```
///
/// Its calls are diesel's sync ones, made inside your sync transaction; with the
/// `async` feature the same inbox records on diesel-async connections too, and
/// implements [`Inbox`](outbox_engine::Inbox) for them. Cheap to clone.
pub struct DieselInbox<C> {
    names: TableNames,
    /// The record and purge statements.
    sql: Arc<(String, String)>,
    dialect: PhantomData<fn() -> C>,
}

impl<C: DieselDialect> DieselInbox<C> {
    /// The inbox in table `outbox_inbox`.
    pub fn new() -> Self {
        Self::with_names(TableNames::default())
    }

    /// The inbox in the table `names` gives.
    pub fn with_names(names: TableNames) -> Self {
        let sql = C::statements(&names, Default::default());
        let shared = C::shared(&sql);
        Self {
            sql: Arc::new((shared.inbox_record.clone(), shared.inbox_purge.clone())),
            names,
            dialect: PhantomData,
        }
    }

    /// Creates the inbox table on `conn` if missing (idempotent, safe to run
    /// concurrently, under the lock the sqlx inbox takes too). Run it outside a
    /// transaction of yours.
    ///
    /// # Errors
    ///
    /// A [`StoreError`] if a statement fails.
    pub fn migrate(&self, conn: &mut C) -> Result<(), StoreError> {
        let migrations = outbox_sql::inbox_migrations(C::DIALECT, &self.names);
        let sql = C::statements(&self.names, Default::default());
        C::migrate(conn, &sql, &migrations, true)
    }

    /// The record and purge statements, for the async connections.
    #[cfg_attr(not(feature = "async"), allow(dead_code))]
    pub(crate) fn statements(&self) -> &(String, String) {
        &self.sql
    }

    /// Records `key` for `consumer` on `conn`, inside your transaction: [`Delivery::New`]
    /// the first time (apply the side effect, then commit), [`Delivery::Duplicate`] once
    /// an earlier delivery committed. A concurrent delivery of the same key waits for
    /// this transaction to end.
    ///
    /// # Errors
    ///
    /// `InvalidInput` for a consumer or key the inbox cannot store (empty, longer than
    /// 191 bytes, a NUL); the database's error otherwise (`Conflict` for a deadlock: retry
    /// the whole transaction).
    pub fn record(&self, conn: &mut C, consumer: &str, key: &str) -> Result<Delivery, StoreError>
    where
        String: diesel::serialize::ToSql<Text, C::Backend>,
    {
        check_key("consumer", consumer)?;
        check_key("key", key)?;
        let query = C::query(&self.sql.0)
            .bind::<Text, _>(consumer.to_owned())
            .bind::<Text, _>(key.to_owned());
        Ok(if conn.run(query)? == 1 {
            Delivery::New
        } else {
            Delivery::Duplicate
        })
    }

    /// Deletes up to `batch_size` records older than `older_than`; returns how many.
    ///
    /// # Errors
    ///
    /// The database's error.
    pub fn purge(
        &self,
        conn: &mut C,
        older_than: Duration,
        batch_size: usize,
    ) -> Result<u64, StoreError>
    where
        i64: diesel::serialize::ToSql<BigInt, C::Backend>,
    {
        let query = C::query(&self.sql.1)
            .bind::<BigInt, _>(C::age_ms(older_than))
            .bind::<BigInt, _>(limit(batch_size));
        conn.run(query)
    }
}

impl<C: DieselDialect> Default for DieselInbox<C> {
    fn default() -> Self {
        Self::new()
    }
}

impl<C> Clone for DieselInbox<C> {
    fn clone(&self) -> Self {
        Self {
            names: self.names.clone(),
            sql: Arc::clone(&self.sql),
            dialect: PhantomData,
        }
    }
}

impl<C> fmt::Debug for DieselInbox<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DieselInbox")
            .field("names", &self.names)
            .finish_non_exhaustive()
    }
}
