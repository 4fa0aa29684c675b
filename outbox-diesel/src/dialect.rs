//! What each dialect implements for its diesel connection type: the enqueue and
//! migration statements of `outbox-sql`, bound with that database's column types.
//! Sealed: the three dialects are the only implementations.

use std::marker::PhantomData;
use std::ops::Range;

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

/// One of `outbox-sql`'s statements and the values bound to its placeholders. Unlike
/// diesel's `sql_query`, diesel keeps its prepared form per connection, keyed by its
/// text, so a statement run again is not parsed and planned again; build statements
/// whose text varies without bound with [`uncached`](Self::uncached).
///
/// The text's placeholders (`$n` on PostgreSQL, `?` or `?n` elsewhere) are handed back
/// to diesel, which writes its own in their place through its public query builder, so
/// this works with any diesel 2.x without its opt-in to unstable internals.
#[doc(hidden)]
pub struct Statement<DB: Backend> {
    sql: String,
    pieces: Vec<Piece>,
    binds: Vec<Box<dyn QueryFragment<DB> + Send>>,
    cache: bool,
}

/// A stretch of the statement's text and the bind that follows it, if any.
struct Piece {
    text: Range<usize>,
    bind: Option<usize>,
}

/// Splits `sql` at its placeholders: `$n` and `?n` name bind `n`, a bare `?` the one
/// after the previous placeholder's. Quoted strings and identifiers are left alone.
fn pieces(sql: &str) -> Vec<Piece> {
    let bytes = sql.as_bytes();
    let mut pieces = Vec::new();
    let (mut start, mut i, mut next) = (0, 0, 0);
    let mut quote: Option<u8> = None;
    while i < bytes.len() {
        let b = bytes[i];
        if let Some(q) = quote {
            if b == q {
                quote = None;
            }
            i += 1;
            continue;
        }
        match b {
            b'\'' | b'"' | b'`' => quote = Some(b),
            b'$' | b'?' => {
                let digits = bytes[i + 1..]
                    .iter()
                    .take_while(|d| d.is_ascii_digit())
                    .count();
                let number = sql[i + 1..i + 1 + digits].parse::<usize>().ok();
                let bind = match (b, number) {
                    (_, Some(n)) if n > 0 => Some(n - 1),
                    (b'?', None) => Some(next),
                    _ => None,
                };
                if let Some(bind) = bind {
                    pieces.push(Piece {
                        text: start..i,
                        bind: Some(bind),
                    });
                    next = bind + 1;
                    i += 1 + digits;
                    start = i;
                    continue;
                }
            }
            _ => {}
        }
        i += 1;
    }
    pieces.push(Piece {
        text: start..sql.len(),
        bind: None,
    });
    pieces
}

impl<DB: Backend> Statement<DB> {
    /// `sql`, nothing bound yet.
    pub(crate) fn new(sql: &str) -> Self {
        Self {
            sql: sql.to_owned(),
            pieces: pieces(sql),
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

/// One bound value, written by diesel as its own placeholder.
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
        out.push_bind_param::<ST, V>(&self.value)
    }
}

impl<DB: Backend> QueryFragment<DB> for Statement<DB> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        if !self.cache {
            out.unsafe_to_cache_prepared();
        }
        for piece in &self.pieces {
            out.push_sql(&self.sql[piece.text.clone()]);
            if let Some(n) = piece.bind {
                let bind = self.binds.get(n).ok_or_else(|| {
                    diesel::result::Error::QueryBuilderError(
                        format!("placeholder {} has no bound value", n + 1).into(),
                    )
                })?;
                bind.walk_ast(out.reborrow())?;
            }
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

#[cfg(test)]
mod tests {
    use super::pieces;

    /// The pieces of `sql` as text.
    fn parts(sql: &str) -> Vec<(&str, Option<usize>)> {
        pieces(sql)
            .into_iter()
            .map(|piece| (&sql[piece.text], piece.bind))
            .collect()
    }

    #[test]
    fn placeholders_split_the_text_and_name_their_bind() {
        assert_eq!(
            parts("DELETE FROM t WHERE a = $2 AND b = $1 OR $2 IS NULL"),
            [
                ("DELETE FROM t WHERE a = ", Some(1)),
                (" AND b = ", Some(0)),
                (" OR ", Some(1)),
                (" IS NULL", None),
            ]
        );
        assert_eq!(
            parts("INSERT INTO t VALUES (?, ?, ?)"),
            [
                ("INSERT INTO t VALUES (", Some(0)),
                (", ", Some(1)),
                (", ", Some(2)),
                (")", None),
            ]
        );
        assert_eq!(
            parts("SELECT ?2, ?1"),
            [("SELECT ", Some(1)), (", ", Some(0)), ("", None)]
        );
    }

    #[test]
    fn quoted_text_and_dollar_signs_that_are_no_placeholders_stay() {
        let sql = "SELECT '$1 ?', \"a?b\", `c$2`, j->'$.x', $$ body $$ FROM t";
        assert_eq!(parts(sql), [(sql, None)]);
    }
}
