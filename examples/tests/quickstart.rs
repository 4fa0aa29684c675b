//! The quickstart runs end to end and its summary is exactly what the story promises.

mod common;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quickstart_delivers_everything_once() {
    let summary = common::run_in_temp_dir("quickstart", outbox_examples::quickstart::run).await;
    assert_eq!(
        summary.to_string(),
        "published=9 dead=1 duplicates_ignored=1 lost=0"
    );
}
