//! The webhook gateway example runs end to end against PostgreSQL (`scripts/services.sh`),
//! replaying the dead letters once in process and once with the `outbox` CLI binary.

use std::path::PathBuf;
use std::process::Command;

use outbox_examples::webhook_gateway::{GLOBEX_COOL_DOWN, Replay, run};

const SUMMARY: &str = "accepted=5 retried_posts=1 rejected=1 committed_before_ack=5 deliveries=13 dead=5 replayed=5 delivered=13 circuit_opened=true lost=0";

/// The `outbox` binary of `outbox-cli`: `$OUTBOX_CLI` (`scripts/test.sh` sets it to the
/// binary its test build made), or built now into this test's target directory.
fn outbox_cli() -> PathBuf {
    if let Some(path) = std::env::var_os("OUTBOX_CLI") {
        return path.into();
    }
    // This test runs as target/<profile>/deps/<name>; binaries go to target/<profile>.
    let exe = std::env::current_exe().expect("test executable");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target dir");
    let target_dir = profile_dir.parent().expect("target dir");
    let mut build = Command::new(env!("CARGO"));
    build
        .args(["build", "--quiet", "-p", "outbox-cli", "--bin", "outbox"])
        .env("CARGO_TARGET_DIR", target_dir);
    if profile_dir.ends_with("release") {
        build.arg("--release");
    }
    let output = outbox_test_support::output_within(
        "cargo build -p outbox-cli",
        std::time::Duration::from_secs(600),
        &mut build,
    );
    assert!(
        output.status.success(),
        "building the outbox CLI failed: {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let binary = profile_dir.join(format!("outbox{}", std::env::consts::EXE_SUFFIX));
    assert!(binary.exists(), "{} was not built", binary.display());
    binary
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_replayed_with_the_api_are_all_delivered() {
    let summary = run(Replay::Api).await.expect("webhook_gateway");
    assert_eq!(summary.to_string(), SUMMARY);
    assert!(summary.globex_quiet >= GLOBEX_COOL_DOWN, "{summary:?}");
    assert!(summary.cli_output.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_replayed_with_the_cli_are_all_delivered() {
    let cli = outbox_cli();
    let summary = run(Replay::Cli(cli)).await.expect("webhook_gateway");
    assert_eq!(summary.to_string(), SUMMARY);
    assert_eq!(
        summary.cli_output,
        ["would replay 5 dead letter(s)", "replayed 5 dead letter(s)"]
    );
}
