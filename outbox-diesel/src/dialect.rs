//! The driver each dialect implements for its diesel connection type: the statements of
//! `outbox-sql`, bound and read with that database's column types. Sealed: the three
//! dialects are the only implementations.

use std::collections::HashSet;

use diesel::query_builder::{BoxedSqlQuery, SqlQuery};
use diesel::query_dsl::LoadQuery;
use diesel::query_dsl::methods::ExecuteDsl;
use diesel::{Connection, RunQueryDsl};
use outbox_engine::{
    Claim, ClaimRequest, Completion, DeadLetter, DeadLetterFilter, DestinationStats, FoundMessage,
    Gauges, LeaseToken, MessageId, NewMessage, PublishedRows, PurgeRequest, StoreError,
};
use outbox_sql::{Dialect, Migration, Shared, TableNames};

use crate::error::classify;

/// A statement with its binds, for any backend.
pub(crate) type Query<B> = BoxedSqlQuery<'static, B, SqlQuery>;

/// What a store needs besides its pool: the rendered statements and how it finishes rows.
#[doc(hidden)]
pub struct Context<C: DieselDialect> {
    pub(crate) sql: C::Statements,
    pub(crate) names: TableNames,
    pub(crate) published: PublishedRows,
}

/// What an operator does with dead letters.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadChange {
    /// Pending again, attempts reset.
    Replay,
    /// Deleted.
    Discard,
}

/// A diesel connection type the outbox runs on: `PgConnection`, `SqliteConnection` or
/// `MysqlConnection`.
pub trait DieselDialect:
    Connection + diesel::r2d2::R2D2Connection + Send + 'static + sealed::Sealed
{
    /// The rendered statements of `outbox-sql`.
    #[doc(hidden)]
    type Statements: Send + Sync + 'static;
    /// Which dialect.
    #[doc(hidden)]
    const DIALECT: Dialect;

    #[doc(hidden)]
    fn statements(names: &TableNames) -> Self::Statements;
    #[doc(hidden)]
    fn shared(sql: &Self::Statements) -> &Shared;

    /// Runs `migrations` under the dialect's migration lock.
    #[doc(hidden)]
    fn migrate(
        &mut self,
        sql: &Self::Statements,
        migrations: &[Migration],
        inbox: bool,
    ) -> Result<(), StoreError>;

    /// Inserts `messages` (numbering keyed ones where the dialect does at enqueue).
    #[doc(hidden)]
    fn insert(&mut self, ctx: &Context<Self>, messages: &[NewMessage]) -> Result<u64, StoreError>;

    #[doc(hidden)]
    fn claim(&mut self, ctx: &Context<Self>, request: &ClaimRequest) -> Result<Claim, StoreError>;
    #[doc(hidden)]
    fn complete(
        &mut self,
        ctx: &Context<Self>,
        token: LeaseToken,
        completions: &[Completion],
    ) -> Result<HashSet<MessageId>, StoreError>;
    #[doc(hidden)]
    fn release(
        &mut self,
        ctx: &Context<Self>,
        token: LeaseToken,
        ids: &[MessageId],
    ) -> Result<HashSet<MessageId>, StoreError>;

    #[doc(hidden)]
    fn stats(&mut self, ctx: &Context<Self>) -> Result<Vec<DestinationStats>, StoreError>;
    /// Keys held back by a dead head, per destination.
    #[doc(hidden)]
    fn halted(&mut self, ctx: &Context<Self>) -> Result<Vec<(String, u64)>, StoreError>;
    /// Three reads whose cost follows the backlog and the dead letters.
    #[doc(hidden)]
    fn gauges(&mut self, ctx: &Context<Self>, limit: usize) -> Result<Gauges, StoreError>;

    #[doc(hidden)]
    fn list_dead(
        &mut self,
        ctx: &Context<Self>,
        filter: &DeadLetterFilter,
        limit: i64,
    ) -> Result<Vec<DeadLetter>, StoreError>;
    #[doc(hidden)]
    fn count_dead(
        &mut self,
        ctx: &Context<Self>,
        filter: &DeadLetterFilter,
    ) -> Result<u64, StoreError>;
    #[doc(hidden)]
    fn change_dead(
        &mut self,
        ctx: &Context<Self>,
        change: DeadChange,
        filter: &DeadLetterFilter,
    ) -> Result<u64, StoreError>;
    #[doc(hidden)]
    fn find(
        &mut self,
        ctx: &Context<Self>,
        key: &str,
        limit: i64,
    ) -> Result<Vec<FoundMessage>, StoreError>;
    #[doc(hidden)]
    fn purge(&mut self, ctx: &Context<Self>, request: &PurgeRequest) -> Result<u64, StoreError>;

    /// A statement with its binds, ready to run on this connection.
    #[doc(hidden)]
    fn query(sql: &str) -> Query<Self::Backend>;

    /// What every pooled connection needs before use (SQLite's pragmas), for pools the
    /// crate builds itself.
    #[doc(hidden)]
    fn connection_setup()
    -> Option<Box<dyn diesel::r2d2::CustomizeConnection<Self, diesel::r2d2::Error>>> {
        None
    }

    /// An age bound as the milliseconds the statements take.
    #[doc(hidden)]
    fn age_ms(age: std::time::Duration) -> i64 {
        outbox_sql::values::millis(age)
    }
}

/// Runs `query`, returning the rows.
pub(crate) fn load<C, R>(conn: &mut C, query: Query<C::Backend>) -> Result<Vec<R>, StoreError>
where
    C: Connection,
    Query<C::Backend>: LoadQuery<'static, C, R>,
{
    query.load(conn).map_err(classify)
}

/// Runs `query`, returning how many rows it changed.
pub(crate) fn execute<C>(conn: &mut C, query: Query<C::Backend>) -> Result<u64, StoreError>
where
    C: Connection,
    Query<C::Backend>: ExecuteDsl<C>,
{
    query.execute(conn).map(|n| n as u64).map_err(classify)
}

pub(crate) mod sealed {
    pub trait Sealed {}
}
