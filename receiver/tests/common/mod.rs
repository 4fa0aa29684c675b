//! What the receiver tests share: secrets, and the real HTTP sink that sends to them.
#![allow(dead_code, unreachable_pub)]

use chrono::Utc;
use outbox_engine::{Message, NewMessage};
use outbox_sink_http::{HttpSink, HttpSinkConfig};

pub const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
pub const OLD_SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";

/// A route to `url` that may reach loopback (the SSRF guard refuses it by default).
pub fn config(url: impl Into<String>) -> HttpSinkConfig {
    HttpSinkConfig::new(url).allow("127.0.0.1/32")
}

/// The sink for `config`, which must be valid.
pub fn sink(config: HttpSinkConfig) -> HttpSink {
    HttpSink::new(config).expect("valid sink")
}

/// A claimed-form JSON message for `dest`.
pub fn message(dest: &str, n: u64) -> Message {
    NewMessage::builder(dest, "test.event")
        .json(&serde_json::json!({ "n": n }))
        .build()
        .unwrap()
        .into_message(Utc::now())
}
