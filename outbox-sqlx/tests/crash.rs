//! Crash recovery with real processes, on every database: a relay running in a separate
//! OS process is killed with SIGKILL while it holds leased rows; another relay finishes
//! the job. Nothing may be lost, and duplicates are bounded by the rows leased at the kill.
//!
//! This file is its own test harness (`harness = false`): run without arguments it is the
//! tests; with `OUTBOX_CRASH_CHILD` set it is the child relay that gets killed. One body,
//! [`crash_test!`], is instantiated per database.

use std::process::Command;
use std::time::{Duration, Instant};

use outbox_engine::{
    Failure, FailureClass, Message, Outcome, Relay, RetryPolicy, Sink, StoreStats,
};
use outbox_sqlx::TableNames;
use outbox_test_support::ChildGuard;

#[path = "common/mod.rs"]
mod common;

use common::relay_process;

const MESSAGES: u64 = 2_000;
const CHILD_LEASE: Duration = Duration::from_secs(3);
const CHILD_VAR: &str = "OUTBOX_CRASH_CHILD";

/// The crash test for one database: `$db` is sqlx's database, `$outbox` the store on it,
/// `$place` an async fn giving the connection URL (a fresh file for SQLite), and
/// `$id_text` the outbox row's id (`o.id`) as the text the received table holds.
macro_rules! crash_test {
    ($module:ident, $db:ty, $outbox:ty, $place:path, $id_text:literal) => {
        mod $module {
            use super::*;

            type Pool = sqlx::Pool<$db>;

            async fn pool(place: &str) -> Pool {
                sqlx::pool::PoolOptions::<$db>::new()
                    .max_connections(8)
                    .acquire_timeout(Duration::from_secs(30))
                    .connect(place)
                    .await
                    .unwrap_or_else(|e| panic!("connect to {}: {e}", stringify!($module)))
            }

            /// The "broker": records every delivery in a table, then acknowledges after a
            /// pause, so a kill lands between a delivery and its completion for some rows.
            struct TableSink {
                pool: Pool,
                received: String,
                pause: Duration,
            }

            impl Sink for TableSink {
                async fn publish(
                    &self,
                    batch: &[Message],
                    _cx: &outbox_engine::PublishContext,
                ) -> Result<Vec<Outcome>, Failure> {
                    let mut insert = sqlx::QueryBuilder::<$db>::new(format!(
                        "INSERT INTO {} (id) ",
                        self.received
                    ));
                    insert.push_values(batch, |mut row, m| {
                        row.push_bind(m.id.to_string());
                    });
                    insert
                        .build()
                        .execute(&self.pool)
                        .await
                        .map_err(|e| Failure::retryable(FailureClass::Connection, e.to_string()))?;
                    tokio::time::sleep(self.pause).await;
                    Ok(vec![Outcome::published(); batch.len()])
                }
            }

            fn relay(
                outbox: $outbox,
                sink: TableSink,
                owner: &str,
                lease: Duration,
            ) -> Relay<$outbox> {
                Relay::builder(outbox)
                    .owner(owner)
                    .route("orders", sink)
                    .batch_size(25)
                    .concurrency(3)
                    .lease(lease)
                    // A publish that timed out after its insert committed is re-sent: a
                    // duplicate of a row that need not be leased at the kill. Allow
                    // publishes nearly the whole lease.
                    .publish_timeout(lease - Duration::from_millis(100))
                    .poll_interval(Duration::from_millis(50))
                    .retry(RetryPolicy::default().initial_delay(Duration::from_millis(10)))
                    .build()
                    .expect("relay")
            }

            /// The relay that gets killed.
            pub(crate) async fn child(place: &str, table: &str, received: &str) {
                let pool = pool(place).await;
                let names = TableNames::default().outbox(table).expect("table name");
                let outbox = <$outbox>::with_names(pool.clone(), names);
                let sink = TableSink {
                    pool,
                    received: received.to_owned(),
                    pause: Duration::from_millis(150),
                };
                relay(outbox, sink, "doomed-child", CHILD_LEASE)
                    .run(std::future::pending())
                    .await;
            }

            async fn count(pool: &Pool, sql: &str) -> i64 {
                sqlx::query_scalar(sql)
                    .fetch_one(pool)
                    .await
                    .unwrap_or_else(|e| panic!("{sql}: {e}"))
            }

            async fn leased_by_child(pool: &Pool, table: &str) -> i64 {
                let sql = format!(
                    "SELECT count(*) FROM {table} WHERE status = 'leased' AND lease_owner = 'doomed-child'"
                );
                count(pool, &sql).await
            }

            pub(crate) async fn parent() {
                let place = $place().await;
                let pool = pool(&place).await;
                let table = common::fresh_table("crash_outbox");
                let received = common::fresh_table("crash_received");
                let names = TableNames::default().outbox(&table).expect("table name");
                let outbox = <$outbox>::with_names(pool.clone(), names);
                outbox.migrate().await.expect("migrate");
                sqlx::query(&format!("CREATE TABLE {received} (id VARCHAR(36) NOT NULL)"))
                    .execute(&pool)
                    .await
                    .unwrap();
                let messages: Vec<_> = (0..MESSAGES)
                    .map(|n| common::message("orders", n))
                    .collect();
                let mut tx = pool.begin().await.unwrap();
                outbox.enqueue_all(&mut tx, &messages).await.unwrap();
                tx.commit().await.unwrap();

                let mut child = ChildGuard::spawn(
                    "child relay",
                    Command::new(std::env::current_exe().unwrap()).env(
                        CHILD_VAR,
                        format!("{} {table} {received} {place}", stringify!($module)),
                    ),
                );
                // Wait until the child has published some rows and holds leases on others.
                let deadline = Instant::now() + Duration::from_secs(60);
                let delivered = format!("SELECT count(*) FROM {received}");
                loop {
                    if count(&pool, &delivered).await >= 200
                        && leased_by_child(&pool, &table).await > 0
                    {
                        break;
                    }
                    assert!(Instant::now() < deadline, "child relay made no progress");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                let status = child.kill(); // SIGKILL
                assert!(!status.success(), "the child died by the signal");
                let leased_at_kill = leased_by_child(&pool, &table).await;
                assert!(
                    leased_at_kill > 0,
                    "rows were leased by the killed relay at the kill"
                );

                let sink = TableSink {
                    pool: pool.clone(),
                    received: received.clone(),
                    pause: Duration::ZERO,
                };
                let survivor = relay(outbox.clone(), sink, "survivor", Duration::from_secs(30));
                // Until the dead child's leases lapse and the survivor has published every
                // message.
                outbox_test_support::wait_until(
                    "the survivor to publish every message",
                    Duration::from_secs(120),
                    || async {
                        survivor.drain().await.expect("drain");
                        outbox.stats().await.unwrap().total().published == MESSAGES
                    },
                )
                .await;

                let deliveries = count(&pool, &delivered).await;
                let distinct = count(&pool, &format!("SELECT count(DISTINCT id) FROM {received}")).await;
                let lost = count(
                    &pool,
                    &format!(
                        "SELECT count(*) FROM {table} o WHERE NOT EXISTS (SELECT 1 FROM {received} r WHERE r.id = {})",
                        $id_text
                    ),
                )
                .await;
                let duplicates = deliveries - distinct;
                eprintln!(
                    "crash ({}): leased_at_kill={leased_at_kill} deliveries={deliveries} distinct={distinct} duplicates={duplicates} lost={lost}",
                    stringify!($module)
                );
                assert_eq!(lost, 0, "every message reached the sink");
                assert_eq!(distinct, MESSAGES as i64);
                assert!(
                    duplicates <= leased_at_kill,
                    "duplicates ({duplicates}) ≤ rows leased at the kill ({leased_at_kill})"
                );
                for t in [&table, &format!("{table}_keys"), &received] {
                    sqlx::query(&format!("DROP TABLE IF EXISTS {t}"))
                        .execute(&pool)
                        .await
                        .expect("drop the test's tables");
                }
                pool.close().await;
                remove_sqlite_file(&place);
            }
        }
    };
}

async fn postgres_url() -> String {
    common::url(
        "OUTBOX_TEST_POSTGRES_URL",
        "postgres://postgres@127.0.0.1:5432/test",
    )
}

async fn mysql_url() -> String {
    common::url("OUTBOX_TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306/test")
}

/// A database file of its own in the temp directory, which both processes open.
async fn sqlite_file() -> String {
    let path = std::env::temp_dir().join(format!(
        "outbox-crash-{}-{:016x}.db",
        std::process::id(),
        fastrand::u64(..)
    ));
    format!("sqlite://{}?mode=rwc", path.display())
}

/// Deletes the database file behind a SQLite `place`, with its journal; other places
/// are left alone.
fn remove_sqlite_file(place: &str) {
    let Some(path) = place
        .strip_prefix("sqlite://")
        .and_then(|p| p.strip_suffix("?mode=rwc"))
    else {
        return;
    };
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let _ = std::fs::remove_file(format!("{path}{suffix}"));
    }
}

crash_test!(
    postgres,
    sqlx::Postgres,
    outbox_sqlx::postgres::PgOutbox,
    postgres_url,
    "CAST(o.id AS TEXT)"
);
crash_test!(
    mysql,
    sqlx::MySql,
    outbox_sqlx::mysql::MySqlOutbox,
    mysql_url,
    "o.id"
);
crash_test!(
    sqlite,
    sqlx::Sqlite,
    outbox_sqlx::sqlite::SqliteOutbox,
    sqlite_file,
    "o.id"
);

/// The child relay: `<database> <outbox table> <received table> <url>`.
async fn child(value: String) {
    let mut parts = value.splitn(4, ' ');
    let mut next = || parts.next().expect("database, tables and url");
    let (database, table, received, place) = (next(), next(), next(), next());
    match database {
        "postgres" => postgres::child(place, table, received).await,
        "mysql" => mysql::child(place, table, received).await,
        "sqlite" => sqlite::child(place, table, received).await,
        other => panic!("no crash test for {other}"),
    }
}

fn main() {
    relay_process::main(
        CHILD_VAR,
        child,
        vec![
            ("crash_recovery_after_sigkill::postgres", || {
                Box::pin(postgres::parent())
            }),
            ("crash_recovery_after_sigkill::mysql", || {
                Box::pin(mysql::parent())
            }),
            ("crash_recovery_after_sigkill::sqlite", || {
                Box::pin(sqlite::parent())
            }),
        ],
    );
}
