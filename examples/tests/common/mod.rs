//! What the example tests share.

use std::future::Future;
use std::path::PathBuf;

/// Runs `story` in a fresh temporary directory named after `name`, removes the directory,
/// and returns the story's summary (panics, naming `name`, when the story failed).
pub(crate) async fn run_in_temp_dir<S, E, F>(name: &str, story: impl FnOnce(PathBuf) -> F) -> S
where
    F: Future<Output = Result<S, E>>,
    E: std::fmt::Display,
{
    let dir = std::env::temp_dir().join(format!("outbox-example-{name}-{:x}", std::process::id()));
    let result = story(dir.clone()).await;
    let _ = std::fs::remove_dir_all(dir);
    result.unwrap_or_else(|e| panic!("{name}: {e}"))
}
