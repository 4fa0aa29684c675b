//! The outbox with diesel-async on PostgreSQL (start it with `scripts/services.sh`).
//!
//! ```text
//! scripts/services.sh          # PostgreSQL on loopback
//! cargo run --example diesel_postgres --features workloads
//! ```
//!
//! Needs the `workloads` feature, which builds librdkafka from its C sources (a C compiler
//! and make) and links libpq (Debian: `libpq-dev`; `scripts/services.sh` installs it).
//!
//! Orders and their outbox messages are written on a diesel-async `AsyncPgConnection`
//! inside `transaction(async |conn| …)`; every third order is rolled back after its
//! message was enqueued. The relay opens the PostgreSQL store from a `diesel+postgres://`
//! URL and delivers signed webhooks to a receiver that deduplicates with its diesel inbox.

fn main() -> std::process::ExitCode {
    let dir = std::env::temp_dir().join("outbox-diesel-postgres");
    outbox_examples::run_example(outbox_examples::diesel_orders::run_postgres(dir), |s| {
        s.lost == 0 && s.unexpected == 0
    })
}
