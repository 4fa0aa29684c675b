//! The writer, written once over [`DieselDialect`]: enqueue and migrate on the caller's
//! own diesel connection.

use std::fmt;
use std::sync::Arc;

use outbox_engine::{NewMessage, PublishedRows, StoreError, StoreErrorKind};
use outbox_sql::TableNames;

use crate::dialect::{Context, DieselDialect};

/// The outbox's writing side on a diesel connection type `C` (`PgConnection`,
/// `SqliteConnection`, `MysqlConnection`): [`enqueue`](Self::enqueue) inside your own
/// `conn.transaction(|conn| …)`, and [`migrate`](Self::migrate) on a connection of yours.
///
/// It holds no connection and no pool. The relay reads the table through the sqlx store
/// of the same database (`outbox_sqlx`, or a `diesel+postgres://…` store URL in the
/// `outbox` front crate, which opens that store): one relay implementation per database
/// (decision 0038). The rows are the same whichever side wrote them.
///
/// ```no_run
/// # #[cfg(feature = "postgres")]
/// # fn demo(conn: &mut diesel::PgConnection) -> Result<(), Box<dyn std::error::Error>> {
/// use diesel::{Connection, RunQueryDsl};
/// use outbox_diesel::postgres::PgOutbox;
/// use outbox_engine::NewMessage;
///
/// let outbox = PgOutbox::new();
/// outbox.migrate(conn)?;
/// conn.transaction(|conn| {
///     diesel::sql_query("UPDATE orders SET status = 'paid' WHERE id = 42").execute(conn)?;
///     let message = NewMessage::builder("billing", "order.paid").json(&42).build()?;
///     outbox.enqueue(conn, &message)?;
///     Ok::<_, Box<dyn std::error::Error>>(())
/// })?;
/// # Ok(())
/// # }
/// ```
///
/// Cheap to clone; clones share the rendered statements.
pub struct DieselOutbox<C: DieselDialect> {
    ctx: Arc<Context<C>>,
}

impl<C: DieselDialect> DieselOutbox<C> {
    /// The outbox in table `outbox`, keeping published rows.
    pub fn new() -> Self {
        Self::with_names(TableNames::default())
    }

    /// The outbox in the tables `names` gives.
    pub fn with_names(names: TableNames) -> Self {
        Self::context(names, PublishedRows::Keep)
    }

    fn context(names: TableNames, published: PublishedRows) -> Self {
        Self {
            ctx: Arc::new(Context {
                sql: C::statements(&names, published),
                names,
                published,
            }),
        }
    }

    /// The layout of the table, as the relay's store is configured: `Keep` (the default)
    /// and `Delete` share one; `Rotate` (PostgreSQL only) writes into slots a purge
    /// empties whole, for a table created in that layout.
    #[must_use]
    pub fn published_rows(self, mode: PublishedRows) -> Self {
        Self::context(self.ctx.names.clone(), mode)
    }

    /// The table names.
    pub fn names(&self) -> &TableNames {
        &self.ctx.names
    }

    /// The rendered statements and settings, for the async enqueue.
    #[cfg_attr(not(feature = "async"), allow(dead_code))]
    pub(crate) fn ctx(&self) -> &Context<C> {
        &self.ctx
    }

    /// Inserts `message` on `conn` — your connection, normally inside
    /// `conn.transaction(|conn| …)`. Never commits and uses no other connection.
    ///
    /// # Errors
    ///
    /// [`StoreError`] of kind `Constraint` if the id exists, or the database's error; fail
    /// the transaction with it, as with any failed statement.
    pub fn enqueue(&self, conn: &mut C, message: &NewMessage) -> Result<(), StoreError> {
        C::insert(conn, &self.ctx, std::slice::from_ref(message)).map(|_| ())
    }

    /// Inserts `messages` on `conn` (one statement on PostgreSQL); see
    /// [`enqueue`](Self::enqueue).
    ///
    /// # Errors
    ///
    /// As [`enqueue`](Self::enqueue); no message is inserted if any fails, once your
    /// transaction rolls back.
    pub fn enqueue_all(&self, conn: &mut C, messages: &[NewMessage]) -> Result<u64, StoreError> {
        C::insert(conn, &self.ctx, messages)
    }

    /// Creates the outbox table, its key counters and indexes on `conn` if missing: the
    /// migrations of the sqlx store, recorded in the same migrations table and under the
    /// same lock, so either side (or `outbox migrate`) may run them, from several
    /// processes at once. Run it outside a transaction of yours.
    ///
    /// # Errors
    ///
    /// A [`StoreError`] if a statement fails.
    pub fn migrate(&self, conn: &mut C) -> Result<(), StoreError> {
        let published = self.ctx.published;
        outbox_sql::check_published_rows(C::DIALECT, published)
            .map_err(|e| StoreError::new(StoreErrorKind::Schema, e))?;
        let migrations = outbox_sql::outbox_migrations(C::DIALECT, &self.ctx.names, published);
        C::migrate(conn, &self.ctx.sql, &migrations, false)
    }
}

impl<C: DieselDialect> Default for DieselOutbox<C> {
    fn default() -> Self {
        Self::new()
    }
}

impl<C: DieselDialect> Clone for DieselOutbox<C> {
    fn clone(&self) -> Self {
        Self {
            ctx: Arc::clone(&self.ctx),
        }
    }
}

impl<C: DieselDialect> fmt::Debug for DieselOutbox<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DieselOutbox")
            .field("dialect", &C::DIALECT)
            .field("names", &self.ctx.names)
            .field("published", &self.ctx.published)
            .finish()
    }
}
