//! Shared by the CLI tests: the consumers (from the battery crate) and a tiny HTTP client.
#![allow(dead_code, unused_imports, unreachable_pub)]

use std::time::Duration;

pub use outbox_battery::consumers::{
    Received, amqp_consumer, delete_amqp_queue, kafka_consumer, recording_receiver, sqs_consumer,
};

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
