//! The examples' code, shared by `cargo run --example …` and the tests that run them.
//!
//! Each example is behind the feature that names what it needs (see `Cargo.toml`), so the
//! quickstart builds nothing it does not use.

#[cfg(feature = "workloads")]
pub mod commerce_notifications;
#[cfg(feature = "diesel")]
pub mod diesel_orders;
pub mod quickstart;
#[cfg(feature = "workloads")]
pub mod saas_event_bus;
#[cfg(feature = "traced")]
pub mod traced_checkout;
#[cfg(feature = "workloads")]
pub mod webhook_gateway;

#[cfg(feature = "workloads")]
mod support;

/// Runs an example's story on a fresh runtime, prints its summary line, and exits with
/// success only when `healthy` approves the summary.
pub fn run_example<S, E>(
    story: impl std::future::Future<Output = Result<S, E>>,
    healthy: impl FnOnce(&S) -> bool,
) -> std::process::ExitCode
where
    S: std::fmt::Display,
    E: std::fmt::Display,
{
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    match runtime.block_on(story) {
        Ok(summary) => {
            println!("{summary}");
            if healthy(&summary) {
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
