//! `outbox relay`: the relay, and a small axum app serving `/metrics`, `/healthz`,
//! `/readyz` and `/slo`; the web dashboard, in the relay or alone (`outbox dashboard`).

use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use outbox::config::DashboardConfig;
use outbox::dashboard::Dashboard;
use outbox::endpoints::{PrometheusMetrics, router};
use outbox::{AnyStore, Config, Outbox, RelayHealth};

/// How long a client may take to send its request headers; and, doubled, the longest a
/// connection stays open. A connection that sends nothing is closed after that.
const IO_TIMEOUT: Duration = Duration::from_secs(5);

pub(crate) async fn relay(config: &Config) -> Result<(), String> {
    let metrics = PrometheusMetrics::install().map_err(|e| e.to_string())?;
    let outbox = Outbox::from_config(config)
        .await
        .map_err(|e| e.to_string())?;
    if let Some(addr) = &config.metrics.listen {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| format!("metrics.listen {addr}: {e}"))?;
        let app = router(Some(metrics), outbox.health(), config.health.objective());
        tokio::spawn(serve(listener, app));
        crate::log_status(&format!(
            "serving /metrics, /healthz, /readyz and /slo on {addr}"
        ));
    }
    if let Some(dashboard) = &config.dashboard {
        serve_dashboard(
            config,
            dashboard,
            outbox.store().clone(),
            Some(outbox.health()),
        )
        .await?;
    }
    crate::log_status(&format!(
        "relay running with {} route(s){}; Ctrl-C or SIGTERM stops it",
        outbox.routes().len(),
        if outbox.listens() {
            ", listening for wakeups"
        } else {
            ""
        }
    ));
    outbox.run(shutdown_signal()).await;
    crate::log_status("relay stopped");
    Ok(())
}

/// `outbox dashboard`: the dashboard alone, until Ctrl-C or SIGTERM.
pub(crate) async fn dashboard(config: &Config, store: AnyStore) -> Result<(), String> {
    let settings = config
        .dashboard
        .as_ref()
        .ok_or("`outbox dashboard` needs a [dashboard] table in the config (listen, token_env)")?;
    serve_dashboard(config, settings, store, None).await?;
    shutdown_signal().await;
    Ok(())
}

/// Binds the dashboard's address and serves it in the background.
async fn serve_dashboard(
    config: &Config,
    settings: &DashboardConfig,
    store: AnyStore,
    relay: Option<RelayHealth>,
) -> Result<(), String> {
    let token = settings.token().map_err(|e| e.to_string())?;
    let hosts = settings.allowed_hosts().map_err(|e| e.to_string())?;
    let mut dashboard = Dashboard::new(store, token)
        .map_err(|e| format!("dashboard: {e}"))?
        .hosts(hosts)
        .public_read(settings.public_read);
    // A configuration without routes (the dashboard's own) says nothing about them.
    if !config.routes.is_empty() {
        dashboard = dashboard.routes(config.routes.keys().cloned());
    }
    if let Some(relay) = relay {
        dashboard = dashboard.relay(relay);
    }
    let addr = settings.listen();
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| format!("dashboard.listen {addr}: {e}"))?;
    tokio::spawn(serve(listener, dashboard.router()));
    crate::log_status(&format!("serving the dashboard on http://{addr}/"));
    Ok(())
}

pub(crate) async fn shutdown_signal() {
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

/// Serves `app` one HTTP/1 connection per task, each closed after [`IO_TIMEOUT`] without
/// request headers and after twice that in any case: an idle or slow client never holds a
/// task for long.
async fn serve(listener: tokio::net::TcpListener, app: Router) {
    loop {
        let Ok((socket, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let service = TowerToHyperService::new(app.clone());
        tokio::spawn(async move {
            let mut http = hyper::server::conn::http1::Builder::new();
            http.timer(TokioTimer::new())
                .header_read_timeout(IO_TIMEOUT)
                .keep_alive(false);
            let connection = http.serve_connection(TokioIo::new(socket), service);
            let _ = tokio::time::timeout(IO_TIMEOUT * 2, connection).await;
        });
    }
}
