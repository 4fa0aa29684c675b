//! Proxies from the environment are ignored: a proxy would resolve names itself, beyond
//! the SSRF guard's reach. `HTTP(S)_PROXY` point at a canary, the sink delivers to a real
//! server directly, and the canary sees nothing.
//!
//! Setting environment variables inside a running test needs `unsafe` (edition 2024),
//! which the workspace forbids, so this file is its own harness (`harness = false`): run
//! plainly it is the test; with `OUTBOX_PROXY_TEST_URL` set it is the child that publishes.

mod common;

use std::time::Instant;

use common::{Canary, TestServer, message};
use outbox_core::Sink;
use outbox_sink_http::EndpointConfig;

async fn child(url: String) {
    let sink = common::sink_to("t", EndpointConfig::new(url));
    assert!(sink.publish(&[message("t", 1)]).await.unwrap()[0].is_published());
}

async fn parent() {
    let canary = Canary::start().await;
    let server = TestServer::start().await;
    let proxy = format!("http://127.0.0.1:{}", canary.port);
    let output = std::process::Command::new(std::env::current_exe().unwrap())
        .env("HTTP_PROXY", &proxy)
        .env("http_proxy", &proxy)
        .env("HTTPS_PROXY", &proxy)
        .env("ALL_PROXY", &proxy)
        .env("OUTBOX_PROXY_TEST_URL", server.url("/via-direct"))
        .output()
        .unwrap();
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
    let filter = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    if filter.is_some_and(|f| !"proxies_from_the_environment_are_ignored".contains(&f)) {
        println!("test result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; 1 filtered out");
        return;
    }
    let started = Instant::now();
    println!("running 1 test");
    runtime.block_on(parent());
    println!("test proxies_from_the_environment_are_ignored ... ok");
    println!(
        "\ntest result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in {:.2}s\n",
        started.elapsed().as_secs_f64()
    );
}
