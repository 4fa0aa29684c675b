//! Errors that stop a route from starting ([`AmqpSinkError`]), and the classification of
//! broker answers into per-message [`Failure`]s ([`classify`]).
//!
//! # Classification
//!
//! The rule: a failure that would hit every message of the route (the connection, the
//! broker's state, permissions, a missing exchange) is **retryable**, so messages wait for
//! the broker or an operator instead of filling the dead letters; a failure tied to this
//! message (it could not be routed to any queue, it is too large) is **permanent**.
//!
//! | the broker or the client says | class | retryable |
//! |---|---|---|
//! | `basic.ack` after `basic.return` (mandatory message reached no queue, e.g. `312 NO_ROUTE`) | `Unroutable` | **no** |
//! | `basic.nack` (the broker could not take it: a queue's leader is down, an internal error) | `Unavailable` | yes |
//! | no confirm before the publish deadline (the message may have arrived) | `Timeout` | yes |
//! | connection refused / reset / closed, missed heartbeats, a closed channel or connection | `Connection` | yes |
//! | publishers blocked by a memory or disk alarm (`connection.blocked`); the message was not sent | `Unavailable` | yes, not counted as an attempt |
//! | `403 ACCESS_REFUSED`, `404 NOT_FOUND` (the exchange does not exist), `530 NOT_ALLOWED` | `Config` | yes |
//! | `406 PRECONDITION_FAILED` naming the message size (over the broker's `max_message_size`) | `TooLarge` | **no** |
//! | another `406`, or any other channel error, for a message sent alone | `Rejected` | **no** |
//! | `501 FRAME_ERROR`, `502 SYNTAX_ERROR`, `503 COMMAND_INVALID`, `505 UNEXPECTED_FRAME` closing the connection after a message sent alone | `Rejected` | **no** |
//! | `320 CONNECTION_FORCED` (an operator closed it, the broker is stopping), `506 RESOURCE_ERROR`, other connection errors | `Unavailable` | yes |
//! | checked before sending: payload over `max_payload_bytes` | `TooLarge` | **no** |
//! | checked before sending: properties (the headers) over the connection's `frame_max`, which would make the broker close the connection | `TooLarge` | **no** |
//! | checked before sending: exchange or routing key the template cannot render, or over 255 bytes | `Config` | **no** |
//! | checked before sending: a header named `outbox-…` (reserved for the sink's own headers), a name over 255 bytes | `Serialization` | **no** |
//! | checked before sending: the rendered exchange does not exist (a passive declare, once per name) | `Config` | yes |
//!
//! When no channel could be had at all (the broker is down, refuses the login, or blocks
//! publishers), nothing was sent: those failures are *deferred*, so the relay waits
//! (100 ms doubling to 5 s between connection attempts) without counting an attempt, and
//! an outage never exhausts `max_attempts`.
//!
//! A channel error closes the channel and fails every unconfirmed message on it, not only
//! the one that caused it. The sink therefore sends those messages again one at a time,
//! on a fresh channel, within the same publish: each then gets the answer to its own
//! publish, so one bad message is dead-lettered alone and the others go through. Missing
//! exchanges, the common cause, are caught before sending; keep `max_payload_bytes` at
//! or below the broker's `max_message_size` so oversize messages are too (lapin 4.12 can
//! send publishes queued on a closing channel after its `close-ok`, and the broker then
//! closes the whole connection: the batch is retried, nothing is lost).

use lapin::protocol::{AMQPErrorKind, AMQPHardError, AMQPSoftError};
use lapin::{Error as LapinError, ErrorKind};
use outbox_engine::{Failure, FailureClass};

/// Why an AMQP route could not be configured or started.
///
/// Every variant says what is wrong and how to fix it; a route never starts in a weaker
/// mode than configured.
///
/// ```
/// use outbox_sink_amqp::{AmqpSinkConfig, AmqpSinkError};
///
/// match AmqpSinkConfig::from_url("amqp://127.0.0.1/%2f?routing_key=orders.{oops}")?.validate() {
///     Err(AmqpSinkError::InvalidTemplate { reason, .. }) => assert!(reason.contains("{oops}")),
///     other => panic!("{other:?}"),
/// }
/// # Ok::<(), AmqpSinkError>(())
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AmqpSinkError {
    /// The URL does not parse, has the wrong scheme, or carries an unknown option.
    #[error("invalid AMQP URL {url}: {reason}")]
    InvalidUrl {
        /// The URL with its password hidden.
        url: String,
        /// What is wrong.
        reason: String,
    },
    /// An `amqps://` URL was given but no TLS feature is enabled.
    #[error(
        "amqps:// needs TLS support: enable the `tls-rustls` or `tls-native-tls` feature of outbox-sink-amqp"
    )]
    TlsNotEnabled,
    /// A TLS file could not be read.
    #[error("cannot read `{setting}` file {path}: {reason}")]
    TlsFile {
        /// The setting naming the file.
        setting: &'static str,
        /// The file's path.
        path: String,
        /// What went wrong.
        reason: String,
    },
    /// The exchange or routing key template does not parse.
    #[error("invalid {setting} template: {reason}")]
    InvalidTemplate {
        /// `exchange` or `routing_key`.
        setting: &'static str,
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
    /// The broker could not be reached, refused the credentials or the vhost, or failed
    /// a start-up step.
    #[error("cannot use the AMQP broker at {url}: {source}")]
    Connect {
        /// The URL with its password hidden.
        url: String,
        /// The client's error.
        #[source]
        source: LapinError,
    },
    /// The configured (fixed) exchange does not exist on the broker.
    #[error(
        "exchange {exchange:?} does not exist on the AMQP broker at {url}; declare it (and bind its queues) before starting the route"
    )]
    ExchangeNotFound {
        /// The exchange's name.
        exchange: String,
        /// The URL with its password hidden.
        url: String,
    },
}

impl AmqpSinkError {
    /// Whether trying again can help: only when the broker could not be reached or was
    /// not ready. A refused login, a missing vhost or exchange, or a bad setting needs a
    /// change first.
    ///
    /// ```
    /// use outbox_sink_amqp::AmqpSinkError;
    /// assert!(!AmqpSinkError::TlsNotEnabled.is_retryable());
    /// ```
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Connect { source, .. } => classify(source).class != FailureClass::Config,
            _ => false,
        }
    }
}

/// The per-message failure for a client or broker error `error` seen while publishing.
///
/// ```
/// use outbox_engine::FailureClass;
///
/// let closed = lapin::Error::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
/// let failure = outbox_sink_amqp::classify(&closed);
/// assert_eq!(failure.class, FailureClass::Connection);
/// assert!(failure.retryable);
/// ```
pub fn classify(error: &LapinError) -> Failure {
    let text = error.to_string();
    match error.kind() {
        ErrorKind::ProtocolError(amqp) => {
            let reply = format!("{} {}", amqp.get_id(), amqp.get_message());
            match amqp.kind() {
                AMQPErrorKind::Soft(AMQPSoftError::ACCESSREFUSED | AMQPSoftError::NOTFOUND)
                | AMQPErrorKind::Hard(AMQPHardError::NOTALLOWED) => {
                    Failure::retryable(FailureClass::Config, format!("broker refused: {reply}"))
                }
                AMQPErrorKind::Soft(AMQPSoftError::PRECONDITIONFAILED)
                    if amqp.get_message().as_str().contains("size") =>
                {
                    Failure::permanent(FailureClass::TooLarge, format!("broker refused: {reply}"))
                }
                AMQPErrorKind::Soft(_) => {
                    Failure::permanent(FailureClass::Rejected, format!("broker refused: {reply}"))
                }
                // The broker could not read what was sent: for a message sent alone,
                // that message.
                AMQPErrorKind::Hard(
                    AMQPHardError::FRAMEERROR
                    | AMQPHardError::SYNTAXERROR
                    | AMQPHardError::COMMANDINVALID
                    | AMQPHardError::UNEXPECTEDFRAME,
                ) => Failure::permanent(
                    FailureClass::Rejected,
                    format!("broker closed the connection in answer to this message: {reply}"),
                ),
                AMQPErrorKind::Hard(_) => Failure::retryable(
                    FailureClass::Unavailable,
                    format!("broker closed the connection: {reply}"),
                ),
            }
        }
        _ => Failure::retryable(FailureClass::Connection, text),
    }
}
