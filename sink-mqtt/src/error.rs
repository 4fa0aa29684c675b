//! Errors that stop a route from starting ([`MqttSinkError`]), and the classification of
//! the broker's answers into per-message [`Failure`]s.
//!
//! # Classification
//!
//! A message is published only on its `PUBACK` (with a success reason code, on MQTT 5).
//!
//! | the broker or the client says | class | retryable |
//! |---|---|---|
//! | `PUBACK` 0x87 not authorized (MQTT 5) | `Rejected` | **no** |
//! | `PUBACK` 0x90 topic name invalid (MQTT 5) | `Config` | **no** |
//! | `PUBACK` 0x99 payload format invalid (MQTT 5) | `Rejected` | **no** |
//! | `PUBACK` 0x97 quota exceeded (MQTT 5) | `RateLimited` | yes |
//! | `PUBACK` 0x80, 0x83, 0x91 (unspecified, implementation specific, packet id in use) | `Unavailable` | yes |
//! | checked before sending: payload over `max_payload_bytes` or the packet over the broker's maximum packet size | `TooLarge` | **no** |
//! | checked before sending: a topic the template cannot render, empty, with a wildcard, NUL or a leading `$` | `Config` | **no** |
//! | checked before sending: a header named `outbox-…`, or a header with NUL | `Serialization` | **no** |
//! | the connection closed before the `PUBACK` (the message may have arrived) | `Connection` | yes |
//! | no connection could be made (the broker is down or refused the login) | `Connection` | yes, deferred |
//! | no `PUBACK` before the publish deadline | `Timeout` | yes |
//!
//! MQTT 3.1.1 has no reason codes: a broker that refuses a publish (an ACL) either
//! acknowledges it and drops it or closes the connection. Use MQTT 5 where the broker
//! enforces ACLs on publishers.

use outbox_engine::{Failure, FailureClass};

/// Why an MQTT route could not be configured or started.
///
/// ```
/// use outbox_sink_mqtt::{MqttSinkConfig, MqttSinkError};
///
/// match MqttSinkConfig::from_url("mqtt://127.0.0.1?topic=orders/{oops}")?.validate() {
///     Err(MqttSinkError::InvalidTemplate { reason, .. }) => assert!(reason.contains("{oops}")),
///     other => panic!("{other:?}"),
/// }
/// # Ok::<(), MqttSinkError>(())
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MqttSinkError {
    /// The URL does not parse, has the wrong scheme, or carries an unknown option.
    #[error("invalid MQTT URL {url}: {reason}")]
    InvalidUrl {
        /// The URL with its password hidden.
        url: String,
        /// What is wrong.
        reason: String,
    },
    /// A TLS file could not be read, or holds no usable certificate or key.
    #[error("cannot use the `{setting}` file {path}: {reason}")]
    TlsFile {
        /// The setting naming the file.
        setting: &'static str,
        /// The file's path.
        path: String,
        /// What went wrong (never the file's content).
        reason: String,
    },
    /// The topic template does not parse, or names a topic MQTT cannot publish to.
    #[error("invalid topic template: {reason}")]
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
    /// The broker could not be reached, or refused the connection.
    #[error("cannot connect to the MQTT broker at {url}: {reason}")]
    Connect {
        /// The URL with its password hidden.
        url: String,
        /// What went wrong.
        reason: String,
        /// Whether trying again later can help (the broker was unreachable or busy,
        /// rather than refusing the login or the protocol version).
        retryable: bool,
    },
}

impl MqttSinkError {
    /// Whether trying again can help: only when the broker could not be reached or was
    /// busy. A refused login, protocol version or setting needs a change first.
    ///
    /// ```
    /// use outbox_sink_mqtt::MqttSinkError;
    /// let e = MqttSinkError::InvalidSetting { setting: "topic", reason: "empty".into() };
    /// assert!(!e.is_retryable());
    /// ```
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Self::Connect {
                retryable: true,
                ..
            }
        )
    }
}

/// The failure for an MQTT 5 `PUBACK` reason code other than success, by its number.
///
/// ```
/// use outbox_engine::FailureClass;
///
/// let failure = outbox_sink_mqtt::error::puback_failure(0x87);
/// assert_eq!(failure.class, FailureClass::Rejected);
/// assert!(!failure.retryable);
/// ```
pub fn puback_failure(code: u8) -> Failure {
    let said = |what: &str| format!("the broker answered PUBACK 0x{code:02x} ({what})");
    match code {
        0x87 => Failure::permanent(FailureClass::Rejected, said("not authorized")),
        0x90 => Failure::permanent(FailureClass::Config, said("topic name invalid")),
        0x99 => Failure::permanent(FailureClass::Rejected, said("payload format invalid")),
        0x97 => Failure::retryable(FailureClass::RateLimited, said("quota exceeded")),
        0x91 => Failure::retryable(FailureClass::Unavailable, said("packet identifier in use")),
        0x83 => Failure::retryable(
            FailureClass::Unavailable,
            said("implementation specific error"),
        ),
        _ => Failure::retryable(FailureClass::Unavailable, said("unspecified error")),
    }
}
