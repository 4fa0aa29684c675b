//! Route configuration: where to connect, which stream, how entries are laid out, how
//! long duplicates are suppressed, and how durable an acknowledgement must be.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use outbox_engine::Message;
use outbox_engine::template::Template;
use serde::Deserialize;

use crate::error::RedisSinkError;

/// The longest stream key a template may render, in bytes.
///
/// ```
/// use outbox_sink_redis::{MAX_STREAM_KEY_BYTES, StreamTemplate};
///
/// assert!(StreamTemplate::parse(&"s".repeat(MAX_STREAM_KEY_BYTES + 1)).is_err());
/// ```
pub const MAX_STREAM_KEY_BYTES: usize = 1024;

/// URL query options that belong to the Redis client, not to the sink.
const CLIENT_OPTIONS: &[&str] = &["protocol"];
/// Extra client options a `unix://` URL may carry.
const UNIX_CLIENT_OPTIONS: &[&str] = &["db", "user", "pass"];
/// URL query options [`RedisSinkConfig::from_url`] understands.
const SINK_OPTIONS: &[&str] = &[
    "stream",
    "maxlen",
    "dedupe_window",
    "dedupe_prefix",
    "durability",
    "durability_timeout",
    "headers",
    "metadata",
    "fields.id",
    "fields.idempotency_key",
    "fields.event_type",
    "fields.content_type",
    "fields.payload",
    "max_payload_bytes",
    "connect_timeout",
    "response_timeout",
    "tls_ca_file",
    "tls_cert_file",
    "tls_key_file",
];

/// The configuration of one Redis Streams route.
///
/// Build it from a URL ([`from_url`](Self::from_url)), from a config file (it implements
/// `Deserialize`; every field has a default), or with the chainable setters. Everything
/// is checked by [`validate`](Self::validate), which
/// [`RedisSink::connect`](crate::RedisSink::connect) calls first.
///
/// | field | default | meaning |
/// |---|---|---|
/// | `url` | `redis://127.0.0.1:6379/` | server (`redis://`, `rediss://`, `unix://`), user, password, database |
/// | `stream` | `{destination}` | stream key template, see [`StreamTemplate`] |
/// | `maxlen` | none | `XADD … MAXLEN ~ n`: trim the stream to about `n` entries |
/// | `dedupe_window` | 5 min | suppress re-sends of an idempotency key for this long; `None` turns it off |
/// | `dedupe_prefix` | `outbox:dedupe:` | prefix of the dedupe keys |
/// | `fields` | see [`FieldLayout`] | entry field names and header layout |
/// | `durability` | [`Durability::None`] | `WAIT` / `WAITAOF` after each batch |
/// | `max_payload_bytes` | 16 MiB | larger payloads fail permanently as too large |
/// | `connect_timeout` | 5 s | one connection attempt |
/// | `response_timeout` | 5 s | one batch round trip |
/// | `tls_ca_file` | none (system roots) | PEM file of the CA that signed the server's certificate (`rediss://` only) |
/// | `tls_cert_file`, `tls_key_file` | none | PEM client certificate and key, for servers that require them (`tls-auth-clients yes`) |
///
/// Durations are strings with a unit (`"250ms"`, `"1.5s"`, `"10m"`, `"1h 30m"`), the
/// grammar of every outbox setting (`outbox_engine::duration`); a bare number is refused.
///
/// ```
/// use std::time::Duration;
/// use outbox_sink_redis::{Durability, RedisSinkConfig};
///
/// let config = RedisSinkConfig::from_url(
///     "redis://:s3cret@127.0.0.1:6379/0?stream=orders.{event_type}&maxlen=100000&dedupe_window=10m",
/// )?
/// .durability(Durability::wait(0, Duration::from_millis(500)));
/// assert_eq!(config.stream, "orders.{event_type}");
/// assert_eq!(config.maxlen, Some(100_000));
/// assert_eq!(config.dedupe_window, Some(Duration::from_secs(600)));
/// // Debug output never shows the password.
/// assert!(!format!("{config:?}").contains("s3cret"));
/// # Ok::<(), outbox_sink_redis::RedisSinkError>(())
/// ```
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct RedisSinkConfig {
    /// The server URL: `redis://[user][:password@]host[:port][/db]`, `rediss://…` (TLS,
    /// needs a `tls-*` feature), or `unix:///path/to/socket?db=0`.
    pub url: String,
    /// The stream key template (see [`StreamTemplate`]).
    pub stream: String,
    /// Trim the stream to about this many entries on every append (`MAXLEN ~ n`).
    pub maxlen: Option<u64>,
    /// How long a re-sent idempotency key is recognised and not appended again.
    /// `"off"` turns it off (TOML has no null).
    #[serde(deserialize_with = "outbox_engine::duration::or_off::deserialize")]
    pub dedupe_window: Option<Duration>,
    /// The prefix of dedupe keys; the full key is
    /// `<prefix><stream byte length>:<stream>:<idempotency key>`.
    pub dedupe_prefix: String,
    /// Entry field names and how headers are written.
    pub fields: FieldLayout,
    /// What a batch waits for before it counts as acknowledged.
    pub durability: Durability,
    /// Payloads larger than this fail permanently as too large.
    pub max_payload_bytes: usize,
    /// How long one connection attempt may take.
    #[serde(deserialize_with = "outbox_engine::duration::deserialize")]
    pub connect_timeout: Duration,
    /// How long one batch round trip may take before it fails retryably as a timeout.
    #[serde(deserialize_with = "outbox_engine::duration::deserialize")]
    pub response_timeout: Duration,
    /// The CA certificate (PEM) to verify the server with, instead of the system roots.
    pub tls_ca_file: Option<PathBuf>,
    /// A client certificate (PEM) for mutual TLS; needs `tls_key_file`.
    pub tls_cert_file: Option<PathBuf>,
    /// The client certificate's private key (PEM); needs `tls_cert_file`.
    pub tls_key_file: Option<PathBuf>,
}

impl Default for RedisSinkConfig {
    fn default() -> Self {
        Self {
            url: "redis://127.0.0.1:6379/".to_owned(),
            stream: "{destination}".to_owned(),
            maxlen: None,
            dedupe_window: Some(Duration::from_secs(300)),
            dedupe_prefix: "outbox:dedupe:".to_owned(),
            fields: FieldLayout::default(),
            durability: Durability::None,
            max_payload_bytes: 16 * 1024 * 1024,
            connect_timeout: Duration::from_secs(5),
            response_timeout: Duration::from_secs(5),
            tls_ca_file: None,
            tls_cert_file: None,
            tls_key_file: None,
        }
    }
}

impl fmt::Debug for RedisSinkConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisSinkConfig")
            .field("url", &outbox_engine::redact::url(&self.url))
            .field("stream", &self.stream)
            .field("maxlen", &self.maxlen)
            .field("dedupe_window", &self.dedupe_window)
            .field("dedupe_prefix", &self.dedupe_prefix)
            .field("fields", &self.fields)
            .field("durability", &self.durability)
            .field("max_payload_bytes", &self.max_payload_bytes)
            .field("connect_timeout", &self.connect_timeout)
            .field("response_timeout", &self.response_timeout)
            .field("tls_ca_file", &self.tls_ca_file)
            .field("tls_cert_file", &self.tls_cert_file)
            .field("tls_key_file", &self.tls_key_file)
            .finish()
    }
}

impl RedisSinkConfig {
    /// The defaults, connecting to `url` (which must carry no sink options; see
    /// [`from_url`](Self::from_url) for that).
    ///
    /// ```
    /// use outbox_sink_redis::RedisSinkConfig;
    ///
    /// let config = RedisSinkConfig::new("redis://127.0.0.1:6379/").stream("events");
    /// assert!(config.validate().is_ok());
    /// ```
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            ..Self::default()
        }
    }

    /// Reads the server address and the sink options from one URL, so a route can be
    /// configured without code.
    ///
    /// Query options: `stream` (template), `maxlen`, `dedupe_window` (a duration, or
    /// `off`), `dedupe_prefix`, `durability` (`none`, `wait:<replicas>` or
    /// `waitaof:<numlocal>:<numreplicas>`), `durability_timeout`, `headers` (`fields`,
    /// `fields:<prefix>`, `json` or `json:<field>`), `metadata` (`true`/`false`), the
    /// field names `fields.id`, `fields.idempotency_key`, `fields.event_type`,
    /// `fields.content_type` and `fields.payload`, `max_payload_bytes`,
    /// `connect_timeout`, `response_timeout`, `tls_ca_file`, `tls_cert_file`,
    /// `tls_key_file`. The Redis client's own `protocol` option is passed through. Any
    /// other option is an error. A route configured by a table (`outbox.toml`) takes
    /// the same options in its `url`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use outbox_sink_redis::{Durability, HeaderLayout, RedisSinkConfig};
    ///
    /// let config = RedisSinkConfig::from_url(
    ///     "redis://127.0.0.1/?stream=events&durability=wait:1&durability_timeout=250ms&headers=json&dedupe_window=off",
    /// )?;
    /// assert_eq!(config.url, "redis://127.0.0.1/");
    /// assert_eq!(config.durability, Durability::wait(1, Duration::from_millis(250)));
    /// assert_eq!(config.fields.headers, HeaderLayout::Json { field: "headers".into() });
    /// assert_eq!(config.dedupe_window, None);
    ///
    /// assert!(RedisSinkConfig::from_url("redis://127.0.0.1/?stream_name=x").is_err());
    /// # Ok::<(), outbox_sink_redis::RedisSinkError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`RedisSinkError::InvalidUrl`] for an unparsable URL or an unknown option,
    /// [`RedisSinkError::InvalidSetting`] for an option with a bad value.
    pub fn from_url(url: &str) -> Result<Self, RedisSinkError> {
        let mut config = Self::new(url);
        config.take_url_options()?;
        Ok(config)
    }

    /// Moves the sink options of [`from_url`](Self::from_url) out of `self.url`'s query
    /// into the fields, keeping the client's own options in the URL; returns the
    /// settings they set.
    pub(crate) fn take_url_options(&mut self) -> Result<Vec<&'static str>, RedisSinkError> {
        let mut parsed = parse_url(&self.url)?;
        let mut durability_kind: Option<String> = None;
        let mut durability_timeout: Option<Duration> = None;
        let mut kept: Vec<(String, String)> = Vec::new();
        let mut set = Vec::new();
        for (name, value) in parsed.query_pairs() {
            let (name, value) = (name.into_owned(), value.into_owned());
            let setting = match name.as_str() {
                "stream" => {
                    self.stream = value;
                    "stream"
                }
                "maxlen" => {
                    self.maxlen = Some(parse_number("maxlen", &value)?);
                    "maxlen"
                }
                "dedupe_window" => {
                    self.dedupe_window = match value.as_str() {
                        "off" | "none" | "0" => None,
                        text => Some(parse_setting_duration("dedupe_window", text)?),
                    };
                    "dedupe_window"
                }
                "dedupe_prefix" => {
                    self.dedupe_prefix = value;
                    "dedupe_prefix"
                }
                "durability" => {
                    durability_kind = Some(value);
                    "durability"
                }
                "durability_timeout" => {
                    durability_timeout =
                        Some(parse_setting_duration("durability_timeout", &value)?);
                    "durability"
                }
                "headers" => {
                    self.fields.headers = HeaderLayout::parse(&value)?;
                    "fields"
                }
                "metadata" => {
                    self.fields.metadata = parse_flag("metadata", &value)?;
                    "fields"
                }
                "fields.id" => {
                    self.fields.id = value;
                    "fields"
                }
                "fields.idempotency_key" => {
                    self.fields.idempotency_key = value;
                    "fields"
                }
                "fields.event_type" => {
                    self.fields.event_type = value;
                    "fields"
                }
                "fields.content_type" => {
                    self.fields.content_type = value;
                    "fields"
                }
                "fields.payload" => {
                    self.fields.payload = value;
                    "fields"
                }
                "max_payload_bytes" => {
                    self.max_payload_bytes = parse_number("max_payload_bytes", &value)?;
                    "max_payload_bytes"
                }
                "connect_timeout" => {
                    self.connect_timeout = parse_setting_duration("connect_timeout", &value)?;
                    "connect_timeout"
                }
                "response_timeout" => {
                    self.response_timeout = parse_setting_duration("response_timeout", &value)?;
                    "response_timeout"
                }
                "tls_ca_file" => {
                    self.tls_ca_file = Some(value.into());
                    "tls_ca_file"
                }
                "tls_cert_file" => {
                    self.tls_cert_file = Some(value.into());
                    "tls_cert_file"
                }
                "tls_key_file" => {
                    self.tls_key_file = Some(value.into());
                    "tls_key_file"
                }
                _ if is_client_option(&parsed, &name) => {
                    kept.push((name, value));
                    continue;
                }
                _ => {
                    return Err(RedisSinkError::InvalidUrl {
                        url: outbox_engine::redact::url(&self.url),
                        reason: format!(
                            "unknown option `{name}` (sink options: {}; client options: {})",
                            SINK_OPTIONS.join(", "),
                            CLIENT_OPTIONS.join(", ")
                        ),
                    });
                }
            };
            if !set.contains(&setting) {
                set.push(setting);
            }
        }
        let timeout = durability_timeout.unwrap_or(Durability::DEFAULT_TIMEOUT);
        match durability_kind {
            Some(kind) => self.durability = Durability::parse(&kind, timeout)?,
            None if durability_timeout.is_some() => {
                return Err(invalid(
                    "durability_timeout",
                    "given without `durability=wait:<n>` or `durability=waitaof:<local>:<n>`",
                ));
            }
            None => {}
        }
        if kept.is_empty() {
            parsed.set_query(None);
        } else {
            parsed.query_pairs_mut().clear().extend_pairs(kept);
        }
        self.url = parsed.to_string();
        Ok(set)
    }

    /// Sets the server URL.
    ///
    /// ```
    /// # use outbox_sink_redis::RedisSinkConfig;
    /// let c = RedisSinkConfig::default().url("redis://cache:6379/2");
    /// assert_eq!(c.url, "redis://cache:6379/2");
    /// ```
    pub fn url(mut self, url: impl Into<String>) -> Self {
        self.url = url.into();
        self
    }

    /// Sets the stream key template (see [`StreamTemplate`]).
    ///
    /// ```
    /// # use outbox_sink_redis::RedisSinkConfig;
    /// let c = RedisSinkConfig::default().stream("events.{tenant_id}");
    /// assert!(c.validate().is_ok());
    /// ```
    pub fn stream(mut self, template: impl Into<String>) -> Self {
        self.stream = template.into();
        self
    }

    /// Trims the stream to about `n` entries on every append (`MAXLEN ~ n`); `None` never
    /// trims.
    ///
    /// ```
    /// # use outbox_sink_redis::RedisSinkConfig;
    /// assert!(RedisSinkConfig::default().maxlen(Some(100_000)).validate().is_ok());
    /// assert!(RedisSinkConfig::default().maxlen(Some(0)).validate().is_err());
    /// ```
    pub fn maxlen(mut self, n: Option<u64>) -> Self {
        self.maxlen = n;
        self
    }

    /// Sets the dedupe window; `None` appends every publish (plain pipelined `XADD`).
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use outbox_sink_redis::RedisSinkConfig;
    /// let c = RedisSinkConfig::default().dedupe_window(Some(Duration::from_secs(3600)));
    /// assert_eq!(c.dedupe_window, Some(Duration::from_secs(3600)));
    /// ```
    pub fn dedupe_window(mut self, window: Option<Duration>) -> Self {
        self.dedupe_window = window;
        self
    }

    /// Sets the dedupe key prefix.
    ///
    /// ```
    /// # use outbox_sink_redis::RedisSinkConfig;
    /// assert!(RedisSinkConfig::default().dedupe_prefix("app:dedupe:").validate().is_ok());
    /// ```
    pub fn dedupe_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.dedupe_prefix = prefix.into();
        self
    }

    /// Sets the entry field layout.
    ///
    /// ```
    /// # use outbox_sink_redis::{FieldLayout, HeaderLayout, RedisSinkConfig};
    /// let mut layout = FieldLayout::default();
    /// layout.headers = HeaderLayout::Json { field: "headers".into() };
    /// assert!(RedisSinkConfig::default().fields(layout).validate().is_ok());
    /// ```
    pub fn fields(mut self, fields: FieldLayout) -> Self {
        self.fields = fields;
        self
    }

    /// Sets what each batch waits for before it counts as acknowledged.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use outbox_sink_redis::{Durability, RedisSinkConfig};
    /// let c = RedisSinkConfig::default().durability(Durability::wait(1, Duration::from_millis(200)));
    /// assert!(c.validate().is_ok());
    /// ```
    pub fn durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// Sets the largest payload accepted.
    ///
    /// ```
    /// # use outbox_sink_redis::RedisSinkConfig;
    /// assert_eq!(RedisSinkConfig::default().max_payload_bytes(1 << 20).max_payload_bytes, 1 << 20);
    /// ```
    pub fn max_payload_bytes(mut self, bytes: usize) -> Self {
        self.max_payload_bytes = bytes;
        self
    }

    /// Sets the timeout of one connection attempt.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use outbox_sink_redis::RedisSinkConfig;
    /// assert!(RedisSinkConfig::default().connect_timeout(Duration::from_secs(2)).validate().is_ok());
    /// ```
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Sets the timeout of one batch round trip.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use outbox_sink_redis::RedisSinkConfig;
    /// assert!(RedisSinkConfig::default().response_timeout(Duration::from_secs(10)).validate().is_ok());
    /// ```
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// Verifies the server with this CA certificate (PEM file) instead of the system roots.
    ///
    /// ```
    /// # use outbox_sink_redis::RedisSinkConfig;
    /// let c = RedisSinkConfig::new("rediss://cache.internal:6380/").tls_ca_file("/etc/ssl/redis-ca.pem");
    /// assert!(c.tls_ca_file.is_some());
    /// ```
    pub fn tls_ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.tls_ca_file = Some(path.into());
        self
    }

    /// Presents this client certificate and key (PEM files) for mutual TLS.
    ///
    /// ```
    /// # use outbox_sink_redis::RedisSinkConfig;
    /// let c = RedisSinkConfig::new("rediss://cache.internal:6380/")
    ///     .tls_client_cert("/etc/ssl/relay.pem", "/etc/ssl/relay.key");
    /// assert!(c.tls_cert_file.is_some() && c.tls_key_file.is_some());
    /// ```
    pub fn tls_client_cert(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        self.tls_cert_file = Some(cert.into());
        self.tls_key_file = Some(key.into());
        self
    }

    /// Checks every setting without touching the network, and returns the parsed stream
    /// template.
    ///
    /// ```
    /// use outbox_sink_redis::{RedisSinkConfig, RedisSinkError};
    ///
    /// let bad = RedisSinkConfig::default().stream("orders.{evnt_type}");
    /// assert!(matches!(bad.validate(), Err(RedisSinkError::InvalidTemplate { .. })));
    /// ```
    ///
    /// # Errors
    ///
    /// The first problem found, as a [`RedisSinkError`] naming the setting.
    pub fn validate(&self) -> Result<StreamTemplate, RedisSinkError> {
        let url = parse_url(&self.url)?;
        if let Some((name, _)) = url
            .query_pairs()
            .find(|(name, _)| !is_client_option(&url, name))
        {
            return Err(RedisSinkError::InvalidUrl {
                url: outbox_engine::redact::url(&self.url),
                reason: format!(
                    "unknown option `{name}` (sink options in a URL are read by RedisSinkConfig::from_url)"
                ),
            });
        }
        let tls = matches!(url.scheme(), "rediss" | "valkeys");
        if tls && !cfg!(any(feature = "tls-rustls", feature = "tls-native-tls")) {
            return Err(RedisSinkError::TlsNotEnabled);
        }
        for (setting, file) in [
            ("tls_ca_file", &self.tls_ca_file),
            ("tls_cert_file", &self.tls_cert_file),
            ("tls_key_file", &self.tls_key_file),
        ] {
            if file.is_some() && !tls {
                return Err(invalid(setting, "is only used with a rediss:// URL"));
            }
        }
        if self.tls_cert_file.is_some() != self.tls_key_file.is_some() {
            return Err(invalid(
                "tls_cert_file",
                "a client certificate needs its key (tls_key_file), and a key its certificate",
            ));
        }
        let template = StreamTemplate::parse(&self.stream)?;
        if self.maxlen == Some(0) {
            return Err(invalid(
                "maxlen",
                "must be at least 1 (leave it unset to never trim)",
            ));
        }
        if let Some(window) = self.dedupe_window {
            if window < Duration::from_millis(1) {
                return Err(invalid(
                    "dedupe_window",
                    "must be at least 1 ms (set it to None to turn deduplication off)",
                ));
            }
            if self.dedupe_prefix.is_empty() {
                return Err(invalid(
                    "dedupe_prefix",
                    "must not be empty while deduplication is on",
                ));
            }
            if self.dedupe_prefix.chars().any(char::is_control) {
                return Err(invalid(
                    "dedupe_prefix",
                    "must not contain control characters",
                ));
            }
        }
        self.fields.validate()?;
        self.durability.validate(self.response_timeout)?;
        if self.max_payload_bytes == 0 {
            return Err(invalid("max_payload_bytes", "must be at least 1"));
        }
        if self.connect_timeout.is_zero() {
            return Err(invalid("connect_timeout", "must be above zero"));
        }
        if self.response_timeout.is_zero() {
            return Err(invalid("response_timeout", "must be above zero"));
        }
        Ok(template)
    }
}

fn is_client_option(url: &url::Url, name: &str) -> bool {
    CLIENT_OPTIONS.contains(&name)
        || (matches!(url.scheme(), "unix" | "redis+unix" | "valkey+unix")
            && UNIX_CLIENT_OPTIONS.contains(&name))
}

fn parse_url(text: &str) -> Result<url::Url, RedisSinkError> {
    let url = url::Url::parse(text).map_err(|e| RedisSinkError::InvalidUrl {
        url: outbox_engine::redact::url(text),
        reason: e.to_string(),
    })?;
    match url.scheme() {
        "redis" | "rediss" | "valkey" | "valkeys" => {
            if url.host_str().is_none_or(str::is_empty) {
                return Err(RedisSinkError::InvalidUrl {
                    url: outbox_engine::redact::url(text),
                    reason: "missing host".to_owned(),
                });
            }
            let db = url.path().trim_matches('/');
            if !db.is_empty() && db.parse::<u16>().is_err() {
                return Err(RedisSinkError::InvalidUrl {
                    url: outbox_engine::redact::url(text),
                    reason: "the path must be a database number, such as `/0`".to_owned(),
                });
            }
        }
        "unix" | "redis+unix" | "valkey+unix" => {}
        other => {
            return Err(RedisSinkError::InvalidUrl {
                url: outbox_engine::redact::url(text),
                reason: format!(
                    "scheme `{other}` is not a Redis scheme (use redis://, rediss:// or unix://)"
                ),
            });
        }
    }
    Ok(url)
}

fn invalid(setting: &'static str, reason: impl Into<String>) -> RedisSinkError {
    RedisSinkError::InvalidSetting {
        setting,
        reason: reason.into(),
    }
}

fn parse_number<T: std::str::FromStr>(
    setting: &'static str,
    text: &str,
) -> Result<T, RedisSinkError> {
    text.parse()
        .map_err(|_| invalid(setting, format!("{text:?} is not a non-negative integer")))
}

fn parse_flag(setting: &'static str, text: &str) -> Result<bool, RedisSinkError> {
    match text {
        "true" | "1" | "yes" => Ok(true),
        "false" | "0" | "no" => Ok(false),
        _ => Err(invalid(setting, "must be true or false")),
    }
}

fn parse_setting_duration(setting: &'static str, text: &str) -> Result<Duration, RedisSinkError> {
    parse_duration(text).map_err(|reason| invalid(setting, reason))
}

/// Parses a duration in `outbox_engine::duration`'s grammar (`250ms`, `1.5s`, `2m`, `1h 30m`).
fn parse_duration(text: &str) -> Result<Duration, String> {
    outbox_engine::duration::parse(text)
}

/// A parsed stream key template.
///
/// Literal text with placeholders in braces: `{destination}`, `{event_type}`,
/// `{partition_key}`, `{tenant_id}`, `{aggregate_type}`. `{{` and `}}` stand for
/// literal braces (for a Redis Cluster hash tag such as `{{orders}}`). A template without
/// placeholders names one fixed stream.
///
/// A message that lacks a field its template needs (no partition key, say) fails
/// permanently with a [`Config`](outbox_engine::FailureClass::Config) failure; so does a
/// rendered key longer than [`MAX_STREAM_KEY_BYTES`].
///
/// ```
/// use outbox_sink_redis::StreamTemplate;
///
/// let t = StreamTemplate::parse("events.{tenant_id}.{event_type}")?;
/// assert!(t.fixed().is_none());
/// assert_eq!(StreamTemplate::parse("orders").unwrap().fixed().as_deref(), Some("orders"));
/// assert!(StreamTemplate::parse("orders.{nope}").is_err());
/// assert!(StreamTemplate::parse("orders.{event_type").is_err());
/// # Ok::<(), outbox_sink_redis::RedisSinkError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamTemplate(Template);

impl StreamTemplate {
    /// Parses a template.
    ///
    /// # Errors
    ///
    /// [`RedisSinkError::InvalidTemplate`] for an empty or over-long template, control
    /// characters, an unknown placeholder, or an unmatched brace.
    pub fn parse(template: &str) -> Result<Self, RedisSinkError> {
        let fail = |reason: String| RedisSinkError::InvalidTemplate {
            template: template.chars().take(128).collect(),
            reason,
        };
        if template.is_empty() {
            return Err(fail("must not be empty".to_owned()));
        }
        if template.len() > MAX_STREAM_KEY_BYTES {
            return Err(fail(format!(
                "{} bytes, limit is {MAX_STREAM_KEY_BYTES}",
                template.len()
            )));
        }
        Template::parse(template)
            .map(Self)
            .map_err(|e| fail(e.reason))
    }

    /// The template as written.
    ///
    /// ```
    /// # use outbox_sink_redis::StreamTemplate;
    /// assert_eq!(StreamTemplate::parse("a.{event_type}")?.as_str(), "a.{event_type}");
    /// # Ok::<(), outbox_sink_redis::RedisSinkError>(())
    /// ```
    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }

    /// The one stream key of a template without placeholders, `None` otherwise.
    ///
    /// ```
    /// # use outbox_sink_redis::StreamTemplate;
    /// assert_eq!(StreamTemplate::parse("orders.{{v2}}")?.fixed().as_deref(), Some("orders.{v2}"));
    /// assert_eq!(StreamTemplate::parse("orders.{tenant_id}")?.fixed(), None);
    /// # Ok::<(), outbox_sink_redis::RedisSinkError>(())
    /// ```
    pub fn fixed(&self) -> Option<String> {
        self.0.fixed()
    }

    /// The stream key for `message`.
    ///
    /// ```
    /// use chrono::Utc;
    /// use outbox_engine::NewMessage;
    /// use outbox_sink_redis::StreamTemplate;
    ///
    /// let t = StreamTemplate::parse("{{app}}.{destination}.{partition_key}")?;
    /// let m = NewMessage::builder("orders", "order.paid").partition_key("o-42").build()?.into_message(Utc::now());
    /// assert_eq!(t.render(&m).unwrap(), "{app}.orders.o-42");
    ///
    /// let unkeyed = NewMessage::builder("orders", "order.paid").build()?.into_message(Utc::now());
    /// assert!(t.render(&unkeyed).unwrap_err().contains("partition_key"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// A description of the problem when the message lacks a field the template needs, or
    /// the key would be longer than [`MAX_STREAM_KEY_BYTES`].
    pub fn render(&self, message: &Message) -> Result<String, String> {
        let key = self.0.render(message).map_err(|e| format!("stream {e}"))?;
        if key.len() > MAX_STREAM_KEY_BYTES {
            return Err(format!(
                "stream key rendered from {:?} is {} bytes, limit is {MAX_STREAM_KEY_BYTES}",
                self.0.as_str(),
                key.len()
            ));
        }
        Ok(key)
    }
}

/// The names of an entry's fields and how headers are written.
///
/// Every entry carries, in this order: `id`, `idempotency_key`, `event_type`,
/// `content_type`; then, when [`metadata`](Self::metadata) is on and the message has
/// them, `partition_key`, `tenant_id`, `aggregate_type`, `aggregate_id`; then the headers
/// (see [`HeaderLayout`]); and last `payload`, the exact payload bytes (binary safe). The
/// first five names can be changed; the metadata names are fixed.
///
/// ```
/// use outbox_sink_redis::{FieldLayout, HeaderLayout};
///
/// let mut layout = FieldLayout::default();
/// assert_eq!(layout.payload, "payload");
/// assert_eq!(layout.headers, HeaderLayout::Prefixed { prefix: "h:".into() });
/// layout.payload = "data".into();
/// assert!(layout.validate().is_ok());
/// layout.payload = "id".into(); // two fields with one name
/// assert!(layout.validate().is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct FieldLayout {
    /// The message id (a UUIDv7). Default `id`.
    pub id: String,
    /// The idempotency key. Default `idempotency_key`.
    pub idempotency_key: String,
    /// The event type. Default `event_type`.
    pub event_type: String,
    /// The payload's media type. Default `content_type`.
    pub content_type: String,
    /// The payload bytes. Default `payload`.
    pub payload: String,
    /// Also write `partition_key`, `tenant_id`, `aggregate_type` and `aggregate_id` when
    /// the message has them. Default on.
    pub metadata: bool,
    /// How headers are written.
    pub headers: HeaderLayout,
}

/// The fixed names of the metadata fields.
///
/// ```
/// assert_eq!(outbox_sink_redis::METADATA_FIELDS[0], "partition_key");
/// ```
pub const METADATA_FIELDS: [&str; 4] = [
    "partition_key",
    "tenant_id",
    "aggregate_type",
    "aggregate_id",
];

impl Default for FieldLayout {
    fn default() -> Self {
        Self {
            id: "id".to_owned(),
            idempotency_key: "idempotency_key".to_owned(),
            event_type: "event_type".to_owned(),
            content_type: "content_type".to_owned(),
            payload: "payload".to_owned(),
            metadata: true,
            headers: HeaderLayout::default(),
        }
    }
}

impl FieldLayout {
    /// Checks that names are non-empty and distinct, and that no fixed field can be
    /// mistaken for a header.
    ///
    /// ```
    /// # use outbox_sink_redis::FieldLayout;
    /// let mut layout = FieldLayout::default();
    /// layout.event_type = "h:type".into(); // would read as the header `type`
    /// assert!(layout.validate().is_err());
    /// ```
    ///
    /// # Errors
    ///
    /// [`RedisSinkError::InvalidSetting`] naming the problem.
    pub fn validate(&self) -> Result<(), RedisSinkError> {
        let mut names: Vec<(&str, &str)> = vec![
            ("fields.id", &self.id),
            ("fields.idempotency_key", &self.idempotency_key),
            ("fields.event_type", &self.event_type),
            ("fields.content_type", &self.content_type),
            ("fields.payload", &self.payload),
        ];
        if self.metadata {
            names.extend(METADATA_FIELDS.iter().map(|n| ("fields.metadata", *n)));
        }
        match &self.headers {
            HeaderLayout::Prefixed { prefix } => {
                if prefix.is_empty() || prefix.chars().any(char::is_control) {
                    return Err(invalid(
                        "fields.headers.prefix",
                        "must be non-empty, without control characters",
                    ));
                }
                if let Some((_, name)) = names.iter().find(|(_, n)| n.starts_with(prefix.as_str()))
                {
                    return Err(invalid(
                        "fields.headers.prefix",
                        format!(
                            "field {name:?} starts with the header prefix {prefix:?}, so it would read as a header"
                        ),
                    ));
                }
            }
            HeaderLayout::Json { field } => names.push(("fields.headers.field", field)),
        }
        for (i, (setting, name)) in names.iter().enumerate() {
            if name.is_empty() || name.chars().any(char::is_control) {
                return Err(invalid(
                    setting,
                    "must be non-empty, without control characters",
                ));
            }
            if names[..i].iter().any(|(_, other)| other == name) {
                return Err(invalid(
                    setting,
                    format!("field name {name:?} is used twice"),
                ));
            }
        }
        Ok(())
    }
}

/// How a message's headers are written into the entry.
///
/// `Prefixed` (the default) writes one field per header, named `<prefix><header name>`
/// (`h:traceparent`), so consumers read a header without parsing anything. Header names
/// are HTTP tokens and never contain `:`, so with the default prefix a header can never
/// clash with another field. `Json` writes one field holding a JSON object of all headers
/// (`{}` when there are none), for consumers that want a fixed set of fields.
///
/// ```
/// use outbox_sink_redis::HeaderLayout;
///
/// assert_eq!(HeaderLayout::parse("json:hdrs")?, HeaderLayout::Json { field: "hdrs".into() });
/// assert_eq!(HeaderLayout::parse("fields")?, HeaderLayout::default());
/// # Ok::<(), outbox_sink_redis::RedisSinkError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(tag = "layout", rename_all = "snake_case", deny_unknown_fields)]
#[non_exhaustive]
pub enum HeaderLayout {
    /// One field per header, named `<prefix><name>`.
    Prefixed {
        /// The field name prefix. Default `h:`.
        #[serde(default = "HeaderLayout::default_prefix")]
        prefix: String,
    },
    /// One field holding a JSON object of all headers.
    Json {
        /// The field name. Default `headers`.
        #[serde(default = "HeaderLayout::default_field")]
        field: String,
    },
}

impl Default for HeaderLayout {
    fn default() -> Self {
        Self::Prefixed {
            prefix: "h:".to_owned(),
        }
    }
}

impl HeaderLayout {
    fn default_prefix() -> String {
        "h:".to_owned()
    }

    fn default_field() -> String {
        "headers".to_owned()
    }

    /// Parses the URL form: `fields`, `fields:<prefix>`, `json` or `json:<field>`.
    ///
    /// # Errors
    ///
    /// [`RedisSinkError::InvalidSetting`] for anything else.
    pub fn parse(text: &str) -> Result<Self, RedisSinkError> {
        match text.split_once(':') {
            None if text == "fields" => Ok(Self::default()),
            None if text == "json" => Ok(Self::Json {
                field: "headers".to_owned(),
            }),
            Some(("fields", prefix)) => Ok(Self::Prefixed {
                prefix: prefix.to_owned(),
            }),
            Some(("json", field)) => Ok(Self::Json {
                field: field.to_owned(),
            }),
            _ => Err(invalid(
                "headers",
                format!("{text:?}: use fields, fields:<prefix>, json or json:<field>"),
            )),
        }
    }
}

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

    fn parse(text: &str, timeout: Duration) -> Result<Self, RedisSinkError> {
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

    fn validate(&self, response_timeout: Duration) -> Result<(), RedisSinkError> {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// One vocabulary: every setting of a route's table is a URL option, and the reverse.
    #[test]
    fn every_table_setting_is_a_url_option_and_the_reverse() {
        use serde_json::json;
        outbox_engine::testkit::assert_url_parity::<crate::RedisSink, _>(
            "redis://127.0.0.1:6379/",
            RedisSinkConfig::from_url,
            RedisSinkConfig::clone,
            &[(
                "fields",
                outbox_engine::testkit::setting_names::<FieldLayout>(),
            )],
            &[],
            SINK_OPTIONS,
            &[
                &[
                    (
                        "stream",
                        json!("orders.{event_type}"),
                        "stream=orders.{event_type}",
                    ),
                    ("maxlen", json!(1000), "maxlen=1000"),
                    ("dedupe_window", json!("10m"), "dedupe_window=10m"),
                    ("dedupe_window", json!("off"), "dedupe_window=off"),
                    ("dedupe_window", json!(null), "dedupe_window=none"),
                    (
                        "dedupe_prefix",
                        json!("app:seen:"),
                        "dedupe_prefix=app:seen:",
                    ),
                    (
                        "durability",
                        json!({ "mode": "wait", "replicas": 1, "timeout": "250ms" }),
                        "durability=wait:1&durability_timeout=250ms",
                    ),
                    (
                        "durability",
                        json!({ "mode": "wait_aof", "local": true, "replicas": 0 }),
                        "durability=waitaof:1:0",
                    ),
                    ("fields.id", json!("msg_id"), "fields.id=msg_id"),
                    (
                        "fields.idempotency_key",
                        json!("key"),
                        "fields.idempotency_key=key",
                    ),
                    ("fields.event_type", json!("type"), "fields.event_type=type"),
                    ("fields.content_type", json!("ct"), "fields.content_type=ct"),
                    ("fields.payload", json!("data"), "fields.payload=data"),
                    ("fields.metadata", json!(false), "metadata=false"),
                    (
                        "fields.headers",
                        json!({ "layout": "json", "field": "hdrs" }),
                        "headers=json:hdrs",
                    ),
                    ("max_payload_bytes", json!(1024), "max_payload_bytes=1024"),
                    ("connect_timeout", json!("2s"), "connect_timeout=2s"),
                    ("response_timeout", json!("3s"), "response_timeout=3s"),
                ][..],
                &outbox_engine::testkit::tls_file_cases(),
            ]
            .concat(),
        );
    }
    use chrono::Utc;
    use outbox_engine::NewMessage;

    fn message() -> Message {
        NewMessage::builder("orders", "order.paid")
            .tenant_id("acme")
            .build()
            .unwrap()
            .into_message(Utc::now())
    }

    #[test]
    fn templates_render_fields_and_escapes() {
        let t = StreamTemplate::parse("{{x}}:{destination}/{event_type}@{tenant_id}").unwrap();
        assert_eq!(t.render(&message()).unwrap(), "{x}:orders/order.paid@acme");
        assert_eq!(t.fixed(), None);
        let fixed = StreamTemplate::parse("a{{b}}c").unwrap();
        assert_eq!(fixed.fixed().as_deref(), Some("a{b}c"));
        assert_eq!(fixed.render(&message()).unwrap(), "a{b}c");
        // Multi-byte characters next to placeholders.
        let t = StreamTemplate::parse("é{event_type}ü").unwrap();
        assert_eq!(t.render(&message()).unwrap(), "éorder.paidü");
    }

    #[test]
    fn bad_templates_are_typed_errors() {
        for (template, needle) in [
            ("", "empty"),
            ("a{", "unclosed"),
            ("a{event_type", "unclosed"),
            ("a}", "unmatched"),
            ("{}", "unknown placeholder"),
            ("{Event_Type}", "unknown placeholder"),
            ("{partition key}", "unknown placeholder"),
            ("a\nb", "control"),
        ] {
            match StreamTemplate::parse(template) {
                Err(RedisSinkError::InvalidTemplate { reason, .. }) => {
                    assert!(reason.contains(needle), "{template:?}: {reason}")
                }
                other => panic!("{template:?}: {other:?}"),
            }
        }
        let long = "x".repeat(MAX_STREAM_KEY_BYTES + 1);
        assert!(StreamTemplate::parse(&long).is_err());
    }

    #[test]
    fn rendering_fails_cleanly_for_missing_fields_and_long_keys() {
        let t = StreamTemplate::parse("s.{partition_key}").unwrap();
        let err = t.render(&message()).unwrap_err();
        assert!(err.contains("partition_key"), "{err}");
        let long_type = NewMessage::builder("orders", "e".repeat(255))
            .build()
            .unwrap()
            .into_message(Utc::now());
        let t = StreamTemplate::parse(&format!(
            "{}{{event_type}}",
            "k".repeat(MAX_STREAM_KEY_BYTES - 20)
        ))
        .unwrap();
        assert!(t.render(&message()).is_ok());
        assert!(t.render(&long_type).unwrap_err().contains("limit"));
    }

    #[test]
    fn from_url_reads_options_and_keeps_client_ones() {
        let c = RedisSinkConfig::from_url(
            "redis://u:p%40ss@h:6380/2?protocol=resp3&stream=s.{event_type}&maxlen=10&dedupe_window=90s&dedupe_prefix=d:&durability=waitaof:1:0&durability_timeout=2s&headers=fields:hdr.&metadata=false&max_payload_bytes=100&connect_timeout=1s&response_timeout=3s",
        )
        .unwrap();
        assert_eq!(c.url, "redis://u:p%40ss@h:6380/2?protocol=resp3");
        assert_eq!(c.stream, "s.{event_type}");
        assert_eq!(c.maxlen, Some(10));
        assert_eq!(c.dedupe_window, Some(Duration::from_secs(90)));
        assert_eq!(c.dedupe_prefix, "d:");
        assert_eq!(
            c.durability,
            Durability::wait_aof(true, 0, Duration::from_secs(2))
        );
        assert_eq!(
            c.fields.headers,
            HeaderLayout::Prefixed {
                prefix: "hdr.".into()
            }
        );
        assert!(!c.fields.metadata);
        assert_eq!(c.max_payload_bytes, 100);
        assert_eq!(c.connect_timeout, Duration::from_secs(1));
        assert_eq!(c.response_timeout, Duration::from_secs(3));
        c.validate().unwrap();
        let debug = format!("{c:?}");
        assert!(
            !debug.contains("p%40ss") && debug.contains("***"),
            "{debug}"
        );
    }

    #[test]
    fn bad_urls_and_options_are_typed_errors() {
        for url in [
            "not a url",
            "http://127.0.0.1/",
            "redis:///",
            "redis://h/notadb",
            "redis://h/?foo=1",
        ] {
            assert!(
                matches!(
                    RedisSinkConfig::from_url(url),
                    Err(RedisSinkError::InvalidUrl { .. })
                ),
                "{url}"
            );
        }
        for (url, setting) in [
            ("redis://h/?maxlen=-1", "maxlen"),
            ("redis://h/?dedupe_window=5 parsecs", "dedupe_window"),
            ("redis://h/?durability=wait", "durability"),
            ("redis://h/?durability=waitaof:2:0", "durability"),
            ("redis://h/?durability_timeout=1s", "durability_timeout"),
            ("redis://h/?headers=xml", "headers"),
            ("redis://h/?metadata=maybe", "metadata"),
        ] {
            match RedisSinkConfig::from_url(url) {
                Err(RedisSinkError::InvalidSetting { setting: s, .. }) => {
                    assert_eq!(s, setting, "{url}")
                }
                other => panic!("{url}: {other:?}"),
            }
        }
        // Sink options given to `new` instead of `from_url` are caught by validate.
        assert!(matches!(
            RedisSinkConfig::new("redis://h/?stream=x").validate(),
            Err(RedisSinkError::InvalidUrl { .. })
        ));
    }

    #[test]
    fn validate_checks_each_setting() {
        let ok = RedisSinkConfig::default();
        ok.validate().unwrap();
        let cases: Vec<(RedisSinkConfig, &str)> = vec![
            (ok.clone().maxlen(Some(0)), "maxlen"),
            (
                ok.clone().dedupe_window(Some(Duration::ZERO)),
                "dedupe_window",
            ),
            (ok.clone().dedupe_prefix(""), "dedupe_prefix"),
            (ok.clone().max_payload_bytes(0), "max_payload_bytes"),
            (
                ok.clone().connect_timeout(Duration::ZERO),
                "connect_timeout",
            ),
            (
                ok.clone()
                    .durability(Durability::wait(0, Duration::from_secs(5))),
                "durability.timeout",
            ),
            (
                ok.clone().durability(Durability::wait(0, Duration::ZERO)),
                "durability.timeout",
            ),
        ];
        for (config, setting) in cases {
            match config.validate() {
                Err(RedisSinkError::InvalidSetting { setting: s, .. }) => assert_eq!(s, setting),
                other => panic!("{setting}: {other:?}"),
            }
        }
        let tls_on_plain = ok.clone().tls_ca_file("/ca.pem");
        assert!(matches!(
            tls_on_plain.validate(),
            Err(RedisSinkError::InvalidSetting {
                setting: "tls_ca_file",
                ..
            })
        ));
        let mut half = RedisSinkConfig::new("rediss://h/");
        half.tls_cert_file = Some("/client.pem".into());
        match half.validate() {
            Err(RedisSinkError::InvalidSetting { setting, .. }) => {
                assert_eq!(setting, "tls_cert_file")
            }
            // Without a TLS feature the URL itself is refused first.
            Err(RedisSinkError::TlsNotEnabled) => {}
            other => panic!("{other:?}"),
        }
        // No deduplication: the prefix does not matter.
        ok.clone()
            .dedupe_window(None)
            .dedupe_prefix("")
            .validate()
            .unwrap();
    }

    #[test]
    fn field_layout_rejects_clashes() {
        let l = FieldLayout {
            headers: HeaderLayout::Prefixed { prefix: "i".into() },
            ..FieldLayout::default()
        };
        assert!(l.validate().is_err(), "`id` starts with the prefix");
        let mut l = FieldLayout {
            payload: "tenant_id".into(),
            ..FieldLayout::default()
        };
        assert!(l.validate().is_err(), "clashes with metadata");
        l.metadata = false;
        l.validate().unwrap();
        let mut l = FieldLayout {
            headers: HeaderLayout::Json {
                field: "payload".into(),
            },
            ..FieldLayout::default()
        };
        assert!(l.validate().is_err());
        l.headers = HeaderLayout::default();
        l.validate().unwrap();
        l.id = String::new();
        assert!(l.validate().is_err());
    }

    #[test]
    fn deserializes_from_json_with_defaults_and_durations() {
        let c: RedisSinkConfig = serde_json::from_value(serde_json::json!({
            "url": "redis://127.0.0.1:6379/1",
            "stream": "events",
            "dedupe_window": "2m",
            "durability": { "mode": "wait", "replicas": 1, "timeout": "250ms" },
            "fields": { "payload": "body", "headers": { "layout": "json", "field": "hdrs" } },
            "response_timeout": "10s"
        }))
        .unwrap();
        assert_eq!(c.dedupe_window, Some(Duration::from_secs(120)));
        assert_eq!(
            c.durability,
            Durability::wait(1, Duration::from_millis(250))
        );
        assert_eq!(c.fields.payload, "body");
        assert_eq!(c.fields.id, "id");
        assert_eq!(c.response_timeout, Duration::from_secs(10));
        assert_eq!(c.connect_timeout, Duration::from_secs(5));
        c.validate().unwrap();
        let off: RedisSinkConfig =
            serde_json::from_value(serde_json::json!({ "dedupe_window": null })).unwrap();
        assert_eq!(off.dedupe_window, None);
        assert!(
            serde_json::from_value::<RedisSinkConfig>(serde_json::json!({ "strem": "x" })).is_err()
        );
        assert!(
            serde_json::from_value::<RedisSinkConfig>(
                serde_json::json!({ "connect_timeout": "5 fortnights" })
            )
            .is_err()
        );
    }

    #[test]
    fn durations_parse() {
        assert!(parse_duration("250").unwrap_err().contains("needs a unit"));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("5s").unwrap(), Duration::from_secs(5));
        assert_eq!(parse_duration("10m").unwrap(), Duration::from_secs(600));
        assert_eq!(parse_duration("1h").unwrap(), Duration::from_secs(3600));
        assert!(parse_duration("").is_err());
        assert!(parse_duration("s").is_err());
        assert!(parse_duration("1x").is_err());
        assert!(parse_duration("99999999999999999999d").is_err());
    }
}
