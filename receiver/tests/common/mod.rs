//! What the receiver tests share: secrets, and the real HTTP sink that sends to them.
#![allow(dead_code, unreachable_pub)]

use outbox_sink_http::{HttpSink, HttpSinkConfig};

pub const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
pub const OLD_SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";

/// The HTTP sink for a route to `url` on loopback (which the SSRF guard refuses unless
/// allowed), as `configure` sets it up.
pub fn sink(url: String, configure: impl FnOnce(HttpSinkConfig) -> HttpSinkConfig) -> HttpSink {
    HttpSink::new(configure(HttpSinkConfig::new(url).allow("127.0.0.1/32"))).expect("valid sink")
}
