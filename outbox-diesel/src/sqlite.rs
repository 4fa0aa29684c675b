//! The outbox on SQLite through diesel's [`SqliteConnection`]: the embedded outbox, no
//! server needed. The statements are the sqlx store's: times are unix milliseconds,
//! ids are lowercase UUID text, and each relay operation is one atomic statement.
//!
//! Open the database in WAL mode with a busy timeout on every pooled connection
//! ([`Pragmas`] does both), and open business transactions that read before they write
//! with `conn.immediate_transaction(|conn| …)`, which takes SQLite's write lock up front.
//!
//! ```no_run
//! # fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use diesel::r2d2::{ConnectionManager, Pool};
//! use diesel::{RunQueryDsl, SqliteConnection};
//! use outbox_diesel::sqlite::{Pragmas, SqliteOutbox};
//! use outbox_engine::NewMessage;
//!
//! let pool = Pool::builder()
//!     .connection_customizer(Box::new(Pragmas::default()))
//!     .build(ConnectionManager::<SqliteConnection>::new("app.db"))?;
//! let outbox = SqliteOutbox::new(pool.clone());
//! let mut conn = pool.get()?;
//! conn.immediate_transaction(|conn| {
//!     diesel::sql_query("UPDATE orders SET status = 'paid' WHERE id = 42").execute(conn)?;
//!     outbox.enqueue(conn, &NewMessage::builder("billing", "order.paid").json(&42).build()?)?;
//!     Ok::<_, Box<dyn std::error::Error>>(())
//! })?;
//! # Ok(())
//! # }
//! ```

use std::collections::HashSet;
use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::QueryableByName;
use diesel::connection::SimpleConnection;
use diesel::r2d2::CustomizeConnection;
use diesel::sql_types::{BigInt, Binary, Nullable, Text};
use diesel::sqlite::{Sqlite, SqliteConnection};
use outbox_engine::{
    Availability, Claim, ClaimRequest, Completion, DeadLetter, DeadLetterFilter, DestinationStats,
    FoundMessage, Gauges, LeaseToken, Message, MessageId, NewMessage, PurgeRequest, Rejected,
    Status, StoreError, WaitedSince,
};
use outbox_sql::sqlite::Statements;
use outbox_sql::values::{
    completion_parts, count, headers_json, id_text, lease, limit, millis, read_headers,
    split_deleted, stored_id, undecodable, waited,
};
use outbox_sql::{Dialect, Migration, Shared, TableNames};

use crate::dialect::{Context, DeadChange, DieselDialect, Query, execute, load, sealed};
use crate::{DieselInbox, DieselOutbox, keyed, migrate, rows};

/// The outbox on SQLite; see [`DieselOutbox`].
pub type SqliteOutbox = DieselOutbox<SqliteConnection>;

/// The receiver-side inbox on SQLite; see [`DieselInbox`].
pub type SqliteInbox = DieselInbox<SqliteConnection>;

/// Sets the pragmas a pooled SQLite connection needs: WAL (readers run while one
/// connection writes) and a busy timeout (a writer waits for the write lock instead of
/// failing at once). Give it to the r2d2 pool with `connection_customizer`.
#[derive(Debug, Clone, Copy)]
pub struct Pragmas {
    /// How long a statement waits for SQLite's write lock. Default 5 s.
    pub busy_timeout: Duration,
}

impl Default for Pragmas {
    fn default() -> Self {
        Self {
            busy_timeout: Duration::from_secs(5),
        }
    }
}

impl CustomizeConnection<SqliteConnection, diesel::r2d2::Error> for Pragmas {
    fn on_acquire(&self, conn: &mut SqliteConnection) -> Result<(), diesel::r2d2::Error> {
        conn.batch_execute(&format!(
            "PRAGMA busy_timeout = {}; PRAGMA journal_mode = WAL;",
            self.busy_timeout.as_millis()
        ))
        .map_err(diesel::r2d2::Error::QueryError)
    }
}

/// Every column read as bytes: SQLite stores whatever a writer gave it, and a value
/// that is not what the table means (a writer in another language, say) must
/// dead-letter its row, not fail the whole read.
#[derive(QueryableByName)]
struct MessageRow {
    #[diesel(sql_type = Nullable<Binary>)]
    id: Option<Vec<u8>>,
    #[diesel(sql_type = Nullable<Binary>)]
    destination: Option<Vec<u8>>,
    #[diesel(sql_type = Nullable<Binary>)]
    event_type: Option<Vec<u8>>,
    #[diesel(sql_type = Nullable<Binary>)]
    aggregate_type: Option<Vec<u8>>,
    #[diesel(sql_type = Nullable<Binary>)]
    aggregate_id: Option<Vec<u8>>,
    #[diesel(sql_type = Nullable<Binary>)]
    partition_key: Option<Vec<u8>>,
    #[diesel(sql_type = Nullable<Binary>)]
    tenant_id: Option<Vec<u8>>,
    #[diesel(sql_type = Nullable<Binary>)]
    idempotency_key: Option<Vec<u8>>,
    #[diesel(sql_type = Nullable<Binary>)]
    payload: Option<Vec<u8>>,
    #[diesel(sql_type = Nullable<Binary>)]
    content_type: Option<Vec<u8>>,
    #[diesel(sql_type = Nullable<Binary>)]
    headers: Option<Vec<u8>>,
    #[diesel(sql_type = Nullable<Binary>)]
    attempts: Option<Vec<u8>>,
    #[diesel(sql_type = Nullable<Binary>)]
    created_at: Option<Vec<u8>>,
}

/// A column's text, if any.
fn optional(column: &str, value: Option<Vec<u8>>) -> Result<Option<String>, String> {
    value
        .map(|bytes| String::from_utf8(bytes).map_err(|_| undecodable(column, "is not UTF-8 text")))
        .transpose()
}

fn text(column: &str, value: Option<Vec<u8>>) -> Result<String, String> {
    optional(column, value)?.ok_or_else(|| undecodable(column, "is NULL"))
}

fn integer(column: &str, value: Option<Vec<u8>>) -> Result<Option<i64>, String> {
    optional(column, value)?
        .map(|text| {
            text.parse::<i64>()
                .map_err(|_| undecodable(column, format!("{text:?} is not an integer")))
        })
        .transpose()
}

/// Times are unix milliseconds.
fn time(column: &str, ms: Option<i64>) -> Result<Option<DateTime<Utc>>, String> {
    ms.map(|ms| {
        DateTime::from_timestamp_millis(ms)
            .ok_or_else(|| undecodable(column, format!("{ms} is not unix milliseconds in range")))
    })
    .transpose()
}

impl MessageRow {
    /// The id as text, whatever it is, for reports.
    fn raw_id(&self) -> String {
        self.id.as_deref().map_or_else(
            || "<no id>".to_owned(),
            |bytes| String::from_utf8_lossy(bytes).into_owned(),
        )
    }

    fn message(self, strict: bool) -> Result<Message, String> {
        let id = stored_id(&text("id", self.id)?)?;
        let created_at = time("created_at", integer("created_at", self.created_at)?)?
            .ok_or_else(|| undecodable("created_at", "is NULL"))?;
        let attempts = integer("attempts", self.attempts)?.unwrap_or(0);
        let mut m = Message::from_parts(
            id,
            text("destination", self.destination)?,
            text("event_type", self.event_type)?,
            self.payload
                .ok_or_else(|| undecodable("payload", "is NULL"))?,
            text("content_type", self.content_type)?,
            text("idempotency_key", self.idempotency_key)?,
            outbox_sql::values::attempts(attempts),
            created_at,
        );
        m.aggregate_type = optional("aggregate_type", self.aggregate_type)?;
        m.aggregate_id = optional("aggregate_id", self.aggregate_id)?;
        m.partition_key = optional("partition_key", self.partition_key)?;
        m.tenant_id = optional("tenant_id", self.tenant_id)?;
        read_headers(&mut m, &text("headers", self.headers)?, strict)?;
        Ok(m)
    }
}

#[derive(QueryableByName)]
struct Claimed {
    #[diesel(embed)]
    fields: MessageRow,
    #[diesel(sql_type = BigInt)]
    rowid: i64,
    #[diesel(sql_type = BigInt)]
    waited_ms: i64,
}

#[derive(QueryableByName)]
struct DeadRow {
    #[diesel(embed)]
    fields: MessageRow,
    #[diesel(sql_type = Nullable<Binary>)]
    last_error: Option<Vec<u8>>,
    #[diesel(sql_type = Nullable<Binary>)]
    dead_at: Option<Vec<u8>>,
}

#[derive(QueryableByName)]
struct FoundRow {
    #[diesel(embed)]
    fields: MessageRow,
    #[diesel(sql_type = Nullable<Binary>)]
    status: Option<Vec<u8>>,
    #[diesel(sql_type = Nullable<Binary>)]
    last_error: Option<Vec<u8>>,
    #[diesel(sql_type = Nullable<Binary>)]
    published_at: Option<Vec<u8>>,
    #[diesel(sql_type = Nullable<Binary>)]
    dead_at: Option<Vec<u8>>,
}

#[derive(QueryableByName)]
struct Id {
    #[diesel(sql_type = Text)]
    id: String,
}

#[derive(QueryableByName)]
struct LastSeq {
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
    #[diesel(sql_type = Nullable<BigInt>)]
    oldest: Option<i64>,
}

/// A JSON array of strings, as the statements read it with `json_each`.
fn json_list<S: AsRef<str>>(items: impl IntoIterator<Item = S>) -> String {
    serde_json::Value::Array(
        items
            .into_iter()
            .map(|s| serde_json::Value::String(s.as_ref().to_owned()))
            .collect(),
    )
    .to_string()
}

/// `t` in unix milliseconds, rounded up (stored times are whole milliseconds).
fn ceil_ms(t: DateTime<Utc>) -> i64 {
    let floor = t.timestamp_millis();
    if t.timestamp_subsec_nanos().is_multiple_of(1_000_000) {
        floor
    } else {
        floor.saturating_add(1)
    }
}

fn returned(
    conn: &mut SqliteConnection,
    query: Query<Sqlite>,
) -> Result<HashSet<MessageId>, StoreError> {
    let rows: Vec<Id> = load(conn, query)?;
    Ok(rows
        .into_iter()
        .filter_map(|r| stored_id(&r.id).ok())
        .collect())
}

fn dead_query(sql: &str, filter: &DeadLetterFilter) -> Query<Sqlite> {
    let list = |items: &[String]| (!items.is_empty()).then(|| json_list(items));
    SqliteConnection::query(sql)
        .bind::<Nullable<Text>, _>(
            (!filter.ids.is_empty()).then(|| json_list(filter.ids.iter().map(ToString::to_string))),
        )
        .bind::<Nullable<Text>, _>(list(&filter.destinations))
        .bind::<Nullable<Text>, _>(list(&filter.event_types))
        .bind::<Nullable<BigInt>, _>(filter.created_after.map(ceil_ms))
        .bind::<Nullable<BigInt>, _>(filter.created_before.map(ceil_ms))
        .bind::<Nullable<Text>, _>(filter.error_contains.clone())
        .bind::<Nullable<Text>, _>(filter.after_id.map(|id| id.to_string()))
}

impl sealed::Sealed for SqliteConnection {}

impl keyed::Keyed for SqliteConnection {
    fn next_seq(&mut self, ctx: &Context<Self>, key: &str, n: usize) -> Result<i64, StoreError> {
        let query = Self::query(&ctx.sql.next_seq)
            .bind::<Text, _>(key.to_owned())
            .bind::<BigInt, _>(limit(n));
        let rows: Vec<LastSeq> = load(self, query)?;
        rows.first().map(|r| r.last_seq).ok_or_else(|| {
            StoreError::new(
                outbox_engine::StoreErrorKind::Other,
                "next_seq returned no row",
            )
        })
    }

    fn insert_one(
        &mut self,
        ctx: &Context<Self>,
        m: &NewMessage,
        seq: Option<i64>,
    ) -> Result<(), StoreError> {
        let (at, delay_ms) = match m.availability() {
            Availability::Now => (None, 0),
            Availability::After(delay) => (None, millis(delay)),
            // Rounded up, so the message is never claimed before `at`.
            Availability::At(at) => (Some(ceil_ms(at)), 0),
        };
        let text = |s: Option<&str>| s.map(str::to_owned);
        let query = Self::query(&ctx.sql.insert)
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
            .bind::<Nullable<BigInt>, _>(at)
            .bind::<BigInt, _>(delay_ms)
            .bind::<Nullable<BigInt>, _>(seq);
        execute(self, query).map(|_| ())
    }
}

impl DieselDialect for SqliteConnection {
    type Statements = Statements;
    const DIALECT: Dialect = Dialect::Sqlite;

    fn statements(names: &TableNames, _: outbox_engine::PublishedRows) -> Statements {
        Statements::new(names)
    }

    fn shared(sql: &Statements) -> &Shared {
        &sql.shared
    }

    fn run(&mut self, query: Query<Sqlite>) -> Result<u64, StoreError> {
        execute(self, query)
    }

    fn connection_setup() -> Option<Box<dyn CustomizeConnection<Self, diesel::r2d2::Error>>> {
        Some(Box::new(Pragmas::default()))
    }

    /// In one `BEGIN IMMEDIATE` transaction: migrating processes take turns.
    fn migrate(
        &mut self,
        sql: &Statements,
        migrations: &[Migration],
        _: bool,
    ) -> Result<(), StoreError> {
        let mut failed = None;
        let done = self.immediate_transaction(|conn| {
            migrate::apply(conn, &sql.shared, migrations, &[]).map_err(|error| {
                failed = Some(error);
                diesel::result::Error::RollbackTransaction
            })
        });
        match (done, failed) {
            (_, Some(error)) => Err(error),
            (result, None) => result.map_err(crate::error::classify),
        }
    }

    fn insert(&mut self, ctx: &Context<Self>, messages: &[NewMessage]) -> Result<u64, StoreError> {
        keyed::insert(self, ctx, messages)
    }

    fn claim(&mut self, ctx: &Context<Self>, request: &ClaimRequest) -> Result<Claim, StoreError> {
        let (token, lease) = lease(request, millis(request.lease));
        let token_text = token.as_uuid().to_string();
        let mut query = Self::query(ctx.sql.claim_for(request))
            .bind::<BigInt, _>(limit(request.batch_size))
            .bind::<Text, _>(request.owner.clone())
            .bind::<Text, _>(token_text.clone())
            .bind::<BigInt, _>(millis(request.lease));
        if let Some(destinations) = &request.destinations {
            query = query.bind::<Text, _>(json_list(destinations));
        }
        let rows: Vec<Claimed> = load(self, query)?;
        let mut claim = Claim::new(lease, Vec::with_capacity(rows.len()));
        for row in rows {
            let (raw_id, destination) = (
                row.fields.raw_id(),
                row.fields
                    .destination
                    .clone()
                    .and_then(|d| String::from_utf8(d).ok()),
            );
            match row.fields.message(true) {
                Ok(mut m) => {
                    m.waited = Some(waited(row.waited_ms, WaitedSince::Insert));
                    claim.messages.push(m);
                }
                Err(reason) => {
                    // By rowid, fenced by this claim's token: the id may be what is unreadable.
                    let reject = Self::query(&ctx.sql.reject)
                        .bind::<Text, _>(token_text.clone())
                        .bind::<BigInt, _>(row.rowid)
                        .bind::<Text, _>(reason.clone());
                    execute(self, reject)?;
                    claim.rejected.push(Rejected {
                        id: raw_id,
                        destination,
                        reason,
                    });
                }
            }
        }
        Ok(claim)
    }

    fn complete(
        &mut self,
        ctx: &Context<Self>,
        token: LeaseToken,
        completions: &[Completion],
    ) -> Result<HashSet<MessageId>, StoreError> {
        let token_text = token.as_uuid().to_string();
        let mut applied = HashSet::new();
        let (deleted, updated) = split_deleted(ctx.published, completions);
        if !deleted.is_empty() {
            let query = Self::query(&ctx.sql.delete_published)
                .bind::<Text, _>(token_text.clone())
                .bind::<Text, _>(json_list(deleted.iter().map(|c| c.id.to_string())));
            applied.extend(returned(self, query)?);
        }
        if !updated.is_empty() {
            let items: Vec<serde_json::Value> = updated
                .iter()
                .map(|c| {
                    let (delay, error) = completion_parts(&c.action);
                    serde_json::json!({
                        "id": c.id.to_string(),
                        "status": outbox_sql::completion_status(&c.action),
                        "delay_ms": delay,
                        "error": error,
                    })
                })
                .collect();
            let query = Self::query(&ctx.sql.complete)
                .bind::<Text, _>(token_text)
                .bind::<Text, _>(serde_json::Value::Array(items).to_string());
            applied.extend(returned(self, query)?);
        }
        Ok(applied)
    }

    fn release(
        &mut self,
        ctx: &Context<Self>,
        token: LeaseToken,
        ids: &[MessageId],
    ) -> Result<HashSet<MessageId>, StoreError> {
        let query = Self::query(&ctx.sql.release)
            .bind::<Text, _>(token.as_uuid().to_string())
            .bind::<Text, _>(json_list(ids.iter().map(ToString::to_string)));
        returned(self, query)
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
                d.oldest_pending_created_at = r.oldest.and_then(DateTime::from_timestamp_millis);
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
        let rows: Vec<DeadRow> = load(
            self,
            dead_query(&ctx.sql.admin.list_dead, filter).bind::<BigInt, _>(n),
        )?;
        Ok(rows
            .into_iter()
            .filter_map(|r| {
                let letter = (|| {
                    Ok::<_, String>(DeadLetter {
                        message: r.fields.message(false)?,
                        reason: optional("last_error", r.last_error)?.unwrap_or_default(),
                        dead_at: time("dead_at", integer("dead_at", r.dead_at)?)?
                            .ok_or_else(|| undecodable("dead_at", "is NULL"))?,
                    })
                })();
                letter
                    .map_err(|reason| tracing::warn!(%reason, "a dead letter cannot be listed"))
                    .ok()
            })
            .collect())
    }

    fn count_dead(
        &mut self,
        ctx: &Context<Self>,
        filter: &DeadLetterFilter,
    ) -> Result<u64, StoreError> {
        rows::dead_count(self, dead_query(&ctx.sql.admin.count_dead, filter))
    }

    fn change_dead(
        &mut self,
        ctx: &Context<Self>,
        change: DeadChange,
        filter: &DeadLetterFilter,
    ) -> Result<u64, StoreError> {
        let sql = match change {
            DeadChange::Replay => &ctx.sql.admin.replay_dead,
            DeadChange::Discard => &ctx.sql.admin.discard_dead,
        };
        execute(self, dead_query(sql, filter))
    }

    fn find(
        &mut self,
        ctx: &Context<Self>,
        key: &str,
        n: i64,
    ) -> Result<Vec<FoundMessage>, StoreError> {
        let query = Self::query(&ctx.sql.admin.find)
            .bind::<Text, _>(id_text(key))
            .bind::<Text, _>(key.to_owned())
            .bind::<BigInt, _>(n);
        let rows: Vec<FoundRow> = load(self, query)?;
        Ok(rows
            .into_iter()
            .filter_map(|r| {
                let found = (|| {
                    let status = text("status", r.status)?;
                    let status =
                        Status::parse(&status).ok_or_else(|| undecodable("status", &status))?;
                    let mut found = FoundMessage::new(r.fields.message(false)?, status);
                    found.last_error = optional("last_error", r.last_error)?;
                    found.published_at =
                        time("published_at", integer("published_at", r.published_at)?)?;
                    found.dead_at = time("dead_at", integer("dead_at", r.dead_at)?)?;
                    Ok::<_, String>(found)
                })();
                found.ok()
            })
            .collect())
    }

    fn purge(&mut self, ctx: &Context<Self>, request: &PurgeRequest) -> Result<u64, StoreError> {
        let query = Self::query(&ctx.sql.admin.purge)
            .bind::<BigInt, _>(millis(request.published_older_than))
            .bind::<Nullable<BigInt>, _>(request.dead_older_than.map(millis))
            .bind::<BigInt, _>(limit(request.batch_size));
        let rows = execute(self, query)?;
        Ok(rows + rows::forget_idle_keys(self, &ctx.sql.shared, request.batch_size)?)
    }
}
