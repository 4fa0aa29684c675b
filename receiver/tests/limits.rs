//! What the receiving side refuses up front: oversize and slow bodies (axum extractor),
//! missing or short secrets, and webhook ids that would make signatures ambiguous.

mod common;

use std::time::{Duration, Instant};

use axum::Router;
use axum::http::StatusCode;
use axum::routing::post;
use common::SECRET;
use outbox_engine::webhooks::{Secret, SecretError, Verifier, VerifyError, signature_header};
use outbox_receiver::{WebhookReceiver, WebhookRequest};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

async fn receiver_server(receiver: WebhookReceiver) -> String {
    let app = Router::new()
        .route(
            "/hook",
            post(|_: WebhookRequest| async { StatusCode::NO_CONTENT }),
        )
        .with_state(receiver);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

/// Sends `head` and then `body`, and returns the status line of the answer, or panics if
/// none comes within 10 s.
async fn status_line(addr: &str, head: &str, body: &[u8]) -> String {
    let mut socket = TcpStream::connect(addr).await.unwrap();
    socket.write_all(head.as_bytes()).await.unwrap();
    socket.write_all(body).await.unwrap();
    let mut answer = vec![0u8; 256];
    let n = tokio::time::timeout(Duration::from_secs(10), socket.read(&mut answer))
        .await
        .expect("an answer within 10 s")
        .unwrap();
    String::from_utf8_lossy(&answer[..n])
        .lines()
        .next()
        .unwrap_or("")
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declared_length_over_the_limit_is_refused_before_reading() {
    let receiver = WebhookReceiver::from_secrets([SECRET])
        .unwrap()
        .max_body(1024);
    let addr = receiver_server(receiver).await;
    let started = Instant::now();
    let line = status_line(
        &addr,
        "POST /hook HTTP/1.1\r\nhost: x\r\ncontent-length: 10000000000\r\n\r\n",
        b"0123456789",
    )
    .await;
    assert!(line.starts_with("HTTP/1.1 413"), "{line}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "refused at once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_slower_than_the_timeout_is_answered_408() {
    let receiver = WebhookReceiver::from_secrets([SECRET])
        .unwrap()
        .body_timeout(Duration::from_millis(300));
    let addr = receiver_server(receiver).await;
    // 100 bytes declared, 10 sent, the rest never.
    let line = status_line(
        &addr,
        "POST /hook HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n",
        b"0123456789",
    )
    .await;
    assert!(line.starts_with("HTTP/1.1 408"), "{line}");
}

#[test]
fn a_receiver_needs_a_secret_of_a_safe_length() {
    assert_eq!(
        WebhookReceiver::from_secrets(Vec::<&str>::new()).unwrap_err(),
        SecretError::NoSecrets
    );
    assert_eq!(
        WebhookReceiver::from_secrets(["whsec_AA=="]).unwrap_err(),
        SecretError::TooShort
    );
    assert_eq!(
        Secret::from_bytes(&[7; 15]).unwrap_err(),
        SecretError::TooShort
    );
    assert!(Secret::from_bytes(&[7; 16]).is_ok());
    let route = outbox_sink_http::HttpSinkConfig::new("https://example.com/hook")
        .secret("whsec_AA==")
        .build()
        .expect_err("a short route secret is refused at build");
    assert_eq!(route.setting(), "secrets", "{route}");
    assert!(route.to_string().contains("too short"), "{route}");
}

fn verify(
    verifier: &Verifier,
    (id, timestamp, signature): (&str, &str, &str),
    body: &[u8],
    now: i64,
) -> Result<(), VerifyError> {
    let header = |name: &str| match name {
        "webhook-id" => Some(id),
        "webhook-timestamp" => Some(timestamp),
        "webhook-signature" => Some(signature),
        _ => None,
    };
    verifier.verify(header, body, now).map(|_| ())
}

/// The signed content is `{id}.{timestamp}.{body}`: with a `.` allowed in the id, a
/// signature for (id, t, "t2.rest") would also verify as (id + ".t", t2, "rest").
#[test]
fn ids_with_a_dot_are_refused_by_the_verifier() {
    let secret: Secret = SECRET.parse().unwrap();
    let now: i64 = 1_700_000_000;
    let body = format!("{now}.rest");
    let signature = signature_header(std::slice::from_ref(&secret), "evt", now, body.as_bytes());
    let verifier = Verifier::new(vec![secret]);
    let ts = now.to_string();
    assert_eq!(
        verify(&verifier, ("evt", &ts, &signature), body.as_bytes(), now),
        Ok(()),
        "the genuine request"
    );
    let moved = format!("evt.{now}");
    assert_eq!(
        verify(&verifier, (&moved, &ts, &signature), b"rest", now),
        Err(VerifyError::InvalidId),
        "the same signature with the split moved"
    );
}
