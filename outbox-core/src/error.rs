//! Error types. Each says whether retrying can help.

use std::error::Error as StdError;

/// A new message failed validation; nothing was enqueued.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MessageError {
    /// A text field is empty, too long or contains control characters.
    #[error("invalid {field}: {reason}")]
    InvalidField {
        /// The field name, e.g. `destination`.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A header name or value is not acceptable.
    #[error("invalid header {name:?}: {reason}")]
    InvalidHeader {
        /// The header name (first 64 characters).
        name: String,
        /// What is wrong with it.
        reason: String,
    },
    /// More headers than [`Limits::max_headers`](crate::Limits::max_headers).
    #[error("{count} headers, limit is {limit}")]
    TooManyHeaders {
        /// Headers given.
        count: usize,
        /// The limit.
        limit: usize,
    },
    /// The payload is larger than [`Limits::max_payload_bytes`](crate::Limits::max_payload_bytes).
    #[error("payload is {size} bytes, limit is {limit}")]
    PayloadTooLarge {
        /// Payload size in bytes.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// The payload could not be serialised to JSON.
    #[error("payload serialization failed: {0}")]
    Serialization(String),
}

/// What kind of store failure happened, and so whether retrying can help.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StoreErrorKind {
    /// The database could not be reached or the connection broke; retry.
    Unavailable,
    /// The operation timed out; retry.
    Timeout,
    /// A serialization failure or deadlock; retry.
    Conflict,
    /// A constraint was violated, e.g. a duplicate message id; retrying will not help.
    Constraint,
    /// The schema is missing or does not match; run the migrations.
    Schema,
    /// Invalid input such as a bad identifier or filter; retrying will not help.
    InvalidInput,
    /// Anything else.
    Other,
}

impl StoreErrorKind {
    /// Whether the same call can succeed if tried again later.
    pub fn is_retryable(self) -> bool {
        matches!(self, Self::Unavailable | Self::Timeout | Self::Conflict)
    }
}

/// A store operation failed.
#[derive(Debug, thiserror::Error)]
#[error("store {kind:?} error: {message}")]
pub struct StoreError {
    kind: StoreErrorKind,
    message: String,
    #[source]
    source: Option<Box<dyn StdError + Send + Sync>>,
}

impl StoreError {
    /// A new error of `kind`.
    pub fn new(kind: StoreErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            source: None,
        }
    }

    /// Attaches the underlying cause.
    pub fn with_source(mut self, source: impl StdError + Send + Sync + 'static) -> Self {
        self.source = Some(Box::new(source));
        self
    }

    /// The kind of failure.
    pub fn kind(&self) -> StoreErrorKind {
        self.kind
    }

    /// Whether the same call can succeed if tried again later.
    pub fn is_retryable(&self) -> bool {
        self.kind.is_retryable()
    }
}

/// The relay could not be built from its configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A numeric setting is out of range.
    #[error("invalid relay setting {setting}: {reason}")]
    InvalidSetting {
        /// The setting name, e.g. `batch_size`.
        setting: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A route's name is not a destination any message can carry, so the route could
    /// never publish.
    #[error("invalid route name {route:?}: {reason}")]
    InvalidRoute {
        /// The name as given.
        route: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A setting needs something the store does not declare in its
    /// [`Capabilities`](crate::Capabilities).
    #[error("the {store} store has no {capability}, which the relay's {setting} needs")]
    Unsupported {
        /// The store's name, as its capabilities give it.
        store: &'static str,
        /// What it lacks, such as `per-key ordering`.
        capability: &'static str,
        /// The relay setting that asked for it.
        setting: &'static str,
    },
    /// No route was configured, so nothing could ever be published.
    #[error("the relay has no routes: add one with `route(destination, sink)`")]
    NoRoutes,
}
