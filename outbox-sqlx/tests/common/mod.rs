//! Shared test helpers: where the servers are, fresh table names, message factories.
#![allow(dead_code, unreachable_pub)]

use outbox_core::NewMessage;

/// Reads a server URL from `var`, or the default that `scripts/services.sh` provides.
pub fn url(var: &str, default: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| default.to_owned())
}

/// Explains which server is missing and how to start it, then fails the test.
pub fn no_server(what: &str, var: &str, url: &str, error: impl std::fmt::Display) -> ! {
    panic!(
        "{what} is not reachable at {url} ({error}).\n\
         These tests need a real {what}: run `scripts/services.sh` (it installs and starts it),\n\
         or point {var} at one. Use `scripts/test.sh` to start services and run everything."
    )
}

/// A table name no other test uses.
pub fn fresh_table(prefix: &str) -> String {
    format!("{prefix}_{:016x}", fastrand::u64(..))
}

/// A small JSON message for `destination`.
pub fn message(destination: &str, n: u64) -> NewMessage {
    NewMessage::builder(destination, "test.event")
        .json(&serde_json::json!({ "n": n }))
        .build()
        .expect("valid message")
}
