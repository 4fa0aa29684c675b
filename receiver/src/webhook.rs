//! Standard Webhooks verification and the inbox step, for HTTP receivers.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{HeaderMap, StatusCode};
use outbox_engine::webhooks::{HEADER_ATTEMPT, HEADER_EVENT_TYPE, HEADER_MESSAGE_ID};
use outbox_engine::webhooks::{Secret, SecretError, Verifier, VerifyError, idempotency_key};
use outbox_engine::{Inbox, StoreError, StoreErrorKind};

/// Default largest request body a receiver reads: 1 MiB (the default outbox payload
/// limit).
pub const DEFAULT_MAX_BODY: usize = 1024 * 1024;

/// How long the axum extractor waits for a request body by default.
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(10);

/// A verified webhook: its signed identity plus the sink's informational headers.
///
/// Returned by [`WebhookReceiver::verify`]; see the example there.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Webhook {
    /// The message's idempotency key, from the signed `webhook-id` (which carries it
    /// percent-encoded where it holds `.`, `%` or what a header cannot carry; see
    /// `outbox_engine::webhooks::webhook_id`). Deduplicate on this.
    pub id: String,
    /// The signed `webhook-timestamp`, unix seconds.
    pub timestamp: i64,
    /// `outbox-message-id`, if sent (not covered by the signature).
    pub message_id: Option<String>,
    /// `outbox-event-type`, if sent (not covered by the signature).
    pub event_type: Option<String>,
    /// `outbox-attempt`, if sent (not covered by the signature).
    pub attempt: Option<u32>,
}

/// Whether a verified webhook is seen for the first time.
///
/// ```
/// # async fn demo(
/// #     receiver: outbox_receiver::WebhookReceiver,
/// #     inbox: impl outbox_engine::Inbox<Connection = ()>,
/// #     headers: http::HeaderMap,
/// #     body: &[u8],
/// # ) -> Result<(), outbox_receiver::ReceiveError> {
/// use outbox_receiver::Receipt;
///
/// match receiver.receive(&inbox, &mut (), &headers, body).await? {
///     Receipt::New(webhook) => println!("apply {} once", webhook.id),
///     Receipt::Duplicate(webhook) => println!("{} again: acknowledge, do nothing", webhook.id),
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Receipt {
    /// First delivery: apply the side effect in the same transaction, then commit.
    New(Webhook),
    /// Already recorded by a committed earlier delivery: skip the side effect, answer 2xx.
    Duplicate(Webhook),
}

impl Receipt {
    /// `true` for [`Receipt::New`].
    pub fn is_new(&self) -> bool {
        matches!(self, Self::New(_))
    }

    /// The webhook, either way.
    pub fn webhook(&self) -> &Webhook {
        match self {
            Self::New(w) | Self::Duplicate(w) => w,
        }
    }
}

/// Why a request was not accepted; [`status`](Self::status) is the HTTP answer to give.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReceiveError {
    /// The signature, timestamp or headers did not check out.
    #[error("webhook rejected: {0}")]
    Verify(#[from] VerifyError),
    /// The body is larger than the receiver reads.
    #[error("request body is larger than {limit} bytes")]
    BodyTooLarge {
        /// The limit in bytes.
        limit: usize,
    },
    /// The body could not be read.
    #[error("request body could not be read: {0}")]
    Body(String),
    /// The body did not arrive within the receiver's body timeout.
    #[error("request body did not arrive within {0:?}")]
    BodyTimeout(Duration),
    /// The inbox could not record the delivery.
    #[error("inbox: {0}")]
    Inbox(#[from] StoreError),
}

impl ReceiveError {
    /// The status to answer with. The HTTP sink dead-letters on a permanent 4xx and
    /// retries on 5xx, so receiver-side trouble (no secrets configured, a database
    /// error) answers 5xx and sender-side trouble (bad signature) answers 4xx.
    ///
    /// ```
    /// use http::StatusCode;
    /// use outbox_engine::webhooks::VerifyError;
    /// use outbox_receiver::ReceiveError;
    ///
    /// assert_eq!(ReceiveError::from(VerifyError::NoMatchingSignature).status(), StatusCode::UNAUTHORIZED);
    /// assert_eq!(ReceiveError::from(VerifyError::NoSecrets).status(), StatusCode::INTERNAL_SERVER_ERROR);
    /// ```
    pub fn status(&self) -> StatusCode {
        match self {
            Self::Verify(VerifyError::NoSecrets) => StatusCode::INTERNAL_SERVER_ERROR,
            Self::Verify(_) => StatusCode::UNAUTHORIZED,
            Self::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::Body(_) => StatusCode::BAD_REQUEST,
            Self::BodyTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            Self::Inbox(e) if e.is_retryable() => StatusCode::SERVICE_UNAVAILABLE,
            Self::Inbox(e) if e.kind() == StoreErrorKind::InvalidInput => StatusCode::BAD_REQUEST,
            Self::Inbox(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

/// Verifies Standard Webhooks requests and records them in an [`Inbox`].
///
/// Cheap to clone (the settings are shared).
///
/// ```
/// use std::time::Duration;
/// use outbox_engine::webhooks::{Secret, signature_header};
/// use outbox_receiver::WebhookReceiver;
///
/// let secret: Secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".parse()?;
/// let receiver = WebhookReceiver::new(vec![secret.clone()])?
///     .consumer("billing")
///     .tolerance(Duration::from_secs(60));
///
/// let body = br#"{"invoice":42}"#;
/// let mut headers = http::HeaderMap::new();
/// headers.insert("webhook-id", "key-1".parse()?);
/// headers.insert("webhook-timestamp", "1700000000".parse()?);
/// headers.insert("webhook-signature", signature_header(&[secret], "key-1", 1_700_000_000, body).parse()?);
/// headers.insert("outbox-event-type", "invoice.paid".parse()?);
///
/// let webhook = receiver.verify_at(&headers, body, 1_700_000_030)?;
/// assert_eq!(webhook.id, "key-1");
/// assert_eq!(webhook.event_type.as_deref(), Some("invoice.paid"));
/// assert!(receiver.verify_at(&headers, b"{}", 1_700_000_030).is_err());
/// assert!(receiver.verify_at(&headers, body, 1_700_000_100).is_err()); // too old
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct WebhookReceiver {
    inner: Arc<Settings>,
}

#[derive(Debug, Clone)]
struct Settings {
    verifier: Verifier,
    consumer: String,
    max_body: usize,
    body_timeout: Duration,
}

impl WebhookReceiver {
    /// Accepts requests signed with any of `secrets` (several during a rotation), within
    /// 5 minutes of their timestamp, as consumer `webhooks`, bodies up to
    /// [`DEFAULT_MAX_BODY`] that arrive within [`DEFAULT_BODY_TIMEOUT`].
    ///
    /// # Errors
    ///
    /// [`SecretError::NoSecrets`] when `secrets` is empty: such a receiver could only
    /// refuse every request.
    pub fn new(secrets: Vec<Secret>) -> Result<Self, SecretError> {
        if secrets.is_empty() {
            return Err(SecretError::NoSecrets);
        }
        Ok(Self {
            inner: Arc::new(Settings {
                verifier: Verifier::new(secrets),
                consumer: "webhooks".to_owned(),
                max_body: DEFAULT_MAX_BODY,
                body_timeout: DEFAULT_BODY_TIMEOUT,
            }),
        })
    }

    /// Like [`new`](Self::new), parsing `whsec_…` strings.
    ///
    /// # Errors
    ///
    /// The first secret that does not parse, or [`SecretError::NoSecrets`].
    pub fn from_secrets<S: AsRef<str>>(
        secrets: impl IntoIterator<Item = S>,
    ) -> Result<Self, SecretError> {
        let secrets = secrets
            .into_iter()
            .map(|s| Secret::parse(s.as_ref()))
            .collect::<Result<Vec<_>, _>>()?;
        Self::new(secrets)
    }

    /// Sets the consumer name the inbox records under. Two services (or two endpoints
    /// that must each act on the same event) need different names.
    #[must_use]
    pub fn consumer(mut self, consumer: impl Into<String>) -> Self {
        Arc::make_mut(&mut self.inner).consumer = consumer.into();
        self
    }

    /// Sets how far a timestamp may be from now (default 5 minutes).
    #[must_use]
    pub fn tolerance(mut self, tolerance: Duration) -> Self {
        let settings = Arc::make_mut(&mut self.inner);
        settings.verifier = settings.verifier.clone().tolerance(tolerance);
        self
    }

    /// Sets the largest body read (used by the axum extractor).
    #[must_use]
    pub fn max_body(mut self, bytes: usize) -> Self {
        Arc::make_mut(&mut self.inner).max_body = bytes;
        self
    }

    /// Sets how long the axum extractor waits for the whole body (default
    /// [`DEFAULT_BODY_TIMEOUT`]); a slower body is answered 408.
    #[must_use]
    pub fn body_timeout(mut self, timeout: Duration) -> Self {
        Arc::make_mut(&mut self.inner).body_timeout = timeout;
        self
    }

    /// The consumer name.
    pub fn consumer_name(&self) -> &str {
        &self.inner.consumer
    }

    /// The largest body read.
    pub fn max_body_limit(&self) -> usize {
        self.inner.max_body
    }

    /// How long the axum extractor waits for a body.
    pub fn body_timeout_limit(&self) -> Duration {
        self.inner.body_timeout
    }

    /// Verifies a request against the current time.
    ///
    /// # Errors
    ///
    /// [`ReceiveError::Verify`] or [`ReceiveError::BodyTooLarge`].
    pub fn verify(&self, headers: &HeaderMap, body: &[u8]) -> Result<Webhook, ReceiveError> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
        self.verify_at(headers, body, now)
    }

    /// Verifies a request as if the time were `now` (unix seconds).
    ///
    /// # Errors
    ///
    /// [`ReceiveError::Verify`] or [`ReceiveError::BodyTooLarge`].
    pub fn verify_at(
        &self,
        headers: &HeaderMap,
        body: &[u8],
        now: i64,
    ) -> Result<Webhook, ReceiveError> {
        if body.len() > self.inner.max_body {
            return Err(ReceiveError::BodyTooLarge {
                limit: self.inner.max_body,
            });
        }
        let lookup = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        let verified = self.inner.verifier.verify(lookup, body, now)?;
        let text = |name: &str| lookup(name).map(str::to_owned);
        Ok(Webhook {
            id: idempotency_key(verified.id).into_owned(),
            timestamp: verified.timestamp,
            message_id: text(HEADER_MESSAGE_ID),
            event_type: text(HEADER_EVENT_TYPE),
            attempt: lookup(HEADER_ATTEMPT).and_then(|a| a.parse().ok()),
        })
    }

    /// Records an already verified webhook in `inbox` on `conn` (your transaction).
    ///
    /// # Errors
    ///
    /// [`ReceiveError::Inbox`] when the inbox fails; roll back and answer
    /// [`status`](ReceiveError::status).
    pub async fn record<I: Inbox>(
        &self,
        inbox: &I,
        conn: &mut I::Connection,
        webhook: Webhook,
    ) -> Result<Receipt, ReceiveError> {
        let delivery = inbox
            .record(conn, &self.inner.consumer, &webhook.id)
            .await?;
        Ok(if delivery.is_new() {
            Receipt::New(webhook)
        } else {
            Receipt::Duplicate(webhook)
        })
    }

    /// Verifies the request, then records it in `inbox` on `conn` (your transaction):
    /// the one call a handler needs before applying its side effect.
    ///
    /// # Errors
    ///
    /// Any [`ReceiveError`]; nothing is written when verification fails.
    pub async fn receive<I: Inbox>(
        &self,
        inbox: &I,
        conn: &mut I::Connection,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Result<Receipt, ReceiveError> {
        let webhook = self.verify(headers, body)?;
        self.record(inbox, conn, webhook).await
    }
}
