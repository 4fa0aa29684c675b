//! The front crate's error: one line, saying what to fix.

/// Building a store, a sink or a relay from configuration failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The configuration is invalid.
    #[error("configuration: {0}")]
    Config(String),
    /// The URL's scheme needs a Cargo feature that is not enabled.
    #[error(
        "{what} URL scheme {scheme:?} needs the `{feature}` feature of the `outbox` crate, which is not enabled"
    )]
    FeatureDisabled {
        /// `store` or `sink`.
        what: &'static str,
        /// The scheme.
        scheme: &'static str,
        /// The feature to enable.
        feature: &'static str,
    },
    /// No store or sink handles this URL.
    #[error("unsupported {what} URL {url:?} (known: {known})")]
    UnsupportedScheme {
        /// `store` or `sink`.
        what: &'static str,
        /// The URL, password hidden.
        url: String,
        /// The schemes that exist.
        known: &'static str,
    },
    /// The database could not be reached.
    #[error("cannot connect to {url}: {reason}")]
    Connect {
        /// The URL, password hidden.
        url: String,
        /// Why.
        reason: String,
    },
    /// A store operation failed.
    #[error(transparent)]
    Store(#[from] outbox_core::StoreError),
    /// A sink could not be built.
    #[error("route {route:?}: {reason}")]
    Sink {
        /// The route (destination).
        route: String,
        /// Why.
        reason: String,
    },
    /// The relay settings are invalid.
    #[error(transparent)]
    Relay(#[from] outbox_core::ConfigError),
}
