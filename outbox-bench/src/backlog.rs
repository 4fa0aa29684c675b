//! `backlog`: does a table full of finished rows slow the relay down? Drains N messages in
//! mark-published mode on an empty table, then again after M published rows were added
//! (10 million in a full run), and reports the ratio.

use std::sync::atomic::Ordering as Atomic;
use std::time::{Duration, Instant};

use outbox_engine::{NewMessage, Relay};
use outbox_sqlx::PublishedRows;

use crate::Scale;
use crate::report::Report;
use crate::setup::{Bench, BoxError, NoopSink};

pub(crate) async fn run(bench: &Bench, scale: Scale, report: &mut Report) -> Result<(), BoxError> {
    let n = scale.drain_rows;
    // Empty, full, empty again: the baseline is the mean of the two empty runs, so a drift
    // of the machine during the long bulk insert does not count as backlog cost.
    let before = drain(bench, n, 0).await?;
    let finished = scale.finished_rows;
    let full = drain(bench, n, finished).await?;
    let after = drain(bench, n, 0).await?;
    let empty = (before + after) / 2.0;
    let rows = vec![
        vec!["0".to_owned(), format!("{empty:.0}"), "1.00".to_owned()],
        vec![
            finished.to_string(),
            format!("{full:.0}"),
            format!("{:.2}", full / empty),
        ],
    ];
    report.section(
        "backlog",
        &format!("Relay drain of {n} messages (mark-published mode, batch 500 × 2 workers), with and without finished rows already in the table, messages/s."),
        &["finished rows in table", "messages/s", "vs empty table"],
        rows,
        serde_json::json!({ "empty": empty, "with_finished": full, "finished_rows": finished, "ratio": full / empty }),
    );
    Ok(())
}

async fn drain(bench: &Bench, n: usize, finished: usize) -> Result<f64, BoxError> {
    let outbox = bench
        .fresh_outbox("bench_backlog_outbox", PublishedRows::Keep)
        .await?;
    let pool = &bench.pool;
    if finished > 0 {
        bench
            .fill_published("bench_backlog_outbox", finished)
            .await?;
    }
    for start in (0..n).step_by(1000) {
        let messages: Vec<NewMessage> = (start..(start + 1000).min(n))
            .map(|i| {
                NewMessage::builder("bench", "bench.event")
                    .json(&serde_json::json!({ "n": i }))
                    .build()
                    .expect("valid")
            })
            .collect();
        let mut tx = pool.begin().await?;
        outbox.enqueue_all(&mut tx, &messages).await?;
        tx.commit().await?;
    }
    sqlx::query("VACUUM ANALYZE bench_backlog_outbox")
        .execute(pool)
        .await?;
    let sink = NoopSink::default();
    let relay = Relay::builder(outbox)
        .route("bench", sink.clone())
        .batch_size(500)
        .concurrency(2)
        .poll_interval(Duration::from_millis(20))
        .build()?;
    let count = sink.count.clone();
    let started = Instant::now();
    relay
        .run(async move {
            while count.load(Atomic::Relaxed) < n {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
    let rate = n as f64 / started.elapsed().as_secs_f64();
    sqlx::query("DROP TABLE bench_backlog_outbox CASCADE")
        .execute(pool)
        .await?;
    Ok(rate)
}
