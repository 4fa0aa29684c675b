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

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use outbox_engine::{
    Claim, ClaimRequest, CompleteAction, CompleteReport, Completion, DeadHead, DeadLetter,
    DeadLetterFilter, DeadLetters, DestinationStats, Lease, LeaseToken, Message, MessageId,
    MessageOrder, NewMessage, Purge, PurgeRequest, Rejected, Stats, Store, StoreError, StoreStats,
    Wakeup,
};
use outbox_sql::postgres::{NOTIFY_CHANNEL, Statements};
use outbox_sql::{Dialect, TableNames};
use sqlx::Row;
use sqlx::postgres::{PgConnection, PgListener, PgPool, PgQueryResult, PgRow, Postgres};
use tracing::{debug, warn};
use uuid::Uuid;

use crate::PublishedRows;
use crate::common::{
    attempts, availability, count, headers_json, limit, millis, read_headers, undecodable,
};
use crate::error::classify;
use crate::inbox::{InboxDialect, SqlInbox};

/// A fixed advisory-lock key serialising migrations across processes.
const MIGRATION_LOCK: i64 = 0x6f75_7462_6f78_0001;

/// The outbox on PostgreSQL: enqueue in your transaction, and the relay's [`Store`].
///
/// Cheap to clone; clones share the pool and the rendered statements.
#[derive(Debug, Clone)]
pub struct PgOutbox {
    pool: PgPool,
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    names: TableNames,
    sql: Statements,
    published: PublishedRows,
    /// The NOTIFY payload: the qualified table name, so listeners of other tables ignore it.
    label: String,
}

impl PgOutbox {
    /// The outbox in table `outbox` (in the connection's `search_path`).
    pub fn new(pool: PgPool) -> Self {
        Self::with_names(pool, TableNames::default())
    }

    /// The outbox in the tables `names` gives.
    pub fn with_names(pool: PgPool, names: TableNames) -> Self {
        let label = names.render(Dialect::Postgres, "{outbox}");
        Self {
            pool,
            inner: Arc::new(Inner {
                sql: Statements::new(&names),
                names,
                published: PublishedRows::Keep,
                label,
            }),
        }
    }

    /// Keeps or deletes rows once published (default: keep, purge later).
    pub fn published_rows(self, mode: PublishedRows) -> Self {
        let inner = Inner {
            names: self.inner.names.clone(),
            sql: self.inner.sql.clone(),
            published: mode,
            label: self.inner.label.clone(),
        };
        Self {
            pool: self.pool,
            inner: Arc::new(inner),
        }
    }

    /// The pool the relay side uses.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The table names.
    pub fn names(&self) -> &TableNames {
        &self.inner.names
    }

    /// Creates the outbox table and its indexes if missing. Idempotent; concurrent callers
    /// serialise on an advisory lock.
    ///
    /// # Errors
    ///
    /// A [`StoreError`] if a statement fails (for example, no permission to create tables).
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let migrations = outbox_sql::outbox_migrations(Dialect::Postgres, &self.inner.names);
        run_migrations(&self.pool, &self.inner.sql, &migrations).await
    }

    /// Inserts `message` on `conn` — normally your open transaction (`&mut tx`). Never
    /// commits and uses no other connection.
    ///
    /// # Errors
    ///
    /// [`StoreError`] of kind `Constraint` if the id exists, or the database's error; the
    /// caller's transaction is then aborted, as with any failed statement.
    pub async fn enqueue(
        &self,
        conn: &mut PgConnection,
        message: &NewMessage,
    ) -> Result<(), StoreError> {
        let (at, delay_ms) = availability(message);
        sqlx::query(&self.inner.sql.insert)
            .bind(message.id().as_uuid())
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
            .execute(conn)
            .await
            .map_err(classify)?;
        Ok(())
    }

    /// Inserts `messages` with one statement on `conn`; see [`enqueue`](Self::enqueue).
    ///
    /// # Errors
    ///
    /// As [`enqueue`](Self::enqueue); no message is inserted if any fails.
    pub async fn enqueue_all(
        &self,
        conn: &mut PgConnection,
        messages: &[NewMessage],
    ) -> Result<u64, StoreError> {
        if messages.is_empty() {
            return Ok(0);
        }
        let mut cols = BatchColumns::default();
        for m in messages {
            let (at, delay_ms) = availability(m);
            cols.id.push(*m.id().as_uuid());
            cols.destination.push(m.destination().to_owned());
            cols.event_type.push(m.event_type().to_owned());
            cols.aggregate_type
                .push(m.aggregate_type().map(str::to_owned));
            cols.aggregate_id.push(m.aggregate_id().map(str::to_owned));
            cols.partition_key
                .push(m.partition_key().map(str::to_owned));
            cols.tenant_id.push(m.tenant_id().map(str::to_owned));
            cols.idempotency_key.push(m.idempotency_key().to_owned());
            cols.payload.push(m.payload().to_vec());
            cols.content_type.push(m.content_type().to_owned());
            cols.headers.push(headers_json(m.headers()));
            cols.at.push(at);
            cols.delay_ms.push(delay_ms);
        }
        let done = sqlx::query(&self.inner.sql.insert_batch)
            .bind(cols.id)
            .bind(cols.destination)
            .bind(cols.event_type)
            .bind(cols.aggregate_type)
            .bind(cols.aggregate_id)
            .bind(cols.partition_key)
            .bind(cols.tenant_id)
            .bind(cols.idempotency_key)
            .bind(cols.payload)
            .bind(cols.content_type)
            .bind(cols.headers)
            .bind(cols.at)
            .bind(cols.delay_ms)
            .execute(conn)
            .await
            .map_err(classify)?;
        Ok(done.rows_affected())
    }

    /// Sends a wakeup to relays listening in other processes. Call it **after** your
    /// transaction committed: a NOTIFY inside the transaction would serialise all
    /// committing transactions on the notification queue lock. For many writers, use a
    /// coalescing [`notifier`](Self::notifier) instead.
    ///
    /// # Errors
    ///
    /// The database's error; the outbox rows are committed anyway and the relay's poll
    /// will find them.
    pub async fn notify(&self) -> Result<(), StoreError> {
        sqlx::query(&self.inner.sql.notify)
            .bind(&self.inner.label)
            .execute(&self.pool)
            .await
            .map_err(classify)?;
        Ok(())
    }

    /// A coalescing notifier: [`PgNotifier::notify`] never blocks, and any number of calls
    /// while a NOTIFY is in flight cause one more NOTIFY. Needs a Tokio runtime; the
    /// background task stops when every clone of the notifier is dropped.
    pub fn notifier(&self) -> PgNotifier {
        let signal = Wakeup::new();
        let mut listener = signal.subscribe();
        let outbox = self.clone();
        let task = tokio::spawn(async move {
            loop {
                listener.wait().await;
                if let Err(error) = outbox.notify().await {
                    warn!(%error, "outbox NOTIFY failed; relays will find the rows on their next poll");
                }
            }
        });
        PgNotifier {
            signal,
            _task: Arc::new(AbortOnDrop(task)),
        }
    }

    /// Starts listening for NOTIFY wakeups on a dedicated connection (never inside a
    /// transaction) and returns a handle whose [`Wakeup`] you pass to the relay. The
    /// listener reconnects by itself after a connection loss and raises the wakeup once
    /// after each reconnect, since notifications sent meanwhile are lost.
    ///
    /// # Errors
    ///
    /// The first connection or `LISTEN` failed.
    pub async fn listen(&self) -> Result<PgWakeupListener, StoreError> {
        let mut listener = PgListener::connect_with(&self.pool)
            .await
            .map_err(classify)?;
        listener.listen(NOTIFY_CHANNEL).await.map_err(classify)?;
        let wakeup = Wakeup::new();
        let signal = wakeup.clone();
        let label = self.inner.label.clone();
        let task = tokio::spawn(async move {
            let mut backoff = Duration::from_millis(100);
            loop {
                match listener.try_recv().await {
                    Ok(Some(notification)) => {
                        backoff = Duration::from_millis(100);
                        if notification.payload() == label {
                            signal.notify();
                        }
                    }
                    Ok(None) => {
                        debug!("outbox listener connection lost; reconnecting");
                        signal.notify();
                    }
                    Err(error) => {
                        warn!(%error, "outbox listener failed; retrying");
                        signal.notify();
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(Duration::from_secs(10));
                    }
                }
            }
        });
        Ok(PgWakeupListener {
            wakeup,
            _task: AbortOnDrop(task),
        })
    }

    /// Reads a claimed or dead row; the error names the column that could not be read.
    /// With `strict_headers` off, headers that cannot be read are left empty (for listing
    /// the dead letters such rows became).
    fn message(row: &PgRow, strict_headers: bool) -> Result<Message, String> {
        fn get<'r, T: sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>>(
            row: &'r PgRow,
            column: &str,
        ) -> Result<T, String> {
            row.try_get(column).map_err(|e| undecodable(column, e))
        }
        let mut m = Message::from_parts(
            MessageId::from_uuid(get(row, "id")?),
            get(row, "destination")?,
            get(row, "event_type")?,
            get(row, "payload")?,
            get(row, "content_type")?,
            get(row, "idempotency_key")?,
            attempts(i64::from(get::<i32>(row, "attempts")?)),
            get(row, "created_at")?,
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
    ) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
        let ids: Option<Vec<Uuid>> =
            (!filter.ids.is_empty()).then(|| filter.ids.iter().map(|id| *id.as_uuid()).collect());
        let destinations = (!filter.destinations.is_empty()).then(|| filter.destinations.clone());
        let event_types = (!filter.event_types.is_empty()).then(|| filter.event_types.clone());
        sqlx::query(sql)
            .bind(ids)
            .bind(destinations)
            .bind(event_types)
            .bind(filter.created_after)
            .bind(filter.created_before)
            .bind(filter.error_contains.clone())
    }
}

#[derive(Default)]
struct BatchColumns {
    id: Vec<Uuid>,
    destination: Vec<String>,
    event_type: Vec<String>,
    aggregate_type: Vec<Option<String>>,
    aggregate_id: Vec<Option<String>>,
    partition_key: Vec<Option<String>>,
    tenant_id: Vec<Option<String>>,
    idempotency_key: Vec<String>,
    payload: Vec<Vec<u8>>,
    content_type: Vec<String>,
    headers: Vec<String>,
    at: Vec<Option<DateTime<Utc>>>,
    delay_ms: Vec<i64>,
}

async fn run_migrations(
    pool: &PgPool,
    sql: &Statements,
    migrations: &[outbox_sql::Migration],
) -> Result<(), StoreError> {
    let mut tx = pool.begin().await.map_err(classify)?;
    sqlx::query(&sql.migration_lock)
        .bind(MIGRATION_LOCK)
        .execute(&mut *tx)
        .await
        .map_err(classify)?;
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

fn ids_of(rows: &[PgRow]) -> Result<HashSet<Uuid>, StoreError> {
    rows.iter()
        .map(|r| r.try_get::<Uuid, _>(0).map_err(classify))
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

impl outbox_engine::Backend for PgOutbox {
    async fn migrate(&self) -> Result<(), StoreError> {
        PgOutbox::migrate(self).await
    }

    async fn listen(&self) -> Result<Option<outbox_engine::Listener>, StoreError> {
        let listener = PgOutbox::listen(self).await?;
        Ok(Some(outbox_engine::Listener::new(
            listener.wakeup(),
            listener,
        )))
    }

    async fn notify(&self) -> Result<(), StoreError> {
        PgOutbox::notify(self).await
    }
}

impl Store for PgOutbox {
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
            .bind(token.as_uuid())
            .bind(millis(request.lease));
        let query = match &request.destinations {
            None => query,
            Some(destinations) => query.bind(destinations),
        };
        let rows = query.fetch_all(&self.pool).await.map_err(classify)?;
        let mut claim = Claim::new(lease, Vec::with_capacity(rows.len()));
        let mut deaths = Vec::new();
        for row in &rows {
            match Self::message(row, true) {
                Ok(message) => claim.messages.push(message),
                Err(reason) => {
                    let id: Uuid = row.try_get("id").map_err(classify)?;
                    deaths.push(Completion::dead(MessageId::from_uuid(id), reason.clone()));
                    claim.rejected.push(Rejected {
                        id: id.to_string(),
                        destination: row.try_get("destination").ok(),
                        reason,
                    });
                }
            }
        }
        if !deaths.is_empty() {
            // Fenced by this claim's own token: the rows are ours until it completes them.
            self.complete(token, &deaths).await?;
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
        let mut applied = HashSet::new();
        let (deleted, updated): (Vec<&Completion>, Vec<&Completion>) =
            completions.iter().partition(|c| {
                self.inner.published == PublishedRows::Delete
                    && c.action == CompleteAction::Published
            });
        if !deleted.is_empty() {
            let ids: Vec<Uuid> = deleted.iter().map(|c| *c.id.as_uuid()).collect();
            let rows = sqlx::query(&sql.delete_published)
                .bind(token.as_uuid())
                .bind(ids)
                .fetch_all(&self.pool)
                .await
                .map_err(classify)?;
            applied.extend(ids_of(&rows)?);
        }
        if !updated.is_empty() {
            let mut ids = Vec::with_capacity(updated.len());
            let mut statuses = Vec::with_capacity(updated.len());
            let mut delays = Vec::with_capacity(updated.len());
            let mut errors = Vec::with_capacity(updated.len());
            for c in &updated {
                ids.push(*c.id.as_uuid());
                statuses.push(outbox_sql::completion_status(&c.action).to_owned());
                let (delay, error) = match &c.action {
                    CompleteAction::Published => (0, None),
                    CompleteAction::Retry { delay, error }
                    | CompleteAction::Defer { delay, error } => {
                        (millis(*delay), Some(error.clone()))
                    }
                    CompleteAction::Dead { reason } => (0, Some(reason.clone())),
                };
                delays.push(delay);
                errors.push(error);
            }
            let rows = sqlx::query(&sql.complete)
                .bind(token.as_uuid())
                .bind(ids)
                .bind(statuses)
                .bind(delays)
                .bind(errors)
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
        let uuids: Vec<Uuid> = ids.iter().map(|id| *id.as_uuid()).collect();
        let rows = sqlx::query(&self.inner.sql.release)
            .bind(token.as_uuid())
            .bind(uuids)
            .fetch_all(&self.pool)
            .await
            .map_err(classify)?;
        Ok(report(ids.iter().copied(), &ids_of(&rows)?))
    }
}

impl StoreStats for PgOutbox {
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
                d.oldest_pending_created_at = row.try_get("oldest").map_err(classify)?;
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

impl DeadLetters for PgOutbox {
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
                    dead_at: row.try_get("dead_at").map_err(classify)?,
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

impl Purge for PgOutbox {
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

/// Sends coalesced NOTIFYs from a background task; see [`PgOutbox::notifier`].
#[derive(Debug, Clone)]
pub struct PgNotifier {
    signal: Wakeup,
    _task: Arc<AbortOnDrop>,
}

impl PgNotifier {
    /// Asks for a NOTIFY soon; returns at once. Call after your transaction committed.
    pub fn notify(&self) {
        self.signal.notify();
    }
}

/// A running LISTEN connection; see [`PgOutbox::listen`]. Dropping it stops listening.
#[derive(Debug)]
pub struct PgWakeupListener {
    wakeup: Wakeup,
    _task: AbortOnDrop,
}

impl PgWakeupListener {
    /// The signal raised on each NOTIFY for this table; pass it to the relay builder.
    pub fn wakeup(&self) -> Wakeup {
        self.wakeup.clone()
    }
}

#[derive(Debug)]
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The receiver-side inbox on PostgreSQL: deduplicates deliveries inside the receiver's
/// own transaction.
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
pub type PgInbox = SqlInbox<Postgres>;

impl crate::inbox::sealed::Sealed for Postgres {}

impl InboxDialect for Postgres {
    fn inbox_statements(names: &TableNames) -> (String, String) {
        let sql = Statements::new(names);
        (sql.inbox_record, sql.inbox_purge)
    }

    async fn migrate_inbox(pool: &PgPool, names: &TableNames) -> Result<(), StoreError> {
        let migrations = outbox_sql::inbox_migrations(Dialect::Postgres, names);
        run_migrations(pool, &Statements::new(names), &migrations).await
    }

    fn rows_affected(result: &PgQueryResult) -> u64 {
        result.rows_affected()
    }
}
