//! One trace from a request to the receiver of its message (feature `opentelemetry`); no
//! servers needed.
//!
//! ```text
//! cargo run --example traced_checkout --features traced
//! ```
//!
//! A request span pays order 42: the order update and its outbox row commit in one SQLite
//! transaction, and the message, built inside the request's span, records that span as
//! its `traceparent`. The relay publishes it as a webhook; its `outbox_publish` span links
//! to the request's span. The receiver continues the request's trace from the header the
//! webhook carries. Each finished span is printed as a line (a stand-in for an OTLP
//! exporter); the last line sums up what the spans show.

fn main() -> std::process::ExitCode {
    outbox_examples::run_example(outbox_examples::traced_checkout::run(), |s| {
        s.receiver_in_request_trace && s.publish_linked_to_request && s.lost == 0
    })
}
