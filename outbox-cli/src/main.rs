//! `outbox`: operate an outbox table from the command line, and run a standalone relay
//! from a config file (any language can write the table).
//!
//! Errors are one line on stderr and a non-zero exit code.

#[cfg(not(any(feature = "postgres", feature = "sqlite", feature = "mysql")))]
compile_error!(
    "the `outbox` CLI needs at least one store feature: enable `postgres`, `sqlite` or `mysql` \
     (the default features enable all three)"
);

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use outbox::{
    AnyStore, Backend, Config, DeadLetterFilter, DeadLetters, MessageId, PurgeRequest, Registry,
    Store, StoreSettings, StoreStats,
};

mod serve;
mod traces;

/// Operate a transactional outbox.
#[derive(Debug, Parser)]
#[command(name = "outbox", version, about)]
struct Cli {
    /// The config file (TOML); `OUTBOX_…` environment variables override it. Without
    /// one, the settings come from those variables alone.
    #[arg(long, short, global = true, env = "OUTBOX_CONFIG")]
    config: Option<PathBuf>,
    /// The store URL, instead of the config file's `store.url`.
    #[arg(long, global = true)]
    store: Option<String>,
    /// The outbox table, instead of the config file's `store.table`.
    #[arg(long, global = true)]
    table: Option<String>,
    /// Log lines on stderr as text or as JSON objects; `RUST_LOG` picks what is logged
    /// (default `warn`, e.g. `RUST_LOG=outbox=debug`).
    #[arg(long, global = true, env = "OUTBOX_LOG_FORMAT", value_enum, default_value_t = LogFormat::Plain)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Plain,
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Create or upgrade the outbox table (idempotent).
    Migrate {
        /// Print the DDL instead of running it (for Flyway, Alembic, Prisma, …); needs no
        /// connection.
        #[arg(long)]
        print: bool,
    },
    /// Run a relay with the config file's routes until Ctrl-C or SIGTERM.
    Relay,
    /// Serve the web dashboard of the config's `[dashboard]` table until Ctrl-C or
    /// SIGTERM (`outbox relay` serves it too, with the relay's rate and latency).
    Dashboard,
    /// Check the configuration without running anything.
    Config {
        #[command(subcommand)]
        action: ConfigAction,
    },
    /// Backlog, oldest pending age, leased and dead rows per destination.
    Status {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// List, replay or discard dead letters.
    Dead {
        #[command(subcommand)]
        action: DeadAction,
    },
    /// Delete old published rows (and, optionally, old dead letters) in bounded batches.
    Purge {
        /// Published rows finished at least this long ago, e.g. `7d`.
        #[arg(long, value_parser = parse_duration)]
        published_older_than: Duration,
        /// Also dead letters that died at least this long ago.
        #[arg(long, value_parser = parse_duration)]
        dead_older_than: Option<Duration>,
        /// Rows per statement.
        #[arg(long, default_value_t = 1000)]
        batch: usize,
    },
}

#[derive(Debug, Subcommand)]
enum ConfigAction {
    /// Load the config file and the `OUTBOX_…` variables, check every setting that can be
    /// checked without reaching a server (secrets are read, never printed), and exit
    /// non-zero with the setting named at the first problem.
    Check,
}

#[derive(Debug, Subcommand)]
enum DeadAction {
    /// Show matching dead letters, oldest first.
    List {
        #[command(flatten)]
        filter: FilterArgs,
        /// At most this many.
        #[arg(long, default_value_t = 50)]
        limit: usize,
        /// Print JSON lines instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Make matching dead letters pending again.
    Replay(ChangeArgs),
    /// Delete matching dead letters.
    Discard(ChangeArgs),
}

/// Which dead letters a replay or a discard changes.
#[derive(Debug, Args)]
struct ChangeArgs {
    #[command(flatten)]
    filter: FilterArgs,
    /// Count the matching dead letters, change nothing.
    #[arg(long)]
    dry_run: bool,
    /// Change every dead letter (required when no filter is given).
    #[arg(long)]
    all: bool,
}

#[derive(Debug, Args)]
struct FilterArgs {
    /// Only this destination (repeatable).
    #[arg(long = "destination")]
    destinations: Vec<String>,
    /// Only this event type (repeatable).
    #[arg(long = "event-type")]
    event_types: Vec<String>,
    /// Only this message id (repeatable).
    #[arg(long = "id")]
    ids: Vec<uuid::Uuid>,
    /// Only dead letters whose reason contains this text.
    #[arg(long)]
    error_contains: Option<String>,
    /// Created at or after (RFC 3339).
    #[arg(long)]
    since: Option<chrono::DateTime<chrono::Utc>>,
    /// Created before (RFC 3339).
    #[arg(long)]
    until: Option<chrono::DateTime<chrono::Utc>>,
}

impl FilterArgs {
    /// Whether no filter was given, so the filter matches every dead letter.
    fn is_empty(&self) -> bool {
        self.destinations.is_empty()
            && self.event_types.is_empty()
            && self.ids.is_empty()
            && self.error_contains.is_none()
            && self.since.is_none()
            && self.until.is_none()
    }

    fn filter(&self) -> DeadLetterFilter {
        let mut filter = DeadLetterFilter::all()
            .ids(self.ids.iter().copied().map(MessageId::from_uuid))
            .created_between(self.since, self.until);
        for d in &self.destinations {
            filter = filter.destination(d.clone());
        }
        for t in &self.event_types {
            filter = filter.event_type(t.clone());
        }
        if let Some(text) = &self.error_contains {
            filter = filter.error_contains(text.clone());
        }
        filter
    }
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    outbox::duration::parse(text)
}

type Result<T, E = String> = std::result::Result<T, E>;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let format = cli.log_format;
    // TLS routes (`amqps://`, `rediss://`) need one process-wide rustls provider; more than
    // one is compiled in (the HTTP sink's and the broker sinks'), so choose it here.
    #[cfg(feature = "tls")]
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => return fail(format!("cannot start the runtime: {e}"), format),
    };
    let traces = match install_logging(format, runtime.handle()) {
        Ok(traces) => traces,
        Err(message) => return fail(message, LogFormat::Plain),
    };
    let result = runtime.block_on(run(cli));
    traces.shutdown();
    // Work a deadline gave up on (a blocking call on a silent connection) must not keep
    // the process alive: exit without waiting for it.
    runtime.shutdown_timeout(Duration::from_secs(5));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => fail(message, format),
    }
}

/// The target of the lines about the process itself (serving, running, stopped): logged
/// at info, and shown unless `RUST_LOG` says otherwise about this target.
const STATUS: &str = "outbox::status";

/// A line about the process itself, in the log's format.
pub(crate) fn log_status(line: &str) {
    tracing::info!(target: STATUS, "{line}");
}

/// The AWS SDK's crates log the access key id of the credentials they use (at info,
/// debug and trace): they stay at `warn` unless `RUST_LOG` names them.
const QUIET_UNLESS_NAMED: &[&str] = &[
    "aws_config",
    "aws_credential_types",
    "aws_runtime",
    "aws_sdk_sqs",
    "aws_sigv4",
    "aws_smithy_runtime",
    "aws_smithy_runtime_api",
];

/// Logs to stderr what `RUST_LOG` selects (warnings and errors by default), and exports
/// spans over OTLP when the environment names a collector (see [`traces::otlp`]).
fn install_logging(format: LogFormat, runtime: &tokio::runtime::Handle) -> Result<traces::Traces> {
    use tracing_subscriber::filter::LevelFilter;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::{EnvFilter, Layer};

    let mut filter = EnvFilter::builder()
        .with_default_directive(LevelFilter::WARN.into())
        .from_env()
        .map_err(|e| format!("RUST_LOG: {e}"))?;
    let named = std::env::var("RUST_LOG").unwrap_or_default();
    if !named.contains(STATUS) {
        filter = filter.add_directive(format!("{STATUS}=info").parse().expect("a valid directive"));
    }
    for target in QUIET_UNLESS_NAMED {
        if !named.contains(target) {
            let directive = format!("{target}=warn").parse().expect("a valid directive");
            filter = filter.add_directive(directive);
        }
    }
    // The OpenTelemetry crates (with their `internal-logs` feature) log an export error at
    // every attempt; `traces::Exporter` says it once.
    if !named.contains("opentelemetry") {
        filter = filter.add_directive("opentelemetry=off".parse().expect("a valid directive"));
    }
    let logs = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let logs = match format {
        LogFormat::Plain => logs
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .boxed(),
        LogFormat::Json => logs.json().boxed(),
    };
    let (provider, spans) = match traces::otlp(runtime)? {
        Some((provider, filter)) => {
            use opentelemetry::trace::TracerProvider as _;
            let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("outbox"));
            (Some(provider), Some(layer.with_filter(filter)))
        }
        None => (None, None),
    };
    tracing_subscriber::registry()
        .with(logs.with_filter(filter))
        .with(spans)
        .try_init()
        .map_err(|e| format!("logging: {e}"))?;
    Ok(traces::Traces(provider))
}

/// Prints `message` as one line on stderr, as a JSON object in the JSON log format (the
/// shape of the log's lines, whatever `RUST_LOG` selects), and fails.
fn fail(message: String, format: LogFormat) -> ExitCode {
    let one_line = message.split_whitespace().collect::<Vec<_>>().join(" ");
    match format {
        LogFormat::Plain => eprintln!("error: {one_line}"),
        LogFormat::Json => eprintln!(
            "{}",
            serde_json::json!({
                "timestamp": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
                "level": "ERROR",
                "fields": { "message": format!("error: {one_line}") },
                "target": STATUS,
            })
        ),
    }
    ExitCode::FAILURE
}

/// The config file over the environment, or the environment alone when it holds
/// settings and no file is given.
fn load_config(cli: &Cli) -> Result<Option<Config>> {
    match cli.config.as_deref() {
        Some(path) => Config::load(path).map(Some),
        None if Config::env_has_settings() => Config::from_env().map(Some),
        None => Ok(None),
    }
    .map_err(|e| e.to_string())
}

/// What a command that needs a configuration says without one (and why the variables
/// that were meant as settings are not).
fn needs_config(command: &str) -> String {
    let mut message =
        format!("`outbox {command}` needs --config FILE, or OUTBOX_… settings in the environment");
    for stray in outbox::config::stray_variables(std::env::vars(), None) {
        message.push_str("; ");
        message.push_str(&stray);
    }
    message
}

fn store_settings(cli: &Cli, config: Option<&Config>) -> Result<StoreSettings> {
    let mut store = match (config, &cli.store) {
        (_, Some(url)) => StoreSettings::new(url.clone()),
        (Some(config), None) => config.store.clone(),
        (None, None) => {
            return Err(
                "no store: pass --store URL or --config FILE (or set OUTBOX_CONFIG)".to_owned(),
            );
        }
    };
    if let Some(table) = &cli.table {
        store.table = Some(table.clone());
    }
    Ok(store)
}

async fn connect(cli: &Cli, config: Option<&Config>) -> Result<AnyStore> {
    let settings = store_settings(cli, config)?;
    Registry::default()
        .connect_store(&settings)
        .await
        .map_err(|e| e.to_string())
}

async fn run(cli: Cli) -> Result<()> {
    let config = load_config(&cli)?;
    match &cli.command {
        Command::Migrate { print: true } => {
            let settings = store_settings(&cli, config.as_ref())?;
            let script = Registry::default()
                .store_schema(&settings)
                .map_err(|e| e.to_string())?;
            print!("{script}");
        }
        Command::Migrate { print: false } => {
            let store = connect(&cli, config.as_ref()).await?;
            store.migrate().await.map_err(|e| e.to_string())?;
            println!("migrated");
        }
        Command::Relay => {
            let mut config = config.ok_or_else(|| needs_config("relay"))?;
            config.store = store_settings(&cli, Some(&config))?;
            for stray in outbox::config::stray_variables(std::env::vars(), Some(&config)) {
                tracing::warn!("{stray}");
            }
            serve::relay(&config).await?;
        }
        Command::Config {
            action: ConfigAction::Check,
        } => {
            let mut config = config.ok_or_else(|| needs_config("config check"))?;
            config.store = store_settings(&cli, Some(&config))?;
            config
                .check(&Registry::default())
                .map_err(|e| e.to_string())?;
            let stray = outbox::config::stray_variables(std::env::vars(), Some(&config));
            if !stray.is_empty() {
                return Err(stray.join("; "));
            }
            let routes: Vec<&str> = config.routes.keys().map(String::as_str).collect();
            println!(
                "config ok: a {} store, {} route(s){}{}",
                outbox::registry::scheme(&config.store.url),
                routes.len(),
                if routes.is_empty() { "" } else { ": " },
                routes.join(", ")
            );
        }
        Command::Dashboard => {
            let config = config.ok_or_else(|| needs_config("dashboard"))?;
            serve::dashboard(&config, connect(&cli, Some(&config)).await?).await?;
        }
        Command::Status { json } => status(&connect(&cli, config.as_ref()).await?, *json).await?,
        Command::Dead { action } => dead(&connect(&cli, config.as_ref()).await?, action).await?,
        Command::Purge {
            published_older_than,
            dead_older_than,
            batch,
        } => {
            let store = connect(&cli, config.as_ref()).await?;
            let mut request = PurgeRequest::published_older_than(*published_older_than)
                .batch_size((*batch).max(1));
            if let Some(age) = dead_older_than {
                request = request.dead_older_than(*age);
            }
            // A spinner on a terminal (stderr); nothing but the summary line otherwise.
            let progress = indicatif::ProgressBar::new_spinner().with_style(
                indicatif::ProgressStyle::with_template(
                    "{spinner} purged {human_pos} rows ({per_sec})",
                )
                .expect("a valid template"),
            );
            loop {
                let n = outbox::Purge::purge(&store, &request)
                    .await
                    .map_err(|e| e.to_string())?;
                progress.inc(n);
                if n < request.batch_size as u64 {
                    break;
                }
            }
            progress.finish_and_clear();
            println!("purged {} rows", progress.position());
        }
    }
    Ok(())
}

async fn status(store: &AnyStore, json: bool) -> Result<()> {
    let stats = store.stats().await.map_err(|e| e.to_string())?;
    let now = chrono::Utc::now();
    if json {
        let rows: Vec<_> = stats
            .destinations
            .iter()
            .map(|d| {
                serde_json::json!({
                    "destination": d.destination, "pending": d.pending, "leased": d.leased, "dead": d.dead,
                    "published": d.published, "halted_keys": d.halted_keys,
                    "oldest_pending_age_seconds": d.oldest_pending_age(now).map(|a| a.as_secs_f64()),
                })
            })
            .collect();
        let capabilities = store.capabilities();
        println!(
            "{}",
            serde_json::json!({ "capabilities": capabilities, "destinations": rows })
        );
        return Ok(());
    }
    println!("store {}", store.capabilities());
    println!(
        "{:<24} {:>9} {:>9} {:>9} {:>11} {:>8} {:>12}",
        "DESTINATION", "PENDING", "LEASED", "DEAD", "PUBLISHED", "HALTED", "OLDEST"
    );
    for d in &stats.destinations {
        let age = d
            .oldest_pending_age(now)
            .map_or_else(|| "-".to_owned(), |a| format!("{}s", a.as_secs()));
        println!(
            "{:<24} {:>9} {:>9} {:>9} {:>11} {:>8} {:>12}",
            d.destination, d.pending, d.leased, d.dead, d.published, d.halted_keys, age
        );
    }
    Ok(())
}

impl ChangeArgs {
    /// Runs `change` (`verb`) on the matching dead letters and returns how many it changed;
    /// `None` after a dry run, which prints how many it would change. Refuses a change to
    /// every dead letter unless `--all` asked for it.
    async fn apply<E: std::fmt::Display>(
        &self,
        store: &AnyStore,
        verb: &str,
        change: impl AsyncFnOnce(&DeadLetterFilter) -> Result<u64, E>,
    ) -> Result<Option<u64>> {
        let filter = self.filter.filter();
        if self.dry_run {
            let n = store.count_dead(&filter).await.map_err(|e| e.to_string())?;
            println!("would {verb} {n} dead letter(s)");
            return Ok(None);
        }
        if self.filter.is_empty() && !self.all {
            return Err(format!(
                "refusing to {verb} every dead letter: give a filter (--destination, --event-type, --id, --error-contains, --since, --until) or --all; --dry-run counts them first"
            ));
        }
        change(&filter).await.map(Some).map_err(|e| e.to_string())
    }
}

async fn dead(store: &AnyStore, action: &DeadAction) -> Result<()> {
    match action {
        DeadAction::List {
            filter,
            limit,
            json,
        } => {
            let letters = store
                .list_dead(&filter.filter(), *limit)
                .await
                .map_err(|e| e.to_string())?;
            for d in &letters {
                if *json {
                    println!(
                        "{}",
                        serde_json::json!({
                            "id": d.message.id.to_string(), "destination": d.message.destination, "event_type": d.message.event_type,
                            "attempts": d.message.attempts, "created_at": d.message.created_at, "dead_at": d.dead_at, "reason": d.reason,
                        })
                    );
                } else {
                    println!(
                        "{}  {:<20} {:<24} {}  {}",
                        d.message.id,
                        d.message.destination,
                        d.message.event_type,
                        d.dead_at.format("%Y-%m-%dT%H:%M:%SZ"),
                        d.reason
                    );
                }
            }
            if !*json {
                eprintln!("{} dead letter(s)", letters.len());
            }
        }
        DeadAction::Replay(change) => {
            let replay = async |filter: &DeadLetterFilter| store.replay_dead(filter).await;
            if let Some(n) = change.apply(store, "replay", replay).await? {
                if n > 0 && store.notify().await.is_err() {
                    eprintln!(
                        "warning: could not wake relays; they pick the rows up at their next poll"
                    );
                }
                println!("replayed {n} dead letter(s)");
            }
        }
        DeadAction::Discard(change) => {
            let discard = async |filter: &DeadLetterFilter| store.discard_dead(filter).await;
            if let Some(n) = change.apply(store, "discard", discard).await? {
                println!("discarded {n} dead letter(s)");
            }
        }
    }
    Ok(())
}
