//! Shared by the CLI tests: the relay command, the consumers (from the battery crate), a
//! tiny HTTP client, and rows left published, dead or pending.
#![allow(dead_code, unused_imports, unreachable_pub)]

use std::time::Duration;

use outbox::postgres::PgOutbox;
use outbox::{ClaimRequest, Completion, NewMessage, Store};

pub use outbox_battery::consumers::{
    Received, amqp_consumer, delete_amqp_queue, delete_nats_stream, kafka_consumer, mqtt_consumer,
    nats_consumer, recording_receiver, sqs_consumer,
};

/// `outbox --config <config> relay`, ignoring any `OUTBOX_CONFIG` in the environment.
pub fn relay_command(config: &std::path::Path) -> std::process::Command {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_outbox"));
    command
        .arg("--config")
        .arg(config)
        .arg("relay")
        .env_remove("OUTBOX_CONFIG");
    command
}

/// A webhook receiver that counts what it gets and answers 204: its URL and the count.
pub async fn counting_receiver() -> (String, std::sync::Arc<std::sync::atomic::AtomicU64>) {
    use std::sync::atomic::{AtomicU64, Ordering};
    let count = std::sync::Arc::new(AtomicU64::new(0));
    let counted = count.clone();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move || {
            let counted = counted.clone();
            async move {
                counted.fetch_add(1, Ordering::SeqCst);
                axum::http::StatusCode::NO_CONTENT
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, count)
}

/// The whole response, or an empty string when the relay does not answer (yet).
pub async fn http_get(addr: &str, path: &str) -> String {
    http(
        addr,
        &format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"),
    )
    .await
}

/// Sends `request` (head and body, as written) to `addr` and returns the whole answer;
/// empty when the connection fails or 5 s pass.
pub async fn http(addr: &str, request: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let exchange = async {
        let mut socket = tokio::net::TcpStream::connect(addr).await?;
        socket.write_all(request.as_bytes()).await?;
        let mut response = String::new();
        socket.read_to_string(&mut response).await?;
        std::io::Result::Ok(response)
    };
    match tokio::time::timeout(Duration::from_secs(5), exchange).await {
        Ok(Ok(response)) => response,
        _ => String::new(),
    }
}

/// Where [`settle`] leaves a message.
#[derive(Debug, Clone, Copy)]
pub enum Fate<'a> {
    Published,
    /// Dead, for this reason.
    Dead(&'a str),
    /// Claimed, then released: pending again.
    Pending,
    /// Failed for this reason, tried again in ten minutes.
    Retry(&'a str),
    /// Still leased by the seeding claim (a minute).
    Leased,
}

/// Commits `messages` in one transaction, claims them all, and leaves each as its fate
/// (`fates[i]` for `messages[i]`) says.
pub async fn settle(outbox: &PgOutbox, messages: &[NewMessage], fates: &[Fate<'_>]) {
    assert_eq!(messages.len(), fates.len(), "one fate per message");
    let mut tx = outbox.pool().begin().await.unwrap();
    outbox.enqueue_all(&mut tx, messages).await.unwrap();
    tx.commit().await.unwrap();
    let claim = outbox
        .claim(&ClaimRequest::new(
            "seed",
            messages.len(),
            Duration::from_secs(60),
        ))
        .await
        .unwrap();
    assert_eq!(
        claim.messages.len(),
        messages.len(),
        "every message claimed"
    );
    let (mut finished, mut pending) = (Vec::new(), Vec::new());
    for (message, fate) in messages.iter().zip(fates) {
        match fate {
            Fate::Published => finished.push(Completion::published(message.id())),
            Fate::Dead(reason) => finished.push(Completion::dead(message.id(), *reason)),
            Fate::Pending => pending.push(message.id()),
            Fate::Retry(reason) => finished.push(Completion::retry(
                message.id(),
                Duration::from_secs(600),
                *reason,
            )),
            Fate::Leased => {}
        }
    }
    if !finished.is_empty() {
        outbox.complete(claim.lease.token, &finished).await.unwrap();
    }
    if !pending.is_empty() {
        outbox.release(claim.lease.token, &pending).await.unwrap();
    }
}
