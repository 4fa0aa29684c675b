//! `outbox relay` keeps its resident memory flat while nobody scrapes its metrics: its
//! histograms' samples are folded in on a timer, not left for a scrape to drain.
//!
//! 300,000 messages through PostgreSQL and a webhook receiver, no `[metrics]` table; the
//! relay's RSS is read at every tenth of the way and may not grow by more than
//! [`BOUND_MIB`] after the first fifth (before the fix: +1.9 MiB per 100,000 messages).
//!
//! The soak form: `OUTBOX_MEMORY_SOAK=30m` commits 1,000 messages a second for that long
//! instead, and samples every tenth of the time.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use outbox::TableNames;
use outbox::postgres::PgOutbox;
use outbox_test_support::{ChildGuard, wait_until};

mod common;

/// How much the relay's RSS may grow after the first fifth of the run.
const BOUND_MIB: f64 = 2.0;
const MESSAGES: u64 = 300_000;
const SOAK_RATE: u64 = 1_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_memory_stays_flat_when_nothing_scrapes_its_metrics() {
    let soak = std::env::var("OUTBOX_MEMORY_SOAK")
        .ok()
        .map(|s| humantime::parse_duration(&s).expect("OUTBOX_MEMORY_SOAK is a duration"));
    let pg_url = outbox_test_support::postgres_url();
    let pool = outbox_test_support::postgres_pool().await;
    let table = format!("memory_{:016x}", fastrand::u64(..));
    let outbox = PgOutbox::with_names(pool.clone(), TableNames::default().outbox(&table).unwrap());
    outbox.migrate().await.unwrap();

    let (hook, delivered) = common::counting_receiver().await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("outbox.toml");
    std::fs::write(
        &config,
        format!(
            "[store]\nurl = \"{pg_url}\"\ntable = \"{table}\"\n\n\
             [relay]\nbatch_size = 200\nconcurrency = 2\npoll_interval = \"100ms\"\n\n\
             [routes.hooks]\nurl = \"{hook}\"\nallow = [\"127.0.0.1/32\"]\n"
        ),
    )
    .unwrap();
    let commit = {
        let (pool, outbox) = (pool.clone(), outbox.clone());
        move |from: u64, n: u64| {
            let (pool, outbox) = (pool.clone(), outbox.clone());
            async move {
                let messages: Vec<_> = (from..from + n)
                    .map(|i| {
                        outbox::NewMessage::builder("hooks", "order.paid")
                            .json(&i)
                            .build()
                            .unwrap()
                    })
                    .collect();
                for chunk in messages.chunks(1_000) {
                    let mut tx = pool.begin().await.unwrap();
                    outbox.enqueue_all(&mut tx, chunk).await.unwrap();
                    tx.commit().await.unwrap();
                }
            }
        }
    };

    // The burst form commits everything first; the soak form commits as it goes.
    let (total, writer) = match soak {
        None => {
            commit(0, MESSAGES).await;
            (MESSAGES, None)
        }
        Some(time) => {
            let total = SOAK_RATE * time.as_secs();
            let writer = tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_millis(100));
                let per_tick = SOAK_RATE / 10;
                for from in (0..total).step_by(per_tick as usize) {
                    tick.tick().await;
                    commit(from, per_tick).await;
                }
            });
            (total, Some(writer))
        }
    };
    let mut relay = ChildGuard::spawn(
        "outbox relay",
        common::relay_command(&config).env("RUST_LOG", "error"),
    );
    let pid = relay.id();
    let limit = soak.unwrap_or_default() + Duration::from_secs(540);
    let started = Instant::now();
    let mut samples: Vec<(u64, f64)> = Vec::new();
    for tenth in 1..=10u64 {
        let due = total * tenth / 10;
        wait_until(
            &format!("{due} of {total} messages delivered"),
            limit.saturating_sub(started.elapsed()),
            || async { delivered.load(Ordering::Relaxed) >= due },
        )
        .await;
        samples.push((delivered.load(Ordering::Relaxed), rss_mib(pid)));
    }
    if let Some(writer) = writer {
        writer.await.unwrap();
    }
    let series: Vec<String> = samples
        .iter()
        .map(|(n, rss)| format!("{n}: {rss:.1} MiB"))
        .collect();
    eprintln!(
        "relay RSS while delivering {total} messages in {:.0?} with no scrape: {}",
        started.elapsed(),
        series.join(", ")
    );
    let baseline = samples[1].1;
    let peak = samples[1..].iter().map(|s| s.1).fold(0.0, f64::max);
    assert!(
        peak - baseline <= BOUND_MIB,
        "the relay's RSS grew by {:.1} MiB after {} messages (bound {BOUND_MIB} MiB): {}",
        peak - baseline,
        samples[1].0,
        series.join(", ")
    );
    assert!(
        relay.terminate(Duration::from_secs(20)).is_some(),
        "graceful stop"
    );
    sqlx::query(&format!("DROP TABLE {table}, {table}_keys"))
        .execute(&pool)
        .await
        .unwrap();
}

/// The resident memory of process `pid`, in MiB.
fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmRSS in /proc/PID/status");
    kib / 1024.0
}
