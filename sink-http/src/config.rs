//! Configuration: routes (destination → endpoint) and sink-wide settings, from code or
//! from a config file (serde).
//!
//! In a TOML file (any serde format works the same):
//!
//! ```toml
//! publish_deadline = "12s"
//!
//! [ssrf]
//! allow = ["10.20.0.0/16"]            # for every endpoint
//!
//! [routes.orders]                     # destination "orders"
//! url = "https://hooks.example.com/orders"
//! secrets = ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]
//! timeout = "10s"
//! concurrency = 8
//! rate_limit = { per_second = 80, burst = 10 }
//! circuit = { failures = 5, cool_down = "30s" }
//!
//! [routes.whatsapp]
//! url = "https://graph.example.com/v19.0/123/messages"
//! headers = { authorization = "Bearer …" }
//! allow = ["192.168.7.10"]            # for this endpoint only
//! ```
//!
//! Durations are strings with a unit: `"250ms"`, `"10s"`, `"1.5s"`, `"2m"`, `"1h"`.
//! Everything is validated by [`HttpSinkConfig::build`], which names the route and the
//! setting that is wrong.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use crate::circuit::CircuitConfig;
use crate::error::ConfigError;
use crate::rate::RateLimit;
use crate::sink::HttpSink;
use crate::ssrf::{AllowRule, Lookup, SsrfPolicy};

/// Settings for the whole sink plus its routes.
///
/// ```
/// use std::time::Duration;
/// use outbox_sink_http::{EndpointConfig, HttpSinkConfig, RateLimit};
///
/// let sink = HttpSinkConfig::new()
///     .route(
///         "orders",
///         EndpointConfig::new("https://hooks.example.com/orders")
///             .secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
///             .timeout(Duration::from_secs(5))
///             .rate_limit(RateLimit::per_second(80.0).burst(10)),
///     )
///     .publish_deadline(Duration::from_secs(12))
///     .build()?;
/// assert_eq!(sink.destinations().collect::<Vec<_>>(), ["orders"]);
/// # Ok::<(), outbox_sink_http::ConfigError>(())
/// ```
#[derive(Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct HttpSinkConfig {
    /// Destination (the outbox row's route name) → endpoint.
    pub routes: BTreeMap<String, EndpointConfig>,
    /// The SSRF guard for every endpoint; endpoints can add their own allow entries.
    pub ssrf: SsrfPolicy,
    /// Refuse `http://` endpoints. Default `false`.
    pub require_https: bool,
    /// The `User-Agent` header. Default `outbox-sink-http/<version>`.
    pub user_agent: String,
    /// Every publish call returns by then: a message without a reply fails retryably
    /// (`Timeout`), one not yet sent is not sent. Keep it below the relay's
    /// `publish_timeout` (15 s by default), so the relay never times out a whole batch.
    /// Default 12 s.
    #[serde(with = "duration")]
    pub publish_deadline: Duration,
    /// Time allowed to open a TCP (and TLS) connection. Default 5 s.
    #[serde(with = "duration")]
    pub connect_timeout: Duration,
    /// Bytes read from any response body; the rest is not read. Default 64 KiB.
    pub max_response_body: usize,
    /// Bytes of a refusing response's body kept in the failure reason. Default 512.
    pub max_error_body: usize,
    /// Longest `Retry-After` honoured; longer ones are cut to this. Default 1 hour.
    #[serde(with = "duration")]
    pub max_retry_after: Duration,
    /// A custom resolver; the system resolver when `None`. Its answers still pass the
    /// SSRF guard. Not read from config files.
    #[serde(skip)]
    pub lookup: Option<Arc<dyn Lookup>>,
}

impl Default for HttpSinkConfig {
    fn default() -> Self {
        Self {
            routes: BTreeMap::new(),
            ssrf: SsrfPolicy::default(),
            require_https: false,
            user_agent: concat!("outbox-sink-http/", env!("CARGO_PKG_VERSION")).to_owned(),
            publish_deadline: Duration::from_secs(12),
            connect_timeout: Duration::from_secs(5),
            max_response_body: 64 * 1024,
            max_error_body: 512,
            max_retry_after: Duration::from_secs(3600),
            lookup: None,
        }
    }
}

impl HttpSinkConfig {
    /// Defaults, no routes.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds (or replaces) the endpoint for `destination`.
    #[must_use]
    pub fn route(mut self, destination: impl Into<String>, endpoint: EndpointConfig) -> Self {
        self.routes.insert(destination.into(), endpoint);
        self
    }

    /// Replaces the SSRF policy.
    #[must_use]
    pub fn ssrf(mut self, policy: SsrfPolicy) -> Self {
        self.ssrf = policy;
        self
    }

    /// Refuses `http://` endpoints when `true`.
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

    /// Sets the publish deadline.
    #[must_use]
    pub fn publish_deadline(mut self, deadline: Duration) -> Self {
        self.publish_deadline = deadline;
        self
    }

    /// Sets the connect timeout.
    #[must_use]
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Sets the response body cap.
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

    /// Validates everything and builds the sink.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the route and setting: no routes, a URL that does not
    /// parse, is not `http(s)`, or names a blocked address; a bad method, header, secret,
    /// rate limit, concurrency or duration.
    pub fn build(self) -> Result<HttpSink, ConfigError> {
        HttpSink::from_config(self)
    }
}

impl fmt::Debug for HttpSinkConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpSinkConfig")
            .field("routes", &self.routes)
            .field("ssrf", &self.ssrf)
            .field("require_https", &self.require_https)
            .field("user_agent", &self.user_agent)
            .field("publish_deadline", &self.publish_deadline)
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

/// One endpoint: where a destination's messages go and how.
///
/// The `Debug` output shows the URL's scheme, host and port only (credentials, path and
/// query can hold secrets), header names without values, and the number of secrets.
///
/// ```
/// use outbox_sink_http::EndpointConfig;
///
/// let endpoint = EndpointConfig::new("https://user:pw@hooks.example.com/T123/secret-token?key=abc")
///     .header("authorization", "Bearer abc")
///     .secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw");
/// let shown = format!("{endpoint:?}");
/// assert!(shown.contains("https://***@hooks.example.com/…"));
/// for secret in ["pw", "secret-token", "key=abc", "Bearer abc", "MfKQ9r8G"] {
///     assert!(!shown.contains(secret), "{shown}");
/// }
/// ```
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct EndpointConfig {
    /// The URL (`http` or `https`). Credentials in it are sent as basic auth.
    pub url: String,
    /// The method: `POST` (default), `PUT`, `PATCH` or `DELETE`.
    #[serde(default = "default_method")]
    pub method: String,
    /// Extra headers on every request (e.g. `authorization`). They replace message
    /// headers of the same name, so a message cannot override credentials.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Time allowed for one request, from connecting to the end of the response body.
    /// Default 10 s.
    #[serde(default = "default_timeout", with = "duration")]
    pub timeout: Duration,
    /// Standard Webhooks signing secrets (`whsec_…`). With several, each request carries
    /// one signature per secret, so receivers can rotate keys. None: unsigned.
    #[serde(default)]
    pub secrets: Vec<String>,
    /// A token-bucket rate limit; none by default.
    #[serde(default)]
    pub rate_limit: Option<RateLimit>,
    /// Most requests in flight to this endpoint at once (1..=1024). Default 8.
    #[serde(default = "default_concurrency")]
    pub concurrency: usize,
    /// The circuit breaker.
    #[serde(default)]
    pub circuit: CircuitConfig,
    /// SSRF allow entries for this endpoint only, added to the sink-wide policy.
    #[serde(default)]
    pub allow: Vec<AllowRule>,
}

fn default_method() -> String {
    "POST".to_owned()
}

fn default_timeout() -> Duration {
    Duration::from_secs(10)
}

fn default_concurrency() -> usize {
    8
}

impl EndpointConfig {
    /// An endpoint at `url` with the defaults: `POST`, 10 s timeout, unsigned, no rate
    /// limit, 8 requests in flight, circuit opening after 5 failures for 30 s.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            method: default_method(),
            headers: BTreeMap::new(),
            timeout: default_timeout(),
            secrets: Vec::new(),
            rate_limit: None,
            concurrency: default_concurrency(),
            circuit: CircuitConfig::default(),
            allow: Vec::new(),
        }
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

    /// Sets the per-request timeout.
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Adds a signing secret (`whsec_…`).
    #[must_use]
    pub fn secret(mut self, secret: impl Into<String>) -> Self {
        self.secrets.push(secret.into());
        self
    }

    /// Sets a rate limit.
    #[must_use]
    pub fn rate_limit(mut self, limit: RateLimit) -> Self {
        self.rate_limit = Some(limit);
        self
    }

    /// Sets the most requests in flight.
    #[must_use]
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n;
        self
    }

    /// Sets the circuit breaker.
    #[must_use]
    pub fn circuit(mut self, circuit: CircuitConfig) -> Self {
        self.circuit = circuit;
        self
    }

    /// Adds an SSRF allow entry for this endpoint only (a CIDR block or host name).
    ///
    /// An entry that does not parse is reported by [`HttpSinkConfig::build`].
    #[must_use]
    pub fn allow(mut self, rule: &str) -> Self {
        match rule.parse() {
            Ok(rule) => self.allow.push(rule),
            // Kept as an impossible host so that `build` reports it with the route name.
            Err(_) => self.allow.push(AllowRule::Host(format!("invalid:{rule}"))),
        }
        self
    }
}

/// The URL with credentials replaced and path and query elided.
pub(crate) fn redacted_url(raw: &str) -> String {
    let Ok(url) = url::Url::parse(raw) else {
        return "<unparsable url>".to_owned();
    };
    let creds = if url.username().is_empty() && url.password().is_none() {
        ""
    } else {
        "***@"
    };
    let host = url.host_str().unwrap_or("");
    let port = url.port().map(|p| format!(":{p}")).unwrap_or_default();
    let rest = if url.path() == "/" && url.query().is_none() {
        "/"
    } else {
        "/…"
    };
    format!("{}://{creds}{host}{port}{rest}", url.scheme())
}

impl fmt::Debug for EndpointConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EndpointConfig")
            .field("url", &redacted_url(&self.url))
            .field("method", &self.method)
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .field("timeout", &self.timeout)
            .field("secrets", &format_args!("[{} hidden]", self.secrets.len()))
            .field("rate_limit", &self.rate_limit)
            .field("concurrency", &self.concurrency)
            .field("circuit", &self.circuit)
            .field("allow", &self.allow)
            .finish()
    }
}

/// Durations written as `"250ms"`, `"10s"`, `"1.5s"`, `"2m"` or `"1h"`.
pub(crate) mod duration {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    pub(crate) fn parse(s: &str) -> Result<Duration, String> {
        let s = s.trim();
        let split = s
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| format!("duration `{s}` needs a unit: ms, s, m or h (e.g. \"10s\")"))?;
        let (number, unit) = s.split_at(split);
        let value: f64 = number
            .parse()
            .map_err(|_| format!("duration `{s}` does not start with a number"))?;
        let secs = match unit.trim() {
            "ms" => value / 1000.0,
            "s" => value,
            "m" => value * 60.0,
            "h" => value * 3600.0,
            other => {
                return Err(format!(
                    "duration `{s}` has unknown unit `{other}` (use ms, s, m or h)"
                ));
            }
        };
        Duration::try_from_secs_f64(secs).map_err(|_| format!("duration `{s}` is out of range"))
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let s = String::deserialize(d)?;
        parse(&s).map_err(serde::de::Error::custom)
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn parses_units_and_rejects_bare_numbers() {
            assert_eq!(parse("250ms"), Ok(Duration::from_millis(250)));
            assert_eq!(parse("10s"), Ok(Duration::from_secs(10)));
            assert_eq!(parse("1.5s"), Ok(Duration::from_millis(1500)));
            assert_eq!(parse("2m"), Ok(Duration::from_secs(120)));
            assert_eq!(parse(" 1h "), Ok(Duration::from_secs(3600)));
            assert!(parse("10").unwrap_err().contains("needs a unit"));
            assert!(parse("10 days").is_err());
            assert!(parse("s").is_err());
            assert!(parse("1e400s").is_err());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_urls() {
        assert_eq!(
            redacted_url("https://hooks.example.com/"),
            "https://hooks.example.com/"
        );
        assert_eq!(
            redacted_url("http://u:p@127.0.0.1:8080/x?y=1"),
            "http://***@127.0.0.1:8080/…"
        );
        assert_eq!(redacted_url("not a url"), "<unparsable url>");
    }
}
