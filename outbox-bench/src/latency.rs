//! `latency`: commit→publish time at a fixed offered rate.
//!
//! Producers commit one message per transaction at a fixed total rate; each records the
//! instant its commit returned. The sink records the instant each message arrived. The
//! latency of a message is arrival − commit. Measured with wakeups (a coalescing NOTIFY
//! after commit, a LISTEN connection feeding the relay) and with polling only, at the
//! same poll interval.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use outbox_engine::{Failure, Message, MessageId, NewMessage, Outcome, Relay, Sink};
use outbox_sqlx::PublishedRows;
use outbox_sqlx::postgres::{PgNotifier, PgOutbox};

use crate::Scale;
use crate::report::{Report, percentile};
use crate::setup::{Bench, BoxError, commit_one, memory_mib, producer_ticks};

const RATES: [u64; 3] = [200, 1_000, 5_000];
const PRODUCERS: u64 = 4;
const POLL: Duration = Duration::from_millis(250);
/// Pairs of runs (wakeups, polling only) at the highest rate for the writers' rate ratio:
/// two 6-second runs differ by as much as the effect measured on 2 shared cores.
const PAIRS: usize = 5;

#[derive(Clone, Default)]
struct TimingSink {
    arrivals: Arc<Mutex<Vec<(MessageId, Instant)>>>,
}

impl Sink for TimingSink {
    async fn publish(
        &self,
        batch: &[Message],
        _cx: &outbox_engine::PublishContext,
    ) -> Result<Vec<Outcome>, Failure> {
        let now = Instant::now();
        self.arrivals
            .lock()
            .expect("lock")
            .extend(batch.iter().map(|m| (m.id, now)));
        Ok(vec![Outcome::published(); batch.len()])
    }
}

/// One measured run: latencies in milliseconds, sorted, and the achieved rate.
pub(crate) struct Run {
    pub(crate) rate: u64,
    pub(crate) wakeups: bool,
    pub(crate) latencies_ms: Vec<f64>,
    pub(crate) achieved: f64,
}

pub(crate) async fn run(bench: &Bench, scale: Scale, report: &mut Report) -> Result<(), BoxError> {
    let mut rows = Vec::new();
    let mut json = serde_json::Map::new();
    for rate in RATES {
        for wakeups in [true, false] {
            let run = measure(bench, scale, rate, wakeups).await?;
            let l = &run.latencies_ms;
            let (peak, _) = memory_mib();
            let mode = if wakeups { "wakeups" } else { "polling only" };
            rows.push(vec![
                rate.to_string(),
                mode.to_owned(),
                format!("{:.0}", run.achieved),
                format!("{:.1}", percentile(l, 0.50)),
                format!("{:.1}", percentile(l, 0.95)),
                format!("{:.1}", percentile(l, 0.99)),
                format!("{:.1}", l.last().copied().unwrap_or(0.0)),
                format!("{peak:.0}"),
            ]);
            json.insert(
                format!("rate_{rate}_{}", if wakeups { "wakeups" } else { "polling" }),
                serde_json::json!({
                    "achieved_per_s": run.achieved, "p50_ms": percentile(l, 0.5), "p95_ms": percentile(l, 0.95),
                    "p99_ms": percentile(l, 0.99), "max_ms": l.last(), "messages": l.len(), "peak_rss_mib": peak,
                }),
            );
            report.latency_runs.push(run);
        }
    }
    report.section(
        "latency",
        &format!(
            "Commit→publish latency, ms, at a fixed offered rate ({PRODUCERS} producer connections, one message per transaction), relay batch 100 × 2 workers, poll interval {} ms in both modes. Peak RSS is the whole benchmark process.",
            POLL.as_millis()
        ),
        &["offered/s", "mode", "achieved/s", "p50", "p95", "p99", "max", "peak RSS MiB"],
        rows,
        serde_json::Value::Object(json),
    );
    wakeup_cost(bench, scale, report).await
}

/// The writers' achieved rate with wakeups against polling only at the highest offered
/// rate, over [`PAIRS`] pairs of runs whose order alternates; the median ratio.
async fn wakeup_cost(bench: &Bench, scale: Scale, report: &mut Report) -> Result<(), BoxError> {
    let rate = RATES[RATES.len() - 1];
    let (mut rows, mut ratios) = (Vec::new(), Vec::new());
    for pair in 0..PAIRS {
        let wakeups_first = pair % 2 == 0;
        let mut achieved = [0.0; 2];
        for wakeups in [wakeups_first, !wakeups_first] {
            achieved[usize::from(!wakeups)] = measure(bench, scale, rate, wakeups).await?.achieved;
        }
        let ratio = achieved[0] / achieved[1];
        ratios.push(ratio);
        rows.push(vec![
            (pair + 1).to_string(),
            if wakeups_first {
                "wakeups"
            } else {
                "polling only"
            }
            .to_owned(),
            format!("{:.0}", achieved[0]),
            format!("{:.0}", achieved[1]),
            format!("{ratio:.2}"),
        ]);
    }
    let median = crate::report::median(&ratios);
    report.section(
        "wakeup-cost",
        &format!(
            "Writers' achieved commits/s at {rate}/s offered, with wakeups and with polling only, in {PAIRS} pairs of runs (the mode that runs first alternates). Median ratio: **{median:.2}**."
        ),
        &["pair", "first", "wakeups achieved/s", "polling only achieved/s", "ratio"],
        rows,
        serde_json::json!({ "offered_per_s": rate, "ratios": ratios, "median_ratio": median }),
    );
    Ok(())
}

async fn measure(bench: &Bench, scale: Scale, rate: u64, wakeups: bool) -> Result<Run, BoxError> {
    let outbox = bench
        .fresh_outbox("bench_latency_outbox", PublishedRows::Delete)
        .await?;
    let sink = TimingSink::default();
    let listener = if wakeups {
        outbox.listen().await?
    } else {
        None
    };
    let mut builder = Relay::builder(outbox.clone())
        .route("bench", sink.clone())
        .batch_size(100)
        .concurrency(2)
        .poll_interval(POLL);
    if let Some(listener) = &listener {
        builder = builder.wakeup(listener.wakeup());
    }
    let relay = builder.build()?;
    let running = tokio::spawn(relay.run(std::future::pending()));
    tokio::time::sleep(Duration::from_millis(300)).await;

    let notifier = wakeups.then(|| outbox.notifier());
    let started = Instant::now();
    let commits = commit_at_rate(bench, &outbox, notifier, rate, scale.latency_time, false).await?;
    let achieved = commits.len() as f64 / started.elapsed().as_secs_f64();
    let latencies_ms = latencies_ms(&commits, &sink.arrivals).await;
    running.abort();
    let latencies_ms = latencies_ms?;
    Ok(Run {
        rate,
        wakeups,
        latencies_ms,
        achieved,
    })
}

/// Commits one message per transaction at `rate` per second in total, from
/// [`PRODUCERS`] connections, for `time` (keyed over 250 keys per producer when `keyed`);
/// raises `notifier` after each commit. Returns when each message's commit returned.
pub(crate) async fn commit_at_rate(
    bench: &Bench,
    outbox: &PgOutbox,
    notifier: Option<PgNotifier>,
    rate: u64,
    time: Duration,
    keyed: bool,
) -> Result<HashMap<MessageId, Instant>, BoxError> {
    let commits: Arc<Mutex<HashMap<MessageId, Instant>>> = Arc::default();
    let started = Instant::now();
    let mut producers = tokio::task::JoinSet::new();
    for p in 0..PRODUCERS {
        let (pool, outbox, commits, notifier) = (
            bench.pool.clone(),
            outbox.clone(),
            commits.clone(),
            notifier.clone(),
        );
        producers.spawn(async move {
            let mut ticks = producer_ticks(PRODUCERS, rate);
            let mut i = 0;
            while started.elapsed() < time {
                ticks.tick().await;
                let message = NewMessage::builder("bench", "bench.event")
                    .json(&serde_json::json!({ "at": started.elapsed().as_micros() as u64 }));
                let message = if keyed {
                    message.partition_key(format!("key-{p}-{}", i % 250))
                } else {
                    message
                };
                let message = message.build().expect("valid");
                i += 1;
                commit_one(&pool, &outbox, &message).await?;
                commits
                    .lock()
                    .expect("lock")
                    .insert(message.id(), Instant::now());
                if let Some(notifier) = &notifier {
                    notifier.notify();
                }
            }
            Ok::<(), sqlx::Error>(())
        });
    }
    while let Some(done) = producers.join_next().await {
        done??;
    }
    let commits = std::mem::take(&mut *commits.lock().expect("lock"));
    Ok(commits)
}

/// Waits up to 30 s for every committed message in `arrivals`, then returns arrival −
/// commit per message in ms, sorted.
pub(crate) async fn latencies_ms(
    commits: &HashMap<MessageId, Instant>,
    arrivals: &Mutex<Vec<(MessageId, Instant)>>,
) -> Result<Vec<f64>, BoxError> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while arrivals.lock().expect("lock").len() < commits.len() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut latencies: Vec<f64> = arrivals
        .lock()
        .expect("lock")
        .iter()
        .filter_map(|(id, arrived)| {
            commits
                .get(id)
                .map(|c| arrived.saturating_duration_since(*c).as_secs_f64() * 1000.0)
        })
        .collect();
    if latencies.len() < commits.len() {
        return Err(format!(
            "only {} of {} messages arrived within 30 s",
            latencies.len(),
            commits.len()
        )
        .into());
    }
    latencies.sort_by(f64::total_cmp);
    Ok(latencies)
}
