//! The front crate's error: one line, saying what to fix, never quoting a secret.

use outbox_engine::registry::BuildError;

/// Building a store, a sink or a relay from configuration failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The configuration is invalid.
    #[error("configuration: {0}")]
    Config(String),
    /// The URL's scheme needs a Cargo feature that is not enabled.
    #[error(
        "{setting}: {what} URL scheme {scheme:?} needs the `{feature}` feature of the `outbox` crate, which is not enabled"
    )]
    FeatureDisabled {
        /// The setting that holds the URL: `store.url`, `routes.billing.url`.
        setting: String,
        /// `store` or `sink`.
        what: &'static str,
        /// The scheme.
        scheme: String,
        /// The feature to enable.
        feature: &'static str,
    },
    /// No installed driver handles this URL.
    #[error("{setting}: unsupported {what} URL {url} (known schemes: {known})")]
    UnsupportedScheme {
        /// The setting that holds the URL: `store.url`, `routes.billing.url`.
        setting: String,
        /// `store` or `sink`.
        what: &'static str,
        /// The URL, secrets hidden.
        url: String,
        /// The schemes the registry knows.
        known: String,
    },
    /// A driver could not build the store or a route's sink.
    #[error("{what}: {source}")]
    Build {
        /// `store` or `route "billing"`.
        what: String,
        /// The driver's error.
        #[source]
        source: BuildError,
    },
    /// A store operation failed.
    #[error(transparent)]
    Store(#[from] outbox_engine::StoreError),
    /// The relay settings are invalid.
    #[error(transparent)]
    Relay(#[from] outbox_engine::ConfigError),
}

impl Error {
    /// Whether trying again can help (a server that was not reachable yet).
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Build { source, .. } => source.is_retryable(),
            Self::Store(error) => error.is_retryable(),
            _ => false,
        }
    }
}
