//! Route configuration: which queue, where SQS is, credentials, and how message fields
//! that SQS cannot carry as they are get sent.

use std::fmt;
use std::time::Duration;

use derive_setters::Setters;
use outbox_engine::redact;
use serde::Deserialize;

use crate::error::SqsSinkError;

/// The group id of FIFO messages that have no partition key, unless configured.
pub const DEFAULT_GROUP: &str = "default";

/// How a payload that is not text SQS accepts is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Binary {
    /// The message fails permanently (class `Serialization`): a consumer reading bodies
    /// as text never meets an encoding it did not expect.
    #[default]
    Refuse,
    /// The body is the payload in standard base64, with the attribute
    /// `outbox-body-encoding = base64`; [`read_message`](crate::read_message) decodes it.
    Base64,
}

/// The configuration of one SQS route.
///
/// Build it from a URL ([`from_url`](Self::from_url)), from a config file (it implements
/// `Deserialize`; every field is optional but `url`), or with the chainable setters.
/// Settings may be given in the URL's query or as fields, not both. Everything is
/// checked by [`validate`](Self::validate), which
/// [`SqsSink::connect`](crate::SqsSink::connect) calls first.
///
/// `url` names the queue, in one of two forms:
///
/// - `sqs://REGION/QUEUE` (or `sqs://REGION/ACCOUNT/QUEUE` for another account's queue):
///   the queue is looked up by name at start-up. `sqs:///QUEUE` takes the region from the
///   environment (`AWS_REGION`, the profile).
/// - `sqs+https://HOST/ACCOUNT/QUEUE` (or `sqs+http://` for a local emulator): the full
///   queue URL with `sqs+` in front. Requests go to that host; the region comes from
///   `region`, from a host `sqs.REGION.amazonaws.com`, or from the environment.
///
/// | field | default | meaning |
/// |---|---|---|
/// | `url` | — | the queue, as above, with options in the query |
/// | `endpoint` | AWS's | where requests go (`http://127.0.0.1:4566` for an emulator, a VPC endpoint) |
/// | `region` | from the URL or the environment | the AWS region |
/// | `default_group` | `default` | FIFO group id of messages without a partition key |
/// | `binary` | `refuse` | payloads that are not SQS text: `refuse` or `base64` ([`Binary`]) |
/// | `connect_timeout` | 5 s | how long start-up may take to read the queue's attributes |
/// | `profile` | the environment's | the shared-config profile for credentials and region |
/// | `access_key_id`, `secret_access_key`, `session_token` | the standard chain | static credentials (never shown) |
///
/// Without static credentials the SDK's standard chain applies: environment variables,
/// the shared config and credentials files, web identity, container and instance
/// metadata. Credentials never go in the URL.
///
/// ```
/// use outbox_sink_sqs::SqsSinkConfig;
///
/// let config = SqsSinkConfig::from_url("sqs://eu-west-1/invoices.fifo?default_group=billing")?;
/// assert!(config.validate().is_ok());
/// assert!(config.clone().default_group("").validate().is_err());
///
/// let local = SqsSinkConfig::new("sqs+http://127.0.0.1:4566/000000000000/invoices")
///     .region("us-east-1")
///     .credentials("test", "s3cret");
/// assert!(local.validate().is_ok());
/// assert!(!format!("{local:?}").contains("s3cret"));
/// # Ok::<(), outbox_sink_sqs::SqsSinkError>(())
/// ```
#[derive(Clone, PartialEq, Eq, Deserialize, Setters)]
#[serde(deny_unknown_fields)]
#[setters(into, strip_option)]
#[non_exhaustive]
pub struct SqsSinkConfig {
    /// `sqs://REGION/QUEUE`, `sqs://REGION/ACCOUNT/QUEUE` or `sqs+https://HOST/ACCOUNT/QUEUE`.
    pub url: String,
    /// Where requests go, when not AWS's own endpoint.
    #[serde(default)]
    pub endpoint: Option<String>,
    /// The AWS region.
    #[serde(default)]
    pub region: Option<String>,
    /// The FIFO group id of messages without a partition key (default `default`).
    #[serde(default)]
    pub default_group: Option<String>,
    /// How payloads that are not SQS text are sent (default [`Binary::Refuse`]).
    #[serde(default)]
    pub binary: Option<Binary>,
    /// How long start-up may take (default 5 s).
    #[serde(default, with = "outbox_engine::duration::optional")]
    pub connect_timeout: Option<Duration>,
    /// The shared-config profile.
    #[serde(default)]
    pub profile: Option<String>,
    /// A static access key id (with `secret_access_key`).
    #[setters(skip)]
    #[serde(default)]
    pub access_key_id: Option<String>,
    /// A static secret access key (never shown).
    #[setters(skip)]
    #[serde(default)]
    pub secret_access_key: Option<String>,
    /// A session token for temporary static credentials (never shown).
    #[setters(skip)]
    #[serde(default)]
    pub session_token: Option<String>,
}

impl fmt::Debug for SqsSinkConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hidden = |v: &Option<String>| v.as_ref().map(|_| "***");
        f.debug_struct("SqsSinkConfig")
            .field("url", &redact::url(&self.url))
            .field("endpoint", &self.endpoint.as_deref().map(redact::url))
            .field("region", &self.region)
            .field("default_group", &self.default_group)
            .field("binary", &self.binary)
            .field("connect_timeout", &self.connect_timeout)
            .field("profile", &self.profile)
            .field("access_key_id", &hidden(&self.access_key_id))
            .field("secret_access_key", &hidden(&self.secret_access_key))
            .field("session_token", &hidden(&self.session_token))
            .finish()
    }
}

/// Which queue, as the URL says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Queue {
    /// Looked up by name (in `account`, when given) at start-up.
    Named {
        name: String,
        account: Option<String>,
    },
    /// A full queue URL.
    Url(String),
}

/// Static credentials from the configuration.
#[derive(Clone)]
pub(crate) struct StaticCredentials {
    pub(crate) access_key_id: String,
    pub(crate) secret_access_key: String,
    pub(crate) session_token: Option<String>,
}

/// A valid configuration, resolved.
#[derive(Clone)]
pub(crate) struct Checked {
    pub(crate) queue: Queue,
    pub(crate) region: Option<String>,
    pub(crate) endpoint: Option<String>,
    pub(crate) default_group: String,
    pub(crate) binary: Binary,
    pub(crate) connect_timeout: Duration,
    pub(crate) profile: Option<String>,
    pub(crate) credentials: Option<StaticCredentials>,
}

impl SqsSinkConfig {
    /// A configuration for `url`, every other setting at its default.
    ///
    /// ```
    /// use outbox_sink_sqs::SqsSinkConfig;
    /// assert!(SqsSinkConfig::new("sqs://us-east-1/orders").validate().is_ok());
    /// ```
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            endpoint: None,
            region: None,
            default_group: None,
            binary: None,
            connect_timeout: None,
            profile: None,
            access_key_id: None,
            secret_access_key: None,
            session_token: None,
        }
    }

    /// A configuration for `url` (queue and options in one URL), checked.
    ///
    /// ```
    /// use outbox_sink_sqs::SqsSinkConfig;
    /// assert!(SqsSinkConfig::from_url("sqs://us-east-1/orders?binary=base64").is_ok());
    /// assert!(SqsSinkConfig::from_url("sqs://us-east-1/orders?binary=hex").is_err());
    /// ```
    ///
    /// # Errors
    ///
    /// As for [`validate`](Self::validate).
    pub fn from_url(url: &str) -> Result<Self, SqsSinkError> {
        let config = Self::new(url);
        config.validate()?;
        Ok(config)
    }

    /// Sets static credentials instead of the standard chain.
    ///
    /// ```
    /// # use outbox_sink_sqs::SqsSinkConfig;
    /// let c = SqsSinkConfig::new("sqs://us-east-1/o").credentials("AKIDEXAMPLE", "wJalrXUtnFEMI");
    /// assert!(!format!("{c:?}").contains("wJalrXUtnFEMI"));
    /// ```
    pub fn credentials(
        mut self,
        access_key_id: impl Into<String>,
        secret_access_key: impl Into<String>,
    ) -> Self {
        self.access_key_id = Some(access_key_id.into());
        self.secret_access_key = Some(secret_access_key.into());
        self
    }

    /// Checks every setting without touching the network.
    ///
    /// ```
    /// use outbox_sink_sqs::{SqsSinkConfig, SqsSinkError};
    ///
    /// let bad = SqsSinkConfig::new("sqs://us-east-1/orders queue");
    /// assert!(matches!(bad.validate(), Err(SqsSinkError::InvalidUrl { .. })));
    /// ```
    ///
    /// # Errors
    ///
    /// The first problem found, as an [`SqsSinkError`] naming the setting.
    pub fn validate(&self) -> Result<(), SqsSinkError> {
        self.check().map(|_| ())
    }

    pub(crate) fn check(&self) -> Result<Checked, SqsSinkError> {
        let parsed = ParsedUrl::parse(&self.url)?;
        let mut endpoint = self.endpoint.clone();
        let mut region = self.region.clone();
        let mut default_group = self.default_group.clone();
        let mut binary = self.binary;
        let mut connect_timeout = self.connect_timeout;
        let mut profile = self.profile.clone();
        let twice = |setting: &str| SqsSinkError::InvalidSetting {
            setting: setting.to_owned(),
            reason: "is given both in the URL and as a setting; keep one".to_owned(),
        };
        let set = |slot: &mut Option<String>, name: &str, value: String| {
            if slot.replace(value).is_some() {
                Err(twice(name))
            } else {
                Ok(())
            }
        };
        if let Some(from_url) = parsed.region {
            set(&mut region, "region", from_url)?;
        }
        if let Some(from_url) = parsed.endpoint {
            set(&mut endpoint, "endpoint", from_url)?;
        }
        for (name, value) in parsed.options {
            match name.as_str() {
                "endpoint" => set(&mut endpoint, "endpoint", value)?,
                "region" => set(&mut region, "region", value)?,
                "default_group" => set(&mut default_group, "default_group", value)?,
                "profile" => set(&mut profile, "profile", value)?,
                "binary" => {
                    let parsed = match value.as_str() {
                        "refuse" => Binary::Refuse,
                        "base64" => Binary::Base64,
                        _ => return Err(invalid("binary", "must be `refuse` or `base64`")),
                    };
                    if binary.replace(parsed).is_some() {
                        return Err(twice("binary"));
                    }
                }
                "connect_timeout" => {
                    let parsed = outbox_engine::duration::parse(&value)
                        .map_err(|reason| invalid("connect_timeout", reason))?;
                    if connect_timeout.replace(parsed).is_some() {
                        return Err(twice("connect_timeout"));
                    }
                }
                "access_key_id" | "secret_access_key" | "session_token" => {
                    return Err(SqsSinkError::InvalidUrl {
                        url: redact::url(&self.url),
                        reason: format!(
                            "credentials do not go in the URL (`{name}`): use the settings or the standard credential chain"
                        ),
                    });
                }
                _ => {
                    return Err(invalid(
                        &name,
                        "is not an SQS route option (endpoint, region, default_group, binary, connect_timeout, profile)",
                    ));
                }
            }
        }
        if let Some(region) = &region
            && (region.is_empty()
                || region.len() > 64
                || !region
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'))
        {
            return Err(invalid(
                "region",
                "is a region name such as `eu-west-1` (lowercase letters, digits, `-`)",
            ));
        }
        if let Some(text) = &endpoint {
            check_endpoint(text)?;
        }
        let default_group = default_group.unwrap_or_else(|| DEFAULT_GROUP.to_owned());
        if !is_sqs_id(&default_group) {
            return Err(invalid(
                "default_group",
                "must be 1 to 128 printable ASCII characters without spaces",
            ));
        }
        let connect_timeout = connect_timeout.unwrap_or(Duration::from_secs(5));
        if connect_timeout.is_zero() {
            return Err(invalid("connect_timeout", "must be above zero"));
        }
        if profile.as_deref() == Some("") {
            return Err(invalid("profile", "must not be empty"));
        }
        let credentials = match (&self.access_key_id, &self.secret_access_key) {
            (Some(id), Some(secret)) if !id.is_empty() && !secret.is_empty() => {
                Some(StaticCredentials {
                    access_key_id: id.clone(),
                    secret_access_key: secret.clone(),
                    session_token: self.session_token.clone(),
                })
            }
            (None, None) if self.session_token.is_none() => None,
            _ => {
                return Err(invalid(
                    "access_key_id",
                    "static credentials need both a non-empty access_key_id and secret_access_key",
                ));
            }
        };
        Ok(Checked {
            queue: parsed.queue,
            region,
            endpoint,
            default_group,
            binary: binary.unwrap_or_default(),
            connect_timeout,
            profile,
            credentials,
        })
    }
}

fn invalid(setting: &str, reason: impl Into<String>) -> SqsSinkError {
    SqsSinkError::InvalidSetting {
        setting: setting.to_owned(),
        reason: reason.into(),
    }
}

/// The parts of an `sqs://` or `sqs+http(s)://` URL.
struct ParsedUrl {
    queue: Queue,
    region: Option<String>,
    endpoint: Option<String>,
    options: Vec<(String, String)>,
}

impl ParsedUrl {
    fn parse(text: &str) -> Result<Self, SqsSinkError> {
        let fail = |reason: &str| SqsSinkError::InvalidUrl {
            url: redact::url(text),
            reason: reason.to_owned(),
        };
        let url = url::Url::parse(text).map_err(|e| fail(&e.to_string()))?;
        if !url.username().is_empty() || url.password().is_some() {
            return Err(fail(
                "credentials do not go in the URL: use the settings or the standard credential chain",
            ));
        }
        if url.fragment().is_some() {
            return Err(fail("a queue URL has no fragment"));
        }
        let mut options = Vec::new();
        for (name, value) in url.query_pairs() {
            if name.is_empty() {
                return Err(fail("an option without a name"));
            }
            if options.iter().any(|(seen, _)| *seen == name) {
                return Err(fail(&format!("option `{name}` is given twice")));
            }
            options.push((name.into_owned(), value.into_owned()));
        }
        let segments: Vec<&str> = url.path().split('/').skip(1).collect();
        let check_name = |name: &str| {
            check_queue_name(name).map_err(|reason| fail(&reason))?;
            Ok::<_, SqsSinkError>(name.to_owned())
        };
        let check_account = |account: &str| {
            if account.len() == 12 && account.bytes().all(|b| b.is_ascii_digit()) {
                Ok(account.to_owned())
            } else {
                Err(fail("the account id is 12 digits"))
            }
        };
        match url.scheme() {
            "sqs" => {
                let region = url.host_str().filter(|h| !h.is_empty()).map(str::to_owned);
                if url.port().is_some() {
                    return Err(fail(
                        "the host of an sqs:// URL is the region; for an emulator use sqs+http://HOST:PORT/ACCOUNT/QUEUE or the endpoint option",
                    ));
                }
                let queue = match segments[..] {
                    [name] => Queue::Named {
                        name: check_name(name)?,
                        account: None,
                    },
                    [account, name] => Queue::Named {
                        name: check_name(name)?,
                        account: Some(check_account(account)?),
                    },
                    _ => {
                        return Err(fail(
                            "the path is the queue: sqs://REGION/QUEUE or sqs://REGION/ACCOUNT/QUEUE",
                        ));
                    }
                };
                Ok(Self {
                    queue,
                    region,
                    endpoint: None,
                    options,
                })
            }
            "sqs+https" | "sqs+http" => {
                let host = url
                    .host_str()
                    .filter(|h| !h.is_empty())
                    .ok_or_else(|| fail("a queue URL needs a host"))?;
                let [account, name] = segments[..] else {
                    return Err(fail("the path of a queue URL is /ACCOUNT/QUEUE"));
                };
                let account = check_account(account)?;
                let name = check_name(name)?;
                let scheme = &url.scheme()["sqs+".len()..];
                let origin = match url.port() {
                    Some(port) => format!("{scheme}://{host}:{port}"),
                    None => format!("{scheme}://{host}"),
                };
                let region = host
                    .strip_prefix("sqs.")
                    .and_then(|h| h.strip_suffix(".amazonaws.com"))
                    .filter(|r| !r.contains('.'))
                    .map(str::to_owned);
                Ok(Self {
                    queue: Queue::Url(format!("{origin}/{account}/{name}")),
                    region,
                    endpoint: Some(origin),
                    options,
                })
            }
            _ => Err(fail(
                "the scheme must be sqs://, sqs+https:// or sqs+http://",
            )),
        }
    }
}

/// Checks an endpoint URL: http or https, a host, no credentials, path or query.
fn check_endpoint(text: &str) -> Result<(), SqsSinkError> {
    let fail = |reason: &str| SqsSinkError::InvalidSetting {
        setting: "endpoint".to_owned(),
        reason: format!("{}: {reason}", redact::url(text)),
    };
    let url = url::Url::parse(text).map_err(|e| fail(&e.to_string()))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(fail("the scheme must be http or https"));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(fail("needs a host"));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(fail("credentials do not go in the endpoint"));
    }
    if url.path() != "/" || url.query().is_some() || url.fragment().is_some() {
        return Err(fail("is scheme, host and port only"));
    }
    Ok(())
}

/// Checks a queue name: 1 to 80 ASCII letters, digits, `-` and `_`, where a FIFO queue's
/// name ends with `.fifo`.
pub(crate) fn check_queue_name(name: &str) -> Result<(), String> {
    let stem = name.strip_suffix(".fifo").unwrap_or(name);
    if name.is_empty() || name.len() > 80 || stem.is_empty() {
        return Err("a queue name has 1 to 80 characters".to_owned());
    }
    if !stem
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err(format!(
            "queue name {:?}: only ASCII letters, digits, `-` and `_` (and a `.fifo` suffix)",
            name.chars().take(80).collect::<String>()
        ));
    }
    Ok(())
}

/// Whether `text` can be a FIFO group id or deduplication id as it is: 1 to 128
/// characters from `!` to `~`.
pub(crate) fn is_sqs_id(text: &str) -> bool {
    (1..=128).contains(&text.len()) && text.bytes().all(|b| (b'!'..=b'~').contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One vocabulary: every setting of a route's table is a URL option, and the
    /// reverse, but for the credentials, which stay out of URLs (the credential chain or
    /// the settings hold them); both resolve to the same queue and client.
    #[test]
    fn every_table_setting_is_a_url_option_and_the_reverse() {
        use serde_json::json;
        type Resolved = (
            Queue,
            Option<String>,
            Option<String>,
            String,
            Binary,
            Duration,
            Option<String>,
        );
        fn resolved(config: &SqsSinkConfig) -> Result<Resolved, String> {
            let c = config.check().map_err(|e| e.to_string())?;
            Ok((
                c.queue,
                c.region,
                c.endpoint,
                c.default_group,
                c.binary,
                c.connect_timeout,
                c.profile,
            ))
        }
        outbox_engine::testkit::assert_url_parity::<crate::SqsSink, _>(
            "sqs:///orders",
            SqsSinkConfig::from_url,
            resolved,
            &[],
            &["access_key_id", "secret_access_key", "session_token"],
            &[
                "endpoint",
                "region",
                "default_group",
                "profile",
                "binary",
                "connect_timeout",
            ],
            &[
                (
                    "endpoint",
                    json!("http://127.0.0.1:4566"),
                    "endpoint=http://127.0.0.1:4566",
                ),
                ("region", json!("eu-west-1"), "region=eu-west-1"),
                ("default_group", json!("all"), "default_group=all"),
                ("profile", json!("relay"), "profile=relay"),
                ("binary", json!("base64"), "binary=base64"),
                ("connect_timeout", json!("9s"), "connect_timeout=9s"),
            ],
        );
    }

    fn checked(url: &str) -> Checked {
        SqsSinkConfig::new(url).check().unwrap()
    }

    fn error(config: SqsSinkConfig) -> String {
        config.check().err().expect("refused").to_string()
    }

    #[test]
    fn both_url_forms_resolve_queue_region_and_endpoint() {
        let named = checked("sqs://eu-west-1/orders.fifo");
        assert_eq!(
            named.queue,
            Queue::Named {
                name: "orders.fifo".into(),
                account: None
            }
        );
        assert_eq!(named.region.as_deref(), Some("eu-west-1"));
        assert_eq!(named.endpoint, None);

        let other_account = checked("sqs://eu-west-1/123456789012/orders");
        assert_eq!(
            other_account.queue,
            Queue::Named {
                name: "orders".into(),
                account: Some("123456789012".into())
            }
        );

        let from_env = checked("sqs:///orders");
        assert_eq!(from_env.region, None);

        let aws = checked("sqs+https://sqs.us-east-2.amazonaws.com/123456789012/orders");
        assert_eq!(
            aws.queue,
            Queue::Url("https://sqs.us-east-2.amazonaws.com/123456789012/orders".into())
        );
        assert_eq!(aws.region.as_deref(), Some("us-east-2"));
        assert_eq!(
            aws.endpoint.as_deref(),
            Some("https://sqs.us-east-2.amazonaws.com")
        );

        let local = SqsSinkConfig::new("sqs+http://127.0.0.1:4566/000000000000/q?region=us-east-1")
            .check()
            .unwrap();
        assert_eq!(
            local.queue,
            Queue::Url("http://127.0.0.1:4566/000000000000/q".into())
        );
        assert_eq!(local.endpoint.as_deref(), Some("http://127.0.0.1:4566"));
        assert_eq!(local.region.as_deref(), Some("us-east-1"));
        assert_eq!(local.default_group, DEFAULT_GROUP);
        assert_eq!(local.binary, Binary::Refuse);
        assert_eq!(local.connect_timeout, Duration::from_secs(5));
    }

    #[test]
    fn options_come_from_the_query_or_the_fields_not_both() {
        let c = checked(
            "sqs://us-east-1/q?default_group=g1&binary=base64&connect_timeout=2s&profile=p",
        );
        assert_eq!(
            (
                c.default_group.as_str(),
                c.binary,
                c.connect_timeout,
                c.profile.as_deref()
            ),
            ("g1", Binary::Base64, Duration::from_secs(2), Some("p"))
        );
        let twice =
            error(SqsSinkConfig::new("sqs://us-east-1/q?default_group=a").default_group("b"));
        assert!(
            twice.contains("default_group") && twice.contains("both"),
            "{twice}"
        );
        let region_twice = error(SqsSinkConfig::new("sqs://us-east-1/q").region("eu-west-1"));
        assert!(region_twice.contains("region"), "{region_twice}");
        let unknown = error(SqsSinkConfig::new("sqs://us-east-1/q?visibility=3"));
        assert!(unknown.contains("visibility"), "{unknown}");
    }

    #[test]
    fn bad_urls_and_settings_are_refused_by_name() {
        for (url, expected) in [
            ("https://sqs.us-east-1.amazonaws.com/1/q", "scheme"),
            ("sqs://us-east-1/", "queue name"),
            ("sqs://us-east-1/a/b/c", "path"),
            ("sqs://us-east-1/orders%20queue", "queue name"),
            ("sqs://us-east-1/.fifo", "1 to 80"),
            ("sqs://us-east-1/12/orders", "12 digits"),
            ("sqs://127.0.0.1:4566/q", "emulator"),
            ("sqs+http://127.0.0.1:4566/q", "ACCOUNT/QUEUE"),
            ("sqs://US_EAST/q", "region"),
            ("sqs://us-east-1/q?binary=hex", "binary"),
            ("sqs://us-east-1/q?connect_timeout=0s", "connect_timeout"),
            ("sqs://us-east-1/q?default_group=a%20b", "default_group"),
            ("sqs://us-east-1/q?endpoint=ftp://h", "endpoint"),
            ("sqs://us-east-1/q?endpoint=http://h/path", "endpoint"),
        ] {
            let e = error(SqsSinkConfig::new(url));
            assert!(e.contains(expected), "{url}: {e}");
        }
        let long = format!("sqs://us-east-1/{}", "q".repeat(81));
        assert!(error(SqsSinkConfig::new(long)).contains("1 to 80"));
        let half = error(SqsSinkConfig {
            access_key_id: Some("AKID".into()),
            ..SqsSinkConfig::new("sqs://us-east-1/q")
        });
        assert!(half.contains("access_key_id"), "{half}");
    }

    #[test]
    fn secrets_never_show() {
        let e = error(SqsSinkConfig::new(
            "sqs://us-east-1/q?secret_access_key=hunter2",
        ));
        assert!(e.contains("credentials") && !e.contains("hunter2"), "{e}");
        let e = error(SqsSinkConfig::new("sqs://AKID:hunter2@us-east-1/q"));
        assert!(e.contains("credentials") && !e.contains("hunter2"), "{e}");
        let e = error(SqsSinkConfig::new("sqs://us-east-1/q").endpoint("http://u:hunter2@h"));
        assert!(!e.contains("hunter2"), "{e}");
        let in_query = "sqs://us-east-1/q?endpoint=http://u:hunter2@h&visibility=1";
        let e = error(SqsSinkConfig::new(in_query));
        assert!(e.contains("visibility") && !e.contains("hunter2"), "{e}");
        let e = error(SqsSinkConfig::new(
            "sqs://us-east-1/bad%20name?endpoint=http://u:hunter2@h",
        ));
        assert!(!e.contains("hunter2"), "{e}");
        assert!(!format!("{:?}", SqsSinkConfig::new(in_query)).contains("hunter2"));
        let mut config = SqsSinkConfig::new("sqs://us-east-1/q").credentials("AKID", "hunter2");
        config.session_token = Some("tok3n".into());
        let shown = format!("{config:?}");
        assert!(shown.contains("access_key_id: Some(\"***\")"), "{shown}");
        assert!(
            !shown.contains("AKID") && !shown.contains("hunter2") && !shown.contains("tok3n"),
            "{shown}"
        );
    }

    #[test]
    fn toml_fields_deserialize() {
        let config: SqsSinkConfig = serde_json::from_value(serde_json::json!({
            "url": "sqs://us-east-1/orders.fifo",
            "endpoint": "http://127.0.0.1:4566",
            "default_group": "billing",
            "binary": "base64",
            "connect_timeout": "3s",
            "access_key_id": "test",
            "secret_access_key": "test",
        }))
        .unwrap();
        let c = config.check().unwrap();
        assert_eq!(c.endpoint.as_deref(), Some("http://127.0.0.1:4566"));
        assert_eq!(c.binary, Binary::Base64);
        assert!(c.credentials.is_some());
        let unknown: Result<SqsSinkConfig, _> =
            serde_json::from_value(serde_json::json!({ "url": "sqs://us-east-1/q", "queue": "x" }));
        assert!(unknown.is_err());
    }

    #[test]
    fn sqs_ids_are_printable_ascii_up_to_128() {
        assert!(is_sqs_id("tenant-7:invoice/42"));
        assert!(!is_sqs_id(""));
        assert!(!is_sqs_id("has space"));
        assert!(!is_sqs_id("ünï"));
        assert!(is_sqs_id(&"k".repeat(128)));
        assert!(!is_sqs_id(&"k".repeat(129)));
    }
}
