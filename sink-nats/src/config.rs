//! Route configuration: which server, which subject, how long to wait for acks, and the
//! credentials and TLS files.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use derive_setters::Setters;
use outbox_engine::template::Template;
use serde::Deserialize;

use crate::error::NatsSinkError;

/// The longest subject the sink publishes to, in bytes.
pub const MAX_SUBJECT_BYTES: usize = 1024;

/// URL query options [`NatsSinkConfig::from_url`] understands.
const OPTIONS: &[&str] = &[
    "subject",
    "ack_timeout",
    "connect_timeout",
    "credentials_file",
    "nkey_seed_file",
    "tls_ca_file",
    "tls_cert_file",
    "tls_key_file",
];

/// The configuration of one NATS JetStream route.
///
/// Build it from a URL ([`from_url`](Self::from_url)), from a config file (it implements
/// `Deserialize`; every field has a default), or with the chainable setters. Everything
/// is checked by [`validate`](Self::validate), which
/// [`NatsSink::connect`](crate::NatsSink::connect) calls first.
///
/// | field | default | meaning |
/// |---|---|---|
/// | `url` | `nats://127.0.0.1:4222` | server, and a user and password (`nats://user:pass@host`) or a token (`nats://token@host`); `nats+tls://` for TLS |
/// | `subject` | `{destination}` | subject template, see [`Template`]; a stream must bind every subject it renders |
/// | `ack_timeout` | 5 s | how long a message waits for its `PubAck` (the relay's publish deadline also bounds it) |
/// | `connect_timeout` | 5 s | one connection attempt, including the handshake |
/// | `credentials_file` | none | a `.creds` file (user JWT and NKey seed), for servers with decentralised auth |
/// | `nkey_seed_file` | none | a file holding an NKey seed (`SU…`), for NKey authentication |
/// | `tls_ca_file` | none (system roots) | PEM file of the CA that signed the server's certificate (`nats+tls://` only) |
/// | `tls_cert_file`, `tls_key_file` | none | PEM client certificate and key, for servers that verify clients |
///
/// Secrets stay out of logs: the URL's password or token never appears in `Debug`
/// output or in an error, and the files are named, never read out.
///
/// ```
/// use std::time::Duration;
/// use outbox_sink_nats::NatsSinkConfig;
///
/// let config = NatsSinkConfig::from_url(
///     "nats://relay:s3cret@nats.internal:4222?subject=orders.{event_type}&ack_timeout=2s",
/// )?;
/// assert_eq!(config.subject, "orders.{event_type}");
/// assert_eq!(config.ack_timeout, Duration::from_secs(2));
/// assert_eq!(config.url, "nats://relay:s3cret@nats.internal:4222");
/// // Debug output never shows the password.
/// assert!(!format!("{config:?}").contains("s3cret"));
/// # Ok::<(), outbox_sink_nats::NatsSinkError>(())
/// ```
#[derive(Clone, PartialEq, Eq, Deserialize, Setters)]
#[serde(default, deny_unknown_fields)]
#[setters(into, strip_option)]
#[non_exhaustive]
pub struct NatsSinkConfig {
    /// The server URL: `nats://[user[:password]@|token@]host[:port]`, or `nats+tls://…`.
    pub url: String,
    /// The subject template.
    pub subject: String,
    /// How long a message waits for its `PubAck`.
    #[serde(deserialize_with = "outbox_engine::duration::deserialize")]
    pub ack_timeout: Duration,
    /// How long one connection attempt may take.
    #[serde(deserialize_with = "outbox_engine::duration::deserialize")]
    pub connect_timeout: Duration,
    /// A credentials file (`.creds`: user JWT and NKey seed).
    pub credentials_file: Option<PathBuf>,
    /// A file holding an NKey seed.
    pub nkey_seed_file: Option<PathBuf>,
    /// The CA certificate (PEM) to verify the server with, instead of the system roots.
    pub tls_ca_file: Option<PathBuf>,
    /// A client certificate (PEM) for mutual TLS; needs `tls_key_file`.
    #[setters(skip)]
    pub tls_cert_file: Option<PathBuf>,
    /// The client certificate's private key (PEM); needs `tls_cert_file`.
    #[setters(skip)]
    pub tls_key_file: Option<PathBuf>,
}

impl Default for NatsSinkConfig {
    fn default() -> Self {
        Self {
            url: "nats://127.0.0.1:4222".to_owned(),
            subject: "{destination}".to_owned(),
            ack_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(5),
            credentials_file: None,
            nkey_seed_file: None,
            tls_ca_file: None,
            tls_cert_file: None,
            tls_key_file: None,
        }
    }
}

impl fmt::Debug for NatsSinkConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsSinkConfig")
            .field("url", &outbox_engine::redact::url(&self.url))
            .field("subject", &self.subject)
            .field("ack_timeout", &self.ack_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("credentials_file", &self.credentials_file)
            .field("nkey_seed_file", &self.nkey_seed_file)
            .field("tls_ca_file", &self.tls_ca_file)
            .field("tls_cert_file", &self.tls_cert_file)
            .field("tls_key_file", &self.tls_key_file)
            .finish()
    }
}

/// How the client logs in, read from the URL.
#[derive(Clone, PartialEq, Eq)]
pub(crate) enum Login {
    None,
    Token(String),
    UserPassword(String, String),
}

/// A valid configuration, parsed: the address as the client takes it (no credentials in
/// it), how to log in, and the subject template.
#[derive(Clone)]
pub(crate) struct Checked {
    pub(crate) address: String,
    pub(crate) tls: bool,
    pub(crate) login: Login,
    pub(crate) subject: Template,
}

impl NatsSinkConfig {
    /// The defaults, connecting to `url` (which must carry no options; see
    /// [`from_url`](Self::from_url) for that).
    ///
    /// ```
    /// use outbox_sink_nats::NatsSinkConfig;
    ///
    /// let config = NatsSinkConfig::new("nats://127.0.0.1:4222").subject("orders.{event_type}");
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
    /// Query options: `subject` (a template), `ack_timeout`, `connect_timeout`,
    /// `credentials_file`, `nkey_seed_file`, `tls_ca_file`, `tls_cert_file`,
    /// `tls_key_file`. Any other option is an error.
    ///
    /// ```
    /// use outbox_sink_nats::NatsSinkConfig;
    ///
    /// let config = NatsSinkConfig::from_url("nats+tls://nats.internal?subject=orders&tls_ca_file=/etc/ca.pem")?;
    /// assert_eq!(config.subject, "orders");
    /// assert!(config.tls_ca_file.is_some());
    /// assert!(NatsSinkConfig::from_url("nats://127.0.0.1?stream=orders").is_err());
    /// # Ok::<(), outbox_sink_nats::NatsSinkError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`NatsSinkError::InvalidUrl`] for an unparsable URL or an unknown option,
    /// [`NatsSinkError::InvalidSetting`] for an option with a bad value.
    pub fn from_url(url: &str) -> Result<Self, NatsSinkError> {
        let mut config = Self::new(url);
        config.take_url_options()?;
        Ok(config)
    }

    /// Moves the options of [`from_url`](Self::from_url) out of `self.url`'s query into
    /// the fields; returns the settings they set.
    pub(crate) fn take_url_options(&mut self) -> Result<Vec<&'static str>, NatsSinkError> {
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
                "subject" => self.subject = value,
                "ack_timeout" => self.ack_timeout = duration("ack_timeout", &value)?,
                "connect_timeout" => self.connect_timeout = duration("connect_timeout", &value)?,
                "credentials_file" => self.credentials_file = Some(value.into()),
                "nkey_seed_file" => self.nkey_seed_file = Some(value.into()),
                "tls_ca_file" => self.tls_ca_file = Some(value.into()),
                "tls_cert_file" => self.tls_cert_file = Some(value.into()),
                "tls_key_file" => self.tls_key_file = Some(value.into()),
                other => {
                    return Err(NatsSinkError::InvalidUrl {
                        url: outbox_engine::redact::url(&self.url),
                        reason: format!(
                            "unknown option `{other}` (options: {})",
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
    /// # use outbox_sink_nats::NatsSinkConfig;
    /// let c = NatsSinkConfig::new("nats+tls://nats.internal")
    ///     .tls_client_cert("/etc/ssl/relay.pem", "/etc/ssl/relay.key");
    /// assert!(c.validate().is_ok());
    /// ```
    pub fn tls_client_cert(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        self.tls_cert_file = Some(cert.into());
        self.tls_key_file = Some(key.into());
        self
    }

    /// Checks every setting without touching the network or the files.
    ///
    /// ```
    /// use outbox_sink_nats::{NatsSinkConfig, NatsSinkError};
    ///
    /// let bad = NatsSinkConfig::default().subject("orders.{evnt_type}");
    /// assert!(matches!(bad.validate(), Err(NatsSinkError::InvalidTemplate { .. })));
    /// ```
    ///
    /// # Errors
    ///
    /// The first problem found, as a [`NatsSinkError`] naming the setting.
    pub fn validate(&self) -> Result<(), NatsSinkError> {
        self.check().map(|_| ())
    }

    pub(crate) fn check(&self) -> Result<Checked, NatsSinkError> {
        let url = parse_url(&self.url)?;
        if let Some((name, _)) = url.query_pairs().next() {
            return Err(NatsSinkError::InvalidUrl {
                url: outbox_engine::redact::url(&self.url),
                reason: format!(
                    "unknown option `{name}` (options in a URL are read by NatsSinkConfig::from_url)"
                ),
            });
        }
        let tls = url.scheme() == "nats+tls";
        for (setting, file) in [
            ("tls_ca_file", &self.tls_ca_file),
            ("tls_cert_file", &self.tls_cert_file),
            ("tls_key_file", &self.tls_key_file),
        ] {
            if file.is_some() && !tls {
                return Err(invalid(setting, "is only used with a nats+tls:// URL"));
            }
        }
        if self.tls_cert_file.is_some() != self.tls_key_file.is_some() {
            return Err(invalid(
                "tls_cert_file",
                "a client certificate needs its key (tls_key_file), and a key its certificate",
            ));
        }
        let user = percent_decoded(url.username());
        let password = url.password().map(percent_decoded);
        let login = match (user.is_empty(), password) {
            (true, None) => Login::None,
            (false, None) => Login::Token(user),
            (_, Some(password)) => Login::UserPassword(user, password),
        };
        let ways = [
            login != Login::None,
            self.credentials_file.is_some(),
            self.nkey_seed_file.is_some(),
        ];
        if ways.iter().filter(|&&w| w).count() > 1 {
            return Err(invalid(
                "credentials_file",
                "choose one way to log in: a user and password or token in the URL, credentials_file, or nkey_seed_file",
            ));
        }
        let subject =
            Template::parse(&self.subject).map_err(|e| NatsSinkError::InvalidTemplate {
                template: self.subject.chars().take(128).collect(),
                reason: e.reason,
            })?;
        if let Some(fixed) = subject.fixed()
            && let Err(reason) = check_subject(&fixed)
        {
            return Err(NatsSinkError::InvalidTemplate {
                template: self.subject.chars().take(128).collect(),
                reason,
            });
        }
        for (setting, value) in [
            ("ack_timeout", self.ack_timeout),
            ("connect_timeout", self.connect_timeout),
        ] {
            if value.is_zero() {
                return Err(invalid(setting, "must be above zero"));
            }
        }
        let host = url.host_str().unwrap_or_default();
        let port = url.port().unwrap_or(4222);
        let address = format!("{}://{host}:{port}", if tls { "tls" } else { "nats" });
        Ok(Checked {
            address,
            tls,
            login,
            subject,
        })
    }
}

/// Why `subject` cannot be published to, if it cannot: NATS subjects are dot-separated
/// tokens of printable characters without spaces, none empty and none a wildcard.
pub(crate) fn check_subject(subject: &str) -> Result<(), String> {
    if subject.is_empty() {
        return Err("the subject is empty".to_owned());
    }
    if subject.len() > MAX_SUBJECT_BYTES {
        return Err(format!(
            "the subject is {} bytes, the sink allows {MAX_SUBJECT_BYTES}",
            subject.len()
        ));
    }
    if let Some(c) = subject
        .chars()
        .find(|c| c.is_whitespace() || c.is_control())
    {
        return Err(format!(
            "subject {subject:?} contains {c:?}; NATS subjects have no spaces or control characters"
        ));
    }
    for token in subject.split('.') {
        match token {
            "" => {
                return Err(format!(
                    "subject {subject:?} has an empty token (a leading, trailing or doubled dot)"
                ));
            }
            "*" | ">" => {
                return Err(format!(
                    "subject {subject:?} has the wildcard {token:?}; publish to a concrete subject"
                ));
            }
            _ => {}
        }
    }
    Ok(())
}

fn parse_url(text: &str) -> Result<url::Url, NatsSinkError> {
    let fail = |reason: String| NatsSinkError::InvalidUrl {
        url: outbox_engine::redact::url(text),
        reason,
    };
    let url = url::Url::parse(text).map_err(|e| fail(e.to_string()))?;
    if !matches!(url.scheme(), "nats" | "nats+tls") {
        return Err(fail(format!(
            "scheme `{}` is not a NATS scheme (use nats:// or nats+tls://)",
            url.scheme()
        )));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(fail("missing host".to_owned()));
    }
    if !matches!(url.path(), "" | "/") {
        return Err(fail(
            "a NATS URL has no path; name the subject with `subject`".to_owned(),
        ));
    }
    Ok(url)
}

fn percent_decoded(text: &str) -> String {
    percent_encoding::percent_decode_str(text)
        .decode_utf8_lossy()
        .into_owned()
}

fn invalid(setting: &'static str, reason: impl Into<String>) -> NatsSinkError {
    NatsSinkError::InvalidSetting {
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
        outbox_engine::testkit::assert_url_parity::<crate::NatsSink, _>(
            "nats://127.0.0.1:4222",
            NatsSinkConfig::from_url,
            NatsSinkConfig::clone,
            &[],
            &[],
            OPTIONS,
            &[
                &[
                    (
                        "subject",
                        json!("shop.{event_type}"),
                        "subject=shop.{event_type}",
                    ),
                    ("ack_timeout", json!("2s"), "ack_timeout=2s"),
                    ("connect_timeout", json!("3s"), "connect_timeout=3s"),
                    (
                        "credentials_file",
                        json!("/etc/n.creds"),
                        "credentials_file=/etc/n.creds",
                    ),
                    (
                        "nkey_seed_file",
                        json!("/etc/n.nk"),
                        "nkey_seed_file=/etc/n.nk",
                    ),
                ][..],
                &outbox_engine::testkit::tls_file_cases(),
            ]
            .concat(),
        );
    }

    #[test]
    fn url_options_become_settings_and_leave_the_url() {
        let c = NatsSinkConfig::from_url(
            "nats+tls://u:p@nats:4443?subject=x.{tenant_id}&connect_timeout=2s&tls_ca_file=/ca.pem",
        )
        .unwrap();
        assert_eq!(c.url, "nats+tls://u:p@nats:4443");
        assert_eq!(c.subject, "x.{tenant_id}");
        assert_eq!(c.connect_timeout, Duration::from_secs(2));
        assert_eq!(c.tls_ca_file, Some(PathBuf::from("/ca.pem")));
        let checked = c.check().unwrap();
        assert_eq!(
            checked.address, "tls://nats:4443",
            "no credentials in the address"
        );
        assert!(checked.tls);
        assert!(checked.login == Login::UserPassword("u".into(), "p".into()));
    }

    #[test]
    fn a_user_without_a_password_is_a_token_and_is_never_shown() {
        let c = NatsSinkConfig::new("nats://s3cr%40t@127.0.0.1");
        assert!(c.check().unwrap().login == Login::Token("s3cr@t".into()));
        assert!(!format!("{c:?}").contains("s3cr"), "{c:?}");
        let e = NatsSinkConfig::from_url("nats://s3cret@127.0.0.1?queue=x").unwrap_err();
        assert!(!e.to_string().contains("s3cret"), "{e}");
    }

    #[test]
    fn bad_settings_name_themselves() {
        let setting = |c: NatsSinkConfig| match c.validate() {
            Err(NatsSinkError::InvalidSetting { setting, .. }) => setting,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            setting(NatsSinkConfig::default().tls_ca_file("/ca.pem")),
            "tls_ca_file"
        );
        assert_eq!(
            setting(NatsSinkConfig::default().ack_timeout(Duration::ZERO)),
            "ack_timeout"
        );
        assert_eq!(
            setting(NatsSinkConfig::new("nats://u:p@127.0.0.1").credentials_file("/relay.creds")),
            "credentials_file"
        );
        assert_eq!(
            setting(
                NatsSinkConfig::new("nats+tls://127.0.0.1")
                    .tls_ca_file("/ca.pem")
                    .tls_client_cert("/c.pem", "/k.pem")
                    .nkey_seed_file("/a")
                    .credentials_file("/b")
            ),
            "credentials_file"
        );
        for subject in [
            "",
            "orders.*",
            "orders.>",
            "orders..paid",
            "orders paid",
            ".orders",
        ] {
            assert!(
                matches!(
                    NatsSinkConfig::default().subject(subject).validate(),
                    Err(NatsSinkError::InvalidTemplate { .. })
                ),
                "{subject:?}"
            );
        }
    }

    #[test]
    fn urls_are_checked_and_never_echo_the_password() {
        for bad in [
            "http://nats/",
            "nats://",
            "nats://nats/orders",
            "not a url",
            "nats://u:hunter2@nats/?queue=x",
        ] {
            let e = NatsSinkConfig::from_url(bad).unwrap_err();
            assert!(matches!(e, NatsSinkError::InvalidUrl { .. }), "{bad}: {e}");
            assert!(!e.to_string().contains("hunter2"), "{e}");
        }
        let e = NatsSinkConfig::new("nats://u:hunter2@nats?subject=x")
            .validate()
            .unwrap_err();
        assert!(!e.to_string().contains("hunter2"), "{e}");
    }

    #[test]
    fn a_config_file_reads_durations_and_refuses_unknown_fields() {
        let c: NatsSinkConfig = serde_json::from_value(serde_json::json!({
            "url": "nats://nats", "subject": "events", "ack_timeout": "1500ms"
        }))
        .unwrap();
        assert_eq!(c.ack_timeout, Duration::from_millis(1500));
        assert!(
            serde_json::from_value::<NatsSinkConfig>(serde_json::json!({ "stream": "x" })).is_err()
        );
    }
}
