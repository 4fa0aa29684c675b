//! The operator's endpoints of a relay, for an application that embeds one (feature
//! `endpoints`): `/metrics` in Prometheus' text format, `/healthz` (liveness), `/readyz`
//! (readiness) and `/slo` (the lag objective), as an axum [`Router`] to mount. The
//! `outbox relay` command serves the same router.
//!
//! ```no_run
//! use outbox::endpoints::{PrometheusMetrics, router};
//! use outbox::{Config, LagObjective, Outbox};
//!
//! # async fn run(config: Config) -> Result<(), Box<dyn std::error::Error>> {
//! let metrics = PrometheusMetrics::install()?; // before the relay records anything
//! let outbox = Outbox::from_config(&config).await?;
//! let ops = router(Some(metrics), outbox.health(), config.health.objective());
//! let app: axum::Router = axum::Router::new().merge(ops); // and the application's routes
//! // … serve `app` as the application serves its routes, then:
//! outbox.run(std::future::pending()).await;
//! # Ok(())
//! # }
//! ```

use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use axum::routing::get;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use outbox_engine::{LagObjective, RelayHealth, Unhealthy};

use crate::Error;

/// How often the recorder folds recorded histogram samples into its buckets.
pub const UPKEEP_INTERVAL: Duration = Duration::from_secs(5);

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

/// The process's Prometheus recorder, installed with the relay's histogram buckets and
/// every series described ([`outbox_engine::series`]), and kept in bounded memory by an
/// upkeep task (histogram samples otherwise pile up until a scrape drains them).
#[derive(Debug, Clone)]
pub struct PrometheusMetrics {
    handle: PrometheusHandle,
}

impl PrometheusMetrics {
    /// Installs the recorder for the whole process and starts its upkeep, every
    /// [`UPKEEP_INTERVAL`], on the current tokio runtime.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] when the process already has a recorder.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime.
    pub fn install() -> Result<Self, Error> {
        let failed = |e: &dyn std::fmt::Display| Error::Config(format!("metrics: {e}"));
        let handle = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), SECONDS_BUCKETS)
            .and_then(|b| {
                b.set_buckets_for_metric(Matcher::Full("outbox_batch_size".into()), BATCH_BUCKETS)
            })
            .map_err(|e| failed(&e))?
            .install_recorder()
            .map_err(|e| failed(&e))?;
        outbox_engine::series::describe();
        let upkeep = handle.clone();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(UPKEEP_INTERVAL);
            loop {
                every.tick().await;
                upkeep.run_upkeep();
            }
        });
        Ok(Self { handle })
    }

    /// Every series now, in Prometheus' text format.
    pub fn render(&self) -> String {
        self.handle.render()
    }
}

#[derive(Clone)]
struct Endpoints {
    metrics: Option<PrometheusMetrics>,
    health: RelayHealth,
    objective: LagObjective,
}

/// `/healthz`, `/readyz` and `/slo` from `health` and `objective` (200, or 503 with one
/// reason per line), and `/metrics` when `metrics` is given.
pub fn router(
    metrics: Option<PrometheusMetrics>,
    health: RelayHealth,
    objective: LagObjective,
) -> Router {
    let mut router = Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/slo", get(slo));
    if metrics.is_some() {
        router = router.route("/metrics", get(render));
    }
    router.with_state(Endpoints {
        metrics,
        health,
        objective,
    })
}

async fn render(State(e): State<Endpoints>) -> impl IntoResponse {
    let text = e.metrics.map(|m| m.render()).unwrap_or_default();
    ([(CONTENT_TYPE, "text/plain; version=0.0.4")], text)
}

async fn healthz(State(e): State<Endpoints>) -> impl IntoResponse {
    verdict(e.health.alive(&e.objective))
}

async fn readyz(State(e): State<Endpoints>) -> impl IntoResponse {
    verdict(e.health.ready(&e.objective))
}

async fn slo(State(e): State<Endpoints>) -> impl IntoResponse {
    verdict(e.health.objective(&e.objective))
}

fn verdict(check: Result<(), Unhealthy>) -> (StatusCode, String) {
    match check {
        Ok(()) => (StatusCode::OK, "ok\n".to_owned()),
        Err(unhealthy) => (StatusCode::SERVICE_UNAVAILABLE, format!("{unhealthy}\n")),
    }
}
