//! The axum extractor for verified webhooks.

use axum::extract::{FromRef, FromRequest, Request};
use axum::response::{IntoResponse, Response};
use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use http::HeaderMap;

use crate::{ReceiveError, Webhook, WebhookReceiver};

/// An axum extractor for a verified Standard Webhooks request. It reads the body (up
/// to the receiver's `max_body`) and verifies it with the [`WebhookReceiver`] in your
/// state; a bad request is rejected with [`ReceiveError::status`] before your handler
/// runs. It consumes the body, so it must be the last extractor.
///
/// ```no_run
/// # mod demo {
/// use axum::extract::{FromRef, State};
/// use axum::http::StatusCode;
/// use outbox_receiver::{WebhookReceiver, WebhookRequest};
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
        let limit = receiver.max_body_limit();
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
        let timeout = receiver.body_timeout_limit();
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
