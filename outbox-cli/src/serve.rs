//! `outbox relay`: the relay, store gauges, and a tiny `/metrics` + `/healthz` endpoint.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use outbox::{Config, Outbox};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How long a `/metrics` or `/healthz` client may take to send its request and to take
/// the answer; a connection that sends nothing is closed after that.
const IO_TIMEOUT: Duration = Duration::from_secs(5);

pub(crate) async fn relay(config: &Config) -> Result<(), String> {
    let metrics = PrometheusBuilder::new()
        .install_recorder()
        .map_err(|e| format!("metrics: {e}"))?;
    let outbox = Outbox::from_config(config)
        .await
        .map_err(|e| e.to_string())?;
    let alive = Arc::new(AtomicBool::new(true));
    if let Some(addr) = &config.metrics.listen {
        let server = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| format!("metrics.listen {addr}: {e}"))?;
        tokio::spawn(serve(server, metrics.clone(), alive.clone()));
        eprintln!("serving /metrics and /healthz on {addr}");
    }
    eprintln!(
        "relay running with {} route(s){}; Ctrl-C or SIGTERM stops it",
        outbox.routes().len(),
        if outbox.listens() {
            ", listening for wakeups"
        } else {
            ""
        }
    );
    outbox.run(shutdown_signal()).await;
    alive.store(false, Ordering::SeqCst);
    eprintln!("relay stopped");
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(term) => term,
        Err(_) => {
            let _ = ctrl_c.await;
            return;
        }
    };
    tokio::select! {
        _ = ctrl_c => {}
        _ = term.recv() => {}
    }
}

async fn serve(
    listener: tokio::net::TcpListener,
    metrics: PrometheusHandle,
    alive: Arc<AtomicBool>,
) {
    loop {
        let Ok((mut socket, _)) = listener.accept().await else {
            continue;
        };
        let (metrics, alive) = (metrics.clone(), alive.clone());
        tokio::spawn(async move {
            let mut buffer = [0u8; 1024];
            let Ok(Ok(n)) = tokio::time::timeout(IO_TIMEOUT, socket.read(&mut buffer)).await else {
                return;
            };
            let request = String::from_utf8_lossy(&buffer[..n]);
            let path = request.split_whitespace().nth(1).unwrap_or("/");
            let (status, body) = match path {
                "/metrics" => ("200 OK", metrics.render()),
                "/healthz" if alive.load(Ordering::SeqCst) => ("200 OK", "ok\n".to_owned()),
                "/healthz" => ("503 Service Unavailable", "stopping\n".to_owned()),
                _ => ("404 Not Found", "not found\n".to_owned()),
            };
            let response = format!(
                "HTTP/1.1 {status}\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = tokio::time::timeout(IO_TIMEOUT, socket.write_all(response.as_bytes())).await;
        });
    }
}
