//! The relay on MySQL: short `READ COMMITTED` transactions. A claim selects with
//! `FOR UPDATE SKIP LOCKED` and leases what it selected; a completion or release locks
//! the rows still leased with its token and changes only those.

use std::collections::HashSet;

use outbox_engine::{
    Claim, ClaimRequest, CompleteAction, CompleteReport, Completion, DeadHead, LeaseToken, Message,
    MessageId, MessageOrder, PublishedRows, StoreError, StoreErrorKind,
};
use outbox_sql::mysql::{MAX_ERROR_BYTES, MAX_OWNER_CHARS, Statements};
use sqlx::Row;
use sqlx::mysql::{MySql, MySqlConnection, MySqlRow};

use super::{ID_CHUNK, MySqlOutbox, bind_ids, clip_bytes, clip_chars, interval_ms, padded};
use crate::common::{lease, limit};
use crate::dialect::RelayDialect;
use crate::error::classify;
use crate::rows;

impl RelayDialect for MySql {
    async fn claim(store: &MySqlOutbox, request: &ClaimRequest) -> Result<Claim, StoreError> {
        let lease_ms = interval_ms(request.lease);
        let (token, lease) = lease(request, lease_ms);
        let destinations = request.destinations.as_deref().unwrap_or_default();
        if request.batch_size == 0 || request.destinations.as_ref().is_some_and(Vec::is_empty) {
            return Ok(Claim::new(lease, Vec::new()));
        }
        let sql = &store.sql;
        let halt = match request.ordering {
            MessageOrder::PerKey(policy) => Some(policy == DeadHead::Halt),
            _ => None,
        };
        let mut tx = store.begin().await?;
        let rows = match halt {
            Some(halt) => {
                store
                    .lock_ordered(&mut tx, destinations, request.batch_size, halt)
                    .await?
            }
            None => {
                let select = sql.claim_select(destinations.len());
                let mut query = sqlx::query(&select);
                for d in destinations {
                    query = query.bind(d.as_str());
                }
                query
                    .bind(limit(request.batch_size))
                    .fetch_all(&mut *tx)
                    .await
                    .map_err(classify)?
            }
        };
        if rows.is_empty() {
            tx.commit().await.map_err(classify)?;
            return Ok(Claim::new(lease, Vec::new()));
        }
        let (mut messages, unreadable) = rows::claimed::<MySql>(&rows);
        let mut rejected = Vec::with_capacity(unreadable.len());
        for (_, r) in unreadable {
            // The row is locked by this transaction: dead-letter it in place.
            sqlx::query(&sql.reject)
                .bind(clip_bytes(&r.reason, MAX_ERROR_BYTES))
                .bind(&r.id)
                .execute(&mut *tx)
                .await
                .map_err(classify)?;
            rejected.push(r);
        }
        if let Some(halt) = halt {
            store.keep_heads(&mut tx, &mut messages, halt).await?;
            if messages.is_empty() {
                tx.commit().await.map_err(classify)?;
                return Ok(Claim {
                    lease,
                    messages,
                    rejected,
                });
            }
        }
        let ids: Vec<MessageId> = messages.iter().map(|m| m.id).collect();
        let owner = clip_chars(&request.owner, MAX_OWNER_CHARS);
        let token_text = token.as_uuid().to_string();
        for chunk in ids.chunks(ID_CHUNK) {
            let n = padded(chunk.len());
            let lease_sql = sql.claim_lease(n);
            let query = sqlx::query(&lease_sql)
                .bind(owner)
                .bind(&token_text)
                .bind(lease_ms)
                .bind(lease_ms);
            let done = bind_ids(query, chunk, n)
                .execute(&mut *tx)
                .await
                .map_err(classify)?;
            if done.rows_affected() != chunk.len() as u64 {
                // Cannot happen while the rows are locked; refuse rather than hand out
                // rows that are not leased.
                return Err(StoreError::new(
                    StoreErrorKind::Other,
                    format!(
                        "leased {} of {} locked rows",
                        done.rows_affected(),
                        chunk.len()
                    ),
                ));
            }
        }
        tx.commit().await.map_err(classify)?;
        for m in &mut messages {
            m.attempts = m.attempts.saturating_add(1);
        }
        Ok(Claim {
            lease,
            messages,
            rejected,
        })
    }

    async fn complete(
        store: &MySqlOutbox,
        token: LeaseToken,
        completions: &[Completion],
    ) -> Result<CompleteReport, StoreError> {
        let ids = unique(completions.iter().map(|c| c.id));
        let mut tx = store.begin().await?;
        let held = store.lock_leased(&mut tx, token, &ids).await?;
        if held.is_empty() {
            tx.rollback().await.map_err(classify)?;
            return Ok(rows::completed(completions, &held));
        }
        let token_text = token.as_uuid().to_string();
        let sql = &store.sql;
        let mut published = Vec::new();
        let mut done = HashSet::new();
        for c in completions {
            if !held.contains(&c.id) || !done.insert(c.id) {
                continue;
            }
            let query = match &c.action {
                CompleteAction::Published => {
                    published.push(c.id);
                    continue;
                }
                CompleteAction::Retry { delay, error } | CompleteAction::Defer { delay, error } => {
                    let statement = match c.action {
                        CompleteAction::Defer { .. } => &sql.defer,
                        _ => &sql.retry,
                    };
                    sqlx::query(statement)
                        .bind(interval_ms(*delay))
                        .bind(clip_bytes(error, MAX_ERROR_BYTES))
                }
                CompleteAction::Dead { reason } => {
                    sqlx::query(&sql.dead).bind(clip_bytes(reason, MAX_ERROR_BYTES))
                }
            };
            // Every row statement ends with the row's id and the lease token.
            query
                .bind(c.id.to_string())
                .bind(&token_text)
                .execute(&mut *tx)
                .await
                .map_err(classify)?;
        }
        if !published.is_empty() {
            match store.published {
                // No slots on MySQL: `migrate` refuses `Rotate`.
                PublishedRows::Keep | PublishedRows::Rotate => {
                    store
                        .for_ids(&mut tx, Statements::publish, &published, token)
                        .await?
                }
                PublishedRows::Delete => {
                    store
                        .for_ids(&mut tx, Statements::delete_published, &published, token)
                        .await?
                }
            };
        }
        tx.commit().await.map_err(classify)?;
        Ok(rows::completed(completions, &held))
    }

    async fn release(
        store: &MySqlOutbox,
        token: LeaseToken,
        ids: &[MessageId],
    ) -> Result<HashSet<MessageId>, StoreError> {
        let unique_ids = unique(ids.iter().copied());
        let mut tx = store.begin().await?;
        let held = store.lock_leased(&mut tx, token, &unique_ids).await?;
        if held.is_empty() {
            tx.rollback().await.map_err(classify)?;
        } else {
            let held_ids: Vec<MessageId> = unique_ids
                .iter()
                .copied()
                .filter(|id| held.contains(id))
                .collect();
            store
                .for_ids(&mut tx, Statements::release, &held_ids, token)
                .await?;
            tx.commit().await.map_err(classify)?;
        }
        Ok(held)
    }
}

impl MySqlOutbox {
    /// The ids of `ids` still leased with `token`, locked until the transaction ends.
    async fn lock_leased(
        &self,
        tx: &mut MySqlConnection,
        token: LeaseToken,
        ids: &[MessageId],
    ) -> Result<HashSet<MessageId>, StoreError> {
        let token = token.as_uuid().to_string();
        let mut held = HashSet::with_capacity(ids.len());
        for chunk in ids.chunks(ID_CHUNK) {
            let n = padded(chunk.len());
            let sql = self.sql.lock_leased(n);
            let rows = bind_ids(sqlx::query(&sql), chunk, n)
                .bind(&token)
                .fetch_all(&mut *tx)
                .await
                .map_err(classify)?;
            held.extend(rows::ids::<MySql>(&rows)?);
        }
        Ok(held)
    }

    /// Locks the rows an ordered claim may lease, at most `batch`: the heads in a window
    /// of due rows (four times the batch), and when that window is full but held fewer,
    /// the due heads of every pair and the earliest unkeyed rows (decision 0034).
    async fn lock_ordered(
        &self,
        tx: &mut MySqlConnection,
        destinations: &[String],
        batch: usize,
        halt: bool,
    ) -> Result<Vec<MySqlRow>, StoreError> {
        let sql = &self.sql;
        let window = batch.saturating_mul(4);
        // Ids are `ascii_bin` text, which the driver reports as binary: read them unchecked.
        let text = |row: &MySqlRow, column| row.try_get_unchecked::<String, _>(column);
        let end = sqlx::query(&sql.window_end)
            .bind(limit(window - 1))
            .fetch_optional(&mut *tx)
            .await
            .map_err(classify)?
            .map(|row| {
                Ok::<_, sqlx::Error>((row.try_get::<chrono::NaiveDateTime, _>(0)?, text(&row, 1)?))
            })
            .transpose()
            .map_err(classify)?;
        let select = sql.claim_select_ordered(destinations.len(), halt, end.is_some());
        let mut query = sqlx::query(&select);
        for d in destinations {
            query = query.bind(d.as_str());
        }
        if let Some((at, id)) = &end {
            query = query.bind(at).bind(at).bind(id.as_str());
        }
        let mut rows = query
            .bind(limit(batch))
            .fetch_all(&mut *tx)
            .await
            .map_err(classify)?;
        if end.is_none() || rows.len() >= batch {
            // Either every due row was tested, or the window held enough heads.
            return Ok(rows);
        }
        // The heads past the window and the unkeyed rows: two statements, since MariaDB
        // loses the loose index scan when one `UNION` holds both; and prepared afresh each
        // time, since it also loses it when it executes a kept prepared statement again.
        let mut found = Vec::new();
        for (statement, filters) in [
            (
                sql.claim_heads(destinations.len(), halt),
                if halt { 3 } else { 2 },
            ),
            (sql.claim_unkeyed(destinations.len()), 1),
        ] {
            let mut query = sqlx::query(&statement).persistent(false);
            for d in std::iter::repeat_n(destinations, filters).flatten() {
                query = query.bind(d.as_str());
            }
            let rows = query
                .bind(limit(batch))
                .fetch_all(&mut *tx)
                .await
                .map_err(classify)?;
            for row in &rows {
                let due: chrono::NaiveDateTime = row.try_get(1).map_err(classify)?;
                found.push((due, text(row, 0).map_err(classify)?));
            }
        }
        // The earliest first, without the rows the walk locked (a transaction's own locks
        // are not skipped), as many as the batch still wants.
        found.sort();
        let mut seen: HashSet<String> = rows
            .iter()
            .map(|row| text(row, 0))
            .collect::<Result<_, _>>()
            .map_err(classify)?;
        let candidates: Vec<String> = found
            .into_iter()
            .map(|(_, id)| id)
            .filter(|id| seen.insert(id.clone()))
            .take(batch - rows.len())
            .collect();
        for chunk in candidates.chunks(ID_CHUNK) {
            let n = padded(chunk.len());
            let lock = sql.claim_candidates(n);
            let query = bind_ids(sqlx::query(&lock), chunk, n);
            rows.extend(query.fetch_all(&mut *tx).await.map_err(classify)?);
        }
        Ok(rows)
    }

    /// Drops the keyed candidates of an ordered claim that a fresh read shows are not the
    /// heads of their keys (see `outbox_sql::mysql`, "Per-key ordering": the claim's own
    /// check can miss a predecessor committed during its scan).
    async fn keep_heads(
        &self,
        tx: &mut MySqlConnection,
        messages: &mut Vec<Message>,
        halt: bool,
    ) -> Result<(), StoreError> {
        let keyed: Vec<MessageId> = messages
            .iter()
            .filter(|m| m.partition_key.is_some())
            .map(|m| m.id)
            .collect();
        if keyed.is_empty() {
            return Ok(());
        }
        let mut heads = HashSet::with_capacity(keyed.len());
        for chunk in keyed.chunks(ID_CHUNK) {
            let n = padded(chunk.len());
            let sql = self.sql.heads(n, halt);
            let rows = bind_ids(sqlx::query(&sql), chunk, n)
                .fetch_all(&mut *tx)
                .await
                .map_err(classify)?;
            heads.extend(rows::ids::<MySql>(&rows)?);
        }
        messages.retain(|m| m.partition_key.is_none() || heads.contains(&m.id));
        Ok(())
    }

    /// Runs a list statement (`ids…, token`) over `ids` in padded chunks.
    async fn for_ids(
        &self,
        tx: &mut MySqlConnection,
        build: impl Fn(&Statements, usize) -> String,
        ids: &[MessageId],
        token: LeaseToken,
    ) -> Result<u64, StoreError> {
        let token = token.as_uuid().to_string();
        let mut changed = 0;
        for chunk in ids.chunks(ID_CHUNK) {
            let n = padded(chunk.len());
            let sql = build(&self.sql, n);
            changed += bind_ids(sqlx::query(&sql), chunk, n)
                .bind(&token)
                .execute(&mut *tx)
                .await
                .map_err(classify)?
                .rows_affected();
        }
        Ok(changed)
    }
}

/// The ids in order, each once.
fn unique(ids: impl Iterator<Item = MessageId>) -> Vec<MessageId> {
    let mut seen = HashSet::new();
    ids.filter(|id| seen.insert(*id)).collect()
}
