//! The [`HttpSink`]: one route, one request per message, an outcome per answer.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::future::join_all;
use outbox_engine::redact;
use outbox_engine::webhooks::{Secret, signature_header, webhook_id};
use outbox_engine::{
    Failure, FailureClass, Message, Outcome, Outcomes, PublishContext, ReportingSink,
};
use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use reqwest::{Method, Url};
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tracing::warn;

use crate::config::HttpSinkConfig;
use crate::error::{HttpSinkError, Limits, classify_error, classify_response};
use crate::headers;
use crate::ssrf::{AllowRule, GuardedResolver, Lookup, SystemLookup};

/// Delivers the messages of one route as HTTP requests: webhooks (signed with Standard
/// Webhooks) and third-party HTTP APIs.
///
/// Build it with [`HttpSink::new`] (no I/O: addresses are checked by the SSRF guard when
/// each request connects) and give it to the relay as the route's sink. Rate limits,
/// circuit breakers and concurrency caps are `outbox-engine` layers that wrap it (see
/// `outbox_engine::layers`).
///
/// # What one publish does
///
/// Messages of a batch go out concurrently (at most `max_in_flight` at once), except that
/// messages with the same partition key go one after another in batch order. For each
/// message, before the call's deadline:
///
/// 1. Headers that HTTP cannot carry fail it permanently (`Serialization`).
/// 2. If a policy around the sink stopped the call (a circuit that just opened), it is
///    not sent: a retryable, deferred failure.
/// 3. It waits for a request slot, is signed (when the route has secrets) and sent; the
///    answer's status line is classified (see [`error`](crate::error) for the table) and
///    reported at once.
///
/// A message without a reply by the deadline fails retryably with class `Timeout`.
///
/// ```no_run
/// # async fn run(store: outbox_engine::MemoryStore) -> Result<(), Box<dyn std::error::Error>> {
/// use outbox_engine::Relay;
/// use outbox_engine::layers::{CircuitConfig, SinkExt};
/// use outbox_sink_http::{HttpSink, HttpSinkConfig};
///
/// let orders = HttpSink::new(
///     HttpSinkConfig::new("https://hooks.example.com/orders")
///         .secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
/// )?;
/// let relay = Relay::builder(store)
///     .route("orders", orders.circuit_breaker(CircuitConfig::default()))
///     .build()?;
/// relay.drain().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct HttpSink {
    inner: Arc<Inner>,
}

struct Inner {
    client: reqwest::Client,
    method: Method,
    url: Url,
    headers: HeaderMap,
    secrets: Vec<Secret>,
    slots: Semaphore,
    max_response_body: usize,
    limits: Limits,
}

impl HttpSink {
    /// Validates `config` and builds the sink.
    ///
    /// # Errors
    ///
    /// An [`HttpSinkError`] naming the setting: a URL that does not parse, is not
    /// `http(s)`, or names a blocked address; a bad method, header, secret (or
    /// `secrets_env` / `secrets_file`), limit or duration.
    pub fn new(config: HttpSinkConfig) -> Result<Self, HttpSinkError> {
        let err = |setting, reason: &dyn std::fmt::Display| {
            HttpSinkError::config(setting, reason.to_string())
        };
        for (setting, value) in [
            ("request_timeout", config.request_timeout),
            ("connect_timeout", config.connect_timeout),
        ] {
            if value.is_zero() {
                return Err(err(setting, &"must be greater than zero"));
            }
        }
        HeaderValue::from_str(&config.user_agent)
            .map_err(|_| err("user_agent", &"not a valid header value"))?;
        check_allow_rules(&config.allow)?;
        check_allow_rules(&config.ssrf.allow)?;
        let lookup: Arc<dyn Lookup> = config
            .lookup
            .clone()
            .unwrap_or_else(|| Arc::new(SystemLookup));

        let url = Url::parse(&config.url).map_err(|e| err("url", &format!("{e}")))?;
        match url.scheme() {
            "https" => {}
            "http" if !config.require_https => {}
            "http" => return Err(err("url", &"must be https (require_https is on)")),
            _ => return Err(err("url", &"the scheme must be http or https")),
        }
        if url.host().is_none() {
            return Err(err("url", &"has no host"));
        }
        let policy = config.ssrf.with_extra(&config.allow);
        if policy.enabled {
            policy
                .check_url(&url)
                .map_err(|e| err("url", &e.to_string()))?;
        }

        let method = Method::from_bytes(config.method.to_ascii_uppercase().as_bytes())
            .ok()
            .filter(|m| [Method::POST, Method::PUT, Method::PATCH, Method::DELETE].contains(m))
            .ok_or_else(|| {
                err(
                    "method",
                    &format!("`{}` is not POST, PUT, PATCH or DELETE", config.method),
                )
            })?;

        let mut headers = HeaderMap::new();
        for (name, value) in &config.headers {
            if headers::is_reserved(name) {
                return Err(err(
                    "headers",
                    &format!("`{name}` is set by the sink and cannot be configured"),
                ));
            }
            let name = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| err("headers", &format!("`{name}` is not a valid header name")))?;
            let mut value = HeaderValue::from_str(value).map_err(|_| {
                err(
                    "headers",
                    &format!("the value of `{name}` is not a valid header value"),
                )
            })?;
            value.set_sensitive(true);
            headers.insert(name, value);
        }

        let secrets = config
            .all_secrets()?
            .iter()
            .enumerate()
            .map(|(i, s)| {
                Secret::parse(s).map_err(|e| err("secrets", &format!("secret {}: {e}", i + 1)))
            })
            .collect::<Result<Vec<_>, _>>()?;
        if secrets.is_empty() {
            // Legitimate for APIs that authenticate with a header, but easy to forget for
            // a webhook: say so once, at start-up.
            warn!(
                url = %redact::url(&config.url),
                "HTTP route has no secrets: its requests are sent unsigned (set `secrets` to sign them)"
            );
        }
        if !(1..=1024).contains(&config.max_in_flight) {
            return Err(err(
                "max_in_flight",
                &format!("must be 1..=1024, got {}", config.max_in_flight),
            ));
        }

        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .referer(false)
            .user_agent(config.user_agent.clone())
            .connect_timeout(config.connect_timeout)
            .timeout(config.request_timeout)
            .pool_max_idle_per_host(config.max_in_flight)
            .https_only(config.require_https)
            .dns_resolver(Arc::new(GuardedResolver::new(policy, lookup)))
            .build()
            .map_err(|e| {
                err(
                    "client",
                    &format!("the HTTP client could not be built: {e}"),
                )
            })?;

        Ok(Self {
            inner: Arc::new(Inner {
                client,
                method,
                url,
                headers,
                secrets,
                slots: Semaphore::new(config.max_in_flight),
                max_response_body: config.max_response_body,
                limits: Limits {
                    max_error_body: config.max_error_body.min(config.max_response_body),
                    max_retry_after: config.max_retry_after,
                },
            }),
        })
    }

    /// [`HttpSinkConfig::from_url`] then [`new`](Self::new).
    ///
    /// ```
    /// let sink = outbox_sink_http::HttpSink::from_url("https://hooks.example.com/orders")?;
    /// # Ok::<(), outbox_sink_http::HttpSinkError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As for [`new`](Self::new).
    pub fn from_url(url: &str) -> Result<Self, HttpSinkError> {
        Self::new(HttpSinkConfig::from_url(url))
    }

    async fn deliver_by(&self, message: &Message, cx: &PublishContext) -> Outcome {
        let sent = AtomicBool::new(false);
        match tokio::time::timeout_at(cx.deadline(), self.deliver(message, cx, &sent)).await {
            Ok(outcome) => outcome,
            Err(_) if sent.load(Ordering::Acquire) => Outcome::retryable(
                FailureClass::Timeout,
                "no reply before the publish deadline; the request may have been delivered",
            ),
            Err(_) => Failure::retryable(
                FailureClass::Timeout,
                "not sent: the publish deadline passed while waiting for a request slot",
            )
            .deferred()
            .into(),
        }
    }

    async fn deliver(&self, message: &Message, cx: &PublishContext, sent: &AtomicBool) -> Outcome {
        let inner = &*self.inner;
        let mut request_headers = match inner.request_headers(message) {
            Ok(headers) => headers,
            Err(failure) => return failure.into(),
        };
        let Ok(_slot) = inner.slots.acquire().await else {
            return Outcome::retryable(FailureClass::Other, "the request limiter is closed");
        };
        // The wait above can end just as a policy stopped the call or at the deadline;
        // never start a request then.
        if let Some(reason) = cx.stopped() {
            return Failure::retryable(FailureClass::Unavailable, format!("not sent: {reason}"))
                .deferred()
                .into();
        }
        if Instant::now() >= cx.deadline() {
            return Failure::retryable(
                FailureClass::Timeout,
                "not sent: the publish deadline passed while waiting for a request slot",
            )
            .deferred()
            .into();
        }
        if !inner.secrets.is_empty() {
            // Any key: `.` and what a header cannot carry are percent-encoded.
            let id = webhook_id(&message.idempotency_key);
            let timestamp = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
            let signature = signature_header(&inner.secrets, &id, timestamp, &message.payload);
            for (name, value) in [
                (headers::WEBHOOK_ID, id.into_owned()),
                (headers::WEBHOOK_TIMESTAMP, timestamp.to_string()),
                (headers::WEBHOOK_SIGNATURE, signature),
            ] {
                match HeaderValue::from_str(&value) {
                    Ok(value) => request_headers.insert(name, value),
                    Err(_) => return unsendable(name),
                };
            }
        }

        sent.store(true, Ordering::Release);
        let response = inner
            .client
            .request(inner.method.clone(), inner.url.clone())
            .headers(request_headers)
            .body(message.payload.clone())
            .send()
            .await;
        match response {
            Ok(mut response) if response.status().is_success() => {
                // The status line is the acknowledgement: the body is not waited for. It is
                // read in the background, briefly, so the connection can be reused.
                let status = response.status();
                let cap = inner.max_response_body;
                tokio::spawn(async move {
                    let _ =
                        tokio::time::timeout(BODY_BUDGET, read_capped(&mut response, cap)).await;
                });
                classify_response(status, &HeaderMap::new(), &[], inner.limits)
            }
            Ok(mut response) => {
                // An error body only explains the failure: read what arrives within a
                // short budget, never wait for a trickling one.
                let status = response.status();
                let body = tokio::time::timeout(
                    BODY_BUDGET,
                    read_capped(&mut response, inner.max_response_body),
                )
                .await
                .unwrap_or_default();
                classify_response(status, response.headers(), &body, inner.limits)
            }
            Err(err) => Outcome::Failed(classify_error(&err)),
        }
    }
}

impl ReportingSink for HttpSink {
    /// Sends every message as its own request, concurrently except that messages sharing
    /// a partition key go one after another, and reports each outcome as its status line
    /// arrives.
    async fn publish_each(&self, batch: &[Message], cx: &PublishContext, outcomes: &Outcomes) {
        let mut lanes: Vec<Vec<usize>> = Vec::new();
        let mut keyed: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
        for (index, message) in batch.iter().enumerate() {
            match &message.partition_key {
                Some(key) => {
                    let lane = *keyed.entry(key).or_insert_with(|| {
                        lanes.push(Vec::new());
                        lanes.len() - 1
                    });
                    lanes[lane].push(index);
                }
                None => lanes.push(vec![index]),
            }
        }
        join_all(lanes.into_iter().map(|lane| async move {
            for index in lane {
                outcomes.report(index, self.deliver_by(&batch[index], cx).await);
            }
        }))
        .await;
    }
}

impl fmt::Debug for HttpSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpSink")
            .field("method", &self.inner.method)
            .field("url", &redact::url(self.inner.url.as_str()))
            .field("secrets", &self.inner.secrets.len())
            .finish_non_exhaustive()
    }
}

fn check_allow_rules(rules: &[AllowRule]) -> Result<(), HttpSinkError> {
    for rule in rules {
        let text = rule.to_string();
        if text.parse::<AllowRule>().as_ref() != Ok(rule) {
            return Err(HttpSinkError::config(
                "allow",
                format!(
                    "`{}` is not a CIDR block or host name",
                    text.trim_start_matches("invalid:")
                ),
            ));
        }
    }
    Ok(())
}

impl Inner {
    /// The message's headers, then the route's, then the sink's own.
    fn request_headers(&self, message: &Message) -> Result<HeaderMap, Failure> {
        let mut out = HeaderMap::new();
        for (name, value) in &message.headers {
            if headers::is_reserved(name) {
                return Err(Failure::permanent(
                    FailureClass::Serialization,
                    format!("message header `{name}` is reserved by the HTTP sink; rename it"),
                ));
            }
            let header = HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
                Failure::permanent(
                    FailureClass::Serialization,
                    format!(
                        "message header name `{}` is not a valid HTTP header name",
                        name.escape_debug()
                    ),
                )
            })?;
            let value = HeaderValue::from_bytes(value.as_bytes()).map_err(|_| {
                Failure::permanent(
                    FailureClass::Serialization,
                    format!("message header `{header}` has a value HTTP cannot carry (control characters)"),
                )
            })?;
            out.insert(header, value);
        }
        for (name, value) in &self.headers {
            out.insert(name.clone(), value.clone());
        }
        let attempt = message.attempts.max(1).to_string();
        let id = message.id.to_string();
        let fields = [
            (CONTENT_TYPE.as_str(), Some(message.content_type.as_str())),
            (
                headers::IDEMPOTENCY_KEY,
                Some(message.idempotency_key.as_str()),
            ),
            (headers::MESSAGE_ID, Some(id.as_str())),
            (headers::EVENT_TYPE, Some(message.event_type.as_str())),
            (headers::ATTEMPT, Some(attempt.as_str())),
            (headers::PARTITION_KEY, message.partition_key.as_deref()),
            (headers::TENANT_ID, message.tenant_id.as_deref()),
            (headers::AGGREGATE_TYPE, message.aggregate_type.as_deref()),
            (headers::AGGREGATE_ID, message.aggregate_id.as_deref()),
        ];
        for (name, value) in fields {
            if let Some(value) = value {
                let value = HeaderValue::from_bytes(value.as_bytes())
                    .map_err(|_| unsendable_failure(name))?;
                out.insert(name, value);
            }
        }
        Ok(out)
    }
}

fn unsendable_failure(header: &str) -> Failure {
    Failure::permanent(
        FailureClass::Serialization,
        format!("the value for header `{header}` contains characters HTTP cannot carry"),
    )
}

fn unsendable(header: &str) -> Outcome {
    unsendable_failure(header).into()
}

/// How long a response body is read after its status line arrived.
const BODY_BUDGET: Duration = Duration::from_secs(1);

/// Reads at most `cap` bytes of the body; errors end the read (what was read is kept).
async fn read_capped(response: &mut reqwest::Response, cap: usize) -> Vec<u8> {
    let mut body = Vec::new();
    while body.len() < cap {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                let take = chunk.len().min(cap - body.len());
                body.extend_from_slice(&chunk[..take]);
            }
            Ok(None) | Err(_) => break,
        }
    }
    body
}
