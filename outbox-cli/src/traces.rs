//! Span export over OTLP/HTTP (protobuf) when the standard `OTEL_…` variables name a
//! collector: the exporter, the checks of the variables the SDK would ignore when
//! malformed, and the flush at exit.

use std::time::Duration;

use opentelemetry_sdk::trace::SdkTracerProvider;

use crate::Result;

/// The spans exported by default: the relay's batches, publishes and workers.
const TRACES_FILTER: &str = "outbox=info";
/// Replaces [`TRACES_FILTER`] (`RUST_LOG` syntax); `RUST_LOG` picks log lines only.
const TRACES_FILTER_VAR: &str = "OUTBOX_OTEL_FILTER";
/// The service name when neither `OTEL_SERVICE_NAME` nor `OTEL_RESOURCE_ATTRIBUTES` gives one.
const SERVICE_NAME: &str = "outbox-relay";
/// How long the exit waits for the last spans to reach the collector.
const TRACES_GRACE: Duration = Duration::from_secs(3);

/// The OTLP/HTTP (protobuf) span export and the filter of its spans, when
/// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT` is set (and
/// neither `OTEL_SDK_DISABLED=true` nor `OTEL_TRACES_EXPORTER=none`). The SDK reads the
/// other standard variables itself (headers, timeout, service name and resource, sampler,
/// `OTEL_BSP_…`); those it would ignore when malformed are checked here.
pub(crate) fn otlp(
    runtime: &tokio::runtime::Handle,
) -> Result<Option<(SdkTracerProvider, tracing_subscriber::EnvFilter)>> {
    use opentelemetry_sdk::resource::{EnvResourceDetector, ResourceDetector};

    if first_set(&["OTEL_SDK_DISABLED"])?.is_some_and(|(_, v)| v.eq_ignore_ascii_case("true")) {
        return Ok(None);
    }
    let endpoint = first_set(&[
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
    ])?;
    let Some((var, endpoint)) = endpoint else {
        return Ok(None);
    };
    match first_set(&["OTEL_TRACES_EXPORTER"])? {
        Some((_, exporter)) if exporter == "none" => return Ok(None),
        Some((var, exporter)) if exporter != "otlp" => {
            return Err(format!(
                "{var}: `{exporter}` is not supported (`otlp` or `none`)"
            ));
        }
        _ => {}
    }
    let collector = url::Url::parse(&endpoint)
        .map_err(|e| e.to_string())
        .and_then(|url| match url.scheme() {
            "http" | "https" if url.has_host() => Ok(url.origin().ascii_serialization()),
            _ => Err("not an http:// or https:// URL".to_owned()),
        })
        .map_err(|e| format!("{var}: {e}"))?;
    let protocol = first_set(&[
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
    ])?;
    if let Some((var, protocol)) = protocol
        && !protocol.eq_ignore_ascii_case("http/protobuf")
    {
        return Err(format!(
            "{var}: `{protocol}` is not supported; the CLI exports OTLP/HTTP as protobuf (`http/protobuf`)"
        ));
    }
    for var in [
        "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
        "OTEL_EXPORTER_OTLP_TIMEOUT",
    ] {
        if let Some((var, timeout)) = first_set(&[var])?
            && timeout.parse::<u64>().is_err()
        {
            return Err(format!("{var}: not a whole number of milliseconds"));
        }
    }
    for var in [
        "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
        "OTEL_EXPORTER_OTLP_HEADERS",
    ] {
        let Some((var, headers)) = first_set(&[var])? else {
            continue;
        };
        // Values are secrets (API keys): the error shows the position only.
        let items = headers.split(',').map(str::trim).filter(|i| !i.is_empty());
        for (n, item) in items.enumerate() {
            let valid = item.split_once('=').is_some_and(|(name, value)| {
                reqwest::header::HeaderName::from_bytes(name.trim().as_bytes()).is_ok()
                    && !value.trim().is_empty()
            });
            if !valid {
                return Err(format!("{var}: header {} is not `name=value`", n + 1));
            }
        }
    }
    if let Some((var, sampler)) = first_set(&["OTEL_TRACES_SAMPLER"])? {
        const SAMPLERS: &[&str] = &[
            "always_on",
            "always_off",
            "traceidratio",
            "parentbased_always_on",
            "parentbased_always_off",
            "parentbased_traceidratio",
        ];
        if !SAMPLERS.contains(&sampler.as_str()) {
            return Err(format!(
                "{var}: `{sampler}` is none of {}",
                SAMPLERS.join(", ")
            ));
        }
        if let Some((var, ratio)) = first_set(&["OTEL_TRACES_SAMPLER_ARG"])?
            && sampler.ends_with("traceidratio")
            && !ratio.parse::<f64>().is_ok_and(|r| (0.0..=1.0).contains(&r))
        {
            return Err(format!("{var}: not a ratio between 0 and 1"));
        }
    }
    let filter = match first_set(&[TRACES_FILTER_VAR])? {
        Some((var, directives)) => tracing_subscriber::EnvFilter::builder()
            .parse(directives)
            .map_err(|e| format!("{var}: {e}"))?,
        None => tracing_subscriber::EnvFilter::new(TRACES_FILTER),
    };

    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .build()
        .map_err(|e| format!("OTLP trace export: {e}"))?;
    let mut resource = opentelemetry_sdk::Resource::builder();
    let service = opentelemetry::Key::from_static_str("service.name");
    if first_set(&["OTEL_SERVICE_NAME"])?.is_none()
        && EnvResourceDetector::new().detect().get(&service).is_none()
    {
        resource = resource.with_service_name(SERVICE_NAME);
    }
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(Exporter {
            otlp: exporter,
            runtime: runtime.clone(),
            collector,
            failing: std::sync::atomic::AtomicBool::new(false),
        })
        .with_resource(resource.build())
        .build();
    Ok(Some((provider, filter)))
}

/// The first of `vars` that is set and not empty, with its value.
fn first_set(vars: &[&'static str]) -> Result<Option<(&'static str, String)>> {
    for &var in vars {
        match std::env::var(var) {
            Ok(value) if !value.trim().is_empty() => return Ok(Some((var, value))),
            Err(std::env::VarError::NotUnicode(_)) => return Err(format!("{var}: not UTF-8")),
            _ => {}
        }
    }
    Ok(None)
}

/// The OTLP exporter, polled on the CLI's runtime (its HTTP client needs one; the SDK
/// exports from a thread of its own). A failing export is logged once, and once more
/// when one succeeds again.
#[derive(Debug)]
struct Exporter {
    otlp: opentelemetry_otlp::SpanExporter,
    runtime: tokio::runtime::Handle,
    /// Scheme, host and port of the endpoint (never its user or path).
    collector: String,
    failing: std::sync::atomic::AtomicBool,
}

impl opentelemetry_sdk::trace::SpanExporter for Exporter {
    async fn export(
        &self,
        batch: Vec<opentelemetry_sdk::trace::SpanData>,
    ) -> opentelemetry_sdk::error::OTelSdkResult {
        use std::sync::atomic::Ordering::Relaxed;

        let mut export = Box::pin(self.otlp.export(batch));
        let result = std::future::poll_fn(|cx| {
            let _runtime = self.runtime.enter();
            export.as_mut().poll(cx)
        })
        .await;
        match &result {
            Err(error) if !self.failing.swap(true, Relaxed) => tracing::warn!(
                collector = %self.collector,
                %error,
                "trace export failing: spans are dropped until the collector takes them (said once; again when it recovers)"
            ),
            Ok(()) if self.failing.swap(false, Relaxed) => {
                tracing::warn!(collector = %self.collector, "trace export recovered");
            }
            _ => {}
        }
        result
    }

    fn set_resource(&mut self, resource: &opentelemetry_sdk::Resource) {
        self.otlp.set_resource(resource);
    }
}

/// The OTLP export, if any, until [`Traces::shutdown`].
pub(crate) struct Traces(pub(crate) Option<SdkTracerProvider>);

impl Traces {
    /// Sends the spans still queued, waiting at most [`TRACES_GRACE`] for the collector.
    pub(crate) fn shutdown(self) {
        if let Some(provider) = self.0
            && let Err(e) = provider.shutdown_with_timeout(TRACES_GRACE)
        {
            tracing::warn!(
                error = %e,
                "trace export: the spans still queued are dropped (the collector did not take them within {TRACES_GRACE:?})"
            );
        }
    }
}
