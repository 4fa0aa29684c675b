//! Dead letters and purge, written once for the dialects whose dead-letter statements
//! take the whole filter as bound values and whose purge is one statement (PostgreSQL,
//! SQLite). MySQL builds its statements for each filter's shape instead.

use outbox_engine::{DeadLetterFilter, PublishedRows, PurgeRequest, StoreError, StoreErrorKind};
use outbox_sql::Admin;
use sqlx::query::Query;

use crate::common::{limit, millis};
use crate::dialect::{AdminDialect, DeadChange, Listing, SqlDialect};
use crate::error::classify;
use crate::store::SqlOutbox;

/// A dialect whose dead-letter statements bind the whole filter.
#[doc(hidden)]
pub trait FilteredDialect: SqlDialect {
    /// The statements that list, count, replay and discard dead letters, and the purge.
    fn admin(sql: &Self::Statements) -> &Admin;

    /// `statement` with `filter` bound: ids, destinations, event types, created after,
    /// created before, error text, ids above, each `NULL` when not filtered on.
    fn dead_query<'q>(
        statement: &'q str,
        filter: &DeadLetterFilter,
    ) -> Query<'q, Self, Self::Arguments<'q>>;

    /// The `find` statement with `key` bound as an id (as the dialect stores ids) and as
    /// an idempotency key.
    fn find_query<'q>(statement: &'q str, key: &str) -> Query<'q, Self, Self::Arguments<'q>>;

    /// The purge of the `rotate` layout: `rotate_prepare` and `rotate`, to run in this
    /// order, each in its own transaction, both taking `(published age ms, dead age ms or
    /// NULL)`; the second returns `emptied`. `None` where the dialect has no slots.
    fn rotation(_sql: &Self::Statements) -> Option<[&str; 2]> {
        None
    }
}

impl<DB> AdminDialect for DB
where
    DB: FilteredDialect,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    for<'q> i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> Option<i64>: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    async fn listed_rows(
        store: &SqlOutbox<DB>,
        listing: Listing,
        filter: &DeadLetterFilter,
        limit_rows: usize,
    ) -> Result<Vec<DB::Row>, StoreError> {
        let admin = DB::admin(&store.sql);
        let statement = match listing {
            Listing::Dead => &admin.list_dead,
            Listing::Waiting => &admin.list_waiting,
        };
        DB::dead_query(statement, filter)
            .bind(limit(limit_rows))
            .fetch_all(&store.pool)
            .await
            .map_err(classify)
    }

    async fn count_dead(
        store: &SqlOutbox<DB>,
        filter: &DeadLetterFilter,
    ) -> Result<u64, StoreError> {
        let row = DB::dead_query(&DB::admin(&store.sql).count_dead, filter)
            .fetch_one(&store.pool)
            .await
            .map_err(classify)?;
        DB::count(&row, "dead")
            .map(crate::common::count)
            .map_err(classify)
    }

    async fn change_dead(
        store: &SqlOutbox<DB>,
        change: DeadChange,
        filter: &DeadLetterFilter,
    ) -> Result<u64, StoreError> {
        let admin = DB::admin(&store.sql);
        let statement = match change {
            DeadChange::Replay => &admin.replay_dead,
            DeadChange::Discard => &admin.discard_dead,
        };
        let done = DB::dead_query(statement, filter)
            .execute(&store.pool)
            .await
            .map_err(classify)?;
        Ok(DB::rows_affected(&done))
    }

    async fn find_rows(
        store: &SqlOutbox<DB>,
        key: &str,
        limit_rows: usize,
    ) -> Result<Vec<DB::Row>, StoreError> {
        DB::find_query(&DB::admin(&store.sql).find, key)
            .bind(limit(limit_rows))
            .fetch_all(&store.pool)
            .await
            .map_err(classify)
    }

    /// One statement taking `(published age ms, dead age ms or NULL, limit)`; in the
    /// `rotate` layout, the two calls of a rotation instead, which empties a whole slot
    /// or nothing.
    async fn purge(store: &SqlOutbox<DB>, request: &PurgeRequest) -> Result<u64, StoreError> {
        if store.published == PublishedRows::Rotate {
            outbox_sql::check_published_rows(DB::DIALECT, store.published)
                .map_err(|e| StoreError::new(StoreErrorKind::Schema, e))?;
            let [prepare, rotate] =
                DB::rotation(&store.sql).expect("checked: the dialect has slots");
            let rotation = |sql| {
                sqlx::query(sql)
                    .bind(millis(request.published_older_than))
                    .bind(request.dead_older_than.map(millis))
            };
            rotation(prepare)
                .execute(&store.pool)
                .await
                .map_err(classify)?;
            let row = rotation(rotate)
                .fetch_one(&store.pool)
                .await
                .map_err(classify)?;
            return DB::count(&row, "emptied")
                .map(crate::common::count)
                .map_err(classify);
        }
        let done = sqlx::query(&DB::admin(&store.sql).purge)
            .bind(millis(request.published_older_than))
            .bind(request.dead_older_than.map(millis))
            .bind(limit(request.batch_size))
            .execute(&store.pool)
            .await
            .map_err(classify)?;
        Ok(DB::rows_affected(&done))
    }
}
