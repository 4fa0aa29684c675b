//! The [`Sink`] implementation: one request per message, classified per message.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::future::join_all;
use outbox_core::webhooks::{Secret, is_signable_id, signature_header};
use outbox_core::{
    DynSink, Failure, FailureClass, Message, Outcome, Outcomes, RelayBuilder, Sink, Store, gather,
};
use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use reqwest::{Method, Url};
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tracing::{info, warn};

use crate::circuit::{Circuit, CircuitState, EndpointHealth, Refusal};
use crate::config::{EndpointConfig, HttpSinkConfig, redacted_url};
use crate::error::{ConfigError, Limits, classify_error, classify_response};
use crate::headers;
use crate::rate::RateLimiter;
use crate::ssrf::{AllowRule, GuardedResolver, Lookup, SystemLookup};

/// Delivers outbox messages as HTTP requests: webhooks (signed with Standard Webhooks)
/// and third-party HTTP APIs.
///
/// One sink serves any number of routes (destination → endpoint). Each endpoint has its
/// own connection pool, concurrency limit, rate limit and circuit breaker. Build it from
/// an [`HttpSinkConfig`] and hand it to the relay with [`register`](Self::register).
///
/// # What one publish does
///
/// Messages of a batch go out concurrently, except that messages with the same
/// destination and partition key go one after another in batch order. For each message:
///
/// 1. An unknown destination fails permanently (`UnknownDestination`); headers that
///    HTTP cannot carry fail permanently (`Serialization`).
/// 2. An open circuit or a `Retry-After` pause fails it retryably without a request.
/// 3. It waits for one of the endpoint's concurrency slots, then for its rate-limit
///    slot (at most `max_wait`; otherwise it is not sent and fails retryably).
/// 4. It is signed (when the route has secrets) and sent; the answer is classified (see
///    [`error`](crate::error) for the table) and fed to the circuit breaker.
///
/// Everything happens before the sink's `publish_deadline`; a message without a reply by
/// then fails retryably with class `Timeout`.
///
/// ```no_run
/// # async fn run(store: outbox_core::MemoryStore) -> Result<(), Box<dyn std::error::Error>> {
/// use outbox_core::Relay;
/// use outbox_sink_http::{EndpointConfig, HttpSinkConfig};
///
/// let sink = HttpSinkConfig::new()
///     .route("orders", EndpointConfig::new("https://hooks.example.com/orders")
///         .secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"))
///     .route("invoices", EndpointConfig::new("https://billing.example.com/hooks"))
///     .build()?;
/// let relay = sink.register(Relay::builder(store)).build()?;
/// relay.drain().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct HttpSink {
    inner: Arc<Inner>,
}

struct Inner {
    endpoints: BTreeMap<String, Endpoint>,
    deadline: Duration,
    max_response_body: usize,
    limits: Limits,
}

struct Endpoint {
    destination: String,
    client: reqwest::Client,
    method: Method,
    url: Url,
    headers: HeaderMap,
    secrets: Vec<Secret>,
    rate: Option<RateLimiter>,
    slots: Semaphore,
    circuit: Circuit,
    circuit_failures: u32,
}

impl HttpSink {
    /// A new configuration to build a sink from; the same as [`HttpSinkConfig::new`].
    pub fn builder() -> HttpSinkConfig {
        HttpSinkConfig::new()
    }

    pub(crate) fn from_config(config: HttpSinkConfig) -> Result<Self, ConfigError> {
        if config.routes.is_empty() {
            return Err(ConfigError::sink(
                "routes",
                "no routes: add one with `route(destination, endpoint)`",
            ));
        }
        for (setting, value) in [
            ("publish_deadline", config.publish_deadline),
            ("connect_timeout", config.connect_timeout),
        ] {
            if value.is_zero() {
                return Err(ConfigError::sink(setting, "must be greater than zero"));
            }
        }
        HeaderValue::from_str(&config.user_agent)
            .map_err(|_| ConfigError::sink("user_agent", "not a valid header value"))?;
        check_allow_rules(None, &config.ssrf.allow)?;
        let lookup: Arc<dyn Lookup> = config
            .lookup
            .clone()
            .unwrap_or_else(|| Arc::new(SystemLookup));
        let mut endpoints = BTreeMap::new();
        for (destination, endpoint) in &config.routes {
            let built = Endpoint::build(destination, endpoint, &config, &lookup)?;
            endpoints.insert(destination.clone(), built);
        }
        Ok(Self {
            inner: Arc::new(Inner {
                endpoints,
                deadline: config.publish_deadline,
                max_response_body: config.max_response_body,
                limits: Limits {
                    max_error_body: config.max_error_body.min(config.max_response_body),
                    max_retry_after: config.max_retry_after,
                },
            }),
        })
    }

    /// The destinations this sink has endpoints for.
    ///
    /// ```
    /// use outbox_sink_http::{EndpointConfig, HttpSinkConfig};
    ///
    /// let sink = HttpSinkConfig::new()
    ///     .route("b", EndpointConfig::new("https://b.example.com/"))
    ///     .route("a", EndpointConfig::new("https://a.example.com/"))
    ///     .build()?;
    /// assert_eq!(sink.destinations().collect::<Vec<_>>(), ["a", "b"]);
    /// # Ok::<(), outbox_sink_http::ConfigError>(())
    /// ```
    pub fn destinations(&self) -> impl Iterator<Item = &str> {
        self.inner.endpoints.keys().map(String::as_str)
    }

    /// The health of `destination`'s endpoint: circuit state, failures in a row and any
    /// pause; `None` for an unknown destination.
    ///
    /// ```
    /// use outbox_sink_http::{CircuitState, EndpointConfig, HttpSinkConfig};
    ///
    /// let sink = HttpSinkConfig::new()
    ///     .route("orders", EndpointConfig::new("https://hooks.example.com/"))
    ///     .build()?;
    /// assert_eq!(sink.health("orders").unwrap().circuit, CircuitState::Closed);
    /// assert!(sink.health("nope").is_none());
    /// # Ok::<(), outbox_sink_http::ConfigError>(())
    /// ```
    pub fn health(&self, destination: &str) -> Option<EndpointHealth> {
        let endpoint = self.inner.endpoints.get(destination)?;
        Some(endpoint.circuit.health(Instant::now()))
    }

    /// Routes every destination of this sink to it in `relay`. All routes share this one
    /// sink, so a batch that mixes destinations is published in one concurrent call.
    ///
    /// ```
    /// use outbox_core::{MemoryStore, Relay};
    /// use outbox_sink_http::{EndpointConfig, HttpSinkConfig};
    ///
    /// let sink = HttpSinkConfig::new()
    ///     .route("orders", EndpointConfig::new("https://hooks.example.com/orders"))
    ///     .build()?;
    /// let relay = sink.register(Relay::builder(MemoryStore::new())).build()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn register<S: Store>(&self, relay: RelayBuilder<S>) -> RelayBuilder<S> {
        let shared: Arc<dyn DynSink> = Arc::new(self.clone());
        self.destinations().fold(relay, |relay, destination| {
            relay.route_dyn(destination, Arc::clone(&shared))
        })
    }

    async fn deliver_by(&self, message: &Message, deadline: Instant) -> Outcome {
        let Some(endpoint) = self.inner.endpoints.get(&message.destination) else {
            return Outcome::permanent(
                FailureClass::UnknownDestination,
                format!(
                    "the HTTP sink has no endpoint for destination `{}`",
                    message.destination
                ),
            );
        };
        let sent = AtomicBool::new(false);
        match tokio::time::timeout_at(deadline, self.deliver(endpoint, message, deadline, &sent))
            .await
        {
            Ok(outcome) => outcome,
            Err(_) if sent.load(Ordering::Acquire) => Outcome::retryable(
                FailureClass::Timeout,
                format!(
                    "no reply before the sink's publish deadline ({:?}); the request may have been delivered",
                    self.inner.deadline
                ),
            ),
            Err(_) => Failure::retryable(
                FailureClass::Timeout,
                format!(
                    "not sent: the sink's publish deadline ({:?}) passed while waiting for a concurrency slot",
                    self.inner.deadline
                ),
            )
            .deferred()
            .into(),
        }
    }

    async fn deliver(
        &self,
        endpoint: &Endpoint,
        message: &Message,
        deadline: Instant,
        sent: &AtomicBool,
    ) -> Outcome {
        let mut request_headers = match endpoint.request_headers(message) {
            Ok(headers) => headers,
            Err(failure) => return failure.into(),
        };
        if let Err(refusal) = endpoint.circuit.check(Instant::now()) {
            return endpoint.refused(refusal);
        }
        let Ok(_slot) = endpoint.slots.acquire().await else {
            return Outcome::retryable(
                FailureClass::Other,
                "the endpoint's concurrency limiter is closed",
            );
        };
        if let Some(rate) = &endpoint.rate {
            let now = Instant::now();
            match rate.reserve(now, deadline.saturating_duration_since(now)) {
                Ok(slot) => tokio::time::sleep_until(slot).await,
                Err(wait) => {
                    return Failure::retryable(
                        FailureClass::RateLimited,
                        format!(
                            "not sent: the route's rate limit has no slot for another {wait:?}"
                        ),
                    )
                    .with_retry_after(wait)
                    .deferred()
                    .into();
                }
            }
        }
        // The waits above can end exactly at the deadline (another message's cut-off
        // frees a slot); never start a request then.
        if Instant::now() >= deadline {
            return Failure::retryable(
                FailureClass::Timeout,
                format!(
                    "not sent: the sink's publish deadline ({:?}) passed while waiting for a slot",
                    self.inner.deadline
                ),
            )
            .deferred()
            .into();
        }
        let admission = match endpoint.circuit.admit(Instant::now()) {
            Ok(admission) => admission,
            Err(refusal) => return endpoint.refused(refusal),
        };
        if !endpoint.secrets.is_empty() {
            if !is_signable_id(&message.idempotency_key) {
                return Failure::permanent(
                    FailureClass::Serialization,
                    "the idempotency key contains `.`, which a Standard Webhooks `webhook-id` cannot carry (the signed content is `id.timestamp.body`)",
                )
                .into();
            }
            let timestamp = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
            let signature = signature_header(
                &endpoint.secrets,
                &message.idempotency_key,
                timestamp,
                &message.payload,
            );
            for (name, value) in [
                (headers::WEBHOOK_ID, message.idempotency_key.clone()),
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
        let response = endpoint
            .client
            .request(endpoint.method.clone(), endpoint.url.clone())
            .headers(request_headers)
            .body(message.payload.clone())
            .send()
            .await;
        let (outcome, reached) = match response {
            Ok(mut response) if response.status().is_success() => {
                // The status line is the acknowledgement: the body is not waited for. It is
                // read in the background, briefly, so the connection can be reused.
                let status = response.status();
                let cap = self.inner.max_response_body;
                tokio::spawn(async move {
                    let _ =
                        tokio::time::timeout(BODY_BUDGET, read_capped(&mut response, cap)).await;
                });
                (
                    classify_response(status, &HeaderMap::new(), &[], self.inner.limits),
                    true,
                )
            }
            Ok(mut response) => {
                // An error body only explains the failure: read what arrives within a
                // short budget, never wait for a trickling one.
                let status = response.status();
                let body = tokio::time::timeout(
                    BODY_BUDGET,
                    read_capped(&mut response, self.inner.max_response_body),
                )
                .await
                .unwrap_or_default();
                (
                    classify_response(status, response.headers(), &body, self.inner.limits),
                    true,
                )
            }
            Err(err) => {
                let failure = classify_error(&err);
                // The guard and the request builder refused before any connection: that
                // says nothing about the endpoint's health.
                let reached = failure.retryable;
                (Outcome::Failed(failure), reached)
            }
        };

        let now = Instant::now();
        if reached {
            let healthy = match &outcome {
                Outcome::Published { .. } => true,
                Outcome::Failed(failure) => {
                    if let (true, Some(delay)) = (failure.retryable, failure.retry_after) {
                        endpoint.circuit.pause(now, delay);
                    }
                    !failure.retryable
                }
            };
            match admission.record(healthy, now) {
                Some(CircuitState::Open) => warn!(
                    destination = %endpoint.destination,
                    "HTTP sink circuit opened after {} consecutive failures",
                    endpoint.circuit_failures
                ),
                Some(CircuitState::Closed) => {
                    info!(destination = %endpoint.destination, "HTTP sink circuit closed");
                }
                _ => {}
            }
        }
        outcome
    }
}

impl Sink for HttpSink {
    async fn publish(&self, batch: &[Message]) -> Result<Vec<Outcome>, Failure> {
        Ok(gather(batch.len(), |outcomes| async move {
            self.publish_reporting(batch, &outcomes).await;
        })
        .await)
    }

    /// Sends every message as its own request, concurrently except that messages sharing
    /// a destination and partition key go one after another, and reports each outcome as
    /// its response arrives.
    async fn publish_reporting(&self, batch: &[Message], outcomes: &Outcomes) {
        let deadline = Instant::now() + self.inner.deadline;
        // Lanes: messages sharing a destination and partition key go one after another.
        let mut lanes: Vec<Vec<usize>> = Vec::new();
        let mut keyed: HashMap<(&str, &str), usize> = HashMap::new();
        for (index, message) in batch.iter().enumerate() {
            match &message.partition_key {
                Some(key) => {
                    let lane = *keyed.entry((&message.destination, key)).or_insert_with(|| {
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
                outcomes.report(index, self.deliver_by(&batch[index], deadline).await);
            }
        }))
        .await;
    }
}

impl fmt::Debug for HttpSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let routes: BTreeMap<&str, String> = self
            .inner
            .endpoints
            .iter()
            .map(|(d, e)| {
                (
                    d.as_str(),
                    format!("{} {}", e.method, redacted_url(e.url.as_str())),
                )
            })
            .collect();
        f.debug_struct("HttpSink")
            .field("routes", &routes)
            .field("publish_deadline", &self.inner.deadline)
            .finish_non_exhaustive()
    }
}

fn check_allow_rules(route: Option<&str>, rules: &[AllowRule]) -> Result<(), ConfigError> {
    for rule in rules {
        let text = rule.to_string();
        if text.parse::<AllowRule>().as_ref() != Ok(rule) {
            let reason = format!(
                "`{}` is not a CIDR block or host name",
                text.trim_start_matches("invalid:")
            );
            return Err(match route {
                Some(route) => ConfigError::for_route(route, "allow", reason),
                None => ConfigError::sink("ssrf.allow", reason),
            });
        }
    }
    Ok(())
}

impl Endpoint {
    fn build(
        destination: &str,
        config: &EndpointConfig,
        sink: &HttpSinkConfig,
        lookup: &Arc<dyn Lookup>,
    ) -> Result<Self, ConfigError> {
        let err = |setting, reason: String| ConfigError::for_route(destination, setting, reason);
        if destination.is_empty() {
            return Err(ConfigError::sink("routes", "a destination name is empty"));
        }
        let url = Url::parse(&config.url).map_err(|e| err("url", format!("{e}")))?;
        match url.scheme() {
            "https" => {}
            "http" if !sink.require_https => {}
            "http" => return Err(err("url", "must be https (require_https is on)".to_owned())),
            _ => return Err(err("url", "the scheme must be http or https".to_owned())),
        }
        if url.host().is_none() {
            return Err(err("url", "has no host".to_owned()));
        }
        check_allow_rules(Some(destination), &config.allow)?;
        let policy = sink.ssrf.with_extra(&config.allow);
        if policy.enabled {
            policy
                .check_url(&url)
                .map_err(|e| err("url", e.to_string()))?;
        }

        let method = Method::from_bytes(config.method.to_ascii_uppercase().as_bytes())
            .ok()
            .filter(|m| [Method::POST, Method::PUT, Method::PATCH, Method::DELETE].contains(m))
            .ok_or_else(|| {
                err(
                    "method",
                    format!("`{}` is not POST, PUT, PATCH or DELETE", config.method),
                )
            })?;

        let mut headers = HeaderMap::new();
        for (name, value) in &config.headers {
            if headers::is_reserved(name) {
                return Err(err(
                    "headers",
                    format!("`{name}` is set by the sink and cannot be configured"),
                ));
            }
            let name = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| err("headers", format!("`{name}` is not a valid header name")))?;
            let mut value = HeaderValue::from_str(value).map_err(|_| {
                err(
                    "headers",
                    format!("the value of `{name}` is not a valid header value"),
                )
            })?;
            value.set_sensitive(true);
            headers.insert(name, value);
        }

        if config.timeout.is_zero() {
            return Err(err("timeout", "must be greater than zero".to_owned()));
        }
        let secrets = config
            .secrets
            .iter()
            .enumerate()
            .map(|(i, s)| {
                Secret::parse(s).map_err(|e| err("secrets", format!("secret {}: {e}", i + 1)))
            })
            .collect::<Result<Vec<_>, _>>()?;
        if secrets.is_empty() {
            // Legitimate for APIs that authenticate with a header, but easy to forget for
            // a webhook: say so once, at start-up.
            warn!(
                destination,
                "HTTP route has no secrets: its requests are sent unsigned (set `secrets` to sign them)"
            );
        }
        if let Some(rate) = &config.rate_limit {
            rate.validate().map_err(|e| err("rate_limit", e))?;
        }
        if !(1..=1024).contains(&config.concurrency) {
            return Err(err(
                "concurrency",
                format!("must be 1..=1024, got {}", config.concurrency),
            ));
        }
        if config.circuit.failures > 0 && config.circuit.cool_down.is_zero() {
            return Err(err(
                "circuit",
                "cool_down must be greater than zero".to_owned(),
            ));
        }

        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .referer(false)
            .user_agent(sink.user_agent.clone())
            .connect_timeout(sink.connect_timeout)
            .timeout(config.timeout)
            .pool_max_idle_per_host(config.concurrency)
            .https_only(sink.require_https)
            .dns_resolver(Arc::new(GuardedResolver::new(policy, Arc::clone(lookup))))
            .build()
            .map_err(|e| err("client", format!("the HTTP client could not be built: {e}")))?;

        Ok(Self {
            destination: destination.to_owned(),
            client,
            method,
            url,
            headers,
            secrets,
            rate: config.rate_limit.as_ref().map(RateLimiter::new),
            slots: Semaphore::new(config.concurrency),
            circuit: Circuit::new(config.circuit.clone()),
            circuit_failures: config.circuit.failures,
        })
    }

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

    fn refused(&self, refusal: Refusal) -> Outcome {
        match refusal {
            Refusal::Open { retry_after } => Failure::retryable(
                FailureClass::Unavailable,
                format!(
                    "not sent: the circuit breaker for this endpoint is open after {} consecutive failures; next probe in {retry_after:?}",
                    self.circuit_failures
                ),
            )
            .with_retry_after(retry_after)
            .deferred()
            .into(),
            Refusal::Paused { retry_after } => Failure::retryable(
                FailureClass::RateLimited,
                format!("not sent: the endpoint asked to wait (Retry-After) another {retry_after:?}"),
            )
            .with_retry_after(retry_after)
            .deferred()
            .into(),
        }
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
