//! The outbox table as diesel `table!`s, one per dialect, for querying it with diesel's
//! DSL (reports, admin pages, tests). They describe the default table name `outbox`;
//! write through [`DieselOutbox`](crate::DieselOutbox), whose statements keep the row
//! states consistent, rather than updating rows with the DSL.
//!
//! ```
//! # #[cfg(feature = "postgres")] {
//! use diesel::prelude::*;
//! use outbox_diesel::schema::postgres::outbox;
//!
//! // The dead letters of one destination, oldest first.
//! let query = outbox::table
//!     .filter(outbox::status.eq("dead").and(outbox::destination.eq("billing")))
//!     .order(outbox::id)
//!     .select((outbox::id, outbox::last_error));
//! let sql = diesel::debug_query::<diesel::pg::Pg, _>(&query).to_string();
//! assert!(sql.contains("\"outbox\".\"status\" = $1"), "{sql}");
//! # }
//! ```

/// PostgreSQL: ids and lease tokens are `uuid`, times `timestamptz`, headers `jsonb`.
#[cfg(feature = "postgres")]
pub mod postgres {
    diesel::table! {
        /// The outbox table (`outbox_sql` migrations, PostgreSQL).
        outbox (id) {
            /// The message id (UUIDv7).
            id -> Uuid,
            /// The route name.
            destination -> Text,
            /// The event type.
            event_type -> Text,
            /// The aggregate type, if any.
            aggregate_type -> Nullable<Text>,
            /// The aggregate id, if any.
            aggregate_id -> Nullable<Text>,
            /// The ordering key, if any.
            partition_key -> Nullable<Text>,
            /// The tenant, if any.
            tenant_id -> Nullable<Text>,
            /// The key receivers deduplicate on.
            idempotency_key -> Text,
            /// The payload bytes.
            payload -> Bytea,
            /// The payload's content type.
            content_type -> Text,
            /// The message's headers, a JSON object of strings.
            headers -> Jsonb,
            /// `pending`, `leased`, `published` or `dead`.
            status -> Text,
            /// Claims so far.
            attempts -> Int4,
            /// Due time of a pending row, lease deadline of a leased one, NULL when finished.
            available_at -> Nullable<Timestamptz>,
            /// The relay holding the lease.
            lease_owner -> Nullable<Text>,
            /// The lease's fencing token.
            lease_token -> Nullable<Uuid>,
            /// When the lease lapses.
            lease_until -> Nullable<Timestamptz>,
            /// The latest failure.
            last_error -> Nullable<Text>,
            /// When the row was inserted (the enqueueing transaction's start).
            created_at -> Timestamptz,
            /// When it was published.
            published_at -> Nullable<Timestamptz>,
            /// When it was dead-lettered.
            dead_at -> Nullable<Timestamptz>,
            /// Its position within its partition key, in commit order.
            seq -> Nullable<Int8>,
            /// The enqueueing transaction's commit time, stamped at the first claim.
            committed_at -> Nullable<Timestamptz>,
        }
    }
}

/// SQLite: ids and tokens are lowercase UUID text, times unix milliseconds.
#[cfg(feature = "sqlite")]
pub mod sqlite {
    diesel::table! {
        /// The outbox table (`outbox_sql` migrations, SQLite).
        outbox (id) {
            /// The message id (lowercase UUID text).
            id -> Text,
            /// The route name.
            destination -> Text,
            /// The event type.
            event_type -> Text,
            /// The aggregate type, if any.
            aggregate_type -> Nullable<Text>,
            /// The aggregate id, if any.
            aggregate_id -> Nullable<Text>,
            /// The ordering key, if any.
            partition_key -> Nullable<Text>,
            /// The tenant, if any.
            tenant_id -> Nullable<Text>,
            /// The key receivers deduplicate on.
            idempotency_key -> Text,
            /// The payload bytes.
            payload -> Binary,
            /// The payload's content type.
            content_type -> Text,
            /// The message's headers, a JSON object of strings.
            headers -> Text,
            /// `pending`, `leased`, `published` or `dead`.
            status -> Text,
            /// Claims so far.
            attempts -> BigInt,
            /// Due time (unix ms) of a pending row, lease deadline of a leased one.
            available_at -> Nullable<BigInt>,
            /// The relay holding the lease.
            lease_owner -> Nullable<Text>,
            /// The lease's fencing token.
            lease_token -> Nullable<Text>,
            /// When the lease lapses (unix ms).
            lease_until -> Nullable<BigInt>,
            /// The latest failure.
            last_error -> Nullable<Text>,
            /// When the row was inserted (unix ms).
            created_at -> BigInt,
            /// When it was published (unix ms).
            published_at -> Nullable<BigInt>,
            /// When it was dead-lettered (unix ms).
            dead_at -> Nullable<BigInt>,
            /// Its position within its partition key, in commit order.
            seq -> Nullable<BigInt>,
        }
    }
}

/// MySQL / MariaDB: ids and tokens are UUID text, times `DATETIME(6)` in UTC.
#[cfg(feature = "mysql")]
pub mod mysql {
    diesel::table! {
        /// The outbox table (`outbox_sql` migrations, MySQL / MariaDB).
        outbox (id) {
            /// The message id (lowercase UUID text).
            id -> Text,
            /// The route name.
            destination -> Text,
            /// The event type.
            event_type -> Text,
            /// The aggregate type, if any.
            aggregate_type -> Nullable<Text>,
            /// The aggregate id, if any.
            aggregate_id -> Nullable<Text>,
            /// The ordering key, if any.
            partition_key -> Nullable<Text>,
            /// The tenant, if any.
            tenant_id -> Nullable<Text>,
            /// The key receivers deduplicate on.
            idempotency_key -> Text,
            /// The payload bytes.
            payload -> Blob,
            /// The payload's content type.
            content_type -> Text,
            /// The message's headers, a JSON object of strings.
            headers -> Text,
            /// `pending`, `leased`, `published` or `dead`.
            status -> Text,
            /// Claims so far.
            attempts -> Integer,
            /// Due time of a pending row, lease deadline of a leased one.
            available_at -> Nullable<Datetime>,
            /// The relay holding the lease.
            lease_owner -> Nullable<Text>,
            /// The lease's fencing token.
            lease_token -> Nullable<Text>,
            /// When the lease lapses.
            lease_until -> Nullable<Datetime>,
            /// The latest failure.
            last_error -> Nullable<Text>,
            /// When the row was inserted.
            created_at -> Datetime,
            /// When it was published.
            published_at -> Nullable<Datetime>,
            /// When it was dead-lettered.
            dead_at -> Nullable<Datetime>,
            /// Its position within its partition key, in commit order.
            seq -> Nullable<BigInt>,
        }
    }
}
