//! Errors that stop a route from starting ([`NatsSinkError`]), and the classification of
//! JetStream's answers into per-message [`Failure`]s ([`classify`]).
//!
//! # Classification
//!
//! A message is published only on its `PubAck`. Everything else is a failure, permanent
//! when the message itself, or where it is sent, is wrong, and retryable otherwise:
//!
//! | the server or the client says | class | retryable |
//! |---|---|---|
//! | no stream binds the subject (no responders, and the JetStream API confirms it) | `Unroutable` | **no** |
//! | no responders while the JetStream API does not answer (a restart, JetStream off) | `Unavailable` | yes |
//! | JetStream error 10059, stream not found | `Unroutable` | **no** |
//! | JetStream error 10054, message over the stream's `max_msg_size` | `TooLarge` | **no** |
//! | message and headers over the server's `max_payload` (checked before sending) | `TooLarge` | **no** |
//! | `Permissions Violation for Publish` to the subject (the server's asynchronous error) | `Rejected` | **no** |
//! | checked before sending: a subject the template cannot render, or not a valid subject | `Config` | **no** |
//! | checked before sending: a header named `Nats-…` or `outbox-…`, or a name or value NATS cannot carry | `Serialization` | **no** |
//! | any other JetStream error (storage full, limits reached with `discard: new`, no quorum) | `Unavailable` | yes |
//! | no `PubAck` before the ack timeout (the message may be stored) | `Timeout` | yes |
//! | the connection is down, or closed before the ack came | `Connection` | yes, deferred when nothing was sent |
//!
//! A re-send within the stream's duplicate window (`Nats-Msg-Id` is the idempotency
//! key) is acknowledged with `duplicate: true`: the message is published (JetStream
//! kept the first copy), and the sink counts it in `outbox_nats_duplicates_total`.

use async_nats::jetstream::ErrorCode;
use async_nats::jetstream::context::{PublishError, PublishErrorKind};
use outbox_engine::{Failure, FailureClass};

/// Why a NATS route could not be configured or started.
///
/// Every variant says what is wrong and how to fix it; a route never starts in a weaker
/// mode than configured.
///
/// ```
/// use outbox_sink_nats::{NatsSinkConfig, NatsSinkError};
///
/// match NatsSinkConfig::from_url("nats://127.0.0.1?subject=orders.{oops}")?.validate() {
///     Err(NatsSinkError::InvalidTemplate { reason, .. }) => assert!(reason.contains("{oops}")),
///     other => panic!("{other:?}"),
/// }
/// # Ok::<(), NatsSinkError>(())
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NatsSinkError {
    /// The URL does not parse, has the wrong scheme, or carries an unknown option.
    #[error("invalid NATS URL {url}: {reason}")]
    InvalidUrl {
        /// The URL with its credentials hidden.
        url: String,
        /// What is wrong.
        reason: String,
    },
    /// The subject template does not parse, or names a subject NATS cannot publish to.
    #[error("invalid subject template: {reason}")]
    InvalidTemplate {
        /// The template (cut to 128 characters).
        template: String,
        /// What is wrong.
        reason: String,
    },
    /// A setting is out of range or inconsistent with another.
    #[error("invalid setting `{setting}`: {reason}")]
    InvalidSetting {
        /// The setting's name.
        setting: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// A credentials, NKey or TLS file could not be read or used.
    #[error("cannot use the `{setting}` file {path}: {reason}")]
    File {
        /// The setting naming the file.
        setting: &'static str,
        /// The file's path.
        path: String,
        /// What went wrong (never the file's content).
        reason: String,
    },
    /// The server could not be reached, or refused the login or the TLS handshake.
    #[error("cannot connect to the NATS server at {url}: {reason}")]
    Connect {
        /// The URL with its credentials hidden.
        url: String,
        /// What the client said.
        reason: String,
        /// Whether trying again later can help (the server was unreachable).
        retryable: bool,
    },
    /// The server answered, but its JetStream API did not: JetStream is off, or not
    /// enabled for this account.
    #[error(
        "the NATS server at {url} has no JetStream for this account ({reason}); start it with `-js` (or `jetstream {{}}` in its config) and enable JetStream for the account"
    )]
    NoJetStream {
        /// The URL with its credentials hidden.
        url: String,
        /// What the server said.
        reason: String,
    },
    /// No stream binds the route's (fixed) subject.
    #[error(
        "no JetStream stream binds subject {subject:?} on the NATS server at {url}; create one first, e.g. `nats stream add ORDERS --subjects '{subject}' --storage file --dupe-window 2m`"
    )]
    NoStream {
        /// The subject.
        subject: String,
        /// The URL with its credentials hidden.
        url: String,
    },
}

impl NatsSinkError {
    /// Whether trying again can help: only when the server could not be reached or its
    /// JetStream did not answer. A bad setting, a refused login or a missing stream needs
    /// a change first.
    ///
    /// ```
    /// use outbox_sink_nats::NatsSinkError;
    /// let e = NatsSinkError::NoStream { subject: "orders".into(), url: "nats://127.0.0.1/".into() };
    /// assert!(!e.is_retryable());
    /// ```
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Connect { retryable, .. } => *retryable,
            Self::NoJetStream { .. } => true,
            _ => false,
        }
    }
}

/// The per-message failure for a publish error `error` (for errors other than "no
/// responders", which the sink confirms with the JetStream API first).
///
/// ```
/// use async_nats::jetstream::context::{PublishError, PublishErrorKind};
/// use outbox_engine::FailureClass;
///
/// let failure = outbox_sink_nats::classify(&PublishError::new(PublishErrorKind::TimedOut));
/// assert_eq!(failure.class, FailureClass::Timeout);
/// assert!(failure.retryable);
/// ```
pub fn classify(error: &PublishError) -> Failure {
    use std::error::Error as _;
    let text = match error.source() {
        Some(source) => format!("{error}: {source}"),
        None => error.to_string(),
    };
    match error.kind() {
        PublishErrorKind::MaxPayloadExceeded => Failure::permanent(FailureClass::TooLarge, text),
        PublishErrorKind::StreamNotFound => Failure::permanent(FailureClass::Unroutable, text),
        PublishErrorKind::TimedOut => Failure::retryable(
            FailureClass::Timeout,
            format!("{text}; the message may have been stored"),
        ),
        PublishErrorKind::BrokenPipe => Failure::retryable(FailureClass::Connection, text),
        PublishErrorKind::Other => match jetstream_code(error) {
            Some(ErrorCode::STREAM_NOT_FOUND) => Failure::permanent(FailureClass::Unroutable, text),
            Some(ErrorCode::STREAM_MESSAGE_EXCEEDS_MAXIMUM) => {
                Failure::permanent(FailureClass::TooLarge, text)
            }
            Some(_) => Failure::retryable(FailureClass::Unavailable, text),
            None => Failure::retryable(FailureClass::Other, text),
        },
        _ => Failure::retryable(FailureClass::Unavailable, text),
    }
}

/// The JetStream error code a publish error carries, if the server answered with one.
fn jetstream_code(error: &PublishError) -> Option<ErrorCode> {
    use std::error::Error as _;
    error
        .source()?
        .downcast_ref::<async_nats::jetstream::Error>()
        .map(async_nats::jetstream::Error::error_code)
}
