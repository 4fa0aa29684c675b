//! Shared test helpers: where the servers are, fresh table names, message factories.
#![allow(dead_code, unreachable_pub, unused_imports)]

use outbox_core::NewMessage;

pub use outbox_test_support::{no_server, server_url as url};

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
