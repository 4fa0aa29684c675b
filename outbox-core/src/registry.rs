//! Drivers: how a store or a sink is built from its URL and settings, so that the front
//! crate can pick one by URL scheme without knowing any backend. A driver is derived from
//! the [`UrlStore`] or [`RouteSink`] a backend implements (`SinkDriver::of::<RedisSink>()`,
//! [`route_sink!`](crate::route_sink) writes the usual `RouteSink`); the front crate's
//! registry installs the ones its Cargo features compiled in, and applications add their
//! own, derived the same way or written out:
//!
//! ```
//! use std::sync::Arc;
//! use outbox_engine::registry::{BuildError, RouteSettings, SinkDriver, no_check};
//! use outbox_engine::{DynSink, testkit::RecordingSink};
//!
//! /// `memory://` routes record what they get.
//! pub const MEMORY: SinkDriver = SinkDriver {
//!     schemes: &["memory"],
//!     build: |_route| Box::pin(async { Ok(Arc::new(RecordingSink::new()) as Arc<dyn DynSink>) }),
//!     check: no_check,
//! };
//! assert!(MEMORY.handles("memory://anything"));
//! ```

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::backend::{AnyStore, DynStore};
use crate::sink::{BoxFuture, DynSink, Sink};

/// What building a store or sink from settings can fail with. It says whether trying
/// again can help (a broker that is down at start-up, say) and never quotes a secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct BuildError {
    message: String,
    retryable: bool,
}

impl BuildError {
    /// A configuration error: retrying cannot help.
    pub fn config(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            retryable: false,
        }
    }

    /// The server could not be reached or refused for now: retrying may help.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            retryable: true,
        }
    }

    /// A start-up error that says itself whether retrying can help: `unavailable` when
    /// `retryable`, `config` otherwise.
    ///
    /// ```
    /// use outbox_engine::registry::BuildError;
    /// assert!(BuildError::new("broker down", true).is_retryable());
    /// assert!(!BuildError::new("bad password", false).is_retryable());
    /// ```
    pub fn new(message: impl Into<String>, retryable: bool) -> Self {
        Self {
            message: message.into(),
            retryable,
        }
    }

    /// Whether trying again can help.
    pub fn is_retryable(&self) -> bool {
        self.retryable
    }
}

/// One route's settings, as a sink driver gets them: the route's table from the
/// configuration (its `url` included, the policy keys of
/// [`RoutePolicy`](crate::layers::RoutePolicy) left out).
#[derive(Clone, PartialEq)]
pub struct RouteSettings {
    /// The route (the destination of its rows).
    pub route: String,
    /// The route's settings as a JSON object.
    pub settings: serde_json::Value,
}

impl RouteSettings {
    /// The route's `url`.
    pub fn url(&self) -> &str {
        self.settings
            .get("url")
            .and_then(serde_json::Value::as_str)
            .unwrap_or("")
    }

    /// The settings as the sink's own configuration type (which should deny unknown
    /// fields). The error names the setting but never quotes a value.
    ///
    /// # Errors
    ///
    /// A [`BuildError::config`] when the settings do not fit `T`.
    pub fn parse<T: DeserializeOwned>(&self) -> Result<T, BuildError> {
        T::deserialize(&self.settings)
            .map_err(|e| BuildError::config(without_values(&e.to_string())))
    }
}

impl fmt::Debug for RouteSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let keys: Vec<&str> = self
            .settings
            .as_object()
            .map(|o| o.keys().map(String::as_str).collect())
            .unwrap_or_default();
        f.debug_struct("RouteSettings")
            .field("route", &self.route)
            .field("keys", &keys)
            .finish()
    }
}

/// serde messages quote the offending value (`invalid type: string "hunter2"`); keep
/// the part that says what was expected. Messages about a key (`unknown field `colour`,
/// expected one of …`) quote only key names, kept so that the key is named.
fn without_values(message: &str) -> String {
    if ["unknown field", "missing field", "duplicate field"]
        .iter()
        .any(|about_a_key| message.starts_with(about_a_key))
    {
        return message.to_owned();
    }
    let mut out = String::with_capacity(message.len());
    let mut quoted = false;
    for c in message.chars() {
        match c {
            '"' | '`' if !quoted => {
                quoted = true;
                out.push('…');
            }
            '"' | '`' => quoted = false,
            _ if !quoted => out.push(c),
            _ => {}
        }
    }
    out
}

/// What a [`SinkDriver`] builds a route's sink with.
pub type BuildSink =
    for<'a> fn(&'a RouteSettings) -> BoxFuture<'a, Result<Arc<dyn DynSink>, BuildError>>;

/// What a [`SinkDriver`] checks a route's settings with, offline.
pub type CheckSink = fn(&RouteSettings) -> Result<(), BuildError>;

/// A [`CheckSink`] that accepts any settings: for drivers written out by hand.
pub fn no_check(_: &RouteSettings) -> Result<(), BuildError> {
    Ok(())
}

/// What a [`StoreDriver`] opens a store with.
pub type ConnectStore =
    for<'a> fn(&'a StoreSettings) -> BoxFuture<'a, Result<AnyStore, BuildError>>;

/// What a [`StoreDriver`] writes its schema script with: the DDL that
/// [`Backend::migrate`](crate::Backend::migrate) runs, for teams that apply migrations
/// with their own tool.
pub type SchemaScript = fn(&StoreSettings) -> Result<String, BuildError>;

/// How to build sinks for some URL schemes.
#[derive(Clone, Copy)]
pub struct SinkDriver {
    /// The URL schemes it handles, e.g. `["http", "https"]`.
    pub schemes: &'static [&'static str],
    /// Builds one route's sink (and checks the server where it can).
    pub build: BuildSink,
    /// Checks one route's settings without reaching a server (`outbox config check`).
    pub check: CheckSink,
}

impl SinkDriver {
    /// The driver of a sink type: its schemes, and a build that parses the route's
    /// settings as `S::Config` and connects.
    ///
    /// ```
    /// use outbox_engine::registry::{RouteSink, SinkDriver};
    /// use outbox_engine::testkit::RecordingSink;
    ///
    /// /// `memory://` routes record what they get.
    /// struct Memory(RecordingSink);
    /// # impl outbox_engine::Sink for Memory {
    /// #     async fn publish(&self, batch: &[outbox_engine::Message], cx: &outbox_engine::PublishContext)
    /// #         -> Result<Vec<outbox_engine::Outcome>, outbox_engine::Failure> { self.0.publish(batch, cx).await }
    /// # }
    /// impl RouteSink for Memory {
    ///     const SCHEMES: &'static [&'static str] = &["memory"];
    ///     type Config = serde_json::Value;
    ///     type Error = std::convert::Infallible;
    ///     async fn connect(_: serde_json::Value) -> Result<Self, Self::Error> {
    ///         Ok(Memory(RecordingSink::new()))
    ///     }
    ///     fn is_retryable(_: &Self::Error) -> bool {
    ///         false
    ///     }
    /// }
    ///
    /// const MEMORY: SinkDriver = SinkDriver::of::<Memory>();
    /// assert!(MEMORY.handles("memory://anything"));
    /// ```
    pub const fn of<S: RouteSink>() -> Self {
        Self {
            schemes: S::SCHEMES,
            build: build_route::<S>,
            check: check_route::<S>,
        }
    }

    /// Whether `url`'s scheme is one of this driver's.
    pub fn handles(&self, url: &str) -> bool {
        self.schemes.contains(&scheme(url))
    }
}

impl fmt::Debug for SinkDriver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SinkDriver")
            .field("schemes", &self.schemes)
            .finish()
    }
}

/// What to do with a row once it is published.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PublishedRows {
    /// Keep it with status `published` until a retention purge (default).
    #[default]
    Keep,
    /// Delete it at once; stats then show no published rows. A retention purge is still
    /// worth running with per-key ordering: it forgets the counters of idle keys.
    Delete,
    /// Keep it in one of three slots of a partitioned table (PostgreSQL only, chosen when
    /// the table is created): a retention purge empties the oldest slot with `TRUNCATE`
    /// after moving its unfinished rows and dead letters out, instead of deleting row by
    /// row, so the table does not bloat even while a long transaction holds back VACUUM.
    /// Published rows stay between one and one and a half times the purge's age.
    Rotate,
}

/// Where the outbox table lives and how to reach it; what a store driver gets.
#[derive(Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct StoreSettings {
    /// `postgres://…`, `sqlite:…`, `mysql://…`, or a scheme of a driver you installed.
    pub url: String,
    /// The schema (PostgreSQL), database (MySQL) or attached database (SQLite).
    #[serde(default)]
    pub schema: Option<String>,
    /// The outbox table (default `outbox`).
    #[serde(default)]
    pub table: Option<String>,
    /// The inbox table (default `outbox_inbox`).
    #[serde(default)]
    pub inbox_table: Option<String>,
    /// Pool size (default 8).
    #[serde(default = "default_connections")]
    pub max_connections: u32,
    /// What happens to published rows (default `keep`).
    #[serde(default)]
    pub published_rows: PublishedRows,
}

fn default_connections() -> u32 {
    8
}

impl StoreSettings {
    /// The settings for `url` with every default.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            schema: None,
            table: None,
            inbox_table: None,
            max_connections: default_connections(),
            published_rows: PublishedRows::Keep,
        }
    }

    /// The settings a store URL's query may carry, as in a config table; every other
    /// query option is the database client's.
    pub const URL_OPTIONS: &'static [&'static str] = &[
        "schema",
        "table",
        "inbox_table",
        "max_connections",
        "published_rows",
    ];

    /// Moves the settings written in the URL's query (see [`URL_OPTIONS`](Self::URL_OPTIONS))
    /// into the fields, so a store URL and a `[store]` table take the same settings; the
    /// database client's own options stay in the URL. The registry does this before it
    /// opens a store.
    ///
    /// ```
    /// use outbox_engine::{PublishedRows, StoreSettings};
    ///
    /// let settings = StoreSettings::new("postgres://db/app?sslmode=require&schema=shop&published_rows=delete")
    ///     .with_url_options()?;
    /// assert_eq!(settings.url, "postgres://db/app?sslmode=require");
    /// assert_eq!(settings.schema.as_deref(), Some("shop"));
    /// assert_eq!(settings.published_rows, PublishedRows::Delete);
    /// # Ok::<(), outbox_engine::registry::BuildError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// A [`BuildError::config`] for a value that does not parse, or a setting given both
    /// in the URL and (with another value than its default) in the fields.
    pub fn with_url_options(mut self) -> Result<Self, BuildError> {
        let Some((base, query)) = self.url.split_once('?') else {
            return Ok(self);
        };
        let (base, query) = (base.to_owned(), query.to_owned());
        let defaults = Self::new("");
        let mut kept = Vec::new();
        for raw in query.split('&').filter(|pair| !pair.is_empty()) {
            let Some((name, value)) = url::form_urlencoded::parse(raw.as_bytes()).next() else {
                continue;
            };
            let both = |given: bool| {
                if given {
                    Err(BuildError::config(format!(
                        "store.{name} is given both in the URL and as a setting"
                    )))
                } else {
                    Ok(())
                }
            };
            let parsed =
                |what: &str| BuildError::config(format!("store.{name} in the URL: {what}"));
            match name.as_ref() {
                "schema" => {
                    both(self.schema.is_some())?;
                    self.schema = Some(value.into_owned());
                }
                "table" => {
                    both(self.table.is_some())?;
                    self.table = Some(value.into_owned());
                }
                "inbox_table" => {
                    both(self.inbox_table.is_some())?;
                    self.inbox_table = Some(value.into_owned());
                }
                "max_connections" => {
                    both(self.max_connections != defaults.max_connections)?;
                    self.max_connections = value
                        .parse()
                        .map_err(|_| parsed("must be a whole number of connections"))?;
                }
                "published_rows" => {
                    both(self.published_rows != defaults.published_rows)?;
                    self.published_rows =
                        PublishedRows::deserialize(serde_json::Value::String(value.into_owned()))
                            .map_err(|_| parsed("must be keep, delete or rotate"))?;
                }
                _ => kept.push(raw.to_owned()),
            }
        }
        self.url = if kept.is_empty() {
            base
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        Ok(self)
    }
}

impl fmt::Debug for StoreSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreSettings")
            .field("url", &crate::redact::url(&self.url))
            .field("schema", &self.schema)
            .field("table", &self.table)
            .field("inbox_table", &self.inbox_table)
            .field("max_connections", &self.max_connections)
            .field("published_rows", &self.published_rows)
            .finish()
    }
}

/// How to open stores for some URL schemes.
#[derive(Clone, Copy)]
pub struct StoreDriver {
    /// The URL schemes it handles, e.g. `["postgres", "postgresql"]`.
    pub schemes: &'static [&'static str],
    /// Connects (nothing is created; see [`Backend::migrate`](crate::Backend::migrate)).
    pub connect: ConnectStore,
    /// The schema as a script, without connecting; `None` for stores without one.
    pub schema: Option<SchemaScript>,
}

impl StoreDriver {
    /// The driver of a store type: its schemes, its connect and its schema script.
    pub const fn of<S: UrlStore>() -> Self {
        Self {
            schemes: S::SCHEMES,
            connect: connect_store::<S>,
            schema: Some(S::schema),
        }
    }

    /// Whether `url`'s scheme is one of this driver's.
    pub fn handles(&self, url: &str) -> bool {
        self.schemes.contains(&scheme(url))
    }
}

impl fmt::Debug for StoreDriver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreDriver")
            .field("schemes", &self.schemes)
            .finish()
    }
}

/// A sink that a route's URL and settings build; its registry entry is
/// [`SinkDriver::of`].
pub trait RouteSink: Sink + Sized {
    /// The URL schemes it handles, e.g. `["redis", "rediss"]`.
    const SCHEMES: &'static [&'static str];
    /// Its settings, parsed from the route's (it should deny unknown fields).
    type Config: DeserializeOwned + Send;
    /// Why it could not be built.
    type Error: fmt::Display + Send;

    /// Builds the sink and checks the server where it can.
    fn connect(config: Self::Config) -> impl Future<Output = Result<Self, Self::Error>> + Send;

    /// Whether building again later can help (a broker down at start-up), rather than
    /// the settings being wrong.
    fn is_retryable(error: &Self::Error) -> bool;

    /// Checks the settings without reaching a server: values out of range, templates,
    /// the files and environment variables they name. Parsing them as [`Self::Config`]
    /// comes first; by default nothing more is checked.
    fn check(config: &Self::Config) -> Result<(), Self::Error> {
        let _ = config;
        Ok(())
    }

    /// Moves the sink options written in the query of `config`'s URL into its fields,
    /// as the sink's `from_url` reads them, so that a route's settings and its URL take
    /// the same options; returns the settings they set (a setting given both ways is
    /// an error). By default the URL is left as it is, for sinks that read their URL's
    /// query themselves.
    fn url_options(config: &mut Self::Config) -> Result<Vec<&'static str>, Self::Error> {
        let _ = config;
        Ok(Vec::new())
    }
}

/// Implements [`RouteSink`] for a sink built the usual way: the sink type's own async
/// `connect(config)` builds it, `config.validate()` checks its settings offline,
/// `error.is_retryable()` says whether building again can help and, with `url_options`
/// last, the config's `take_url_options` moves the options in its URL's query into its
/// fields.
///
/// ```
/// # use outbox_engine::testkit::RecordingSink;
/// # use outbox_engine::{Failure, Message, Outcome, PublishContext};
/// # #[derive(serde::Deserialize)]
/// # struct MemoryConfig;
/// # impl MemoryConfig {
/// #     fn validate(&self) -> Result<(), MemoryError> { Ok(()) }
/// # }
/// # #[derive(Debug, thiserror::Error)]
/// # #[error("never")]
/// # struct MemoryError;
/// # impl MemoryError {
/// #     fn is_retryable(&self) -> bool { false }
/// # }
/// struct Memory(RecordingSink);
/// # impl outbox_engine::Sink for Memory {
/// #     async fn publish(&self, batch: &[Message], cx: &PublishContext)
/// #         -> Result<Vec<Outcome>, Failure> { self.0.publish(batch, cx).await }
/// # }
///
/// impl Memory {
///     async fn connect(_: MemoryConfig) -> Result<Self, MemoryError> {
///         Ok(Memory(RecordingSink::new()))
///     }
/// }
///
/// outbox_engine::route_sink!(Memory, ["memory"], MemoryConfig, MemoryError);
///
/// let driver = outbox_engine::registry::SinkDriver::of::<Memory>();
/// assert!(driver.handles("memory://anything"));
/// ```
#[macro_export]
macro_rules! route_sink {
    ($sink:ty, [$($scheme:literal),+], $config:ty, $error:ty $(, $url_options:ident)?) => {
        impl $crate::registry::RouteSink for $sink {
            const SCHEMES: &'static [&'static str] = &[$($scheme),+];
            type Config = $config;
            type Error = $error;

            async fn connect(config: $config) -> ::core::result::Result<Self, $error> {
                <$sink>::connect(config).await
            }

            fn is_retryable(error: &$error) -> bool {
                error.is_retryable()
            }

            fn check(config: &$config) -> ::core::result::Result<(), $error> {
                config.validate().map(drop)
            }

            $($crate::route_sink!(@$url_options $config, $error);)?
        }
    };
    (@url_options $config:ty, $error:ty) => {
        fn url_options(
            config: &mut $config,
        ) -> ::core::result::Result<::std::vec::Vec<&'static str>, $error> {
            config.take_url_options()
        }
    };
}

/// The route's settings as `S::Config`, with the options of its URL moved in.
fn parse_route<S: RouteSink>(route: &RouteSettings) -> Result<S::Config, BuildError> {
    let mut config: S::Config = route.parse()?;
    let set = S::url_options(&mut config).map_err(|e| BuildError::config(e.to_string()))?;
    if let Some(key) = set.iter().find(|key| route.settings.get(**key).is_some()) {
        return Err(BuildError::config(format!(
            "`{key}` is given both in the URL and as a setting"
        )));
    }
    Ok(config)
}

fn check_route<S: RouteSink>(route: &RouteSettings) -> Result<(), BuildError> {
    let config = parse_route::<S>(route)?;
    S::check(&config).map_err(|e| BuildError::config(e.to_string()))
}

fn build_route<S: RouteSink>(
    route: &RouteSettings,
) -> BoxFuture<'_, Result<Arc<dyn DynSink>, BuildError>> {
    Box::pin(async move {
        let config = parse_route::<S>(route)?;
        let sink = S::connect(config)
            .await
            .map_err(|e| BuildError::new(e.to_string(), S::is_retryable(&e)))?;
        Ok(Arc::new(sink) as Arc<dyn DynSink>)
    })
}

/// A store that [`StoreSettings`] open; its registry entry is [`StoreDriver::of`].
pub trait UrlStore: DynStore + Sized {
    /// The URL schemes it handles, e.g. `["postgres", "postgresql"]`.
    const SCHEMES: &'static [&'static str];

    /// Connects (nothing is created; see [`Backend::migrate`](crate::Backend::migrate)).
    fn connect(settings: &StoreSettings) -> impl Future<Output = Result<Self, BuildError>> + Send;

    /// The DDL [`Backend::migrate`](crate::Backend::migrate) runs for these settings, for
    /// teams that apply migrations with their own tool.
    ///
    /// # Errors
    ///
    /// A [`BuildError::config`] for settings the store cannot take.
    fn schema(settings: &StoreSettings) -> Result<String, BuildError>;
}

fn connect_store<S: UrlStore>(
    settings: &StoreSettings,
) -> BoxFuture<'_, Result<AnyStore, BuildError>> {
    Box::pin(async move { S::connect(settings).await.map(AnyStore::new) })
}

/// The scheme of `url`: what comes before the first `:`.
pub fn scheme(url: &str) -> &str {
    url.split_once(':').map_or("", |(scheme, _)| scheme)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One vocabulary: every setting of a `[store]` table is a store URL option, and a
    /// setting given both ways is refused; the client's own options stay in the URL.
    #[test]
    fn every_store_setting_is_a_url_option_and_the_reverse() {
        use serde_json::json;
        let base = "postgres://app@db/app?sslmode=require";
        let cases = [
            ("schema", json!("shop"), "schema=shop"),
            ("table", json!("events"), "table=events"),
            ("inbox_table", json!("seen"), "inbox_table=seen"),
            ("max_connections", json!(3), "max_connections=3"),
            ("published_rows", json!("delete"), "published_rows=delete"),
        ];
        let defaults = StoreSettings::new(base);
        for (key, value, query) in &cases {
            let via_url = StoreSettings::new(format!("{base}&{query}"))
                .with_url_options()
                .unwrap();
            let via_table: StoreSettings =
                serde_json::from_value(json!({ "url": base, *key: value })).unwrap();
            let via_table = via_table.with_url_options().unwrap();
            assert_eq!(via_url, via_table, "`{query}` against `{key}`");
            assert_ne!(via_url, defaults, "`{query}` changes nothing");
            assert_eq!(via_url.url, base, "the client's options stay, ours leave");

            let both: StoreSettings =
                serde_json::from_value(json!({ "url": format!("{base}&{query}"), *key: value }))
                    .unwrap();
            let refused = both.with_url_options().unwrap_err().to_string();
            assert!(
                refused.contains(key) && refused.contains("given both"),
                "{refused}"
            );
        }
        for name in crate::testkit::setting_names::<StoreSettings>() {
            assert!(
                *name == "url" || cases.iter().any(|(key, _, _)| key == name),
                "store setting `{name}` has no URL case"
            );
        }
        assert_eq!(StoreSettings::URL_OPTIONS.len(), cases.len());
        let bad = StoreSettings::new("sqlite:app.db?max_connections=many").with_url_options();
        assert!(bad.unwrap_err().to_string().contains("max_connections"));
    }

    #[test]
    fn parse_errors_never_quote_values() {
        #[derive(Debug, Deserialize)]
        #[serde(deny_unknown_fields)]
        #[allow(dead_code)]
        struct Settings {
            url: String,
            port: u16,
        }
        let route = RouteSettings {
            route: "r".into(),
            settings: serde_json::json!({ "url": "x://", "port": "hunter2" }),
        };
        let error = route.parse::<Settings>().unwrap_err().to_string();
        assert!(!error.contains("hunter2"), "{error}");
        assert!(error.contains("expected u16"), "{error}");
    }
}
