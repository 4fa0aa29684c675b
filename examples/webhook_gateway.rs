//! Webhook gateway: an axum API that answers 2xx only after the enqueue transaction
//! committed, fan-out to several signed endpoints that verify and deduplicate with an
//! inbox, a per-endpoint circuit breaker, and dead letters replayed once the broken
//! endpoint is fixed.
//!
//! ```text
//! scripts/services.sh          # PostgreSQL on loopback
//! cargo run --example webhook_gateway --features workloads
//! ```
//!
//! Needs the `workloads` feature, which builds librdkafka from its C sources (a C compiler
//! and make) and links libpq (Debian: `libpq-dev`; `scripts/services.sh` installs it).
//!
//! The story is in `examples/src/webhook_gateway.rs`; the last line sums it up. The
//! example replays in process and prints the equivalent `outbox dead replay` command;
//! the test `examples/tests/webhook_gateway.rs` runs that command with the CLI binary.

fn main() -> std::process::ExitCode {
    let replay = outbox_examples::webhook_gateway::Replay::Api;
    outbox_examples::run_example(outbox_examples::webhook_gateway::run(replay), |s| {
        s.lost == 0
    })
}
