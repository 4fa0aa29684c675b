//! A 2xx status line is the acknowledgement: a body that trickles in does not hold the
//! message, and one slow endpoint never holds another endpoint's messages.

mod common;

use std::time::{Duration, Instant};

use outbox_engine::{MemoryStore, NewMessage, Outcome, PublishContext, Relay, Sink, Status};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// A raw HTTP server that answers every request with `head`, then sends the body one
/// byte a second (or never answers, with `head` empty). Returns its base URL.
async fn trickling_server(head: &'static str) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut request = vec![0u8; 64 * 1024];
                let _ = socket.read(&mut request).await;
                if head.is_empty() {
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                    return;
                }
                if socket.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                for _ in 0..100 {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    if socket.write_all(b"x").await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    url
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_2xx_whose_body_trickles_is_published_at_once() {
    let url = trickling_server("HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n").await;
    let sink = common::sink(common::config(format!("{url}/hook")));
    let started = Instant::now();
    let outcomes = sink
        .publish(
            &[common::message("t", 1)],
            &PublishContext::timeout(Duration::from_secs(30)),
        )
        .await
        .unwrap();
    assert!(
        matches!(&outcomes[0], Outcome::Published { .. }),
        "{:?}",
        outcomes[0]
    );
    // The body would take 100 s; the status line arrived at once.
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "took {:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_5xx_whose_body_trickles_fails_without_waiting_for_the_body() {
    let url =
        trickling_server("HTTP/1.1 503 Service Unavailable\r\ncontent-length: 100\r\n\r\n").await;
    let sink = common::sink(common::config(format!("{url}/hook")));
    let started = Instant::now();
    let outcomes = outbox_engine::testkit::publish(&sink, &[common::message("t", 1)]).await;
    let Outcome::Failed(failure) = &outcomes[0] else {
        panic!("a 503 is a failure: {:?}", outcomes[0]);
    };
    assert!(
        failure.retryable && failure.message.contains("503"),
        "{failure}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "took {:?}",
        started.elapsed()
    );
}

/// Two tenants' endpoints (one sink each) in one batch: the one that never answers holds
/// only its own message; the other's is marked published while the first is still
/// waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_endpoint_does_not_hold_another_endpoints_messages() {
    let silent = trickling_server("").await;
    let fast = common::TestServer::start().await;
    let tenant_a = common::sink(common::config(format!("{silent}/hook")));
    let tenant_b = common::sink(common::config(fast.url("/hook")));
    let store = MemoryStore::new();
    let message = |destination: &str| {
        NewMessage::builder(destination, "invoice.paid")
            .json(&1)
            .build()
            .unwrap()
    };
    let held = store.enqueue(message("tenant-a")).unwrap();
    let free: Vec<_> = (0..3)
        .map(|_| store.enqueue(message("tenant-b")).unwrap())
        .collect();
    let relay = Relay::builder(store.clone())
        .route("tenant-a", tenant_a)
        .route("tenant-b", tenant_b)
        .lease(Duration::from_secs(60))
        .publish_timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    let batch = tokio::spawn(async move { relay.run_once().await });
    let status = |id| store.row(id).unwrap().row.status();
    outbox_test_support::wait_until(
        "tenant-b's messages marked published",
        Duration::from_secs(10),
        || async { free.iter().all(|id| status(*id) == Status::Published) },
    )
    .await;
    assert_eq!(
        status(held),
        Status::Leased,
        "tenant-a's message is still waiting"
    );
    batch.abort();
}
