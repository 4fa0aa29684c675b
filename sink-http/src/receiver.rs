//! The receiving side: verify a Standard Webhooks request and deduplicate it with an
//! inbox, inside the receiver's own database transaction.
//!
//! Delivery is at-least-once, so a receiver sees some messages twice (a relay crashed
//! after sending, a reply got lost, an endpoint answered 500 after committing). The
//! recipe for exactly one side effect per message:
//!
//! 1. Verify the signature and timestamp **before** touching the database, so that
//!    unauthenticated requests cannot fill the inbox.
//! 2. In one transaction: record the signed `webhook-id` in the inbox, apply the side
//!    effect only if the record is new, commit.
//! 3. Answer 2xx only after the commit. If anything fails, answer an error: the sender
//!    retries, and the inbox turns the retry into a no-op if the first try committed.
//!
//! [`WebhookReceiver::receive`] does steps 1 and 2a in one call:
//!
//! ```no_run
//! # #[cfg(feature = "receiver-postgres")]
//! # async fn handle(
//! #     pool: sqlx::PgPool,
//! #     headers: http::HeaderMap,
//! #     body: bytes::Bytes,
//! # ) -> Result<http::StatusCode, Box<dyn std::error::Error>> {
//! use outbox_sink_http::receiver::WebhookReceiver;
//! use outbox_sqlx::postgres::PgInbox;
//!
//! let receiver = WebhookReceiver::from_secrets(["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"])?
//!     .consumer("billing");
//! let inbox = PgInbox::new();
//!
//! let mut tx = pool.begin().await?;
//! let received = match receiver.receive(&inbox, &mut tx, &headers, &body).await {
//!     Ok(received) => received,
//!     Err(e) => return Ok(e.status()), // 401 bad signature, 413 too large, 503 database…
//! };
//! if received.is_new() {
//!     sqlx::query("UPDATE invoices SET paid = true WHERE id = $1")
//!         .bind(42_i64)
//!         .execute(&mut *tx)
//!         .await?;
//! }
//! tx.commit().await?;
//! Ok(http::StatusCode::NO_CONTENT)
//! # }
//! ```
//!
//! With the `axum` feature, [`WebhookRequest`] is an extractor that does step 1 and
//! rejects bad requests with the right status; [`WebhookReceiver::record`] then does
//! step 2a.
//!
//! Inboxes for PostgreSQL, SQLite and MySQL/MariaDB (from `outbox-sqlx`) implement
//! [`Inbox`] behind the features `receiver-postgres`, `receiver-sqlite` and
//! `receiver-mysql`; implement it for your own store if you use another.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{HeaderMap, StatusCode};
use outbox_engine::webhooks::{Secret, SecretError, Verifier, VerifyError};
use outbox_engine::{StoreError, StoreErrorKind};

use crate::headers;

/// Default largest request body a receiver reads: 1 MiB (the default outbox payload
/// limit).
pub const DEFAULT_MAX_BODY: usize = 1024 * 1024;

/// How long the axum extractor waits for a request body by default.
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(10);

/// Records deliveries inside the receiver's transaction: the dedupe table.
///
/// ```
/// use std::collections::HashSet;
/// use std::sync::Mutex;
/// use outbox_engine::StoreError;
/// use outbox_sink_http::receiver::Inbox;
///
/// /// An in-memory inbox for tests; the "connection" is unused.
/// struct MemoryInbox(Mutex<HashSet<(String, String)>>);
///
/// impl Inbox for MemoryInbox {
///     type Connection = ();
///
///     async fn record_delivery(&self, _: &mut (), consumer: &str, id: &str) -> Result<bool, StoreError> {
///         Ok(self.0.lock().unwrap().insert((consumer.to_owned(), id.to_owned())))
///     }
/// }
/// ```
pub trait Inbox: Send + Sync {
    /// The connection (usually a transaction derefs to it) the record is written on.
    type Connection: Send;

    /// Records `(consumer, id)`; `true` when it was not recorded before.
    fn record_delivery(
        &self,
        conn: &mut Self::Connection,
        consumer: &str,
        id: &str,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;
}

#[cfg(feature = "receiver-postgres")]
impl Inbox for outbox_sqlx::postgres::PgInbox {
    type Connection = sqlx::PgConnection;

    async fn record_delivery(
        &self,
        conn: &mut sqlx::PgConnection,
        consumer: &str,
        id: &str,
    ) -> Result<bool, StoreError> {
        Ok(self.record(conn, consumer, id).await?.is_new())
    }
}

#[cfg(feature = "receiver-sqlite")]
impl Inbox for outbox_sqlx::sqlite::SqliteInbox {
    type Connection = sqlx::SqliteConnection;

    async fn record_delivery(
        &self,
        conn: &mut sqlx::SqliteConnection,
        consumer: &str,
        id: &str,
    ) -> Result<bool, StoreError> {
        Ok(self.record(conn, consumer, id).await?.is_new())
    }
}

#[cfg(feature = "receiver-mysql")]
impl Inbox for outbox_sqlx::mysql::MySqlInbox {
    type Connection = sqlx::MySqlConnection;

    async fn record_delivery(
        &self,
        conn: &mut sqlx::MySqlConnection,
        consumer: &str,
        id: &str,
    ) -> Result<bool, StoreError> {
        Ok(self.record(conn, consumer, id).await?.is_new())
    }
}

/// A verified webhook: its signed identity plus the sink's informational headers.
///
/// Returned by [`WebhookReceiver::verify`]; see the example there.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Webhook {
    /// The signed `webhook-id`: the message's idempotency key. Deduplicate on this.
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
/// #     receiver: outbox_sink_http::receiver::WebhookReceiver,
/// #     inbox: impl outbox_sink_http::receiver::Inbox<Connection = ()>,
/// #     headers: http::HeaderMap,
/// #     body: &[u8],
/// # ) -> Result<(), outbox_sink_http::receiver::ReceiveError> {
/// use outbox_sink_http::receiver::Received;
///
/// match receiver.receive(&inbox, &mut (), &headers, body).await? {
///     Received::New(webhook) => println!("apply {} once", webhook.id),
///     Received::Duplicate(webhook) => println!("{} again: acknowledge, do nothing", webhook.id),
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Received {
    /// First delivery: apply the side effect in the same transaction, then commit.
    New(Webhook),
    /// Already recorded by a committed earlier delivery: skip the side effect, answer 2xx.
    Duplicate(Webhook),
}

impl Received {
    /// `true` for [`Received::New`].
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
    /// use outbox_sink_http::receiver::ReceiveError;
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
/// use outbox_sink_http::receiver::WebhookReceiver;
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
            id: verified.id.to_owned(),
            timestamp: verified.timestamp,
            message_id: text(headers::MESSAGE_ID),
            event_type: text(headers::EVENT_TYPE),
            attempt: lookup(headers::ATTEMPT).and_then(|a| a.parse().ok()),
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
    ) -> Result<Received, ReceiveError> {
        let new = inbox
            .record_delivery(conn, &self.inner.consumer, &webhook.id)
            .await?;
        Ok(if new {
            Received::New(webhook)
        } else {
            Received::Duplicate(webhook)
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
    ) -> Result<Received, ReceiveError> {
        let webhook = self.verify(headers, body)?;
        self.record(inbox, conn, webhook).await
    }
}

#[cfg(feature = "axum")]
pub use extract::WebhookRequest;

#[cfg(feature = "axum")]
mod extract {
    use axum::extract::{FromRef, FromRequest, Request};
    use axum::response::{IntoResponse, Response};
    use bytes::{Bytes, BytesMut};
    use futures_util::StreamExt;
    use http::HeaderMap;

    use super::{ReceiveError, Webhook, WebhookReceiver};

    /// An axum extractor for a verified Standard Webhooks request. It reads the body (up
    /// to the receiver's `max_body`) and verifies it with the [`WebhookReceiver`] in your
    /// state; a bad request is rejected with [`ReceiveError::status`] before your handler
    /// runs. It consumes the body, so it must be the last extractor.
    ///
    /// ```no_run
    /// # #[cfg(feature = "receiver-postgres")]
    /// # mod demo {
    /// use axum::extract::{FromRef, State};
    /// use axum::http::StatusCode;
    /// use outbox_sink_http::receiver::{WebhookReceiver, WebhookRequest};
    /// use outbox_sqlx::postgres::PgInbox;
    ///
    /// #[derive(Clone)]
    /// struct App {
    ///     pool: sqlx::PgPool,
    ///     receiver: WebhookReceiver,
    ///     inbox: PgInbox,
    /// }
    ///
    /// impl FromRef<App> for WebhookReceiver {
    ///     fn from_ref(app: &App) -> Self {
    ///         app.receiver.clone()
    ///     }
    /// }
    ///
    /// async fn invoice_paid(State(app): State<App>, request: WebhookRequest) -> Result<StatusCode, StatusCode> {
    ///     let error = |_| StatusCode::SERVICE_UNAVAILABLE;
    ///     let mut tx = app.pool.begin().await.map_err(error)?;
    ///     let received = app.receiver.record(&app.inbox, &mut tx, request.webhook).await.map_err(|e| e.status())?;
    ///     if received.is_new() {
    ///         // Apply the side effect with `&mut *tx`, using `request.body`.
    ///     }
    ///     tx.commit().await.map_err(error)?;
    ///     Ok(StatusCode::NO_CONTENT)
    /// }
    /// # }
    /// ```
    #[derive(Debug, Clone)]
    #[non_exhaustive]
    pub struct WebhookRequest {
        /// The verified identity.
        pub webhook: Webhook,
        /// The request headers.
        pub headers: HeaderMap,
        /// The raw body (what was signed).
        pub body: Bytes,
    }

    impl<S> FromRequest<S> for WebhookRequest
    where
        S: Send + Sync,
        WebhookReceiver: FromRef<S>,
    {
        type Rejection = ReceiveError;

        async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
            let receiver = WebhookReceiver::from_ref(state);
            let limit = receiver.inner.max_body;
            let (parts, body) = request.into_parts();
            // A declared length over the limit is refused before reading anything.
            let declared = parts
                .headers
                .get(http::header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok());
            if declared.is_some_and(|n| n > limit as u64) {
                return Err(ReceiveError::BodyTooLarge { limit });
            }
            let read = async {
                let mut stream = body.into_data_stream();
                let mut buffer = BytesMut::new();
                while let Some(chunk) = stream.next().await {
                    let chunk = chunk.map_err(|e| ReceiveError::Body(e.to_string()))?;
                    if buffer.len() + chunk.len() > limit {
                        return Err(ReceiveError::BodyTooLarge { limit });
                    }
                    buffer.extend_from_slice(&chunk);
                }
                Ok(buffer.freeze())
            };
            let timeout = receiver.inner.body_timeout;
            let body = tokio::time::timeout(timeout, read)
                .await
                .map_err(|_| ReceiveError::BodyTimeout(timeout))??;
            let webhook = receiver.verify(&parts.headers, &body)?;
            Ok(Self {
                webhook,
                headers: parts.headers,
                body,
            })
        }
    }

    impl IntoResponse for ReceiveError {
        fn into_response(self) -> Response {
            (self.status(), self.to_string()).into_response()
        }
    }
}
