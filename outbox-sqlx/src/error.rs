//! Classification of sqlx errors: whether retrying can help.

use outbox_engine::{StoreError, StoreErrorKind};

/// Maps a sqlx error to a [`StoreError`] with the right kind.
pub(crate) fn classify(error: sqlx::Error) -> StoreError {
    let kind = kind_of(&error);
    let message = if missing_table(&error) {
        format!(
            "{error}: the table does not exist; run the migrations (`migrate()`, or `outbox migrate`) or check the configured table name"
        )
    } else {
        error.to_string()
    };
    StoreError::new(kind, message).with_source(error)
}

/// PostgreSQL's undefined table, MySQL's "table doesn't exist", SQLite's "no such table".
fn missing_table(error: &sqlx::Error) -> bool {
    let sqlx::Error::Database(db) = error else {
        return false;
    };
    #[cfg(feature = "mysql")]
    if let Some(mysql) = db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
        return mysql.number() == 1146;
    }
    db.code().as_deref() == Some("42P01") || db.message().contains("no such table")
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
    #[cfg(feature = "mysql")]
    if let Some(kind) = db
        .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
        .and_then(|mysql| mysql_kind(mysql.number()))
    {
        return kind;
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

/// MySQL / MariaDB server error numbers.
#[cfg(feature = "mysql")]
fn mysql_kind(number: u16) -> Option<StoreErrorKind> {
    Some(match number {
        // Lock wait timeout, deadlock, NOWAIT lock not granted.
        1205 | 1213 | 3572 => StoreErrorKind::Conflict,
        // No such table, column, database; unknown table on drop.
        1146 | 1054 | 1049 | 1051 => StoreErrorKind::Schema,
        // Too many connections, server shutting down, read-only (failover), killed.
        1040 | 1053 | 1290 | 1792 | 1836 | 1927 => StoreErrorKind::Unavailable,
        // Statement time limit (MySQL max_execution_time, MariaDB max_statement_time).
        3024 | 1969 => StoreErrorKind::Timeout,
        // Packet too large, data too long, incorrect value: the input cannot be stored.
        1153 | 1406 | 1366 => StoreErrorKind::InvalidInput,
        _ => return None,
    })
}
