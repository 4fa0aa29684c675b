//! The `opentelemetry` feature against PostgreSQL, a real HTTP receiver and Redis: a
//! message built inside a traced request carries that request's `traceparent` and
//! `tracestate` to the receiver of each sink unchanged, without application code copying
//! them, and the relay's publish span links to the enqueueing span.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::HeaderMap;
use opentelemetry::trace::{
    SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState, TracerProvider as _,
};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter};
use outbox::http::{HttpSink, HttpSinkConfig};
use outbox::postgres::PgOutbox;
use outbox::redis::{RedisSink, RedisSinkConfig, client as redis};
use outbox::{NewMessage, Outbox, TableNames};
use outbox_test_support::{no_server, server_url, wait_for};
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;

const LIMIT: Duration = Duration::from_secs(30);

/// Keeps every finished span.
#[derive(Debug, Clone, Default)]
struct Collected(Arc<Mutex<Vec<SpanData>>>);

impl SpanExporter for Collected {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        self.0.lock().unwrap().extend(batch);
        Ok(())
    }
}

impl Collected {
    fn named(&self, name: &str) -> Vec<SpanData> {
        let spans = self.0.lock().unwrap();
        spans.iter().filter(|s| s.name == name).cloned().collect()
    }
}

/// An HTTP receiver that keeps the trace headers of every request.
async fn receiver() -> (String, Arc<Mutex<Vec<(Option<String>, Option<String>)>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let kept = seen.clone();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |headers: HeaderMap| {
            let value = |name| Some(headers.get(name)?.to_str().ok()?.to_owned());
            kept.lock()
                .unwrap()
                .push((value("traceparent"), value("tracestate")));
            async { axum::http::StatusCode::NO_CONTENT }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traceparent_reaches_http_and_redis_receivers_unchanged() {
    let spans = Collected::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(spans.clone())
        .build();
    tracing::subscriber::set_global_default(
        tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test"))),
    )
    .expect("the only subscriber of this test binary");

    let pool = outbox_test_support::postgres_pool().await;
    let redis_url = server_url("OUTBOX_TEST_REDIS_URL", "redis://127.0.0.1:6379/");
    let mut redis = redis::Client::open(redis_url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap_or_else(|e| no_server("Redis", "OUTBOX_TEST_REDIS_URL", &redis_url, e));
    let suffix = format!("{:016x}", fastrand::u64(..));
    let table = format!("trace_{suffix}");
    let stream = format!("outbox-trace-{suffix}");
    let store = PgOutbox::with_names(pool.clone(), TableNames::default().outbox(&table).unwrap());
    store.migrate().await.unwrap();
    let (url, http_seen) = receiver().await;

    // The request arrives with a trace of its caller, which has a tracestate of its own.
    let caller = SpanContext::new(
        TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap(),
        SpanId::from_hex("00f067aa0ba902b7").unwrap(),
        TraceFlags::SAMPLED,
        true,
        "acme=t61rcWkgMzE".parse::<TraceState>().unwrap(),
    );
    let request = tracing::info_span!("POST /checkout");
    request
        .set_parent(opentelemetry::Context::new().with_remote_span_context(caller))
        .unwrap();
    let enqueued = request.context().span().span_context().clone();
    async {
        let mut tx = pool.begin().await.unwrap();
        for destination in ["webhooks", "events"] {
            let message = NewMessage::builder(destination, "order.paid")
                .json(&42)
                .build()
                .unwrap();
            store.enqueue(&mut tx, &message).await.unwrap();
        }
        tx.commit().await.unwrap();
    }
    .instrument(request)
    .await;

    let outbox = Outbox::builder(store.clone())
        .route(
            "webhooks",
            HttpSink::new(HttpSinkConfig::new(url).allow("127.0.0.1/32")).unwrap(),
        )
        .route(
            "events",
            RedisSink::connect(RedisSinkConfig::new(redis_url.clone()).stream(stream.clone()))
                .await
                .unwrap(),
        )
        .build()
        .await
        .unwrap();
    assert_eq!(outbox.drain().await.unwrap().published, 2);

    let traceparent = format!(
        "00-4bf92f3577b34da6a3ce929d0e0e4736-{}-01",
        enqueued.span_id()
    );
    let sent = (
        Some(traceparent.clone()),
        Some("acme=t61rcWkgMzE".to_owned()),
    );
    assert_eq!(
        *http_seen.lock().unwrap(),
        vec![sent.clone()],
        "HTTP request headers"
    );

    let entries: Vec<(String, HashMap<String, String>)> = redis::cmd("XRANGE")
        .arg(&stream)
        .arg("-")
        .arg("+")
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(entries.len(), 1);
    let field = |name: &str| entries[0].1.get(name).cloned();
    assert_eq!(
        (field("h:traceparent"), field("h:tracestate")),
        sent,
        "Redis entry fields"
    );

    // One publish span per sink call, each linked to the enqueueing span.
    let publishes = wait_for("two exported outbox_publish spans", LIMIT, || {
        let publishes = spans.named("outbox_publish");
        async move { (publishes.len() == 2).then_some(publishes) }
    })
    .await;
    for publish in publishes {
        let linked: Vec<_> = publish
            .links
            .iter()
            .map(|l| l.span_context.clone())
            .collect();
        assert_eq!(linked.len(), 1, "{publish:?}");
        assert_eq!(linked[0].trace_id(), enqueued.trace_id());
        assert_eq!(linked[0].span_id(), enqueued.span_id());
        assert_ne!(
            publish.span_context.trace_id(),
            enqueued.trace_id(),
            "a link, not a parent"
        );
    }

    let _: () = redis::cmd("DEL")
        .arg(&stream)
        .query_async(&mut redis)
        .await
        .unwrap();
    sqlx::query(&format!("DROP TABLE {table} CASCADE"))
        .execute(&pool)
        .await
        .unwrap();
}
