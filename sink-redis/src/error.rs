//! Errors that stop a route from starting ([`RedisSinkError`]), and the classification of
//! Redis errors into per-message [`Failure`]s ([`classify`], [`classify_reply`]).
//!
//! # Classification
//!
//! The rule: a failure that would hit every message of the route (the connection, the
//! server's state, authentication, permissions, memory) is **retryable**, so messages wait
//! for the server or an operator instead of filling the dead letters; a failure tied to
//! this message or its rendered stream key is **permanent**.
//!
//! | Redis says | class | retryable |
//! |---|---|---|
//! | I/O timeout, response timeout | `Timeout` | yes |
//! | connection refused / reset / closed, other I/O, protocol desync | `Connection` | yes |
//! | `LOADING`, `BUSY`, `TRYAGAIN`, `MASTERDOWN`, `CLUSTERDOWN`, `READONLY`, `MISCONF`, `ERR max number of clients` | `Unavailable` | yes |
//! | `OOM` (maxmemory reached under `noeviction`; consumers trimming or acking frees it) | `Unavailable` | yes, after 1 s |
//! | `NOAUTH`, `WRONGPASS`, `NOPERM` (also the `ERR` form an ACL denial takes inside a script), `ERR unknown command` (renamed or disabled) | `Config` | yes |
//! | `NOSCRIPT` (script cache flushed; the sink reloads it) | `Other` | yes |
//! | `WRONGTYPE` (the stream or dedupe key holds another type) | `Config` | **no** |
//! | any other `ERR` (the server refused this command's arguments) | `Rejected` | **no** |
//! | an error code this table does not know | `Other` | yes |
//!
//! Errors raised inside the dedupe script carry the code of the command that failed
//! (`WRONGTYPE`, `OOM`, …) and are classified by it; Redis before 7.0 wraps them in
//! `ERR Error running script …`, which is unwrapped first. A script error with no inner
//! code is a genuine script failure on this message's arguments: permanent `Rejected`.

use std::time::Duration;

use outbox_engine::{Failure, FailureClass};
use redis::{ErrorKind, RedisError, ServerErrorKind};

/// Why a Redis route could not be configured or started.
///
/// Every variant says what is wrong and how to fix it; a route never starts in a weaker
/// mode than configured.
///
/// ```
/// use outbox_sink_redis::{RedisSinkConfig, RedisSinkError};
///
/// match RedisSinkConfig::from_url("redis://127.0.0.1/?stream=orders.{oops}")?.validate() {
///     Err(RedisSinkError::InvalidTemplate { reason, .. }) => assert!(reason.contains("{oops}")),
///     other => panic!("{other:?}"),
/// }
/// # Ok::<(), RedisSinkError>(())
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RedisSinkError {
    /// The URL does not parse, has the wrong scheme, or carries an unknown option.
    #[error("invalid Redis URL {url}: {reason}")]
    InvalidUrl {
        /// The URL with its password hidden.
        url: String,
        /// What is wrong.
        reason: String,
    },
    /// A `rediss://` URL was given but no TLS feature is enabled.
    #[error(
        "rediss:// needs TLS support: enable the `tls-rustls` or `tls-native-tls` feature of outbox-sink-redis"
    )]
    TlsNotEnabled,
    /// The stream template does not parse.
    #[error("invalid stream template: {reason}")]
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
    /// The server could not be reached, refused the credentials, or failed a start-up
    /// command.
    #[error("cannot use Redis at {url}: {source}")]
    Connect {
        /// The URL with its password hidden.
        url: String,
        /// The client's error.
        #[source]
        source: RedisError,
    },
    /// The server lacks something the sink needs (version, scripting).
    #[error("Redis at {url} is not supported: {reason}")]
    Unsupported {
        /// The URL with its password hidden.
        url: String,
        /// What is missing.
        reason: String,
    },
    /// The configured durability cannot be honoured by this server.
    #[error("durability {requested} cannot be honoured by Redis at {url}: {reason}")]
    DurabilityUnavailable {
        /// The setting, as the command it sends (`WAITAOF 1 0 1000`).
        requested: String,
        /// The URL with its password hidden.
        url: String,
        /// Why, and what to change.
        reason: String,
    },
    /// The fixed stream key already holds a value that is not a stream.
    #[error("stream key {key:?} at {url} holds a {found}, not a stream")]
    WrongType {
        /// The key.
        key: String,
        /// The URL with its password hidden.
        url: String,
        /// The type `TYPE` reported.
        found: String,
    },
}

impl RedisSinkError {
    /// Whether trying again can help: only when the server could not be reached (or
    /// refused a start-up command for now); every other error needs a configuration or
    /// server change.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Connect { .. })
    }
}

/// Classifies an error from the Redis client (a whole round trip or one reply) as a
/// [`Failure`]; see the [module docs](self) for the table.
///
/// ```
/// use outbox_engine::FailureClass;
/// use outbox_sink_redis::classify;
///
/// let refused = redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
/// let failure = classify(&refused);
/// assert!(failure.retryable);
/// assert_eq!(failure.class, FailureClass::Connection);
/// ```
pub fn classify(error: &RedisError) -> Failure {
    if let Some(code) = error.code() {
        let detail = error.detail().unwrap_or_default();
        return classify_reply(code, detail);
    }
    let text = error.to_string();
    match error.kind() {
        _ if error.is_timeout() => Failure::retryable(FailureClass::Timeout, text),
        ErrorKind::Io | ErrorKind::Parse => Failure::retryable(FailureClass::Connection, text),
        ErrorKind::AuthenticationFailed | ErrorKind::InvalidClientConfig => {
            Failure::retryable(FailureClass::Config, text)
        }
        ErrorKind::Server(kind) => classify_reply(server_code(kind), &text),
        _ => Failure::retryable(FailureClass::Other, text),
    }
}

/// Classifies an error reply by its code (`WRONGTYPE`) and detail (the rest of the line);
/// see the [module docs](self) for the table.
///
/// ```
/// use outbox_engine::FailureClass;
/// use outbox_sink_redis::classify_reply;
///
/// let oom = classify_reply("OOM", "command not allowed when used memory > 'maxmemory'.");
/// assert!(oom.retryable);
/// let wrong = classify_reply("WRONGTYPE", "Operation against a key holding the wrong kind of value");
/// assert!(!wrong.retryable);
/// assert_eq!(wrong.class, FailureClass::Config);
/// ```
pub fn classify_reply(code: &str, detail: &str) -> Failure {
    let text = if detail.is_empty() {
        code.to_owned()
    } else {
        format!("{code} {detail}")
    };
    if code == "ERR"
        && let Some(inner) = script_inner_code(detail)
    {
        return classify_reply(inner, detail);
    }
    match code {
        "LOADING" | "BUSY" | "TRYAGAIN" | "MASTERDOWN" | "CLUSTERDOWN" | "READONLY" | "MISCONF" => {
            Failure::retryable(FailureClass::Unavailable, text)
        }
        "OOM" => Failure::retryable(FailureClass::Unavailable, text)
            .with_retry_after(Duration::from_secs(1)),
        "NOAUTH" | "WRONGPASS" | "NOPERM" => Failure::retryable(FailureClass::Config, text),
        "NOSCRIPT" => Failure::retryable(FailureClass::Other, text),
        "WRONGTYPE" => Failure::permanent(FailureClass::Config, text),
        "ERR" if detail.starts_with("max number of clients") => {
            Failure::retryable(FailureClass::Unavailable, text)
        }
        // An ACL denial inside a script (Redis 7 reports it as ERR, not NOPERM).
        "ERR"
            if detail.starts_with("unknown command")
                || detail.starts_with("The user executing the script can't run") =>
        {
            Failure::retryable(FailureClass::Config, text)
        }
        "ERR" => Failure::permanent(FailureClass::Rejected, text),
        _ => Failure::retryable(FailureClass::Other, text),
    }
}

/// Redis before 7.0 reports an error raised by a command inside a script as
/// `ERR Error running script (call to f_<sha>): @user_script:<line>: <CODE> <detail>`.
fn script_inner_code(detail: &str) -> Option<&str> {
    if !detail.starts_with("Error running script") {
        return None;
    }
    let after = detail.split("@user_script:").nth(1)?;
    let (_, rest) = after.split_once(": ")?;
    let code = rest.split_whitespace().next()?;
    let is_code = code.len() >= 2 && code.bytes().all(|b| b.is_ascii_uppercase());
    (is_code && code != "ERR").then_some(code)
}

fn server_code(kind: ServerErrorKind) -> &'static str {
    match kind {
        ServerErrorKind::BusyLoading => "LOADING",
        ServerErrorKind::NoScript => "NOSCRIPT",
        ServerErrorKind::TryAgain => "TRYAGAIN",
        ServerErrorKind::ClusterDown => "CLUSTERDOWN",
        ServerErrorKind::MasterDown => "MASTERDOWN",
        ServerErrorKind::ReadOnly => "READONLY",
        ServerErrorKind::NoPerm => "NOPERM",
        ServerErrorKind::ResponseError => "ERR",
        _ => "UNKNOWN",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(code: &str, detail: &str, class: FailureClass, retryable: bool) {
        let f = classify_reply(code, detail);
        assert_eq!(
            (f.class, f.retryable),
            (class, retryable),
            "{code} {detail}"
        );
        assert!(f.message.starts_with(code), "{}", f.message);
    }

    #[test]
    fn server_states_are_retryable() {
        for code in [
            "LOADING",
            "BUSY",
            "TRYAGAIN",
            "MASTERDOWN",
            "CLUSTERDOWN",
            "READONLY",
            "MISCONF",
        ] {
            check(code, "x", FailureClass::Unavailable, true);
        }
        let oom = classify_reply("OOM", "command not allowed");
        assert_eq!(oom.retry_after, Some(Duration::from_secs(1)));
        check(
            "ERR",
            "max number of clients reached",
            FailureClass::Unavailable,
            true,
        );
        check(
            "NOAUTH",
            "Authentication required.",
            FailureClass::Config,
            true,
        );
        check(
            "WRONGPASS",
            "invalid username-password pair",
            FailureClass::Config,
            true,
        );
        check(
            "NOPERM",
            "this user has no permissions",
            FailureClass::Config,
            true,
        );
        check("ERR", "unknown command 'XADD'", FailureClass::Config, true);
        check(
            "ERR",
            "The user executing the script can't run this command or subcommand script: abc, on @user_script:35.",
            FailureClass::Config,
            true,
        );
        check("NOSCRIPT", "No matching script.", FailureClass::Other, true);
        check("SOMETHINGNEW", "future error", FailureClass::Other, true);
    }

    #[test]
    fn message_specific_errors_are_permanent() {
        check(
            "WRONGTYPE",
            "Operation against a key holding the wrong kind of value script: abc, on @user_script:9.",
            FailureClass::Config,
            false,
        );
        check("ERR", "syntax error", FailureClass::Rejected, false);
        check(
            "ERR",
            "Error running script (call to f_abc): @user_script:3: user_script:3: attempt to call a nil value",
            FailureClass::Rejected,
            false,
        );
    }

    #[test]
    fn pre_7_script_errors_are_unwrapped() {
        let f = classify_reply(
            "ERR",
            "Error running script (call to f_abc): @user_script:12: WRONGTYPE Operation against a key holding the wrong kind of value",
        );
        assert_eq!((f.class, f.retryable), (FailureClass::Config, false));
        let f = classify_reply(
            "ERR",
            "Error running script (call to f_abc): @user_script:12: OOM command not allowed when used memory > 'maxmemory'.",
        );
        assert_eq!((f.class, f.retryable), (FailureClass::Unavailable, true));
    }

    #[test]
    fn client_errors() {
        let timeout = RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut));
        assert_eq!(classify(&timeout).class, FailureClass::Timeout);
        assert!(classify(&timeout).retryable);
        let reset = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert_eq!(classify(&reset).class, FailureClass::Connection);
        assert!(classify(&reset).retryable);
        let server = redis::make_extension_error("BUSY".into(), Some("running a script".into()));
        let f = classify(&server);
        assert_eq!((f.class, f.retryable), (FailureClass::Unavailable, true));
        assert_eq!(f.message, "BUSY running a script");
    }
}
