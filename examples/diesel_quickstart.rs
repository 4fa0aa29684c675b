//! The outbox with diesel, no servers needed.
//!
//! ```text
//! cargo run --example diesel_quickstart --features diesel
//! ```
//!
//! A shop commits orders with diesel (SQLite): each order and its outbox message in one
//! `immediate_transaction`; every third order is declined and rolled back after its
//! message was enqueued. A relay delivers the messages as signed webhooks to a receiver
//! in the same process, which records each one in its diesel inbox and applies it in the
//! same transaction. The last line says what reached the receiver: every committed order
//! once, no rolled-back one.

fn main() -> std::process::ExitCode {
    let dir = std::env::temp_dir().join("outbox-diesel-quickstart");
    outbox_examples::run_example(outbox_examples::diesel_orders::run_sqlite(dir), |s| {
        s.lost == 0 && s.unexpected == 0
    })
}
