//! The outbox on SQLite through diesel's [`SqliteConnection`]: the embedded outbox, no
//! server needed. The statements are the sqlx store's: times are unix milliseconds and
//! ids are lowercase UUID text, and the sqlx store's relay drains what you enqueue.
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
//! let outbox = SqliteOutbox::new();
//! let mut conn = pool.get()?;
//! outbox.migrate(&mut conn)?;
//! conn.immediate_transaction(|conn| {
//!     diesel::sql_query("UPDATE orders SET status = 'paid' WHERE id = 42").execute(conn)?;
//!     outbox.enqueue(conn, &NewMessage::builder("billing", "order.paid").json(&42).build()?)?;
//!     Ok::<_, Box<dyn std::error::Error>>(())
//! })?;
//! # Ok(())
//! # }
//! ```

use std::time::Duration;

use diesel::QueryableByName;
use diesel::connection::SimpleConnection;
use diesel::r2d2::CustomizeConnection;
use diesel::sql_types::{BigInt, Nullable, Text};
use diesel::sqlite::{Sqlite, SqliteConnection};
use outbox_engine::{Availability, NewMessage, PublishedRows, StoreError};
use outbox_sql::sqlite::{Statements, ceil_ms};
use outbox_sql::values::{limit, millis};
use outbox_sql::{Dialect, Migration, Shared, TableNames};

use crate::dialect::{Context, DieselDialect, Query, execute, load, sealed};
use crate::{DieselInbox, DieselOutbox, keyed, migrate};

/// The outbox's writing side on SQLite; see [`DieselOutbox`].
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

#[derive(QueryableByName)]
struct LastSeq {
    #[diesel(sql_type = BigInt)]
    last_seq: i64,
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
        let query = Self::query(&ctx.sql.insert)
            .bind::<Text, _>(m.id().to_string())
            .bind_columns(m)
            .bind::<Nullable<BigInt>, _>(at)
            .bind::<BigInt, _>(delay_ms)
            .bind::<Nullable<BigInt>, _>(seq);
        execute(self, query).map(|_| ())
    }
}

impl DieselDialect for SqliteConnection {
    type Statements = Statements;
    const DIALECT: Dialect = Dialect::Sqlite;

    fn statements(names: &TableNames, _: PublishedRows) -> Statements {
        Statements::new(names)
    }

    fn shared(sql: &Statements) -> &Shared {
        &sql.shared
    }

    fn run(&mut self, query: Query<Sqlite>) -> Result<u64, StoreError> {
        execute(self, query)
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
}
