//! Shared test helpers: where the servers are, fresh table names, message factories.
#![allow(dead_code, unreachable_pub)]

use outbox_core::NewMessage;

/// Reads a server URL from `var`, or the default that `scripts/services.sh` provides.
pub fn url(var: &str, default: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| default.to_owned())
}

/// Explains which server is missing and how to start it, then fails the test.
pub fn no_server(what: &str, var: &str, url: &str, error: impl std::fmt::Display) -> ! {
    panic!(
        "{what} is not reachable at {url} ({error}).\n\
         These tests need a real {what}: run `scripts/services.sh` (it installs and starts it),\n\
         or point {var} at one. Use `scripts/test.sh` to start services and run everything."
    )
}

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

/// The body of a `harness = false` test file holding one test: honours a name filter the
/// way libtest does, runs `test`, and prints libtest's lines so runners can read them.
pub fn run_single_test(
    name: &str,
    runtime: &tokio::runtime::Runtime,
    test: impl std::future::Future<Output = ()>,
) {
    let filter = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    if filter.is_some_and(|f| !name.contains(&f)) {
        println!("test result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; 1 filtered out");
        return;
    }
    let started = std::time::Instant::now();
    println!("running 1 test");
    runtime.block_on(test);
    println!("test {name} ... ok");
    println!(
        "\ntest result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in {:.2}s\n",
        started.elapsed().as_secs_f64()
    );
}
