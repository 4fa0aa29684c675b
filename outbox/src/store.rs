//! A store chosen at run time from a URL.

use std::time::Duration;

use outbox_core::{
    Claim, ClaimRequest, CompleteReport, Completion, DeadLetter, DeadLetterFilter, DeadLetters,
    LeaseToken, MessageId, Purge, PurgeRequest, Stats, Store, StoreError, StoreStats, Wakeup,
};

use crate::Error;
use crate::config::{PublishedRowsSetting, StoreConfig};

/// One of the SQL stores, picked by the URL scheme: `postgres://` (or `postgresql://`),
/// `sqlite:` and `mysql://` (or `mariadb://`), each behind its Cargo feature.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum AnyStore {
    /// PostgreSQL.
    #[cfg(feature = "postgres")]
    Postgres(outbox_sqlx::postgres::PgOutbox),
    /// SQLite.
    #[cfg(feature = "sqlite")]
    Sqlite(outbox_sqlx::sqlite::SqliteOutbox),
    /// MySQL / MariaDB.
    #[cfg(feature = "mysql")]
    MySql(outbox_sqlx::mysql::MySqlOutbox),
}

/// The scheme of `url` and the feature its store needs.
pub(crate) fn store_feature(url: &str) -> Result<(&'static str, &'static str), Error> {
    let scheme = url.split(':').next().unwrap_or("");
    Ok(match scheme {
        "postgres" | "postgresql" => ("postgres", "postgres"),
        "sqlite" => ("sqlite", "sqlite"),
        "mysql" | "mariadb" => ("mysql", "mysql"),
        _ => {
            return Err(Error::UnsupportedScheme {
                what: "store",
                url: crate::config::redact_url(url),
                known: "postgres://, sqlite:, mysql://",
            });
        }
    })
}

impl AnyStore {
    /// Connects the store `config` describes (nothing is created; see [`migrate`](Self::migrate)).
    ///
    /// # Errors
    ///
    /// [`Error::FeatureDisabled`] when the scheme's feature is off, [`Error::Config`] for a
    /// bad table name, [`Error::Store`] when the database cannot be reached.
    pub async fn connect(config: &StoreConfig) -> Result<Self, Error> {
        let (scheme, feature) = store_feature(&config.url)?;
        let mut names = outbox_sql::TableNames::default();
        if let Some(schema) = &config.schema {
            names = names
                .schema(schema)
                .map_err(|e| Error::Config(format!("store.schema: {e}")))?;
        }
        if let Some(table) = &config.table {
            names = names
                .outbox(table)
                .map_err(|e| Error::Config(format!("store.table: {e}")))?;
        }
        if let Some(table) = &config.inbox_table {
            names = names
                .inbox(table)
                .map_err(|e| Error::Config(format!("store.inbox_table: {e}")))?;
        }
        match scheme {
            #[cfg(feature = "postgres")]
            "postgres" => {
                let url = config.url.replacen("postgresql://", "postgres://", 1);
                probe::<sqlx::PgConnection>(config, &url).await?;
                let pool = sqlx::postgres::PgPoolOptions::new()
                    .max_connections(config.max_connections)
                    .acquire_timeout(Duration::from_secs(10))
                    .connect(&url)
                    .await
                    .map_err(|e| connect_error(config, e))?;
                let outbox = outbox_sqlx::postgres::PgOutbox::with_names(pool, names)
                    .published_rows(published(config));
                Ok(Self::Postgres(outbox))
            }
            #[cfg(feature = "sqlite")]
            "sqlite" => {
                use std::str::FromStr;
                let options = sqlx::sqlite::SqliteConnectOptions::from_str(&config.url)
                    .map_err(|e| Error::Config(format!("store.url: {e}")))?
                    .create_if_missing(true)
                    .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
                    .busy_timeout(Duration::from_secs(10));
                let pool = sqlx::sqlite::SqlitePoolOptions::new()
                    .max_connections(config.max_connections)
                    .connect_with(options)
                    .await
                    .map_err(|e| connect_error(config, e))?;
                let outbox = outbox_sqlx::sqlite::SqliteOutbox::with_names(pool, names)
                    .published_rows(published(config));
                Ok(Self::Sqlite(outbox))
            }
            #[cfg(feature = "mysql")]
            "mysql" => {
                let url = config.url.replacen("mariadb://", "mysql://", 1);
                probe::<sqlx::MySqlConnection>(config, &url).await?;
                let pool = sqlx::mysql::MySqlPoolOptions::new()
                    .max_connections(config.max_connections)
                    .acquire_timeout(Duration::from_secs(10))
                    .connect(&url)
                    .await
                    .map_err(|e| connect_error(config, e))?;
                let outbox = outbox_sqlx::mysql::MySqlOutbox::with_names(pool, names)
                    .published_rows(published(config));
                Ok(Self::MySql(outbox))
            }
            _ => Err(Error::FeatureDisabled {
                what: "store",
                scheme,
                feature,
            }),
        }
    }

    /// Creates or updates the outbox table.
    ///
    /// # Errors
    ///
    /// The store's error.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        match self {
            #[cfg(feature = "postgres")]
            Self::Postgres(s) => s.migrate().await,
            #[cfg(feature = "sqlite")]
            Self::Sqlite(s) => s.migrate().await,
            #[cfg(feature = "mysql")]
            Self::MySql(s) => s.migrate().await,
        }
    }

    /// Wakes relays listening on this database, where it can (PostgreSQL NOTIFY); a no-op
    /// on the other stores, whose relays poll.
    ///
    /// # Errors
    ///
    /// The NOTIFY failed; relays still find the rows on their next poll.
    pub async fn notify(&self) -> Result<(), StoreError> {
        match self {
            #[cfg(feature = "postgres")]
            Self::Postgres(s) => s.notify().await,
            #[allow(unreachable_patterns)]
            _ => Ok(()),
        }
    }

    /// A wakeup fed by the database, where it has one (PostgreSQL LISTEN/NOTIFY). Keep
    /// the returned guard alive as long as the wakeup is used.
    ///
    /// # Errors
    ///
    /// The listener could not connect.
    pub async fn listen(
        &self,
    ) -> Result<Option<(Wakeup, Box<dyn std::any::Any + Send>)>, StoreError> {
        match self {
            #[cfg(feature = "postgres")]
            Self::Postgres(s) => {
                let listener = s.listen().await?;
                Ok(Some((listener.wakeup(), Box::new(listener))))
            }
            #[allow(unreachable_patterns)]
            _ => Ok(None),
        }
    }
}

fn published(config: &StoreConfig) -> outbox_sqlx::PublishedRows {
    match config.published_rows {
        PublishedRowsSetting::Keep => outbox_sqlx::PublishedRows::Keep,
        PublishedRowsSetting::Delete => outbox_sqlx::PublishedRows::Delete,
    }
}

/// Opens and closes one connection, so that an unreachable server is reported with its
/// real cause ("Connection refused", a bad password, an unknown database) at once: the
/// pool retries such errors until its acquire timeout and then says only "timed out".
#[cfg(any(feature = "postgres", feature = "mysql"))]
async fn probe<C: sqlx::Connection>(config: &StoreConfig, url: &str) -> Result<(), Error> {
    match tokio::time::timeout(Duration::from_secs(10), C::connect(url)).await {
        Ok(Ok(connection)) => {
            let _ = connection.close().await;
            Ok(())
        }
        Ok(Err(error)) => Err(connect_error(config, error)),
        Err(_) => Err(Error::Connect {
            url: crate::config::redact_url(&config.url),
            reason: "no answer within 10 s".to_owned(),
        }),
    }
}

fn connect_error(config: &StoreConfig, error: sqlx::Error) -> Error {
    Error::Connect {
        url: crate::config::redact_url(&config.url),
        reason: error.to_string(),
    }
}

macro_rules! dispatch {
    ($self:ident, $store:ident => $call:expr) => {
        match $self {
            #[cfg(feature = "postgres")]
            AnyStore::Postgres($store) => $call,
            #[cfg(feature = "sqlite")]
            AnyStore::Sqlite($store) => $call,
            #[cfg(feature = "mysql")]
            AnyStore::MySql($store) => $call,
        }
    };
}

impl Store for AnyStore {
    async fn claim(&self, request: &ClaimRequest) -> Result<Claim, StoreError> {
        dispatch!(self, s => s.claim(request).await)
    }
    async fn complete(
        &self,
        token: LeaseToken,
        completions: &[Completion],
    ) -> Result<CompleteReport, StoreError> {
        dispatch!(self, s => s.complete(token, completions).await)
    }
    async fn release(
        &self,
        token: LeaseToken,
        ids: &[MessageId],
    ) -> Result<CompleteReport, StoreError> {
        dispatch!(self, s => s.release(token, ids).await)
    }
}

impl StoreStats for AnyStore {
    async fn stats(&self) -> Result<Stats, StoreError> {
        dispatch!(self, s => s.stats().await)
    }
}

impl DeadLetters for AnyStore {
    async fn list_dead(
        &self,
        filter: &DeadLetterFilter,
        limit: usize,
    ) -> Result<Vec<DeadLetter>, StoreError> {
        dispatch!(self, s => s.list_dead(filter, limit).await)
    }
    async fn replay_dead(&self, filter: &DeadLetterFilter) -> Result<u64, StoreError> {
        dispatch!(self, s => s.replay_dead(filter).await)
    }
    async fn discard_dead(&self, filter: &DeadLetterFilter) -> Result<u64, StoreError> {
        dispatch!(self, s => s.discard_dead(filter).await)
    }
}

impl Purge for AnyStore {
    async fn purge(&self, request: &PurgeRequest) -> Result<u64, StoreError> {
        dispatch!(self, s => s.purge(request).await)
    }
}
