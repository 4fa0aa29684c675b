//! `held-xmin`: the drain while another transaction holds the xmin horizon back, so no
//! row version left by the relay can be vacuumed away (a forgotten `BEGIN` in a psql
//! session, a long report, a replica with `hot_standby_feedback`).
//!
//! Three outbox tables, keeping published rows, deleting them on publish, and keeping
//! them in rotating slots (rotated after each of its rounds), take rounds in turn: enqueue a batch of messages (not timed), then drain it with the relay
//! (timed). A few rounds run first with nothing held (the baseline); then one connection
//! opens a `REPEATABLE READ` transaction with an xid and keeps it for the hold time while
//! the rounds go on; then it ends, the tables are vacuumed, and one more round each
//! shows the recovery. Reported per minute of the hold, against each table's baseline.

use std::time::{Duration, Instant};

use outbox_engine::{Purge, PurgeRequest};
use outbox_sqlx::PublishedRows;
use outbox_sqlx::postgres::PgOutbox;

use crate::Scale;
use crate::report::{Report, median};
use crate::setup::{Bench, BoxError, timed_drain_checking};

const TABLES: [(&str, PublishedRows); 3] = [
    ("bench_xmin_keep", PublishedRows::Keep),
    ("bench_xmin_delete", PublishedRows::Delete),
    ("bench_xmin_rotate", PublishedRows::Rotate),
];
const BASELINE_ROUNDS: usize = 3;

pub(crate) async fn run(bench: &Bench, scale: Scale, report: &mut Report) -> Result<(), BoxError> {
    let n = scale.drain_rows / 2;
    let mut outboxes = Vec::new();
    for (name, mode) in TABLES {
        outboxes.push((bench.fresh_outbox(name, mode).await?, mode));
    }

    let mut baseline = [Vec::new(), Vec::new(), Vec::new()];
    for _ in 0..BASELINE_ROUNDS {
        for (i, outbox) in outboxes.iter().enumerate() {
            baseline[i].push(round(bench, outbox, n).await?);
        }
    }
    let baseline = baseline.map(|rates| median(&rates));

    // The holder: a snapshot and an xid, kept open while the rounds go on.
    let mut holder = bench.pool.begin().await?;
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        .execute(&mut *holder)
        .await?;
    sqlx::query("SELECT txid_current()")
        .execute(&mut *holder)
        .await?;
    let started = Instant::now();
    // Per minute of the hold: each table's rates, and the dead row versions at its end.
    let mut minutes: Vec<([Vec<f64>; 3], i64)> = Vec::new();
    while started.elapsed() < scale.xmin_hold {
        let minute = (started.elapsed().as_secs() / 60) as usize;
        if minutes.len() <= minute {
            minutes.push(([Vec::new(), Vec::new(), Vec::new()], 0));
        }
        for (i, outbox) in outboxes.iter().enumerate() {
            let rate = round(bench, outbox, n).await?;
            minutes[minute].0[i].push(rate);
        }
        minutes[minute].1 = dead_versions(bench).await?;
    }
    holder.rollback().await?;
    for (name, _) in TABLES {
        sqlx::query(&format!("VACUUM ANALYZE {name}"))
            .execute(&bench.pool)
            .await?;
    }
    let mut after = [0.0; 3];
    for (i, outbox) in outboxes.iter().enumerate() {
        after[i] = round(bench, outbox, n).await?;
    }

    // A phase's row: each table's rate and its ratio to that table's baseline.
    let row = |phase: String, rates: [f64; 3], dead: String| {
        let mut row = vec![phase];
        for (rate, base) in rates.into_iter().zip(baseline) {
            row.push(format!("{rate:.0}"));
            row.push(format!("{:.2}", rate / base));
        }
        row.push(dead);
        row
    };
    let mut rows = vec![row(
        "before (nothing held)".to_owned(),
        baseline,
        "—".to_owned(),
    )];
    let mut curve = Vec::new();
    for (minute, (rates, dead)) in minutes.iter().enumerate() {
        let rates = rates.each_ref().map(|r| median(r));
        rows.push(row(
            format!("held, minute {}", minute + 1),
            rates,
            dead.to_string(),
        ));
        curve.push(serde_json::json!({
            "minute": minute + 1, "keep": rates[0], "delete": rates[1], "rotate": rates[2],
            "keep_ratio": rates[0] / baseline[0], "delete_ratio": rates[1] / baseline[1],
            "rotate_ratio": rates[2] / baseline[2], "dead_versions": dead,
        }));
    }
    rows.push(row("released, vacuumed".to_owned(), after, "—".to_owned()));
    report.section(
        "held-xmin",
        &format!(
            "Relay drain of {n} messages per round (batch 500 × 2 workers, no-op sink), rounds \
             alternating between a table that keeps published rows, one that deletes them and \
             one in rotating slots (rotated after each of its rounds), \
             while another transaction holds the xmin horizon for {} s; median per minute, \
             messages/s, against the same table's rounds before the hold. Dead row versions: \
             `n_dead_tup` of the three tables at the minute's end.",
            scale.xmin_hold.as_secs()
        ),
        &[
            "phase",
            "keep msg/s",
            "keep vs before",
            "delete msg/s",
            "delete vs before",
            "rotate msg/s",
            "rotate vs before",
            "dead row versions",
        ],
        rows,
        serde_json::json!({
            "messages_per_round": n, "hold_s": scale.xmin_hold.as_secs(),
            "before": { "keep": baseline[0], "delete": baseline[1], "rotate": baseline[2] },
            "held": curve,
            "after": { "keep": after[0], "delete": after[1], "rotate": after[2] },
        }),
    );
    for (name, _) in TABLES {
        sqlx::query(&format!(
            "DROP TABLE IF EXISTS {name}, {name}_keys, {name}_slots CASCADE"
        ))
        .execute(&bench.pool)
        .await?;
    }
    Ok(())
}

/// Enqueues `n` messages (not timed), then drains them with a relay; returns messages/s.
/// A rotate table then rotates once (not timed; age zero stands for the hours between
/// rotations in service), so the drained rows leave two rounds later.
async fn round(
    bench: &Bench,
    (outbox, mode): &(PgOutbox, PublishedRows),
    n: usize,
) -> Result<f64, BoxError> {
    bench.enqueue_bench(outbox, n).await?;
    let rate = timed_drain_checking(outbox.clone(), n, 500, 2, Duration::from_millis(2)).await?;
    if *mode == PublishedRows::Rotate {
        outbox
            .purge(&PurgeRequest::published_older_than(Duration::ZERO))
            .await?;
    }
    Ok(rate)
}

/// Dead row versions of the tables (the rotate table's slots), as the statistics
/// collector last counted them.
async fn dead_versions(bench: &Bench) -> Result<i64, BoxError> {
    Ok(sqlx::query_scalar(
        "SELECT COALESCE(sum(n_dead_tup), 0)::bigint FROM pg_stat_user_tables \
         WHERE relname IN ('bench_xmin_keep', 'bench_xmin_delete') \
            OR relname LIKE 'bench\\_xmin\\_rotate\\_slot\\__'",
    )
    .fetch_one(&bench.pool)
    .await?)
}
