//! SaaS event bus: invoice and tenant events (tenant id on every row, per-aggregate
//! ordering) published to one route built from a TOML configuration — first to a Redis
//! stream, then, with only the configuration text changed, to an HTTP endpoint, a
//! RabbitMQ exchange, a Kafka topic and an Amazon SQS FIFO queue.
//!
//! ```text
//! scripts/services.sh          # PostgreSQL, Redis, RabbitMQ, Kafka and SQS on loopback
//! cargo run --example saas_event_bus --features workloads
//! ```
//!
//! Needs the `workloads` feature, which builds librdkafka from its C sources (a C compiler
//! and make) and links libpq (Debian: `libpq-dev`; `scripts/services.sh` installs it).
//!
//! The story is in `examples/src/saas_event_bus.rs`; the last line sums it up.

fn main() -> std::process::ExitCode {
    outbox_examples::run_example(outbox_examples::saas_event_bus::run(), |s| {
        s.lost == 0 && s.out_of_order == 0
    })
}
