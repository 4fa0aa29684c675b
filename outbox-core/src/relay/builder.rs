//! The [`RelayBuilder`]: a relay's routes and settings, checked by `build`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::{Inner, Relay};
use crate::clock::{Clock, SystemClock};
use crate::error::{ConfigError, MessageError};
use crate::health::{GaugeSettings, RelayHealth};
use crate::message::check_destination_name;
use crate::retry::RetryPolicy;
use crate::sink::{DynSink, Sink};
use crate::store::{ClaimRequest, MessageOrder, Store};
use crate::wakeup::Wakeup;

/// Builds a [`Relay`].
///
/// ```
/// use std::time::Duration;
/// use outbox_engine::{MemoryStore, Relay, RetryPolicy, testkit::RecordingSink};
///
/// let store = MemoryStore::new();
/// let relay = Relay::builder(store.clone())
///     .route("billing", RecordingSink::new())
///     .batch_size(100)
///     .concurrency(2)
///     .lease(Duration::from_secs(30))
///     .poll_interval(Duration::from_millis(500))
///     .wakeup(store.wakeup())
///     .retry(RetryPolicy::default().max_attempts(10))
///     .build()?;
/// # Ok::<(), outbox_engine::ConfigError>(())
/// ```
#[must_use = "a builder does nothing until `build` is called"]
pub struct RelayBuilder<S> {
    store: S,
    routes: HashMap<String, Arc<dyn DynSink>>,
    owner: String,
    batch_size: usize,
    concurrency: usize,
    lease: Duration,
    publish_timeout: Option<Duration>,
    poll_interval: Duration,
    shutdown_grace: Duration,
    dead_letter_unrouted: bool,
    wakeup: Option<Wakeup>,
    min_wakeup_interval: Duration,
    retry: RetryPolicy,
    ordering: MessageOrder,
    clock: Arc<dyn Clock>,
    gauges: Option<GaugeSettings>,
}

impl<S: Store> RelayBuilder<S> {
    pub(super) fn new(store: S) -> Self {
        Self {
            store,
            routes: HashMap::new(),
            owner: format!("relay-{}-{:04x}", std::process::id(), fastrand::u16(..)),
            batch_size: 100,
            concurrency: 1,
            lease: Duration::from_secs(30),
            publish_timeout: None,
            poll_interval: Duration::from_secs(1),
            shutdown_grace: Duration::from_secs(10),
            dead_letter_unrouted: false,
            wakeup: None,
            min_wakeup_interval: Duration::from_millis(1),
            retry: RetryPolicy::default(),
            ordering: MessageOrder::Unordered,
            clock: Arc::new(SystemClock),
            gauges: Some(GaugeSettings::default()),
        }
    }

    /// Publishes messages whose destination is `destination` through `sink`.
    pub fn route(mut self, destination: impl Into<String>, sink: impl Sink) -> Self {
        self.routes.insert(destination.into(), Arc::new(sink));
        self
    }

    /// Like [`route`](Self::route), for a sink that is already shared or type-erased.
    pub fn route_dyn(mut self, destination: impl Into<String>, sink: Arc<dyn DynSink>) -> Self {
        self.routes.insert(destination.into(), sink);
        self
    }

    /// The name stored as `lease_owner` (default `relay-<pid>-<random>`).
    pub fn owner(mut self, owner: impl Into<String>) -> Self {
        self.owner = owner.into();
        self
    }

    /// Rows per claim (1..=10,000; default 100).
    pub fn batch_size(mut self, n: usize) -> Self {
        self.batch_size = n;
        self
    }

    /// Workers, each claiming and publishing its own batches (default 1).
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n;
        self
    }

    /// How long a claim holds its rows (default 30 s). A relay that dies holding rows
    /// delays them by at most this long.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// How long one publish call may take before it counts as a retryable timeout
    /// (default: half the lease; must be shorter than the lease).
    pub fn publish_timeout(mut self, timeout: Duration) -> Self {
        self.publish_timeout = Some(timeout);
        self
    }

    /// How long an idle worker waits before claiming again without a wakeup (default 1 s).
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval;
        self
    }

    /// How long shutdown waits for in-flight batches before releasing their leases
    /// (default 10 s).
    pub fn shutdown_grace(mut self, grace: Duration) -> Self {
        self.shutdown_grace = grace;
        self
    }

    /// Claims every destination, and dead-letters the messages of destinations that have
    /// no route as a permanent `unknown_destination` failure.
    ///
    /// Off by default: a relay claims only the destinations it routes and leaves the
    /// others to the relays that route them, so several relays with different routes can
    /// share one table. Turn it on only for a relay that is the table's sole reader, to
    /// surface messages written for a destination nobody serves.
    pub fn dead_letter_unrouted(mut self, enabled: bool) -> Self {
        self.dead_letter_unrouted = enabled;
        self
    }

    /// Wakes idle workers when this signal is raised (in-process enqueue, LISTEN/NOTIFY).
    /// Several sources can share one signal. Polling stays on as the fallback.
    pub fn wakeup(mut self, wakeup: Wakeup) -> Self {
        self.wakeup = Some(wakeup);
        self
    }

    /// The shortest time between two claims caused by wakeups (default 1 ms). A wakeup
    /// wakes one idle worker; the wakeups raised during the next `interval` are coalesced
    /// into one more claim at its end. Under load (a wakeup per commit) this turns
    /// thousands of one-row claims per second into at most one claim per interval, each
    /// taking every row committed meanwhile, so the relay does not tax the writers'
    /// database; a lone commit is still claimed at once. `Duration::ZERO` claims on every
    /// wakeup.
    pub fn min_wakeup_interval(mut self, interval: Duration) -> Self {
        self.min_wakeup_interval = interval;
        self
    }

    /// The retry policy (default [`RetryPolicy::default`]).
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = policy;
        self
    }

    /// The ordering mode (default [`MessageOrder::Unordered`]). With
    /// [`MessageOrder::PerKey`] the store hands out only the oldest unfinished message of
    /// each key, so a key never has two messages in flight and a failing message holds
    /// back only its own key. Per route: run one relay per ordering mode, each routing
    /// its own destinations.
    pub fn ordering(mut self, ordering: MessageOrder) -> Self {
        self.ordering = ordering;
        self
    }

    /// Applies every setting that `settings` gives (the others keep their values).
    pub fn settings(mut self, settings: &crate::settings::RelaySettings) -> Self {
        if let Some(owner) = &settings.owner {
            self.owner = owner.clone();
        }
        if let Some(n) = settings.batch_size {
            self.batch_size = n;
        }
        if let Some(n) = settings.concurrency {
            self.concurrency = n;
        }
        if let Some(lease) = settings.lease {
            self.lease = lease;
        }
        if let Some(timeout) = settings.publish_timeout {
            self.publish_timeout = Some(timeout);
        }
        if let Some(poll) = settings.poll_interval {
            self.poll_interval = poll;
        }
        if let Some(interval) = settings.min_wakeup_interval {
            self.min_wakeup_interval = interval;
        }
        if let Some(grace) = settings.shutdown_grace {
            self.shutdown_grace = grace;
        }
        if let Some(enabled) = settings.dead_letter_unrouted {
            self.dead_letter_unrouted = enabled;
        }
        if let Some(order) = settings.order() {
            self.ordering = order;
        }
        if let Some(enabled) = settings.gauges {
            self = self.gauges(enabled);
        }
        if let Some(interval) = settings.gauge_interval {
            self = self.gauge_interval(interval);
        }
        if let Some(limit) = settings.gauge_limit {
            self = self.gauge_limit(limit);
        }
        self
    }

    /// Whether the running relay reads the store's gauges and exports them as metrics
    /// (default on): `outbox_backlog`, `outbox_leased`, `outbox_dead_letters`,
    /// `outbox_halted_keys` and `outbox_oldest_pending_age_seconds` per destination, and
    /// `outbox_gauges_truncated`. They describe the whole table, so with several relays on
    /// one table, one exporting them is enough: turn it off on the others.
    pub fn gauges(mut self, enabled: bool) -> Self {
        self.gauges = enabled.then(|| self.gauges.unwrap_or_default());
        self
    }

    /// How often the gauges are read (default 10 s).
    pub fn gauge_interval(mut self, interval: Duration) -> Self {
        if let Some(gauges) = &mut self.gauges {
            gauges.interval = interval;
        }
        self
    }

    /// How many unfinished (and dead) rows a gauge read counts at most (default 50,000);
    /// past it the counts are lower bounds and `outbox_gauges_truncated` is 1.
    pub fn gauge_limit(mut self, limit: usize) -> Self {
        if let Some(gauges) = &mut self.gauges {
            gauges.limit = limit;
        }
        self
    }

    /// The clock used for retry ages and lag metrics (default: system clock).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Checks the settings and builds the relay.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming the setting that is out of range, the setting that needs
    /// what the store's [`capabilities`](Store::capabilities) lack, or
    /// [`ConfigError::NoRoutes`].
    pub fn build(self) -> Result<Relay<S>, ConfigError> {
        let invalid = |setting, reason: &str| ConfigError::InvalidSetting {
            setting,
            reason: reason.to_owned(),
        };
        if self.routes.is_empty() {
            return Err(ConfigError::NoRoutes);
        }
        for route in self.routes.keys() {
            if let Err(MessageError::InvalidField { reason, .. }) = check_destination_name(route) {
                let route = route.clone();
                return Err(ConfigError::InvalidRoute { route, reason });
            }
        }
        if !(1..=10_000).contains(&self.batch_size) {
            return Err(invalid("batch_size", "must be between 1 and 10000"));
        }
        if !(1..=1024).contains(&self.concurrency) {
            return Err(invalid("concurrency", "must be between 1 and 1024"));
        }
        if self.lease < Duration::from_millis(10) {
            return Err(invalid("lease", "must be at least 10 ms"));
        }
        let publish_timeout = self.publish_timeout.unwrap_or(self.lease / 2);
        if publish_timeout.is_zero() || publish_timeout >= self.lease {
            return Err(invalid(
                "publish_timeout",
                "must be above zero and shorter than the lease, or a slow publish would outlive its lease",
            ));
        }
        if self.poll_interval.is_zero() {
            return Err(invalid("poll_interval", "must be above zero"));
        }
        if let Some(gauges) = self.gauges {
            if gauges.interval < Duration::from_millis(10) {
                return Err(invalid("gauge_interval", "must be at least 10 ms"));
            }
            if gauges.limit == 0 {
                return Err(invalid("gauge_limit", "must be above zero"));
            }
        }
        if self.owner.is_empty() || self.owner.len() > 255 {
            return Err(invalid("owner", "must be 1 to 255 bytes"));
        }
        let capabilities = self.store.capabilities();
        if self.ordering != MessageOrder::Unordered && !capabilities.per_key_ordering {
            return Err(ConfigError::Unsupported {
                store: capabilities.store,
                capability: "per-key ordering",
                setting: "ordering",
            });
        }
        let mut destinations: Vec<String> = self.routes.keys().cloned().collect();
        destinations.sort();
        let mut claim =
            ClaimRequest::new(self.owner, self.batch_size, self.lease).ordering(self.ordering);
        if !self.dead_letter_unrouted {
            claim = claim.destinations(destinations);
        }
        let health = RelayHealth::new(
            self.lease,
            self.gauges.unwrap_or_default(),
            self.routes.keys().cloned(),
        );
        Ok(Relay {
            inner: Arc::new(Inner {
                store: self.store,
                routes: self.routes.into_iter().collect(),
                claim,
                publish_timeout,
                retry: self.retry,
                clock: self.clock,
                in_flight: Mutex::default(),
                overlapped_claims: capabilities.overlapped_claims,
                health,
            }),
            gauges: self.gauges,
            concurrency: self.concurrency,
            poll_interval: self.poll_interval,
            shutdown_grace: self.shutdown_grace,
            wakeup: self.wakeup.unwrap_or_default(),
            min_wakeup_interval: self.min_wakeup_interval,
            ordering: self.ordering,
        })
    }
}
