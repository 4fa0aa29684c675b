//! Commerce notifications: order status changes become WhatsApp-style template messages
//! through a rate-limited HTTP API, with deterministic idempotency keys, permanent 4xx
//! answers dead-lettered while the rest flows, and a courier webhook that writes a
//! customer message and an ads-conversion event (Redis Streams) in one transaction.
//!
//! ```text
//! scripts/services.sh          # PostgreSQL and Redis on loopback
//! cargo run --example commerce_notifications --features workloads
//! ```
//!
//! Needs the `workloads` feature, which builds librdkafka from its C sources (a C compiler
//! and make) and links libpq (Debian: `libpq-dev`; `scripts/services.sh` installs it).
//!
//! The story is in `examples/src/commerce_notifications.rs`; the last line sums it up.

fn main() -> std::process::ExitCode {
    outbox_examples::run_example(outbox_examples::commerce_notifications::run(), |s| {
        s.lost == 0 && s.billed_twice == 0
    })
}
