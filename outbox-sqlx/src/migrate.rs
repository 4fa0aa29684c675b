//! The migrations runner, written once: each dialect takes its lock (an advisory lock,
//! SQLite's write lock, MySQL's named lock) and runs [`apply`] on that connection.

use outbox_engine::StoreError;
use outbox_sql::{Migration, Shared};

use crate::error::classify;

/// Runs every statement of `migrations` on `conn`, recording each migration. `checks[i]`,
/// if present, must succeed before migration `i` is recorded (`CREATE TABLE IF NOT EXISTS`
/// succeeds on any table of that name: a check proves it is ours); all checks run again
/// at the end.
///
/// Every statement is idempotent and runs on every call, so a table dropped by hand is
/// recreated even though its migration is recorded.
pub(crate) async fn apply<DB>(
    conn: &mut DB::Connection,
    shared: &Shared,
    migrations: &[Migration],
    checks: &[&str],
) -> Result<(), StoreError>
where
    DB: sqlx::Database + sqlx::database::HasStatementCache,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    for<'q> &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    // Each step is a statement and the migration id it records, if it records one.
    let mut steps: Vec<(&str, Option<&str>)> = vec![(&shared.create_migrations, None)];
    for (i, migration) in migrations.iter().enumerate() {
        steps.extend(migration.statements.iter().map(|s| (s.as_str(), None)));
        steps.extend(checks.get(i).map(|check| (*check, None)));
        steps.push((&shared.record_migration, Some(&migration.id)));
    }
    steps.extend(checks.iter().map(|check| (*check, None)));
    for (statement, id) in steps {
        // Not prepared for reuse: each runs once per migration.
        let mut query = sqlx::query(statement).persistent(false);
        if let Some(id) = id {
            query = query.bind(id);
        }
        query.execute(&mut *conn).await.map_err(classify)?;
    }
    Ok(())
}
