//! The outbox on PostgreSQL through diesel's [`PgConnection`]: enqueue inside your
//! `conn.transaction(|conn| …)`, and the inbox.
//!
//! The statements are those of the sqlx store (`outbox-sql`), so the table, its
//! functions and triggers (keyed rows numbered at commit, `outbox_enqueue(...)` for
//! other languages) are the same, and the sqlx store's relay drains what you enqueue.
//!
//! ```no_run
//! # fn demo(conn: &mut diesel::PgConnection) -> Result<(), Box<dyn std::error::Error>> {
//! use diesel::{Connection, RunQueryDsl};
//! use outbox_diesel::postgres::PgOutbox;
//! use outbox_engine::NewMessage;
//!
//! let outbox = PgOutbox::new();
//! conn.transaction(|conn| {
//!     diesel::sql_query("UPDATE orders SET status = 'paid' WHERE id = 42").execute(conn)?;
//!     let message = NewMessage::builder("billing", "order.paid").json(&42).build()?;
//!     outbox.enqueue(conn, &message)?;
//!     Ok::<_, Box<dyn std::error::Error>>(())
//! })?;
//! # Ok(())
//! # }
//! ```

use diesel::pg::{Pg, PgConnection};
use diesel::sql_types::{Array, BigInt, Bytea, Nullable, Text, Timestamptz, Uuid as SqlUuid};
use outbox_engine::{MessageId, NewMessage, PublishedRows, StoreError};
use outbox_sql::postgres::Statements;
use outbox_sql::values::{availability, headers_json};
use outbox_sql::{Dialect, Migration, Shared, TableNames};
use uuid::Uuid;

use crate::dialect::{Context, DieselDialect, Query, execute, sealed};
use crate::{DieselInbox, DieselOutbox, migrate};

/// The outbox's writing side on PostgreSQL; see [`DieselOutbox`].
pub type PgOutbox = DieselOutbox<PgConnection>;

/// The receiver-side inbox on PostgreSQL; see [`DieselInbox`].
pub type PgInbox = DieselInbox<PgConnection>;

/// The advisory-lock key the sqlx store takes too, so migrations of both serialise.
const MIGRATION_LOCK: i64 = 0x6f75_7462_6f78_0001;

fn ids(ids: impl IntoIterator<Item = MessageId>) -> Vec<Uuid> {
    ids.into_iter().map(|id| *id.as_uuid()).collect()
}

/// One message: the `insert` statement. Several: `insert_batch`, one array per column.
pub(crate) fn insert_query(sql: &Statements, messages: &[NewMessage]) -> Query<Pg> {
    if let [m] = messages {
        let (at, delay_ms) = availability(m);
        return PgConnection::query(&sql.insert)
            .bind::<SqlUuid, _>(*m.id().as_uuid())
            .bind_columns(m)
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
}
