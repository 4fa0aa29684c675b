//! Enqueue on MySQL: a numbering statement per key (taken in sorted order), then one
//! multi-row `INSERT` (cut into chunks for very large batches).

use outbox_engine::{NewMessage, StoreError, StoreErrorKind};
use sqlx::mysql::{MySql, MySqlArguments, MySqlConnection};
use sqlx::query::Query;

use super::{MAX_INTERVAL_MS, MySqlOutbox, db_time, insert_chunks};
use crate::common::{availability, bind_columns, limit};
use crate::dialect::KeyedDialect;
use crate::error::classify;

impl MySqlOutbox {
    /// Inserts `messages` on `conn` with one multi-row `INSERT` (several for very large
    /// batches, cut at 500 rows or about 4 MiB of payload), preceded by one numbering
    /// statement per distinct partition key, taken in sorted key order; see
    /// [`enqueue`](Self::enqueue). Messages of one key are numbered in the order of the
    /// slice. Returns how many rows were inserted.
    ///
    /// # Errors
    ///
    /// As [`enqueue`](Self::enqueue). Inside a transaction nothing is kept once you roll
    /// back after an error; outside one, statements that succeeded before the failing one
    /// stay.
    pub async fn enqueue_all(
        &self,
        conn: &mut MySqlConnection,
        messages: &[NewMessage],
    ) -> Result<u64, StoreError> {
        let seqs = self.number(conn, messages).await?;
        let mut inserted = 0;
        for chunk in insert_chunks(messages) {
            let sql = self.sql.insert_batch(chunk.len());
            let mut query = sqlx::query(&sql).persistent(chunk.len() <= 16);
            for (m, seq) in messages[chunk.clone()].iter().zip(&seqs[chunk]) {
                query = bind_message(query, m, *seq);
            }
            inserted += query
                .execute(&mut *conn)
                .await
                .map_err(classify)?
                .rows_affected();
        }
        Ok(inserted)
    }
}

impl KeyedDialect for MySql {
    /// Locks the key's counter until the transaction ends; the last number comes back
    /// as the statement's last insert id.
    async fn next_seq(
        store: &MySqlOutbox,
        conn: &mut MySqlConnection,
        key: &str,
        count: usize,
    ) -> Result<i64, StoreError> {
        let done = sqlx::query(&store.sql.next_seq)
            .bind(key)
            .bind(limit(count))
            .bind(limit(count))
            .execute(conn)
            .await
            .map_err(classify)?;
        match i64::try_from(done.last_insert_id()) {
            Ok(last) if last >= limit(count) => Ok(last),
            _ => Err(StoreError::new(
                StoreErrorKind::Other,
                format!(
                    "numbering partition key {key:?} returned last insert id {}, expected at least {count}",
                    done.last_insert_id()
                ),
            )),
        }
    }

    async fn insert(
        store: &MySqlOutbox,
        conn: &mut MySqlConnection,
        message: &NewMessage,
        seq: Option<i64>,
    ) -> Result<(), StoreError> {
        bind_message(sqlx::query(&store.sql.insert), message, seq)
            .execute(conn)
            .await
            .map_err(classify)?;
        Ok(())
    }
}

/// Binds the fourteen `insert` parameters of one message.
fn bind_message<'q>(
    query: Query<'q, MySql, MySqlArguments>,
    m: &'q NewMessage,
    seq: Option<i64>,
) -> Query<'q, MySql, MySqlArguments> {
    let (at, delay_ms) = availability(m);
    let (at, delay_ms) = (at.map(db_time), delay_ms.min(MAX_INTERVAL_MS));
    bind_columns(query.bind(m.id().to_string()), m)
        .bind(at)
        .bind(delay_ms)
        .bind(seq)
}
