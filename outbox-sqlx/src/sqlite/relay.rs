//! The relay on SQLite: every operation is one atomic statement (ids and completions
//! bound as JSON), so the relay never holds a transaction open.

use std::collections::HashSet;

use outbox_engine::{
    Claim, ClaimRequest, CompleteReport, Completion, LeaseToken, MessageId, StoreError,
};
use sqlx::Row;
use sqlx::sqlite::Sqlite;

use super::{SqliteOutbox, json_list};
use crate::common::{completion_parts, lease, limit, millis, split_deleted};
use crate::dialect::RelayDialect;
use crate::error::classify;
use crate::rows;

impl RelayDialect for Sqlite {
    async fn claim(store: &SqliteOutbox, request: &ClaimRequest) -> Result<Claim, StoreError> {
        let (token, lease) = lease(request, millis(request.lease));
        let token_text = token.as_uuid().to_string();
        let query = sqlx::query(store.sql.claim_for(request))
            .bind(limit(request.batch_size))
            .bind(&request.owner)
            .bind(&token_text)
            .bind(millis(request.lease));
        let query = match &request.destinations {
            None => query,
            Some(destinations) => query.bind(json_list(destinations)),
        };
        let rows = query.fetch_all(&store.pool).await.map_err(classify)?;
        let (messages, unreadable) = rows::claimed::<Self>(&rows);
        let mut claim = Claim::new(lease, messages);
        for (row, rejected) in unreadable {
            // By rowid, fenced by this claim's token: the id may be what is unreadable.
            let rowid: i64 = row.try_get("rowid").map_err(classify)?;
            sqlx::query(&store.sql.reject)
                .bind(&token_text)
                .bind(rowid)
                .bind(&rejected.reason)
                .execute(&store.pool)
                .await
                .map_err(classify)?;
            claim.rejected.push(rejected);
        }
        Ok(claim)
    }

    async fn complete(
        store: &SqliteOutbox,
        token: LeaseToken,
        completions: &[Completion],
    ) -> Result<CompleteReport, StoreError> {
        let token_text = token.as_uuid().to_string();
        let mut applied = HashSet::new();
        let (deleted, updated) = split_deleted(store.published, completions);
        if !deleted.is_empty() {
            let query = sqlx::query(&store.sql.delete_published)
                .bind(&token_text)
                .bind(json_list(deleted.iter().map(|c| c.id.to_string())));
            applied.extend(rows::returned_ids(&store.pool, query).await?);
        }
        if !updated.is_empty() {
            let items: Vec<serde_json::Value> = updated
                .iter()
                .map(|c| {
                    let (delay, error) = completion_parts(&c.action);
                    serde_json::json!({
                        "id": c.id.to_string(),
                        "status": outbox_sql::completion_status(&c.action),
                        "delay_ms": delay,
                        "error": error,
                    })
                })
                .collect();
            let query = sqlx::query(&store.sql.complete)
                .bind(&token_text)
                .bind(serde_json::Value::Array(items).to_string());
            applied.extend(rows::returned_ids(&store.pool, query).await?);
        }
        Ok(rows::completed(completions, &applied))
    }

    async fn release(
        store: &SqliteOutbox,
        token: LeaseToken,
        ids: &[MessageId],
    ) -> Result<HashSet<MessageId>, StoreError> {
        let query = sqlx::query(&store.sql.release)
            .bind(token.as_uuid().to_string())
            .bind(json_list(ids.iter().map(ToString::to_string)));
        rows::returned_ids(&store.pool, query).await
    }
}
