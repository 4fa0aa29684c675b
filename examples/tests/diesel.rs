//! The diesel examples deliver every committed order once and no rolled-back one.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_diesel_quickstart_delivers_exactly_the_committed_orders() {
    let dir = tempfile_dir("sqlite");
    let summary = outbox_examples::diesel_orders::run_sqlite(dir.clone())
        .await
        .expect("diesel quickstart");
    assert_eq!(
        summary.to_string(),
        "committed=8 rolled_back=4 applied=8 unexpected=0 lost=0"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[cfg(feature = "workloads")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_diesel_async_postgres_story_delivers_exactly_the_committed_orders() {
    let dir = tempfile_dir("postgres");
    let summary = outbox_examples::diesel_orders::run_postgres(dir.clone())
        .await
        .expect("diesel PostgreSQL story");
    assert_eq!(
        summary.to_string(),
        "committed=8 rolled_back=4 applied=8 unexpected=0 lost=0"
    );
    let _ = std::fs::remove_dir_all(dir);
}

fn tempfile_dir(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!(
        "outbox-diesel-example-{name}-{:x}",
        std::process::id()
    ))
}
