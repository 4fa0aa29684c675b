//! `outbox relay`: the relay, and a small axum app serving `/metrics`, `/healthz` and
//! `/readyz`; the web dashboard, in the relay or alone (`outbox dashboard`).

use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use axum::routing::get;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use outbox::config::DashboardConfig;
use outbox::dashboard::Dashboard;
use outbox::{AnyStore, Config, LagObjective, Outbox, RelayHealth};

/// How long a client may take to send its request headers; and, doubled, the longest a
/// connection stays open. A connection that sends nothing is closed after that.
const IO_TIMEOUT: Duration = Duration::from_secs(5);

/// Buckets of the `_seconds` histograms: 1 ms to 4 hours, so a relay publishing in
/// milliseconds and one hours behind are both measured.
const SECONDS_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    300.0, 900.0, 3600.0, 14400.0,
];

/// Buckets of `outbox_batch_size`.
const BATCH_BUCKETS: &[f64] = &[
    1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 10000.0,
];

pub(crate) async fn relay(config: &Config) -> Result<(), String> {
    let metrics = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), SECONDS_BUCKETS)
        .and_then(|b| {
            b.set_buckets_for_metric(Matcher::Full("outbox_batch_size".into()), BATCH_BUCKETS)
        })
        .map_err(|e| format!("metrics: {e}"))?
        .install_recorder()
        .map_err(|e| format!("metrics: {e}"))?;
    let outbox = Outbox::from_config(config)
        .await
        .map_err(|e| e.to_string())?;
    if let Some(addr) = &config.metrics.listen {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| format!("metrics.listen {addr}: {e}"))?;
        let app = app(Endpoints {
            metrics,
            health: outbox.health(),
            objective: config.health.objective(),
        });
        tokio::spawn(serve(listener, app));
        eprintln!("serving /metrics, /healthz and /readyz on {addr}");
    }
    if let Some(dashboard) = &config.dashboard {
        serve_dashboard(dashboard, outbox.store().clone(), Some(outbox.health())).await?;
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
    eprintln!("relay stopped");
    Ok(())
}

/// `outbox dashboard`: the dashboard alone, until Ctrl-C or SIGTERM.
pub(crate) async fn dashboard(config: &Config, store: AnyStore) -> Result<(), String> {
    let settings = config
        .dashboard
        .as_ref()
        .ok_or("`outbox dashboard` needs a [dashboard] table in the config (listen, token_env)")?;
    serve_dashboard(settings, store, None).await?;
    shutdown_signal().await;
    Ok(())
}

/// Binds the dashboard's address and serves it in the background.
async fn serve_dashboard(
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
    if let Some(relay) = relay {
        dashboard = dashboard.relay(relay);
    }
    let addr = settings.listen();
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| format!("dashboard.listen {addr}: {e}"))?;
    tokio::spawn(serve(listener, dashboard.router()));
    eprintln!("serving the dashboard on http://{addr}/");
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

#[derive(Clone)]
struct Endpoints {
    metrics: PrometheusHandle,
    health: RelayHealth,
    objective: LagObjective,
}

fn app(endpoints: Endpoints) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(endpoints)
}

async fn metrics(State(e): State<Endpoints>) -> impl IntoResponse {
    (
        [(CONTENT_TYPE, "text/plain; version=0.0.4")],
        e.metrics.render(),
    )
}

async fn healthz(State(e): State<Endpoints>) -> impl IntoResponse {
    verdict(e.health.alive(&e.objective))
}

async fn readyz(State(e): State<Endpoints>) -> impl IntoResponse {
    verdict(e.health.ready(&e.objective))
}

fn verdict(check: Result<(), outbox::Unhealthy>) -> (StatusCode, String) {
    match check {
        Ok(()) => (StatusCode::OK, "ok\n".to_owned()),
        Err(unhealthy) => (StatusCode::SERVICE_UNAVAILABLE, format!("{unhealthy}\n")),
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
