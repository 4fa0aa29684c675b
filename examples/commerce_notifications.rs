//! Commerce notifications: order status changes become WhatsApp-style template messages
//! through a rate-limited HTTP API, with deterministic idempotency keys, permanent 4xx
//! answers dead-lettered while the rest flows, and a courier webhook that writes a
//! customer message and an ads-conversion event (Redis Streams) in one transaction.
//!
//! ```text
//! scripts/services.sh          # PostgreSQL and Redis on loopback
//! cargo run --example commerce_notifications
//! ```
//!
//! The story is in `examples/src/commerce_notifications.rs`; the last line sums it up.

fn main() -> std::process::ExitCode {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    match runtime.block_on(outbox_examples::commerce_notifications::run()) {
        Ok(summary) => {
            println!("{summary}");
            if summary.lost == 0 && summary.billed_twice == 0 {
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
