//! Enqueue on SQLite: a numbering statement per key, then one `INSERT` per message.

use outbox_engine::{Availability, NewMessage, StoreError};
use sqlx::sqlite::{Sqlite, SqliteConnection};

use super::{SqliteOutbox, ceil_ms};
use crate::common::{bind_columns, limit, millis};
use crate::dialect::KeyedDialect;
use crate::error::classify;

impl SqliteOutbox {
    /// Inserts `messages` on `conn`, one `INSERT` each (and one numbering statement per
    /// distinct partition key), inside a savepoint so that either all of them or none are
    /// inserted; see [`enqueue`](Self::enqueue). Messages of one key are numbered in the
    /// order of the slice. On a connection in a transaction the savepoint is only
    /// released, never committed: your commit decides. (On a connection outside any
    /// transaction, the savepoint is itself the transaction, as one multi-row statement
    /// would be.)
    ///
    /// Open your transaction through sqlx (`pool.begin()`, `begin_with(..)`), which
    /// tracks the nesting; a `BEGIN` sent as a plain query is invisible to it and makes
    /// this call fail.
    ///
    /// # Errors
    ///
    /// As [`enqueue`](Self::enqueue); no message of the batch is inserted if any fails.
    pub async fn enqueue_all(
        &self,
        conn: &mut SqliteConnection,
        messages: &[NewMessage],
    ) -> Result<u64, StoreError> {
        match messages {
            [] => Ok(0),
            [one] => self.enqueue(conn, one).await.map(|()| 1),
            many => {
                // A nested sqlx transaction is a SAVEPOINT; if this future is dropped or
                // a statement fails, sqlx rolls back to it, leaving the caller's
                // transaction as it was.
                let mut savepoint = sqlx::Connection::begin(conn).await.map_err(classify)?;
                let seqs = self.number(&mut savepoint, many).await?;
                for (message, seq) in many.iter().zip(seqs) {
                    Sqlite::insert(self, &mut savepoint, message, seq).await?;
                }
                savepoint.commit().await.map_err(classify)?;
                Ok(many.len() as u64)
            }
        }
    }
}

impl KeyedDialect for Sqlite {
    async fn next_seq(
        store: &SqliteOutbox,
        conn: &mut SqliteConnection,
        key: &str,
        count: usize,
    ) -> Result<i64, StoreError> {
        sqlx::query_scalar(&store.sql.next_seq)
            .bind(key)
            .bind(limit(count))
            .fetch_one(conn)
            .await
            .map_err(classify)
    }

    async fn insert(
        store: &SqliteOutbox,
        conn: &mut SqliteConnection,
        message: &NewMessage,
        seq: Option<i64>,
    ) -> Result<(), StoreError> {
        let (at, delay_ms) = availability_ms(message);
        let query = sqlx::query(&store.sql.insert).bind(message.id().to_string());
        bind_columns(query, message)
            .bind(at)
            .bind(delay_ms)
            .bind(seq)
            .execute(conn)
            .await
            .map_err(classify)?;
        Ok(())
    }
}

/// When a new message is due, in the form the insert binds: absolute unix milliseconds,
/// or a delay from SQLite's now.
fn availability_ms(message: &NewMessage) -> (Option<i64>, i64) {
    match message.availability() {
        Availability::Now => (None, 0),
        Availability::After(delay) => (None, millis(delay)),
        // Rounded up, so the message is never claimed before `at`.
        Availability::At(at) => (Some(ceil_ms(at)), 0),
    }
}
