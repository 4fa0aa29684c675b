//! The outbox on MySQL 8 or MariaDB ≥ 10.6 through diesel's [`MysqlConnection`]. The
//! statements are the sqlx store's (`outbox_sql::mysql`): relay work runs in short
//! `READ COMMITTED` transactions, a claim selects with `FOR UPDATE SKIP LOCKED` and
//! leases what it selected, and keyed rows are numbered at enqueue by a counter row held
//! until the writer's transaction ends.
//!
//! ```no_run
//! # fn demo(pool: diesel::r2d2::Pool<diesel::r2d2::ConnectionManager<diesel::MysqlConnection>>) -> Result<(), Box<dyn std::error::Error>> {
//! use diesel::{Connection, RunQueryDsl};
//! use outbox_diesel::mysql::MysqlOutbox;
//! use outbox_engine::NewMessage;
//!
//! let outbox = MysqlOutbox::new(pool.clone());
//! let mut conn = pool.get()?;
//! conn.transaction(|conn| {
//!     diesel::sql_query("UPDATE orders SET status = 'paid' WHERE id = 42").execute(conn)?;
//!     outbox.enqueue(conn, &NewMessage::builder("billing", "order.paid").json(&42).build()?)?;
//!     Ok::<_, Box<dyn std::error::Error>>(())
//! })?;
//! # Ok(())
//! # }
//! ```

use std::collections::HashSet;

use chrono::NaiveDateTime;
use diesel::QueryableByName;
use diesel::connection::SimpleConnection;
use diesel::mysql::{Mysql, MysqlConnection};
use diesel::sql_types::{BigInt, Binary, Datetime, Integer, Nullable, Text};
use outbox_engine::{
    Claim, ClaimRequest, CompleteAction, Completion, DeadHead, DeadLetter, DeadLetterFilter,
    DestinationStats, FoundMessage, Gauges, LeaseToken, Message, MessageId, MessageOrder,
    NewMessage, PublishedRows, PurgeRequest, Rejected, Status, StoreError, StoreErrorKind,
    WaitedSince,
};
use outbox_sql::mysql::{
    DeadFilterShape, ID_CHUNK, INSERT_CHUNK_BYTES, INSERT_CHUNK_ROWS, MAX_ERROR_BYTES,
    MAX_FILTER_VALUES, MAX_INTERVAL_MS, MAX_OWNER_CHARS, MIGRATION_LOCK, MIGRATION_LOCK_TIMEOUT_S,
    RELAY_ISOLATION, Statements, clip_bytes, clip_chars, db_time, interval_ms, padded,
};
use outbox_sql::values::{
    availability, count, headers_json, id_text, lease, limit, read_headers, stored_id, waited,
};
use outbox_sql::{Dialect, Migration, Shared, TableNames};

use crate::dialect::{Context, DeadChange, DieselDialect, Query, execute, load, sealed};
use crate::error::classify;
use crate::migrate::in_transaction;
use crate::{DieselInbox, DieselOutbox, keyed, migrate, rows};

/// The outbox on MySQL / MariaDB; see [`DieselOutbox`].
pub type MysqlOutbox = DieselOutbox<MysqlConnection>;

/// The receiver-side inbox on MySQL / MariaDB; see [`DieselInbox`].
pub type MysqlInbox = DieselInbox<MysqlConnection>;

/// Gives each pooled session a 30 s `wait_timeout`. A claim is a transaction: when its
/// connection falls silent between the `SELECT … FOR UPDATE` and the commit, the server
/// ends the transaction, and frees the rows every other relay skips, after 30 s instead
/// of its default 8 hours. r2d2 tests a connection before handing it out, so one the
/// server closed while idle is replaced.
#[derive(Debug)]
struct Session;

impl diesel::r2d2::CustomizeConnection<MysqlConnection, diesel::r2d2::Error> for Session {
    fn on_acquire(&self, conn: &mut MysqlConnection) -> Result<(), diesel::r2d2::Error> {
        conn.batch_execute("SET SESSION wait_timeout = 30")
            .map_err(diesel::r2d2::Error::QueryError)
    }
}

#[derive(QueryableByName)]
struct MessageRow {
    #[diesel(sql_type = Text)]
    id: String,
    #[diesel(sql_type = Text)]
    destination: String,
    #[diesel(sql_type = Text)]
    event_type: String,
    #[diesel(sql_type = Nullable<Text>)]
    aggregate_type: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    aggregate_id: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    partition_key: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    tenant_id: Option<String>,
    #[diesel(sql_type = Text)]
    idempotency_key: String,
    #[diesel(sql_type = Binary)]
    payload: Vec<u8>,
    #[diesel(sql_type = Text)]
    content_type: String,
    #[diesel(sql_type = Text)]
    headers: String,
    #[diesel(sql_type = Integer)]
    attempts: i32,
    #[diesel(sql_type = Datetime)]
    created_at: NaiveDateTime,
}

impl MessageRow {
    /// The message; ids are read only in the form the library writes, because
    /// completions find rows by comparing that text.
    fn message(self, strict: bool) -> Result<Message, String> {
        let mut m = Message::from_parts(
            stored_id(&self.id)?,
            self.destination,
            self.event_type,
            self.payload,
            self.content_type,
            self.idempotency_key,
            outbox_sql::values::attempts(i64::from(self.attempts)),
            self.created_at.and_utc(),
        );
        m.aggregate_type = self.aggregate_type;
        m.aggregate_id = self.aggregate_id;
        m.partition_key = self.partition_key;
        m.tenant_id = self.tenant_id;
        read_headers(&mut m, &self.headers, strict)?;
        Ok(m)
    }
}

/// A row the claim selected, with its wait by the server's clock.
#[derive(QueryableByName)]
struct Claimed {
    #[diesel(embed)]
    fields: MessageRow,
    #[diesel(sql_type = BigInt)]
    waited_ms: i64,
}

#[derive(QueryableByName)]
struct DeadRow {
    #[diesel(embed)]
    fields: MessageRow,
    #[diesel(sql_type = Nullable<Text>)]
    last_error: Option<String>,
    #[diesel(sql_type = Datetime)]
    dead_at: NaiveDateTime,
}

#[derive(QueryableByName)]
struct FoundRow {
    #[diesel(embed)]
    fields: MessageRow,
    #[diesel(sql_type = Text)]
    status: String,
    #[diesel(sql_type = Nullable<Text>)]
    last_error: Option<String>,
    #[diesel(sql_type = Nullable<Datetime>)]
    published_at: Option<NaiveDateTime>,
    #[diesel(sql_type = Nullable<Datetime>)]
    dead_at: Option<NaiveDateTime>,
}

#[derive(QueryableByName)]
struct Id {
    #[diesel(sql_type = Text)]
    id: String,
}

#[derive(QueryableByName)]
struct Locked {
    #[diesel(sql_type = Nullable<BigInt>)]
    locked: Option<i64>,
}

#[derive(QueryableByName)]
pub(crate) struct LastSeq {
    #[diesel(sql_type = BigInt)]
    last_seq: i64,
}

#[derive(QueryableByName)]
struct StatsRow {
    #[diesel(sql_type = Text)]
    destination: String,
    #[diesel(sql_type = BigInt)]
    pending: i64,
    #[diesel(sql_type = BigInt)]
    leased: i64,
    #[diesel(sql_type = BigInt)]
    dead: i64,
    #[diesel(sql_type = BigInt)]
    published: i64,
    #[diesel(sql_type = Nullable<Datetime>)]
    oldest: Option<NaiveDateTime>,
}

/// `query` with `ids` bound, padded to `n` with the last id.
fn bind_ids(mut query: Query<Mysql>, ids: &[MessageId], n: usize) -> Query<Mysql> {
    let last = ids.last().map(ToString::to_string).unwrap_or_default();
    for id in ids {
        query = query.bind::<Text, _>(id.to_string());
    }
    for _ in ids.len()..n {
        query = query.bind::<Text, _>(last.clone());
    }
    query
}

fn ids_of(
    conn: &mut MysqlConnection,
    query: Query<Mysql>,
) -> Result<HashSet<MessageId>, StoreError> {
    let rows: Vec<Id> = load(conn, query)?;
    Ok(rows
        .into_iter()
        .filter_map(|r| stored_id(&r.id).ok())
        .collect())
}

/// Runs `work` in a relay transaction at `READ COMMITTED` (see `outbox_sql::mysql`).
fn relay_transaction<T>(
    conn: &mut MysqlConnection,
    work: impl FnOnce(&mut MysqlConnection) -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    conn.batch_execute(RELAY_ISOLATION).map_err(classify)?;
    in_transaction(conn, work)
}

/// The ids in order, each once.
fn unique(ids: impl Iterator<Item = MessageId>) -> Vec<MessageId> {
    let mut seen = HashSet::new();
    ids.filter(|id| seen.insert(*id)).collect()
}

/// The ids of `ids` still leased with `token`, locked until the transaction ends.
fn lock_leased(
    conn: &mut MysqlConnection,
    sql: &Statements,
    token: &str,
    ids: &[MessageId],
) -> Result<HashSet<MessageId>, StoreError> {
    let mut held = HashSet::with_capacity(ids.len());
    for chunk in ids.chunks(ID_CHUNK) {
        let n = padded(chunk.len());
        let query = bind_ids(MysqlConnection::query(&sql.lock_leased(n)), chunk, n)
            .bind::<Text, _>(token.to_owned());
        held.extend(ids_of(conn, query)?);
    }
    Ok(held)
}

/// Runs a list statement (`ids…, token`) over `ids` in padded chunks.
fn for_ids(
    conn: &mut MysqlConnection,
    sql: &Statements,
    build: fn(&Statements, usize) -> String,
    ids: &[MessageId],
    token: &str,
) -> Result<u64, StoreError> {
    let mut changed = 0;
    for chunk in ids.chunks(ID_CHUNK) {
        let n = padded(chunk.len());
        changed += execute(
            conn,
            bind_ids(MysqlConnection::query(&build(sql, n)), chunk, n)
                .bind::<Text, _>(token.to_owned()),
        )?;
    }
    Ok(changed)
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
        after_id: filter.after_id.is_some(),
    })
}

fn dead_query(sql: String, filter: &DeadLetterFilter) -> Query<Mysql> {
    let mut query = MysqlConnection::query(&sql);
    for id in &filter.ids {
        query = query.bind::<Text, _>(id.to_string());
    }
    for d in &filter.destinations {
        query = query.bind::<Text, _>(d.clone());
    }
    for e in &filter.event_types {
        query = query.bind::<Text, _>(e.clone());
    }
    if let Some(after) = filter.created_after {
        query = query.bind::<Datetime, _>(db_time(after));
    }
    if let Some(before) = filter.created_before {
        query = query.bind::<Datetime, _>(db_time(before));
    }
    if let Some(error) = &filter.error_contains {
        query = query.bind::<Text, _>(error.clone());
    }
    if let Some(id) = filter.after_id {
        query = query.bind::<Text, _>(id.to_string());
    }
    query
}

/// One message's fourteen insert values.
fn bind_message(query: Query<Mysql>, m: &NewMessage, seq: Option<i64>) -> Query<Mysql> {
    let (at, delay_ms) = availability(m);
    let text = |s: Option<&str>| s.map(str::to_owned);
    query
        .bind::<Text, _>(m.id().to_string())
        .bind::<Text, _>(m.destination().to_owned())
        .bind::<Text, _>(m.event_type().to_owned())
        .bind::<Nullable<Text>, _>(text(m.aggregate_type()))
        .bind::<Nullable<Text>, _>(text(m.aggregate_id()))
        .bind::<Nullable<Text>, _>(text(m.partition_key()))
        .bind::<Nullable<Text>, _>(text(m.tenant_id()))
        .bind::<Text, _>(m.idempotency_key().to_owned())
        .bind::<Binary, _>(m.payload().to_vec())
        .bind::<Text, _>(m.content_type().to_owned())
        .bind::<Text, _>(headers_json(m.headers()))
        .bind::<Nullable<Datetime>, _>(at.map(db_time))
        .bind::<BigInt, _>(delay_ms.min(MAX_INTERVAL_MS))
        .bind::<Nullable<BigInt>, _>(seq)
}

impl sealed::Sealed for MysqlConnection {}

/// Bumps the counter of `key` by `n` (`LAST_INSERT_ID(expr)`).
pub(crate) fn next_seq_query(ctx: &Context<MysqlConnection>, key: &str, n: usize) -> Query<Mysql> {
    MysqlConnection::query(&ctx.sql.next_seq)
        .bind::<Text, _>(key.to_owned())
        .bind::<BigInt, _>(limit(n))
        .bind::<BigInt, _>(limit(n))
}

/// Reads the number the counter bump left in the session.
pub(crate) fn last_seq_query() -> Query<Mysql> {
    MysqlConnection::query("SELECT CAST(LAST_INSERT_ID() AS SIGNED) AS last_seq")
}

/// The last of `n` new numbers of `key`, checked.
pub(crate) fn checked_last_seq(rows: &[LastSeq], key: &str, n: usize) -> Result<i64, StoreError> {
    match rows.first().map(|r| r.last_seq) {
        Some(last) if last >= limit(n) => Ok(last),
        other => Err(StoreError::new(
            StoreErrorKind::Other,
            format!("numbering partition key {key:?} returned {other:?}, expected at least {n}"),
        )),
    }
}

/// Inserts one message with its number.
pub(crate) fn insert_query(
    ctx: &Context<MysqlConnection>,
    m: &NewMessage,
    seq: Option<i64>,
) -> Query<Mysql> {
    bind_message(MysqlConnection::query(&ctx.sql.insert), m, seq)
}

impl keyed::Keyed for MysqlConnection {
    /// Bumps the counter, then reads the number back on the same session.
    fn next_seq(&mut self, ctx: &Context<Self>, key: &str, n: usize) -> Result<i64, StoreError> {
        execute(self, next_seq_query(ctx, key, n))?;
        let rows: Vec<LastSeq> = load(self, last_seq_query())?;
        checked_last_seq(&rows, key, n)
    }

    fn insert_one(
        &mut self,
        ctx: &Context<Self>,
        m: &NewMessage,
        seq: Option<i64>,
    ) -> Result<(), StoreError> {
        execute(self, insert_query(ctx, m, seq)).map(|_| ())
    }
}

impl DieselDialect for MysqlConnection {
    type Statements = Statements;
    const DIALECT: Dialect = Dialect::MySql;

    fn statements(names: &TableNames, _: PublishedRows) -> Statements {
        Statements::new(names)
    }

    fn connection_setup()
    -> Option<Box<dyn diesel::r2d2::CustomizeConnection<Self, diesel::r2d2::Error>>> {
        Some(Box::new(Session))
    }

    fn shared(sql: &Statements) -> &Shared {
        &sql.shared
    }

    fn run(&mut self, query: Query<Mysql>) -> Result<u64, StoreError> {
        execute(self, query)
    }

    fn age_ms(age: std::time::Duration) -> i64 {
        interval_ms(age)
    }

    /// Under the named lock the sqlx store takes too; the checks prove an existing table
    /// of that name is ours.
    fn migrate(
        &mut self,
        sql: &Statements,
        migrations: &[Migration],
        inbox: bool,
    ) -> Result<(), StoreError> {
        let lock = Self::query(&sql.migration_lock)
            .bind::<Text, _>(MIGRATION_LOCK.to_owned())
            .bind::<BigInt, _>(MIGRATION_LOCK_TIMEOUT_S);
        let locked: Vec<Locked> = load(self, lock)?;
        if locked.first().and_then(|l| l.locked) != Some(1) {
            return Err(StoreError::new(
                StoreErrorKind::Timeout,
                format!(
                    "another migration held the lock {MIGRATION_LOCK:?} for {MIGRATION_LOCK_TIMEOUT_S} s"
                ),
            ));
        }
        let checks = if inbox {
            vec![sql.check_inbox.as_str()]
        } else {
            vec![sql.check_outbox.as_str(), sql.check_keys.as_str()]
        };
        let result = migrate::apply(self, &sql.shared, migrations, &checks);
        let unlocked: Result<Vec<Locked>, _> = load(
            self,
            Self::query(&format!("{} AS locked", sql.migration_unlock))
                .bind::<Text, _>(MIGRATION_LOCK.to_owned()),
        );
        result?;
        unlocked.map(|_| ())
    }

    /// Numbers keyed messages, then one multi-row `INSERT` per chunk.
    fn insert(&mut self, ctx: &Context<Self>, messages: &[NewMessage]) -> Result<u64, StoreError> {
        if messages.len() < 2 {
            return keyed::insert(self, ctx, messages);
        }
        in_transaction(self, |conn| {
            let seqs = keyed::numbers(conn, ctx, messages)?;
            let mut inserted = 0;
            let (mut rest, mut rest_seqs) = (messages, seqs.as_slice());
            while !rest.is_empty() {
                let (mut rows, mut bytes) = (0, 0);
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
                let mut query = Self::query(&ctx.sql.insert_batch(chunk.len())).uncached();
                for (m, seq) in chunk.iter().zip(chunk_seqs) {
                    query = bind_message(query, m, *seq);
                }
                inserted += execute(conn, query)?;
                (rest, rest_seqs) = (tail, tail_seqs);
            }
            Ok(inserted)
        })
    }

    fn claim(&mut self, ctx: &Context<Self>, request: &ClaimRequest) -> Result<Claim, StoreError> {
        let lease_ms = interval_ms(request.lease);
        let (token, lease) = lease(request, lease_ms);
        let destinations = request.destinations.as_deref().unwrap_or_default();
        if request.batch_size == 0 || request.destinations.as_ref().is_some_and(Vec::is_empty) {
            return Ok(Claim::new(lease, Vec::new()));
        }
        let sql = &ctx.sql;
        let halt = match request.ordering {
            MessageOrder::PerKey(policy) => Some(policy == DeadHead::Halt),
            _ => None,
        };
        let select = match halt {
            Some(halt) => sql.claim_select_ordered(destinations.len(), halt),
            None => sql.claim_select(destinations.len()),
        };
        relay_transaction(self, |conn| {
            let mut query = Self::query(&select);
            for d in destinations {
                query = query.bind::<Text, _>(d.clone());
            }
            let rows: Vec<Claimed> =
                load(conn, query.bind::<BigInt, _>(limit(request.batch_size)))?;
            let mut messages = Vec::with_capacity(rows.len());
            let mut rejected = Vec::new();
            for Claimed {
                fields: row,
                waited_ms,
            } in rows
            {
                let (raw_id, destination) = (row.id.clone(), row.destination.clone());
                match row.message(true) {
                    Ok(mut m) => {
                        m.waited = Some(waited(waited_ms, WaitedSince::Insert));
                        messages.push(m);
                    }
                    Err(reason) => {
                        // The row is locked by this transaction: dead-letter it in place.
                        let reject = Self::query(&sql.reject)
                            .bind::<Text, _>(clip_bytes(&reason, MAX_ERROR_BYTES).to_owned())
                            .bind::<Text, _>(raw_id.clone());
                        execute(conn, reject)?;
                        rejected.push(Rejected {
                            id: raw_id,
                            destination: Some(destination),
                            reason,
                        });
                    }
                }
            }
            if let Some(halt) = halt {
                // A fresh read of the candidates' keys: the claim's own check can miss a
                // predecessor committed during its scan (see `outbox_sql::mysql`).
                let keyed: Vec<MessageId> = messages
                    .iter()
                    .filter(|m| m.partition_key.is_some())
                    .map(|m| m.id)
                    .collect();
                let mut heads = HashSet::with_capacity(keyed.len());
                for chunk in keyed.chunks(ID_CHUNK) {
                    let n = padded(chunk.len());
                    heads.extend(ids_of(
                        conn,
                        bind_ids(Self::query(&sql.heads(n, halt)), chunk, n),
                    )?);
                }
                messages.retain(|m| m.partition_key.is_none() || heads.contains(&m.id));
            }
            let ids: Vec<MessageId> = messages.iter().map(|m| m.id).collect();
            let owner = clip_chars(&request.owner, MAX_OWNER_CHARS).to_owned();
            let token_text = token.as_uuid().to_string();
            for chunk in ids.chunks(ID_CHUNK) {
                let n = padded(chunk.len());
                let query = Self::query(&sql.claim_lease(n))
                    .bind::<Text, _>(owner.clone())
                    .bind::<Text, _>(token_text.clone())
                    .bind::<BigInt, _>(lease_ms)
                    .bind::<BigInt, _>(lease_ms);
                let leased = execute(conn, bind_ids(query, chunk, n))?;
                if leased != chunk.len() as u64 {
                    // Cannot happen while the rows are locked; refuse rather than hand out
                    // rows that are not leased.
                    return Err(StoreError::new(
                        StoreErrorKind::Other,
                        format!("leased {leased} of {} locked rows", chunk.len()),
                    ));
                }
            }
            for m in &mut messages {
                m.attempts = m.attempts.saturating_add(1);
            }
            Ok(Claim {
                lease,
                messages,
                rejected,
            })
        })
    }

    fn complete(
        &mut self,
        ctx: &Context<Self>,
        token: LeaseToken,
        completions: &[Completion],
    ) -> Result<HashSet<MessageId>, StoreError> {
        let ids = unique(completions.iter().map(|c| c.id));
        let token_text = token.as_uuid().to_string();
        let sql = &ctx.sql;
        relay_transaction(self, |conn| {
            let held = lock_leased(conn, sql, &token_text, &ids)?;
            let mut published = Vec::new();
            let mut done = HashSet::new();
            for c in completions {
                if !held.contains(&c.id) || !done.insert(c.id) {
                    continue;
                }
                let (statement, delay, error) = match &c.action {
                    CompleteAction::Published => {
                        published.push(c.id);
                        continue;
                    }
                    CompleteAction::Retry { delay, error } => (&sql.retry, Some(*delay), error),
                    CompleteAction::Defer { delay, error } => (&sql.defer, Some(*delay), error),
                    CompleteAction::Dead { reason } => (&sql.dead, None, reason),
                };
                let mut query = Self::query(statement);
                if let Some(delay) = delay {
                    query = query.bind::<BigInt, _>(interval_ms(delay));
                }
                let query = query
                    .bind::<Text, _>(clip_bytes(error, MAX_ERROR_BYTES).to_owned())
                    .bind::<Text, _>(c.id.to_string())
                    .bind::<Text, _>(token_text.clone());
                execute(conn, query)?;
            }
            if !published.is_empty() {
                let build = match ctx.published {
                    // No slots on MySQL: `migrate` refuses `Rotate`.
                    PublishedRows::Keep | PublishedRows::Rotate => Statements::publish,
                    PublishedRows::Delete => Statements::delete_published,
                };
                for_ids(conn, sql, build, &published, &token_text)?;
            }
            Ok(held)
        })
    }

    fn release(
        &mut self,
        ctx: &Context<Self>,
        token: LeaseToken,
        ids: &[MessageId],
    ) -> Result<HashSet<MessageId>, StoreError> {
        let unique_ids = unique(ids.iter().copied());
        let token_text = token.as_uuid().to_string();
        relay_transaction(self, |conn| {
            let held = lock_leased(conn, &ctx.sql, &token_text, &unique_ids)?;
            let held_ids: Vec<MessageId> = unique_ids
                .iter()
                .copied()
                .filter(|id| held.contains(id))
                .collect();
            if !held_ids.is_empty() {
                for_ids(conn, &ctx.sql, Statements::release, &held_ids, &token_text)?;
            }
            Ok(held)
        })
    }

    fn stats(&mut self, ctx: &Context<Self>) -> Result<Vec<DestinationStats>, StoreError> {
        let rows: Vec<StatsRow> = load(self, Self::query(&ctx.sql.shared.stats))?;
        Ok(rows
            .into_iter()
            .map(|r| {
                let mut d = DestinationStats::new(r.destination);
                d.pending = count(r.pending);
                d.leased = count(r.leased);
                d.dead = count(r.dead);
                d.published = count(r.published);
                d.oldest_pending_created_at = r.oldest.map(|t| t.and_utc());
                d
            })
            .collect())
    }

    fn halted(&mut self, ctx: &Context<Self>) -> Result<Vec<(String, u64)>, StoreError> {
        rows::halted(self, &ctx.sql.shared)
    }

    fn gauges(&mut self, ctx: &Context<Self>, bound: usize) -> Result<Gauges, StoreError> {
        rows::gauges(self, &ctx.sql.shared, bound)
    }

    fn list_dead(
        &mut self,
        ctx: &Context<Self>,
        filter: &DeadLetterFilter,
        n: i64,
    ) -> Result<Vec<DeadLetter>, StoreError> {
        let sql = ctx.sql.list_dead(dead_shape(filter)?);
        let rows: Vec<DeadRow> = load(self, dead_query(sql, filter).bind::<BigInt, _>(n))?;
        Ok(rows
            .into_iter()
            .filter_map(|r| {
                let message = r
                    .fields
                    .message(false)
                    .map_err(|reason| tracing::warn!(%reason, "a dead letter cannot be listed"))
                    .ok()?;
                Some(DeadLetter {
                    message,
                    reason: r.last_error.unwrap_or_default(),
                    dead_at: r.dead_at.and_utc(),
                })
            })
            .collect())
    }

    fn count_dead(
        &mut self,
        ctx: &Context<Self>,
        filter: &DeadLetterFilter,
    ) -> Result<u64, StoreError> {
        let sql = ctx.sql.count_dead(dead_shape(filter)?);
        rows::dead_count(self, dead_query(sql, filter))
    }

    fn change_dead(
        &mut self,
        ctx: &Context<Self>,
        change: DeadChange,
        filter: &DeadLetterFilter,
    ) -> Result<u64, StoreError> {
        let shape = dead_shape(filter)?;
        let sql = match change {
            DeadChange::Replay => ctx.sql.replay_dead(shape),
            DeadChange::Discard => ctx.sql.discard_dead(shape),
        };
        relay_transaction(self, |conn| execute(conn, dead_query(sql, filter)))
    }

    fn find(
        &mut self,
        ctx: &Context<Self>,
        key: &str,
        n: i64,
    ) -> Result<Vec<FoundMessage>, StoreError> {
        let query = Self::query(&ctx.sql.find())
            .bind::<Text, _>(id_text(key))
            .bind::<Text, _>(key.to_owned())
            .bind::<BigInt, _>(n);
        let rows: Vec<FoundRow> = load(self, query)?;
        Ok(rows
            .into_iter()
            .filter_map(|r| {
                let status = Status::parse(&r.status)?;
                let mut found = FoundMessage::new(r.fields.message(false).ok()?, status);
                found.last_error = r.last_error;
                found.published_at = r.published_at.map(|t| t.and_utc());
                found.dead_at = r.dead_at.map(|t| t.and_utc());
                Some(found)
            })
            .collect())
    }

    /// Published rows first, then dead letters, at most `batch_size` in all, in one
    /// transaction; then the counters of idle keys.
    fn purge(&mut self, ctx: &Context<Self>, request: &PurgeRequest) -> Result<u64, StoreError> {
        let batch = limit(request.batch_size);
        let sql = &ctx.sql;
        let rows = relay_transaction(self, |conn| {
            let mut deleted = execute(
                conn,
                Self::query(&sql.purge_published)
                    .bind::<BigInt, _>(interval_ms(request.published_older_than))
                    .bind::<BigInt, _>(batch),
            )?;
            if let Some(dead_age) = request.dead_older_than {
                let left = batch.saturating_sub(i64::try_from(deleted).unwrap_or(i64::MAX));
                if left > 0 {
                    deleted += execute(
                        conn,
                        Self::query(&sql.purge_dead)
                            .bind::<BigInt, _>(interval_ms(dead_age))
                            .bind::<BigInt, _>(left),
                    )?;
                }
            }
            Ok(deleted)
        })?;
        Ok(rows + rows::forget_idle_keys(self, &sql.shared, request.batch_size)?)
    }
}
