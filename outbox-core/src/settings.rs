//! The relay and retry settings as a configuration file gives them. Every field is
//! optional; one that is absent keeps the default of [`RelayBuilder`] or
//! [`RetryPolicy`], so the defaults are defined once, there.
//!
//! ```
//! use outbox_engine::settings::{RelaySettings, RetrySettings};
//! use outbox_engine::{MemoryStore, Relay, testkit::RecordingSink};
//!
//! let relay: RelaySettings = serde_json::from_str(r#"{ "batch_size": 50, "lease": "1m", "ordering": "per-key" }"#)?;
//! let retry: RetrySettings = serde_json::from_str(r#"{ "max_attempts": 10, "max_delay": "10m" }"#)?;
//! let relay = Relay::builder(MemoryStore::new())
//!     .settings(&relay)
//!     .retry(retry.policy())
//!     .route("billing", RecordingSink::new())
//!     .build()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! [`RelayBuilder`]: crate::RelayBuilder

use std::time::Duration;

use serde::Deserialize;

use crate::retry::RetryPolicy;
use crate::store::{DeadHead, MessageOrder};

/// Relay settings; see the [`RelayBuilder`](crate::RelayBuilder) method of each name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct RelaySettings {
    /// The lease owner name (default `relay-PID-RANDOM`).
    pub owner: Option<String>,
    /// Rows per claim, 1 to 10,000 (default 100).
    pub batch_size: Option<usize>,
    /// Workers, each claiming and publishing its own batches, 1 to 1,024 (default 1).
    pub concurrency: Option<usize>,
    /// How long a claimed row stays with this relay before any relay may claim it again
    /// (default 30 s).
    #[serde(with = "crate::duration::optional")]
    pub lease: Option<Duration>,
    /// Longest publish call, shorter than the lease (default half the lease).
    #[serde(with = "crate::duration::optional")]
    pub publish_timeout: Option<Duration>,
    /// Poll interval, the fallback when no wakeup arrives (default 1 s).
    #[serde(with = "crate::duration::optional")]
    pub poll_interval: Option<Duration>,
    /// How long shutdown waits for in-flight batches before releasing them (default 10 s).
    #[serde(with = "crate::duration::optional")]
    pub shutdown_grace: Option<Duration>,
    /// Claim every destination and dead-letter those without a route (default false:
    /// rows without a route wait for a relay that has one).
    pub dead_letter_unrouted: Option<bool>,
    /// `unordered` (default) or `per-key`.
    pub ordering: Option<OrderingSetting>,
    /// With `per-key`: `skip` (default) or `halt` on a dead head.
    pub dead_head: Option<DeadHead>,
    /// Listen for wakeups where the store has them (default on).
    pub wakeups: Option<bool>,
    /// Shortest time between two claims caused by wakeups (default 1 ms).
    #[serde(with = "crate::duration::optional")]
    pub min_wakeup_interval: Option<Duration>,
    /// Read and export the store's gauges (default on).
    pub gauges: Option<bool>,
    /// How often the gauges are read (default 10 s).
    #[serde(with = "crate::duration::optional")]
    pub gauge_interval: Option<Duration>,
    /// Most rows a gauge read counts (default 50,000).
    pub gauge_limit: Option<usize>,
}

/// The ordering mode's name in a configuration file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum OrderingSetting {
    /// No ordering.
    Unordered,
    /// Per partition key and destination, in commit order.
    PerKey,
}

impl RelaySettings {
    /// The ordering mode these settings ask for, if any.
    pub fn order(&self) -> Option<MessageOrder> {
        self.ordering.map(|ordering| match ordering {
            OrderingSetting::Unordered => MessageOrder::Unordered,
            OrderingSetting::PerKey => MessageOrder::PerKey(self.dead_head.unwrap_or_default()),
        })
    }
}

/// Retry settings; see the [`RetryPolicy`] method of each name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct RetrySettings {
    /// First backoff (default 1 s).
    #[serde(with = "crate::duration::optional")]
    pub initial_delay: Option<Duration>,
    /// Backoff cap (default 5 min).
    #[serde(with = "crate::duration::optional")]
    pub max_delay: Option<Duration>,
    /// Attempts before dead-lettering (default 25).
    pub max_attempts: Option<u32>,
    /// Dead-letter when the next attempt would start later than this after creation
    /// (default 3 days).
    #[serde(with = "crate::duration::optional")]
    pub max_age: Option<Duration>,
}

impl RetrySettings {
    /// The default policy with these settings applied.
    pub fn policy(&self) -> RetryPolicy {
        let mut policy = RetryPolicy::default();
        if let Some(delay) = self.initial_delay {
            policy = policy.initial_delay(delay);
        }
        if let Some(delay) = self.max_delay {
            policy = policy.max_delay(delay);
        }
        if let Some(attempts) = self.max_attempts {
            policy = policy.max_attempts(attempts);
        }
        if let Some(age) = self.max_age {
            policy = policy.max_age(Some(age));
        }
        policy
    }
}
