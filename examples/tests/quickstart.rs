//! The quickstart runs end to end and its summary is exactly what the story promises.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quickstart_delivers_everything_once() {
    let dir = std::env::temp_dir().join(format!("outbox-quickstart-test-{:x}", std::process::id()));
    let summary = outbox_examples::quickstart::run(dir.clone())
        .await
        .expect("quickstart");
    assert_eq!(
        summary.to_string(),
        "published=9 dead=1 duplicates_ignored=1 lost=0"
    );
    let _ = std::fs::remove_dir_all(dir);
}
