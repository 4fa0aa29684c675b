//! Route configuration: which brokers, which topic, how unkeyed messages are keyed, and
//! the librdkafka properties of the producer.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use derive_setters::Setters;
use outbox_engine::template::Template;
use serde::Deserialize;

use crate::error::KafkaSinkError;

/// The longest topic name Kafka accepts.
pub const MAX_TOPIC_BYTES: usize = 249;

/// Properties the sink sets itself unless the configuration does (see
/// [`KafkaSinkConfig`]'s table).
const DEFAULT_PROPERTIES: &[(&str, &str)] = &[
    ("enable.idempotence", "true"),
    ("acks", "all"),
    ("max.in.flight.requests.per.connection", "5"),
    ("message.timeout.ms", "10000"),
    ("partitioner", "murmur2_random"),
    ("linger.ms", "1"),
];

/// How a message without a partition key is keyed on Kafka.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Unkeyed {
    /// No key: the producer spreads such messages over the partitions (sticky batches).
    #[default]
    Null,
    /// The message id as the key: each message lands on the partition its id hashes to.
    Id,
}

/// The configuration of one Kafka route.
///
/// Build it from a URL ([`from_url`](Self::from_url)), from a config file (it implements
/// `Deserialize`; every field is optional but `url`), or with the chainable setters.
/// Settings may be given in the URL or as fields, not both. Everything is checked by
/// [`validate`](Self::validate), which [`KafkaSink::connect`](crate::KafkaSink::connect)
/// calls first.
///
/// `url` is `kafka://host:port[,host:port…][/topic-template][?option=value&…]`: the
/// bootstrap brokers (port 9092 when left out), the topic template as the path, and
/// options in the query: the sink's own (`topic`, `unkeyed`, `connect_timeout`) or any
/// [librdkafka producer property](https://docs.confluent.io/platform/current/clients/librdkafka/html/md_CONFIGURATION.html)
/// (`linger.ms`, `compression.type`, `security.protocol`, …).
///
/// | field | default | meaning |
/// |---|---|---|
/// | `url` | `kafka://127.0.0.1:9092` | bootstrap brokers, and optionally topic and options |
/// | `topic` | `{destination}` | topic name template, see [`Template`] |
/// | `unkeyed` | `null` | key of messages without a partition key: `null` (no key) or `id` (the message id) |
/// | `connect_timeout` | 5 s | how long start-up may take to reach the brokers and read the topic's metadata |
/// | `properties` | see below | librdkafka properties, as strings |
///
/// Properties the sink sets unless configured: `enable.idempotence=true`, `acks=all`,
/// `max.in.flight.requests.per.connection=5` (per-partition order survives retries),
/// `message.timeout.ms=10000` (keep it below the relay's publish timeout, 15 s by
/// default), `partitioner=murmur2_random` (the same partition for a key as Java clients
/// pick), `linger.ms=1` (the relay hands over a whole batch at once; a longer linger only
/// adds latency). Refused: turning idempotence off, `acks` other than
/// `all`/`-1`, more than 5 requests in flight, `bootstrap.servers` (it is the URL's),
/// `transactional.id` (not supported; decision 0022). Values of properties whose name
/// holds `password`, `secret`, `token`, `.pem` or `jaas` are never shown.
///
/// ```
/// use outbox_sink_kafka::KafkaSinkConfig;
///
/// let config = KafkaSinkConfig::from_url(
///     "kafka://k1.internal:9092,k2.internal/billing.{event_type}?unkeyed=id&compression.type=lz4",
/// )?;
/// let config = config.property("sasl.password", "s3cret");
/// assert!(config.validate().is_ok());
/// // Debug output never shows the password.
/// assert!(!format!("{config:?}").contains("s3cret"));
/// # Ok::<(), outbox_sink_kafka::KafkaSinkError>(())
/// ```
#[derive(Clone, PartialEq, Eq, Deserialize, Setters)]
#[serde(deny_unknown_fields)]
#[setters(into, strip_option)]
#[non_exhaustive]
pub struct KafkaSinkConfig {
    /// `kafka://host:port[,host:port…][/topic][?options]`.
    pub url: String,
    /// The topic name template (default `{destination}`).
    #[serde(default)]
    pub topic: Option<String>,
    /// The key of messages without a partition key (default [`Unkeyed::Null`]).
    #[serde(default)]
    pub unkeyed: Option<Unkeyed>,
    /// How long start-up may take (default 5 s).
    #[serde(default, with = "outbox_engine::duration::optional")]
    pub connect_timeout: Option<Duration>,
    /// librdkafka producer properties.
    #[setters(skip)]
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
}

impl Default for KafkaSinkConfig {
    fn default() -> Self {
        Self::new("kafka://127.0.0.1:9092")
    }
}

impl fmt::Debug for KafkaSinkConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let properties: BTreeMap<&str, &str> = self
            .properties
            .iter()
            .map(|(name, value)| (name.as_str(), shown(name, value)))
            .collect();
        f.debug_struct("KafkaSinkConfig")
            .field("url", &redacted_url(&self.url))
            .field("topic", &self.topic)
            .field("unkeyed", &self.unkeyed)
            .field("connect_timeout", &self.connect_timeout)
            .field("properties", &properties)
            .finish()
    }
}

/// A valid configuration, resolved: the producer's properties and the sink's settings.
#[derive(Clone)]
pub(crate) struct Checked {
    /// The bootstrap brokers, `host:port,host:port`.
    pub(crate) brokers: String,
    pub(crate) topic: Template,
    pub(crate) unkeyed: Unkeyed,
    pub(crate) connect_timeout: Duration,
    /// Every producer property but `bootstrap.servers`, defaults included.
    pub(crate) properties: BTreeMap<String, String>,
}

impl KafkaSinkConfig {
    /// A configuration for `url`, every other setting at its default.
    ///
    /// ```
    /// use outbox_sink_kafka::KafkaSinkConfig;
    ///
    /// let config = KafkaSinkConfig::new("kafka://127.0.0.1:9092").topic("orders");
    /// assert!(config.validate().is_ok());
    /// ```
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            topic: None,
            unkeyed: None,
            connect_timeout: None,
            properties: BTreeMap::new(),
        }
    }

    /// A configuration for `url` (brokers, topic and options in one URL), checked.
    ///
    /// ```
    /// use outbox_sink_kafka::KafkaSinkConfig;
    ///
    /// assert!(KafkaSinkConfig::from_url("kafka://127.0.0.1:9092/orders?linger.ms=20").is_ok());
    /// assert!(KafkaSinkConfig::from_url("kafka://127.0.0.1:9092/orders?unkeyed=sometimes").is_err());
    /// ```
    ///
    /// # Errors
    ///
    /// As for [`validate`](Self::validate).
    pub fn from_url(url: &str) -> Result<Self, KafkaSinkError> {
        let config = Self::new(url);
        config.validate()?;
        Ok(config)
    }

    /// Sets a librdkafka producer property.
    ///
    /// ```
    /// # use outbox_sink_kafka::KafkaSinkConfig;
    /// let c = KafkaSinkConfig::default().property("compression.type", "zstd");
    /// assert_eq!(c.properties["compression.type"], "zstd");
    /// assert!(KafkaSinkConfig::default().property("acks", "1").validate().is_err());
    /// ```
    pub fn property(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.properties.insert(name.into(), value.into());
        self
    }

    /// Checks every setting without touching the network (librdkafka checks property
    /// names and values when the producer is made, in [`KafkaSink::connect`](crate::KafkaSink::connect)).
    ///
    /// ```
    /// use outbox_sink_kafka::{KafkaSinkConfig, KafkaSinkError};
    ///
    /// let bad = KafkaSinkConfig::default().topic("orders.{evnt_type}");
    /// assert!(matches!(bad.validate(), Err(KafkaSinkError::InvalidTemplate { .. })));
    /// ```
    ///
    /// # Errors
    ///
    /// The first problem found, as a [`KafkaSinkError`] naming the setting.
    pub fn validate(&self) -> Result<(), KafkaSinkError> {
        self.check().map(|_| ())
    }

    pub(crate) fn check(&self) -> Result<Checked, KafkaSinkError> {
        let url = ParsedUrl::parse(&self.url)?;
        let mut topic = self.topic.clone();
        let mut unkeyed = self.unkeyed;
        let mut connect_timeout = self.connect_timeout;
        let mut properties = self.properties.clone();
        let twice = |setting: &str| KafkaSinkError::InvalidSetting {
            setting: setting.to_owned(),
            reason: "is given both in the URL and as a setting; keep one".to_owned(),
        };
        if let Some(path) = url.topic {
            if topic.is_some() {
                return Err(twice("topic"));
            }
            topic = Some(path);
        }
        for (name, value) in url.options {
            match name.as_str() {
                "topic" => {
                    if topic.replace(value).is_some() {
                        return Err(twice("topic"));
                    }
                }
                "unkeyed" => {
                    let parsed = match value.as_str() {
                        "null" => Unkeyed::Null,
                        "id" => Unkeyed::Id,
                        _ => return Err(invalid("unkeyed", "must be `null` or `id`")),
                    };
                    if unkeyed.replace(parsed).is_some() {
                        return Err(twice("unkeyed"));
                    }
                }
                "connect_timeout" => {
                    let parsed = outbox_engine::duration::parse(&value)
                        .map_err(|reason| invalid("connect_timeout", reason))?;
                    if connect_timeout.replace(parsed).is_some() {
                        return Err(twice("connect_timeout"));
                    }
                }
                _ => {
                    if properties.insert(name.clone(), value).is_some() {
                        return Err(twice(&name));
                    }
                }
            }
        }
        check_properties(&properties)?;
        for (name, value) in DEFAULT_PROPERTIES {
            if *name == "acks" && properties.contains_key("request.required.acks") {
                continue;
            }
            properties
                .entry((*name).to_owned())
                .or_insert_with(|| (*value).to_owned());
        }
        let topic_text = topic.unwrap_or_else(|| "{destination}".to_owned());
        let template =
            Template::parse(&topic_text).map_err(|e| KafkaSinkError::InvalidTemplate {
                template: topic_text.chars().take(128).collect(),
                reason: e.reason,
            })?;
        if let Some(fixed) = template.fixed() {
            check_topic_name(&fixed).map_err(|reason| KafkaSinkError::InvalidTemplate {
                template: topic_text.chars().take(128).collect(),
                reason,
            })?;
        } else if !template_text_is_legal(&topic_text) {
            return Err(KafkaSinkError::InvalidTemplate {
                template: topic_text.chars().take(128).collect(),
                reason: "a topic name holds only ASCII letters, digits, `.`, `_` and `-`"
                    .to_owned(),
            });
        }
        let connect_timeout = connect_timeout.unwrap_or(Duration::from_secs(5));
        if connect_timeout.is_zero() {
            return Err(invalid("connect_timeout", "must be above zero"));
        }
        Ok(Checked {
            brokers: url.brokers,
            topic: template,
            unkeyed: unkeyed.unwrap_or_default(),
            connect_timeout,
            properties,
        })
    }
}

/// The parts of a `kafka://` URL.
struct ParsedUrl {
    brokers: String,
    topic: Option<String>,
    options: Vec<(String, String)>,
}

impl ParsedUrl {
    fn parse(text: &str) -> Result<Self, KafkaSinkError> {
        let fail = |reason: &str| KafkaSinkError::InvalidUrl {
            url: redacted_url(text),
            reason: reason.to_owned(),
        };
        let rest = text
            .strip_prefix("kafka://")
            .ok_or_else(|| fail("the scheme must be kafka://"))?;
        let (address, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (hosts, path) = address.split_once('/').unwrap_or((address, ""));
        if hosts.contains('@') {
            return Err(fail(
                "credentials do not go in the URL: set the properties sasl.username and sasl.password",
            ));
        }
        let mut brokers = Vec::new();
        for host in hosts.split(',') {
            brokers.push(broker_address(host).map_err(|reason| fail(&reason))?);
        }
        let topic = match path {
            "" => None,
            path if path.contains('/') => {
                return Err(fail("the path is the topic and must be one segment"));
            }
            path => Some(path.to_owned()),
        };
        let mut options = Vec::new();
        for (name, value) in url::form_urlencoded::parse(query.as_bytes()) {
            if name.is_empty() {
                return Err(fail("an option without a name"));
            }
            if options.iter().any(|(seen, _)| *seen == name) {
                return Err(fail(&format!("option `{name}` is given twice")));
            }
            options.push((name.into_owned(), value.into_owned()));
        }
        Ok(Self {
            brokers: brokers.join(","),
            topic,
            options,
        })
    }
}

/// `host:port` for one broker of the list (port 9092 when left out).
fn broker_address(text: &str) -> Result<String, String> {
    let (host, port) = if let Some(v6) = text.strip_prefix('[') {
        let (host, after) = v6
            .split_once(']')
            .ok_or_else(|| format!("broker `{text}`: an IPv6 address needs its closing `]`"))?;
        (format!("[{host}]"), after.strip_prefix(':'))
    } else {
        match text.rsplit_once(':') {
            Some((host, port)) => (host.to_owned(), Some(port)),
            None => (text.to_owned(), None),
        }
    };
    if host.is_empty() || host == "[]" {
        return Err("a broker address is empty (the list is `host:port,host:port`)".to_owned());
    }
    if host.contains(|c: char| c.is_whitespace() || c == ':' && !host.starts_with('[')) {
        return Err(format!(
            "broker host `{host}` is not a host name or address"
        ));
    }
    let port = match port {
        None => 9092,
        Some(port) => port
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("broker `{text}`: the port must be a number from 1 to 65535"))?,
    };
    Ok(format!("{host}:{port}"))
}

/// Refuses properties that would weaken the delivery guarantee or that the sink owns.
fn check_properties(properties: &BTreeMap<String, String>) -> Result<(), KafkaSinkError> {
    for (name, value) in properties {
        let reason = match name.as_str() {
            "bootstrap.servers" | "metadata.broker.list" => {
                Some("the brokers are the URL's host list".to_owned())
            }
            "enable.idempotence" if value != "true" => Some(
                "must stay true: the idempotent producer keeps per-partition order and writes each message once across retries"
                    .to_owned(),
            ),
            "acks" | "request.required.acks" if !matches!(value.as_str(), "all" | "-1") => Some(
                "must be `all` (or -1): a row is marked published only once every in-sync replica has it"
                    .to_owned(),
            ),
            "max.in.flight.requests.per.connection" | "max.in.flight"
                if !value.parse::<u32>().is_ok_and(|n| (1..=5).contains(&n)) =>
            {
                Some("must be 1 to 5, the most the idempotent producer keeps in order".to_owned())
            }
            "transactional.id" => Some(
                "transactions are not supported: the relay's store commit cannot join a Kafka transaction (decision 0022)"
                    .to_owned(),
            ),
            "delivery.report.only.error" | "dr_msg_cb" | "dr_cb" => {
                Some("the sink needs every delivery report".to_owned())
            }
            _ => None,
        };
        if let Some(reason) = reason {
            return Err(KafkaSinkError::InvalidSetting {
                setting: name.clone(),
                reason,
            });
        }
    }
    Ok(())
}

/// Whether a rendered name is a legal Kafka topic.
pub(crate) fn check_topic_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("the topic name is empty".to_owned());
    }
    if name.len() > MAX_TOPIC_BYTES {
        return Err(format!(
            "the topic name is {} bytes, the limit is {MAX_TOPIC_BYTES}",
            name.len()
        ));
    }
    if name == "." || name == ".." {
        return Err("`.` and `..` are not topic names".to_owned());
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !c.is_ascii() || !legal_topic_byte(*c as u8))
    {
        return Err(format!(
            "the topic name holds {bad:?}, which Kafka refuses (only ASCII letters, digits, `.`, `_` and `-`)"
        ));
    }
    Ok(())
}

fn legal_topic_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')
}

/// The literal parts of a topic template are legal topic characters (braces are the
/// placeholders' own).
fn template_text_is_legal(text: &str) -> bool {
    text.bytes()
        .all(|b| legal_topic_byte(b) || b == b'{' || b == b'}')
}

/// Whether a librdkafka property's value is a credential.
pub(crate) fn is_secret(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    [
        "password",
        "secret",
        "token",
        ".pem",
        "jaas",
        "oauthbearer.config",
    ]
    .iter()
    .any(|part| name.contains(part))
}

fn shown<'a>(name: &str, value: &'a str) -> &'a str {
    if is_secret(name) { "***" } else { value }
}

/// Where the URL points, as it may be shown: scheme, brokers and query keys (the rule of
/// `outbox_engine::redact::url`, which a broker list with commas does not parse for).
pub(crate) fn redacted_url(url: &str) -> String {
    let (address, query) = url.split_once('?').unwrap_or((url, ""));
    let Some((scheme, rest)) = address.split_once(':') else {
        return "<a URL that does not parse>".to_owned();
    };
    let slashes = if rest.starts_with("//") { "//" } else { "" };
    let rest = &rest[slashes.len()..];
    // Everything up to the last `@` is user info: a password with an unencoded `/` or `@`
    // in it still ends there, wherever a parser would end the authority.
    let (credentials, rest) = match rest.rsplit_once('@') {
        Some((_, hosts)) => ("***@", hosts),
        None => ("", rest),
    };
    let (brokers, path) = rest.split_once('/').unwrap_or((rest, ""));
    let path = if path.is_empty() { "" } else { "/…" };
    let mut shown = format!("{scheme}:{slashes}{credentials}{brokers}{path}");
    if !query.is_empty() {
        let keys: Vec<String> = url::form_urlencoded::parse(query.as_bytes())
            .map(|(name, _)| format!("{name}=…"))
            .collect();
        shown.push('?');
        shown.push_str(&keys.join("&"));
    }
    shown
}

fn invalid(setting: &str, reason: impl Into<String>) -> KafkaSinkError {
    KafkaSinkError::InvalidSetting {
        setting: setting.to_owned(),
        reason: reason.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One vocabulary: every setting of a route's table is a URL option (properties as
    /// flat `name=value` options), and the reverse; both resolve to the same producer.
    #[test]
    fn every_table_setting_is_a_url_option_and_the_reverse() {
        use serde_json::json;
        type Resolved = (
            String,
            Template,
            Unkeyed,
            Duration,
            BTreeMap<String, String>,
        );
        fn resolved(config: &KafkaSinkConfig) -> Result<Resolved, String> {
            let c = config.check().map_err(|e| e.to_string())?;
            Ok((
                c.brokers,
                c.topic,
                c.unkeyed,
                c.connect_timeout,
                c.properties,
            ))
        }
        outbox_engine::testkit::assert_url_parity::<crate::KafkaSink, _>(
            "kafka://127.0.0.1:9092",
            KafkaSinkConfig::from_url,
            resolved,
            &[],
            &[],
            &["topic", "unkeyed", "connect_timeout"],
            &[
                (
                    "topic",
                    json!("shop.{event_type}"),
                    "topic=shop.{event_type}",
                ),
                ("unkeyed", json!("id"), "unkeyed=id"),
                ("connect_timeout", json!("9s"), "connect_timeout=9s"),
                (
                    "properties",
                    json!({ "linger.ms": "20", "compression.type": "zstd" }),
                    "linger.ms=20&compression.type=zstd",
                ),
            ],
        );
    }

    #[test]
    fn one_url_holds_brokers_topic_sink_options_and_properties() {
        let c = KafkaSinkConfig::new(
            "kafka://k1:9093,10.0.0.5,[::1]:9094/billing.{event_type}?unkeyed=id&connect_timeout=2s&linger.ms=20",
        )
        .check()
        .unwrap();
        assert_eq!(c.brokers, "k1:9093,10.0.0.5:9092,[::1]:9094");
        assert_eq!(c.topic.as_str(), "billing.{event_type}");
        assert_eq!(c.unkeyed, Unkeyed::Id);
        assert_eq!(c.connect_timeout, Duration::from_secs(2));
        assert_eq!(c.properties["linger.ms"], "20");
        assert_eq!(c.properties["acks"], "all");
        assert_eq!(c.properties["enable.idempotence"], "true");
    }

    #[test]
    fn defaults_fill_only_what_is_not_set() {
        let c = KafkaSinkConfig::default()
            .property("message.timeout.ms", "3000")
            .property("request.required.acks", "-1")
            .check()
            .unwrap();
        assert_eq!(c.topic.as_str(), "{destination}");
        assert_eq!(c.unkeyed, Unkeyed::Null);
        assert_eq!(c.properties["message.timeout.ms"], "3000");
        assert!(!c.properties.contains_key("acks"), "one acks setting only");
    }

    #[test]
    fn weakening_the_guarantee_is_refused_by_name() {
        for (name, value) in [
            ("enable.idempotence", "false"),
            ("acks", "1"),
            ("request.required.acks", "0"),
            ("max.in.flight.requests.per.connection", "6"),
            ("bootstrap.servers", "elsewhere:9092"),
            ("transactional.id", "relay-1"),
        ] {
            match KafkaSinkConfig::default().property(name, value).validate() {
                Err(KafkaSinkError::InvalidSetting { setting, .. }) => assert_eq!(setting, name),
                other => panic!("{name}={value}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_setting_given_twice_is_an_error() {
        for config in [
            KafkaSinkConfig::new("kafka://k/orders").topic("x"),
            KafkaSinkConfig::new("kafka://k/orders?topic=x"),
            KafkaSinkConfig::new("kafka://k?unkeyed=id").unkeyed(Unkeyed::Null),
            KafkaSinkConfig::new("kafka://k?linger.ms=1").property("linger.ms", "2"),
        ] {
            assert!(
                matches!(
                    config.validate(),
                    Err(KafkaSinkError::InvalidSetting { .. })
                ),
                "{config:?}"
            );
        }
    }

    #[test]
    fn bad_urls_say_what_is_wrong_without_secrets() {
        for bad in [
            "http://k:9092",
            "kafka://",
            "kafka://k:notaport",
            "kafka://k:0",
            "kafka://k1,,k2",
            "kafka://u:hunter2@k:9092",
            // A `/` in the password, and one slash: found by fuzzing, echoed before.
            "kafka://u:hun/ter2@k:9092",
            "https:/u:hunter2@k:9092",
            "kafka://k/a/b",
            "kafka://[::1:9092",
            "kafka://k?linger.ms=1&linger.ms=2",
        ] {
            let e = KafkaSinkConfig::new(bad).validate().unwrap_err();
            assert!(matches!(e, KafkaSinkError::InvalidUrl { .. }), "{bad}: {e}");
            assert!(!e.to_string().contains("hunter2"), "{e}");
            assert!(!e.to_string().contains("ter2"), "{e}");
        }
    }

    #[test]
    fn topic_names_are_checked_as_kafka_would() {
        assert!(check_topic_name("orders.v1_x-y").is_ok());
        for bad in ["", ".", "..", "a b", "ümlaut", &"x".repeat(250)] {
            assert!(check_topic_name(bad).is_err(), "{bad:?}");
        }
        assert!(
            KafkaSinkConfig::default()
                .topic("a/{destination}")
                .validate()
                .is_err()
        );
        assert!(
            KafkaSinkConfig::default()
                .topic("a.{destination}")
                .validate()
                .is_ok()
        );
    }

    #[test]
    fn secrets_are_hidden_in_debug_output() {
        let c = KafkaSinkConfig::new("kafka://k?sasl.password=hunter2&linger.ms=5")
            .property("ssl.key.pem", "hunter3")
            .property("sasl.oauthbearer.client.secret", "hunter4");
        let shown = format!("{c:?}");
        for secret in ["hunter2", "hunter3", "hunter4"] {
            assert!(!shown.contains(secret), "{shown}");
        }
        assert!(shown.contains("linger.ms=…"), "{shown}");
    }

    #[test]
    fn a_config_file_reads_durations_and_refuses_unknown_fields() {
        let c: KafkaSinkConfig = serde_json::from_value(serde_json::json!({
            "url": "kafka://k:9092", "topic": "events", "connect_timeout": "1500ms",
            "unkeyed": "id", "properties": { "compression.type": "lz4" }
        }))
        .unwrap();
        assert_eq!(c.connect_timeout, Some(Duration::from_millis(1500)));
        assert_eq!(c.unkeyed, Some(Unkeyed::Id));
        assert!(
            serde_json::from_value::<KafkaSinkConfig>(
                serde_json::json!({ "url": "kafka://k", "topc": "x" })
            )
            .is_err()
        );
    }
}
