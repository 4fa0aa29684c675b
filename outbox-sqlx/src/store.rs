//! The outbox store, written once over a [`SqlDialect`]: construction, migrations, the
//! relay's [`Store`], stats, dead letters and purge. Each dialect module adds its enqueue.

use std::fmt;
use std::sync::Arc;

use outbox_engine::{
    Backend, Capabilities, Claim, ClaimRequest, CompleteReport, Completion, DeadLetter,
    DeadLetterFilter, DeadLetters, DestinationStats, FindMessages, FoundMessage, Gauges,
    LeaseToken, Listener, MessageId, Purge, PurgeRequest, Stats, Store, StoreError, StoreStats,
    Wakeup, Wakeups,
};
use outbox_sql::TableNames;
use tracing::warn;

use crate::PublishedRows;
use crate::dialect::{AdminDialect, DeadChange, Listing, RelayDialect, SqlDialect, Tables};
use crate::error::classify;
use crate::rows;

/// The outbox on one SQL dialect: enqueue in your transaction, and the relay's [`Store`].
/// Use it through its dialect's name: [`PgOutbox`](crate::postgres::PgOutbox),
/// [`SqliteOutbox`](crate::sqlite::SqliteOutbox), [`MySqlOutbox`](crate::mysql::MySqlOutbox).
///
/// Cheap to clone; clones share the pool, the rendered statements and the in-process
/// wakeup.
pub struct SqlOutbox<DB: SqlDialect> {
    pub(crate) pool: sqlx::Pool<DB>,
    pub(crate) sql: Arc<DB::Statements>,
    pub(crate) names: Arc<TableNames>,
    pub(crate) published: PublishedRows,
    /// Raised by [`Backend::notify`] where the dialect has no wakeup of its own: relays
    /// of this process that listen wake up at once; others find the rows at their next
    /// poll.
    pub(crate) wakeup: Wakeup,
}

impl<DB: SqlDialect> SqlOutbox<DB> {
    /// The outbox in table `outbox` (in the connection's default schema or database).
    pub fn new(pool: sqlx::Pool<DB>) -> Self {
        Self::with_names(pool, TableNames::default())
    }

    /// The outbox in the tables `names` gives (a schema in `names` is a PostgreSQL schema,
    /// a MySQL database, or a SQLite database attached on every connection of the pool).
    pub fn with_names(pool: sqlx::Pool<DB>, names: TableNames) -> Self {
        Self {
            pool,
            sql: Arc::new(DB::statements(&names, PublishedRows::Keep)),
            names: Arc::new(names),
            published: PublishedRows::Keep,
            wakeup: Wakeup::new(),
        }
    }

    /// Keeps or deletes rows once published (default: keep, purge later), or keeps them
    /// in slots that a purge empties whole (`Rotate`: PostgreSQL only, and the table must
    /// be created in that layout; `migrate` refuses it elsewhere).
    pub fn published_rows(mut self, mode: PublishedRows) -> Self {
        self.published = mode;
        self.sql = Arc::new(DB::statements(&self.names, mode));
        self
    }

    /// The pool the relay side uses.
    pub fn pool(&self) -> &sqlx::Pool<DB> {
        &self.pool
    }

    /// The table names.
    pub fn names(&self) -> &TableNames {
        &self.names
    }

    /// Creates the outbox table, its key counters and indexes if missing, and records
    /// the migrations applied. Idempotent and safe to run from several processes at
    /// once: PostgreSQL serialises on an advisory lock, SQLite on its write lock
    /// (`BEGIN IMMEDIATE`), MySQL on the named lock `outbox-sqlx.migrate`.
    ///
    /// # Errors
    ///
    /// A [`StoreError`] if a statement fails (for example, no permission to create
    /// tables); of kind `Schema` if a table of that name exists but is not an outbox
    /// (MySQL, SQLite) or `Rotate` is asked of a dialect without slots, `Timeout` if
    /// another MySQL migration held the lock for two minutes. In the `Rotate` layout a
    /// table created without slots fails with a message saying so, unchanged.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        outbox_sql::check_published_rows(DB::DIALECT, self.published)
            .map_err(|e| StoreError::new(outbox_engine::StoreErrorKind::Schema, e))?;
        let migrations = Tables::Outbox.migrations::<DB>(&self.names, self.published);
        DB::migrate(&self.pool, &self.sql, &migrations, Tables::Outbox).await
    }

    /// Wakes the relays that listen, after your transaction committed: on PostgreSQL a
    /// NOTIFY that reaches relays in every process (for many writers, share a coalescing
    /// `PgOutbox::notifier`); on SQLite and MySQL the relays of this process, through
    /// the signal [`listen`](Self::listen) hands out. Relays that are not woken find the
    /// rows at their next poll.
    ///
    /// # Errors
    ///
    /// PostgreSQL's error when the NOTIFY fails; the rows are committed anyway and the
    /// relays' poll finds them.
    pub async fn notify(&self) -> Result<(), StoreError> {
        DB::notify(self).await
    }

    /// The wakeup a relay of this process listens to: a LISTEN connection on PostgreSQL
    /// (which reconnects by itself), the in-process signal that [`notify`](Self::notify)
    /// raises on SQLite and MySQL. `outbox::Outbox` listens by itself.
    ///
    /// # Errors
    ///
    /// PostgreSQL's error when the LISTEN connection cannot be opened.
    pub async fn listen(&self) -> Result<Option<Listener>, StoreError> {
        DB::listen(self).await
    }
}

impl<DB: SqlDialect> Clone for SqlOutbox<DB> {
    fn clone(&self) -> Self {
        Self {
            pool: self.pool.clone(),
            sql: Arc::clone(&self.sql),
            names: Arc::clone(&self.names),
            published: self.published,
            wakeup: self.wakeup.clone(),
        }
    }
}

impl<DB: SqlDialect> fmt::Debug for SqlOutbox<DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlOutbox")
            .field("dialect", &DB::DIALECT)
            .field("names", &self.names)
            .field("published", &self.published)
            .finish_non_exhaustive()
    }
}

impl<DB: SqlDialect> Backend for SqlOutbox<DB> {
    async fn migrate(&self) -> Result<(), StoreError> {
        SqlOutbox::migrate(self).await
    }

    async fn listen(&self) -> Result<Option<Listener>, StoreError> {
        SqlOutbox::listen(self).await
    }

    async fn notify(&self) -> Result<(), StoreError> {
        SqlOutbox::notify(self).await
    }
}

impl<DB> Store for SqlOutbox<DB>
where
    DB: RelayDialect,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
{
    fn capabilities(&self) -> Capabilities {
        let wakeups = match DB::DIALECT {
            outbox_sql::Dialect::Postgres => Wakeups::Database,
            outbox_sql::Dialect::Sqlite | outbox_sql::Dialect::MySql => Wakeups::InProcess,
        };
        Capabilities::new(DB::DIALECT.name())
            .published_rows(self.published)
            .wakeups(wakeups)
            // SQLite has one writer: a claim would wait for the completion it overlaps.
            .overlapped_claims(DB::DIALECT != outbox_sql::Dialect::Sqlite)
    }

    async fn claim(&self, request: &ClaimRequest) -> Result<Claim, StoreError> {
        let mut claim = DB::claim(self, request).await?;
        claim.messages.sort_by_key(|m| m.id);
        Ok(claim)
    }

    /// Three reads whose cost follows the backlog and the dead letters: the unfinished
    /// rows through the due index, the dead ones through the dead index, and the halted
    /// keys from the dead keyed rows.
    async fn gauges(&self, limit: usize) -> Result<Option<Gauges>, StoreError> {
        let shared = DB::shared(&self.sql);
        let bound = crate::common::limit(limit);
        let unfinished = sqlx::query(&shared.gauges_unfinished)
            .bind(bound)
            .fetch_all(&self.pool)
            .await
            .map_err(classify)?;
        let dead = sqlx::query(&shared.gauges_dead)
            .bind(bound)
            .fetch_all(&self.pool)
            .await
            .map_err(classify)?;
        let halted = sqlx::query(&shared.halted_keys)
            .fetch_all(&self.pool)
            .await
            .map_err(classify)?;
        Ok(Some(outbox_sql::values::gauges(
            unfinished
                .iter()
                .map(rows::unfinished_gauges::<DB>)
                .collect::<Result<_, _>>()?,
            dead.iter()
                .map(rows::dead_gauge::<DB>)
                .collect::<Result<_, _>>()?,
            halted
                .iter()
                .map(rows::halted_keys::<DB>)
                .collect::<Result<_, _>>()?,
            limit,
        )))
    }

    async fn complete(
        &self,
        token: LeaseToken,
        completions: &[Completion],
    ) -> Result<CompleteReport, StoreError> {
        if completions.is_empty() {
            return Ok(CompleteReport::default());
        }
        DB::complete(self, token, completions).await
    }

    async fn release(
        &self,
        token: LeaseToken,
        ids: &[MessageId],
    ) -> Result<CompleteReport, StoreError> {
        if ids.is_empty() {
            return Ok(CompleteReport::default());
        }
        let released = DB::release(self, token, ids).await?;
        Ok(outbox_sql::values::report(ids.iter().copied(), &released))
    }
}

impl<DB> StoreStats for SqlOutbox<DB>
where
    DB: SqlDialect,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
{
    async fn stats(&self) -> Result<Stats, StoreError> {
        let shared = DB::shared(&self.sql);
        let rows = sqlx::query(&shared.stats)
            .fetch_all(&self.pool)
            .await
            .map_err(classify)?;
        let mut destinations = rows
            .iter()
            .map(rows::destination_stats::<DB>)
            .collect::<Result<Vec<DestinationStats>, StoreError>>()?;
        let halted = sqlx::query(&shared.halted_keys)
            .fetch_all(&self.pool)
            .await
            .map_err(classify)?;
        for row in &halted {
            let (destination, keys) = rows::halted_keys::<DB>(row)?;
            if let Some(d) = destinations
                .iter_mut()
                .find(|d| d.destination == destination)
            {
                d.halted_keys = keys;
            }
        }
        Ok(Stats { destinations })
    }
}

impl<DB: AdminDialect> DeadLetters for SqlOutbox<DB> {
    async fn list_dead(
        &self,
        filter: &DeadLetterFilter,
        limit: usize,
    ) -> Result<Vec<DeadLetter>, StoreError> {
        let rows = DB::listed_rows(self, Listing::Dead, filter, limit).await?;
        let mut dead = Vec::with_capacity(rows.len());
        for row in &rows {
            match rows::dead_letter::<DB>(row) {
                Ok(letter) => dead.push(letter),
                Err(reason) => warn!(%reason, "a dead letter cannot be listed"),
            }
        }
        Ok(dead)
    }

    async fn count_dead(&self, filter: &DeadLetterFilter) -> Result<u64, StoreError> {
        DB::count_dead(self, filter).await
    }

    async fn replay_dead(&self, filter: &DeadLetterFilter) -> Result<u64, StoreError> {
        DB::change_dead(self, DeadChange::Replay, filter).await
    }

    async fn discard_dead(&self, filter: &DeadLetterFilter) -> Result<u64, StoreError> {
        DB::change_dead(self, DeadChange::Discard, filter).await
    }
}

impl<DB: AdminDialect> FindMessages for SqlOutbox<DB> {
    async fn find_messages(
        &self,
        key: &str,
        limit: usize,
    ) -> Result<Vec<FoundMessage>, StoreError> {
        let rows = DB::find_rows(self, key, limit).await?;
        let mut found = Vec::with_capacity(rows.len());
        for row in &rows {
            match rows::found::<DB>(row) {
                Ok(message) => found.push(message),
                Err(reason) => warn!(%reason, "a found row cannot be read as a message"),
            }
        }
        Ok(found)
    }

    async fn list_waiting(
        &self,
        filter: &DeadLetterFilter,
        limit: usize,
    ) -> Result<Vec<FoundMessage>, StoreError> {
        let rows = DB::listed_rows(self, Listing::Waiting, filter, limit).await?;
        let mut found = Vec::with_capacity(rows.len());
        for row in &rows {
            match rows::waiting::<DB>(row) {
                Ok(message) => found.push(message),
                Err(reason) => warn!(%reason, "a waiting row cannot be listed"),
            }
        }
        Ok(found)
    }
}

impl<DB> Purge for SqlOutbox<DB>
where
    DB: AdminDialect,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    for<'q> i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> String: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    /// Old finished rows as the request says, then the counter rows of up to
    /// `batch_size` keys left with no pending, leased or dead row; returns both counts
    /// summed.
    async fn purge(&self, request: &PurgeRequest) -> Result<u64, StoreError> {
        let rows = DB::purge(self, request).await?;
        Ok(rows + self.forget_idle_keys(request.batch_size).await?)
    }
}

impl<DB> SqlOutbox<DB>
where
    DB: SqlDialect,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    for<'q> i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> String: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    /// Deletes the counter rows of at most `bound` idle keys (see `Shared::forget_key`
    /// in `outbox-sql` for why each takes a lock and a second look); returns how many.
    async fn forget_idle_keys(&self, bound: usize) -> Result<u64, StoreError> {
        let shared = DB::shared(&self.sql);
        let idle = sqlx::query(&shared.idle_keys)
            .bind(crate::common::limit(bound))
            .fetch_all(&self.pool)
            .await
            .map_err(classify)?;
        let mut forgotten = 0;
        for row in &idle {
            let Some(key) = DB::text(row, "partition_key").map_err(classify)? else {
                continue;
            };
            let forget = sqlx::query(&shared.forget_key).bind(key.clone());
            if DB::DIALECT == outbox_sql::Dialect::Sqlite {
                // One writer at a time: the delete alone judges the key on current rows.
                let done = forget.execute(&self.pool).await.map_err(classify)?;
                forgotten += DB::rows_affected(&done);
                continue;
            }
            let mut tx = self.pool.begin().await.map_err(classify)?;
            let held = sqlx::query(&shared.lock_key)
                .bind(key)
                .fetch_optional(&mut *tx)
                .await
                .map_err(classify)?;
            if held.is_some() {
                let done = forget.execute(&mut *tx).await.map_err(classify)?;
                forgotten += DB::rows_affected(&done);
            }
            tx.commit().await.map_err(classify)?;
        }
        Ok(forgotten)
    }
}
