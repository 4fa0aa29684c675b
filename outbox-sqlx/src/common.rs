//! Conversions shared by the dialects: the table's value conventions (from `outbox-sql`,
//! shared with every backend) and the sqlx binding of a message's columns.

// Each dialect uses some of these; a build with one dialect leaves the others unused.
#[allow(unused_imports)]
pub(crate) use outbox_sql::values::{
    attempts, availability, completion_parts, count, headers_json, id_text, lease, limit, millis,
    read_headers, split_deleted, stored_id, undecodable,
};

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
