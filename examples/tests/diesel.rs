//! The diesel examples deliver every committed order once and no rolled-back one.

mod common;

/// The summary of both stories: every committed order applied once, none rolled back.
const SUMMARY: &str = "committed=8 rolled_back=4 applied=8 unexpected=0 lost=0";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_diesel_quickstart_delivers_exactly_the_committed_orders() {
    let summary =
        common::run_in_temp_dir("diesel-sqlite", outbox_examples::diesel_orders::run_sqlite).await;
    assert_eq!(summary.to_string(), SUMMARY);
}

#[cfg(feature = "workloads")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_diesel_async_postgres_story_delivers_exactly_the_committed_orders() {
    let summary = common::run_in_temp_dir(
        "diesel-postgres",
        outbox_examples::diesel_orders::run_postgres,
    )
    .await;
    assert_eq!(summary.to_string(), SUMMARY);
}
