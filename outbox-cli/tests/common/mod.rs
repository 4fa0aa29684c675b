//! Shared by the CLI tests: a webhook receiver that records what it is sent.
#![allow(dead_code, unreachable_pub)]

use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Every `outbox-message-id` received, in arrival order (duplicates included).
pub type Received = Arc<Mutex<Vec<String>>>;

/// Starts a receiver on loopback that records each request's `outbox-message-id` on
/// arrival and answers 204 after a random delay in `delay_ms`. Returns its URL.
pub async fn recording_receiver(delay_ms: Range<u64>) -> (String, Received) {
    let got: Received = Arc::default();
    let record = got.clone();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |headers: axum::http::HeaderMap| {
            let record = record.clone();
            let delay = delay_ms.clone();
            async move {
                let id = headers
                    .get("outbox-message-id")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_owned();
                record.lock().unwrap().push(id);
                if !delay.is_empty() {
                    tokio::time::sleep(Duration::from_millis(fastrand::u64(delay))).await;
                }
                axum::http::StatusCode::NO_CONTENT
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, got)
}
