//! Tests of the test harness itself: a test that spawns a child ends it however the test
//! ends. `scripts/check-harness.sh` runs this test with `OUTBOX_HARNESS_SELFTEST=panic`
//! (the test fails after spawning) and `=hang` (the test never ends and the runner's
//! time limit kills it), and checks that the child is gone and the run is reported red.

use std::process::Command;
use std::time::Duration;

use outbox_test_support::{ChildGuard, process_exists};

#[test]
fn a_spawned_child_ends_with_its_test() {
    let mut sleeper = ChildGuard::spawn("sleep 300", Command::new("sleep").arg("300"));
    let pid = sleeper.id();
    if let Ok(file) = std::env::var("OUTBOX_HARNESS_PIDFILE") {
        std::fs::write(file, pid.to_string()).expect("write the pid file");
    }
    match std::env::var("OUTBOX_HARNESS_SELFTEST").as_deref() {
        Ok("panic") => {
            panic!("deliberate failure with a child running (OUTBOX_HARNESS_SELFTEST=panic)")
        }
        Ok("hang") => loop {
            std::thread::sleep(Duration::from_secs(1));
        },
        _ => {}
    }
    assert!(process_exists(pid), "the child runs while its guard lives");
    assert!(sleeper.try_wait().is_none(), "sleep 300 has not exited");
    drop(sleeper);
    assert!(
        !process_exists(pid),
        "dropping the guard killed and reaped the child"
    );
}

#[test]
fn a_panicking_test_kills_its_child_while_unwinding() {
    let (tx, rx) = std::sync::mpsc::channel();
    let panicked = std::thread::spawn(move || {
        let sleeper = ChildGuard::spawn("sleep 300", Command::new("sleep").arg("300"));
        tx.send(sleeper.id()).unwrap();
        panic!("a test body fails with a guarded child running");
    })
    .join();
    assert!(panicked.is_err(), "the body panicked");
    let pid = rx.recv().unwrap();
    assert!(
        !process_exists(pid),
        "the child was killed during the unwind"
    );
}

#[test]
fn a_child_outliving_its_deadline_is_killed() {
    let started = std::time::Instant::now();
    let result = std::panic::catch_unwind(|| {
        outbox_test_support::output_within(
            "sleep 300",
            Duration::from_millis(200),
            Command::new("sleep").arg("300"),
        )
    });
    let message = *result
        .expect_err("a deadline miss panics")
        .downcast::<String>()
        .unwrap();
    assert!(message.contains("did not finish within 200ms"), "{message}");
    let pid: u32 = message
        .split("(pid ")
        .nth(1)
        .and_then(|rest| rest.split(')').next())
        .and_then(|pid| pid.parse().ok())
        .expect("the message names the pid");
    assert!(!process_exists(pid), "the late child was killed and reaped");
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[test]
fn output_within_returns_what_the_child_printed() {
    let output = outbox_test_support::output_within(
        "sh",
        Duration::from_secs(10),
        Command::new("sh").args(["-c", "echo out; echo err >&2; exit 3"]),
    );
    assert_eq!(output.stdout, b"out\n");
    assert_eq!(output.stderr, b"err\n");
    assert_eq!(output.status.code(), Some(3));
}
