//! The store drivers: open a store from [`StoreSettings`] (URL, table names, pool size).

use std::time::Duration;

use outbox_engine::registry::{BuildError, StoreDriver, UrlStore};
use outbox_engine::{StoreSettings, redact};

/// How long connecting may take before it is reported as unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The relay's MySQL sessions end after 30 s without a word from the relay, even inside
/// a transaction (MySQL's default is 8 hours). A claim is a transaction that locks its
/// rows: if the relay's host vanishes, or its connection falls silent, between the
/// claim's `SELECT … FOR UPDATE` and its commit, the server would otherwise keep those
/// rows locked, and every other relay skipping them, for hours.
#[cfg(feature = "mysql")]
const MYSQL_SESSION: &str = "SET SESSION wait_timeout = 30";

/// `postgres://` and `postgresql://` URLs: a [`PgOutbox`](crate::postgres::PgOutbox).
#[cfg(feature = "postgres")]
pub const POSTGRES: StoreDriver = StoreDriver::of::<crate::postgres::PgOutbox>();

/// `sqlite:` URLs (`sqlite:outbox.db`, `sqlite::memory:`): a
/// [`SqliteOutbox`](crate::sqlite::SqliteOutbox); the file is created if missing.
#[cfg(feature = "sqlite")]
pub const SQLITE: StoreDriver = StoreDriver::of::<crate::sqlite::SqliteOutbox>();

/// `mysql://` and `mariadb://` URLs: a [`MySqlOutbox`](crate::mysql::MySqlOutbox).
#[cfg(feature = "mysql")]
pub const MYSQL: StoreDriver = StoreDriver::of::<crate::mysql::MySqlOutbox>();

/// The DDL `migrate` runs for these settings' table names.
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
fn schema<DB: crate::dialect::SqlDialect>(settings: &StoreSettings) -> Result<String, BuildError> {
    Ok(outbox_sql::schema_script(
        DB::DIALECT,
        &outbox_sql::table_names(settings)?,
        outbox_sql::published_rows(DB::DIALECT, settings)?,
    ))
}

fn unreachable(settings: &StoreSettings, reason: impl std::fmt::Display) -> BuildError {
    BuildError::unavailable(format!(
        "cannot connect to {}: {reason}",
        redact::url(&settings.url)
    ))
}

/// Opens and closes one connection first, so that an unreachable server is reported with
/// its real cause ("Connection refused", a bad password, an unknown database) at once:
/// the pool retries such errors until its acquire timeout and then says only "timed out".
#[cfg(any(feature = "postgres", feature = "mysql"))]
async fn probe<C: sqlx::Connection>(settings: &StoreSettings, url: &str) -> Result<(), BuildError> {
    match tokio::time::timeout(CONNECT_TIMEOUT, C::connect(url)).await {
        Ok(Ok(connection)) => {
            let _ = connection.close().await;
            Ok(())
        }
        Ok(Err(error)) => Err(unreachable(settings, error)),
        Err(_) => Err(unreachable(settings, "no answer within 10 s")),
    }
}

/// A pool on a database server at `url`, after one probing connection; connections that
/// stop answering are closed rather than kept (see [`release_check`](crate::release_check)).
#[cfg(any(feature = "postgres", feature = "mysql"))]
async fn server_pool<DB: sqlx::Database>(
    settings: &StoreSettings,
    url: &str,
    options: sqlx::pool::PoolOptions<DB>,
) -> Result<sqlx::Pool<DB>, BuildError> {
    probe::<DB::Connection>(settings, url).await?;
    options
        .max_connections(settings.max_connections)
        .acquire_timeout(CONNECT_TIMEOUT)
        .after_release(crate::release_check::<DB>)
        .connect(url)
        .await
        .map_err(|e| unreachable(settings, e))
}

#[cfg(feature = "postgres")]
impl UrlStore for crate::postgres::PgOutbox {
    const SCHEMES: &'static [&'static str] = &["postgres", "postgresql"];

    async fn connect(settings: &StoreSettings) -> Result<Self, BuildError> {
        let names = outbox_sql::table_names(settings)?;
        let published = outbox_sql::published_rows(outbox_sql::Dialect::Postgres, settings)?;
        let url = settings.url.replacen("postgresql://", "postgres://", 1);
        let pool = server_pool(settings, &url, sqlx::postgres::PgPoolOptions::new()).await?;
        Ok(Self::with_names(pool, names).published_rows(published))
    }

    fn schema(settings: &StoreSettings) -> Result<String, BuildError> {
        schema::<sqlx::Postgres>(settings)
    }
}

#[cfg(feature = "sqlite")]
impl UrlStore for crate::sqlite::SqliteOutbox {
    const SCHEMES: &'static [&'static str] = &["sqlite"];

    async fn connect(settings: &StoreSettings) -> Result<Self, BuildError> {
        use std::str::FromStr;
        let names = outbox_sql::table_names(settings)?;
        let published = outbox_sql::published_rows(outbox_sql::Dialect::Sqlite, settings)?;
        let options = sqlx::sqlite::SqliteConnectOptions::from_str(&settings.url)
            .map_err(|e| BuildError::config(format!("store.url: {e}")))?
            .create_if_missing(true)
            .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
            .busy_timeout(CONNECT_TIMEOUT);
        let pool = sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(settings.max_connections)
            .connect_with(options)
            .await
            .map_err(|e| unreachable(settings, e))?;
        Ok(Self::with_names(pool, names).published_rows(published))
    }

    fn schema(settings: &StoreSettings) -> Result<String, BuildError> {
        schema::<sqlx::Sqlite>(settings)
    }
}

#[cfg(feature = "mysql")]
impl UrlStore for crate::mysql::MySqlOutbox {
    const SCHEMES: &'static [&'static str] = &["mysql", "mariadb"];

    async fn connect(settings: &StoreSettings) -> Result<Self, BuildError> {
        let names = outbox_sql::table_names(settings)?;
        let published = outbox_sql::published_rows(outbox_sql::Dialect::MySql, settings)?;
        let url = settings.url.replacen("mariadb://", "mysql://", 1);
        let options = sqlx::mysql::MySqlPoolOptions::new()
            .after_connect(|connection, _| {
                Box::pin(async move {
                    sqlx::query(MYSQL_SESSION).execute(connection).await?;
                    Ok(())
                })
            })
            // Closed here before the server's `wait_timeout` closes them.
            .idle_timeout(Duration::from_secs(20));
        let pool = server_pool(settings, &url, options).await?;
        Ok(Self::with_names(pool, names).published_rows(published))
    }

    fn schema(settings: &StoreSettings) -> Result<String, BuildError> {
        schema::<sqlx::MySql>(settings)
    }
}
