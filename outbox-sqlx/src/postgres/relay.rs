//! The relay on PostgreSQL: one statement leases a batch (`FOR UPDATE SKIP LOCKED`), one
//! completes it (arrays of ids, statuses, delays and errors), one gives rows back.

use std::collections::HashSet;

use outbox_engine::{
    Claim, ClaimRequest, CompleteReport, Completion, LeaseToken, MessageId, StoreError,
};
use sqlx::Row;
use sqlx::postgres::{PgArguments, Postgres};
use uuid::Uuid;

use super::PgOutbox;
use crate::common::{completion_parts, lease, limit, millis, split_deleted};
use crate::dialect::{RelayDialect, SqlDialect};
use crate::error::classify;
use crate::rows;

/// Runs a completion statement that reports as `outbox_sql`'s `report_stale` does: `None`
/// when it changed one row per id it was given, else the ids whose rows it changed.
async fn fenced<'q>(
    pool: &sqlx::PgPool,
    query: sqlx::query::Query<'q, Postgres, PgArguments>,
) -> Result<Option<HashSet<MessageId>>, StoreError> {
    let rows = query.fetch_all(pool).await.map_err(classify)?;
    if rows.is_empty() {
        return Ok(None);
    }
    let mut applied = HashSet::with_capacity(rows.len());
    for row in &rows {
        if row.try_get("applied").map_err(classify)? {
            applied.insert(Postgres::id(row, "id").map_err(rows::schema)?);
        }
    }
    Ok(Some(applied))
}

impl RelayDialect for Postgres {
    async fn claim(store: &PgOutbox, request: &ClaimRequest) -> Result<Claim, StoreError> {
        let (token, lease) = lease(request, millis(request.lease));
        let statement = store.sql.claim_for(request);
        let query = sqlx::query(statement)
            .bind(limit(request.batch_size))
            .bind(&request.owner)
            .bind(token.as_uuid())
            .bind(millis(request.lease));
        let query = match &request.destinations {
            None => query,
            Some(destinations) => query.bind(destinations),
        };
        let rows = query.fetch_all(&store.pool).await.map_err(classify)?;
        let (messages, unreadable) = rows::claimed::<Self>(&rows);
        let mut claim = Claim::new(lease, messages);
        let mut deaths = Vec::with_capacity(unreadable.len());
        for (row, rejected) in unreadable {
            // The id column is a uuid, so it always reads.
            let id = Self::id(row, "id").map_err(rows::schema)?;
            deaths.push(Completion::dead(id, rejected.reason.clone()));
            claim.rejected.push(rejected);
        }
        if !deaths.is_empty() {
            // Fenced by this claim's own token: the rows are ours until it completes them.
            Self::complete(store, token, &deaths).await?;
        }
        Ok(claim)
    }

    async fn complete(
        store: &PgOutbox,
        token: LeaseToken,
        completions: &[Completion],
    ) -> Result<CompleteReport, StoreError> {
        let (deleted, updated) = split_deleted(store.published, completions);
        let mut parts = Vec::with_capacity(2);
        if !deleted.is_empty() {
            let ids: Vec<Uuid> = deleted.iter().map(|c| *c.id.as_uuid()).collect();
            let query = sqlx::query(&store.sql.delete_published)
                .bind(token.as_uuid())
                .bind(ids);
            parts.push((deleted, fenced(&store.pool, query).await?));
        }
        if !updated.is_empty() {
            let mut ids = Vec::with_capacity(updated.len());
            let mut statuses = Vec::with_capacity(updated.len());
            let mut delays = Vec::with_capacity(updated.len());
            let mut errors = Vec::with_capacity(updated.len());
            for c in &updated {
                let (delay, error) = completion_parts(&c.action);
                ids.push(*c.id.as_uuid());
                statuses.push(outbox_sql::completion_status(&c.action));
                delays.push(delay);
                errors.push(error);
            }
            let query = sqlx::query(&store.sql.complete)
                .bind(token.as_uuid())
                .bind(ids)
                .bind(statuses)
                .bind(delays)
                .bind(errors);
            parts.push((updated, fenced(&store.pool, query).await?));
        }
        if parts.iter().all(|(_, applied)| applied.is_none()) {
            // Each statement changed one row per id it was given: every id was distinct
            // and applied.
            return Ok(CompleteReport {
                applied: completions.len(),
                stale: Vec::new(),
            });
        }
        let mut applied = HashSet::with_capacity(completions.len());
        for (part, changed) in parts {
            match changed {
                Some(changed) => applied.extend(changed),
                None => applied.extend(part.iter().map(|c| c.id)),
            }
        }
        Ok(rows::completed(completions, &applied))
    }

    async fn release(
        store: &PgOutbox,
        token: LeaseToken,
        ids: &[MessageId],
    ) -> Result<HashSet<MessageId>, StoreError> {
        let uuids: Vec<Uuid> = ids.iter().map(|id| *id.as_uuid()).collect();
        let query = sqlx::query(&store.sql.release)
            .bind(token.as_uuid())
            .bind(uuids);
        rows::returned_ids(&store.pool, query).await
    }
}
