//! Configuration: a TOML file, then `OUTBOX_…` environment variables over it, layered
//! with [figment](https://docs.rs/figment).
//!
//! ```toml
//! [store]
//! url = "postgres://app@db/app"      # or sqlite:outbox.db, mysql://…
//! table = "outbox"                   # optional; schema = "…" too
//!
//! [relay]
//! batch_size = 100
//! concurrency = 2
//! lease = "30s"
//! poll_interval = "1s"
//! min_wakeup_interval = "1ms"        # wakeups within it make one claim
//! ordering = "per-key"               # or "unordered" (default)
//! dead_head = "skip"                 # or "halt"
//!
//! [retry]
//! initial_delay = "1s"
//! max_delay = "5m"
//! max_attempts = 25
//! max_age = "3d"
//!
//! [routes.billing]                   # destination "billing"; the url scheme picks the sink
//! url = "https://billing.example.com/hooks"
//! secrets_env = "BILLING_WEBHOOK_SECRETS"
//! rate_limit = { per_second = 80, burst = 20 }   # route policies, for any sink
//! circuit = { failures = 5, cool_down = "30s" }
//!
//! [routes.events]
//! url = "redis://127.0.0.1:6379/"
//! stream = "events:{event_type}"
//! ```
//!
//! Every value can be set from the environment: `OUTBOX_` followed by the path in upper
//! case with `__` between parts (`OUTBOX_STORE__URL`, `OUTBOX_RELAY__BATCH_SIZE`,
//! `OUTBOX_ROUTES__BILLING__URL`). Lists and tables are written as in TOML:
//! `OUTBOX_ROUTES__BILLING__ALLOW=[10.0.0.0/8, audit.internal]`,
//! `OUTBOX_ROUTES__BILLING__RATE_LIMIT={per_second=50}`. Route names are matched in lower
//! case. Names without `__` (such as `OUTBOX_CONFIG`) are not settings; a setting that
//! matches no key is an error, so a misspelt variable does not go unnoticed. Durations
//! take a unit (`250ms`, `1.5s`, `2m`, `1h 30m`, `1d`); a bare number is refused.
//!
//! Errors name the setting and where it came from (the file, or the environment
//! variable) and never quote a value, which could be a secret.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::time::Duration;

use figment::providers::{Format, Toml};
use figment::value::{Dict, Map, Value};
use figment::{Figment, Metadata, Profile, Provider};
use outbox_engine::layers::{POLICY_KEYS, RoutePolicy};
use outbox_engine::registry::RouteSettings;
use outbox_engine::settings::{RelaySettings, RetrySettings};
use outbox_engine::{LagObjective, MessageError, StoreSettings};
use serde::Deserialize;

use crate::Error;

/// The prefix of environment settings.
pub const ENV_PREFIX: &str = "OUTBOX_";

/// The whole configuration of a relay process.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct Config {
    /// Where the outbox table lives.
    pub store: StoreSettings,
    /// How the relay claims and publishes.
    #[serde(default)]
    pub relay: RelaySettings,
    /// Backoff and giving up.
    #[serde(default)]
    pub retry: RetrySettings,
    /// Destination name → the route's settings; its `url` scheme picks the sink.
    #[serde(default)]
    pub routes: BTreeMap<String, RouteTable>,
    /// The metrics and health endpoint of the `outbox relay` command.
    #[serde(default)]
    pub metrics: MetricsConfig,
    /// When that endpoint reports the relay not alive or not ready.
    #[serde(default)]
    pub health: HealthConfig,
    /// The web dashboard of `outbox dashboard` and `outbox relay`; off without this table.
    #[serde(default)]
    pub dashboard: Option<DashboardConfig>,
}

/// One route's table: its `url`, the sink's own settings, and the route policies
/// ([`POLICY_KEYS`]). `Debug` shows the keys, not the values (secrets live here).
#[derive(Clone, Default, PartialEq, Deserialize)]
#[serde(transparent)]
pub struct RouteTable(serde_json::Map<String, serde_json::Value>);

impl RouteTable {
    /// A table from `(key, value)` pairs.
    ///
    /// ```
    /// let table = outbox::config::RouteTable::new([("url", "https://example.com/hooks".into())]);
    /// assert_eq!(table.url(), Some("https://example.com/hooks"));
    /// ```
    pub fn new<K: Into<String>>(pairs: impl IntoIterator<Item = (K, serde_json::Value)>) -> Self {
        Self(pairs.into_iter().map(|(k, v)| (k.into(), v)).collect())
    }

    /// The route's URL.
    pub fn url(&self) -> Option<&str> {
        self.0.get("url").and_then(serde_json::Value::as_str)
    }

    /// The route policies in the table.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] naming the route and setting, never the value.
    pub fn policy(&self, route: &str) -> Result<RoutePolicy, Error> {
        let policy: serde_json::Map<_, _> = self
            .0
            .iter()
            .filter(|(k, _)| POLICY_KEYS.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let settings = RouteSettings {
            route: route.to_owned(),
            settings: serde_json::Value::Object(policy),
        };
        let policy: RoutePolicy = settings
            .parse()
            .map_err(|e| Error::Config(format!("routes.{route}: {e}")))?;
        policy
            .validate()
            .map_err(|e| Error::Config(format!("routes.{route}.{e}")))?;
        Ok(policy)
    }

    /// The sink's settings: the table without the policy keys.
    pub fn sink_settings(&self, route: &str) -> RouteSettings {
        let sink: serde_json::Map<_, _> = self
            .0
            .iter()
            .filter(|(k, _)| !POLICY_KEYS.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        RouteSettings {
            route: route.to_owned(),
            settings: serde_json::Value::Object(sink),
        }
    }
}

impl fmt::Debug for RouteTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RouteTable")
            .field("url", &self.url().map(outbox_engine::redact::url))
            .field("keys", &self.0.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// The metrics endpoint.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct MetricsConfig {
    /// Address for `/metrics`, `/healthz`, `/readyz` and `/slo`, e.g. `127.0.0.1:9464`;
    /// none by default.
    pub listen: Option<String>,
}

/// Health and the relay's lag objective. `/healthz` fails while the workers have not
/// beaten for `max_heartbeat_age`; `/readyz` while the store does not answer the relay's
/// claims (unreachable, or no outbox table in the shape this relay reads). `/slo` fails
/// while a routed destination's oldest pending row is older than its threshold or no
/// publish of a route got through for `max_failing`: an alert, and part of `/readyz` only
/// with `gates_readiness = true`.
///
/// ```toml
/// [health]
/// max_pending_age = "5m"
/// destinations = { billing = "30s" }
/// max_failing = "1m"        # the default
/// gates_readiness = false   # the default
/// ```
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct HealthConfig {
    /// The threshold of every destination without its own; none by default.
    #[serde(with = "outbox_engine::duration::optional")]
    pub max_pending_age: Option<Duration>,
    /// Thresholds per destination.
    pub destinations: BTreeMap<String, Threshold>,
    /// Longest time without a worker beat (default: three leases, at least 2 minutes).
    #[serde(with = "outbox_engine::duration::optional")]
    pub max_heartbeat_age: Option<Duration>,
    /// Longest time every publish of one route may fail (default 1 minute).
    #[serde(with = "outbox_engine::duration::optional")]
    pub max_failing: Option<Duration>,
    /// Whether `/readyz` fails while the objective is missed, too (default false).
    pub gates_readiness: bool,
}

/// The web dashboard (crate `outbox-dashboard`): where it listens and the token it asks
/// for. Off unless the `[dashboard]` table is present; it listens on loopback unless told
/// otherwise. `Debug` hides the token.
///
/// ```toml
/// [dashboard]
/// listen = "127.0.0.1:9465"              # the default
/// token_env = "OUTBOX_DASHBOARD_TOKEN"   # or token = "…", or token_file = "/run/secrets/…"
/// public_read = false                    # true: pages without payloads need no token
/// hosts = ["ops.example.com"]            # the names browsers use; with public_read, the
///                                        # listen address (and localhost) when not set
/// ```
#[derive(Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct DashboardConfig {
    /// The address to listen on; `127.0.0.1:9465` when not set.
    pub listen: Option<String>,
    /// The token, written in the file (prefer `token_env` or `token_file`).
    pub token: Option<String>,
    /// The environment variable that holds the token.
    pub token_env: Option<String>,
    /// The file that holds the token (surrounding whitespace is ignored).
    pub token_file: Option<std::path::PathBuf>,
    /// Pages without payloads or actions need no token.
    pub public_read: bool,
    /// The host names the dashboard answers to (`Host`, with `:port` or without); see
    /// [`allowed_hosts`](Self::allowed_hosts).
    pub hosts: Option<Vec<String>>,
}

/// Where the dashboard listens when `dashboard.listen` is not set.
pub const DEFAULT_DASHBOARD_LISTEN: &str = "127.0.0.1:9465";

impl DashboardConfig {
    /// The address to listen on.
    pub fn listen(&self) -> &str {
        self.listen.as_deref().unwrap_or(DEFAULT_DASHBOARD_LISTEN)
    }

    /// The host names the dashboard answers to: `hosts` when set; else, with
    /// `public_read`, the listen address (and `localhost` on loopback), so that a
    /// DNS-rebinding page cannot read it; else any (every page needs the token).
    ///
    /// ```
    /// let config = outbox::Config::from_toml(
    ///     "[store]\nurl = \"sqlite::memory:\"\n[dashboard]\ntoken_env = \"T\"\npublic_read = true\n",
    ///     Vec::<(String, String)>::new(),
    /// )?;
    /// let dashboard = config.dashboard.expect("the table is there");
    /// assert_eq!(dashboard.allowed_hosts()?, ["127.0.0.1:9465", "localhost:9465"]);
    /// # Ok::<(), outbox::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for `public_read` on every address (`0.0.0.0`, `[::]`) without
    /// `hosts`: the names browsers use cannot be known then.
    pub fn allowed_hosts(&self) -> Result<Vec<String>, Error> {
        if let Some(hosts) = &self.hosts {
            return Ok(hosts.clone());
        }
        if !self.public_read {
            return Ok(Vec::new());
        }
        let listen = self.listen();
        let addr: std::net::SocketAddr = listen.parse().map_err(|_| {
            Error::Config(format!(
                "dashboard.hosts: set it, since dashboard.listen {listen:?} is not an address to derive the host names from"
            ))
        })?;
        if addr.ip().is_unspecified() {
            return Err(Error::Config(
                "dashboard.hosts: public_read on every address needs the host names browsers use (hosts = [\"ops.example.com\"]), or a page of any site could read the dashboard through DNS rebinding".into(),
            ));
        }
        let mut hosts = vec![listen.to_owned()];
        if addr.ip().is_loopback() {
            hosts.push(format!("localhost:{}", addr.port()));
        }
        Ok(hosts)
    }

    /// The token, from exactly one of `token`, `token_env` and `token_file`.
    ///
    /// ```
    /// let config = outbox::Config::from_toml(
    ///     "[store]\nurl = \"sqlite::memory:\"\n[dashboard]\ntoken_env = \"MY_DASHBOARD_TOKEN\"\n",
    ///     [("OUTBOX_DASHBOARD__PUBLIC_READ", "true")],
    /// )?;
    /// let dashboard = config.dashboard.expect("the table is there");
    /// assert!(dashboard.public_read);
    /// assert_eq!(dashboard.listen(), "127.0.0.1:9465");
    /// let error = dashboard.token().unwrap_err().to_string();
    /// assert!(error.contains("MY_DASHBOARD_TOKEN"), "{error}");
    /// # Ok::<(), outbox::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Config`] when none or several are set, the variable is unset or the file
    /// unreadable; it names the setting, never the token.
    pub fn token(&self) -> Result<String, Error> {
        let set = [
            self.token.is_some(),
            self.token_env.is_some(),
            self.token_file.is_some(),
        ];
        if set.iter().filter(|s| **s).count() != 1 {
            return Err(Error::Config(
                "dashboard: set exactly one of token, token_env and token_file".into(),
            ));
        }
        if let Some(token) = &self.token {
            return Ok(token.clone());
        }
        if let Some(var) = &self.token_env {
            return std::env::var(var).map_err(|_| {
                Error::Config(format!(
                    "dashboard.token_env: the variable {var} is not set"
                ))
            });
        }
        let path = self.token_file.as_ref().expect("one of the three is set");
        std::fs::read_to_string(path)
            .map(|t| t.trim().to_owned())
            .map_err(|e| Error::Config(format!("dashboard.token_file {}: {e}", path.display())))
    }
}

impl fmt::Debug for DashboardConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DashboardConfig")
            .field("listen", &self.listen())
            .field("token", &self.token.as_ref().map(|_| "[redacted]"))
            .field("token_env", &self.token_env)
            .field("token_file", &self.token_file)
            .field("public_read", &self.public_read)
            .field("hosts", &self.hosts)
            .finish()
    }
}

/// A duration in a configuration map, such as `"30s"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Threshold(#[serde(with = "outbox_engine::duration")] pub Duration);

impl HealthConfig {
    /// The lag objective these settings describe.
    pub fn objective(&self) -> LagObjective {
        let mut objective = LagObjective::new();
        if let Some(age) = self.max_pending_age {
            objective = objective.max_pending_age(age);
        }
        if let Some(age) = self.max_heartbeat_age {
            objective = objective.max_heartbeat_age(age);
        }
        if let Some(duration) = self.max_failing {
            objective = objective.max_failing(duration);
        }
        for (destination, Threshold(age)) in &self.destinations {
            objective = objective.destination(destination.clone(), *age);
        }
        objective.gates_readiness(self.gates_readiness)
    }
}

impl Config {
    /// Reads `path`, then the process's `OUTBOX_…` environment variables over it.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] naming the file or variable and the setting that is wrong.
    pub fn load(path: &Path) -> Result<Self, Error> {
        if !path.exists() {
            return Err(Error::Config(format!(
                "cannot read {}: no such file",
                path.display()
            )));
        }
        Self::extract(
            Figment::new()
                .merge(Toml::file(path))
                .merge(Environment::process()),
        )
    }

    /// Parses TOML text, then applies `OUTBOX_…` settings from `env` (pairs of name and
    /// value) over it.
    ///
    /// ```
    /// let config = outbox::Config::from_toml(
    ///     "[store]\nurl = \"sqlite::memory:\"\n[relay]\nbatch_size = 10\n",
    ///     [("OUTBOX_RELAY__BATCH_SIZE", "25"), ("OUTBOX_ROUTES__BILLING__URL", "https://b.example.com/")],
    /// )?;
    /// assert_eq!(config.relay.batch_size, Some(25));
    /// assert_eq!(config.routes["billing"].url(), Some("https://b.example.com/"));
    /// # Ok::<(), outbox::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Config`] naming the position or variable and the setting that is wrong.
    pub fn from_toml<K: AsRef<str>, V: AsRef<str>>(
        text: &str,
        env: impl IntoIterator<Item = (K, V)>,
    ) -> Result<Self, Error> {
        let env = env
            .into_iter()
            .map(|(k, v)| (k.as_ref().to_owned(), v.as_ref().to_owned()))
            .collect();
        Self::extract(
            Figment::new()
                .merge(Toml::string(text))
                .merge(Environment(env)),
        )
    }

    /// The process's `OUTBOX_…` environment variables alone, without a file.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] naming the variable and the setting that is wrong.
    pub fn from_env() -> Result<Self, Error> {
        Self::extract(Figment::new().merge(Environment::process()))
    }

    /// Whether the process's environment holds settings (`OUTBOX_…` names with `__`).
    pub fn env_has_settings() -> bool {
        std::env::vars_os().any(|(name, _)| {
            name.to_str()
                .and_then(|n| n.strip_prefix(ENV_PREFIX))
                .is_some_and(|rest| rest.contains("__"))
        })
    }

    /// Checks what can be checked without reaching a server: the store's URL scheme and
    /// table names, each route's driver, policies and sink settings (the secrets they name
    /// are read, never shown), the relay and retry settings, the dashboard's token and
    /// host names, and the lag objective.
    ///
    /// ```
    /// let config = outbox::Config::from_toml(
    ///     "[store]\nurl = \"sqlite::memory:\"\n[relay]\nbatch_size = 0\n",
    ///     Vec::<(String, String)>::new(),
    /// )?;
    /// let error = config.check(&outbox::Registry::default()).unwrap_err().to_string();
    /// assert!(error.contains("batch_size"), "{error}");
    /// # Ok::<(), outbox::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// The first problem, as an [`Error`] naming the setting.
    pub fn check(&self, registry: &crate::Registry) -> Result<(), Error> {
        registry.check_store(&self.store)?;
        // The relay's own checks, on a relay that is built and never run (with a route of
        // its own when the configuration has none, as `outbox status` needs none).
        let mut relay = outbox_engine::Relay::builder(outbox_engine::MemoryStore::new())
            .settings(&self.relay)
            .retry(self.retry.policy());
        for (route, table) in &self.routes {
            registry.check_sink(route, table)?;
            relay = relay.route(route.clone(), Unsent);
        }
        if self.routes.is_empty() {
            relay = relay.route("unrouted", Unsent);
        }
        relay.build()?;
        if let Some(dashboard) = &self.dashboard {
            dashboard.token()?;
            dashboard.allowed_hosts()?;
        }
        Ok(())
    }

    /// The environment variables the configuration names as holding secrets.
    fn variables_named(&self) -> Vec<String> {
        let mut named: Vec<String> = self
            .routes
            .values()
            .flat_map(|table| table.0.iter())
            .filter(|(key, _)| key.ends_with("_env"))
            .filter_map(|(_, value)| value.as_str().map(str::to_owned))
            .collect();
        if let Some(var) = self.dashboard.as_ref().and_then(|d| d.token_env.clone()) {
            named.push(var);
        }
        named
    }

    fn extract(figment: Figment) -> Result<Self, Error> {
        let config: Self = figment.extract().map_err(|e| Error::Config(describe(e)))?;
        for route in config.routes.keys() {
            if let Err(MessageError::InvalidField { reason, .. }) =
                outbox_engine::check_destination_name(route)
            {
                let problem = format!("routes.{route:?}: invalid route name: {reason}");
                return Err(Error::Config(problem));
            }
        }
        Ok(config)
    }
}

/// `OUTBOX_…` variables among `env` that look like settings but are not read: a section
/// name with one `_` where settings take `__` (`OUTBOX_STORE_URL` for
/// `OUTBOX_STORE__URL`). Variables `config` names (`token_env`, a route's `…_env`) are not
/// settings and are left out. Each entry says what to write instead.
///
/// ```
/// let stray = outbox::config::stray_variables([("OUTBOX_STORE_URL".to_owned(), String::new())], None);
/// assert_eq!(stray, ["OUTBOX_STORE_URL is not read: settings join their parts with `__`, as in OUTBOX_STORE__URL"]);
/// ```
pub fn stray_variables(
    env: impl IntoIterator<Item = (String, String)>,
    config: Option<&Config>,
) -> Vec<String> {
    const SECTIONS: &[&str] = &[
        "STORE",
        "RELAY",
        "RETRY",
        "ROUTES",
        "METRICS",
        "HEALTH",
        "DASHBOARD",
    ];
    let named = config.map(Config::variables_named).unwrap_or_default();
    env.into_iter()
        .filter_map(|(name, _)| {
            let rest = name.strip_prefix(ENV_PREFIX)?;
            if rest.contains("__") || named.contains(&name) {
                return None;
            }
            let (section, key) = rest.split_once('_')?;
            SECTIONS.contains(&section).then(|| {
                format!(
                    "{name} is not read: settings join their parts with `__`, as in {ENV_PREFIX}{section}__{key}"
                )
            })
        })
        .collect()
}

/// The sink [`Config::check`] gives the relay's settings check: never called.
struct Unsent;

impl outbox_engine::Sink for Unsent {
    async fn publish(
        &self,
        batch: &[outbox_engine::Message],
        _cx: &outbox_engine::PublishContext,
    ) -> Result<Vec<outbox_engine::Outcome>, outbox_engine::Failure> {
        Ok(vec![outbox_engine::Outcome::published(); batch.len()])
    }
}

/// `OUTBOX_…` variables with `__` in their names, as figment data: the rest of the name,
/// lower case, split at `__`, is the key path; the value is parsed like a TOML value.
struct Environment(Vec<(String, String)>);

impl Environment {
    fn process() -> Self {
        Self(std::env::vars().collect())
    }
}

impl Provider for Environment {
    fn metadata(&self) -> Metadata {
        Metadata::named("environment variable")
    }

    fn data(&self) -> Result<Map<Profile, Dict>, figment::Error> {
        let mut dict = Dict::new();
        for (name, value) in &self.0 {
            let Some(path) = name.strip_prefix(ENV_PREFIX) else {
                continue;
            };
            if !path.contains("__") {
                continue;
            }
            let key = path.to_ascii_lowercase().replace("__", ".");
            let value = env_value(value);
            if let Some(nested) = figment::util::nest(&key, value).into_dict() {
                merge(&mut dict, nested);
            }
        }
        Ok(Profile::Default.collect(dict))
    }
}

/// An environment value read like a TOML value (`7`, `true`, `"text"`, `[a, b]`,
/// `{ k = 1 }`), or else as plain text. figment's reader takes a character count for a
/// byte offset when an escape follows a non-ASCII character, and panics (figment 0.10.19,
/// found by fuzzing), so such values are read by the toml crate, whose escapes are the
/// same.
fn env_value(raw: &str) -> Value {
    if raw.is_ascii() || !raw.contains('\\') {
        return raw.parse().expect("infallible");
    }
    let text = || Value::from(raw.to_owned());
    if raw.contains('\n') {
        return text();
    }
    toml::from_str::<toml::Table>(&format!("v = {raw}"))
        .ok()
        .and_then(|mut table| table.remove("v"))
        .and_then(|value| Value::serialize(value).ok())
        .unwrap_or_else(text)
}

/// Merges `from` into `into`, table by table; a value in `from` wins.
fn merge(into: &mut Dict, from: Dict) {
    for (key, value) in from {
        match (into.get_mut(&key), value) {
            (Some(Value::Dict(_, existing)), Value::Dict(_, more)) => merge(existing, more),
            (_, value) => {
                into.insert(key, value);
            }
        }
    }
}

/// figment's errors, one line each, naming the key and its source but never a value.
fn describe(error: figment::Error) -> String {
    use figment::error::{Actual, Kind};
    let actual = |a: &Actual| match a {
        Actual::Bool(_) => "a boolean",
        Actual::Unsigned(_) | Actual::Signed(_) => "an integer",
        Actual::Float(_) => "a number",
        Actual::Char(_) | Actual::Str(_) => "a string",
        Actual::Bytes(_) => "bytes",
        Actual::Unit | Actual::Option => "nothing",
        Actual::Seq => "a list",
        Actual::Map => "a table",
        _ => "another kind of value",
    };
    let messages: Vec<String> = error
        .into_iter()
        .map(|e| {
            let what = match &e.kind {
                Kind::Message(message) => without_source_lines(message),
                Kind::InvalidType(found, expected) | Kind::InvalidValue(found, expected) => {
                    format!("expected {expected}, found {}", actual(found))
                }
                Kind::InvalidLength(n, expected) => format!("expected {expected}, found {n} items"),
                Kind::UnknownVariant(_, expected) => {
                    format!("unknown value, expected one of {}", expected.join(", "))
                }
                Kind::UnknownField(field, _) => format!("unknown setting `{field}`"),
                Kind::MissingField(field) => format!("missing setting `{field}`"),
                Kind::DuplicateField(field) => format!("`{field}` is set twice"),
                other => other.to_string(),
            };
            let key = e.path.join(".");
            let source = match &e.metadata {
                Some(md) if md.name == "environment variable" => {
                    format!(
                        " (from {ENV_PREFIX}{})",
                        e.path.join("__").to_ascii_uppercase()
                    )
                }
                Some(md) => match &md.source {
                    Some(source) => format!(" (in {source})"),
                    None => String::new(),
                },
                None => String::new(),
            };
            if key.is_empty() {
                format!("{what}{source}")
            } else {
                format!("{key}: {what}{source}")
            }
        })
        .collect();
    messages.join("; ")
}

/// A parser's message without the lines it quotes from the file (TOML parse errors show
/// the line at fault, which may hold a password or a signing secret): the position and
/// the reason stay.
fn without_source_lines(message: &str) -> String {
    let quoted = |line: &str| {
        line.trim_start_matches(|c: char| c.is_ascii_digit() || c == ' ')
            .starts_with('|')
    };
    message
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !quoted(line))
        .collect::<Vec<_>>()
        .join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = "[store]\nurl = \"sqlite:outbox.db\"\n";
    const NO_ENV: [(&str, &str); 0] = [];

    #[test]
    fn file_then_environment() {
        let config = Config::from_toml(
            "[store]\nurl = \"sqlite:x.db\"\n[relay]\nbatch_size = 7\nlease = \"1m\"\n[routes.Billing]\nurl = \"https://b.example.com/\"\n",
            [
                ("OUTBOX_RELAY__CONCURRENCY", "3"),
                ("OUTBOX_ROUTES__EVENTS__URL", "redis://127.0.0.1:6379/"),
                ("OUTBOX_ROUTES__EVENTS__ALLOW", "[10.0.0.0/8, audit.internal]"),
                ("OUTBOX_ROUTES__EVENTS__RATE_LIMIT", "{per_second=50}"),
                ("OUTBOX_CONFIG", "/etc/outbox.toml"),
                ("OUTBOX_TEST_POSTGRES_URL", "postgres://x"),
                ("HOME", "/root"),
            ],
        )
        .unwrap();
        assert_eq!(config.relay.batch_size, Some(7));
        assert_eq!(config.relay.concurrency, Some(3));
        assert_eq!(config.relay.lease, Some(std::time::Duration::from_secs(60)));
        let events = &config.routes["events"];
        assert_eq!(events.url(), Some("redis://127.0.0.1:6379/"));
        assert_eq!(
            events.0["allow"],
            serde_json::json!(["10.0.0.0/8", "audit.internal"])
        );
        let policy = events.policy("events").unwrap();
        assert_eq!(policy.rate_limit.unwrap().per_second, 50.0);
        assert!(
            config.routes.contains_key("Billing"),
            "file keys keep their case"
        );
    }

    #[test]
    fn errors_name_the_key_and_source_but_no_value() {
        let secret = "postgres://u:hunter2@db/app";
        for (toml, env, needle) in [
            (
                MINIMAL,
                vec![("OUTBOX_RELAY__BATCH_SIZE", secret)],
                "relay.batch_size: expected",
            ),
            (
                MINIMAL,
                vec![("OUTBOX_RELAY__BATCHSIZE", "7")],
                "unknown setting `batchsize`",
            ),
            (
                MINIMAL,
                vec![("OUTBOX_RELAI__BATCH_SIZE", "7")],
                "unknown setting `relai`",
            ),
            (MINIMAL, vec![("OUTBOX_RELAY__LEASE", "250")], "add one"),
            (
                MINIMAL,
                vec![("OUTBOX_RELAY__LEASE", secret)],
                "relay.lease",
            ),
            (
                "[store]\nurl = 5\n",
                vec![],
                "store.url: expected a string, found an integer",
            ),
        ] {
            let error = Config::from_toml(toml, env).unwrap_err().to_string();
            assert!(error.contains(needle), "{needle}: {error}");
            assert!(!error.contains("hunter2"), "no secret in {error}");
        }
        let error = Config::from_toml(MINIMAL, [("OUTBOX_RELAY__BATCH_SIZE", "x")])
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("OUTBOX_RELAY__BATCH_SIZE"),
            "names the variable: {error}"
        );
        let error = Config::from_toml("[store\n", NO_ENV)
            .unwrap_err()
            .to_string();
        assert!(error.contains("TOML") || error.contains("line"), "{error}");
        // A parse error names the place, but does not quote the line (found by fuzzing).
        let error = Config::from_toml(
            "[store]\nurl = \"postgres://u:hunter2@db/app\nmax_connections = 2\n",
            NO_ENV,
        )
        .unwrap_err()
        .to_string();
        assert!(error.contains("line 2"), "{error}");
        assert!(!error.contains("hunter2"), "no secret in {error}");
    }

    #[test]
    fn an_escape_after_a_non_ascii_character_is_read() {
        // figment's own reader panics on these (found by fuzzing).
        let config = Config::from_toml(
            MINIMAL,
            [
                ("OUTBOX_RELAY__OWNER", r#""relé\tA""#),
                ("OUTBOX_ROUTES__A__URL", r#"["é\n"]"#),
                ("OUTBOX_ROUTES__B__URL", "é\\x"),
            ],
        )
        .unwrap();
        assert_eq!(config.relay.owner.as_deref(), Some("relé\tA"));
        assert_eq!(config.routes["a"].0["url"], serde_json::json!(["é\n"]));
        assert_eq!(config.routes["b"].url(), Some("é\\x"));
    }

    #[test]
    fn debug_hides_route_values() {
        let config = Config::from_toml(
            "[store]\nurl = \"postgres://u:hunter2@db/app?sslpassword=hunter3&password=hunter8\"\n[routes.b]\nurl = \"https://u:pw4@hooks.example.com/T/token5\"\nsecrets = [\"whsec_hunter6\"]\nheaders = { authorization = \"Bearer hunter7\" }\n[routes.r]\nurl = \"redis://:hunter9@cache:6379/\"\n",
            [("OUTBOX_ROUTES__B__SECRETS_ENV", "HUNTER10")],
        )
        .unwrap();
        let shown = format!("{config:?}");
        for secret in [
            "hunter2", "hunter3", "hunter8", "pw4", "token5", "hunter6", "hunter7", "hunter9",
        ] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
    }
}
