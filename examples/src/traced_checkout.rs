//! One trace from a request to the receiver of its message, with the `opentelemetry`
//! feature: request → enqueue → relay publish → receiver.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use opentelemetry::trace::{SpanId, TraceContextExt, TraceId, TracerProvider as _};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter};
use outbox::http::{HttpSink, HttpSinkConfig};
use outbox::sqlite::SqliteOutbox;
use outbox::{NewMessage, Outbox, trace};
use sqlx::sqlite::SqlitePoolOptions;
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;

type Error = Box<dyn std::error::Error + Send + Sync>;

/// What the exported spans show.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    /// Spans exported.
    pub spans: usize,
    /// The receiver's span is a child of the request's span, in the request's trace.
    pub receiver_in_request_trace: bool,
    /// The relay's publish span links to the request's span.
    pub publish_linked_to_request: bool,
    /// The committed order's message never reached the receiver (0 or 1).
    pub lost: u64,
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "spans={} receiver_in_request_trace={} publish_linked_to_request={} lost={}",
            self.spans, self.receiver_in_request_trace, self.publish_linked_to_request, self.lost
        )
    }
}

/// A span exporter that prints one line per finished span on stdout and keeps the spans;
/// a real service exports to an OTLP collector instead (`opentelemetry-otlp`).
#[derive(Debug, Clone, Default)]
struct Stdout(Arc<Mutex<Vec<SpanData>>>);

impl SpanExporter for Stdout {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        for span in &batch {
            let links: Vec<String> = span
                .links
                .iter()
                .map(|l| format!("{}/{}", l.span_context.trace_id(), l.span_context.span_id()))
                .collect();
            println!(
                "span trace={} id={} parent={} name={:?} links=[{}]",
                span.span_context.trace_id(),
                span.span_context.span_id(),
                span.parent_span_id,
                span.name,
                links.join(" ")
            );
        }
        self.0.lock().expect("spans").extend(batch);
        Ok(())
    }
}

/// The receiving service continues the trace the message carries.
async fn receive(
    State(received): State<Arc<AtomicU64>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> StatusCode {
    let span = tracing::info_span!("receive order.paid", bytes = body.len());
    // The HTTP sink sends the message's own `traceparent`: the enqueueing request's.
    let _ = span.set_parent(trace::context_from(|name| headers.get(name)?.to_str().ok()));
    async {
        received.fetch_add(1, Ordering::Relaxed);
        StatusCode::NO_CONTENT
    }
    .instrument(span)
    .await
}

/// Runs the story and sums up the exported spans.
///
/// Installs the process's global `tracing` subscriber: call it once per process.
///
/// # Errors
///
/// Any database, network or configuration failure, or a subscriber already installed.
pub async fn run() -> Result<Summary, Error> {
    let spans = Stdout::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(spans.clone())
        .build();
    tracing::subscriber::set_global_default(
        tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("checkout"))),
    )?;

    // The receiver, on loopback.
    let received = Arc::new(AtomicU64::new(0));
    let app = axum::Router::new()
        .route("/hooks", axum::routing::post(receive))
        .with_state(received.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/hooks", listener.local_addr()?);
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    // The order service: SQLite in memory, one connection.
    let pool = SqlitePoolOptions::new()
        .max_connections(1)
        .connect("sqlite::memory:")
        .await?;
    sqlx::query("CREATE TABLE orders (id INTEGER PRIMARY KEY, status TEXT NOT NULL)")
        .execute(&pool)
        .await?;
    sqlx::query("INSERT INTO orders VALUES (42, 'new')")
        .execute(&pool)
        .await?;
    let store = SqliteOutbox::new(pool.clone());
    store.migrate().await?;

    // A request handler: the message is built inside the request's span, so it records
    // that span's context as its `traceparent` header. No code copies it.
    let request = tracing::info_span!("POST /orders/42/pay");
    let request_ids = (
        request.context().span().span_context().trace_id(),
        request.context().span().span_context().span_id(),
    );
    async {
        let mut tx = pool.begin().await?;
        sqlx::query("UPDATE orders SET status = 'paid' WHERE id = 42")
            .execute(&mut *tx)
            .await?;
        let message = NewMessage::builder("billing", "order.paid")
            .json(&serde_json::json!({ "order": 42 }))
            .build()?;
        store.enqueue(&mut tx, &message).await?;
        tx.commit().await?;
        Ok::<(), Error>(())
    }
    .instrument(request)
    .await?;

    // The relay: its publish span links to the request's span.
    let outbox = Outbox::builder(store)
        .route(
            "billing",
            HttpSink::new(HttpSinkConfig::new(url).allow("127.0.0.1/32"))?,
        )
        .build()
        .await?;
    let report = outbox.drain().await?;
    if report.published != 1 {
        return Err(format!("expected one published message, got {report:?}").into());
    }
    server.abort();
    // Spans end when their tasks do: wait a little for the last ones.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while spans.0.lock().expect("spans").len() < 4 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    provider.force_flush()?;
    let lost = u64::from(received.load(Ordering::Relaxed) == 0);
    Ok(summarize(
        &spans.0.lock().expect("spans"),
        request_ids,
        lost,
    ))
}

fn summarize(spans: &[SpanData], (trace_id, span_id): (TraceId, SpanId), lost: u64) -> Summary {
    let named = |name: &str| spans.iter().find(|s| s.name == name);
    let receiver_in_request_trace = named("receive order.paid")
        .is_some_and(|s| s.span_context.trace_id() == trace_id && s.parent_span_id == span_id);
    let publish_linked_to_request = named("outbox_publish").is_some_and(|s| {
        s.links
            .iter()
            .any(|l| l.span_context.trace_id() == trace_id && l.span_context.span_id() == span_id)
    });
    Summary {
        spans: spans.len(),
        receiver_in_request_trace,
        publish_linked_to_request,
        lost,
    }
}
