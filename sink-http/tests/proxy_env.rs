//! Proxies from the environment are ignored: a proxy would resolve names itself, beyond
//! the SSRF guard's reach. `HTTP(S)_PROXY` point at a canary, the sink delivers to a real
//! server directly, and the canary sees nothing.
//!
//! Setting environment variables inside a running test needs `unsafe` (edition 2024),
//! which the workspace forbids, so this file is its own harness (`harness = false`): run
//! plainly it is the test; with `OUTBOX_PROXY_TEST_URL` set it is the child that publishes.

mod common;

use common::{Canary, TestServer, message};
use outbox_engine::testkit::publish;

async fn child(url: String) {
    let sink = common::sink(common::config(url));
    assert!(publish(&sink, &[message("t", 1)]).await[0].is_published());
}

async fn parent() {
    let canary = Canary::start().await;
    let server = TestServer::start().await;
    let proxy = format!("http://127.0.0.1:{}", canary.port);
    let output = outbox_test_support::output_within(
        "the publishing child",
        std::time::Duration::from_secs(60),
        std::process::Command::new(std::env::current_exe().unwrap())
            .env("HTTP_PROXY", &proxy)
            .env("http_proxy", &proxy)
            .env("HTTPS_PROXY", &proxy)
            .env("ALL_PROXY", &proxy)
            .env("OUTBOX_PROXY_TEST_URL", server.url("/via-direct")),
    );
    assert!(
        output.status.success(),
        "child failed:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(server.count(), 1, "delivered directly");
    assert_eq!(canary.connections(), 0, "the proxy was used");
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    if let Ok(url) = std::env::var("OUTBOX_PROXY_TEST_URL") {
        runtime.block_on(child(url));
        return;
    }
    outbox_test_support::run_single_test("proxies_from_the_environment_are_ignored", move || {
        runtime.block_on(parent())
    });
}
