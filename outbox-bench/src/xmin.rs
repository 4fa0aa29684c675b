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

use std::sync::atomic::Ordering as Atomic;
use std::time::{Duration, Instant};

use outbox_engine::{NewMessage, Purge, PurgeRequest, Relay};
use outbox_sqlx::PublishedRows;
use outbox_sqlx::postgres::PgOutbox;

use crate::Scale;
use crate::report::{Report, median};
use crate::setup::{Bench, BoxError, NoopSink};

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

    let ratio = |rate: f64, i: usize| format!("{:.2}", rate / baseline[i]);
    let mut rows = vec![vec![
        "before (nothing held)".to_owned(),
        format!("{:.0}", baseline[0]),
        "1.00".to_owned(),
        format!("{:.0}", baseline[1]),
        "1.00".to_owned(),
        format!("{:.0}", baseline[2]),
        "1.00".to_owned(),
        "—".to_owned(),
    ]];
    let mut curve = Vec::new();
    for (minute, (rates, dead)) in minutes.iter().enumerate() {
        let rates = rates.each_ref().map(|r| median(r));
        rows.push(vec![
            format!("held, minute {}", minute + 1),
            format!("{:.0}", rates[0]),
            ratio(rates[0], 0),
            format!("{:.0}", rates[1]),
            ratio(rates[1], 1),
            format!("{:.0}", rates[2]),
            ratio(rates[2], 2),
            dead.to_string(),
        ]);
        curve.push(serde_json::json!({
            "minute": minute + 1, "keep": rates[0], "delete": rates[1], "rotate": rates[2],
            "keep_ratio": rates[0] / baseline[0], "delete_ratio": rates[1] / baseline[1],
            "rotate_ratio": rates[2] / baseline[2], "dead_versions": dead,
        }));
    }
    rows.push(vec![
        "released, vacuumed".to_owned(),
        format!("{:.0}", after[0]),
        ratio(after[0], 0),
        format!("{:.0}", after[1]),
        ratio(after[1], 1),
        format!("{:.0}", after[2]),
        ratio(after[2], 2),
        "—".to_owned(),
    ]);
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
    for start in (0..n).step_by(1000) {
        let messages: Vec<NewMessage> = (start..(start + 1000).min(n))
            .map(|i| {
                NewMessage::builder("bench", "bench.event")
                    .json(&serde_json::json!({ "n": i }))
                    .build()
                    .expect("valid")
            })
            .collect();
        let mut tx = bench.pool.begin().await?;
        outbox.enqueue_all(&mut tx, &messages).await?;
        tx.commit().await?;
    }
    let sink = NoopSink::default();
    let relay = Relay::builder(outbox.clone())
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
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
        .await;
    let rate = n as f64 / started.elapsed().as_secs_f64();
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
