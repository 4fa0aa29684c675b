//! What a SQL dialect supplies to the store, the inbox and the migrations, which are
//! written once over it: its statements, its migration lock, how it reads the columns
//! whose types differ ([`SqlDialect`]), and the operations whose SQL shape differs
//! ([`RelayDialect`], [`AdminDialect`], [`KeyedDialect`]).

use std::collections::HashSet;
use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};
use outbox_engine::{
    Claim, ClaimRequest, CompleteReport, Completion, DeadLetterFilter, LeaseToken, Listener,
    MessageId, NewMessage, PurgeRequest, StoreError,
};
use outbox_sql::{Migration, Shared, TableNames};

use crate::common::millis;
use crate::store::SqlOutbox;

/// A SQL dialect the generic [`SqlOutbox`] and [`SqlInbox`](crate::SqlInbox) run on.
/// Implemented for sqlx's `Postgres`, `Sqlite` and `MySql` (behind their features);
/// sealed, and its items are the crate's internals.
pub trait SqlDialect: sqlx::Database + sealed::Sealed {
    /// The dialect's statements from `outbox-sql`.
    #[doc(hidden)]
    type Statements: std::fmt::Debug + Send + Sync + 'static;

    /// The dialect, for rendering names and choosing migrations.
    #[doc(hidden)]
    const DIALECT: outbox_sql::Dialect;

    /// Every statement, rendered for `names` and the layout `published` implies.
    #[doc(hidden)]
    fn statements(names: &TableNames, published: outbox_engine::PublishedRows) -> Self::Statements;

    /// The statements every dialect has.
    #[doc(hidden)]
    fn shared(sql: &Self::Statements) -> &Shared;

    /// Runs `migrations` of `tables` under the dialect's lock (see [`crate::migrate`]).
    #[doc(hidden)]
    fn migrate(
        pool: &sqlx::Pool<Self>,
        sql: &Self::Statements,
        migrations: &[Migration],
        tables: Tables,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// A text column, `None` if NULL.
    #[doc(hidden)]
    fn text(row: &Self::Row, column: impl Into<Column>) -> Result<Option<String>, sqlx::Error>;

    /// A count (a `COUNT(*)` or `SUM`).
    #[doc(hidden)]
    fn count(row: &Self::Row, column: impl Into<Column>) -> Result<i64, sqlx::Error>;

    /// A payload column.
    #[doc(hidden)]
    fn payload(row: &Self::Row, column: impl Into<Column>) -> Result<Vec<u8>, sqlx::Error>;

    /// An attempts column.
    #[doc(hidden)]
    fn attempts(row: &Self::Row, column: impl Into<Column>) -> Result<i64, sqlx::Error>;

    /// A time column, `None` if NULL; the error is a reason naming the column.
    #[doc(hidden)]
    fn time(row: &Self::Row, column: impl Into<Column>) -> Result<Option<DateTime<Utc>>, String>;

    /// A message id column; the error is a reason naming the column.
    #[doc(hidden)]
    fn id(row: &Self::Row, column: impl Into<Column>) -> Result<MessageId, String>;

    /// The `id` column as far as it can be read, to name a row that cannot be decoded.
    #[doc(hidden)]
    fn raw_id(row: &Self::Row) -> String;

    /// The store's wakeup for relays: by default the in-process signal that
    /// [`notify`](Self::notify) raises.
    #[doc(hidden)]
    fn listen(
        store: &SqlOutbox<Self>,
    ) -> impl Future<Output = Result<Option<Listener>, StoreError>> + Send {
        let wakeup = store.wakeup.clone();
        async move { Ok(Some(Listener::new(wakeup, ()))) }
    }

    /// Wakes the relays that listen: by default those of this process.
    #[doc(hidden)]
    fn notify(store: &SqlOutbox<Self>) -> impl Future<Output = Result<(), StoreError>> + Send {
        store.wakeup.notify();
        async { Ok(()) }
    }

    /// Whether a result's types belong to its columns, so that one row of a result read
    /// whole vouches for the types of the others (a `verified` column). SQLite types
    /// each value instead.
    #[doc(hidden)]
    const TYPED_COLUMNS: bool = true;

    /// How many rows a statement changed.
    #[doc(hidden)]
    fn rows_affected(result: &Self::QueryResult) -> u64;

    /// An age bound as the milliseconds the statements take.
    #[doc(hidden)]
    fn age_ms(age: Duration) -> i64 {
        millis(age)
    }
}

/// A column of a result row, by name until [`located`](Self::located) in one of the
/// result's rows. Every row of a result has the same columns, so a batch of rows looks
/// each name up once, not once per row; and once one row was read whole, the later rows
/// skip the check of each value's type ([`verified`](Self::verified)).
#[doc(hidden)]
#[derive(Debug, Clone, Copy)]
pub struct Column {
    name: &'static str,
    position: Position,
    verified: bool,
}

#[derive(Debug, Clone, Copy)]
enum Position {
    /// Not located: looked up by name in each row.
    Unknown,
    At(usize),
    /// Located, and the result has no such column.
    Missing,
}

impl Column {
    /// The column's name.
    pub(crate) const fn name(self) -> &'static str {
        self.name
    }

    /// This column where it is in `row`, and so in every row of `row`'s result.
    pub(crate) fn located<R: sqlx::Row>(self, row: &R) -> Self {
        let position = match self.find(row) {
            Some(at) => Position::At(at),
            None => Position::Missing,
        };
        Self { position, ..self }
    }

    /// Where a column of this name is in `row`.
    fn find<R: sqlx::Row>(self, row: &R) -> Option<usize> {
        use sqlx::Column as _;
        row.columns().iter().position(|c| c.name() == self.name)
    }

    /// This column, read from a row of its result as the type it is always read as:
    /// later rows of the result skip the type check.
    pub(crate) const fn verified(self) -> Self {
        Self {
            verified: true,
            ..self
        }
    }
}

impl From<&'static str> for Column {
    fn from(name: &'static str) -> Self {
        Self {
            name,
            position: Position::Unknown,
            verified: false,
        }
    }
}

impl<R: sqlx::Row> sqlx::ColumnIndex<R> for Column {
    fn index(&self, row: &R) -> Result<usize, sqlx::Error> {
        let at = match self.position {
            Position::At(at) => Some(at),
            Position::Missing => None,
            Position::Unknown => self.find(row),
        };
        match at {
            Some(at) if at < row.len() => Ok(at),
            Some(index) => Err(sqlx::Error::ColumnIndexOutOfBounds {
                index,
                len: row.len(),
            }),
            None => Err(sqlx::Error::ColumnNotFound(self.name.to_owned())),
        }
    }
}

/// Reads `column` of `row` as `T`; the column's type is checked unless it was
/// [`verified`](Column::verified).
pub(crate) fn get<'r, T, R>(row: &'r R, column: impl Into<Column>) -> Result<T, sqlx::Error>
where
    R: sqlx::Row,
    T: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    let column = column.into();
    if column.verified {
        row.try_get_unchecked(column)
    } else {
        row.try_get(column)
    }
}

/// The relay's operations on a dialect, whose SQL shape differs: leasing, completing and
/// giving back rows (each dialect's `relay.rs`).
#[doc(hidden)]
pub trait RelayDialect: SqlDialect {
    /// Leases a batch; rows that cannot be read are dead-lettered and reported.
    #[doc(hidden)]
    fn claim(
        store: &SqlOutbox<Self>,
        request: &ClaimRequest,
    ) -> impl Future<Output = Result<Claim, StoreError>> + Send;

    /// Applies the completions fenced by `token`; reports what was applied and what was
    /// stale, as [`outbox_sql::values::report`] counts them.
    #[doc(hidden)]
    fn complete(
        store: &SqlOutbox<Self>,
        token: LeaseToken,
        completions: &[Completion],
    ) -> impl Future<Output = Result<CompleteReport, StoreError>> + Send;

    /// Gives rows back, fenced by `token`; returns the ids given back.
    #[doc(hidden)]
    fn release(
        store: &SqlOutbox<Self>,
        token: LeaseToken,
        ids: &[MessageId],
    ) -> impl Future<Output = Result<HashSet<MessageId>, StoreError>> + Send;
}

/// The operator's operations on a dialect: dead letters and purge (each dialect's
/// `admin.rs`).
#[doc(hidden)]
pub trait AdminDialect: SqlDialect {
    /// The rows of `listing` that `filter` matches, at most `limit`, in id order, with the
    /// message columns and the listing's own (see [`Listing`]).
    #[doc(hidden)]
    fn listed_rows(
        store: &SqlOutbox<Self>,
        listing: Listing,
        filter: &DeadLetterFilter,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<Self::Row>, StoreError>> + Send;

    /// How many dead rows `filter` matches.
    #[doc(hidden)]
    fn count_dead(
        store: &SqlOutbox<Self>,
        filter: &DeadLetterFilter,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Replays or discards the dead rows `filter` matches; returns how many changed.
    #[doc(hidden)]
    fn change_dead(
        store: &SqlOutbox<Self>,
        change: DeadChange,
        filter: &DeadLetterFilter,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Up to `limit` rows whose id or idempotency key is `key`, in id order, with the
    /// message columns, `status`, `last_error`, `published_at` and `dead_at`.
    #[doc(hidden)]
    fn find_rows(
        store: &SqlOutbox<Self>,
        key: &str,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<Self::Row>, StoreError>> + Send;

    /// Deletes one bounded batch of old finished rows.
    #[doc(hidden)]
    fn purge(
        store: &SqlOutbox<Self>,
        request: &PurgeRequest,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;
}

/// A dialect that numbers keyed messages when they are enqueued, with a counter row per
/// key bumped in the writer's transaction (SQLite, MySQL; PostgreSQL numbers at commit).
#[doc(hidden)]
pub trait KeyedDialect: SqlDialect {
    /// Bumps the counter of `key` by `count`; returns the last of the `count` numbers.
    fn next_seq(
        store: &SqlOutbox<Self>,
        conn: &mut Self::Connection,
        key: &str,
        count: usize,
    ) -> impl Future<Output = Result<i64, StoreError>> + Send;

    /// Inserts one message with its number.
    fn insert(
        store: &SqlOutbox<Self>,
        conn: &mut Self::Connection,
        message: &NewMessage,
        seq: Option<i64>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
}

/// The tables a migration run creates.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tables {
    /// The outbox and its key counters.
    Outbox,
    /// The inbox.
    Inbox,
}

impl Tables {
    /// The migrations of these tables for dialect `DB`.
    pub(crate) fn migrations<DB: SqlDialect>(
        self,
        names: &TableNames,
        published: outbox_engine::PublishedRows,
    ) -> Vec<Migration> {
        match self {
            Self::Outbox => outbox_sql::outbox_migrations(DB::DIALECT, names, published),
            Self::Inbox => outbox_sql::inbox_migrations(DB::DIALECT, names),
        }
    }
}

/// Which rows an operator lists with a dead-letter filter.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listing {
    /// Dead letters, with `last_error` and `dead_at`.
    Dead,
    /// Pending and leased rows, with `status`, `last_error` and `available_at`.
    Waiting,
}

/// What an operator does with dead letters.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadChange {
    /// Makes them pending again, attempts reset.
    Replay,
    /// Deletes them.
    Discard,
}

pub(crate) mod sealed {
    pub trait Sealed {}
}

#[cfg(all(test, feature = "sqlite"))]
mod tests {
    use sqlx::{Connection, Row};

    use super::Column;

    #[tokio::test]
    async fn a_located_column_reads_every_row_of_its_result_and_a_missing_one_is_named() {
        let mut conn = sqlx::SqliteConnection::connect("sqlite::memory:")
            .await
            .unwrap();
        let rows = sqlx::query("SELECT 1 AS a, 'x' AS b UNION ALL SELECT 2, 'y'")
            .fetch_all(&mut conn)
            .await
            .unwrap();
        let b = Column::from("b").located(&rows[0]);
        let read: Vec<String> = rows.iter().map(|r| r.try_get(b).unwrap()).collect();
        assert_eq!(read, ["x", "y"]);
        assert_eq!(rows[1].try_get::<i64, _>(Column::from("a")).unwrap(), 2);
        for missing in [Column::from("c"), Column::from("c").located(&rows[0])] {
            let error = rows[0].try_get::<i64, _>(missing).unwrap_err();
            assert!(
                matches!(&error, sqlx::Error::ColumnNotFound(name) if name == "c"),
                "{error}"
            );
        }
    }
}
