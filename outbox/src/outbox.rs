//! [`Outbox`]: the store, its routes, the wakeup listener, store metrics and graceful
//! shutdown, owned together.

use std::future::Future;

use outbox_engine::{
    AnyStore, Backend, BatchReport, DynStore, Listener, Relay, RelayBuilder, RelayHealth,
    RunningRelay, Sink, StoreError,
};

use crate::config::{Config, RouteTable};
use crate::{Error, Registry};

/// The relay side of an outbox, ready to run: the store, one sink per route, the wakeup
/// listener (kept alive as long as the `Outbox`), store gauges and graceful shutdown.
///
/// Built in code with [`Outbox::builder`], or from `outbox.toml` with
/// [`Outbox::from_config`]. Enqueueing stays with your store type, inside your own
/// transaction.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use outbox::{MemoryStore, NewMessage, Outbox, testkit::RecordingSink};
///
/// let store = MemoryStore::new();
/// let sink = RecordingSink::new();
/// let outbox = Outbox::builder(store.clone()).route("billing", sink.clone()).build().await?;
///
/// store.enqueue(NewMessage::builder("billing", "invoice.paid").json(&42).build()?)?;
/// assert_eq!(outbox.drain().await?.published, 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
pub struct Outbox {
    store: AnyStore,
    relay: Relay<AnyStore>,
    routes: Vec<String>,
    listener: Option<Listener>,
}

/// Builds an [`Outbox`] in code.
#[must_use = "a builder does nothing until `build` is awaited"]
pub struct OutboxBuilder {
    store: AnyStore,
    relay: RelayBuilder<AnyStore>,
    registry: Registry,
    urls: Vec<(String, RouteTable)>,
    routes: Vec<String>,
    wakeups: bool,
}

impl Outbox {
    /// Starts building an outbox over `store` (a `PgOutbox`, a `MemoryStore`, …).
    pub fn builder(store: impl DynStore) -> OutboxBuilder {
        Self::builder_any(AnyStore::new(store))
    }

    /// Like [`builder`](Self::builder), for a store chosen at run time.
    pub fn builder_any(store: AnyStore) -> OutboxBuilder {
        OutboxBuilder {
            relay: Relay::builder(store.clone()),
            store,
            registry: Registry::default(),
            urls: Vec::new(),
            routes: Vec::new(),
            wakeups: true,
        }
    }

    /// The outbox `config` describes, with the drivers of the enabled features.
    ///
    /// # Errors
    ///
    /// As for [`from_config_with`](Self::from_config_with).
    pub async fn from_config(config: &Config) -> Result<Self, Error> {
        Self::from_config_with(&Registry::default(), config).await
    }

    /// The outbox `config` describes, with `registry`'s drivers: the store from
    /// `[store]`, one sink per `[routes.*]` (its `url` scheme picks the driver, its
    /// policies wrap it), the `[relay]` and `[retry]` settings, and wakeups unless
    /// `relay.wakeups = false`.
    ///
    /// # Errors
    ///
    /// [`Error`] naming the store, the route or the setting that is wrong.
    pub async fn from_config_with(registry: &Registry, config: &Config) -> Result<Self, Error> {
        let store = registry.connect_store(&config.store).await?;
        let mut builder = Self::builder_any(store)
            .registry(registry.clone())
            .wakeups(config.relay.wakeups.unwrap_or(true))
            .relay(|relay| relay.settings(&config.relay).retry(config.retry.policy()));
        for (route, table) in &config.routes {
            builder = builder.route_table(route.clone(), table.clone());
        }
        builder.build().await
    }

    /// The store.
    pub fn store(&self) -> &AnyStore {
        &self.store
    }

    /// The routes' destinations.
    pub fn routes(&self) -> &[String] {
        &self.routes
    }

    /// Whether a wakeup listener is running (the store has one and wakeups are on).
    pub fn listens(&self) -> bool {
        self.listener.is_some()
    }

    /// Runs batches until a claim comes back empty; see [`Relay::drain`].
    ///
    /// # Errors
    ///
    /// The first [`StoreError`].
    pub async fn drain(&self) -> Result<BatchReport, StoreError> {
        self.relay.drain().await
    }

    /// The relay's liveness, readiness and latest gauges; see [`Relay::health`].
    pub fn health(&self) -> RelayHealth {
        self.relay.health()
    }

    /// Runs the relay until `shutdown` completes, then shuts down gracefully (see
    /// [`Relay::run`]); the relay exports the store's gauges meanwhile (see
    /// [`RelayBuilder::gauges`]). The wakeup listener lives until it returns.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send) {
        self.relay.run(shutdown).await;
        drop(self.listener);
    }

    /// Runs the relay in a task of its own on the current Tokio runtime, as
    /// [`run`](Self::run) does, until the handle's [`stop`](RunningRelay::stop).
    ///
    /// # Panics
    ///
    /// Outside a Tokio runtime.
    pub fn spawn(self) -> RunningRelay {
        RunningRelay::spawn(|shutdown| self.run(shutdown))
    }
}

impl OutboxBuilder {
    /// Publishes messages of `destination` through `sink`.
    pub fn route(mut self, destination: impl Into<String>, sink: impl Sink) -> Self {
        let destination = destination.into();
        self.routes.push(destination.clone());
        self.relay = self.relay.route(destination, sink);
        self
    }

    /// Publishes messages of `destination` to the sink `url` names, built by the
    /// registry when [`build`](Self::build) runs (e.g. `redis://cache:6379/?stream=events`).
    pub fn route_url(self, destination: impl Into<String>, url: impl Into<String>) -> Self {
        let table = RouteTable::new([("url", serde_json::Value::String(url.into()))]);
        self.route_table(destination, table)
    }

    /// Publishes messages of `destination` to the sink a route table describes.
    pub fn route_table(mut self, destination: impl Into<String>, table: RouteTable) -> Self {
        self.urls.push((destination.into(), table));
        self
    }

    /// The drivers [`route_url`](Self::route_url) and [`route_table`](Self::route_table)
    /// use (default: [`Registry::default`]).
    pub fn registry(mut self, registry: Registry) -> Self {
        self.registry = registry;
        self
    }

    /// Adjusts the relay: batch size, workers, lease, retry policy, ordering, …
    pub fn relay(
        mut self,
        adjust: impl FnOnce(RelayBuilder<AnyStore>) -> RelayBuilder<AnyStore>,
    ) -> Self {
        self.relay = adjust(self.relay);
        self
    }

    /// Listens for the store's wakeups (default on); polling stays on as the fallback.
    pub fn wakeups(mut self, enabled: bool) -> Self {
        self.wakeups = enabled;
        self
    }

    /// Builds the route sinks, starts the wakeup listener and checks the relay settings.
    ///
    /// # Errors
    ///
    /// A route's [`Error`], the listener's [`StoreError`], or invalid relay settings.
    pub async fn build(self) -> Result<Outbox, Error> {
        let Self {
            store,
            mut relay,
            registry,
            urls,
            mut routes,
            wakeups,
        } = self;
        for (destination, table) in urls {
            let sink = registry.build_sink(&destination, &table).await?;
            relay = relay.route_dyn(destination.clone(), sink);
            routes.push(destination);
        }
        let listener = if wakeups { store.listen().await? } else { None };
        if let Some(listener) = &listener {
            relay = relay.wakeup(listener.wakeup());
        }
        routes.sort();
        Ok(Outbox {
            relay: relay.build()?,
            store,
            routes,
            listener,
        })
    }
}
