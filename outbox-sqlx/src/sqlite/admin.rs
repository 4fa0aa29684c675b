//! Dead letters and purge on SQLite: the filter bound as JSON arrays, `NULL` for "any",
//! times rounded up to the stored milliseconds (the operations themselves are written
//! once, in `filtered.rs`).

use outbox_engine::DeadLetterFilter;
use outbox_sql::Admin;
use outbox_sql::sqlite::Statements;
use sqlx::query::Query;
use sqlx::sqlite::{Sqlite, SqliteArguments};

use super::{ceil_ms, json_list};
use crate::filtered::FilteredDialect;

impl FilteredDialect for Sqlite {
    fn admin(sql: &Statements) -> &Admin {
        &sql.admin
    }

    fn dead_query<'q>(
        sql: &'q str,
        filter: &DeadLetterFilter,
    ) -> Query<'q, Sqlite, SqliteArguments<'q>> {
        let ids =
            (!filter.ids.is_empty()).then(|| json_list(filter.ids.iter().map(ToString::to_string)));
        let destinations =
            (!filter.destinations.is_empty()).then(|| json_list(filter.destinations.iter()));
        let event_types =
            (!filter.event_types.is_empty()).then(|| json_list(filter.event_types.iter()));
        sqlx::query(sql)
            .bind(ids)
            .bind(destinations)
            .bind(event_types)
            .bind(filter.created_after.map(ceil_ms))
            .bind(filter.created_before.map(ceil_ms))
            .bind(filter.error_contains.clone())
            .bind(filter.after_id.map(|id| id.to_string()))
    }

    fn find_query<'q>(sql: &'q str, key: &str) -> Query<'q, Sqlite, SqliteArguments<'q>> {
        sqlx::query(sql)
            .bind(crate::common::id_text(key))
            .bind(key.to_owned())
    }
}
