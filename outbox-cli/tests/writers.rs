//! Services written in other languages use the outbox as the docs tell them to: Python
//! (psycopg on PostgreSQL, PyMySQL on MariaDB) and Node (pg) run business transactions
//! that enqueue with the one-statement enqueue, 30% of them rolled back, while `outbox
//! relay` delivers to a recording receiver. Nothing committed is lost, nothing rolled back
//! is delivered, and each key's messages arrive in commit order.
//!
//! The interpreters and drivers come from `scripts/services.sh` (`OUTBOX_TEST_PYTHON`,
//! `OUTBOX_TEST_NODE`, `OUTBOX_TEST_NODE_PATH`).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use outbox_test_support::{ChildGuard, output_within, wait_until};

mod common;

const TRANSACTIONS: usize = 1000;
const ROLLBACK_SHARE: &str = "0.3";
const LIMIT: Duration = Duration::from_secs(120);

fn env_or(var: &str, default: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| default.to_owned())
}

fn writers_dir() -> PathBuf {
    let home = std::env::var("HOME").unwrap_or_default();
    Path::new(&home).join(".cache/outbox-writers")
}

fn script(name: &str) -> String {
    format!("{}/tests/writers/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// A program the test needs, checked by running `probe` with it; panics loudly (never
/// passes silently) when it is missing.
fn program(var: &str, default: PathBuf, probe: &[&str], what: &str) -> String {
    let path = std::env::var(var).unwrap_or_else(|_| default.display().to_string());
    let out = output_within(
        what,
        Duration::from_secs(30),
        Command::new(&path).args(probe),
    );
    assert!(
        out.status.success(),
        "this test needs {what} at {path} (set {var}); run scripts/services.sh: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    path
}

/// One transaction as the writer reported it.
struct Written {
    id: String,
    key: String,
    committed: bool,
}

fn parse_report(stdout: &[u8]) -> Vec<Written> {
    String::from_utf8_lossy(stdout)
        .lines()
        .map(|line| {
            let v: serde_json::Value =
                serde_json::from_str(line).unwrap_or_else(|e| panic!("{line:?}: {e}"));
            Written {
                id: v["id"].as_str().unwrap().to_owned(),
                key: v["key"].as_str().unwrap().to_owned(),
                committed: v["committed"].as_bool().unwrap(),
            }
        })
        .collect()
}

/// The store URL, outbox and business tables, and what runs the writer.
struct Setup {
    store_url: String,
    table: String,
    business: String,
    writer: Command,
}

impl Setup {
    /// A setup on `store_url` with a fresh outbox table named `<prefix>_<16 hex digits>`.
    fn new(store_url: String, prefix: &str, business: String, writer: Command) -> Self {
        Self {
            store_url,
            table: format!("{prefix}_{:016x}", fastrand::u64(..)),
            business,
            writer,
        }
    }
}

/// Migrates with `outbox migrate`, runs `outbox relay` towards a recording receiver and
/// the writer, then checks what arrived against what the writer committed. Returns how
/// many transactions committed.
async fn writers_are_delivered_in_commit_order(mut setup: Setup, transactions: usize) -> i64 {
    let migrate = output_within(
        "outbox migrate",
        LIMIT,
        Command::new(env!("CARGO_BIN_EXE_outbox"))
            .args([
                "--store",
                &setup.store_url,
                "--table",
                &setup.table,
                "migrate",
            ])
            .env_remove("OUTBOX_CONFIG"),
    );
    assert!(
        migrate.status.success(),
        "{}",
        String::from_utf8_lossy(&migrate.stderr)
    );

    let (hook, got) = common::recording_receiver(0..0).await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("outbox.toml");
    std::fs::write(
        &config,
        format!(
            "[store]\nurl = \"{}\"\ntable = \"{}\"\n\n[relay]\nordering = \"per-key\"\nconcurrency = 4\nbatch_size = 5\npoll_interval = \"100ms\"\n\n[routes.orders]\nurl = \"{hook}\"\nallow = [\"127.0.0.1\"]\n",
            setup.store_url, setup.table
        ),
    )
    .unwrap();
    let _relay = ChildGuard::spawn("outbox relay", &mut common::relay_command(&config));

    let seed = fastrand::u32(..).to_string();
    eprintln!("writer seed {seed}");
    let mut writer = std::mem::replace(&mut setup.writer, Command::new("true"));
    writer.args([
        setup.table.as_str(),
        setup.business.as_str(),
        &transactions.to_string(),
        ROLLBACK_SHARE,
        &seed,
    ]);
    let out = tokio::task::spawn_blocking(move || output_within("the writer", LIMIT, &mut writer))
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "the writer failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let written = parse_report(&out.stdout);
    assert_eq!(written.len(), transactions, "one line per transaction");
    let committed: HashSet<&str> = written
        .iter()
        .filter(|w| w.committed)
        .map(|w| w.id.as_str())
        .collect();
    let rolled_back: HashSet<&str> = written
        .iter()
        .filter(|w| !w.committed)
        .map(|w| w.id.as_str())
        .collect();
    assert!(
        rolled_back.len() > transactions / 5 && committed.len() > transactions / 2,
        "about 30% rolled back: {} of {transactions}",
        rolled_back.len()
    );

    wait_until(
        &format!("the {} committed messages at the receiver", committed.len()),
        LIMIT,
        || async {
            let got = got.lock().unwrap();
            let arrived: HashSet<&str> = got.iter().map(String::as_str).collect();
            committed.iter().all(|id| arrived.contains(id))
        },
    )
    .await;
    // Anything still in flight would have been sent by now; give it a moment to arrive.
    tokio::time::sleep(Duration::from_millis(500)).await;

    let arrivals = got.lock().unwrap().clone();
    let delivered_rolled_back: Vec<&String> = arrivals
        .iter()
        .filter(|id| rolled_back.contains(id.as_str()))
        .collect();
    assert!(
        delivered_rolled_back.is_empty(),
        "rolled back yet delivered: {delivered_rolled_back:?}"
    );
    let unknown: Vec<&String> = arrivals
        .iter()
        .filter(|id| !committed.contains(id.as_str()))
        .collect();
    assert!(
        unknown.is_empty(),
        "delivered but never written: {unknown:?}"
    );

    // Per key, first arrivals in the order the writer committed.
    let key_of: HashMap<&str, &str> = written
        .iter()
        .map(|w| (w.id.as_str(), w.key.as_str()))
        .collect();
    let mut expected: HashMap<&str, Vec<&str>> = HashMap::new();
    for w in written.iter().filter(|w| w.committed) {
        expected
            .entry(w.key.as_str())
            .or_default()
            .push(w.id.as_str());
    }
    let mut seen = HashSet::new();
    let mut arrived: HashMap<&str, Vec<&str>> = HashMap::new();
    for id in &arrivals {
        if seen.insert(id.as_str()) {
            arrived
                .entry(key_of[id.as_str()])
                .or_default()
                .push(id.as_str());
        }
    }
    for (key, order) in &expected {
        assert_eq!(
            arrived.get(key),
            Some(order),
            "key {key}: arrivals in commit order"
        );
    }
    i64::try_from(committed.len()).unwrap()
}

fn python() -> String {
    program(
        "OUTBOX_TEST_PYTHON",
        writers_dir().join("venv/bin/python"),
        &["-c", "import psycopg, pymysql"],
        "Python with psycopg and PyMySQL",
    )
}

/// A pool on the server at `url` (`server` names it in the failure), and a fresh business
/// table for the writer's orders, `CREATE TABLE <name> <definition>`.
async fn business_table<DB>(server: &str, url: &str, definition: &str) -> (sqlx::Pool<DB>, String)
where
    DB: sqlx::Database,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
{
    let pool = sqlx::Pool::<DB>::connect(url).await.unwrap_or_else(|e| {
        panic!("{server} is not reachable at {url} ({e}); run scripts/services.sh")
    });
    let business = format!("orders_{:016x}", fastrand::u64(..));
    sqlx::query(&format!("CREATE TABLE {business} {definition}"))
        .execute(&pool)
        .await
        .unwrap();
    (pool, business)
}

/// Runs [`writers_are_delivered_in_commit_order`], then checks that `pool`'s business
/// table holds exactly the committed orders.
async fn exactly_the_committed_orders_remain<DB>(
    pool: &sqlx::Pool<DB>,
    setup: Setup,
    transactions: usize,
) where
    DB: sqlx::Database,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    (i64,): for<'r> sqlx::FromRow<'r, DB::Row>,
{
    let business = setup.business.clone();
    let committed = writers_are_delivered_in_commit_order(setup, transactions).await;
    let placed: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM {business}"))
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(placed, committed, "exactly the committed orders remain");
}

/// `writer` on PostgreSQL at `url`, with a fresh business table.
async fn writers_on_postgres(url: String, prefix: &str, writer: Command, transactions: usize) {
    let (pool, business) = business_table::<sqlx::Postgres>(
        "PostgreSQL",
        &url,
        "(n int PRIMARY KEY, status text NOT NULL)",
    )
    .await;
    let setup = Setup::new(url, prefix, business, writer);
    exactly_the_committed_orders_remain(&pool, setup, transactions).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_writers_on_postgres_are_delivered_in_commit_order() {
    let url = outbox_test_support::postgres_url();
    let mut writer = Command::new(python());
    writer.args([script("writer.py"), "postgres".to_owned(), url.clone()]);
    writers_on_postgres(url, "pywriter", writer, TRANSACTIONS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_writers_on_mysql_are_delivered_in_commit_order() {
    let url = env_or("OUTBOX_TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306/test");
    let python = python();
    let (pool, business) = business_table::<sqlx::MySql>(
        "MariaDB",
        &url,
        "(n INT PRIMARY KEY, status VARCHAR(16) NOT NULL) ENGINE = InnoDB",
    )
    .await;
    let mut writer = Command::new(python);
    writer.args([script("writer.py"), "mysql".to_owned(), url.clone()]);
    let setup = Setup::new(url, "pywriter", business.clone(), writer);
    let table = setup.table.clone();
    exactly_the_committed_orders_remain(&pool, setup, TRANSACTIONS).await;
    for statement in [
        format!("DROP TABLE {business}"),
        format!("DROP TABLE {table}"),
        format!("DROP TABLE {table}_keys"),
        format!("DROP FUNCTION {table}_uuidv7"),
        format!("DROP FUNCTION {table}_key"),
        format!("DROP PROCEDURE {table}_enqueue"),
        format!("DELETE FROM outbox_migrations WHERE id LIKE '{table}/%'"),
    ] {
        sqlx::query(&statement).execute(&pool).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_writers_on_postgres_are_delivered_in_commit_order() {
    let url = outbox_test_support::postgres_url();
    let node = program(
        "OUTBOX_TEST_NODE",
        PathBuf::from("node"),
        &["--version"],
        "Node.js",
    );
    let node_path = env_or(
        "OUTBOX_TEST_NODE_PATH",
        &writers_dir()
            .join("node/node_modules")
            .display()
            .to_string(),
    );
    assert!(
        Path::new(&node_path).join("pg/package.json").exists(),
        "this test needs the pg package in {node_path} (set OUTBOX_TEST_NODE_PATH); run scripts/services.sh"
    );
    let mut writer = Command::new(node);
    writer
        .env("NODE_PATH", &node_path)
        .args([script("writer.cjs"), url.clone()]);
    writers_on_postgres(url, "nodewriter", writer, TRANSACTIONS / 2).await;
}
