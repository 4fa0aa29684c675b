//! Classification of diesel errors: whether retrying can help.
//!
//! diesel reports no SQLSTATE or error number, only a kind and a message, so deadlocks,
//! lock timeouts and a busy SQLite are recognised by their message.

use diesel::result::{DatabaseErrorKind, Error};
use outbox_engine::{StoreError, StoreErrorKind};

/// Maps a diesel error to a [`StoreError`] of the right kind.
pub(crate) fn classify(error: Error) -> StoreError {
    let kind = kind_of(&error);
    let message = if kind == StoreErrorKind::Schema {
        format!(
            "{error}: run the migrations (`migrate()`, or `outbox migrate`) or check the configured table name"
        )
    } else {
        error.to_string()
    };
    StoreError::new(kind, message).with_source(error)
}

fn kind_of(error: &Error) -> StoreErrorKind {
    match error {
        Error::DatabaseError(kind, info) => match kind {
            DatabaseErrorKind::UniqueViolation
            | DatabaseErrorKind::ForeignKeyViolation
            | DatabaseErrorKind::NotNullViolation
            | DatabaseErrorKind::CheckViolation => StoreErrorKind::Constraint,
            DatabaseErrorKind::SerializationFailure => StoreErrorKind::Conflict,
            DatabaseErrorKind::ClosedConnection | DatabaseErrorKind::UnableToSendCommand => {
                StoreErrorKind::Unavailable
            }
            _ => by_message(info.message()),
        },
        Error::BrokenTransactionManager | Error::RollbackErrorOnCommit { .. } => {
            StoreErrorKind::Unavailable
        }
        Error::DeserializationError(_) => StoreErrorKind::Schema,
        _ => StoreErrorKind::Other,
    }
}

fn by_message(message: &str) -> StoreErrorKind {
    let message = message.to_ascii_lowercase();
    let any = |needles: &[&str]| needles.iter().any(|n| message.contains(n));
    if any(&[
        "deadlock",
        "lock wait timeout",
        "database is locked",
        "could not serialize",
        "try restarting transaction",
    ]) {
        StoreErrorKind::Conflict
    } else if any(&[
        "no such table",
        "doesn't exist",
        "does not exist",
        "undefined table",
    ]) {
        StoreErrorKind::Schema
    } else if any(&[
        "server closed the connection",
        "connection refused",
        "terminating connection",
        "lost connection",
        "gone away",
    ]) {
        StoreErrorKind::Unavailable
    } else {
        StoreErrorKind::Other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_say_whether_retrying_helps() {
        assert_eq!(
            by_message("Deadlock found when trying to get lock; try restarting transaction"),
            StoreErrorKind::Conflict
        );
        assert_eq!(by_message("database is locked"), StoreErrorKind::Conflict);
        assert_eq!(
            by_message("relation \"x\" does not exist"),
            StoreErrorKind::Schema
        );
        assert_eq!(by_message("no such table: outbox"), StoreErrorKind::Schema);
        assert_eq!(by_message("syntax error"), StoreErrorKind::Other);
        assert!(by_message("MySQL server has gone away").is_retryable());
    }
}
