//! `soak`: the relay under a steady offered load for a long time (30 minutes, 2 with
//! `--quick`), with the process's resident memory sampled every 10 seconds.
//!
//! Producers commit one message per transaction at 5,000/s offered (as in `latency`),
//! raising a wakeup after each commit; one relay (batch 100 × 2 workers, wakeups, delete
//! on publish) drains into a counting sink. Only counters are kept, so the benchmark's
//! own bookkeeping does not grow: the RSS series is the relay's, the producers' and the
//! runtime's. The table is vacuumed every minute, as autovacuum would.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use outbox_engine::{NewMessage, Relay};
use outbox_sqlx::PublishedRows;

use crate::Scale;
use crate::report::Report;
use crate::setup::{Bench, BoxError, NoopSink, commit_one, memory_mib, producer_ticks};

const RATE: u64 = 5_000;
const PRODUCERS: u64 = 4;
const SAMPLE: Duration = Duration::from_secs(10);
/// A `VACUUM` of the outbox table every this many samples (every minute).
const VACUUM_EVERY: usize = 6;

/// One sample of the soak.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sample {
    pub(crate) at_s: f64,
    pub(crate) rss_mib: f64,
    pub(crate) committed: u64,
    pub(crate) delivered: u64,
}

pub(crate) async fn run(bench: &Bench, scale: Scale, report: &mut Report) -> Result<(), BoxError> {
    let time = scale.soak_time;
    let outbox = bench
        .fresh_outbox("bench_soak_outbox", PublishedRows::Delete)
        .await?;
    let listener = outbox.listen().await?.ok_or("PostgreSQL listens")?;
    let sink = NoopSink::default();
    let relay = Relay::builder(outbox.clone())
        .route("bench", sink.clone())
        .batch_size(100)
        .concurrency(2)
        .wakeup(listener.wakeup())
        .build()?;
    let relay = tokio::spawn(relay.run(std::future::pending()));

    let committed = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let mut producers = tokio::task::JoinSet::new();
    // One notifier per process, shared by its writers (as `PgOutbox::notifier` says).
    let notifier = outbox.notifier();
    for _ in 0..PRODUCERS {
        let (pool, outbox, committed, stop, notifier) = (
            bench.pool.clone(),
            outbox.clone(),
            committed.clone(),
            stop.clone(),
            notifier.clone(),
        );
        producers.spawn(async move {
            let mut ticks = producer_ticks(PRODUCERS, RATE);
            while !stop.load(Ordering::Relaxed) {
                ticks.tick().await;
                let message = NewMessage::builder("bench", "bench.event")
                    .json(&serde_json::json!({ "at": started.elapsed().as_micros() as u64 }))
                    .build()
                    .expect("valid");
                commit_one(&pool, &outbox, &message).await?;
                committed.fetch_add(1, Ordering::Relaxed);
                notifier.notify();
            }
            Ok::<(), sqlx::Error>(())
        });
    }

    let mut samples = Vec::new();
    let mut next = started + SAMPLE;
    let mut vacuums = tokio::task::JoinSet::new();
    while started.elapsed() < time {
        tokio::time::sleep_until(next.into()).await;
        next += SAMPLE;
        // Autovacuum's part, done by hand: the benchmark machine runs PostgreSQL with
        // `autovacuum = off`, and every delivered row leaves a dead tuple behind.
        if samples.len() % VACUUM_EVERY == VACUUM_EVERY - 1 && vacuums.is_empty() {
            let pool = bench.pool.clone();
            vacuums
                .spawn(async move { sqlx::query("VACUUM bench_soak_outbox").execute(&pool).await });
        }
        if let Some(done) = vacuums.try_join_next() {
            done??;
        }
        if let Some(done) = producers.try_join_next() {
            done??;
            return Err("a producer stopped early".into());
        }
        let sample = Sample {
            at_s: started.elapsed().as_secs_f64(),
            rss_mib: memory_mib().1,
            committed: committed.load(Ordering::Relaxed),
            delivered: sink.count.load(Ordering::Relaxed) as u64,
        };
        println!(
            "soak {:>5.0} s: RSS {:.1} MiB, committed {}, delivered {}",
            sample.at_s, sample.rss_mib, sample.committed, sample.delivered
        );
        samples.push(sample);
    }
    stop.store(true, Ordering::Relaxed);
    while let Some(done) = producers.join_next().await {
        done??;
    }
    let total = committed.load(Ordering::Relaxed);
    let deadline = Instant::now() + Duration::from_secs(30);
    while (sink.count.load(Ordering::Relaxed) as u64) < total && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    relay.abort();
    let delivered = sink.count.load(Ordering::Relaxed) as u64;
    if delivered < total {
        return Err(format!(
            "only {delivered} of {total} committed messages were delivered within 30 s of the end"
        )
        .into());
    }
    summarize(&samples, time, report)
}

fn summarize(samples: &[Sample], time: Duration, report: &mut Report) -> Result<(), BoxError> {
    let (Some(first), Some(last)) = (samples.first(), samples.last()) else {
        return Err("the soak took no sample".into());
    };
    // The first minute is warm-up (pools, buffers, the allocator's arenas).
    let settled: Vec<&Sample> = samples.iter().filter(|s| s.at_s >= 60.0).collect();
    let settled = if settled.is_empty() {
        samples.iter().collect()
    } else {
        settled
    };
    let min = settled
        .iter()
        .map(|s| s.rss_mib)
        .fold(f64::INFINITY, f64::min);
    let max = settled.iter().map(|s| s.rss_mib).fold(0.0, f64::max);
    let rate = (last.committed - first.committed) as f64 / (last.at_s - first.at_s).max(1.0);
    let mut rows = Vec::new();
    let mut previous: Option<&Sample> = None;
    for s in samples {
        let every = if time >= Duration::from_secs(600) {
            300.0
        } else {
            30.0
        };
        let due = previous.is_none_or(|p| s.at_s - p.at_s >= every - 1.0);
        if !due && !std::ptr::eq(s, last) {
            continue;
        }
        let window = previous.map_or((s.committed, s.at_s), |p| {
            (s.committed - p.committed, s.at_s - p.at_s)
        });
        rows.push(vec![
            format!("{:.1}", s.at_s / 60.0),
            format!("{:.1}", s.rss_mib),
            format!("{:.0}", window.0 as f64 / window.1),
            (s.committed - s.delivered).to_string(),
        ]);
        previous = Some(s);
    }
    report.soak = samples.to_vec();
    report.section(
        "soak",
        &format!(
            "{} minutes at {RATE} messages/s offered ({PRODUCERS} producers, one message per transaction, a wakeup after each commit); one relay, batch 100 × 2 workers, delete on publish, no-op sink, a `VACUUM` of the table every minute (the machine's PostgreSQL runs with autovacuum off). RSS of the whole benchmark process, sampled every {} s (all samples in the plot and the JSON). After the first minute: RSS {min:.1}–{max:.1} MiB; {rate:.0} messages/s committed on average; every committed message delivered.",
            time.as_secs() / 60,
            SAMPLE.as_secs()
        ),
        &["minute", "RSS MiB", "committed/s since the row before", "committed, not yet delivered"],
        rows,
        serde_json::json!({
            "minutes": time.as_secs_f64() / 60.0,
            "offered_per_s": RATE,
            "committed_per_s": rate,
            "rss_mib_after_first_minute": { "min": min, "max": max },
            "samples": samples.iter().map(|s| serde_json::json!([s.at_s.round(), (s.rss_mib * 10.0).round() / 10.0, s.committed, s.delivered])).collect::<Vec<_>>(),
            "sample_columns": ["seconds", "rss_mib", "committed", "delivered"],
        }),
    );
    Ok(())
}
