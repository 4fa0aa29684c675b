//! The commerce example runs end to end against PostgreSQL and Redis (`scripts/services.sh`)
//! and its summary is exactly what the story promises.

use std::time::Duration;

use outbox_examples::commerce_notifications::{SEND_BURST, SEND_RATE, run};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_transition_is_billed_once_and_refusals_dead_letter() {
    let summary = run().await.expect("commerce_notifications");
    assert_eq!(
        summary.to_string(),
        "rows=28 billed=19 duplicates_dropped=2 billed_twice=0 dead=2 conversions=4 lost=0"
    );
    // 23 rows go to the provider: each reached it once (a throttled one once more).
    assert_eq!(summary.requests, 23 + summary.throttled, "{summary:?}");
    // The relay kept to the account's rate: n requests at r/s with a burst of b cannot
    // finish sooner than (n - b) / r after the relay started.
    let floor = (summary.requests - u64::from(SEND_BURST)) as f64 / SEND_RATE;
    assert!(
        summary.drain_time + Duration::from_millis(1) >= Duration::from_secs_f64(floor),
        "{} requests in {:?}: faster than {SEND_RATE}/s",
        summary.requests,
        summary.drain_time
    );
}
