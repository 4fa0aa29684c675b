//! Enqueue and the inbox on diesel-async connections (feature `async`):
//! `AsyncPgConnection`, `AsyncMysqlConnection`, and `SyncConnectionWrapper<SqliteConnection>`.
//! The statements and their binds are the sync dialects' own; only the way they run
//! differs, so a message enqueued either way is the same row.
//!
//! ```no_run
//! # #[cfg(feature = "postgres")]
//! # async fn demo(outbox: outbox_diesel::postgres::PgOutbox, conn: &mut diesel_async::AsyncPgConnection) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! use diesel_async::{AsyncConnection, RunQueryDsl};
//! use outbox_engine::NewMessage;
//!
//! type Error = Box<dyn std::error::Error + Send + Sync>;
//! let message = NewMessage::builder("billing", "order.paid").json(&42).build()?;
//! conn.transaction::<_, Error, _>(async |conn| {
//!     diesel::sql_query("UPDATE orders SET status = 'paid' WHERE id = 42")
//!         .execute(conn)
//!         .await?;
//!     outbox.enqueue_async(conn, &message).await?;
//!     Ok(())
//! })
//! .await?;
//! # Ok(())
//! # }
//! ```

use std::future::Future;
use std::time::Duration;

use diesel::sql_types::{BigInt, Text};
use outbox_engine::receive::check_key;
use outbox_engine::{Delivery, Inbox, NewMessage, StoreError};
use outbox_sql::values::limit;

use crate::dialect::{Context, DieselDialect, Query};
use crate::error::classify;
use crate::{DieselInbox, DieselOutbox};

/// A sync dialect's diesel-async connection type.
pub trait AsyncDialect: DieselDialect {
    /// The diesel-async connection of this database.
    type Async: Send;

    /// Runs `query` on `conn`, returning how many rows it changed.
    #[doc(hidden)]
    fn execute_async(
        conn: &mut Self::Async,
        query: Query<Self::Backend>,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Inserts `messages` on `conn` as the sync dialect's `insert` does.
    #[doc(hidden)]
    fn insert_async(
        conn: &mut Self::Async,
        ctx: &Context<Self>,
        messages: &[NewMessage],
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;
}

impl<C: AsyncDialect> DieselOutbox<C> {
    /// Inserts `message` on `conn`, a diesel-async connection — normally inside its
    /// `transaction(async |conn| …)`. Never commits and uses no other connection.
    ///
    /// # Errors
    ///
    /// As [`enqueue`](Self::enqueue).
    pub async fn enqueue_async(
        &self,
        conn: &mut C::Async,
        message: &NewMessage,
    ) -> Result<(), StoreError> {
        C::insert_async(conn, self.ctx(), std::slice::from_ref(message))
            .await
            .map(|_| ())
    }

    /// Inserts `messages` on `conn`; see [`enqueue_async`](Self::enqueue_async).
    ///
    /// # Errors
    ///
    /// As [`enqueue_all`](Self::enqueue_all).
    pub async fn enqueue_all_async(
        &self,
        conn: &mut C::Async,
        messages: &[NewMessage],
    ) -> Result<u64, StoreError> {
        if messages.is_empty() {
            return Ok(0);
        }
        C::insert_async(conn, self.ctx(), messages).await
    }
}

/// The inbox on a diesel-async connection, inside the receiver's transaction.
impl<C> Inbox for DieselInbox<C>
where
    C: AsyncDialect,
    String: diesel::serialize::ToSql<Text, C::Backend>,
    i64: diesel::serialize::ToSql<BigInt, C::Backend>,
{
    type Connection = C::Async;

    async fn record(
        &self,
        conn: &mut C::Async,
        consumer: &str,
        key: &str,
    ) -> Result<Delivery, StoreError> {
        check_key("consumer", consumer)?;
        check_key("key", key)?;
        let query = C::query(&self.statements().0)
            .bind::<Text, _>(consumer.to_owned())
            .bind::<Text, _>(key.to_owned());
        Ok(if C::execute_async(conn, query).await? == 1 {
            Delivery::New
        } else {
            Delivery::Duplicate
        })
    }

    async fn purge(
        &self,
        conn: &mut C::Async,
        older_than: Duration,
        batch_size: usize,
    ) -> Result<u64, StoreError> {
        let query = C::query(&self.statements().1)
            .bind::<BigInt, _>(C::age_ms(older_than))
            .bind::<BigInt, _>(limit(batch_size));
        C::execute_async(conn, query).await
    }
}

/// Runs `query` on a diesel-async connection that speaks to the server itself.
async fn execute_native<A>(conn: &mut A, query: Query<A::Backend>) -> Result<u64, StoreError>
where
    A: diesel_async::AsyncConnection + Send,
    Query<A::Backend>: diesel_async::methods::ExecuteDsl<A>,
{
    diesel_async::RunQueryDsl::execute(query, conn)
        .await
        .map(|n| n as u64)
        .map_err(classify)
}

#[cfg(feature = "postgres")]
impl AsyncDialect for diesel::PgConnection {
    type Async = diesel_async::AsyncPgConnection;

    async fn execute_async(
        conn: &mut Self::Async,
        query: Query<diesel::pg::Pg>,
    ) -> Result<u64, StoreError> {
        execute_native(conn, query).await
    }

    /// One `INSERT` (an array per column for several messages), as the sync dialect.
    async fn insert_async(
        conn: &mut Self::Async,
        ctx: &Context<Self>,
        messages: &[NewMessage],
    ) -> Result<u64, StoreError> {
        execute_native(conn, crate::postgres::insert_query(&ctx.sql, messages)).await
    }
}

#[cfg(feature = "mysql")]
impl AsyncDialect for diesel::MysqlConnection {
    type Async = diesel_async::AsyncMysqlConnection;

    async fn execute_async(
        conn: &mut Self::Async,
        query: Query<diesel::mysql::Mysql>,
    ) -> Result<u64, StoreError> {
        execute_native(conn, query).await
    }

    /// Numbers keyed messages (one counter bump per key, in sorted order), then inserts
    /// each message; a failure leaves your transaction to roll back.
    async fn insert_async(
        conn: &mut Self::Async,
        ctx: &Context<Self>,
        messages: &[NewMessage],
    ) -> Result<u64, StoreError> {
        use diesel_async::RunQueryDsl;

        let mut keys: std::collections::BTreeMap<&str, (usize, i64)> =
            std::collections::BTreeMap::new();
        for key in messages.iter().filter_map(NewMessage::partition_key) {
            keys.entry(key).or_default().0 += 1;
        }
        for (key, (n, next)) in &mut keys {
            execute_native(conn, crate::mysql::next_seq_query(ctx, key, *n)).await?;
            let rows: Vec<crate::mysql::LastSeq> = crate::mysql::last_seq_query()
                .load(conn)
                .await
                .map_err(classify)?;
            *next = crate::mysql::checked_last_seq(&rows, key, *n)? - limit(*n) + 1;
        }
        let mut inserted = 0;
        for m in messages {
            let seq = m.partition_key().and_then(|key| {
                let (_, next) = keys.get_mut(key)?;
                *next += 1;
                Some(*next - 1)
            });
            inserted += execute_native(conn, crate::mysql::insert_query(ctx, m, seq)).await?;
        }
        Ok(inserted)
    }
}

#[cfg(feature = "sqlite")]
impl AsyncDialect for diesel::SqliteConnection {
    type Async =
        diesel_async::sync_connection_wrapper::SyncConnectionWrapper<diesel::SqliteConnection>;

    async fn execute_async(
        conn: &mut Self::Async,
        query: Query<diesel::sqlite::Sqlite>,
    ) -> Result<u64, StoreError> {
        conn.spawn_blocking(move |conn| diesel::RunQueryDsl::execute(query, conn))
            .await
            .map(|n| n as u64)
            .map_err(classify)
    }

    /// The sync dialect's insert, on the wrapped connection in the blocking pool.
    async fn insert_async(
        conn: &mut Self::Async,
        ctx: &Context<Self>,
        messages: &[NewMessage],
    ) -> Result<u64, StoreError> {
        let sql = Self::statements(&ctx.names, ctx.published);
        let (names, published, messages) = (ctx.names.clone(), ctx.published, messages.to_vec());
        conn.spawn_blocking(move |conn| {
            let ctx = Context {
                sql,
                names,
                published,
            };
            Ok(Self::insert(conn, &ctx, &messages))
        })
        .await
        .map_err(classify)?
    }
}
