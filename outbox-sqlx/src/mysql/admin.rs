//! Dead letters and purge on MySQL: filters as `?` lists sized to the filter (the
//! statement is built for its shape), run in relay transactions.

use outbox_engine::{DeadLetterFilter, PurgeRequest, StoreError, StoreErrorKind};
use outbox_sql::mysql::{DeadFilterShape, Statements};
use sqlx::mysql::{MySql, MySqlArguments, MySqlRow};
use sqlx::query::Query;

use super::{MAX_FILTER_VALUES, MySqlOutbox, db_time, interval_ms};
use crate::common::{count, limit};
use crate::dialect::SqlDialect;
use crate::dialect::{AdminDialect, DeadChange, Listing};
use crate::error::classify;

impl AdminDialect for MySql {
    async fn listed_rows(
        store: &MySqlOutbox,
        listing: Listing,
        filter: &DeadLetterFilter,
        limit_rows: usize,
    ) -> Result<Vec<MySqlRow>, StoreError> {
        let shape = dead_shape(filter)?;
        let sql = match listing {
            Listing::Dead => store.sql.list_dead(shape),
            Listing::Waiting => store.sql.list_waiting(shape),
        };
        bind_dead_filter(sqlx::query(&sql).persistent(false), filter)
            .bind(limit(limit_rows))
            .fetch_all(&store.pool)
            .await
            .map_err(classify)
    }

    async fn find_rows(
        store: &MySqlOutbox,
        key: &str,
        limit_rows: usize,
    ) -> Result<Vec<MySqlRow>, StoreError> {
        sqlx::query(&store.sql.find())
            .bind(crate::common::id_text(key))
            .bind(key)
            .bind(limit(limit_rows))
            .fetch_all(&store.pool)
            .await
            .map_err(classify)
    }

    async fn count_dead(store: &MySqlOutbox, filter: &DeadLetterFilter) -> Result<u64, StoreError> {
        let sql = store.sql.count_dead(dead_shape(filter)?);
        let row = bind_dead_filter(sqlx::query(&sql).persistent(false), filter)
            .fetch_one(&store.pool)
            .await
            .map_err(classify)?;
        MySql::count(&row, "dead").map(count).map_err(classify)
    }

    async fn change_dead(
        store: &MySqlOutbox,
        change: DeadChange,
        filter: &DeadLetterFilter,
    ) -> Result<u64, StoreError> {
        let build = match change {
            DeadChange::Replay => Statements::replay_dead,
            DeadChange::Discard => Statements::discard_dead,
        };
        dead_execute(store, build, filter).await
    }

    /// Published rows first, then dead ones, at most a batch in all.
    async fn purge(store: &MySqlOutbox, request: &PurgeRequest) -> Result<u64, StoreError> {
        let sql = &store.sql;
        let batch = limit(request.batch_size);
        let mut tx = store.begin().await?;
        let mut deleted = sqlx::query(&sql.purge_published)
            .bind(interval_ms(request.published_older_than))
            .bind(batch)
            .execute(&mut *tx)
            .await
            .map_err(classify)?
            .rows_affected();
        if let Some(dead_age) = request.dead_older_than {
            let left = batch.saturating_sub(i64::try_from(deleted).unwrap_or(i64::MAX));
            if left > 0 {
                deleted += sqlx::query(&sql.purge_dead)
                    .bind(interval_ms(dead_age))
                    .bind(left)
                    .execute(&mut *tx)
                    .await
                    .map_err(classify)?
                    .rows_affected();
            }
        }
        tx.commit().await.map_err(classify)?;
        Ok(deleted)
    }
}

/// Runs one dead-letter statement in a relay transaction.
async fn dead_execute(
    store: &MySqlOutbox,
    build: impl Fn(&Statements, DeadFilterShape) -> String,
    filter: &DeadLetterFilter,
) -> Result<u64, StoreError> {
    let shape = dead_shape(filter)?;
    let sql = build(&store.sql, shape);
    let mut tx = store.begin().await?;
    let done = bind_dead_filter(sqlx::query(&sql).persistent(false), filter)
        .execute(&mut *tx)
        .await
        .map_err(classify)?;
    tx.commit().await.map_err(classify)?;
    Ok(done.rows_affected())
}

fn dead_shape(filter: &DeadLetterFilter) -> Result<DeadFilterShape, StoreError> {
    let values = filter.ids.len() + filter.destinations.len() + filter.event_types.len();
    if values > MAX_FILTER_VALUES {
        return Err(StoreError::new(
            StoreErrorKind::InvalidInput,
            format!(
                "a dead-letter filter may list at most {MAX_FILTER_VALUES} values, got {values}"
            ),
        ));
    }
    Ok(DeadFilterShape {
        ids: filter.ids.len(),
        destinations: filter.destinations.len(),
        event_types: filter.event_types.len(),
        after: filter.created_after.is_some(),
        before: filter.created_before.is_some(),
        error: filter.error_contains.is_some(),
        after_id: filter.after_id.is_some(),
    })
}

fn bind_dead_filter<'q>(
    mut query: Query<'q, MySql, MySqlArguments>,
    filter: &'q DeadLetterFilter,
) -> Query<'q, MySql, MySqlArguments> {
    for id in &filter.ids {
        query = query.bind(id.to_string());
    }
    for d in &filter.destinations {
        query = query.bind(d.as_str());
    }
    for e in &filter.event_types {
        query = query.bind(e.as_str());
    }
    if let Some(after) = filter.created_after {
        query = query.bind(db_time(after));
    }
    if let Some(before) = filter.created_before {
        query = query.bind(db_time(before));
    }
    if let Some(error) = &filter.error_contains {
        query = query.bind(error.as_str());
    }
    if let Some(id) = filter.after_id {
        query = query.bind(id.to_string());
    }
    query
}
