//! Route configuration: where to connect, which stream, how entries are laid out, how
//! long duplicates are suppressed, and how durable an acknowledgement must be.

mod durability;
mod stream;
#[cfg(test)]
mod tests;
mod url;

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use derive_setters::Setters;
use serde::Deserialize;

pub use durability::Durability;
pub use stream::{MAX_STREAM_KEY_BYTES, StreamTemplate};

use self::url::{is_client_option, parse_url};
use crate::error::RedisSinkError;

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
#[derive(Clone, PartialEq, Eq, Deserialize, Setters)]
#[serde(default, deny_unknown_fields)]
#[setters(into, strip_option)]
#[non_exhaustive]
pub struct RedisSinkConfig {
    /// The server URL: `redis://[user][:password@]host[:port][/db]`, `rediss://…` (TLS,
    /// needs a `tls-*` feature), or `unix:///path/to/socket?db=0`.
    pub url: String,
    /// The stream key template (see [`StreamTemplate`]).
    pub stream: String,
    /// Trim the stream to about this many entries on every append (`MAXLEN ~ n`); unset,
    /// the stream is never trimmed.
    #[setters(into = false, strip_option = false)]
    pub maxlen: Option<u64>,
    /// How long a re-sent idempotency key is recognised and not appended again. `"off"`
    /// (`None` in code; TOML has no null) appends every publish.
    #[setters(into = false, strip_option = false)]
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
    #[setters(into = false)]
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
    #[setters(skip)]
    pub tls_cert_file: Option<PathBuf>,
    /// The client certificate's private key (PEM); needs `tls_cert_file`.
    #[setters(skip)]
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

fn invalid(setting: &'static str, reason: impl Into<String>) -> RedisSinkError {
    RedisSinkError::InvalidSetting {
        setting,
        reason: reason.into(),
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
