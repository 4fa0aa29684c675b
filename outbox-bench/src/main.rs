//! `outbox-bench`: every figure is a ratio against a baseline measured in the same run.
//!
//! ```text
//! cargo run --release -p outbox-bench -- [all|enqueue|drain|scale|ordered|latency|backlog|amqp|kafka|sqs] [--quick] [--write BENCHMARKS.md]
//! ```
//!
//! Each scenario prints a table and, as its last line, one JSON object with its figures.
//! `--write` rewrites the generated part of BENCHMARKS.md (between the `bench:begin` and
//! `bench:end` markers) and the latency plot next to it.

mod backlog;
mod drain;
mod enqueue;
mod kafka;
mod latency;
mod report;
mod setup;
mod sinks;
mod sqs;

use std::time::Duration;

use report::Report;

/// Sizes for a full or a quick run.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Scale {
    /// Rows preloaded for each drain measurement.
    pub(crate) drain_rows: usize,
    /// How long each enqueue measurement runs.
    pub(crate) enqueue_time: Duration,
    /// How long each latency measurement runs.
    pub(crate) latency_time: Duration,
    /// Rounds of each enqueue mode (interleaved; the median is reported).
    pub(crate) rounds: usize,
    /// Finished rows present in the table for the backlog scenario.
    pub(crate) finished_rows: usize,
}

const FULL: Scale = Scale {
    drain_rows: 100_000,
    enqueue_time: Duration::from_secs(2),
    latency_time: Duration::from_secs(6),
    rounds: 3,
    finished_rows: 10_000_000,
};

const QUICK: Scale = Scale {
    drain_rows: 20_000,
    enqueue_time: Duration::from_secs(1),
    latency_time: Duration::from_secs(2),
    rounds: 1,
    finished_rows: 1_000_000,
};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let scale = if args.iter().any(|a| a == "--quick") {
        QUICK
    } else {
        FULL
    };
    let write = args.iter().position(|a| a == "--write").map(|i| {
        args.get(i + 1).cloned().unwrap_or_else(|| {
            eprintln!("error: --write needs a file name");
            std::process::exit(2)
        })
    });
    let scenarios: Vec<&str> = args
        .iter()
        .filter(|a| !a.starts_with("--") && Some(*a) != write.as_ref())
        .map(String::as_str)
        .collect();
    let scenarios = if scenarios.is_empty() || scenarios == ["all"] {
        vec![
            "enqueue", "drain", "scale", "ordered", "latency", "backlog", "amqp", "kafka", "sqs",
        ]
    } else {
        scenarios
    };
    for s in &scenarios {
        if ![
            "enqueue", "drain", "scale", "ordered", "latency", "backlog", "amqp", "kafka", "sqs",
        ]
        .contains(s)
        {
            eprintln!(
                "error: unknown scenario {s:?} (enqueue, drain, scale, ordered, latency, backlog, amqp, kafka, sqs, all)"
            );
            std::process::exit(2);
        }
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let result = runtime.block_on(async {
        let bench = setup::Bench::connect().await?;
        let mut report = Report::new(&bench, &args).await?;
        for scenario in scenarios {
            match scenario {
                "enqueue" => enqueue::run(&bench, scale, &mut report).await?,
                "drain" => drain::run(&bench, scale, &mut report, false).await?,
                "ordered" => drain::run(&bench, scale, &mut report, true).await?,
                "scale" => drain::scale(&bench, scale, &mut report).await?,
                "latency" => latency::run(&bench, scale, &mut report).await?,
                "backlog" => backlog::run(&bench, scale, &mut report).await?,
                "amqp" => sinks::amqp(&bench, scale, &mut report).await?,
                "kafka" => kafka::run(&bench, scale, &mut report).await?,
                "sqs" => sqs::run(&bench, scale, &mut report).await?,
                _ => unreachable!("checked above"),
            }
        }
        if let Some(path) = write {
            report.write(&path)?;
        }
        Ok::<_, Box<dyn std::error::Error>>(())
    });
    if let Err(error) = result {
        eprintln!("error: {error}");
        std::process::exit(1);
    }
}
