//! Dead letters and purge on PostgreSQL: the filter bound as arrays, `NULL` for "any"
//! (the operations themselves are written once, in `filtered.rs`).

use outbox_engine::DeadLetterFilter;
use outbox_sql::Admin;
use outbox_sql::postgres::Statements;
use sqlx::postgres::{PgArguments, Postgres};
use sqlx::query::Query;
use uuid::Uuid;

use crate::filtered::FilteredDialect;

impl FilteredDialect for Postgres {
    fn admin(sql: &Statements) -> &Admin {
        &sql.admin
    }

    fn dead_query<'q>(sql: &'q str, filter: &DeadLetterFilter) -> Query<'q, Postgres, PgArguments> {
        let ids: Option<Vec<Uuid>> =
            (!filter.ids.is_empty()).then(|| filter.ids.iter().map(|id| *id.as_uuid()).collect());
        let destinations = (!filter.destinations.is_empty()).then(|| filter.destinations.clone());
        let event_types = (!filter.event_types.is_empty()).then(|| filter.event_types.clone());
        sqlx::query(sql)
            .bind(ids)
            .bind(destinations)
            .bind(event_types)
            .bind(filter.created_after)
            .bind(filter.created_before)
            .bind(filter.error_contains.clone())
            .bind(filter.after_id.map(|id| *id.as_uuid()))
    }

    fn rotation(sql: &Statements) -> Option<[&str; 2]> {
        Some([&sql.rotate_prepare, &sql.rotate])
    }

    fn find_query<'q>(sql: &'q str, key: &str) -> Query<'q, Postgres, PgArguments> {
        sqlx::query(sql)
            .bind(Uuid::parse_str(key).ok())
            .bind(key.to_owned())
    }
}
