//! Configuration of one HTTP route: where its messages go and how, from code or from a
//! config file (serde).
//!
//! In a route of `outbox.toml` (any serde format works the same):
//!
//! ```toml
//! [routes.orders]
//! url = "https://hooks.example.com/orders"
//! secrets = ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]   # or secrets_env / secrets_file
//! request_timeout = "10s"
//! max_in_flight = 8
//! allow = ["10.20.0.0/16"]                               # SSRF allow entries
//! headers = { authorization = "Bearer …" }
//! ```
//!
//! Rate limits, circuit breakers, concurrency caps and timeouts are route policies of
//! `outbox-engine` (`rate_limit`, `circuit`, `concurrency`, `timeout` in the same table),
//! the same for every sink. Durations use `outbox_engine::duration`'s grammar (`250ms`,
//! `1.5s`, `2m`, `1h 30m`). [`HttpSink::new`] validates everything and names the setting
//! that is wrong.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use outbox_engine::redact;
use serde::Deserialize;

use crate::error::HttpSinkError;
use crate::sink::HttpSink;
use crate::ssrf::{AllowRule, Lookup, SsrfPolicy};

/// One HTTP route: the endpoint, how requests are made, and the SSRF guard.
///
/// The `Debug` output shows the URL's scheme, host and port only (credentials, path and
/// query can hold secrets), header names without values, and the number of secrets.
///
/// ```
/// use std::time::Duration;
/// use outbox_sink_http::{HttpSink, HttpSinkConfig};
///
/// let config = HttpSinkConfig::new("https://user:pw@hooks.example.com/T123/secret-token?key=abc")
///     .header("authorization", "Bearer abc")
///     .secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
///     .request_timeout(Duration::from_secs(5));
/// let shown = format!("{config:?}");
/// assert!(shown.contains("https://***@hooks.example.com/…"));
/// for secret in ["pw", "secret-token", "key=abc", "Bearer abc", "MfKQ9r8G"] {
///     assert!(!shown.contains(secret), "{shown}");
/// }
/// let sink = HttpSink::new(config)?;
/// # Ok::<(), outbox_sink_http::HttpSinkError>(())
/// ```
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct HttpSinkConfig {
    /// The URL (`http` or `https`). Credentials in it are sent as basic auth.
    pub url: String,
    /// The method: `POST` (default), `PUT`, `PATCH` or `DELETE`.
    #[serde(default = "default_method")]
    pub method: String,
    /// Extra headers on every request (e.g. `authorization`). They replace message
    /// headers of the same name, so a message cannot override credentials.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Standard Webhooks signing secrets (`whsec_…`). With several, each request carries
    /// one signature per secret, so receivers can rotate keys. None: unsigned.
    #[serde(default)]
    pub secrets: Vec<String>,
    /// The name of an environment variable holding more secrets, separated by spaces or
    /// commas (kept out of the config file).
    #[serde(default)]
    pub secrets_env: Option<String>,
    /// A file holding more secrets, one per line (a mounted secret, say).
    #[serde(default)]
    pub secrets_file: Option<PathBuf>,
    /// Time allowed for one request, from connecting to its status line. Default 10 s.
    #[serde(default = "default_request_timeout", with = "outbox_engine::duration")]
    pub request_timeout: Duration,
    /// Most requests of this route in flight at once (1..=1024). Default 8.
    #[serde(default = "default_max_in_flight")]
    pub max_in_flight: usize,
    /// SSRF allow entries (CIDR blocks or host names) for this route.
    #[serde(default)]
    pub allow: Vec<AllowRule>,
    /// The SSRF guard; `allow` entries are added to it. On by default.
    #[serde(default)]
    pub ssrf: SsrfPolicy,
    /// Refuse `http://` URLs. Default `false`.
    #[serde(default)]
    pub require_https: bool,
    /// The `User-Agent` header. Default `outbox-sink-http/<version>`.
    #[serde(default = "default_user_agent")]
    pub user_agent: String,
    /// Time allowed to open a TCP (and TLS) connection. Default 5 s.
    #[serde(default = "default_connect_timeout", with = "outbox_engine::duration")]
    pub connect_timeout: Duration,
    /// Bytes read from a refusing response's body. Default 64 KiB.
    #[serde(default = "default_max_response_body")]
    pub max_response_body: usize,
    /// Bytes of a refusing response's body kept in the failure reason. Default 512.
    #[serde(default = "default_max_error_body")]
    pub max_error_body: usize,
    /// Longest `Retry-After` honoured; longer ones are cut to this. Default 1 hour.
    #[serde(default = "default_max_retry_after", with = "outbox_engine::duration")]
    pub max_retry_after: Duration,
    /// A custom resolver; the system resolver when `None`. Its answers still pass the
    /// SSRF guard. Not read from config files.
    #[serde(skip)]
    pub lookup: Option<Arc<dyn Lookup>>,
}

fn default_method() -> String {
    "POST".to_owned()
}

fn default_request_timeout() -> Duration {
    Duration::from_secs(10)
}

fn default_max_in_flight() -> usize {
    8
}

fn default_user_agent() -> String {
    concat!("outbox-sink-http/", env!("CARGO_PKG_VERSION")).to_owned()
}

fn default_connect_timeout() -> Duration {
    Duration::from_secs(5)
}

fn default_max_response_body() -> usize {
    64 * 1024
}

fn default_max_error_body() -> usize {
    512
}

fn default_max_retry_after() -> Duration {
    Duration::from_secs(3600)
}

impl HttpSinkConfig {
    /// A route to `url` with the defaults: `POST`, unsigned, 10 s per request, 8 requests
    /// in flight, the SSRF guard on.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            method: default_method(),
            headers: BTreeMap::new(),
            secrets: Vec::new(),
            secrets_env: None,
            secrets_file: None,
            request_timeout: default_request_timeout(),
            max_in_flight: default_max_in_flight(),
            allow: Vec::new(),
            ssrf: SsrfPolicy::default(),
            require_https: false,
            user_agent: default_user_agent(),
            connect_timeout: default_connect_timeout(),
            max_response_body: default_max_response_body(),
            max_error_body: default_max_error_body(),
            max_retry_after: default_max_retry_after(),
            lookup: None,
        }
    }

    /// The same as [`new`](Self::new): an HTTP route's URL is its endpoint.
    pub fn from_url(url: &str) -> Self {
        Self::new(url)
    }

    /// Sets the method.
    #[must_use]
    pub fn method(mut self, method: impl Into<String>) -> Self {
        self.method = method.into();
        self
    }

    /// Adds a header sent on every request.
    #[must_use]
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.insert(name.into(), value.into());
        self
    }

    /// Adds a signing secret (`whsec_…`).
    #[must_use]
    pub fn secret(mut self, secret: impl Into<String>) -> Self {
        self.secrets.push(secret.into());
        self
    }

    /// Sets the per-request timeout.
    #[must_use]
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Sets the most requests in flight.
    #[must_use]
    pub fn max_in_flight(mut self, n: usize) -> Self {
        self.max_in_flight = n;
        self
    }

    /// Adds an SSRF allow entry (a CIDR block or host name).
    ///
    /// An entry that does not parse is reported by [`HttpSink::new`].
    #[must_use]
    pub fn allow(mut self, rule: &str) -> Self {
        match rule.parse() {
            Ok(rule) => self.allow.push(rule),
            // Kept as an impossible host so that `HttpSink::new` reports it.
            Err(_) => self.allow.push(AllowRule::Host(format!("invalid:{rule}"))),
        }
        self
    }

    /// Replaces the SSRF policy.
    #[must_use]
    pub fn ssrf(mut self, policy: SsrfPolicy) -> Self {
        self.ssrf = policy;
        self
    }

    /// Refuses `http://` URLs when `true`.
    #[must_use]
    pub fn require_https(mut self, required: bool) -> Self {
        self.require_https = required;
        self
    }

    /// Sets the `User-Agent`.
    #[must_use]
    pub fn user_agent(mut self, user_agent: impl Into<String>) -> Self {
        self.user_agent = user_agent.into();
        self
    }

    /// Sets the connect timeout.
    #[must_use]
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Sets how much of a refusing body is read.
    #[must_use]
    pub fn max_response_body(mut self, bytes: usize) -> Self {
        self.max_response_body = bytes;
        self
    }

    /// Sets how much of a refusing body goes into the failure reason.
    #[must_use]
    pub fn max_error_body(mut self, bytes: usize) -> Self {
        self.max_error_body = bytes;
        self
    }

    /// Sets the longest `Retry-After` honoured.
    #[must_use]
    pub fn max_retry_after(mut self, max: Duration) -> Self {
        self.max_retry_after = max;
        self
    }

    /// Resolves names with `lookup` instead of the system resolver.
    #[must_use]
    pub fn lookup(mut self, lookup: impl Lookup) -> Self {
        self.lookup = Some(Arc::new(lookup));
        self
    }

    /// Validates everything and builds the sink; the same as [`HttpSink::new`].
    ///
    /// # Errors
    ///
    /// As for [`HttpSink::new`].
    pub fn build(self) -> Result<HttpSink, HttpSinkError> {
        HttpSink::new(self)
    }

    /// Every secret: `secrets`, then those of `secrets_env` and `secrets_file`. An error
    /// names the variable or file, never a value.
    pub(crate) fn all_secrets(&self) -> Result<Vec<String>, HttpSinkError> {
        let mut all = self.secrets.clone();
        let split = |text: &str| -> Vec<String> {
            text.split(|c: char| c == ',' || c.is_whitespace())
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect()
        };
        if let Some(var) = &self.secrets_env {
            let text = std::env::var(var).map_err(|_| {
                HttpSinkError::config(
                    "secrets_env",
                    format!("the environment variable `{var}` is not set (or not UTF-8)"),
                )
            })?;
            all.extend(split(&text));
        }
        if let Some(path) = &self.secrets_file {
            let text = std::fs::read_to_string(path).map_err(|e| {
                HttpSinkError::config(
                    "secrets_file",
                    format!("cannot read {}: {}", path.display(), e.kind()),
                )
            })?;
            all.extend(split(&text));
        }
        Ok(all)
    }
}

impl fmt::Debug for HttpSinkConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpSinkConfig")
            .field("url", &redact::url(&self.url))
            .field("method", &self.method)
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .field("secrets", &format_args!("[{} hidden]", self.secrets.len()))
            .field("secrets_env", &self.secrets_env)
            .field("secrets_file", &self.secrets_file)
            .field("request_timeout", &self.request_timeout)
            .field("max_in_flight", &self.max_in_flight)
            .field("allow", &self.allow)
            .field("ssrf", &self.ssrf)
            .field("require_https", &self.require_https)
            .field("user_agent", &self.user_agent)
            .field("connect_timeout", &self.connect_timeout)
            .field("max_response_body", &self.max_response_body)
            .field("max_error_body", &self.max_error_body)
            .field("max_retry_after", &self.max_retry_after)
            .field(
                "lookup",
                &self.lookup.as_ref().map_or("system", |_| "custom"),
            )
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The exception to one vocabulary: an HTTP route's URL is its endpoint, query and
    /// all, so no setting is read from it (a query option named like a setting reaches
    /// the endpoint as it is), whether the route comes from a URL or a table.
    #[test]
    fn an_http_routes_query_belongs_to_its_endpoint() {
        let url = "https://hooks.example.com/in?request_timeout=1s&method=GET&token=abc";
        let from_url = HttpSinkConfig::from_url(url);
        let settings = outbox_engine::registry::RouteSettings {
            route: "billing".to_owned(),
            settings: serde_json::json!({ "url": url }),
        };
        let mut from_table: HttpSinkConfig = settings.parse().unwrap();
        let moved =
            <crate::HttpSink as outbox_engine::registry::RouteSink>::url_options(&mut from_table)
                .unwrap();
        assert!(moved.is_empty());
        for config in [&from_url, &from_table] {
            assert_eq!(config.url, url, "the query is sent as it is");
            assert_eq!(config.method, HttpSinkConfig::new(url).method);
            assert_eq!(
                config.request_timeout,
                HttpSinkConfig::new(url).request_timeout
            );
        }
    }

    #[test]
    fn secrets_come_from_the_environment_and_files_without_echoing_them() {
        let dir = std::env::temp_dir().join(format!("outbox-http-secrets-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("secrets");
        std::fs::write(&file, "whsec_a\nwhsec_b\n").unwrap();
        let mut config = HttpSinkConfig::new("https://example.com/");
        config.secrets_file = Some(file);
        assert_eq!(config.all_secrets().unwrap(), ["whsec_a", "whsec_b"]);
        config.secrets_env = Some("OUTBOX_TEST_SURELY_UNSET_VARIABLE".into());
        let error = config.all_secrets().unwrap_err().to_string();
        assert!(
            error.contains("OUTBOX_TEST_SURELY_UNSET_VARIABLE"),
            "{error}"
        );
        let _ = std::fs::remove_dir_all(dir);
    }
}
