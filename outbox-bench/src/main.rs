//! `outbox-bench`: every figure is a ratio against a baseline measured in the same run.
//!
//! ```text
//! cargo run --release -p outbox-bench -- [all|enqueue|drain|clauses|scale|ordered|latency|backlog|held-xmin|sqlite|mysql|soak|gauges|diesel|amqp|kafka|sqs|nats|mqtt] [--quick] [--write BENCHMARKS.md]
//! ```
//!
//! Each scenario prints a table and, as its last line, one JSON object with its figures.
//! `--write BENCHMARKS.md` writes each scenario run as a page in `docs/benchmarks/` (its
//! tables, figures, plot, commit and machine) and rewrites the index of those pages in
//! BENCHMARKS.md (between the `bench:begin` and `bench:end` markers).

mod backlog;
mod diesel;
mod drain;
mod enqueue;
mod gauges;
mod kafka;
mod latency;
mod mqtt;
mod nats;
mod report;
mod setup;
mod sinks;
mod soak;
mod sqs;
mod stores;
mod xmin;

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
    /// How long the held-xmin scenario holds the horizon back.
    pub(crate) xmin_hold: Duration,
    /// How long the soak runs.
    pub(crate) soak_time: Duration,
}

const FULL: Scale = Scale {
    drain_rows: 100_000,
    enqueue_time: Duration::from_secs(2),
    latency_time: Duration::from_secs(6),
    rounds: 3,
    finished_rows: 10_000_000,
    xmin_hold: Duration::from_secs(600),
    soak_time: Duration::from_secs(1800),
};

const QUICK: Scale = Scale {
    drain_rows: 20_000,
    enqueue_time: Duration::from_secs(1),
    latency_time: Duration::from_secs(2),
    rounds: 1,
    finished_rows: 1_000_000,
    xmin_hold: Duration::from_secs(60),
    soak_time: Duration::from_secs(120),
};

/// Benchmarks of the outbox, each reported as a ratio against a baseline measured in
/// the same run. Needs the servers `scripts/services.sh` starts.
#[derive(Debug, clap::Parser)]
#[command(name = "outbox-bench")]
struct Cli {
    /// The scenarios to run, in order (all of them by default).
    #[arg(value_enum)]
    scenarios: Vec<Scenario>,
    /// Smaller sizes and shorter runs (figures are noisier).
    #[arg(long)]
    quick: bool,
    /// Finished rows for the backlog scenario (default: 10 million, 1 million with
    /// `--quick`).
    #[arg(long, value_name = "N")]
    finished_rows: Option<usize>,
    /// Run the backlog scenario on these layouts only (default: keep and rotate).
    #[arg(long, value_enum, value_name = "LAYOUT")]
    backlog_layout: Vec<backlog::Layout>,
    /// Write each scenario's page into `docs/benchmarks/` beside this file (BENCHMARKS.md)
    /// and rewrite this file's index of the pages.
    #[arg(long, value_name = "FILE")]
    write: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Scenario {
    /// Every scenario below.
    All,
    /// Enqueue cost against the business transaction alone and a raw INSERT.
    Enqueue,
    /// Relay drain against the raw SQL ceiling and pgmq.
    Drain,
    /// What each clause of the relay's claim and delete costs the database.
    Clauses,
    /// Drain with several relays.
    Scale,
    /// Per-key ordered drain against unordered.
    Ordered,
    /// Commit-to-publish latency at a fixed offered rate, wakeups against polling.
    Latency,
    /// Drain with millions of finished rows in the table, kept in one table or in slots.
    Backlog,
    /// Drain while another transaction holds the xmin horizon back.
    HeldXmin,
    /// Enqueue and drain on SQLite against raw SQL on the same database.
    Sqlite,
    /// Enqueue and drain on MySQL/MariaDB against raw SQL on the same database.
    Mysql,
    /// 30 minutes at 5,000 messages/s offered, RSS sampled every 10 s (not part of `all`).
    Soak,
    /// The relay's gauges on millions of finished rows, against the full stats scan.
    Gauges,
    /// RabbitMQ sink against a raw lapin publishing loop.
    Amqp,
    /// Kafka sink against a raw rdkafka producer loop.
    Kafka,
    /// SQS sink against a raw `SendMessageBatch` loop (moto).
    Sqs,
    /// NATS JetStream sink against a raw async-nats publishing loop.
    Nats,
    /// MQTT sink against a raw rumqttc publishing loop.
    Mqtt,
    /// diesel's enqueue against a raw INSERT.
    Diesel,
}

const EVERY_SCENARIO: [Scenario; 17] = [
    Scenario::Enqueue,
    Scenario::Drain,
    Scenario::Clauses,
    Scenario::Scale,
    Scenario::Ordered,
    Scenario::Latency,
    Scenario::Backlog,
    Scenario::HeldXmin,
    Scenario::Sqlite,
    Scenario::Mysql,
    Scenario::Gauges,
    Scenario::Diesel,
    Scenario::Amqp,
    Scenario::Kafka,
    Scenario::Sqs,
    Scenario::Nats,
    Scenario::Mqtt,
];

impl Scenario {
    /// The name on the command line, and its help: what the scenario compares.
    fn described(self) -> (String, String) {
        let value = clap::ValueEnum::to_possible_value(&self).expect("no scenario is skipped");
        let about = value
            .get_help()
            .map(ToString::to_string)
            .unwrap_or_default();
        (value.get_name().to_owned(), about)
    }
}

fn main() {
    let cli = <Cli as clap::Parser>::parse();
    let mut scale = if cli.quick { QUICK } else { FULL };
    if let Some(rows) = cli.finished_rows {
        scale.finished_rows = rows;
    }
    let write = cli.write.clone();
    let scenarios = if cli.scenarios.is_empty() || cli.scenarios.contains(&Scenario::All) {
        EVERY_SCENARIO.to_vec()
    } else {
        cli.scenarios.clone()
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let result = runtime.block_on(async {
        let bench = setup::Bench::connect().await?;
        let mut report = Report::new(&bench, cli.quick).await?;
        for scenario in scenarios {
            let (name, about) = scenario.described();
            report.begin(name, about);
            match scenario {
                Scenario::All => unreachable!("expanded above"),
                Scenario::Enqueue => enqueue::run(&bench, scale, &mut report).await?,
                Scenario::Drain => drain::run(&bench, scale, &mut report, false).await?,
                Scenario::Clauses => drain::clauses(&bench, scale, &mut report).await?,
                Scenario::Ordered => drain::run(&bench, scale, &mut report, true).await?,
                Scenario::Scale => drain::scale(&bench, scale, &mut report).await?,
                Scenario::Latency => latency::run(&bench, scale, &mut report).await?,
                Scenario::Backlog => {
                    backlog::run(&bench, scale, &cli.backlog_layout, &mut report).await?;
                }
                Scenario::HeldXmin => xmin::run(&bench, scale, &mut report).await?,
                Scenario::Sqlite => stores::sqlite(scale, &mut report).await?,
                Scenario::Mysql => stores::mysql(scale, &mut report).await?,
                Scenario::Soak => soak::run(&bench, scale, &mut report).await?,
                Scenario::Gauges => gauges::run(&bench, scale, &mut report).await?,
                Scenario::Diesel => diesel::run(&bench, scale, &mut report).await?,
                Scenario::Amqp => sinks::amqp(&bench, scale, &mut report).await?,
                Scenario::Kafka => kafka::run(&bench, scale, &mut report).await?,
                Scenario::Sqs => sqs::run(&bench, scale, &mut report).await?,
                Scenario::Nats => nats::run(&bench, scale, &mut report).await?,
                Scenario::Mqtt => mqtt::run(&bench, scale, &mut report).await?,
            }
        }
        if let Some(path) = write {
            let every: Vec<_> = EVERY_SCENARIO
                .iter()
                .chain([&Scenario::Soak])
                .map(|s| s.described())
                .collect();
            report.write(&path, &every)?;
        }
        Ok::<_, Box<dyn std::error::Error>>(())
    });
    if let Err(error) = result {
        eprintln!("error: {error}");
        std::process::exit(1);
    }
}
