//! The store, written once over [`DieselDialect`]: an r2d2 pool of the dialect's
//! connections, each operation run on one of them in tokio's blocking pool.

use std::fmt;
use std::sync::{Arc, PoisonError, RwLock};

use diesel::r2d2::{ConnectionManager, Pool};
use outbox_engine::{
    Backend, Claim, ClaimRequest, CompleteReport, Completion, DeadLetter, DeadLetterFilter,
    DeadLetters, FindMessages, FoundMessage, Gauges, LeaseToken, Listener, MessageId, NewMessage,
    Purge, PurgeRequest, Stats, Store, StoreError, StoreStats, Wakeup,
};
use outbox_sql::values::{limit, report};
use outbox_sql::{Migration, TableNames};

pub use outbox_engine::PublishedRows;

use crate::dialect::{Context, DeadChange, DieselDialect};
use crate::error;

/// The outbox on a diesel connection type `C` (`PgConnection`, `SqliteConnection`,
/// `MysqlConnection`): enqueue on your own connection, inside your transaction
/// ([`enqueue`](Self::enqueue)), and the relay's [`Store`] over an r2d2 pool of `C`.
///
/// The relay's statements are those of the sqlx stores (`outbox-sql`): a table written
/// through one is read by the other. Each store call takes a pooled connection and runs
/// on tokio's blocking pool; size the pool to the relay's `concurrency` plus the reads of
/// dashboards and the CLI.
///
/// A diesel call cannot be cancelled. When the caller gives up on a store call (the relay
/// does after its lease), the call keeps its thread and its connection until the
/// database answers, or the OS gives up on a connection that went silent, which may be
/// never. With [`renewing_pool`](Self::renewing_pool), the store then opens a fresh pool
/// and leaves the stuck connection behind; without it, each such call holds one
/// connection of the pool for as long as it is stuck.
///
/// Cheap to clone; clones share the pool and the rendered statements.
pub struct DieselOutbox<C: DieselDialect> {
    pools: Arc<Pools<C>>,
    ctx: Arc<Context<C>>,
    wakeup: Wakeup,
}

/// How a fresh pool is opened.
type OpenPool<C> = Box<dyn Fn() -> Pool<ConnectionManager<C>> + Send + Sync>;

/// The pool the store's calls take connections from, and how to open a fresh one.
struct Pools<C: DieselDialect> {
    current: RwLock<(u64, Pool<ConnectionManager<C>>)>,
    open: Option<OpenPool<C>>,
}

impl<C: DieselDialect> Pools<C> {
    fn new(pool: Pool<ConnectionManager<C>>, open: Option<OpenPool<C>>) -> Arc<Self> {
        Arc::new(Self {
            current: RwLock::new((0, pool)),
            open,
        })
    }

    /// The current pool and its generation.
    fn current(&self) -> (u64, Pool<ConnectionManager<C>>) {
        let current = self.current.read().unwrap_or_else(PoisonError::into_inner);
        (current.0, current.1.clone())
    }

    /// Replaces the pool of `generation`, once, if there is a way to open one.
    fn renew(&self, generation: u64) {
        let Some(open) = &self.open else { return };
        let mut current = self.current.write().unwrap_or_else(PoisonError::into_inner);
        if current.0 == generation {
            *current = (generation + 1, open());
        }
    }
}

/// Renews the pool of `generation` when dropped armed: its call was abandoned.
struct Abandoned<'a, C: DieselDialect> {
    pools: &'a Pools<C>,
    generation: u64,
    armed: bool,
}

impl<C: DieselDialect> Drop for Abandoned<'_, C> {
    fn drop(&mut self) {
        if self.armed {
            self.pools.renew(self.generation);
        }
    }
}

impl<C: DieselDialect> DieselOutbox<C> {
    /// The outbox in table `outbox`, keeping published rows.
    pub fn new(pool: Pool<ConnectionManager<C>>) -> Self {
        Self::with_names(pool, TableNames::default())
    }

    /// The outbox in the tables `names` gives.
    pub fn with_names(pool: Pool<ConnectionManager<C>>, names: TableNames) -> Self {
        Self {
            pools: Pools::new(pool, None),
            ctx: Arc::new(Context {
                sql: C::statements(&names, PublishedRows::Keep),
                names,
                published: PublishedRows::Keep,
            }),
            wakeup: Wakeup::new(),
        }
    }

    /// Keeps published rows (the default; `outbox purge` removes old ones), deletes
    /// each row once it is published, or keeps them in slots a purge empties whole
    /// (`Rotate`: PostgreSQL only, for a table created in that layout).
    #[must_use]
    pub fn published_rows(self, mode: PublishedRows) -> Self {
        Self {
            ctx: Arc::new(Context {
                sql: C::statements(&self.ctx.names, mode),
                names: self.ctx.names.clone(),
                published: mode,
            }),
            ..self
        }
    }

    /// Opens a fresh pool with `open` when a store call is abandoned before it ends, and
    /// leaves the old one to the calls still stuck on it (see the type's docs). `open`
    /// must not block: build the pool with r2d2's `build_unchecked`. The pools the
    /// drivers open (`diesel+postgres://` …) do this.
    ///
    /// ```no_run
    /// # #[cfg(feature = "postgres")] {
    /// use diesel::r2d2::{ConnectionManager, Pool};
    /// use outbox_diesel::postgres::PgOutbox;
    ///
    /// let open = || {
    ///     Pool::builder()
    ///         .max_size(4)
    ///         .build_unchecked(ConnectionManager::new("postgres://app@db/app"))
    /// };
    /// let outbox = PgOutbox::new(open()).renewing_pool(open);
    /// # }
    /// ```
    #[must_use]
    pub fn renewing_pool(
        self,
        open: impl Fn() -> Pool<ConnectionManager<C>> + Send + Sync + 'static,
    ) -> Self {
        let (_, pool) = self.pools.current();
        Self {
            pools: Pools::new(pool, Some(Box::new(open))),
            ..self
        }
    }

    /// The pool the relay side uses now.
    pub fn pool(&self) -> Pool<ConnectionManager<C>> {
        self.pools.current().1
    }

    /// The table names.
    pub fn names(&self) -> &TableNames {
        &self.ctx.names
    }

    /// The rendered statements and settings, for the async enqueue.
    #[cfg_attr(not(feature = "async"), allow(dead_code))]
    pub(crate) fn context(&self) -> &Context<C> {
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

    /// Creates the outbox table, its key counters and indexes if missing (idempotent and
    /// safe to run from several processes at once, as with the sqlx stores).
    ///
    /// # Errors
    ///
    /// A [`StoreError`] if a statement fails.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let published = self.ctx.published;
        outbox_sql::check_published_rows(C::DIALECT, published)
            .map_err(|e| StoreError::new(outbox_engine::StoreErrorKind::Schema, e))?;
        let migrations = outbox_sql::outbox_migrations(C::DIALECT, &self.ctx.names, published);
        self.run(move |conn, ctx| C::migrate(conn, &ctx.sql, &migrations, false))
            .await
    }

    /// Runs `work` on a pooled connection in tokio's blocking pool.
    pub(crate) async fn run<T, F>(&self, work: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&mut C, &Context<C>) -> Result<T, StoreError> + Send + 'static,
    {
        let (generation, pool) = self.pools.current();
        let ctx = Arc::clone(&self.ctx);
        let mut abandoned = Abandoned {
            pools: &self.pools,
            generation,
            armed: true,
        };
        let joined = tokio::task::spawn_blocking(move || {
            let mut conn = pool.get().map_err(error::pool)?;
            work(&mut conn, &ctx)
        })
        .await;
        abandoned.armed = false;
        joined.map_err(error::task)?
    }
}

/// Runs `migrations` on a pooled connection of `pool` under the dialect's lock.
pub(crate) async fn migrate<C: DieselDialect>(
    pool: &Pool<ConnectionManager<C>>,
    names: &TableNames,
    migrations: Vec<Migration>,
    inbox: bool,
) -> Result<(), StoreError> {
    let pool = pool.clone();
    let sql = C::statements(names, PublishedRows::default());
    tokio::task::spawn_blocking(move || {
        let mut conn = pool.get().map_err(error::pool)?;
        C::migrate(&mut conn, &sql, &migrations, inbox)
    })
    .await
    .map_err(error::task)?
}

impl<C: DieselDialect> Clone for DieselOutbox<C> {
    fn clone(&self) -> Self {
        Self {
            pools: Arc::clone(&self.pools),
            ctx: Arc::clone(&self.ctx),
            wakeup: self.wakeup.clone(),
        }
    }
}

impl<C: DieselDialect> fmt::Debug for DieselOutbox<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DieselOutbox")
            .field("dialect", &C::DIALECT)
            .field("names", &self.ctx.names)
            .field("published", &self.ctx.published)
            .finish_non_exhaustive()
    }
}

/// Wakeups are in-process: a relay in the process that enqueues wakes when it calls
/// [`notify`](Backend::notify) after its commit; relays elsewhere poll.
impl<C: DieselDialect> Backend for DieselOutbox<C> {
    async fn migrate(&self) -> Result<(), StoreError> {
        DieselOutbox::migrate(self).await
    }

    async fn listen(&self) -> Result<Option<Listener>, StoreError> {
        Ok(Some(Listener::new(self.wakeup.clone(), ())))
    }

    async fn notify(&self) -> Result<(), StoreError> {
        self.wakeup.notify();
        Ok(())
    }
}

impl<C: DieselDialect> Store for DieselOutbox<C> {
    async fn claim(&self, request: &ClaimRequest) -> Result<Claim, StoreError> {
        let request = request.clone();
        let mut claim = self
            .run(move |conn, ctx| C::claim(conn, ctx, &request))
            .await?;
        claim.messages.sort_by_key(|m| m.id);
        Ok(claim)
    }

    async fn complete(
        &self,
        token: LeaseToken,
        completions: &[Completion],
    ) -> Result<CompleteReport, StoreError> {
        if completions.is_empty() {
            return Ok(CompleteReport::default());
        }
        let owned = completions.to_vec();
        let applied = self
            .run(move |conn, ctx| C::complete(conn, ctx, token, &owned))
            .await?;
        Ok(report(completions.iter().map(|c| c.id), &applied))
    }

    async fn release(
        &self,
        token: LeaseToken,
        ids: &[MessageId],
    ) -> Result<CompleteReport, StoreError> {
        if ids.is_empty() {
            return Ok(CompleteReport::default());
        }
        let owned = ids.to_vec();
        let released = self
            .run(move |conn, ctx| C::release(conn, ctx, token, &owned))
            .await?;
        Ok(report(ids.iter().copied(), &released))
    }

    /// Three reads whose cost follows the backlog and the dead letters, as on the sqlx
    /// stores.
    async fn gauges(&self, bound: usize) -> Result<Option<Gauges>, StoreError> {
        self.run(move |conn, ctx| C::gauges(conn, ctx, bound).map(Some))
            .await
    }
}

impl<C: DieselDialect> StoreStats for DieselOutbox<C> {
    async fn stats(&self) -> Result<Stats, StoreError> {
        let (mut destinations, halted) = self
            .run(|conn, ctx| Ok((C::stats(conn, ctx)?, C::halted(conn, ctx)?)))
            .await?;
        for (destination, keys) in halted {
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

impl<C: DieselDialect> DeadLetters for DieselOutbox<C> {
    async fn list_dead(
        &self,
        filter: &DeadLetterFilter,
        n: usize,
    ) -> Result<Vec<DeadLetter>, StoreError> {
        let filter = filter.clone();
        self.run(move |conn, ctx| C::list_dead(conn, ctx, &filter, limit(n)))
            .await
    }

    async fn count_dead(&self, filter: &DeadLetterFilter) -> Result<u64, StoreError> {
        let filter = filter.clone();
        self.run(move |conn, ctx| C::count_dead(conn, ctx, &filter))
            .await
    }

    async fn replay_dead(&self, filter: &DeadLetterFilter) -> Result<u64, StoreError> {
        let filter = filter.clone();
        self.run(move |conn, ctx| C::change_dead(conn, ctx, DeadChange::Replay, &filter))
            .await
    }

    async fn discard_dead(&self, filter: &DeadLetterFilter) -> Result<u64, StoreError> {
        let filter = filter.clone();
        self.run(move |conn, ctx| C::change_dead(conn, ctx, DeadChange::Discard, &filter))
            .await
    }
}

impl<C: DieselDialect> FindMessages for DieselOutbox<C> {
    async fn find_messages(&self, key: &str, n: usize) -> Result<Vec<FoundMessage>, StoreError> {
        let key = key.to_owned();
        self.run(move |conn, ctx| C::find(conn, ctx, &key, limit(n)))
            .await
    }
}

impl<C: DieselDialect> Purge for DieselOutbox<C> {
    async fn purge(&self, request: &PurgeRequest) -> Result<u64, StoreError> {
        let request = request.clone();
        self.run(move |conn, ctx| C::purge(conn, ctx, &request))
            .await
    }
}
