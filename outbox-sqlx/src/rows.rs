//! Reading the rows every dialect returns — messages, dead letters, stats, returned ids —
//! through the dialect's column readers.

use std::collections::HashSet;
use std::time::Duration;

use outbox_engine::{
    CompleteReport, Completion, DeadLetter, DestinationGauges, DestinationStats, FoundMessage,
    Message, MessageId, Rejected, Status, StoreError, StoreErrorKind, Waited, WaitedSince,
};

use crate::common::{attempts, count, read_headers, undecodable};
use crate::dialect::{Column, SqlDialect};
use crate::error::classify;

/// A required text column; the error is a reason naming the column.
fn text<DB: SqlDialect>(row: &DB::Row, column: impl Into<Column>) -> Result<String, String> {
    let column = column.into();
    optional::<DB>(row, column)?.ok_or_else(|| undecodable(column.name(), "is NULL"))
}

fn optional<DB: SqlDialect>(
    row: &DB::Row,
    column: impl Into<Column>,
) -> Result<Option<String>, String> {
    let column = column.into();
    DB::text(row, column).map_err(|e| undecodable(column.name(), e))
}

/// Declares [`MessageColumns`], one field per column, named as the column.
macro_rules! message_columns {
    ($($column:ident),* $(,)?) => {
        /// The columns a message is read from, and the wait a claim returns.
        struct MessageColumns {
            $($column: Column,)*
        }

        impl MessageColumns {
            /// Each column by its name.
            fn named() -> Self {
                Self { $($column: stringify!($column).into(),)* }
            }

            /// The columns where they are in `row`, and so in every row of its result.
            fn located(row: &impl sqlx::Row) -> Self {
                Self { $($column: Column::from(stringify!($column)).located(row),)* }
            }

            /// The columns, read whole from a row of their result.
            fn verified(&self) -> Self {
                Self { $($column: self.$column.verified(),)* }
            }
        }
    };
}

message_columns!(
    id,
    destination,
    event_type,
    payload,
    content_type,
    idempotency_key,
    attempts,
    created_at,
    aggregate_type,
    aggregate_id,
    partition_key,
    tenant_id,
    headers,
    waited_ms,
    from_commit,
);

/// Reads a claimed or dead row; the error names the column that could not be read. With
/// `strict_headers` off, headers that cannot be read are left empty (for listing the dead
/// letters such rows became).
pub(crate) fn message<DB: SqlDialect>(
    row: &DB::Row,
    strict_headers: bool,
) -> Result<Message, String> {
    message_in::<DB>(row, &MessageColumns::named(), strict_headers)
}

/// Reads a row of a result whose columns are `c`.
fn message_in<DB: SqlDialect>(
    row: &DB::Row,
    c: &MessageColumns,
    strict_headers: bool,
) -> Result<Message, String> {
    let mut m = Message::from_parts(
        DB::id(row, c.id)?,
        text::<DB>(row, c.destination)?,
        text::<DB>(row, c.event_type)?,
        DB::payload(row, c.payload).map_err(|e| undecodable("payload", e))?,
        text::<DB>(row, c.content_type)?,
        text::<DB>(row, c.idempotency_key)?,
        attempts(DB::attempts(row, c.attempts).map_err(|e| undecodable("attempts", e))?),
        DB::time(row, c.created_at)?.ok_or_else(|| undecodable("created_at", "is NULL"))?,
    );
    m.aggregate_type = optional::<DB>(row, c.aggregate_type)?;
    m.aggregate_id = optional::<DB>(row, c.aggregate_id)?;
    m.partition_key = optional::<DB>(row, c.partition_key)?;
    m.tenant_id = optional::<DB>(row, c.tenant_id)?;
    read_headers(&mut m, &text::<DB>(row, c.headers)?, strict_headers)?;
    Ok(m)
}

/// Splits claimed rows into the messages and the rows that cannot be read, each with its
/// [`Rejected`] report (the dialect dead-letters those rows).
pub(crate) fn claimed<DB: SqlDialect>(
    rows: &[DB::Row],
) -> (Vec<Message>, Vec<(&DB::Row, Rejected)>) {
    let mut messages = Vec::with_capacity(rows.len());
    let mut rejected = Vec::new();
    let Some(first) = rows.first() else {
        return (messages, rejected);
    };
    let mut columns = MessageColumns::located(first);
    let mut verified = false;
    for row in rows {
        match message_in::<DB>(row, &columns, true) {
            Ok(mut m) => {
                m.waited = waited::<DB>(row, &columns);
                messages.push(m);
                if DB::TYPED_COLUMNS && !verified {
                    verified = true;
                    columns = columns.verified();
                }
            }
            Err(reason) => rejected.push((
                row,
                Rejected {
                    id: DB::raw_id(row),
                    destination: DB::text(row, columns.destination).ok().flatten(),
                    reason,
                },
            )),
        }
    }
    (messages, rejected)
}

/// The wait a claim returns, `waited_ms`: from the commit or the transaction's start on
/// PostgreSQL, which says which in `from_commit`; from the insert on SQLite and MySQL,
/// which have no such column.
fn waited<DB: SqlDialect>(row: &DB::Row, c: &MessageColumns) -> Option<Waited> {
    let ms = DB::count(row, c.waited_ms).ok()?;
    let since = match DB::count(row, c.from_commit) {
        Ok(1) => WaitedSince::Commit,
        Ok(_) => WaitedSince::TransactionStart,
        Err(_) => WaitedSince::Insert,
    };
    Some(outbox_sql::values::waited(ms, since))
}

/// A dead row as a dead letter: its message, `last_error` and `dead_at`.
pub(crate) fn dead_letter<DB: SqlDialect>(row: &DB::Row) -> Result<DeadLetter, String> {
    Ok(DeadLetter {
        message: message::<DB>(row, false)?,
        reason: optional::<DB>(row, "last_error")?.unwrap_or_default(),
        dead_at: DB::time(row, "dead_at")?.ok_or_else(|| undecodable("dead_at", "is NULL"))?,
    })
}

/// A row's message, `status` and `last_error`: what the `find` and `list_waiting`
/// statements share.
fn found_message<DB: SqlDialect>(row: &DB::Row) -> Result<FoundMessage, String> {
    let status = text::<DB>(row, "status")?;
    let status =
        Status::parse(&status).ok_or_else(|| undecodable("status", format!("{status:?}")))?;
    let mut found = FoundMessage::new(message::<DB>(row, false)?, status);
    found.last_error = optional::<DB>(row, "last_error")?;
    Ok(found)
}

/// A row of the `find` statement: its message, status, failure and finish times.
pub(crate) fn found<DB: SqlDialect>(row: &DB::Row) -> Result<FoundMessage, String> {
    let mut found = found_message::<DB>(row)?;
    found.published_at = DB::time(row, "published_at")?;
    found.dead_at = DB::time(row, "dead_at")?;
    Ok(found)
}

/// A row of the `list_waiting` statement: its message, status, last failure and next
/// attempt.
pub(crate) fn waiting<DB: SqlDialect>(row: &DB::Row) -> Result<FoundMessage, String> {
    let mut found = found_message::<DB>(row)?;
    found.next_attempt = DB::time(row, "available_at")?;
    Ok(found)
}

/// A row of the `stats` statement.
pub(crate) fn destination_stats<DB: SqlDialect>(
    row: &DB::Row,
) -> Result<DestinationStats, StoreError> {
    let mut d = DestinationStats::new(text::<DB>(row, "destination").map_err(schema)?);
    let n = |column: &'static str| DB::count(row, column).map(count).map_err(classify);
    d.pending = n("pending")?;
    d.leased = n("leased")?;
    d.dead = n("dead")?;
    d.published = n("published")?;
    d.oldest_pending_created_at = DB::time(row, "oldest").map_err(schema)?;
    Ok(d)
}

/// A row of the `gauges_unfinished` statement.
pub(crate) fn unfinished_gauges<DB: SqlDialect>(
    row: &DB::Row,
) -> Result<DestinationGauges, StoreError> {
    let mut d = DestinationGauges::new(text::<DB>(row, "destination").map_err(schema)?);
    let n = |column: &'static str| DB::count(row, column).map(count).map_err(classify);
    d.pending = n("pending")?;
    d.leased = n("leased")?;
    d.oldest_pending_age = Some(Duration::from_millis(n("oldest_ms")?));
    Ok(d)
}

/// A row of the `gauges_dead` statement: the destination and its dead letters.
pub(crate) fn dead_gauge<DB: SqlDialect>(row: &DB::Row) -> Result<(String, u64), StoreError> {
    Ok((
        text::<DB>(row, "destination").map_err(schema)?,
        count(DB::count(row, "dead").map_err(classify)?),
    ))
}

/// A row of the `halted_keys` statement: the destination and its halted keys.
pub(crate) fn halted_keys<DB: SqlDialect>(row: &DB::Row) -> Result<(String, u64), StoreError> {
    Ok((
        text::<DB>(row, "destination").map_err(schema)?,
        count(DB::count(row, "halted").map_err(classify)?),
    ))
}

/// The ids a statement returned (`RETURNING id`, or a locking `SELECT id`).
pub(crate) fn ids<DB: SqlDialect>(rows: &[DB::Row]) -> Result<HashSet<MessageId>, StoreError> {
    // Sized up front: collecting through `Result` gives the set no size hint, and growing
    // it rehashes every id several times per batch.
    let mut ids = HashSet::with_capacity(rows.len());
    for row in rows {
        ids.insert(DB::id(row, "id").map_err(schema)?);
    }
    Ok(ids)
}

/// The report of `completions`, of which the rows of `applied` changed.
pub(crate) fn completed(
    completions: &[Completion],
    applied: &HashSet<MessageId>,
) -> CompleteReport {
    outbox_sql::values::report(completions.iter().map(|c| c.id), applied)
}

/// Runs a statement that returns the ids it changed (`RETURNING id`).
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) async fn returned_ids<'q, DB>(
    pool: &sqlx::Pool<DB>,
    query: sqlx::query::Query<'q, DB, DB::Arguments<'q>>,
) -> Result<HashSet<MessageId>, StoreError>
where
    DB: SqlDialect,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
{
    ids::<DB>(&query.fetch_all(pool).await.map_err(classify)?)
}

/// A stored value the schema does not allow.
pub(crate) fn schema(reason: String) -> StoreError {
    StoreError::new(StoreErrorKind::Schema, reason)
}
