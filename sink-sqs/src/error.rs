//! Errors that stop a route from starting ([`SqsSinkError`]), and the classification of
//! SQS's answers into per-message [`Failure`]s.
//!
//! # Classification
//!
//! A `SendMessageBatch` call answers per entry: an entry in `Successful` is published (its
//! SQS message id is the receipt); an entry in `Failed` with `SenderFault = true` is
//! **permanent** (SQS says this entry is wrong; retrying sends the same entry), with
//! `SenderFault = false` it is retryable. A sender fault whose code is about the route
//! rather than the entry (throttling, credentials, KMS, as in the table below) is retried. An entry in neither list, or whose answer cannot
//! be matched to it, is retryable.
//!
//! When the whole call fails:
//!
//! | SQS says | class | retryable |
//! |---|---|---|
//! | `BatchRequestTooLong` | `TooLarge` | the batch is sent again as halves; a single entry: **no** |
//! | `InvalidParameterValue`, `InvalidMessageContents`, `MissingParameter`, `InvalidAttributeName`, `InvalidAttributeValue`, `ValidationError`, `InvalidParameterCombination` | `Rejected` | the batch is sent again as halves (one entry may be the cause); a single entry: **no** |
//! | `QueueDoesNotExist` (`AWS.SimpleQueueService.NonExistentQueue`) | `Config` | yes (every message of the route; an operator recreates the queue) |
//! | `AccessDenied`, `InvalidClientTokenId`, `SignatureDoesNotMatch`, `ExpiredToken`, `UnrecognizedClient`, `Kms…` (other than throttling), other credential errors | `Config` | yes (every message of the route) |
//! | `Throttling`, `RequestThrottled`, `KmsThrottled`, `OverLimit` | `RateLimited` | yes |
//! | `InternalError`, `ServiceUnavailable`, any HTTP 5xx | `Unavailable` | yes |
//! | `TooManyEntriesInBatchRequest`, `EmptyBatchRequest`, `BatchEntryIdsNotDistinct`, `InvalidBatchEntryId` (the sink's own mistake) | `Other` | yes |
//! | no answer in time | `Timeout` | yes (the messages may have been sent) |
//! | connection refused, reset, DNS, TLS | `Connection` | yes |
//! | an answer that does not parse | `Unavailable` | yes (the messages may have been sent) |
//! | any other error | `Other` | yes |
//!
//! Checked before sending, permanent:
//!
//! | problem | class |
//! |---|---|
//! | the body and attributes are larger than the queue's `MaximumMessageSize` | `TooLarge` |
//! | a payload that is not SQS text (UTF-8 without control characters other than tab, CR, LF; no U+FFFE/U+FFFF) with `binary = refuse` | `Serialization` |
//! | a header, tenant or other attribute value with characters SQS refuses | `Serialization` |
//! | a message header named `outbox-…` (reserved for the sink's attributes) | `Serialization` |
//! | an empty idempotency key or event type (a row written by hand) | `Serialization` |

use aws_sdk_sqs::error::{ProvideErrorMetadata, SdkError};
use outbox_engine::{Failure, FailureClass};

/// Why an SQS route could not be configured or started.
///
/// ```
/// use outbox_sink_sqs::{SqsSinkConfig, SqsSinkError};
///
/// match SqsSinkConfig::new("sqs://us-east-1/q?binary=hex").validate() {
///     Err(SqsSinkError::InvalidSetting { setting, .. }) => assert_eq!(setting, "binary"),
///     other => panic!("{other:?}"),
/// }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SqsSinkError {
    /// The URL does not parse, has the wrong scheme, or names no legal queue.
    #[error("invalid url {url} (an SQS queue URL): {reason}")]
    InvalidUrl {
        /// The URL with secrets hidden.
        url: String,
        /// What is wrong.
        reason: String,
    },
    /// A setting is out of range, refused, or given twice.
    #[error("invalid setting `{setting}`: {reason}")]
    InvalidSetting {
        /// The setting's name.
        setting: String,
        /// What is wrong (never a secret's value).
        reason: String,
    },
    /// No region was configured and the environment names none.
    #[error(
        "no AWS region for queue {queue}: give it in the URL (sqs://REGION/QUEUE), as `region`, or set AWS_REGION"
    )]
    NoRegion {
        /// The queue.
        queue: String,
    },
    /// SQS could not be reached, or refused the client, while reading the queue.
    #[error("cannot read SQS queue {queue}: {reason}")]
    Connect {
        /// The queue (name or URL).
        queue: String,
        /// What SQS or the connection said.
        reason: String,
        /// Whether trying again can help.
        retryable: bool,
    },
    /// The queue does not exist.
    #[error("SQS queue {queue} does not exist; create it before starting the route")]
    QueueNotFound {
        /// The queue (name or URL).
        queue: String,
    },
}

impl SqsSinkError {
    /// Whether trying again can help: only when SQS could not be reached or answered
    /// with a passing error. A bad setting, a refused login or a missing queue needs a
    /// change first.
    ///
    /// ```
    /// use outbox_sink_sqs::SqsSinkConfig;
    /// let e = SqsSinkConfig::new("sqs://us-east-1/bad name").validate().unwrap_err();
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

/// What to do after a whole call failed.
#[derive(Debug)]
pub(crate) enum CallFailure {
    /// SQS refused the request for a reason one entry may cause: send it again as halves
    /// (a single entry fails with the failure).
    Split(Failure),
    /// Every entry of the call fails with this.
    All(Failure),
}

/// The failure of an entry that SQS listed in `Failed`: with `SenderFault` permanent,
/// unless its code says the route, not the entry, is at fault (throttling, credentials,
/// KMS, SQS unavailable); without it retryable.
pub(crate) fn entry_failure(code: &str, message: Option<&str>, sender_fault: bool) -> Failure {
    let text = match message {
        Some(message) if !message.is_empty() => format!("SQS refused the entry: {code}: {message}"),
        _ => format!("SQS refused the entry: {code}"),
    };
    let route_wide = match classify_code(Some(code), None, String::new()) {
        CallFailure::All(f) => matches!(
            f.class,
            FailureClass::RateLimited | FailureClass::Config | FailureClass::Unavailable
        )
        .then_some(f.class),
        CallFailure::Split(_) => None,
    };
    match (sender_fault, route_wide) {
        (true, None) => Failure::permanent(FailureClass::Rejected, text),
        (true, Some(class)) => Failure::retryable(class, text),
        (false, class) => Failure::retryable(class.unwrap_or(FailureClass::Unavailable), text),
    }
}

/// Classifies a failed call of the SDK.
pub(crate) fn call_failure<E>(error: &SdkError<E>) -> CallFailure
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
{
    let text = || causes(error);
    match error {
        SdkError::ServiceError(service) => {
            let status = service.raw().status().as_u16();
            classify_code(service.err().code(), Some(status), text())
        }
        SdkError::TimeoutError(_) => CallFailure::All(Failure::retryable(
            FailureClass::Timeout,
            format!(
                "no answer from SQS in time; the messages may have been sent: {}",
                text()
            ),
        )),
        SdkError::DispatchFailure(dispatch) => {
            let class = if dispatch.is_timeout() {
                FailureClass::Timeout
            } else {
                FailureClass::Connection
            };
            CallFailure::All(Failure::retryable(class, text()))
        }
        SdkError::ResponseError(_) => CallFailure::All(Failure::retryable(
            FailureClass::Unavailable,
            format!(
                "SQS's answer could not be read; the messages may have been sent: {}",
                text()
            ),
        )),
        _ => CallFailure::All(Failure::retryable(FailureClass::Config, text())),
    }
}

/// `error` and its sources, joined with `: `, each said once (the SDK's errors nest the
/// same text at several levels).
fn causes(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let said = cause.to_string();
        if !text.contains(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        source = cause.source();
    }
    text
}

/// The classification table for a whole call refused with `code` (and HTTP `status`).
pub(crate) fn classify_code(code: Option<&str>, status: Option<u16>, text: String) -> CallFailure {
    let code = code.unwrap_or("");
    let short = code.strip_prefix("AWS.SimpleQueueService.").unwrap_or(code);
    let split = |class| CallFailure::Split(Failure::permanent(class, text.clone()));
    let all = |class| CallFailure::All(Failure::retryable(class, text.clone()));
    match short {
        "BatchRequestTooLong" => split(FailureClass::TooLarge),
        "InvalidParameterValue"
        | "InvalidMessageContents"
        | "MissingParameter"
        | "InvalidAttributeName"
        | "InvalidAttributeValue"
        | "ValidationError"
        | "ValidationException"
        | "InvalidParameterCombination" => split(FailureClass::Rejected),
        "NonExistentQueue" | "QueueDoesNotExist" => all(FailureClass::Config),
        "Throttling"
        | "ThrottlingException"
        | "RequestThrottled"
        | "KmsThrottled"
        | "OverLimit" => all(FailureClass::RateLimited),
        "TooManyEntriesInBatchRequest"
        | "EmptyBatchRequest"
        | "BatchEntryIdsNotDistinct"
        | "InvalidBatchEntryId" => all(FailureClass::Other),
        "AccessDenied"
        | "AccessDeniedException"
        | "InvalidClientTokenId"
        | "UnrecognizedClientException"
        | "SignatureDoesNotMatch"
        | "ExpiredToken"
        | "ExpiredTokenException"
        | "InvalidSecurity"
        | "IncompleteSignature"
        | "MissingAuthenticationToken"
        | "RequestExpired"
        | "InvalidAddress"
        | "OptInRequired" => all(FailureClass::Config),
        kms if kms.to_ascii_lowercase().starts_with("kms") => {
            if kms.to_ascii_lowercase().contains("throttl") {
                all(FailureClass::RateLimited)
            } else {
                all(FailureClass::Config)
            }
        }
        "InternalError" | "InternalFailure" | "ServiceUnavailable" => {
            all(FailureClass::Unavailable)
        }
        _ if status.is_some_and(|s| s >= 500) => all(FailureClass::Unavailable),
        _ => all(FailureClass::Other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(code: &str, status: u16) -> (bool, FailureClass, bool) {
        match classify_code(Some(code), Some(status), "t".into()) {
            CallFailure::Split(f) => (true, f.class, f.retryable),
            CallFailure::All(f) => (false, f.class, f.retryable),
        }
    }

    #[test]
    fn the_table_holds() {
        use FailureClass as C;
        for (code, status, expected) in [
            ("BatchRequestTooLong", 400, (true, C::TooLarge, false)),
            (
                "AWS.SimpleQueueService.BatchRequestTooLong",
                400,
                (true, C::TooLarge, false),
            ),
            ("InvalidParameterValue", 400, (true, C::Rejected, false)),
            ("MissingParameter", 400, (true, C::Rejected, false)),
            (
                "AWS.SimpleQueueService.NonExistentQueue",
                400,
                (false, C::Config, true),
            ),
            ("QueueDoesNotExist", 400, (false, C::Config, true)),
            ("InvalidClientTokenId", 403, (false, C::Config, true)),
            ("KmsAccessDenied", 400, (false, C::Config, true)),
            ("KmsThrottled", 400, (false, C::RateLimited, true)),
            (
                "KMS.ThrottlingException",
                400,
                (false, C::RateLimited, true),
            ),
            ("KMS.DisabledException", 400, (false, C::Config, true)),
            ("ThrottlingException", 400, (false, C::RateLimited, true)),
            ("BatchEntryIdsNotDistinct", 400, (false, C::Other, true)),
            ("InternalError", 500, (false, C::Unavailable, true)),
            ("SomethingNew", 503, (false, C::Unavailable, true)),
            ("SomethingNew", 400, (false, C::Other, true)),
        ] {
            assert_eq!(class(code, status), expected, "{code} ({status})");
        }
    }

    #[test]
    fn entries_fail_by_sender_fault() {
        let mine = entry_failure("InvalidParameterValue", Some("bad"), true);
        assert!(!mine.retryable && mine.class == FailureClass::Rejected);
        assert!(
            mine.message.contains("InvalidParameterValue: bad"),
            "{}",
            mine.message
        );
        let theirs = entry_failure("InternalError", None, false);
        assert!(theirs.retryable && theirs.class == FailureClass::Unavailable);
        // A sender fault that is the route's, not the entry's: retried, not dead-lettered.
        let throttled = entry_failure("ThrottlingException", None, true);
        assert!(throttled.retryable && throttled.class == FailureClass::RateLimited);
        let key = entry_failure("KmsAccessDenied", Some("no access to the key"), true);
        assert!(key.retryable && key.class == FailureClass::Config);
        let unknown = entry_failure("SomethingNew", None, true);
        assert!(!unknown.retryable, "an unknown sender fault is the entry's");
    }
}
