//! The outbox on MySQL 8 or MariaDB ≥ 10.6 through diesel's [`MysqlConnection`]. The
//! statements are the sqlx store's (`outbox_sql::mysql`): keyed rows are numbered at
//! enqueue by a counter row held until the writer's transaction ends, and the sqlx
//! store's relay drains what you enqueue.
//!
//! ```no_run
//! # fn demo(conn: &mut diesel::MysqlConnection) -> Result<(), Box<dyn std::error::Error>> {
//! use diesel::{Connection, RunQueryDsl};
//! use outbox_diesel::mysql::MysqlOutbox;
//! use outbox_engine::NewMessage;
//!
//! let outbox = MysqlOutbox::new();
//! conn.transaction(|conn| {
//!     diesel::sql_query("UPDATE orders SET status = 'paid' WHERE id = 42").execute(conn)?;
//!     outbox.enqueue(conn, &NewMessage::builder("billing", "order.paid").json(&42).build()?)?;
//!     Ok::<_, Box<dyn std::error::Error>>(())
//! })?;
//! # Ok(())
//! # }
//! ```

use diesel::QueryableByName;
use diesel::mysql::{Mysql, MysqlConnection};
use diesel::sql_types::{BigInt, Datetime, Nullable, Text};
use outbox_engine::{NewMessage, PublishedRows, StoreError, StoreErrorKind};
use outbox_sql::mysql::{
    MAX_INTERVAL_MS, MIGRATION_LOCK, MIGRATION_LOCK_TIMEOUT_S, Statements, db_time, insert_chunks,
    interval_ms,
};
use outbox_sql::values::{availability, limit};
use outbox_sql::{Dialect, Migration, Shared, TableNames};

use crate::dialect::{Context, DieselDialect, Query, execute, load, sealed};
use crate::migrate::in_transaction;
use crate::{DieselInbox, DieselOutbox, keyed, migrate};

/// The outbox's writing side on MySQL / MariaDB; see [`DieselOutbox`].
pub type MysqlOutbox = DieselOutbox<MysqlConnection>;

/// The receiver-side inbox on MySQL / MariaDB; see [`DieselInbox`].
pub type MysqlInbox = DieselInbox<MysqlConnection>;

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

/// One message's fourteen insert values.
fn bind_message(query: Query<Mysql>, m: &NewMessage, seq: Option<i64>) -> Query<Mysql> {
    let (at, delay_ms) = availability(m);
    query
        .bind::<Text, _>(m.id().to_string())
        .bind_columns(m)
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
            for chunk in insert_chunks(messages) {
                let mut query = Self::query(&ctx.sql.insert_batch(chunk.len())).uncached();
                for (m, seq) in messages[chunk.clone()].iter().zip(&seqs[chunk]) {
                    query = bind_message(query, m, *seq);
                }
                inserted += execute(conn, query)?;
            }
            Ok(inserted)
        })
    }
}
