//! The quickstart: no servers needed.
//!
//! ```text
//! cargo run --example quickstart
//! ```
//!
//! Needs a Rust toolchain and a C compiler (SQLite is compiled from its sources); no
//! server and no system library. At the workspace root this builds the examples package
//! alone with its default features, so nothing else is compiled.
//!
//! A tiny order service commits orders and outbox rows in one SQLite transaction. A relay
//! delivers signed webhooks to a receiver running in the same process, which verifies each
//! one and deduplicates it with an inbox inside its own transaction. On purpose, one
//! delivery fails and is retried, one acknowledgement is lost after the receiver committed
//! (so the relay delivers again and the inbox drops the copy), and one order is refused
//! for good (a dead letter). The last line sums up what the receiver saw.

fn main() -> std::process::ExitCode {
    let dir = std::env::temp_dir().join("outbox-quickstart");
    outbox_examples::run_example(outbox_examples::quickstart::run(dir), |s| s.lost == 0)
}
