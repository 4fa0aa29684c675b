//! What a batch waits for before its messages count as acknowledged.

use std::time::Duration;

use serde::Deserialize;

use super::invalid;
use crate::error::RedisSinkError;

/// What a batch waits for, after its appends and in the same round trip, before its
/// messages count as acknowledged.
///
/// When the server answers with fewer acknowledgements than asked, every message of the
/// batch fails retryably (the appends happened; with deduplication on, the retry does not
/// append again). [`RedisSink::connect`](crate::RedisSink::connect) refuses to start a
/// route whose server cannot honour the setting at all: `WAITAOF` on a server older than
/// 7.2 or with `appendonly no` (when `local` is set), or more replicas than are connected.
///
/// ```
/// use std::time::Duration;
/// use outbox_sink_redis::Durability;
///
/// // fsync to the local AOF before acknowledging (Redis >= 7.2, appendonly yes).
/// let fsync = Durability::wait_aof(true, 0, Duration::from_secs(1));
/// // Received by one replica.
/// let replicated = Durability::wait(1, Duration::from_millis(500));
/// assert_ne!(fsync, replicated);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(tag = "mode", rename_all = "snake_case", deny_unknown_fields)]
#[non_exhaustive]
pub enum Durability {
    /// The `XADD` reply is the acknowledgement (Redis has the entry in memory).
    #[default]
    None,
    /// `WAIT <replicas> <timeout>`: the writes reached this many replicas.
    Wait {
        /// Replicas that must have received the batch.
        replicas: u32,
        /// How long to wait (must be above zero and below the response timeout).
        #[serde(
            default = "Durability::default_timeout",
            deserialize_with = "outbox_engine::duration::deserialize"
        )]
        timeout: Duration,
    },
    /// `WAITAOF <local> <replicas> <timeout>` (Redis >= 7.2): the writes were fsynced to
    /// the append-only file locally (`local`) and on this many replicas.
    #[serde(alias = "waitaof")]
    WaitAof {
        /// Wait for the local AOF fsync.
        local: bool,
        /// Replicas that must have fsynced the batch.
        replicas: u32,
        /// How long to wait (must be above zero and below the response timeout).
        #[serde(
            default = "Durability::default_timeout",
            deserialize_with = "outbox_engine::duration::deserialize"
        )]
        timeout: Duration,
    },
}

impl Durability {
    /// The default wait, 1 s.
    ///
    /// ```
    /// # use outbox_sink_redis::Durability;
    /// assert_eq!(Durability::DEFAULT_TIMEOUT.as_secs(), 1);
    /// ```
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);

    fn default_timeout() -> Duration {
        Self::DEFAULT_TIMEOUT
    }

    /// `WAIT <replicas> <timeout>`.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use outbox_sink_redis::Durability;
    /// let d = Durability::wait(2, Duration::from_millis(250));
    /// assert_eq!(d.timeout(), Some(Duration::from_millis(250)));
    /// ```
    pub fn wait(replicas: u32, timeout: Duration) -> Self {
        Self::Wait { replicas, timeout }
    }

    /// `WAITAOF <local> <replicas> <timeout>`.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use outbox_sink_redis::Durability;
    /// let d = Durability::wait_aof(true, 1, Duration::from_secs(1));
    /// assert!(matches!(d, Durability::WaitAof { local: true, replicas: 1, .. }));
    /// ```
    pub fn wait_aof(local: bool, replicas: u32, timeout: Duration) -> Self {
        Self::WaitAof {
            local,
            replicas,
            timeout,
        }
    }

    /// The wait timeout, if any.
    ///
    /// ```
    /// # use outbox_sink_redis::Durability;
    /// assert_eq!(Durability::None.timeout(), None);
    /// ```
    pub fn timeout(&self) -> Option<Duration> {
        match self {
            Self::None => None,
            Self::Wait { timeout, .. } | Self::WaitAof { timeout, .. } => Some(*timeout),
        }
    }

    pub(super) fn parse(text: &str, timeout: Duration) -> Result<Self, RedisSinkError> {
        let bad = || {
            invalid(
                "durability",
                format!("{text:?}: use none, wait:<replicas> or waitaof:<numlocal>:<numreplicas>"),
            )
        };
        let parts: Vec<&str> = text.split(':').collect();
        match parts.as_slice() {
            ["none"] => Ok(Self::None),
            ["wait", replicas] => Ok(Self::wait(replicas.parse().map_err(|_| bad())?, timeout)),
            ["waitaof", local, replicas] => {
                let local = match *local {
                    "0" => false,
                    "1" => true,
                    _ => return Err(bad()),
                };
                Ok(Self::wait_aof(
                    local,
                    replicas.parse().map_err(|_| bad())?,
                    timeout,
                ))
            }
            _ => Err(bad()),
        }
    }

    pub(super) fn validate(&self, response_timeout: Duration) -> Result<(), RedisSinkError> {
        if let Some(timeout) = self.timeout() {
            if timeout < Duration::from_millis(1) {
                return Err(invalid(
                    "durability.timeout",
                    "must be at least 1 ms (Redis reads 0 as wait forever)",
                ));
            }
            if timeout >= response_timeout {
                return Err(invalid(
                    "durability.timeout",
                    format!(
                        "{timeout:?} must be shorter than response_timeout ({response_timeout:?}), or every wait would time out the batch"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// How the setting reads in messages: `WAIT 1 500` or `WAITAOF 1 0 1000`.
    pub(crate) fn describe(&self) -> String {
        match self {
            Self::None => "none".to_owned(),
            Self::Wait { replicas, timeout } => format!("WAIT {replicas} {}", timeout.as_millis()),
            Self::WaitAof {
                local,
                replicas,
                timeout,
            } => format!(
                "WAITAOF {} {replicas} {}",
                u8::from(*local),
                timeout.as_millis()
            ),
        }
    }
}
