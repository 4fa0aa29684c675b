//! Route configuration: which broker and vhost, which exchange and routing key, how
//! messages are marked, and the connection's timeouts and TLS files.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use derive_setters::Setters;
use outbox_engine::template::Template;
use serde::Deserialize;

use crate::error::AmqpSinkError;

/// The longest exchange name or routing key AMQP carries (a `shortstr`), in bytes.
pub const MAX_NAME_BYTES: usize = 255;

/// URL query options that belong to the AMQP client (lapin), not to the sink.
const CLIENT_OPTIONS: &[&str] = &[
    "heartbeat",
    "channel_max",
    "frame_max",
    "connection_timeout",
    "auth_mechanism",
];
/// URL query options [`AmqpSinkConfig::from_url`] understands.
const SINK_OPTIONS: &[&str] = &[
    "exchange",
    "routing_key",
    "persistent",
    "max_payload_bytes",
    "connect_timeout",
    "tls_ca_file",
    "tls_cert_file",
    "tls_key_file",
];

/// The configuration of one RabbitMQ (AMQP 0-9-1) route.
///
/// Build it from a URL ([`from_url`](Self::from_url)), from a config file (it implements
/// `Deserialize`; every field has a default), or with the chainable setters. Everything
/// is checked by [`validate`](Self::validate), which
/// [`AmqpSink::connect`](crate::AmqpSink::connect) calls first.
///
/// | field | default | meaning |
/// |---|---|---|
/// | `url` | `amqp://127.0.0.1:5672/%2f` | broker, user, password and vhost (`amqp://`, `amqps://`); the path is the vhost, URL-encoded (`%2f` is `/`) |
/// | `exchange` | `""` (the default exchange) | exchange name template, see [`Template`] |
/// | `routing_key` | `{destination}` | routing key template |
/// | `persistent` | `true` | delivery mode 2: the broker writes the message to disk in durable queues |
/// | `max_payload_bytes` | 16 MiB | larger payloads fail permanently as too large |
/// | `connect_timeout` | 5 s | one connection attempt, including the AMQP handshake |
/// | `tls_ca_file` | none (system roots) | PEM file of the CA that signed the broker's certificate (`amqps://` only) |
/// | `tls_cert_file`, `tls_key_file` | none | PEM client certificate and PKCS#8 key, for brokers that verify clients |
///
/// Every message is published with `mandatory` set and waits for its publisher confirm;
/// neither can be turned off, because without them a broker's acknowledgement does not
/// mean a queue has the message.
///
/// ```
/// use outbox_sink_amqp::AmqpSinkConfig;
///
/// let config = AmqpSinkConfig::from_url(
///     "amqp://relay:s3cret@mq.internal:5672/shop?exchange=events&routing_key={event_type}&heartbeat=30",
/// )?;
/// assert_eq!(config.exchange, "events");
/// assert_eq!(config.routing_key, "{event_type}");
/// assert_eq!(config.url, "amqp://relay:s3cret@mq.internal:5672/shop?heartbeat=30");
/// // Debug output never shows the password.
/// assert!(!format!("{config:?}").contains("s3cret"));
/// # Ok::<(), outbox_sink_amqp::AmqpSinkError>(())
/// ```
#[derive(Clone, PartialEq, Eq, Deserialize, Setters)]
#[serde(default, deny_unknown_fields)]
#[setters(into, strip_option)]
#[non_exhaustive]
pub struct AmqpSinkConfig {
    /// The broker URL: `amqp://[user[:password]@]host[:port][/vhost][?client options]`,
    /// or `amqps://…` (TLS, needs a `tls-*` feature).
    pub url: String,
    /// The exchange name template; empty for the default exchange, which routes by queue
    /// name.
    pub exchange: String,
    /// The routing key template.
    pub routing_key: String,
    /// Publish with delivery mode 2 (persistent).
    pub persistent: bool,
    /// Payloads larger than this fail permanently as too large.
    #[setters(into = false)]
    pub max_payload_bytes: usize,
    /// How long one connection attempt may take.
    #[serde(deserialize_with = "outbox_engine::duration::deserialize")]
    pub connect_timeout: Duration,
    /// The CA certificate (PEM) to verify the broker with, instead of the system roots.
    pub tls_ca_file: Option<PathBuf>,
    /// A client certificate (PEM) for mutual TLS; needs `tls_key_file`.
    #[setters(skip)]
    pub tls_cert_file: Option<PathBuf>,
    /// The client certificate's private key (PEM, PKCS#8); needs `tls_cert_file`.
    #[setters(skip)]
    pub tls_key_file: Option<PathBuf>,
}

impl Default for AmqpSinkConfig {
    fn default() -> Self {
        Self {
            url: "amqp://127.0.0.1:5672/%2f".to_owned(),
            exchange: String::new(),
            routing_key: "{destination}".to_owned(),
            persistent: true,
            max_payload_bytes: 16 * 1024 * 1024,
            connect_timeout: Duration::from_secs(5),
            tls_ca_file: None,
            tls_cert_file: None,
            tls_key_file: None,
        }
    }
}

impl fmt::Debug for AmqpSinkConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AmqpSinkConfig")
            .field("url", &outbox_engine::redact::url(&self.url))
            .field("exchange", &self.exchange)
            .field("routing_key", &self.routing_key)
            .field("persistent", &self.persistent)
            .field("max_payload_bytes", &self.max_payload_bytes)
            .field("connect_timeout", &self.connect_timeout)
            .field("tls_ca_file", &self.tls_ca_file)
            .field("tls_cert_file", &self.tls_cert_file)
            .field("tls_key_file", &self.tls_key_file)
            .finish()
    }
}

/// A valid configuration, parsed: the broker address as the client takes it, and the
/// name templates.
#[derive(Debug, Clone)]
pub(crate) struct Checked {
    pub(crate) uri: lapin::uri::AMQPUri,
    pub(crate) exchange: Template,
    pub(crate) routing_key: Template,
}

impl AmqpSinkConfig {
    /// The defaults, connecting to `url` (which must carry no sink options; see
    /// [`from_url`](Self::from_url) for that).
    ///
    /// ```
    /// use outbox_sink_amqp::AmqpSinkConfig;
    ///
    /// let config = AmqpSinkConfig::new("amqp://guest:guest@127.0.0.1:5672/%2f").exchange("events");
    /// assert!(config.validate().is_ok());
    /// ```
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            ..Self::default()
        }
    }

    /// Reads the broker address and the sink options from one URL, so a route can be
    /// configured without code.
    ///
    /// Query options: `exchange`, `routing_key` (templates), `persistent`
    /// (`true`/`false`), `max_payload_bytes`, `connect_timeout`, `tls_ca_file`,
    /// `tls_cert_file`, `tls_key_file`. The client's own `heartbeat`, `channel_max`,
    /// `frame_max`, `connection_timeout` and `auth_mechanism` are passed through. Any
    /// other option is an error.
    ///
    /// ```
    /// use outbox_sink_amqp::AmqpSinkConfig;
    ///
    /// let config = AmqpSinkConfig::from_url("amqp://127.0.0.1/%2f?exchange=&routing_key=orders&persistent=false")?;
    /// assert_eq!(config.exchange, "");
    /// assert!(!config.persistent);
    /// assert!(AmqpSinkConfig::from_url("amqp://127.0.0.1/?queue=orders").is_err());
    /// # Ok::<(), outbox_sink_amqp::AmqpSinkError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`AmqpSinkError::InvalidUrl`] for an unparsable URL or an unknown option,
    /// [`AmqpSinkError::InvalidSetting`] for an option with a bad value.
    pub fn from_url(url: &str) -> Result<Self, AmqpSinkError> {
        let mut config = Self::new(url);
        config.take_url_options()?;
        Ok(config)
    }

    /// Moves the options of [`from_url`](Self::from_url) out of `self.url`'s query into
    /// the fields; returns the settings they set.
    pub(crate) fn take_url_options(&mut self) -> Result<Vec<&'static str>, AmqpSinkError> {
        let mut parsed = parse_url(&self.url)?;
        let mut set = Vec::new();
        let mut kept: Vec<(String, String)> = Vec::new();
        for (name, value) in parsed.query_pairs() {
            let (name, value) = (name.into_owned(), value.into_owned());
            if let Some(option) = SINK_OPTIONS.iter().find(|option| **option == name)
                && !set.contains(option)
            {
                set.push(*option);
            }
            match name.as_str() {
                "exchange" => self.exchange = value,
                "routing_key" => self.routing_key = value,
                "persistent" => {
                    self.persistent = match value.as_str() {
                        "true" | "1" | "yes" => true,
                        "false" | "0" | "no" => false,
                        _ => return Err(invalid("persistent", "must be true or false")),
                    }
                }
                "max_payload_bytes" => {
                    self.max_payload_bytes = value.parse().map_err(|_| {
                        invalid(
                            "max_payload_bytes",
                            format!("{value:?} is not a non-negative integer"),
                        )
                    })?
                }
                "connect_timeout" => {
                    self.connect_timeout = outbox_engine::duration::parse(&value)
                        .map_err(|reason| invalid("connect_timeout", reason))?
                }
                "tls_ca_file" => self.tls_ca_file = Some(value.into()),
                "tls_cert_file" => self.tls_cert_file = Some(value.into()),
                "tls_key_file" => self.tls_key_file = Some(value.into()),
                _ if CLIENT_OPTIONS.contains(&name.as_str()) => kept.push((name, value)),
                _ => {
                    return Err(AmqpSinkError::InvalidUrl {
                        url: outbox_engine::redact::url(&self.url),
                        reason: format!(
                            "unknown option `{name}` (sink options: {}; client options: {})",
                            SINK_OPTIONS.join(", "),
                            CLIENT_OPTIONS.join(", ")
                        ),
                    });
                }
            }
        }
        if kept.is_empty() {
            parsed.set_query(None);
        } else {
            parsed.query_pairs_mut().clear().extend_pairs(kept);
        }
        self.url = parsed.to_string();
        Ok(set)
    }

    /// Presents this client certificate and PKCS#8 key (PEM files) for mutual TLS.
    ///
    /// ```
    /// # use outbox_sink_amqp::AmqpSinkConfig;
    /// let c = AmqpSinkConfig::new("amqps://mq.internal:5671/%2f")
    ///     .tls_client_cert("/etc/ssl/relay.pem", "/etc/ssl/relay.key");
    /// assert!(c.tls_cert_file.is_some() && c.tls_key_file.is_some());
    /// ```
    pub fn tls_client_cert(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        self.tls_cert_file = Some(cert.into());
        self.tls_key_file = Some(key.into());
        self
    }

    /// Checks every setting without touching the network.
    ///
    /// ```
    /// use outbox_sink_amqp::{AmqpSinkConfig, AmqpSinkError};
    ///
    /// let bad = AmqpSinkConfig::default().routing_key("orders.{evnt_type}");
    /// assert!(matches!(bad.validate(), Err(AmqpSinkError::InvalidTemplate { .. })));
    /// ```
    ///
    /// # Errors
    ///
    /// The first problem found, as an [`AmqpSinkError`] naming the setting.
    pub fn validate(&self) -> Result<(), AmqpSinkError> {
        self.check().map(|_| ())
    }

    pub(crate) fn check(&self) -> Result<Checked, AmqpSinkError> {
        let url = parse_url(&self.url)?;
        let uri = amqp_uri(&url)?;
        if let Some((name, _)) = url
            .query_pairs()
            .find(|(name, _)| !CLIENT_OPTIONS.contains(&name.as_ref()))
        {
            return Err(AmqpSinkError::InvalidUrl {
                url: outbox_engine::redact::url(&self.url),
                reason: format!(
                    "unknown option `{name}` (sink options in a URL are read by AmqpSinkConfig::from_url)"
                ),
            });
        }
        let tls = url.scheme() == "amqps";
        if tls && !cfg!(any(feature = "tls-rustls", feature = "tls-native-tls")) {
            return Err(AmqpSinkError::TlsNotEnabled);
        }
        for (setting, file) in [
            ("tls_ca_file", &self.tls_ca_file),
            ("tls_cert_file", &self.tls_cert_file),
            ("tls_key_file", &self.tls_key_file),
        ] {
            if file.is_some() && !tls {
                return Err(invalid(setting, "is only used with an amqps:// URL"));
            }
        }
        if self.tls_cert_file.is_some() != self.tls_key_file.is_some() {
            return Err(invalid(
                "tls_cert_file",
                "a client certificate needs its key (tls_key_file), and a key its certificate",
            ));
        }
        let template = |setting: &'static str, text: &str| {
            let fail = |reason: String| AmqpSinkError::InvalidTemplate {
                setting,
                template: text.chars().take(128).collect(),
                reason,
            };
            if text.len() > MAX_NAME_BYTES {
                return Err(fail(format!(
                    "{} bytes, limit is {MAX_NAME_BYTES}",
                    text.len()
                )));
            }
            Template::parse(text).map_err(|e| fail(e.reason))
        };
        let exchange = template("exchange", &self.exchange)?;
        let routing_key = template("routing_key", &self.routing_key)?;
        if exchange.fixed().as_deref() == Some("") && routing_key.fixed().as_deref() == Some("") {
            return Err(invalid(
                "routing_key",
                "the default exchange routes by queue name: give the queue's name (or a template) as the routing key",
            ));
        }
        if self.max_payload_bytes == 0 {
            return Err(invalid("max_payload_bytes", "must be at least 1"));
        }
        if self.connect_timeout.is_zero() {
            return Err(invalid("connect_timeout", "must be above zero"));
        }
        Ok(Checked {
            uri,
            exchange,
            routing_key,
        })
    }
}

fn parse_url(text: &str) -> Result<url::Url, AmqpSinkError> {
    let fail = |reason: String| AmqpSinkError::InvalidUrl {
        url: outbox_engine::redact::url(text),
        reason,
    };
    let url = url::Url::parse(text).map_err(|e| fail(e.to_string()))?;
    if !matches!(url.scheme(), "amqp" | "amqps") {
        return Err(fail(format!(
            "scheme `{}` is not an AMQP scheme (use amqp:// or amqps://)",
            url.scheme()
        )));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(fail("missing host".to_owned()));
    }
    if url.path().trim_start_matches('/').contains('/') {
        return Err(fail(
            "the path is the vhost and must be one segment; write `/` inside it as %2f".to_owned(),
        ));
    }
    Ok(url)
}

/// The address as lapin takes it. Its own parser reads the host with `Url::domain`, which
/// is empty for an IP address, and would then connect to `localhost`; the host is set
/// from the URL here instead.
fn amqp_uri(url: &url::Url) -> Result<lapin::uri::AMQPUri, AmqpSinkError> {
    let mut uri: lapin::uri::AMQPUri = url.as_str().parse().map_err(|reason: String| {
        let reason = match url.password() {
            Some(password) if !password.is_empty() => reason.replace(password, "***"),
            _ => reason,
        };
        AmqpSinkError::InvalidUrl {
            url: outbox_engine::redact::url(url.as_str()),
            reason,
        }
    })?;
    if let Some(host) = url.host_str() {
        uri.authority.host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
    }
    Ok(uri)
}

fn invalid(setting: &'static str, reason: impl Into<String>) -> AmqpSinkError {
    AmqpSinkError::InvalidSetting {
        setting,
        reason: reason.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One vocabulary: every setting of a route's table is a URL option, and the reverse.
    #[test]
    fn every_table_setting_is_a_url_option_and_the_reverse() {
        use serde_json::json;
        outbox_engine::testkit::assert_url_parity::<crate::AmqpSink, _>(
            "amqp://127.0.0.1:5672/%2f",
            AmqpSinkConfig::from_url,
            AmqpSinkConfig::clone,
            &[],
            &[],
            SINK_OPTIONS,
            &[
                &[
                    ("exchange", json!("shop"), "exchange=shop"),
                    (
                        "routing_key",
                        json!("orders.{event_type}"),
                        "routing_key=orders.{event_type}",
                    ),
                    ("persistent", json!(false), "persistent=false"),
                    ("max_payload_bytes", json!(1024), "max_payload_bytes=1024"),
                    ("connect_timeout", json!("2s"), "connect_timeout=2s"),
                ][..],
                &outbox_engine::testkit::tls_file_cases(),
            ]
            .concat(),
        );
    }

    #[test]
    fn url_options_split_between_sink_and_client() {
        let c = AmqpSinkConfig::from_url(
            "amqps://u:p@mq:5671/v?exchange=x.{tenant_id}&routing_key=k&heartbeat=10&connect_timeout=2s&tls_ca_file=/ca.pem",
        )
        .unwrap();
        assert_eq!(c.url, "amqps://u:p@mq:5671/v?heartbeat=10");
        assert_eq!(c.exchange, "x.{tenant_id}");
        assert_eq!(c.connect_timeout, Duration::from_secs(2));
        assert_eq!(c.tls_ca_file, Some(PathBuf::from("/ca.pem")));
    }

    #[test]
    fn bad_settings_name_themselves() {
        let setting = |c: AmqpSinkConfig| match c.validate() {
            Err(AmqpSinkError::InvalidSetting { setting, .. }) => setting,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            setting(AmqpSinkConfig::default().max_payload_bytes(0)),
            "max_payload_bytes"
        );
        assert_eq!(
            setting(AmqpSinkConfig::default().routing_key("")),
            "routing_key"
        );
        assert_eq!(
            setting(AmqpSinkConfig::default().tls_ca_file("/ca.pem")),
            "tls_ca_file"
        );
        assert_eq!(
            setting(AmqpSinkConfig::default().connect_timeout(Duration::ZERO)),
            "connect_timeout"
        );
        assert!(matches!(
            AmqpSinkConfig::default()
                .exchange("x".repeat(256))
                .validate(),
            Err(AmqpSinkError::InvalidTemplate {
                setting: "exchange",
                ..
            })
        ));
    }

    #[test]
    fn urls_are_checked_and_never_echo_the_password() {
        for bad in [
            "http://mq/",
            "amqp:///%2f",
            "amqp://mq/a/b",
            "not a url",
            "amqp://u:hunter2@mq/?queue=x",
        ] {
            let e = AmqpSinkConfig::from_url(bad).unwrap_err();
            assert!(matches!(e, AmqpSinkError::InvalidUrl { .. }), "{bad}: {e}");
            assert!(!e.to_string().contains("hunter2"), "{e}");
        }
        let e = AmqpSinkConfig::new("amqp://u:hunter2@mq/%2f?exchange=x")
            .validate()
            .unwrap_err();
        assert!(!e.to_string().contains("hunter2"), "{e}");
    }

    #[test]
    fn ip_hosts_and_client_options_reach_the_client() {
        let c = AmqpSinkConfig::from_url("amqp://u:p@10.0.0.5:5673/shop?heartbeat=30").unwrap();
        let uri = c.check().unwrap().uri;
        assert_eq!(uri.authority.host, "10.0.0.5");
        assert_eq!(uri.authority.port, 5673);
        assert_eq!(uri.vhost, "shop");
        assert_eq!(uri.query.heartbeat, Some(30));
        let v6 = AmqpSinkConfig::new("amqp://[::1]:5672/%2f")
            .check()
            .unwrap()
            .uri;
        assert_eq!(v6.authority.host, "::1");
        assert_eq!(v6.vhost, "/");
        let bad = AmqpSinkConfig::new("amqp://u:hunter2@mq/%2f?heartbeat=often").validate();
        let Err(e @ AmqpSinkError::InvalidUrl { .. }) = bad else {
            panic!("{bad:?}")
        };
        assert!(!e.to_string().contains("hunter2"), "{e}");
    }

    #[test]
    fn a_config_file_reads_durations_and_refuses_unknown_fields() {
        let c: AmqpSinkConfig = serde_json::from_value(serde_json::json!({
            "url": "amqp://mq/%2f", "exchange": "events", "connect_timeout": "1500ms"
        }))
        .unwrap();
        assert_eq!(c.connect_timeout, Duration::from_millis(1500));
        assert!(
            serde_json::from_value::<AmqpSinkConfig>(serde_json::json!({ "exchang": "x" }))
                .is_err()
        );
    }
}
