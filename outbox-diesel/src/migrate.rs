//! The migrations runner, written once: each dialect takes its lock and runs [`apply`]
//! on that connection. The statements are `outbox-sql`'s, as for the sqlx stores, and
//! the migrations table is shared with them.

use diesel::sql_types::Text;
use outbox_engine::StoreError;
use outbox_sql::{Migration, Shared};

use crate::dialect::DieselDialect;
use crate::error::classify;

/// Runs every statement of `migrations` on `conn`, recording each migration. `checks[i]`,
/// if present, must succeed before migration `i` is recorded (a `CREATE TABLE IF NOT
/// EXISTS` succeeds on any table of that name: a check proves it is ours); all checks
/// run again at the end. Statements without parameters go through the simple protocol,
/// which takes DDL with bodies (functions, triggers) on every database.
pub(crate) fn apply<C>(
    conn: &mut C,
    shared: &Shared,
    migrations: &[Migration],
    checks: &[&str],
) -> Result<(), StoreError>
where
    C: DieselDialect,
    String: diesel::serialize::ToSql<Text, C::Backend>,
{
    let simple = |conn: &mut C, statement: &str| conn.batch_execute(statement).map_err(classify);
    simple(conn, &shared.create_migrations)?;
    for (i, migration) in migrations.iter().enumerate() {
        for statement in &migration.statements {
            simple(conn, statement)?;
        }
        if let Some(check) = checks.get(i) {
            simple(conn, check)?;
        }
        conn.run(C::query(&shared.record_migration).bind::<Text, _>(migration.id.clone()))?;
    }
    for check in checks {
        simple(conn, check)?;
    }
    Ok(())
}

/// Runs `work` in a transaction of `conn`, rolled back when it fails.
pub(crate) fn in_transaction<C, T>(
    conn: &mut C,
    work: impl FnOnce(&mut C) -> Result<T, StoreError>,
) -> Result<T, StoreError>
where
    C: diesel::Connection,
{
    /// `transaction` needs an error type made from diesel's.
    enum Failed {
        Diesel(diesel::result::Error),
        Store(StoreError),
    }
    impl From<diesel::result::Error> for Failed {
        fn from(error: diesel::result::Error) -> Self {
            Self::Diesel(error)
        }
    }
    conn.transaction(|conn| work(conn).map_err(Failed::Store))
        .map_err(|failed| match failed {
            Failed::Diesel(error) => classify(error),
            Failed::Store(error) => error,
        })
}
