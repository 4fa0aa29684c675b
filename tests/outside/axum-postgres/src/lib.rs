//! An order service's first hour with the outbox: `POST /orders/{id}/pay` marks the order
//! paid and enqueues `order.paid` in the same PostgreSQL transaction; a relay delivers
//! it as a signed webhook to billing, whose handler records it in an inbox and creates
//! the invoice only for a delivery it has not seen.

use axum::Router;
use axum::extract::{FromRef, Path, State};
use axum::http::StatusCode;
use axum::routing::post;
use outbox::http::{HttpSink, HttpSinkConfig};
use outbox::postgres::{PgInbox, PgOutbox};
use outbox::receiver::{WebhookReceiver, WebhookRequest};
use outbox::sqlx::{self, PgPool};
use outbox::{NewMessage, Outbox};

/// The shop's state: its pool and the outbox it writes to.
#[derive(Clone)]
pub struct Shop {
    pub pool: PgPool,
    pub outbox: PgOutbox,
}

/// The shop's API.
pub fn shop(shop: Shop) -> Router {
    Router::new()
        .route("/orders/{id}/pay", post(pay))
        .with_state(shop)
}

async fn pay(State(shop): State<Shop>, Path(id): Path<i64>) -> Result<StatusCode, StatusCode> {
    let mut tx = shop.pool.begin().await.map_err(unavailable)?;
    let paid =
        sqlx::query("UPDATE shop_orders SET status = 'paid' WHERE id = $1 AND status = 'new'")
            .bind(id)
            .execute(&mut *tx)
            .await
            .map_err(unavailable)?;
    if paid.rows_affected() == 0 {
        return Ok(StatusCode::CONFLICT);
    }
    let message = NewMessage::builder("billing", "order.paid")
        .idempotency_key(format!("order-{id}:paid"))
        .json(&serde_json::json!({ "order": id }))
        .build()
        .map_err(|_| StatusCode::INTERNAL_SERVER_ERROR)?;
    shop.outbox
        .enqueue(&mut tx, &message)
        .await
        .map_err(unavailable)?;
    tx.commit().await.map_err(unavailable)?;
    // Wakes the relay now; without it the relay's poll finds the row a moment later.
    let _ = shop.outbox.notify().await;
    Ok(StatusCode::ACCEPTED)
}

/// The relay: the `billing` destination goes to `webhook`, signed with `secret`.
///
/// # Errors
///
/// An invalid webhook URL or secret, or the store's error when it starts listening.
pub async fn relay(
    outbox: PgOutbox,
    webhook: &str,
    secret: &str,
) -> Result<Outbox, Box<dyn std::error::Error + Send + Sync>> {
    // The receiver runs on this machine: loopback must be allowed explicitly.
    let sink = HttpSink::new(
        HttpSinkConfig::new(webhook)
            .secret(secret)
            .allow("127.0.0.1"),
    )?;
    Ok(Outbox::builder(outbox)
        .route("billing", sink)
        .build()
        .await?)
}

/// Billing's state: its pool, the webhook receiver and its inbox.
#[derive(Clone)]
pub struct Billing {
    pub pool: PgPool,
    pub receiver: WebhookReceiver,
    pub inbox: PgInbox,
}

impl FromRef<Billing> for WebhookReceiver {
    fn from_ref(billing: &Billing) -> Self {
        billing.receiver.clone()
    }
}

/// Billing's webhook endpoint.
pub fn billing(billing: Billing) -> Router {
    Router::new()
        .route("/hooks/billing", post(order_paid))
        .with_state(billing)
}

async fn order_paid(
    State(billing): State<Billing>,
    request: WebhookRequest,
) -> Result<StatusCode, StatusCode> {
    let order = serde_json::from_slice::<serde_json::Value>(&request.body)
        .ok()
        .and_then(|body| body["order"].as_i64())
        .ok_or(StatusCode::UNPROCESSABLE_ENTITY)?;
    let mut tx = billing.pool.begin().await.map_err(unavailable)?;
    let receipt = billing
        .receiver
        .record(&billing.inbox, &mut tx, request.webhook)
        .await
        .map_err(|e| e.status())?;
    if receipt.is_new() {
        sqlx::query("INSERT INTO invoices (order_id) VALUES ($1)")
            .bind(order)
            .execute(&mut *tx)
            .await
            .map_err(unavailable)?;
    }
    tx.commit().await.map_err(unavailable)?;
    Ok(StatusCode::NO_CONTENT)
}

/// A database that failed: the client may try again.
fn unavailable<E>(_: E) -> StatusCode {
    StatusCode::SERVICE_UNAVAILABLE
}
