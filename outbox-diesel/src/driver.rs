//! The store drivers, for configuration files and the CLI: `diesel+postgres://…`,
//! `diesel+sqlite:PATH` and `diesel+mysql://…` open a [`DieselOutbox`] on an r2d2 pool of
//! `store.max_connections` connections.

use std::time::Duration;

use diesel::r2d2::{ConnectionManager, Pool};
use outbox_engine::registry::{BuildError, StoreDriver};
use outbox_engine::{AnyStore, StoreSettings, redact};

use crate::{DieselDialect, DieselOutbox};

/// How long connecting may take before it is reported as unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// `diesel+postgres://` and `diesel+postgresql://`: a [`PgOutbox`](crate::postgres::PgOutbox).
#[cfg(feature = "postgres")]
pub const POSTGRES: StoreDriver = StoreDriver {
    schemes: &["diesel+postgres", "diesel+postgresql"],
    connect: |settings| Box::pin(connect::<diesel::PgConnection>(settings, "postgres://")),
    schema: Some(|settings| schema(outbox_sql::Dialect::Postgres, settings)),
};

/// `diesel+sqlite:PATH`: a [`SqliteOutbox`](crate::sqlite::SqliteOutbox) in WAL mode
/// with a busy timeout ([`Pragmas`](crate::sqlite::Pragmas)); the file is created if
/// missing.
#[cfg(feature = "sqlite")]
pub const SQLITE: StoreDriver = StoreDriver {
    schemes: &["diesel+sqlite"],
    connect: |settings| Box::pin(connect::<diesel::SqliteConnection>(settings, "")),
    schema: Some(|settings| schema(outbox_sql::Dialect::Sqlite, settings)),
};

/// `diesel+mysql://` and `diesel+mariadb://`: a [`MysqlOutbox`](crate::mysql::MysqlOutbox).
#[cfg(feature = "mysql")]
pub const MYSQL: StoreDriver = StoreDriver {
    schemes: &["diesel+mysql", "diesel+mariadb"],
    connect: |settings| Box::pin(connect::<diesel::MysqlConnection>(settings, "mysql://")),
    schema: Some(|settings| schema(outbox_sql::Dialect::MySql, settings)),
};

/// The DDL `migrate` runs for these settings' table names.
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
fn schema(dialect: outbox_sql::Dialect, settings: &StoreSettings) -> Result<String, BuildError> {
    Ok(outbox_sql::schema_script(
        dialect,
        &outbox_sql::table_names(settings)?,
        outbox_sql::published_rows(dialect, settings)?,
    ))
}

/// The connection URL diesel takes: the scheme replaced by `scheme` (`postgres://`,
/// `mysql://`), or, for SQLite (`scheme` empty), the path after `diesel+sqlite:`.
#[cfg_attr(
    not(any(feature = "postgres", feature = "sqlite", feature = "mysql")),
    allow(dead_code)
)]
fn connection_url(url: &str, scheme: &str) -> Result<String, BuildError> {
    let (_, rest) = url
        .split_once(':')
        .ok_or_else(|| BuildError::config("store.url has no scheme"))?;
    if scheme.is_empty() {
        let path = rest.strip_prefix("//").unwrap_or(rest);
        if path.is_empty() {
            return Err(BuildError::config(
                "store.url: diesel+sqlite: needs a file path",
            ));
        }
        return Ok(path.to_owned());
    }
    let rest = rest
        .strip_prefix("//")
        .ok_or_else(|| BuildError::config("store.url: expected SCHEME://HOST/DATABASE"))?;
    Ok(format!("{scheme}{rest}"))
}

#[cfg_attr(
    not(any(feature = "postgres", feature = "sqlite", feature = "mysql")),
    allow(dead_code)
)]
async fn connect<C>(settings: &StoreSettings, scheme: &'static str) -> Result<AnyStore, BuildError>
where
    C: DieselDialect,
    DieselOutbox<C>: outbox_engine::backend::DynStore,
{
    let names = outbox_sql::table_names(settings)?;
    let published = outbox_sql::published_rows(C::DIALECT, settings)?;
    let url = connection_url(&settings.url, scheme)?;
    let size = settings.max_connections.max(1);
    let builder = move || {
        let builder = Pool::builder()
            .max_size(size)
            .min_idle(Some(1))
            .connection_timeout(CONNECT_TIMEOUT);
        match C::connection_setup() {
            Some(setup) => builder.connection_customizer(setup),
            None => builder,
        }
    };
    // r2d2 connects while it builds the pool: a blocking call. The pools opened after an
    // abandoned call connect in the background.
    let first = ConnectionManager::<C>::new(url.clone());
    let pool = tokio::task::spawn_blocking(move || builder().build(first))
        .await
        .map_err(|e| BuildError::unavailable(format!("connecting failed: {e}")))?
        .map_err(|e| {
            BuildError::unavailable(format!(
                "cannot connect to {}: {e}",
                redact::url(&settings.url)
            ))
        })?;
    Ok(AnyStore::new(
        DieselOutbox::with_names(pool, names)
            .published_rows(published)
            .renewing_pool(move || builder().build_unchecked(ConnectionManager::new(url.clone()))),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_lose_the_diesel_prefix() {
        assert_eq!(
            connection_url("diesel+postgres://app:pw@db:5432/app", "postgres://").unwrap(),
            "postgres://app:pw@db:5432/app"
        );
        assert_eq!(
            connection_url("diesel+sqlite:outbox.db", "").unwrap(),
            "outbox.db"
        );
        assert_eq!(
            connection_url("diesel+sqlite:///tmp/o.db", "").unwrap(),
            "/tmp/o.db"
        );
        assert!(connection_url("diesel+sqlite:", "").is_err());
        assert!(connection_url("diesel+mysql:db", "mysql://").is_err());
    }
}
