//! Route configuration: which broker, which protocol version, which topic, and the
//! connection's timeouts and limits.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use derive_setters::Setters;
use outbox_engine::template::Template;
use serde::Deserialize;

use crate::error::MqttSinkError;

/// The longest topic MQTT carries, in bytes.
pub const MAX_TOPIC_BYTES: usize = 65_535;

/// URL query options [`MqttSinkConfig::from_url`] understands.
const OPTIONS: &[&str] = &[
    "topic",
    "protocol",
    "client_id",
    "keep_alive",
    "connect_timeout",
    "max_payload_bytes",
    "tls_ca_file",
    "tls_cert_file",
    "tls_key_file",
];

/// Which MQTT version the sink speaks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[non_exhaustive]
pub enum Protocol {
    /// MQTT 5: the message's identity travels in user properties next to the payload.
    #[default]
    #[serde(rename = "5")]
    V5,
    /// MQTT 3.1.1, which has no properties: each message travels in a JSON envelope
    /// (see [`read_envelope`](crate::read_envelope)).
    #[serde(rename = "3.1.1")]
    V311,
}

/// The configuration of one MQTT route.
///
/// Build it from a URL ([`from_url`](Self::from_url)), from a config file (it implements
/// `Deserialize`; every field has a default), or with the chainable setters. Everything
/// is checked by [`validate`](Self::validate), which
/// [`MqttSink::connect`](crate::MqttSink::connect) calls first.
///
/// | field | default | meaning |
/// |---|---|---|
/// | `url` | `mqtt://127.0.0.1:1883` | broker, and a user and password (`mqtt://user:pass@host`); `mqtts://` for TLS (port 8883 by default) |
/// | `topic` | `{destination}` | topic template, see [`Template`] |
/// | `protocol` | `"5"` | `"5"` (identity in user properties) or `"3.1.1"` (identity in a JSON envelope) |
/// | `client_id` | `outbox-relay-<pid>-<random>` | the MQTT client identifier; two connections with the same id take each other's place |
/// | `keep_alive` | 30 s | how often the client pings an idle connection |
/// | `connect_timeout` | 5 s | one connection attempt, including `CONNACK` |
/// | `max_payload_bytes` | 1 MiB | larger payloads fail permanently as too large (the broker's own limit, when it announces one, also applies) |
/// | `tls_ca_file` | none (system roots) | PEM file of the CA that signed the broker's certificate (`mqtts://` only) |
/// | `tls_cert_file`, `tls_key_file` | none | PEM client certificate and key, for brokers that verify clients |
///
/// Every message is published with QoS 1 and waits for its `PUBACK`; retained messages
/// are off. Neither can be changed: a QoS 0 publish is acknowledged by nothing, and a
/// retained message would be delivered again to every new subscriber.
///
/// ```
/// use outbox_sink_mqtt::{MqttSinkConfig, Protocol};
///
/// let config = MqttSinkConfig::from_url(
///     "mqtt://relay:s3cret@broker.internal:1883?topic=shop/{event_type}&protocol=3.1.1",
/// )?;
/// assert_eq!(config.topic, "shop/{event_type}");
/// assert_eq!(config.protocol, Protocol::V311);
/// assert_eq!(config.url, "mqtt://relay:s3cret@broker.internal:1883");
/// // Debug output never shows the password.
/// assert!(!format!("{config:?}").contains("s3cret"));
/// # Ok::<(), outbox_sink_mqtt::MqttSinkError>(())
/// ```
#[derive(Clone, PartialEq, Eq, Deserialize, Setters)]
#[serde(default, deny_unknown_fields)]
#[setters(into, strip_option)]
#[non_exhaustive]
pub struct MqttSinkConfig {
    /// The broker URL: `mqtt://[user[:password]@]host[:port]`.
    pub url: String,
    /// The topic template.
    pub topic: String,
    /// The MQTT version.
    pub protocol: Protocol,
    /// The client identifier; generated when empty.
    pub client_id: String,
    /// The keep-alive interval.
    #[serde(deserialize_with = "outbox_engine::duration::deserialize")]
    pub keep_alive: Duration,
    /// How long one connection attempt may take.
    #[serde(deserialize_with = "outbox_engine::duration::deserialize")]
    pub connect_timeout: Duration,
    /// Payloads larger than this fail permanently as too large.
    #[setters(into = false)]
    pub max_payload_bytes: usize,
    /// The CA certificate (PEM) to verify the broker with, instead of the system roots.
    pub tls_ca_file: Option<PathBuf>,
    /// A client certificate (PEM) for mutual TLS; needs `tls_key_file`.
    #[setters(skip)]
    pub tls_cert_file: Option<PathBuf>,
    /// The client certificate's private key (PEM); needs `tls_cert_file`.
    #[setters(skip)]
    pub tls_key_file: Option<PathBuf>,
}

impl Default for MqttSinkConfig {
    fn default() -> Self {
        Self {
            url: "mqtt://127.0.0.1:1883".to_owned(),
            topic: "{destination}".to_owned(),
            protocol: Protocol::V5,
            client_id: String::new(),
            keep_alive: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(5),
            max_payload_bytes: 1024 * 1024,
            tls_ca_file: None,
            tls_cert_file: None,
            tls_key_file: None,
        }
    }
}

impl fmt::Debug for MqttSinkConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MqttSinkConfig")
            .field("url", &outbox_engine::redact::url(&self.url))
            .field("topic", &self.topic)
            .field("protocol", &self.protocol)
            .field("client_id", &self.client_id)
            .field("keep_alive", &self.keep_alive)
            .field("connect_timeout", &self.connect_timeout)
            .field("max_payload_bytes", &self.max_payload_bytes)
            .field("tls_ca_file", &self.tls_ca_file)
            .field("tls_cert_file", &self.tls_cert_file)
            .field("tls_key_file", &self.tls_key_file)
            .finish()
    }
}

/// A valid configuration, parsed: where to connect, the login and the topic template.
#[derive(Clone)]
pub(crate) struct Checked {
    pub(crate) host: String,
    pub(crate) port: u16,
    pub(crate) login: Option<(String, String)>,
    pub(crate) tls: bool,
    pub(crate) topic: Template,
}

impl MqttSinkConfig {
    /// The defaults, connecting to `url` (which must carry no options; see
    /// [`from_url`](Self::from_url) for that).
    ///
    /// ```
    /// use outbox_sink_mqtt::MqttSinkConfig;
    ///
    /// let config = MqttSinkConfig::new("mqtt://127.0.0.1:1883").topic("shop/{event_type}");
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
    /// Query options: `topic` (a template), `protocol` (`5` or `3.1.1`), `client_id`,
    /// `keep_alive`, `connect_timeout`, `max_payload_bytes`, `tls_ca_file`, `tls_cert_file`,
    /// `tls_key_file`. Any other option is an error.
    ///
    /// ```
    /// use outbox_sink_mqtt::MqttSinkConfig;
    ///
    /// let config = MqttSinkConfig::from_url("mqtt://broker?topic=orders/{partition_key}&keep_alive=10s")?;
    /// assert_eq!(config.topic, "orders/{partition_key}");
    /// assert!(MqttSinkConfig::from_url("mqtt://broker?qos=0").is_err());
    /// # Ok::<(), outbox_sink_mqtt::MqttSinkError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`MqttSinkError::InvalidUrl`] for an unparsable URL or an unknown option,
    /// [`MqttSinkError::InvalidSetting`] for an option with a bad value.
    pub fn from_url(url: &str) -> Result<Self, MqttSinkError> {
        let mut config = Self::new(url);
        config.take_url_options()?;
        Ok(config)
    }

    /// Moves the options of [`from_url`](Self::from_url) out of `self.url`'s query into
    /// the fields; returns the settings they set.
    pub(crate) fn take_url_options(&mut self) -> Result<Vec<&'static str>, MqttSinkError> {
        let mut parsed = parse_url(&self.url)?;
        let mut set = Vec::new();
        let duration = |setting: &'static str, value: &str| {
            outbox_engine::duration::parse(value).map_err(|reason| invalid(setting, reason))
        };
        for (name, value) in parsed.query_pairs() {
            let value = value.into_owned();
            if let Some(option) = OPTIONS.iter().find(|option| **option == name)
                && !set.contains(option)
            {
                set.push(*option);
            }
            match name.as_ref() {
                "topic" => self.topic = value,
                "protocol" => {
                    self.protocol = match value.as_str() {
                        "5" | "5.0" => Protocol::V5,
                        "3.1.1" => Protocol::V311,
                        _ => return Err(invalid("protocol", "must be 5 or 3.1.1")),
                    }
                }
                "client_id" => self.client_id = value,
                "keep_alive" => self.keep_alive = duration("keep_alive", &value)?,
                "connect_timeout" => self.connect_timeout = duration("connect_timeout", &value)?,
                "max_payload_bytes" => {
                    self.max_payload_bytes = value.parse().map_err(|_| {
                        invalid(
                            "max_payload_bytes",
                            format!("{value:?} is not a non-negative integer"),
                        )
                    })?
                }
                "tls_ca_file" => self.tls_ca_file = Some(value.into()),
                "tls_cert_file" => self.tls_cert_file = Some(value.into()),
                "tls_key_file" => self.tls_key_file = Some(value.into()),
                other => {
                    return Err(MqttSinkError::InvalidUrl {
                        url: outbox_engine::redact::url(&self.url),
                        reason: format!(
                            "unknown option `{other}` (options: {}; QoS is always 1 and retain always off)",
                            OPTIONS.join(", ")
                        ),
                    });
                }
            }
        }
        parsed.set_query(None);
        self.url = parsed.to_string();
        Ok(set)
    }

    /// Presents this client certificate and key (PEM files) for mutual TLS.
    ///
    /// ```
    /// # use outbox_sink_mqtt::MqttSinkConfig;
    /// let c = MqttSinkConfig::new("mqtts://broker.internal")
    ///     .tls_client_cert("/etc/ssl/relay.pem", "/etc/ssl/relay.key");
    /// assert!(c.validate().is_ok());
    /// ```
    pub fn tls_client_cert(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        self.tls_cert_file = Some(cert.into());
        self.tls_key_file = Some(key.into());
        self
    }

    /// Checks every setting without touching the network.
    ///
    /// ```
    /// use outbox_sink_mqtt::{MqttSinkConfig, MqttSinkError};
    ///
    /// let bad = MqttSinkConfig::default().topic("orders/{evnt_type}");
    /// assert!(matches!(bad.validate(), Err(MqttSinkError::InvalidTemplate { .. })));
    /// ```
    ///
    /// # Errors
    ///
    /// The first problem found, as an [`MqttSinkError`] naming the setting.
    pub fn validate(&self) -> Result<(), MqttSinkError> {
        self.check().map(|_| ())
    }

    pub(crate) fn check(&self) -> Result<Checked, MqttSinkError> {
        let url = parse_url(&self.url)?;
        if let Some((name, _)) = url.query_pairs().next() {
            return Err(MqttSinkError::InvalidUrl {
                url: outbox_engine::redact::url(&self.url),
                reason: format!(
                    "unknown option `{name}` (options in a URL are read by MqttSinkConfig::from_url)"
                ),
            });
        }
        let tls = url.scheme() == "mqtts";
        for (setting, file) in [
            ("tls_ca_file", &self.tls_ca_file),
            ("tls_cert_file", &self.tls_cert_file),
            ("tls_key_file", &self.tls_key_file),
        ] {
            if file.is_some() && !tls {
                return Err(invalid(setting, "is only used with an mqtts:// URL"));
            }
        }
        if self.tls_cert_file.is_some() != self.tls_key_file.is_some() {
            return Err(invalid(
                "tls_cert_file",
                "a client certificate needs its key (tls_key_file), and a key its certificate",
            ));
        }
        let decoded = |text: &str| {
            percent_encoding::percent_decode_str(text)
                .decode_utf8_lossy()
                .into_owned()
        };
        let login = match (url.username(), url.password()) {
            ("", None) => None,
            (user, password) => Some((decoded(user), password.map(decoded).unwrap_or_default())),
        };
        let topic = Template::parse(&self.topic).map_err(|e| MqttSinkError::InvalidTemplate {
            template: self.topic.chars().take(128).collect(),
            reason: e.reason,
        })?;
        if let Some(fixed) = topic.fixed()
            && let Err(reason) = check_topic(&fixed)
        {
            return Err(MqttSinkError::InvalidTemplate {
                template: self.topic.chars().take(128).collect(),
                reason,
            });
        }
        if self.max_payload_bytes == 0 {
            return Err(invalid("max_payload_bytes", "must be at least 1"));
        }
        if self.max_payload_bytes > 128 * 1024 * 1024 {
            return Err(invalid(
                "max_payload_bytes",
                "at most 128 MiB: MQTT carries 256 MiB in one packet, and a 3.1.1 envelope holds the payload as base64",
            ));
        }
        for (setting, value) in [
            ("keep_alive", self.keep_alive),
            ("connect_timeout", self.connect_timeout),
        ] {
            if value.is_zero() {
                return Err(invalid(setting, "must be above zero"));
            }
        }
        if self.keep_alive < Duration::from_secs(1)
            || self.keep_alive.as_secs() > u64::from(u16::MAX)
        {
            return Err(invalid("keep_alive", "must be between 1 s and 65535 s"));
        }
        Ok(Checked {
            host: url
                .host_str()
                .unwrap_or_default()
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned(),
            port: url.port().unwrap_or(if tls { 8883 } else { 1883 }),
            login,
            tls,
            topic,
        })
    }
}

/// Why `topic` cannot be published to, if it cannot: MQTT topics are 1 to 65,535 bytes of
/// UTF-8 without NUL, and a publish names no wildcard (`+`, `#`). Topics starting with `$`
/// belong to the broker.
pub(crate) fn check_topic(topic: &str) -> Result<(), String> {
    if topic.is_empty() {
        return Err("the topic is empty".to_owned());
    }
    if topic.len() > MAX_TOPIC_BYTES {
        return Err(format!(
            "the topic is {} bytes, MQTT allows {MAX_TOPIC_BYTES}",
            topic.len()
        ));
    }
    if topic.contains('\0') {
        return Err("the topic contains NUL".to_owned());
    }
    if topic.contains(['+', '#']) {
        return Err(format!(
            "topic {topic:?} has a wildcard (`+` or `#`); publish to a concrete topic"
        ));
    }
    if topic.starts_with('$') {
        return Err(format!(
            "topic {topic:?} starts with `$`, which names the broker's own topics"
        ));
    }
    Ok(())
}

fn parse_url(text: &str) -> Result<url::Url, MqttSinkError> {
    let fail = |reason: String| MqttSinkError::InvalidUrl {
        url: outbox_engine::redact::url(text),
        reason,
    };
    let url = url::Url::parse(text).map_err(|e| fail(e.to_string()))?;
    if !matches!(url.scheme(), "mqtt" | "mqtts") {
        return Err(fail(format!(
            "scheme `{}` is not an MQTT scheme (use mqtt:// or mqtts://)",
            url.scheme()
        )));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(fail("missing host".to_owned()));
    }
    if !matches!(url.path(), "" | "/") {
        return Err(fail(
            "an MQTT URL has no path; name the topic with `topic`".to_owned(),
        ));
    }
    Ok(url)
}

fn invalid(setting: &'static str, reason: impl Into<String>) -> MqttSinkError {
    MqttSinkError::InvalidSetting {
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
        outbox_engine::testkit::assert_url_parity::<crate::MqttSink, _>(
            "mqtt://127.0.0.1:1883",
            MqttSinkConfig::from_url,
            MqttSinkConfig::clone,
            &[],
            &[],
            OPTIONS,
            &[
                &[
                    (
                        "topic",
                        json!("shop/{event_type}"),
                        "topic=shop/{event_type}",
                    ),
                    ("protocol", json!("3.1.1"), "protocol=3.1.1"),
                    ("client_id", json!("relay-7"), "client_id=relay-7"),
                    ("keep_alive", json!("20s"), "keep_alive=20s"),
                    ("connect_timeout", json!("3s"), "connect_timeout=3s"),
                    ("max_payload_bytes", json!(1024), "max_payload_bytes=1024"),
                ][..],
                &outbox_engine::testkit::tls_file_cases(),
            ]
            .concat(),
        );
    }

    #[test]
    fn url_options_become_settings_and_leave_the_url() {
        let c = MqttSinkConfig::from_url(
            "mqtt://u:p%40ss@broker:1884?topic=x/{tenant_id}&connect_timeout=2s&client_id=r1",
        )
        .unwrap();
        assert_eq!(c.url, "mqtt://u:p%40ss@broker:1884");
        assert_eq!(c.topic, "x/{tenant_id}");
        assert_eq!(c.client_id, "r1");
        assert_eq!(c.connect_timeout, Duration::from_secs(2));
        let checked = c.check().unwrap();
        assert_eq!((checked.host.as_str(), checked.port), ("broker", 1884));
        assert_eq!(checked.login, Some(("u".to_owned(), "p@ss".to_owned())));
    }

    #[test]
    fn bad_settings_name_themselves() {
        let setting = |c: MqttSinkConfig| match c.validate() {
            Err(MqttSinkError::InvalidSetting { setting, .. }) => setting,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            setting(MqttSinkConfig::default().max_payload_bytes(0)),
            "max_payload_bytes"
        );
        assert_eq!(
            setting(MqttSinkConfig::default().keep_alive(Duration::from_millis(10))),
            "keep_alive"
        );
        assert_eq!(
            setting(MqttSinkConfig::default().connect_timeout(Duration::ZERO)),
            "connect_timeout"
        );
        for topic in ["", "orders/+", "orders/#", "$SYS/x"] {
            assert!(
                matches!(
                    MqttSinkConfig::default().topic(topic).validate(),
                    Err(MqttSinkError::InvalidTemplate { .. })
                ),
                "{topic:?}"
            );
        }
        assert!(matches!(
            MqttSinkConfig::from_url("mqtt://b?protocol=4"),
            Err(MqttSinkError::InvalidSetting {
                setting: "protocol",
                ..
            })
        ));
    }

    #[test]
    fn urls_are_checked_and_never_echo_the_password() {
        for bad in [
            "http://broker/",
            "mqtt://",
            "mqtt://broker/orders",
            "not a url",
            "mqtt://u:hunter2@broker/?qos=0",
        ] {
            let e = MqttSinkConfig::from_url(bad).unwrap_err();
            assert!(matches!(e, MqttSinkError::InvalidUrl { .. }), "{bad}: {e}");
            assert!(!e.to_string().contains("hunter2"), "{e}");
        }
        assert!(matches!(
            MqttSinkConfig::new("mqtt://broker")
                .tls_ca_file("/ca.pem")
                .validate(),
            Err(MqttSinkError::InvalidSetting {
                setting: "tls_ca_file",
                ..
            })
        ));
        assert_eq!(
            MqttSinkConfig::new("mqtts://broker").check().unwrap().port,
            8883
        );
    }

    #[test]
    fn a_config_file_reads_the_protocol_and_durations_and_refuses_unknown_fields() {
        let c: MqttSinkConfig = serde_json::from_value(serde_json::json!({
            "url": "mqtt://broker", "protocol": "3.1.1", "keep_alive": "15s"
        }))
        .unwrap();
        assert_eq!(c.protocol, Protocol::V311);
        assert_eq!(c.keep_alive, Duration::from_secs(15));
        assert!(serde_json::from_value::<MqttSinkConfig>(serde_json::json!({ "qos": 0 })).is_err());
    }
}
