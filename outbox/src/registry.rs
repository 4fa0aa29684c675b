//! The registry: URL scheme → driver, for stores and sinks.

use std::sync::Arc;

pub use outbox_engine::registry::{
    BuildError, CheckSink, RouteSettings, SchemaScript, SinkDriver, StoreDriver, no_check, scheme,
};
use outbox_engine::{AnyStore, DynSink, StoreSettings, redact};

use crate::Error;
use crate::config::RouteTable;

/// The schemes this crate has drivers for, with the Cargo feature that compiles each in.
const KNOWN: &[(&str, &str, &str)] = &[
    ("store", "postgres", "postgres"),
    ("store", "postgresql", "postgres"),
    ("store", "sqlite", "sqlite"),
    ("store", "mysql", "mysql"),
    ("store", "mariadb", "mysql"),
    ("store", "diesel+postgres", "postgres"),
    ("store", "diesel+postgresql", "postgres"),
    ("store", "diesel+sqlite", "sqlite"),
    ("store", "diesel+mysql", "mysql"),
    ("store", "diesel+mariadb", "mysql"),
    ("sink", "http", "http"),
    ("sink", "https", "http"),
    ("sink", "redis", "redis"),
    ("sink", "rediss", "redis"),
    ("sink", "amqp", "amqp"),
    ("sink", "amqps", "amqp"),
    ("sink", "kafka", "kafka"),
    ("sink", "sqs", "sqs"),
    ("sink", "sqs+https", "sqs"),
    ("sink", "sqs+http", "sqs"),
    ("sink", "nats", "nats"),
    ("sink", "nats+tls", "nats"),
    ("sink", "mqtt", "mqtt"),
    ("sink", "mqtts", "mqtt"),
];

/// `diesel+postgres://…`, `diesel+sqlite:PATH` and `diesel+mysql://…`: the URL without
/// its `diesel+` prefix, opened by the sqlx store of that database. A diesel application
/// enqueues with `outbox-diesel` on its own connections, and its relay drains the same
/// table through the one relay store each database has (decision 0038).
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
mod diesel {
    use outbox_engine::StoreSettings;
    use outbox_engine::registry::{BuildError, StoreDriver};

    /// `settings` with the `diesel+` prefix taken off the URL; `diesel+sqlite:` with
    /// nothing after it is refused here, where sqlx would open a database in memory.
    fn plain(settings: &StoreSettings) -> Result<StoreSettings, BuildError> {
        let url = settings
            .url
            .strip_prefix("diesel+")
            .unwrap_or(&settings.url);
        if matches!(url, "sqlite:" | "sqlite://") {
            return Err(BuildError::config(
                "store.url: diesel+sqlite: needs a file path",
            ));
        }
        let mut plain = settings.clone();
        plain.url = url.to_owned();
        Ok(plain)
    }

    macro_rules! alias {
        ($name:ident, $driver:path, $schemes:expr) => {
            pub(super) const $name: StoreDriver = StoreDriver {
                schemes: $schemes,
                connect: |settings| {
                    let plain = plain(settings);
                    Box::pin(async move { ($driver.connect)(&plain?).await })
                },
                schema: $driver.schema,
            };
        };
    }

    #[cfg(feature = "postgres")]
    alias!(
        POSTGRES,
        outbox_sqlx::POSTGRES,
        &["diesel+postgres", "diesel+postgresql"]
    );
    #[cfg(feature = "sqlite")]
    alias!(SQLITE, outbox_sqlx::SQLITE, &["diesel+sqlite"]);
    #[cfg(feature = "mysql")]
    alias!(
        MYSQL,
        outbox_sqlx::MYSQL,
        &["diesel+mysql", "diesel+mariadb"]
    );
}

/// The drivers stores and sinks are built with, by URL scheme.
///
/// [`Registry::default`] holds the drivers this crate's Cargo features compiled in; add
/// your own (a test sink, a broker this crate does not ship) with
/// [`with_sink`](Self::with_sink) and [`with_store`](Self::with_store). A scheme no
/// driver handles fails with an error naming the feature that would, if there is one.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use std::sync::Arc;
/// use outbox::config::RouteTable;
/// use outbox::registry::{SinkDriver, no_check};
/// use outbox::{DynSink, Registry, testkit::RecordingSink};
///
/// const MEMORY: SinkDriver = SinkDriver {
///     schemes: &["memory"],
///     build: |_| Box::pin(async { Ok(Arc::new(RecordingSink::new()) as Arc<dyn DynSink>) }),
///     check: no_check,
/// };
/// let registry = Registry::default().with_sink(MEMORY);
/// let route = RouteTable::new([("url", "memory://billing".into())]);
/// let sink = registry.build_sink("billing", &route).await?;
/// # Ok::<(), outbox::Error>(())
/// # }).unwrap();
/// ```
#[derive(Debug, Clone)]
pub struct Registry {
    stores: Vec<StoreDriver>,
    sinks: Vec<SinkDriver>,
}

impl Default for Registry {
    /// The drivers of the enabled features.
    fn default() -> Self {
        #[allow(unused_mut)] // with no features enabled nothing is pushed
        let mut registry = Self::empty();
        #[cfg(feature = "postgres")]
        registry
            .stores
            .extend([outbox_sqlx::POSTGRES, diesel::POSTGRES]);
        #[cfg(feature = "sqlite")]
        registry
            .stores
            .extend([outbox_sqlx::SQLITE, diesel::SQLITE]);
        #[cfg(feature = "mysql")]
        registry.stores.extend([outbox_sqlx::MYSQL, diesel::MYSQL]);
        #[cfg(feature = "http")]
        registry
            .sinks
            .push(SinkDriver::of::<outbox_sink_http::HttpSink>());
        #[cfg(feature = "redis")]
        registry
            .sinks
            .push(SinkDriver::of::<outbox_sink_redis::RedisSink>());
        #[cfg(feature = "amqp")]
        registry
            .sinks
            .push(SinkDriver::of::<outbox_sink_amqp::AmqpSink>());
        #[cfg(feature = "kafka")]
        registry
            .sinks
            .push(SinkDriver::of::<outbox_sink_kafka::KafkaSink>());
        #[cfg(feature = "sqs")]
        registry
            .sinks
            .push(SinkDriver::of::<outbox_sink_sqs::SqsSink>());
        #[cfg(feature = "nats")]
        registry
            .sinks
            .push(SinkDriver::of::<outbox_sink_nats::NatsSink>());
        #[cfg(feature = "mqtt")]
        registry
            .sinks
            .push(SinkDriver::of::<outbox_sink_mqtt::MqttSink>());
        registry
    }
}

impl Registry {
    /// No drivers at all.
    pub fn empty() -> Self {
        Self {
            stores: Vec::new(),
            sinks: Vec::new(),
        }
    }

    /// Adds a store driver; it is consulted before the ones already there.
    #[must_use]
    pub fn with_store(mut self, driver: StoreDriver) -> Self {
        self.stores.insert(0, driver);
        self
    }

    /// Adds a sink driver; it is consulted before the ones already there.
    #[must_use]
    pub fn with_sink(mut self, driver: SinkDriver) -> Self {
        self.sinks.insert(0, driver);
        self
    }

    /// Opens the store `settings` describe (nothing is created; see
    /// [`Backend::migrate`](outbox_engine::Backend::migrate)).
    ///
    /// # Errors
    ///
    /// [`Error::FeatureDisabled`] or [`Error::UnsupportedScheme`] for a scheme no driver
    /// handles; [`Error::Build`] when the driver fails (retryable if the server was not
    /// reachable).
    pub async fn connect_store(&self, settings: &StoreSettings) -> Result<AnyStore, Error> {
        let (driver, settings) = self.store_driver(settings)?;
        (driver.connect)(&settings)
            .await
            .map_err(|source| Error::Build {
                what: "store".to_owned(),
                source,
            })
    }

    /// The DDL that [`Backend::migrate`](outbox_engine::Backend::migrate) runs for the
    /// store `settings` describe, as one script for a team's own migration tool; nothing
    /// is connected to.
    ///
    /// # Errors
    ///
    /// As [`connect_store`](Self::connect_store) for the scheme; [`Error::Build`] when the
    /// store has no SQL schema or the table names are invalid.
    pub fn store_schema(&self, settings: &StoreSettings) -> Result<String, Error> {
        let (driver, settings) = self.store_driver(settings)?;
        let build = |source| Error::Build {
            what: "store".to_owned(),
            source,
        };
        let schema = driver
            .schema
            .ok_or_else(|| build(BuildError::config("this store has no schema to print")))?;
        schema(&settings).map_err(build)
    }

    /// Checks the store `settings` without connecting: a driver for the URL's scheme,
    /// and, where the store has an SQL schema, the table names.
    ///
    /// # Errors
    ///
    /// As for [`store_schema`](Self::store_schema).
    pub fn check_store(&self, settings: &StoreSettings) -> Result<(), Error> {
        let (driver, settings) = self.store_driver(settings)?;
        match driver.schema {
            Some(schema) => schema(&settings).map(drop).map_err(|source| Error::Build {
                what: "store".to_owned(),
                source,
            }),
            None => Ok(()),
        }
    }

    /// Builds the sink of `route` from its table (its `url` scheme picks the driver),
    /// wrapped in the route policies the table sets.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for a missing `url` or a bad policy; as for
    /// [`connect_store`](Self::connect_store) otherwise.
    pub async fn build_sink(
        &self,
        route: &str,
        table: &RouteTable,
    ) -> Result<Arc<dyn DynSink>, Error> {
        let driver = self.sink_driver(route, table)?;
        let policy = table.policy(route)?;
        let sink = (driver.build)(&table.sink_settings(route))
            .await
            .map_err(|source| Error::Build {
                what: format!("route {route:?}"),
                source,
            })?;
        Ok(policy.apply(route, sink))
    }

    /// Checks the sink settings of `route` without reaching a server: a driver for its
    /// `url` scheme, its policies, and the driver's own check (values, templates, the
    /// files and variables it names, read but never shown).
    ///
    /// # Errors
    ///
    /// As for [`build_sink`](Self::build_sink).
    pub fn check_sink(&self, route: &str, table: &RouteTable) -> Result<(), Error> {
        let driver = self.sink_driver(route, table)?;
        table.policy(route)?;
        (driver.check)(&table.sink_settings(route)).map_err(|source| Error::Build {
            what: format!("route {route:?}"),
            source,
        })
    }

    /// The driver of the store URL's scheme.
    /// The driver of the store URL's scheme, and the settings with the URL's own
    /// options ([`StoreSettings::with_url_options`]) moved in.
    fn store_driver(
        &self,
        settings: &StoreSettings,
    ) -> Result<(&StoreDriver, StoreSettings), Error> {
        let driver = self
            .stores
            .iter()
            .find(|d| d.handles(&settings.url))
            .ok_or_else(|| {
                let known = self.stores.iter().flat_map(|d| d.schemes.iter().copied());
                unknown("store.url".to_owned(), "store", &settings.url, known)
            })?;
        let settings = settings
            .clone()
            .with_url_options()
            .map_err(|source| Error::Build {
                what: "store".to_owned(),
                source,
            })?;
        Ok((driver, settings))
    }

    /// The driver of the scheme of `route`'s `url`.
    fn sink_driver(&self, route: &str, table: &RouteTable) -> Result<&SinkDriver, Error> {
        let url = table
            .url()
            .ok_or_else(|| Error::Config(format!("routes.{route}: missing `url`")))?;
        self.sinks.iter().find(|d| d.handles(url)).ok_or_else(|| {
            let known = self.sinks.iter().flat_map(|d| d.schemes.iter().copied());
            unknown(format!("routes.{route}.url"), "sink", url, known)
        })
    }
}

fn unknown<'a>(
    setting: String,
    what: &'static str,
    url: &str,
    known: impl Iterator<Item = &'a str>,
) -> Error {
    let wanted = scheme(url);
    if let Some((_, _, feature)) = KNOWN
        .iter()
        .find(|(kind, scheme, _)| *kind == what && *scheme == wanted)
    {
        return Error::FeatureDisabled {
            setting,
            what,
            scheme: wanted.to_owned(),
            feature,
        };
    }
    let known: Vec<String> = known.map(|s| format!("{s}:")).collect();
    Error::UnsupportedScheme {
        setting,
        what,
        url: redact::url(url),
        known: if known.is_empty() {
            "none".to_owned()
        } else {
            known.join(", ")
        },
    }
}
