//! `outbox::endpoints`: the router an application mounts answers `/healthz`, `/readyz`,
//! `/slo` and `/metrics` from a running relay, every series with its help text.

use std::time::Duration;

use outbox::endpoints::{PrometheusMetrics, router};
use outbox::testkit::RecordingSink;
use outbox::{LagObjective, MemoryStore, NewMessage, Outbox};
use outbox_test_support::wait_for;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The whole answer to `GET path` from `addr`.
async fn get(addr: std::net::SocketAddr, path: &str) -> String {
    let mut socket = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
    socket.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    socket.read_to_string(&mut answer).await.unwrap();
    answer
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_embedded_relay_serves_health_and_described_metrics() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let metrics = PrometheusMetrics::install().unwrap();
        let store = MemoryStore::new();
        let sink = RecordingSink::new();
        let outbox = Outbox::builder(store.clone())
            .route("billing", sink.clone())
            .relay(|relay| relay.poll_interval(Duration::from_millis(20)))
            .build()
            .await
            .unwrap();
        let objective = LagObjective::new().max_pending_age(Duration::from_secs(60));
        let app = router(Some(metrics), outbox.health(), objective);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });

        let unready = get(addr, "/readyz").await;
        assert!(
            unready.starts_with("HTTP/1.1 503")
                && unready.contains("no claim has been answered yet"),
            "{unready}"
        );
        store
            .enqueue(
                NewMessage::builder("billing", "invoice.paid")
                    .json(&1)
                    .build()
                    .unwrap(),
            )
            .unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let running = tokio::spawn(outbox.run(async {
            let _ = stopped.await;
        }));
        let metrics = wait_for(
            "one message published and counted",
            Duration::from_secs(20),
            || async {
                let text = get(addr, "/metrics").await;
                text.contains("outbox_messages_published_total{destination=\"billing\"} 1")
                    .then_some(text)
            },
        )
        .await;
        assert_eq!(sink.len(), 1);
        for path in ["/healthz", "/readyz", "/slo"] {
            let answer = get(addr, path).await;
            assert!(answer.starts_with("HTTP/1.1 200"), "{path}: {answer}");
        }
        for needle in [
            "# HELP outbox_messages_published_total Messages published and marked.",
            "# TYPE outbox_commit_to_publish_seconds histogram",
            "outbox_build_info{version=\"",
        ] {
            assert!(metrics.contains(needle), "{needle:?} in\n{metrics}");
        }
        let _ = stop.send(());
        running.await.unwrap();
    })
    .await
    .expect("the test ends within 60 s");
}
