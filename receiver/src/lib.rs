//! The receiving side of outbox webhooks: verify a Standard Webhooks request and
//! deduplicate it with an [`Inbox`](outbox_engine::Inbox) inside the receiver's own
//! database transaction. This crate has no HTTP client: a service that only receives
//! does not compile one.
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
//! # async fn handle(
//! #     pool: sqlx::PgPool,
//! #     headers: http::HeaderMap,
//! #     body: bytes::Bytes,
//! # ) -> Result<http::StatusCode, Box<dyn std::error::Error>> {
//! use outbox_receiver::WebhookReceiver;
//! use outbox_sqlx::postgres::PgInbox;
//!
//! let receiver = WebhookReceiver::from_secrets(["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"])?
//!     .consumer("billing");
//! let inbox = PgInbox::new();
//!
//! let mut tx = pool.begin().await?;
//! let receipt = match receiver.receive(&inbox, &mut tx, &headers, &body).await {
//!     Ok(receipt) => receipt,
//!     Err(e) => return Ok(e.status()), // 401 bad signature, 413 too large, 503 database…
//! };
//! if receipt.is_new() {
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
//! Any [`Inbox`](outbox_engine::Inbox) works: `outbox-sqlx` has one for PostgreSQL,
//! SQLite and MySQL/MariaDB, the test kit has an in-memory one. Consumers of the broker
//! sinks use the same inboxes with the `Received` helpers of those sinks' crates.

#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(feature = "axum")]
mod extract;
mod webhook;

#[cfg(feature = "axum")]
pub use extract::WebhookRequest;
pub use webhook::{
    DEFAULT_BODY_TIMEOUT, DEFAULT_MAX_BODY, Receipt, ReceiveError, Webhook, WebhookReceiver,
};
