//! Errors that stop a route from starting ([`KafkaSinkError`]), and the classification of
//! librdkafka's errors into per-message [`Failure`]s ([`classify`]).
//!
//! # Classification
//!
//! The rule: a failure tied to this message (too large, a topic that does not exist or
//! cannot exist, a record the broker refuses) is **permanent**; a failure of the
//! connection, the cluster's state or the producer is **retryable**, so messages wait for
//! the cluster instead of filling the dead letters. Authorization failures are retryable
//! too: they hit every message of the route and need an operator, not a dead letter per
//! message.
//!
//! | librdkafka says | class | retryable |
//! |---|---|---|
//! | `MSG_SIZE_TOO_LARGE` (local, over `message.max.bytes`; or the broker's `MessageSizeTooLarge`), `MessageBatchTooLarge`, `InvalidMessageSize` | `TooLarge` | **no** |
//! | `UNKNOWN_TOPIC` (local), `UnknownTopicOrPartition`, `InvalidTopic`, `UNKNOWN_PARTITION` | `Rejected` | **no** |
//! | `InvalidMessage`, `InvalidRecord`, `CorruptMessage`, `InvalidTimestamp`, `UnsupportedForMessageFormat`, `PolicyViolation`, `INVALID_ARG`, `BAD_MSG` | `Rejected` | **no** |
//! | `TopicAuthorizationFailed`, `ClusterAuthorizationFailed`, `SaslAuthenticationFailed`, `AUTHENTICATION`, `SSL` | `Config` | yes |
//! | `MSG_TIMED_OUT` (no acknowledgement within `message.timeout.ms`; the message may have been written) | `Timeout` | yes |
//! | `RequestTimedOut`, `TIMED_OUT` | `Timeout` | yes |
//! | `TRANSPORT`, `ALL_BROKERS_DOWN`, `RESOLVE`, `NetworkException`, `BrokerNotAvailable` | `Connection` | yes |
//! | `NotEnoughReplicas`, `NotEnoughReplicasAfterAppend`, `NotLeaderForPartition`, `LeaderNotAvailable`, `KafkaStorageError`, other broker errors | `Unavailable` | yes |
//! | `QUEUE_FULL` (the producer's local queue; the message was not sent) | `Unavailable` | yes, not counted as an attempt |
//! | `ThrottlingQuotaExceeded` | `RateLimited` | yes |
//! | `FATAL` (the idempotent producer's state is lost, e.g. `OutOfOrderSequenceNumber`), `ProducerFenced`, `PURGE_*`, the producer dropped | `Unavailable` | yes (the producer is rebuilt) |
//! | checked before sending: a topic the template cannot render or that is not a legal topic name | `Config` | **no** |
//! | checked before sending: a message header named `outbox-…` (reserved for the sink's own headers) | `Serialization` | **no** |
//! | checked before sending: the rendered topic does not exist (metadata, once per topic) | `Rejected` | **no** |
//! | checked before sending: the metadata shows the topic with an error (e.g. `LeaderNotAvailable` while it is being created) | `Unavailable` | yes |
//!
//! A message is never marked published from anything but its own delivery report with an
//! offset. After a fatal error the sink drops the producer; the next publish builds a new
//! one (a new producer id), and the messages of the failed batch are retried by the relay.

use outbox_engine::{Failure, FailureClass};
use rdkafka::error::{KafkaError, RDKafkaErrorCode as Code};

/// Why a Kafka route could not be configured or started.
///
/// Every variant says what is wrong and how to fix it; a route never starts in a weaker
/// mode than configured.
///
/// ```
/// use outbox_sink_kafka::{KafkaSinkConfig, KafkaSinkError};
///
/// match KafkaSinkConfig::new("kafka://127.0.0.1:9092").property("acks", "1").validate() {
///     Err(KafkaSinkError::InvalidSetting { setting, .. }) => assert_eq!(setting, "acks"),
///     other => panic!("{other:?}"),
/// }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KafkaSinkError {
    /// The URL does not parse or has the wrong scheme.
    #[error("invalid Kafka URL {url}: {reason}")]
    InvalidUrl {
        /// The URL with secret options hidden.
        url: String,
        /// What is wrong.
        reason: String,
    },
    /// The topic template does not parse or names an illegal topic.
    #[error("invalid topic template: {reason}")]
    InvalidTemplate {
        /// The template (cut to 128 characters).
        template: String,
        /// What is wrong.
        reason: String,
    },
    /// A setting or librdkafka property is out of range, refused, or given twice.
    #[error("invalid setting `{setting}`: {reason}")]
    InvalidSetting {
        /// The setting's or property's name.
        setting: String,
        /// What is wrong (never the value of a secret property).
        reason: String,
    },
    /// librdkafka refused the producer's configuration.
    #[error("librdkafka refused the producer configuration: {reason}")]
    Client {
        /// librdkafka's reason, naming the property (values left out).
        reason: String,
    },
    /// No broker answered within `connect_timeout`, or the cluster refused the client.
    #[error("cannot reach the Kafka brokers {brokers}: {reason}")]
    Connect {
        /// The bootstrap brokers.
        brokers: String,
        /// librdkafka's error.
        reason: String,
        /// Whether trying again can help.
        retryable: bool,
    },
    /// The configured (fixed) topic does not exist on the cluster.
    #[error(
        "topic {topic:?} does not exist on the Kafka cluster at {brokers}; create it before starting the route"
    )]
    TopicNotFound {
        /// The topic's name.
        topic: String,
        /// The bootstrap brokers.
        brokers: String,
    },
}

impl KafkaSinkError {
    /// Whether trying again can help: only when the brokers could not be reached. A bad
    /// setting, a refused login or a missing topic needs a change first.
    ///
    /// ```
    /// use outbox_sink_kafka::KafkaSinkConfig;
    /// let e = KafkaSinkConfig::new("kafka://k:0").validate().unwrap_err();
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

/// The per-message failure for a librdkafka error seen while publishing.
///
/// ```
/// use outbox_engine::FailureClass;
/// use rdkafka::error::{KafkaError, RDKafkaErrorCode};
///
/// let too_large = KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge);
/// let failure = outbox_sink_kafka::classify(&too_large);
/// assert_eq!(failure.class, FailureClass::TooLarge);
/// assert!(!failure.retryable);
///
/// let down = KafkaError::MessageProduction(RDKafkaErrorCode::AllBrokersDown);
/// assert!(outbox_sink_kafka::classify(&down).retryable);
/// ```
pub fn classify(error: &KafkaError) -> Failure {
    let Some(code) = error.rdkafka_error_code() else {
        return Failure::retryable(FailureClass::Unavailable, error.to_string());
    };
    let text = format!("{code:?}: {code}");
    use FailureClass as C;
    match code {
        Code::MessageSizeTooLarge | Code::MessageBatchTooLarge | Code::InvalidMessageSize => {
            Failure::permanent(C::TooLarge, text)
        }
        Code::UnknownTopic
        | Code::UnknownTopicOrPartition
        | Code::InvalidTopic
        | Code::UnknownPartition
        | Code::InvalidMessage
        | Code::InvalidRecord
        | Code::InvalidTimestamp
        | Code::UnsupportedForMessageFormat
        | Code::PolicyViolation
        | Code::InvalidArgument
        | Code::BadMessage => Failure::permanent(C::Rejected, text),
        Code::TopicAuthorizationFailed
        | Code::ClusterAuthorizationFailed
        | Code::SaslAuthenticationFailed
        | Code::Authentication
        | Code::SSL
        | Code::UnsupportedSASLMechanism
        | Code::IllegalSASLState => Failure::retryable(C::Config, text),
        Code::MessageTimedOut => Failure::retryable(
            C::Timeout,
            format!(
                "{text} (no acknowledgement within message.timeout.ms; it may have been written)"
            ),
        ),
        Code::RequestTimedOut | Code::OperationTimedOut => Failure::retryable(C::Timeout, text),
        Code::BrokerTransportFailure
        | Code::AllBrokersDown
        | Code::Resolve
        | Code::NetworkException
        | Code::BrokerNotAvailable => Failure::retryable(C::Connection, text),
        Code::QueueFull => Failure::retryable(C::Unavailable, text).deferred(),
        Code::ThrottlingQuotaExceeded => Failure::retryable(C::RateLimited, text),
        _ => Failure::retryable(C::Unavailable, text),
    }
}

/// librdkafka's configuration error without the value it quotes (which may be a secret).
pub(crate) fn config_error(error: &KafkaError) -> String {
    match error {
        KafkaError::ClientConfig(_, description, key, _) => {
            format!("property `{key}`: {}", without_value(description))
        }
        other => other.to_string(),
    }
}

/// librdkafka's descriptions quote the refused value (`Invalid value "x" for …`); keep
/// the rest.
fn without_value(description: &str) -> String {
    let mut out = String::with_capacity(description.len());
    let mut quoted = false;
    for c in description.chars() {
        if c == '"' {
            quoted = !quoted;
            if quoted {
                out.push_str("\"…\"");
            }
        } else if !quoted {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_class_of_the_table() {
        let class = |code| {
            let f = classify(&KafkaError::MessageProduction(code));
            (f.class, f.retryable, f.deferred)
        };
        use FailureClass as C;
        for (code, expected) in [
            (Code::MessageSizeTooLarge, (C::TooLarge, false, false)),
            (Code::UnknownTopicOrPartition, (C::Rejected, false, false)),
            (Code::UnknownTopic, (C::Rejected, false, false)),
            (Code::TopicAuthorizationFailed, (C::Config, true, false)),
            (Code::MessageTimedOut, (C::Timeout, true, false)),
            (Code::BrokerTransportFailure, (C::Connection, true, false)),
            (Code::NotEnoughReplicas, (C::Unavailable, true, false)),
            (Code::QueueFull, (C::Unavailable, true, true)),
            (Code::ThrottlingQuotaExceeded, (C::RateLimited, true, false)),
            (Code::Fatal, (C::Unavailable, true, false)),
            (
                Code::OutOfOrderSequenceNumber,
                (C::Unavailable, true, false),
            ),
        ] {
            assert_eq!(class(code), expected, "{code:?}");
        }
        assert!(classify(&KafkaError::Canceled).retryable);
    }

    #[test]
    fn configuration_errors_never_quote_values() {
        assert_eq!(
            without_value(r#"Invalid value "hunter2" for configuration property "sasl.mechanism""#),
            r#"Invalid value "…" for configuration property "…""#
        );
    }
}
