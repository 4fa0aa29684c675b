//! `outbox-battery`: one store × sink × fault cell of the reliability battery.
//!
//! Writers commit business transactions (a third roll back) that enqueue one keyed
//! message each and record it in a ledger of their own; relays run as separate `outbox
//! relay` processes; a consumer records every delivery. While the writers run, the fault
//! is injected; then the writers stop, the relays drain the table, and the deliveries are
//! counted against the ledger: lost, unexpected, duplicates, out of order per key.
//!
//! ```text
//! outbox-battery run --store postgres --sink http --fault kill9
//! ```
//!
//! prints one line `battery store=… sink=… fault=… …` and exits 1 if the run broke a
//! promise. `scripts/battery.sh` runs the whole table; see `docs/RELIABILITY.md`.
//!
//! Two more commands keep the results file (the latest run of each cell) and the tables
//! generated from it; `scripts/battery.sh --record` runs them:
//!
//! ```text
//! outbox-battery record docs/reliability/cells.tsv --commit abc1234 --verdict ok 'battery store=…'
//! outbox-battery table docs/reliability/cells.tsv docs/RELIABILITY.md docs/reliability/cells.md
//! ```

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand, ValueEnum};
use outbox_battery::consumers::{self, Received, Receiver, RedisServer};
use outbox_battery::verdict::{Committed, Counts};
use outbox_test_support::ChildGuard;

mod broken;
mod faults;
mod ledger;
mod relays;
mod results;

use faults::{Fault, SinkServer, Target};
use ledger::{Ledger, Writes};
use relays::{RelayCommand, Relays};

#[derive(Parser)]
#[command(about = "One cell of the outbox reliability battery", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Runs one store × sink × fault cell and prints its counts.
    Run(RunArgs),
    /// A deliberately broken relay: reports every message published *before* sending it
    /// (the "mark, then publish" bug). The battery must catch it losing messages.
    BrokenRelay {
        /// The relay's config file, as for `outbox relay`.
        #[arg(long)]
        config: PathBuf,
    },
    /// Records one cell's result in the results file, in place of the cell's earlier row:
    /// the latest run wins.
    Record {
        /// The results file (`docs/reliability/cells.tsv`); created if missing.
        results: PathBuf,
        /// The commit the cell ran at.
        #[arg(long)]
        commit: String,
        /// The cell's verdict.
        #[arg(long, value_enum)]
        verdict: results::Verdict,
        /// The line `outbox-battery run` printed, or `battery store=… sink=… fault=…` for
        /// a cell that printed none (its counts are then unknown).
        line: String,
    },
    /// Writes the Markdown generated from the results file into each page, between its
    /// `<!-- battery:cells:begin -->` … `<!-- battery:cells:end -->` lines (the table of
    /// every cell) and its `battery:summary` ones (the cells recorded and failing).
    Table {
        /// The results file.
        results: PathBuf,
        /// The pages to write.
        #[arg(required = true)]
        pages: Vec<PathBuf>,
        /// Writes nothing; exits 1 if a page's generated lines differ from the results.
        #[arg(long)]
        check: bool,
    },
}

#[derive(clap::Args)]
struct RunArgs {
    /// Where the outbox table lives.
    #[arg(long, value_enum)]
    store: StoreKind,
    /// Where the relays publish.
    #[arg(long, value_enum)]
    sink: SinkKind,
    /// What goes wrong meanwhile.
    #[arg(long, value_enum, default_value = "none")]
    fault: Fault,
    /// How many times the fault is injected.
    #[arg(long, default_value_t = 20)]
    cycles: usize,
    /// Concurrent writers.
    #[arg(long, default_value_t = 4)]
    writers: usize,
    /// Partition keys the writers spread their messages over.
    #[arg(long, default_value_t = 50)]
    keys: usize,
    /// Commits per second over all writers (default: as fast as they can; 40 for SQS,
    /// whose emulator slows down as its queue grows).
    #[arg(long)]
    rate: Option<u32>,
    /// Runs the deliberately broken relay instead of `outbox relay`.
    #[arg(long)]
    broken: bool,
    /// Relays without per-key ordering, whose claims on PostgreSQL commit asynchronously
    /// like their completions (decision 0049); the order of deliveries is not checked.
    #[arg(long)]
    unordered: bool,
    /// The `outbox` binary (default: `$OUTBOX_CLI`, else `outbox` next to this binary).
    #[arg(long)]
    outbox: Option<PathBuf>,
}

/// The stores the battery runs on, by database and by how the writers enqueue: through
/// sqlx, or through `outbox-diesel` on diesel's connections (the `diesel-` cells, whose
/// relays open the store by its `diesel+` URL). The ledger's reads use sqlx either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum StoreKind {
    Postgres,
    Sqlite,
    Mysql,
    DieselPostgres,
    DieselSqlite,
    DieselMysql,
}

impl StoreKind {
    /// The database under the store.
    pub(crate) fn database(self) -> Database {
        match self {
            Self::Postgres | Self::DieselPostgres => Database::Postgres,
            Self::Sqlite | Self::DieselSqlite => Database::Sqlite,
            Self::Mysql | Self::DieselMysql => Database::Mysql,
        }
    }

    /// Whether the writers enqueue through diesel.
    fn diesel(self) -> bool {
        matches!(
            self,
            Self::DieselPostgres | Self::DieselSqlite | Self::DieselMysql
        )
    }

    /// The URL the relays open the store with: `url`, with `diesel+` before it for the
    /// diesel cells, as a diesel application names its relay store.
    fn relay_url(self, url: &str) -> String {
        match self {
            Self::DieselPostgres | Self::DieselSqlite | Self::DieselMysql => {
                format!("diesel+{url}")
            }
            Self::Postgres | Self::Sqlite | Self::Mysql => url.to_owned(),
        }
    }
}

/// A database the stores live in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Database {
    Postgres,
    Sqlite,
    Mysql,
}

impl Database {
    fn server(self) -> &'static str {
        match self {
            Self::Postgres => "PostgreSQL",
            Self::Sqlite => "SQLite",
            Self::Mysql => "MariaDB",
        }
    }

    fn env_var(self) -> &'static str {
        match self {
            Self::Postgres => "OUTBOX_TEST_POSTGRES_URL",
            Self::Sqlite => "(none)",
            Self::Mysql => "OUTBOX_TEST_MYSQL_URL",
        }
    }
}

/// The sinks the battery publishes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum SinkKind {
    Http,
    Redis,
    Amqp,
    Kafka,
    Sqs,
    Nats,
    Mqtt,
}

impl SinkKind {
    /// Whether the sink keeps each key's order: all but SQS, whose standard queues do not.
    pub(crate) fn keeps_order(self) -> bool {
        self != Self::Sqs
    }
}

/// The lease the relays take: short, so that a killed relay's rows come back quickly.
/// The publish deadline is half of it. The SQS emulator can take seconds to answer, so
/// the SQS cells get a longer lease.
fn lease(sink: SinkKind) -> Duration {
    Duration::from_secs(if sink == SinkKind::Sqs { 10 } else { 2 })
}
/// How long the relays get to drain the table once the writers stopped.
const DRAIN_LIMIT: Duration = Duration::from_secs(300);
/// How long the consumer may go without a new delivery before the count is taken.
const QUIET_LIMIT: Duration = Duration::from_secs(15);

fn main() -> std::process::ExitCode {
    let runtime = || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(4)
            .enable_all()
            .build()
            .expect("a Tokio runtime")
    };
    let outcome = match Cli::parse().command {
        Command::Run(args) => return runtime().block_on(run(args)),
        Command::BrokenRelay { config } => return runtime().block_on(broken::relay(&config)),
        Command::Record {
            results,
            commit,
            verdict,
            line,
        } => results::record(&results, &commit, verdict, &line).map(|()| true),
        Command::Table {
            results,
            pages,
            check,
        } => results::table(&results, &pages, check).map(|differ| {
            for page in &differ {
                eprintln!(
                    "{}: its generated tables are not what {} gives (`outbox-battery table {} {}` \
                     writes them; `scripts/battery.sh --record` does after its cells)",
                    page.display(),
                    results.display(),
                    results.display(),
                    page.display()
                );
            }
            differ.is_empty()
        }),
    };
    match outcome {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => std::process::ExitCode::FAILURE,
        Err(e) => {
            eprintln!("outbox-battery: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// A consumer of the chosen sink: the route's TOML, what it records, and whatever must
/// live as long as it does.
struct Consumer {
    route: String,
    received: Received,
    receiver: Option<Receiver>,
    server: Option<SinkServer>,
    keeps_order: bool,
    _emulator: Option<ChildGuard>,
}

/// The consumer of `sink`; under `sink-restart`, on a server the battery can restart
/// (for Redis, a private one that keeps what it acknowledged; see [`RedisServer`]).
async fn consumer(sink: SinkKind, fault: Fault, dir: &Path) -> Consumer {
    let plain = |route: String, received: Received, server: Option<SinkServer>| Consumer {
        route,
        received,
        receiver: None,
        server,
        keeps_order: true,
        _emulator: None,
    };
    match sink {
        SinkKind::Http => {
            let receiver = Receiver::start(2..20).await;
            Consumer {
                route: format!(
                    "url = \"{}\"\nallow = [\"127.0.0.1/32\"]\nrequest_timeout = \"1s\"\n",
                    receiver.url
                ),
                received: receiver.received.clone(),
                server: Some(SinkServer::Receiver(receiver.clone())),
                receiver: Some(receiver),
                keeps_order: true,
                _emulator: None,
            }
        }
        SinkKind::Redis => {
            let own = if fault == Fault::SinkRestart {
                Some(RedisServer::start(dir).await)
            } else {
                None
            };
            let url = own.as_ref().map_or_else(
                || {
                    outbox_test_support::server_url(
                        "OUTBOX_TEST_REDIS_URL",
                        "redis://127.0.0.1:6379/",
                    )
                },
                |own| own.url.clone(),
            );
            let stream = format!("battery.{:016x}", fastrand::u64(..));
            let received = consumers::redis_consumer(&url, &stream).await;
            plain(
                format!("url = \"{url}\"\nstream = \"{stream}\"\n"),
                received,
                own.map(SinkServer::Redis),
            )
        }
        SinkKind::Amqp => {
            let (url, queue, received) = consumers::amqp_consumer().await;
            plain(
                format!("url = \"{url}\"\nrouting_key = \"{queue}\"\n"),
                received,
                Some(SinkServer::RabbitMq),
            )
        }
        SinkKind::Nats => {
            // Under `sink-restart`, a private server whose JetStream store is on disk.
            let own = (fault == Fault::SinkRestart)
                .then(|| outbox_test_support::servers::PrivateServer::nats(dir, ""));
            let url = own.as_ref().map_or_else(
                || outbox_test_support::server_url("OUTBOX_TEST_NATS_URL", "nats://127.0.0.1:4222"),
                |own| own.url.clone(),
            );
            let (stream, received) = consumers::nats_consumer(&url).await;
            plain(
                format!("url = \"{url}\"\nsubject = \"{stream}.events\"\n"),
                received,
                own.map(|own| SinkServer::Nats(std::sync::Mutex::new(own))),
            )
        }
        SinkKind::Mqtt => {
            // Always a private broker: its configuration queues whatever the battery's
            // subscriber has not taken yet (mosquitto's default drops QoS 1 messages beyond
            // 1,000), and it has persistence on for `sink-restart`.
            let own = outbox_test_support::servers::PrivateServer::mosquitto(dir, "");
            let (topic, received) = consumers::mqtt_consumer(&own.url).await;
            plain(
                format!("url = \"{}\"\ntopic = \"{topic}/events\"\n", own.url),
                received,
                Some(SinkServer::Mqtt(std::sync::Mutex::new(own))),
            )
        }
        SinkKind::Kafka => {
            let (brokers, topic, received) = consumers::kafka_consumer().await;
            plain(
                format!("url = \"kafka://{brokers}/{topic}\"\n"),
                received,
                None,
            )
        }
        SinkKind::Sqs => {
            let (emulator, queue_url, received) = consumers::sqs_consumer().await;
            Consumer {
                // moto slows down as its queue grows: the rate limit keeps it short.
                route: format!(
                    "url = \"sqs+{queue_url}\"\nrate_limit = {{ per_second = 100, burst = 20 }}\n"
                ),
                received,
                receiver: None,
                server: None,
                keeps_order: SinkKind::Sqs.keeps_order(),
                _emulator: Some(emulator),
            }
        }
    }
}

async fn run(args: RunArgs) -> std::process::ExitCode {
    let cell = format!(
        "store={} sink={} fault={}{}{}",
        name(args.store),
        name(args.sink),
        name(args.fault),
        if args.broken { " broken" } else { "" },
        if args.unordered { " unordered" } else { "" }
    );
    if let Some(reason) = args.fault.unsupported(args.store.database(), args.sink) {
        eprintln!("battery {cell}: not applicable: {reason}");
        return std::process::ExitCode::from(2);
    }
    let started = Instant::now();
    let dir = std::env::temp_dir().join(format!("outbox-battery-{:016x}", fastrand::u64(..)));
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    let ledger = Ledger::create(args.store.database(), &dir, args.keys, args.store.diesel()).await;
    let mut consumer = consumer(args.sink, args.fault, &dir).await;
    let mut store_url = args.store.relay_url(&ledger.store_url);
    let proxy = match args.fault {
        Fault::NetSink | Fault::SilentSink => {
            Some(outbox_test_support::proxy::in_front(&mut consumer.route).await)
        }
        Fault::NetStore | Fault::SilentStore => {
            Some(outbox_test_support::proxy::in_front(&mut store_url).await)
        }
        _ => None,
    };
    let config = dir.join("outbox.toml");
    std::fs::write(
        &config,
        relay_config(
            &store_url,
            &ledger.table,
            lease(args.sink),
            &consumer.route,
            args.unordered,
        ),
    )
    .expect("write the config");
    let mut command = if args.broken {
        RelayCommand::broken(&config)
    } else {
        RelayCommand::cli(&outbox_binary(args.outbox), &config)
    };
    if args.fault == Fault::ClockSkew {
        command = command.clocks_off_by(&["+10m", "-10m"], &dir);
    }

    let stop = Arc::new(AtomicBool::new(false));
    let writes = Arc::new(Writes::default());
    let rate = args.rate.or((args.sink == SinkKind::Sqs).then_some(40));
    let pace = rate.map_or(Duration::ZERO, |rate| {
        Duration::from_secs(args.writers as u64) / rate.max(1)
    });
    let writers: Vec<_> = (0..args.writers)
        .map(|_| {
            let (ledger, stop, writes) = (ledger.clone(), stop.clone(), writes.clone());
            tokio::spawn(async move { ledger.write(pace, stop, writes).await })
        })
        .collect();
    let mut relays = Relays::start(command, args.fault.relays());
    let injected = Target {
        database: args.store.database(),
        ledger: &ledger,
        relays: &mut relays,
        receiver: consumer.receiver.as_ref(),
        sink: consumer.server.as_ref(),
        proxy: proxy.as_ref(),
        lease: lease(args.sink),
        broken: args.broken,
    }
    .inject(args.fault, args.cycles)
    .await;
    stop.store(true, Ordering::Relaxed);
    for writer in writers {
        writer.await.expect("a writer panicked");
    }

    // Drain: every committed row finished (published, or dead, which counts as lost).
    let unfinished = drain(&ledger).await;
    if let Some(exit) = relays.exited() {
        panic!("{exit}");
    }
    let unstoppable = relays.stop_all();
    let committed = ledger.committed().await;
    let deliveries = settle(&consumer.received, &committed).await;
    let counts = Counts::of(&committed, &deliveries);
    let (_, published, dead) = ledger.statuses().await.expect("the database after the run");
    let stalled = format!(
        "rows left unfinished {} s after the writers stopped",
        DRAIN_LIMIT.as_secs()
    );

    let mut broken_promises = Vec::new();
    if injected.faults < args.cycles {
        // A fault that did not take effect tested nothing.
        broken_promises.push("fewer faults took effect than were asked for");
    }
    if !counts.safe() {
        broken_promises.push("lost or unexpected messages");
    }
    if unfinished != 0 {
        broken_promises.push(&stalled);
    }
    if unstoppable > 0 {
        broken_promises.push("relays that did not stop within 20 s of SIGTERM");
    }
    if dead > 0 {
        broken_promises.push("dead letters (no row should fail for good here)");
    }
    let ordered = consumer.keeps_order && !args.unordered;
    if ordered && counts.out_of_order > 0 {
        broken_promises.push("per-key order");
    }
    if args.fault.kills() && counts.duplicates as i64 > injected.leased_at_kills {
        broken_promises.push("more re-sends than rows leased at the kills");
    }
    println!(
        "battery {cell} faults={} relays_started={} {counts} rolled_back={} writes_failed={} \
         published={published} unfinished={unfinished} dead={dead} leased_at_kills={} ordered={} seconds={}",
        injected.faults,
        relays.started,
        writes.rolled_back.load(Ordering::Relaxed),
        writes.failed.load(Ordering::Relaxed),
        injected.leased_at_kills,
        ordered,
        started.elapsed().as_secs(),
    );
    ledger.drop_tables().await;
    let _ = std::fs::remove_dir_all(&dir);
    if broken_promises.is_empty() {
        std::process::ExitCode::SUCCESS
    } else {
        eprintln!("battery {cell}: FAILED: {}", broken_promises.join(", "));
        std::process::ExitCode::FAILURE
    }
}

/// The relays' config: short leases and retries, so that faults resolve within the run;
/// per-key ordering on unless `unordered`; attempts that outlast any fault here.
fn relay_config(
    store_url: &str,
    table: &str,
    lease: Duration,
    route: &str,
    unordered: bool,
) -> String {
    let ordering = if unordered { "unordered" } else { "per-key" };
    format!(
        "[store]\nurl = \"{url}\"\ntable = \"{table}\"\n\n\
         [relay]\nbatch_size = 50\nconcurrency = 2\nlease = \"{lease}s\"\npoll_interval = \"100ms\"\n\
         ordering = \"{ordering}\"\n\n\
         [retry]\ninitial_delay = \"100ms\"\nmax_delay = \"1s\"\nmax_attempts = 10000\nmax_age = \"1h\"\n\n\
         [routes.battery]\n{route}",
        url = store_url,
        lease = lease.as_secs(),
    )
}

/// Waits up to [`DRAIN_LIMIT`] for every row to be finished; returns how many were not.
async fn drain(ledger: &Ledger) -> i64 {
    let deadline = Instant::now() + DRAIN_LIMIT;
    loop {
        let unfinished = ledger.statuses().await.map(|(unfinished, _, _)| unfinished);
        if unfinished == Some(0) {
            return 0;
        }
        if Instant::now() >= deadline {
            return unfinished.unwrap_or(-1);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The deliveries once the consumer has every committed message, or once it received
/// nothing new for [`QUIET_LIMIT`] (what is missing then is lost).
async fn settle(received: &Received, committed: &HashMap<String, Committed>) -> Vec<String> {
    let mut last = (0, Instant::now());
    loop {
        let deliveries = received.lock().unwrap().clone();
        let distinct: HashSet<&String> = deliveries.iter().collect();
        if committed.keys().all(|id| distinct.contains(id)) {
            return deliveries;
        }
        if deliveries.len() != last.0 {
            last = (deliveries.len(), Instant::now());
        } else if last.1.elapsed() > QUIET_LIMIT {
            return deliveries;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The name `value` has on the command line.
fn name(value: impl ValueEnum) -> String {
    value
        .to_possible_value()
        .map_or_else(String::new, |v| v.get_name().to_owned())
}

/// The `outbox` binary: `--outbox`, else `$OUTBOX_CLI`, else next to this one.
fn outbox_binary(given: Option<PathBuf>) -> PathBuf {
    let path = given
        .or_else(|| std::env::var_os("OUTBOX_CLI").map(PathBuf::from))
        .unwrap_or_else(|| {
            let me = std::env::current_exe().expect("the battery's own path");
            me.with_file_name("outbox")
        });
    assert!(
        path.exists(),
        "no `outbox` binary at {} (build it with `cargo build -p outbox-cli`, or pass --outbox)",
        path.display()
    );
    path
}
