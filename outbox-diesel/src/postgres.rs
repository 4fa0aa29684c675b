//! The outbox on PostgreSQL through diesel's [`PgConnection`]: enqueue inside your
//! `conn.transaction(|conn| …)`, the relay's store on an r2d2 pool, the inbox.
//!
//! The statements are those of the sqlx store (`outbox-sql`), so the table, its
//! functions and triggers (keyed rows numbered at commit, `outbox_enqueue(...)` for
//! other languages) are the same, and either backend drains what the other enqueued.
//!
//! ```no_run
//! # fn demo(pool: diesel::r2d2::Pool<diesel::r2d2::ConnectionManager<diesel::PgConnection>>) -> Result<(), Box<dyn std::error::Error>> {
//! use diesel::Connection;
//! use outbox_diesel::postgres::PgOutbox;
//! use outbox_engine::NewMessage;
//!
//! let outbox = PgOutbox::new(pool.clone());
//! let mut conn = pool.get()?;
//! conn.transaction(|conn| {
//!     diesel::sql_query("UPDATE orders SET status = 'paid' WHERE id = 42").execute(conn)?;
//!     let message = NewMessage::builder("billing", "order.paid").json(&42).build()?;
//!     outbox.enqueue(conn, &message)?;
//!     Ok::<_, Box<dyn std::error::Error>>(())
//! })?;
//! # Ok(())
//! # }
//! # use diesel::RunQueryDsl;
//! ```

use std::collections::HashSet;

use chrono::{DateTime, Utc};
use diesel::QueryableByName;
use diesel::pg::{Pg, PgConnection};
use diesel::sql_types::{
    Array, BigInt, Bytea, Integer, Nullable, Text, Timestamptz, Uuid as SqlUuid,
};
use outbox_engine::{
    Claim, ClaimRequest, Completion, DeadLetter, DeadLetterFilter, DestinationStats, FoundMessage,
    Gauges, LeaseToken, Message, MessageId, NewMessage, PublishedRows, PurgeRequest, Rejected,
    Status, StoreError, WaitedSince,
};
use outbox_sql::postgres::Statements;
use outbox_sql::values::{
    availability, completion_parts, count, headers_json, lease, millis, read_headers, split_deleted,
};
use outbox_sql::{Dialect, Migration, Shared, TableNames};
use uuid::Uuid;

use crate::dialect::{Context, DeadChange, DieselDialect, Query, execute, load, sealed};
use crate::{DieselInbox, DieselOutbox, migrate, rows};

/// The outbox on PostgreSQL; see [`DieselOutbox`].
pub type PgOutbox = DieselOutbox<PgConnection>;

/// The receiver-side inbox on PostgreSQL; see [`DieselInbox`].
pub type PgInbox = DieselInbox<PgConnection>;

/// The advisory-lock key the sqlx store takes too, so migrations of both serialise.
const MIGRATION_LOCK: i64 = 0x6f75_7462_6f78_0001;

/// The message columns (`outbox_sql::postgres::MESSAGE_COLUMNS`).
#[derive(QueryableByName)]
struct MessageRow {
    #[diesel(sql_type = SqlUuid)]
    id: Uuid,
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
    #[diesel(sql_type = Bytea)]
    payload: Vec<u8>,
    #[diesel(sql_type = Text)]
    content_type: String,
    #[diesel(sql_type = Text)]
    headers: String,
    #[diesel(sql_type = Integer)]
    attempts: i32,
    #[diesel(sql_type = Timestamptz)]
    created_at: DateTime<Utc>,
}

impl MessageRow {
    /// The message; with `strict` off, headers that cannot be read are left empty.
    fn message(self, strict: bool) -> Result<Message, String> {
        let mut m = Message::from_parts(
            MessageId::from_uuid(self.id),
            self.destination,
            self.event_type,
            self.payload,
            self.content_type,
            self.idempotency_key,
            outbox_sql::values::attempts(i64::from(self.attempts)),
            self.created_at,
        );
        m.aggregate_type = self.aggregate_type;
        m.aggregate_id = self.aggregate_id;
        m.partition_key = self.partition_key;
        m.tenant_id = self.tenant_id;
        read_headers(&mut m, &self.headers, strict)?;
        Ok(m)
    }
}

#[derive(QueryableByName)]
struct Claimed {
    #[diesel(embed)]
    fields: MessageRow,
    #[diesel(sql_type = BigInt)]
    waited_ms: i64,
    #[diesel(sql_type = BigInt)]
    from_commit: i64,
}

#[derive(QueryableByName)]
struct DeadRow {
    #[diesel(embed)]
    fields: MessageRow,
    #[diesel(sql_type = Nullable<Text>)]
    last_error: Option<String>,
    #[diesel(sql_type = Timestamptz)]
    dead_at: DateTime<Utc>,
}

#[derive(QueryableByName)]
struct FoundRow {
    #[diesel(embed)]
    fields: MessageRow,
    #[diesel(sql_type = Text)]
    status: String,
    #[diesel(sql_type = Nullable<Text>)]
    last_error: Option<String>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    published_at: Option<DateTime<Utc>>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    dead_at: Option<DateTime<Utc>>,
}

/// What `<outbox>_rotate` returns.
#[derive(QueryableByName)]
struct Emptied {
    #[diesel(sql_type = BigInt)]
    emptied: i64,
}

#[derive(QueryableByName)]
struct Id {
    #[diesel(sql_type = SqlUuid)]
    id: Uuid,
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
    #[diesel(sql_type = Nullable<Timestamptz>)]
    oldest: Option<DateTime<Utc>>,
}

fn ids(ids: impl IntoIterator<Item = MessageId>) -> Vec<Uuid> {
    ids.into_iter().map(|id| *id.as_uuid()).collect()
}

fn returned(conn: &mut PgConnection, query: Query<Pg>) -> Result<HashSet<MessageId>, StoreError> {
    let rows: Vec<Id> = load(conn, query)?;
    Ok(rows
        .into_iter()
        .map(|r| MessageId::from_uuid(r.id))
        .collect())
}

/// `sql` with the dead-letter filter bound (`$1`..`$7`).
fn dead_query(sql: &str, filter: &DeadLetterFilter) -> Query<Pg> {
    let set = |v: &[String]| (!v.is_empty()).then(|| v.to_vec());
    PgConnection::query(sql)
        .bind::<Nullable<Array<SqlUuid>>, _>(
            (!filter.ids.is_empty()).then(|| ids(filter.ids.iter().copied())),
        )
        .bind::<Nullable<Array<Text>>, _>(set(&filter.destinations))
        .bind::<Nullable<Array<Text>>, _>(set(&filter.event_types))
        .bind::<Nullable<Timestamptz>, _>(filter.created_after)
        .bind::<Nullable<Timestamptz>, _>(filter.created_before)
        .bind::<Nullable<Text>, _>(filter.error_contains.clone())
        .bind::<Nullable<SqlUuid>, _>(filter.after_id.map(|id| *id.as_uuid()))
}

/// The ten message columns between the id and the due time, bound one by one.
fn bind_columns(query: Query<Pg>, m: &NewMessage) -> Query<Pg> {
    let text = |s: Option<&str>| s.map(str::to_owned);
    query
        .bind::<Text, _>(m.destination().to_owned())
        .bind::<Text, _>(m.event_type().to_owned())
        .bind::<Nullable<Text>, _>(text(m.aggregate_type()))
        .bind::<Nullable<Text>, _>(text(m.aggregate_id()))
        .bind::<Nullable<Text>, _>(text(m.partition_key()))
        .bind::<Nullable<Text>, _>(text(m.tenant_id()))
        .bind::<Text, _>(m.idempotency_key().to_owned())
        .bind::<Bytea, _>(m.payload().to_vec())
        .bind::<Text, _>(m.content_type().to_owned())
        .bind::<Text, _>(headers_json(m.headers()))
}

/// One message: the `insert` statement. Several: `insert_batch`, one array per column.
pub(crate) fn insert_query(sql: &Statements, messages: &[NewMessage]) -> Query<Pg> {
    if let [m] = messages {
        let (at, delay_ms) = availability(m);
        return bind_columns(
            PgConnection::query(&sql.insert).bind::<SqlUuid, _>(*m.id().as_uuid()),
            m,
        )
        .bind::<Nullable<Timestamptz>, _>(at)
        .bind::<BigInt, _>(delay_ms);
    }
    let column =
        |f: &dyn Fn(&NewMessage) -> Option<String>| messages.iter().map(f).collect::<Vec<_>>();
    let required = |f: &dyn Fn(&NewMessage) -> &str| {
        messages.iter().map(|m| f(m).to_owned()).collect::<Vec<_>>()
    };
    let (at, delay): (Vec<_>, Vec<_>) = messages.iter().map(availability).unzip();
    PgConnection::query(&sql.insert_batch)
        .bind::<Array<SqlUuid>, _>(ids(messages.iter().map(NewMessage::id)))
        .bind::<Array<Text>, _>(required(&|m| m.destination()))
        .bind::<Array<Text>, _>(required(&|m| m.event_type()))
        .bind::<Array<Nullable<Text>>, _>(column(&|m| m.aggregate_type().map(str::to_owned)))
        .bind::<Array<Nullable<Text>>, _>(column(&|m| m.aggregate_id().map(str::to_owned)))
        .bind::<Array<Nullable<Text>>, _>(column(&|m| m.partition_key().map(str::to_owned)))
        .bind::<Array<Nullable<Text>>, _>(column(&|m| m.tenant_id().map(str::to_owned)))
        .bind::<Array<Text>, _>(required(&|m| m.idempotency_key()))
        .bind::<Array<Bytea>, _>(
            messages
                .iter()
                .map(|m| m.payload().to_vec())
                .collect::<Vec<_>>(),
        )
        .bind::<Array<Text>, _>(required(&|m| m.content_type()))
        .bind::<Array<Text>, _>(
            messages
                .iter()
                .map(|m| headers_json(m.headers()))
                .collect::<Vec<_>>(),
        )
        .bind::<Array<Nullable<Timestamptz>>, _>(at)
        .bind::<Array<BigInt>, _>(delay)
}

impl sealed::Sealed for PgConnection {}

impl DieselDialect for PgConnection {
    type Statements = Statements;
    const DIALECT: Dialect = Dialect::Postgres;

    fn statements(names: &TableNames, published: PublishedRows) -> Statements {
        Statements::for_rows(names, published)
    }

    fn shared(sql: &Statements) -> &Shared {
        &sql.shared
    }

    fn run(&mut self, query: Query<Pg>) -> Result<u64, StoreError> {
        execute(self, query)
    }

    /// In one transaction holding the advisory lock the sqlx store takes too.
    fn migrate(
        &mut self,
        sql: &Statements,
        migrations: &[Migration],
        _: bool,
    ) -> Result<(), StoreError> {
        migrate::in_transaction(self, |conn| {
            execute(
                conn,
                Self::query(&sql.migration_lock).bind::<BigInt, _>(MIGRATION_LOCK),
            )?;
            migrate::apply(conn, &sql.shared, migrations, &[])
        })
    }

    fn insert(&mut self, ctx: &Context<Self>, messages: &[NewMessage]) -> Result<u64, StoreError> {
        if messages.is_empty() {
            return Ok(0);
        }
        execute(self, insert_query(&ctx.sql, messages))
    }

    fn claim(&mut self, ctx: &Context<Self>, request: &ClaimRequest) -> Result<Claim, StoreError> {
        let (token, lease) = lease(request, millis(request.lease));
        let mut query = Self::query(ctx.sql.claim_for(request))
            .bind::<BigInt, _>(outbox_sql::values::limit(request.batch_size))
            .bind::<Text, _>(request.owner.clone())
            .bind::<SqlUuid, _>(*token.as_uuid())
            .bind::<BigInt, _>(millis(request.lease));
        if let Some(destinations) = &request.destinations {
            query = query.bind::<Array<Text>, _>(destinations.clone());
        }
        let rows: Vec<Claimed> = load(self, query)?;
        let mut claim = Claim::new(lease, Vec::with_capacity(rows.len()));
        let mut deaths = Vec::new();
        for row in rows {
            let id = MessageId::from_uuid(row.fields.id);
            let destination = row.fields.destination.clone();
            match row.fields.message(true) {
                Ok(mut m) => {
                    let since = if row.from_commit == 1 {
                        WaitedSince::Commit
                    } else {
                        WaitedSince::TransactionStart
                    };
                    m.waited = Some(outbox_sql::values::waited(row.waited_ms, since));
                    claim.messages.push(m);
                }
                Err(reason) => {
                    deaths.push(Completion::dead(id, reason.clone()));
                    claim.rejected.push(Rejected {
                        id: id.to_string(),
                        destination: Some(destination),
                        reason,
                    });
                }
            }
        }
        if !deaths.is_empty() {
            // Fenced by this claim's own token: the rows are ours until it completes them.
            Self::complete(self, ctx, token, &deaths)?;
        }
        Ok(claim)
    }

    fn complete(
        &mut self,
        ctx: &Context<Self>,
        token: LeaseToken,
        completions: &[Completion],
    ) -> Result<HashSet<MessageId>, StoreError> {
        let mut applied = HashSet::new();
        let (deleted, updated) = split_deleted(ctx.published, completions);
        if !deleted.is_empty() {
            let query = Self::query(&ctx.sql.delete_published)
                .bind::<SqlUuid, _>(*token.as_uuid())
                .bind::<Array<SqlUuid>, _>(ids(deleted.iter().map(|c| c.id)));
            applied.extend(returned(self, query)?);
        }
        if !updated.is_empty() {
            let parts: Vec<_> = updated
                .iter()
                .map(|c| completion_parts(&c.action))
                .collect();
            let query = Self::query(&ctx.sql.complete)
                .bind::<SqlUuid, _>(*token.as_uuid())
                .bind::<Array<SqlUuid>, _>(ids(updated.iter().map(|c| c.id)))
                .bind::<Array<Text>, _>(
                    updated
                        .iter()
                        .map(|c| outbox_sql::completion_status(&c.action).to_owned())
                        .collect::<Vec<_>>(),
                )
                .bind::<Array<BigInt>, _>(parts.iter().map(|(delay, _)| *delay).collect::<Vec<_>>())
                .bind::<Array<Nullable<Text>>, _>(
                    parts
                        .iter()
                        .map(|(_, e)| e.map(str::to_owned))
                        .collect::<Vec<_>>(),
                );
            applied.extend(returned(self, query)?);
        }
        Ok(applied)
    }

    fn release(
        &mut self,
        ctx: &Context<Self>,
        token: LeaseToken,
        released: &[MessageId],
    ) -> Result<HashSet<MessageId>, StoreError> {
        let query = Self::query(&ctx.sql.release)
            .bind::<SqlUuid, _>(*token.as_uuid())
            .bind::<Array<SqlUuid>, _>(ids(released.iter().copied()));
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
                d.oldest_pending_created_at = r.oldest;
                d
            })
            .collect())
    }

    fn halted(&mut self, ctx: &Context<Self>) -> Result<Vec<(String, u64)>, StoreError> {
        rows::halted(self, &ctx.sql.shared)
    }

    fn gauges(&mut self, ctx: &Context<Self>, limit: usize) -> Result<Gauges, StoreError> {
        rows::gauges(self, &ctx.sql.shared, limit)
    }

    fn list_dead(
        &mut self,
        ctx: &Context<Self>,
        filter: &DeadLetterFilter,
        limit: i64,
    ) -> Result<Vec<DeadLetter>, StoreError> {
        let rows: Vec<DeadRow> = load(
            self,
            dead_query(&ctx.sql.admin.list_dead, filter).bind::<BigInt, _>(limit),
        )?;
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
                    dead_at: r.dead_at,
                })
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
        limit: i64,
    ) -> Result<Vec<FoundMessage>, StoreError> {
        let query = Self::query(&ctx.sql.admin.find)
            .bind::<Nullable<SqlUuid>, _>(Uuid::parse_str(key).ok())
            .bind::<Text, _>(key.to_owned())
            .bind::<BigInt, _>(limit);
        let rows: Vec<FoundRow> = load(self, query)?;
        Ok(rows
            .into_iter()
            .filter_map(|r| {
                let status = Status::parse(&r.status)?;
                let mut found = FoundMessage::new(r.fields.message(false).ok()?, status);
                found.last_error = r.last_error;
                found.published_at = r.published_at;
                found.dead_at = r.dead_at;
                Some(found)
            })
            .collect())
    }

    fn purge(&mut self, ctx: &Context<Self>, request: &PurgeRequest) -> Result<u64, StoreError> {
        if ctx.published == PublishedRows::Rotate {
            // Two transactions, in this order (see `rotate_prepare` in `outbox-sql`).
            let rotation = |sql| {
                Self::query(sql)
                    .bind::<BigInt, _>(millis(request.published_older_than))
                    .bind::<Nullable<BigInt>, _>(request.dead_older_than.map(millis))
            };
            execute(self, rotation(&ctx.sql.rotate_prepare))?;
            let emptied: Vec<Emptied> = load(self, rotation(&ctx.sql.rotate))?;
            let emptied = emptied.first().map_or(0, |r| count(r.emptied));
            return Ok(emptied + rows::forget_idle_keys(self, &ctx.sql.shared, request.batch_size)?);
        }
        let query = Self::query(&ctx.sql.admin.purge)
            .bind::<BigInt, _>(millis(request.published_older_than))
            .bind::<Nullable<BigInt>, _>(request.dead_older_than.map(millis))
            .bind::<BigInt, _>(outbox_sql::values::limit(request.batch_size));
        let rows = execute(self, query)?;
        Ok(rows + rows::forget_idle_keys(self, &ctx.sql.shared, request.batch_size)?)
    }
}
