//! SaaS event bus: invoice and tenant events (tenant id on every row, per-aggregate
//! ordering) published to one route built from a TOML configuration — first to a Redis
//! stream, then, with only the configuration text changed, to an HTTP endpoint.
//!
//! ```text
//! scripts/services.sh          # PostgreSQL and Redis on loopback
//! cargo run --example saas_event_bus
//! ```
//!
//! The story is in `examples/src/saas_event_bus.rs`; the last line sums it up.

fn main() -> std::process::ExitCode {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    match runtime.block_on(outbox_examples::saas_event_bus::run()) {
        Ok(summary) => {
            println!("{summary}");
            if summary.lost == 0 && summary.out_of_order == 0 {
                std::process::ExitCode::SUCCESS
            } else {
                std::process::ExitCode::FAILURE
            }
        }
        Err(error) => {
            eprintln!("error: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}
