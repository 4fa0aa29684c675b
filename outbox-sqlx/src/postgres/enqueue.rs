//! Enqueue on PostgreSQL: one `INSERT` on the caller's connection, or one for a batch.

use chrono::{DateTime, Utc};
use outbox_engine::{NewMessage, StoreError};
use sqlx::postgres::PgConnection;
use uuid::Uuid;

use super::PgOutbox;
use crate::common::{availability, bind_columns, headers_json};
use crate::error::classify;

impl PgOutbox {
    /// Inserts `message` on `conn` — normally your open transaction (`&mut tx`). Never
    /// commits and uses no other connection.
    ///
    /// # Errors
    ///
    /// [`StoreError`] of kind `Constraint` if the id exists, or the database's error; the
    /// caller's transaction is then aborted, as with any failed statement.
    pub async fn enqueue(
        &self,
        conn: &mut PgConnection,
        message: &NewMessage,
    ) -> Result<(), StoreError> {
        let (at, delay_ms) = availability(message);
        let query = sqlx::query(&self.sql.insert).bind(*message.id().as_uuid());
        bind_columns(query, message)
            .bind(at)
            .bind(delay_ms)
            .execute(conn)
            .await
            .map_err(classify)?;
        Ok(())
    }

    /// Inserts `messages` with one statement on `conn`; see [`enqueue`](Self::enqueue).
    ///
    /// # Errors
    ///
    /// As [`enqueue`](Self::enqueue); no message is inserted if any fails.
    pub async fn enqueue_all(
        &self,
        conn: &mut PgConnection,
        messages: &[NewMessage],
    ) -> Result<u64, StoreError> {
        if messages.is_empty() {
            return Ok(0);
        }
        let mut cols = BatchColumns::default();
        for m in messages {
            let (at, delay_ms) = availability(m);
            cols.id.push(*m.id().as_uuid());
            cols.destination.push(m.destination().to_owned());
            cols.event_type.push(m.event_type().to_owned());
            cols.aggregate_type
                .push(m.aggregate_type().map(str::to_owned));
            cols.aggregate_id.push(m.aggregate_id().map(str::to_owned));
            cols.partition_key
                .push(m.partition_key().map(str::to_owned));
            cols.tenant_id.push(m.tenant_id().map(str::to_owned));
            cols.idempotency_key.push(m.idempotency_key().to_owned());
            cols.payload.push(m.payload().to_vec());
            cols.content_type.push(m.content_type().to_owned());
            cols.headers.push(headers_json(m.headers()));
            cols.at.push(at);
            cols.delay_ms.push(delay_ms);
        }
        let done = sqlx::query(&self.sql.insert_batch)
            .bind(cols.id)
            .bind(cols.destination)
            .bind(cols.event_type)
            .bind(cols.aggregate_type)
            .bind(cols.aggregate_id)
            .bind(cols.partition_key)
            .bind(cols.tenant_id)
            .bind(cols.idempotency_key)
            .bind(cols.payload)
            .bind(cols.content_type)
            .bind(cols.headers)
            .bind(cols.at)
            .bind(cols.delay_ms)
            .execute(conn)
            .await
            .map_err(classify)?;
        Ok(done.rows_affected())
    }
}

#[derive(Default)]
struct BatchColumns {
    id: Vec<Uuid>,
    destination: Vec<String>,
    event_type: Vec<String>,
    aggregate_type: Vec<Option<String>>,
    aggregate_id: Vec<Option<String>>,
    partition_key: Vec<Option<String>>,
    tenant_id: Vec<Option<String>>,
    idempotency_key: Vec<String>,
    payload: Vec<Vec<u8>>,
    content_type: Vec<String>,
    headers: Vec<String>,
    at: Vec<Option<DateTime<Utc>>>,
    delay_ms: Vec<i64>,
}
