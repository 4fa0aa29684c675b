//! What each dialect implements for its diesel connection type: the enqueue and
//! migration statements of `outbox-sql`, bound with that database's column types.
//! Sealed: the three dialects are the only implementations.

use std::marker::PhantomData;

use diesel::backend::Backend;
use diesel::query_builder::{AstPass, QueryFragment, QueryId};
#[cfg(any(feature = "sqlite", feature = "mysql"))]
use diesel::query_dsl::LoadQuery;
use diesel::query_dsl::methods::ExecuteDsl;
use diesel::serialize::ToSql;
use diesel::sql_types::{Binary, HasSqlType, Nullable, Text, Untyped};
use diesel::{Connection, QueryResult, RunQueryDsl};
use outbox_engine::{NewMessage, PublishedRows, StoreError};
use outbox_sql::values::headers_json;
use outbox_sql::{Dialect, Migration, Shared, TableNames};

use crate::error::classify;

/// A statement with its binds, for any backend.
pub(crate) type Query<B> = Statement<B>;

/// One of `outbox-sql`'s statements (its placeholders written in) and the values bound
/// to them. Unlike diesel's `sql_query`, diesel keeps its prepared form per connection,
/// keyed by its text, so a statement run again is not parsed and planned again; build
/// statements whose text varies without bound with [`uncached`](Self::uncached).
#[doc(hidden)]
pub struct Statement<DB: Backend> {
    sql: String,
    binds: Vec<Box<dyn QueryFragment<DB> + Send>>,
    cache: bool,
}

impl<DB: Backend> Statement<DB> {
    /// `sql`, nothing bound yet.
    pub(crate) fn new(sql: &str) -> Self {
        Self {
            sql: sql.to_owned(),
            binds: Vec::new(),
            cache: true,
        }
    }

    /// Binds `value` as the next parameter, as SQL type `ST`.
    pub fn bind<ST, V>(mut self, value: V) -> Self
    where
        DB: HasSqlType<ST>,
        V: ToSql<ST, DB> + Send + 'static,
        ST: Send + 'static,
    {
        self.binds.push(Box::new(Bind {
            value,
            sql_type: PhantomData::<fn() -> ST>,
        }));
        self
    }

    /// Binds the ten message columns between the id and the due time of `m`, in table
    /// order: destination through headers (as JSON text).
    pub(crate) fn bind_columns(self, m: &NewMessage) -> Self
    where
        DB: HasSqlType<Text> + HasSqlType<Binary>,
        String: ToSql<Text, DB>,
        Option<String>: ToSql<Nullable<Text>, DB>,
        Vec<u8>: ToSql<Binary, DB>,
    {
        let text = |s: Option<&str>| s.map(str::to_owned);
        self.bind::<Text, _>(m.destination().to_owned())
            .bind::<Text, _>(m.event_type().to_owned())
            .bind::<Nullable<Text>, _>(text(m.aggregate_type()))
            .bind::<Nullable<Text>, _>(text(m.aggregate_id()))
            .bind::<Nullable<Text>, _>(text(m.partition_key()))
            .bind::<Nullable<Text>, _>(text(m.tenant_id()))
            .bind::<Text, _>(m.idempotency_key().to_owned())
            .bind::<Binary, _>(m.payload().to_vec())
            .bind::<Text, _>(m.content_type().to_owned())
            .bind::<Text, _>(headers_json(m.headers()))
    }

    /// Not kept prepared: for statements built for one use (a multi-row insert of a
    /// given length, say).
    #[cfg_attr(
        not(feature = "mysql"),
        expect(dead_code, reason = "only MySQL builds such statements")
    )]
    pub(crate) fn uncached(mut self) -> Self {
        self.cache = false;
        self
    }
}

/// One bound value; its placeholder is in the statement's text already.
struct Bind<ST, V> {
    value: V,
    sql_type: PhantomData<fn() -> ST>,
}

impl<ST, V, DB> QueryFragment<DB> for Bind<ST, V>
where
    DB: Backend + HasSqlType<ST>,
    V: ToSql<ST, DB>,
{
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        out.push_bind_param_value_only::<ST, V>(&self.value)
    }
}

impl<DB: Backend> QueryFragment<DB> for Statement<DB> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        if !self.cache {
            out.unsafe_to_cache_prepared();
        }
        out.push_sql(&self.sql);
        for bind in &self.binds {
            bind.walk_ast(out.reborrow())?;
        }
        Ok(())
    }
}

/// No static id: diesel keys the prepared statement by its text and bind types.
impl<DB: Backend> QueryId for Statement<DB> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl<DB: Backend> diesel::query_builder::Query for Statement<DB> {
    type SqlType = Untyped;
}

impl<C: Connection> RunQueryDsl<C> for Statement<C::Backend> {}

/// What a writer needs: the rendered statements, the table names and the row layout.
#[doc(hidden)]
pub struct Context<C: DieselDialect> {
    pub(crate) sql: C::Statements,
    pub(crate) names: TableNames,
    pub(crate) published: PublishedRows,
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

    /// Every statement, rendered for `names` and the layout `published` implies.
    #[doc(hidden)]
    fn statements(names: &TableNames, published: PublishedRows) -> Self::Statements;
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

    /// A statement with its binds, ready to run on this connection.
    #[doc(hidden)]
    fn query(sql: &str) -> Query<Self::Backend> {
        Statement::new(sql)
    }

    /// Runs `query` on this connection, returning how many rows it changed.
    #[doc(hidden)]
    fn run(&mut self, query: Query<Self::Backend>) -> Result<u64, StoreError>;

    /// An age bound as the milliseconds the statements take.
    #[doc(hidden)]
    fn age_ms(age: std::time::Duration) -> i64 {
        outbox_sql::values::millis(age)
    }
}

/// Runs `query`, returning the rows.
#[cfg(any(feature = "sqlite", feature = "mysql"))]
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
