//! A shop's first hour with the outbox on SQLite: each order is committed with its
//! `order.placed` message in one transaction; a relay appends the messages to a Redis
//! stream (the route is a URL); the shipping consumer reads the stream in a consumer
//! group and creates one shipment per order, whatever the stream redelivers.

use std::error::Error;

use outbox::prelude::*;
use outbox::redis::client::AsyncCommands;
use outbox::redis::client::aio::MultiplexedConnection;
use outbox::redis::client::streams::{StreamId, StreamReadOptions, StreamReadReply};
use outbox::sqlite::{SqliteInbox, SqliteOutbox};
use outbox::sqlx::{self, SqlitePool};
use outbox::{Delivery, NewMessage, Outbox};

/// What this example's functions fail with.
pub type BoxError = Box<dyn Error + Send + Sync>;

/// Places order `id`: the order and its message commit together, or (with `commit`
/// false) roll back together, and nothing is ever sent for them.
///
/// # Errors
///
/// The database's error.
pub async fn place_order(
    pool: &SqlitePool,
    outbox: &SqliteOutbox,
    id: i64,
    commit: bool,
) -> Result<(), BoxError> {
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
    sqlx::query("INSERT INTO orders (id, status) VALUES (?1, 'placed')")
        .bind(id)
        .execute(&mut *tx)
        .await?;
    let message = NewMessage::builder("orders", "order.placed")
        .idempotency_key(format!("order-{id}:placed"))
        .json(&serde_json::json!({ "order": id }))
        .build()?;
    outbox.enqueue(&mut tx, &message).await?;
    if commit {
        tx.commit().await?;
        outbox.notify().await?; // the relay in this process claims now
    } else {
        tx.rollback().await?;
    }
    Ok(())
}

/// The relay: the `orders` destination goes to the Redis stream `stream`.
///
/// # Errors
///
/// An invalid route, or Redis refusing the connection.
pub async fn relay(outbox: SqliteOutbox, redis: &str, stream: &str) -> Result<Outbox, BoxError> {
    Ok(Outbox::builder(outbox)
        .route_url("orders", format!("{redis}?stream={stream}"))
        .build()
        .await?)
}

/// The shipping service: a consumer of the stream's group, deduplicating in its own
/// SQLite database.
pub struct Shipping {
    pub redis: MultiplexedConnection,
    pub pool: SqlitePool,
    pub inbox: SqliteInbox,
    pub stream: String,
    pub group: String,
}

impl Shipping {
    /// Reads what the group has not seen yet, handles each entry and acknowledges it;
    /// returns how many entries it read.
    ///
    /// # Errors
    ///
    /// Redis's or the database's error, or an entry that is not an outbox message.
    pub async fn poll(&mut self) -> Result<usize, BoxError> {
        let options = StreamReadOptions::default()
            .group(&self.group, "shipping-1")
            .count(100);
        let reply: StreamReadReply = self
            .redis
            .xread_options(&[&self.stream], &[">"], &options)
            .await?;
        let entries: Vec<StreamId> = reply.keys.into_iter().flat_map(|key| key.ids).collect();
        for entry in &entries {
            self.handle(entry).await?;
            let _: i64 = self
                .redis
                .xack(&self.stream, &self.group, &[&entry.id])
                .await?;
        }
        Ok(entries.len())
    }

    /// Creates the shipment of one entry, unless the inbox has seen its message.
    ///
    /// # Errors
    ///
    /// The database's error, or an entry that is not an outbox message.
    pub async fn handle(&self, entry: &StreamId) -> Result<Delivery, BoxError> {
        let received = outbox::redis::read_stream_entry(entry)?;
        let order = serde_json::from_slice::<serde_json::Value>(&received.payload)?["order"]
            .as_i64()
            .ok_or("an order.placed message without an order")?;
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let delivery = self
            .inbox
            .record(&mut tx, "shipping", &received.idempotency_key)
            .await?;
        if delivery == Delivery::New {
            sqlx::query("INSERT INTO shipments (order_id) VALUES (?1)")
                .bind(order)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(delivery)
    }
}
