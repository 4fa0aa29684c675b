//! W3C trace context carried by messages (feature `opentelemetry`).
//!
//! With this feature on, a trace continues through the outbox without application code:
//!
//! - [`NewMessageBuilder::build`](crate::NewMessageBuilder::build) records the trace
//!   context it runs in as the message's [`TRACEPARENT`] and [`TRACESTATE`] headers: the
//!   current `tracing` span's when it belongs to an OpenTelemetry trace (through
//!   `tracing-opentelemetry`), else OpenTelemetry's current context. A message that
//!   already has a `traceparent` header keeps it; outside any trace nothing is added.
//!   Build the message where you enqueue it, inside the request's span.
//! - Every sink carries headers unchanged (an HTTP header, a Kafka header, an SQS or AMQP
//!   attribute, a Redis field), so the receiver gets the enqueueing context, not the
//!   relay's.
//! - The relay's `outbox_publish` span (one per sink call) links to the context of every
//!   message it publishes, the OpenTelemetry convention for batched sends.
//! - A receiver continues the trace with [`context_of`] (or
//!   [`Received::trace_context`](crate::Received::trace_context)), or [`context_from`]
//!   for an HTTP request's headers.
//!
//! The trace context format is W3C Trace Context, whatever propagator the application
//! installed globally: these are the header names every sink documents.
//!
//! ```
//! use outbox_engine::{Headers, trace};
//!
//! let mut headers = Headers::new();
//! headers.insert(
//!     "traceparent".into(),
//!     "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into(),
//! );
//! let parent = trace::span_context_of(&headers).expect("a valid traceparent");
//! assert_eq!(parent.trace_id().to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
//! assert!(parent.is_remote());
//!
//! // A malformed value (a row written by hand, say) is no context, never an error.
//! headers.insert("traceparent".into(), "00-not-a-trace-01".into());
//! assert!(trace::span_context_of(&headers).is_none());
//! ```

use std::marker::PhantomData;

use opentelemetry::Context;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{SpanContext, TraceContextExt};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::message::{Headers, Message};

/// The header that carries the W3C `traceparent`.
pub const TRACEPARENT: &str = "traceparent";
/// The header that carries the W3C `tracestate`, when the context has one.
pub const TRACESTATE: &str = "tracestate";

/// The trace context of the code running now: the current `tracing` span's when it
/// belongs to an OpenTelemetry trace, else OpenTelemetry's current context.
fn current() -> Context {
    let span = tracing::Span::current().context();
    if span.span().span_context().is_valid() {
        span
    } else {
        Context::current()
    }
}

/// Adds the current trace context to `headers` (name, value pairs) unless one of them is
/// already a `traceparent`. Nothing is added outside a trace.
pub(crate) fn record_current(headers: &mut Vec<(String, String)>) {
    if headers
        .iter()
        .any(|(name, _)| name.eq_ignore_ascii_case(TRACEPARENT))
    {
        return;
    }
    TraceContextPropagator::new().inject_context(&current(), &mut PairInjector(headers));
}

/// The trace context a message's headers carry, as the remote parent of a new span;
/// an empty context when they carry none or a malformed one.
///
/// ```
/// # fn demo(received: &outbox_engine::Received) {
/// use tracing_opentelemetry::OpenTelemetrySpanExt;
///
/// let span = tracing::info_span!("apply_event");
/// let _ = span.set_parent(outbox_engine::trace::context_of(&received.headers));
/// # }
/// ```
pub fn context_of(headers: &Headers) -> Context {
    context_from(|name| header(headers, name))
}

/// The trace context found by looking up header names with `get`: for carriers other
/// than [`Headers`], such as an HTTP request's header map.
///
/// ```
/// use std::collections::HashMap;
/// use opentelemetry::trace::TraceContextExt;
///
/// // An HTTP server's header map works the same: `|name| map.get(name)?.to_str().ok()`.
/// let request = HashMap::from([("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")]);
/// let cx = outbox_engine::trace::context_from(|name| request.get(name).copied());
/// assert!(cx.span().span_context().is_valid());
/// ```
pub fn context_from<'a>(get: impl Fn(&str) -> Option<&'a str>) -> Context {
    TraceContextPropagator::new().extract(&LookupExtractor(get, PhantomData))
}

/// The span context in a message's headers, if they carry a valid one.
pub fn span_context_of(headers: &Headers) -> Option<SpanContext> {
    let cx = context_of(headers);
    let span = cx.span().span_context().clone();
    span.is_valid().then_some(span)
}

/// Links `span` to the trace context of each message in `messages` that carries one.
pub(crate) fn link_messages(span: &tracing::Span, messages: &[Message]) {
    if span.is_disabled() {
        return;
    }
    for message in messages {
        if let Some(context) = span_context_of(&message.headers) {
            span.add_link(context);
        }
    }
}

/// A header's value, by exact name first, then ignoring ASCII case (writers in other
/// languages may capitalise it).
fn header<'a>(headers: &'a Headers, name: &str) -> Option<&'a str> {
    headers
        .get(name)
        .or_else(|| {
            headers
                .iter()
                .find(|(key, _)| key.eq_ignore_ascii_case(name))
                .map(|(_, value)| value)
        })
        .map(String::as_str)
}

struct PairInjector<'a>(&'a mut Vec<(String, String)>);

impl Injector for PairInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        // The propagator writes an empty `tracestate` when there is none: leave it out
        // (some sinks refuse empty attribute values).
        if !value.is_empty() {
            self.0.push((key.to_owned(), value));
        }
    }
}

/// Holds `'a` so that a borrow of the extractor never outlives the values it hands out.
struct LookupExtractor<'a, F>(F, PhantomData<&'a str>);

impl<'a, F: Fn(&str) -> Option<&'a str>> Extractor for LookupExtractor<'a, F> {
    fn get(&self, key: &str) -> Option<&str> {
        (self.0)(key)
    }

    fn keys(&self) -> Vec<&str> {
        [TRACEPARENT, TRACESTATE]
            .into_iter()
            .filter(|name| (self.0)(name).is_some())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_sdk::trace::SdkTracerProvider;
    use tracing_subscriber::layer::SubscriberExt;

    use super::*;
    use crate::NewMessage;

    fn subscriber() -> impl tracing::Subscriber + Send + Sync {
        let tracer = SdkTracerProvider::builder().build().tracer("test");
        tracing_subscriber::registry().with(tracing_opentelemetry::layer().with_tracer(tracer))
    }

    fn invoice_paid() -> NewMessage {
        NewMessage::builder("billing", "invoice.paid")
            .build()
            .expect("valid")
    }

    #[test]
    fn build_records_the_current_span_as_traceparent() {
        tracing::subscriber::with_default(subscriber(), || {
            let span = tracing::info_span!("request");
            let expected = span.context().span().span_context().clone();
            let message = span.in_scope(invoice_paid);
            let traceparent = &message.headers()[TRACEPARENT];
            assert_eq!(
                traceparent,
                &format!("00-{}-{}-01", expected.trace_id(), expected.span_id())
            );
            assert!(
                !message.headers().contains_key(TRACESTATE),
                "no empty tracestate"
            );
            assert_eq!(
                span_context_of(message.headers()).map(|c| c.span_id()),
                Some(expected.span_id())
            );
        });
    }

    #[test]
    fn an_explicit_traceparent_is_kept_and_nothing_is_added_outside_a_trace() {
        tracing::subscriber::with_default(subscriber(), || {
            let given = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
            let explicit = tracing::info_span!("request").in_scope(|| {
                NewMessage::builder("billing", "invoice.paid")
                    .header("TraceParent", given)
                    .build()
                    .expect("valid")
            });
            assert_eq!(explicit.headers().len(), 1);
            assert_eq!(explicit.headers()["TraceParent"], given);
            assert_eq!(
                span_context_of(explicit.headers()).map(|c| c.trace_id().to_string()),
                Some("4bf92f3577b34da6a3ce929d0e0e4736".to_owned()),
                "found whatever the case of the name"
            );
            assert!(invoice_paid().headers().is_empty(), "no span, no header");
        });
        let untraced = tracing::info_span!("request").in_scope(invoice_paid);
        assert!(
            untraced.headers().is_empty(),
            "no OpenTelemetry layer, no header"
        );
    }

    #[test]
    fn malformed_trace_headers_are_no_context() {
        for value in [
            "",
            "00-00000000000000000000000000000000-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "zz-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "\u{0}\u{ffff}",
        ] {
            let headers = Headers::from([(TRACEPARENT.to_owned(), value.to_owned())]);
            assert!(span_context_of(&headers).is_none(), "{value:?}");
        }
    }
}
