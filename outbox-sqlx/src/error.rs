//! Classification of sqlx errors: whether retrying can help.

use outbox_core::{StoreError, StoreErrorKind};

/// Maps a sqlx error to a [`StoreError`] with the right kind.
pub(crate) fn classify(error: sqlx::Error) -> StoreError {
    let kind = kind_of(&error);
    StoreError::new(kind, error.to_string()).with_source(error)
}

fn kind_of(error: &sqlx::Error) -> StoreErrorKind {
    use sqlx::Error as E;
    match error {
        E::Io(_) | E::Tls(_) | E::PoolClosed | E::WorkerCrashed | E::Protocol(_) => {
            StoreErrorKind::Unavailable
        }
        E::PoolTimedOut => StoreErrorKind::Timeout,
        E::Configuration(_)
        | E::ColumnNotFound(_)
        | E::ColumnDecode { .. }
        | E::Decode(_)
        | E::TypeNotFound { .. } => StoreErrorKind::Schema,
        E::Database(db) => database_kind(db.as_ref()),
        _ => StoreErrorKind::Other,
    }
}

fn database_kind(db: &dyn sqlx::error::DatabaseError) -> StoreErrorKind {
    use sqlx::error::ErrorKind as K;
    match db.kind() {
        K::UniqueViolation | K::ForeignKeyViolation | K::NotNullViolation | K::CheckViolation => {
            return StoreErrorKind::Constraint;
        }
        _ => {}
    }
    let code = db.code();
    let code = code.as_deref().unwrap_or("");
    let message = db.message();
    match code {
        // Serialization failure or deadlock (PostgreSQL and MySQL share 40001), PostgreSQL
        // deadlock, lock not available, query canceled.
        "40001" | "40P01" | "55P03" | "57014" => StoreErrorKind::Conflict,
        // PostgreSQL: undefined table / column / schema.
        "42P01" | "42703" | "3F000" => StoreErrorKind::Schema,
        // PostgreSQL: admin shutdown, crash shutdown, cannot connect now, too many connections.
        "57P01" | "57P02" | "57P03" | "53300" => StoreErrorKind::Unavailable,
        c if c.starts_with("08") => StoreErrorKind::Unavailable,
        // MySQL / MariaDB (SQLSTATE): no such table, unknown column, unknown database.
        "42S02" | "42S22" | "42000"
            if message.contains("Unknown") || message.contains("doesn't exist") =>
        {
            StoreErrorKind::Schema
        }
        // MySQL / MariaDB: lock wait timeout has the generic SQLSTATE HY000.
        "HY000" if message.contains("Lock wait timeout") => StoreErrorKind::Conflict,
        // SQLite: busy, locked (primary codes and extended ones).
        "5" | "6" | "261" | "262" | "517" | "518" | "773" => StoreErrorKind::Conflict,
        _ if message.contains("no such table") || message.contains("no such column") => {
            StoreErrorKind::Schema
        }
        _ => StoreErrorKind::Other,
    }
}
