//! `backlog`: does a table full of finished rows slow the relay down? Drains N messages in
//! mark-published mode on an empty table, then again after M published rows were added
//! (10 million in a full run, `--finished-rows` to change it), and reports the ratio,
//! for the plain table and for the rotate layout's slots.

use outbox_sqlx::PublishedRows;

use crate::Scale;
use crate::report::Report;
use crate::setup::{Bench, BoxError, timed_drain};

/// A table layout the backlog scenario can run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Layout {
    /// One table, published rows kept.
    Keep,
    /// The rotate layout's three slots.
    Rotate,
}

pub(crate) async fn run(
    bench: &Bench,
    scale: Scale,
    layouts: &[Layout],
    report: &mut Report,
) -> Result<(), BoxError> {
    let n = scale.drain_rows;
    let finished = scale.finished_rows;
    let mut rows = Vec::new();
    let mut json = serde_json::Map::new();
    let layouts = if layouts.is_empty() {
        &[Layout::Keep, Layout::Rotate][..]
    } else {
        layouts
    };
    for &chosen in layouts {
        let (layout, mode) = match chosen {
            Layout::Keep => ("keep", PublishedRows::Keep),
            Layout::Rotate => ("rotate", PublishedRows::Rotate),
        };
        // Empty, full, empty again: the baseline is the mean of the two empty runs, so a
        // drift of the machine during the long bulk insert does not count as backlog cost.
        let before = drain(bench, n, 0, mode).await?;
        let full = drain(bench, n, finished, mode).await?;
        let after = drain(bench, n, 0, mode).await?;
        let empty = (before + after) / 2.0;
        rows.push(vec![
            layout.to_owned(),
            format!("{empty:.0}"),
            finished.to_string(),
            format!("{full:.0}"),
            format!("{:.2}", full / empty),
        ]);
        json.insert(
            layout.to_owned(),
            serde_json::json!({ "empty": empty, "with_finished": full, "ratio": full / empty }),
        );
    }
    json.insert("finished_rows".to_owned(), finished.into());
    report.section(
        "backlog",
        &format!("Relay drain of {n} messages (published rows kept, batch 500 × 2 workers), on an empty table and with finished rows already in it, messages/s. `keep`: one table; `rotate`: the three slots of decision 0031, the finished rows spread over them."),
        &["layout", "empty table msg/s", "finished rows", "msg/s", "vs empty table"],
        rows,
        serde_json::Value::Object(json),
    );
    Ok(())
}

async fn drain(
    bench: &Bench,
    n: usize,
    finished: usize,
    mode: PublishedRows,
) -> Result<f64, BoxError> {
    let outbox = bench.fresh_outbox("bench_backlog_outbox", mode).await?;
    let pool = &bench.pool;
    if finished > 0 {
        let slots = mode == PublishedRows::Rotate;
        bench
            .fill_published("bench_backlog_outbox", finished, slots)
            .await?;
    }
    bench.enqueue_bench(&outbox, n).await?;
    sqlx::query("VACUUM ANALYZE bench_backlog_outbox")
        .execute(pool)
        .await?;
    let rate = timed_drain(outbox, n, 500, 2).await?;
    sqlx::query("DROP TABLE IF EXISTS bench_backlog_outbox, bench_backlog_outbox_slots CASCADE")
        .execute(pool)
        .await?;
    Ok(rate)
}
