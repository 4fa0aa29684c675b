//! Conversions shared by the dialects.

use std::time::Duration;

#[cfg(any(feature = "postgres", feature = "mysql"))]
use chrono::DateTime;
use chrono::Utc;
#[cfg(any(feature = "postgres", feature = "mysql"))]
use outbox_engine::{Availability, NewMessage};
use outbox_engine::{ClaimRequest, Headers, Lease, LeaseToken};
#[cfg(any(feature = "postgres", feature = "sqlite"))]
use outbox_engine::{CompleteAction, Completion, PublishedRows};

/// A fresh lease for `request`, `lease_ms` from now by this host's clock (the rows'
/// deadline is set by the database's clock; this is the relay's own estimate).
pub(crate) fn lease(request: &ClaimRequest, lease_ms: i64) -> (LeaseToken, Lease) {
    let token = LeaseToken::new();
    let lease = Lease {
        owner: request.owner.clone(),
        token,
        until: Utc::now() + chrono::Duration::milliseconds(lease_ms),
    };
    (token, lease)
}

/// Splits completions into those that delete their row (published, in delete mode) and
/// those that update it.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) fn split_deleted(
    published: PublishedRows,
    completions: &[Completion],
) -> (Vec<&Completion>, Vec<&Completion>) {
    completions
        .iter()
        .partition(|c| published == PublishedRows::Delete && c.action == CompleteAction::Published)
}

/// A completion's delay in milliseconds and the error it records.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) fn completion_parts(action: &CompleteAction) -> (i64, Option<&str>) {
    match action {
        CompleteAction::Published => (0, None),
        CompleteAction::Retry { delay, error } | CompleteAction::Defer { delay, error } => {
            (millis(*delay), Some(error))
        }
        CompleteAction::Dead { reason } => (0, Some(reason)),
    }
}

/// A duration as whole milliseconds for binding, saturating.
pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// When a new message is due: an absolute instant, or a delay from the database's now.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn availability(message: &NewMessage) -> (Option<DateTime<Utc>>, i64) {
    match message.availability() {
        Availability::Now => (None, 0),
        Availability::After(delay) => (None, millis(delay)),
        Availability::At(at) => (Some(at), 0),
    }
}

pub(crate) fn headers_json(headers: &Headers) -> String {
    serde_json::to_string(headers).expect("string maps always serialize")
}

/// Reads the `headers` column; the error is a dead-letter reason naming the column.
pub(crate) fn headers_from_json(json: &str) -> Result<Headers, String> {
    serde_json::from_str(json)
        .map_err(|e| undecodable("headers", format!("not a JSON object of strings ({e})")))
}

/// Sets `message.headers` from the `headers` column's text. With `strict` off, headers
/// that cannot be read are left empty (for listing the dead letters such rows became).
pub(crate) fn read_headers(
    message: &mut outbox_engine::Message,
    json: &str,
    strict: bool,
) -> Result<(), String> {
    match headers_from_json(json) {
        Ok(headers) => message.headers = headers,
        Err(reason) if strict => return Err(reason),
        Err(_) => {}
    }
    Ok(())
}

/// The reason a claimed row that cannot be read as a message is dead-lettered with.
pub(crate) fn undecodable(column: &str, problem: impl std::fmt::Display) -> String {
    format!("undecodable row: column {column}: {problem}")
}

/// Reads a message id stored as text: only the lowercase hyphenated form the library
/// writes is accepted, because completions find rows by comparing that text.
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub(crate) fn stored_id(text: &str) -> Result<outbox_engine::MessageId, String> {
    match uuid::Uuid::parse_str(text) {
        Ok(id) if id.hyphenated().to_string() == text => {
            Ok(outbox_engine::MessageId::from_uuid(id))
        }
        _ => Err(undecodable(
            "id",
            format!("{text:?} is not a lowercase hyphenated UUID"),
        )),
    }
}

pub(crate) fn attempts(value: i64) -> u32 {
    u32::try_from(value.max(0)).unwrap_or(u32::MAX)
}

pub(crate) fn count(value: i64) -> u64 {
    u64::try_from(value.max(0)).unwrap_or(0)
}

pub(crate) fn limit(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Binds the ten message columns every insert takes between the id and the due time:
/// destination, event type, aggregate type and id, partition key, tenant, idempotency
/// key, payload, content type, headers.
pub(crate) fn bind_columns<'q, DB>(
    query: sqlx::query::Query<'q, DB, DB::Arguments<'q>>,
    m: &'q outbox_engine::NewMessage,
) -> sqlx::query::Query<'q, DB, DB::Arguments<'q>>
where
    DB: sqlx::Database,
    &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    Option<&'q str>: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    &'q [u8]: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    String: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    query
        .bind(m.destination())
        .bind(m.event_type())
        .bind(m.aggregate_type())
        .bind(m.aggregate_id())
        .bind(m.partition_key())
        .bind(m.tenant_id())
        .bind(m.idempotency_key())
        .bind(m.payload())
        .bind(m.content_type())
        .bind(headers_json(m.headers()))
}

/// `key` as the SQL stores keep ids in text (lowercase, hyphenated) when it is a UUID in
/// any spelling; otherwise `key` itself, which matches no id.
pub(crate) fn id_text(key: &str) -> String {
    uuid::Uuid::parse_str(key).map_or_else(|_| key.to_owned(), |id| id.to_string())
}
