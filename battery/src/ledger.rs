//! The writers' side: the outbox table, the writers' own ledger of what committed, and
//! writers that commit (or roll back) business transactions enqueueing one keyed message.
//!
//! Each transaction bumps its key's row in `<table>_k` first (a row lock the writers take
//! themselves, so the ledger's per-key numbers are commit order whatever the outbox
//! does), enqueues the message with that key, and inserts `(id, key, seq)` into
//! `<table>_ledger`. A third of the transactions roll back: their messages must never
//! arrive. What committed is whatever the ledger holds afterwards, so a commit whose
//! answer was lost to a fault is counted by what the database kept.
//!
//! The diesel cells write the same transactions through `outbox-diesel` on diesel's
//! sync connections (the table migrated by diesel too); the relays drain it alike.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use outbox::diesel::diesel::r2d2::{ConnectionManager, Pool};
use outbox::diesel::diesel::sql_types::{BigInt, Text};
use outbox::diesel::diesel::{self, Connection, RunQueryDsl};
use outbox::mysql::MySqlOutbox;
use outbox::postgres::PgOutbox;
use outbox::sqlite::SqliteOutbox;
use outbox::{NewMessage, TableNames};
use outbox_battery::verdict::Committed;

use crate::Database;

/// A fraction of the writers' transactions that roll back (in percent).
const ROLLBACK_PERCENT: u32 = 30;

/// The database the outbox lives in, with the outbox over it.
#[derive(Clone)]
enum Db {
    Postgres(sqlx::PgPool, PgOutbox),
    Sqlite(sqlx::SqlitePool, SqliteOutbox),
    MySql(sqlx::MySqlPool, MySqlOutbox),
}

/// Runs `$body` with `$pool` and `$outbox` bound to the concrete types of `$db`'s kind;
/// `$db` is a `$kind`, [`Db`] or [`DieselDb`].
macro_rules! on_db {
    ($kind:ident, $db:expr, |$pool:ident, $outbox:ident| $body:expr) => {
        match $db {
            $kind::Postgres($pool, $outbox) => $body,
            $kind::Sqlite($pool, $outbox) => $body,
            $kind::MySql($pool, $outbox) => $body,
        }
    };
}

/// diesel's writer and a pool of diesel's sync connections on the same database.
#[derive(Clone)]
enum DieselDb {
    Postgres(
        Pool<ConnectionManager<diesel::PgConnection>>,
        outbox::diesel::postgres::PgOutbox,
    ),
    Sqlite(
        Pool<ConnectionManager<diesel::SqliteConnection>>,
        outbox::diesel::sqlite::SqliteOutbox,
    ),
    MySql(
        Pool<ConnectionManager<diesel::MysqlConnection>>,
        outbox::diesel::mysql::MysqlOutbox,
    ),
}

/// The message a writer enqueues for number `seq` of key `k`.
fn written(k: &str, seq: i64) -> NewMessage {
    NewMessage::builder("battery", "battery.written")
        .partition_key(k)
        .json(&serde_json::json!({ "key": k, "seq": seq }))
        .build()
        .expect("a valid message")
}

/// A key's number, read back on a diesel connection.
#[derive(diesel::QueryableByName)]
struct Seq {
    #[diesel(sql_type = BigInt)]
    seq: i64,
}

/// The outbox table of one run, its ledger, and the URL relays open it with.
#[derive(Clone)]
pub(crate) struct Ledger {
    db: Db,
    /// The writers' connections in the diesel cells.
    diesel: Option<DieselDb>,
    /// The outbox table's name.
    pub(crate) table: String,
    /// The store URL for the relays' config.
    pub(crate) store_url: String,
    keys: usize,
    placeholders: Placeholders,
}

/// How statements mark their parameters.
#[derive(Clone, Copy)]
enum Placeholders {
    Numbered,
    Question,
}

/// What the writers did.
#[derive(Debug, Default)]
pub(crate) struct Writes {
    pub(crate) committed: AtomicU64,
    pub(crate) rolled_back: AtomicU64,
    pub(crate) failed: AtomicU64,
}

impl Writes {
    /// Counts one transaction; after a failure, pauses before the next.
    async fn count(&self, commit: bool, succeeded: bool) {
        let counter = match (succeeded, commit) {
            (true, true) => &self.committed,
            (true, false) => &self.rolled_back,
            (false, _) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
                &self.failed
            }
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

impl Ledger {
    /// Creates a fresh outbox table with `keys` partition keys, in the store of `kind`
    /// (SQLite: a file in `dir`); with `diesel`, the writers enqueue through diesel.
    pub(crate) async fn create(kind: Database, dir: &Path, keys: usize, diesel: bool) -> Self {
        let table = format!("battery_{:012x}", fastrand::u64(..1 << 48));
        let names = TableNames::default().outbox(&table).unwrap();
        let (db, store_url, placeholders) = match kind {
            Database::Postgres => {
                let url = outbox_test_support::server_url(
                    "OUTBOX_TEST_POSTGRES_URL",
                    "postgres://postgres@127.0.0.1:5432/test",
                );
                let options = url
                    .parse::<sqlx::postgres::PgConnectOptions>()
                    .unwrap()
                    .application_name("outbox-battery");
                let pool = connect(kind, &url, pool_options().connect_with(options)).await;
                let outbox = PgOutbox::with_names(pool.clone(), names.clone());
                (Db::Postgres(pool, outbox), url, Placeholders::Numbered)
            }
            Database::Sqlite => {
                let url = format!("sqlite:{}", dir.join("battery.db").display());
                let options = url
                    .parse::<sqlx::sqlite::SqliteConnectOptions>()
                    .unwrap()
                    .create_if_missing(true)
                    .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
                    .busy_timeout(Duration::from_secs(10));
                let pool = connect(kind, &url, pool_options().connect_with(options)).await;
                let outbox = SqliteOutbox::with_names(pool.clone(), names.clone());
                (Db::Sqlite(pool, outbox), url, Placeholders::Question)
            }
            Database::Mysql => {
                let url = outbox_test_support::server_url(
                    "OUTBOX_TEST_MYSQL_URL",
                    "mysql://root@127.0.0.1:3306/test",
                );
                let options = url.parse::<sqlx::mysql::MySqlConnectOptions>().unwrap();
                let pool = connect(kind, &url, pool_options().connect_with(options)).await;
                let outbox = MySqlOutbox::with_names(pool.clone(), names.clone());
                (Db::MySql(pool, outbox), url, Placeholders::Question)
            }
        };
        let diesel = if diesel {
            Some(diesel_db(kind, &store_url, names.clone()).await)
        } else {
            None
        };
        let ledger = Self {
            db,
            diesel,
            table,
            store_url,
            keys,
            placeholders,
        };
        ledger.migrate().await;
        ledger
    }

    async fn migrate(&self) {
        let t = &self.table;
        let tables = [
            format!("CREATE TABLE {t}_k (k VARCHAR(16) PRIMARY KEY, seq BIGINT NOT NULL)"),
            format!(
                "CREATE TABLE {t}_ledger (id VARCHAR(36) PRIMARY KEY, k VARCHAR(16) NOT NULL, \
                 seq BIGINT NOT NULL)"
            ),
        ];
        let keys: Vec<String> = (0..self.keys).map(key).collect();
        let insert = format!(
            "INSERT INTO {t}_k (k, seq) VALUES {}",
            keys.iter()
                .map(|k| format!("('{k}', 0)"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        match &self.diesel {
            Some(db) => on_db!(DieselDb, db.clone(), |pool, outbox| {
                tokio::task::spawn_blocking(move || {
                    outbox.migrate(&mut pool.get().expect("a diesel connection"))
                })
                .await
                .expect("the migrating task")
                .expect("diesel migrates the outbox table")
            }),
            None => on_db!(Db, &self.db, |_pool, outbox| {
                outbox.migrate().await.expect("migrate the outbox table")
            }),
        }
        on_db!(Db, &self.db, |pool, _outbox| {
            for statement in tables.iter().chain([&insert]) {
                sqlx::query(statement)
                    .execute(pool)
                    .await
                    .unwrap_or_else(|e| panic!("{statement}: {e}"));
            }
        });
    }

    /// `sql` with `?` placeholders, numbered for PostgreSQL.
    fn sql(&self, sql: &str) -> String {
        match self.placeholders {
            Placeholders::Question => sql.to_owned(),
            Placeholders::Numbered => {
                let mut n = 0;
                sql.chars()
                    .map(|c| {
                        if c == '?' {
                            n += 1;
                            format!("${n}")
                        } else {
                            c.to_string()
                        }
                    })
                    .collect()
            }
        }
    }

    /// Commits (or rolls back) business transactions, one per `pace` at most, until
    /// `stop` is set; a transaction that fails (the database restarted, the connection
    /// was killed) is counted and the writer goes on after a short pause.
    pub(crate) async fn write(&self, pace: Duration, stop: Arc<AtomicBool>, writes: Arc<Writes>) {
        let mut tick = tokio::time::interval(pace.max(Duration::from_micros(1)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let t = &self.table;
        let bump = self.sql(&format!("UPDATE {t}_k SET seq = seq + 1 WHERE k = ?"));
        let read = self.sql(&format!("SELECT seq FROM {t}_k WHERE k = ?"));
        let record = self.sql(&format!(
            "INSERT INTO {t}_ledger (id, k, seq) VALUES (?, ?, ?)"
        ));
        while !stop.load(Ordering::Relaxed) {
            if !pace.is_zero() {
                tick.tick().await;
            }
            let k = key(fastrand::usize(..self.keys));
            let commit = fastrand::u32(..100) >= ROLLBACK_PERCENT;
            if let Some(db) = &self.diesel {
                let statements = [bump.clone(), read.clone(), record.clone()];
                let attempt = on_db!(DieselDb, db.clone(), |pool, outbox| {
                    tokio::task::spawn_blocking(move || {
                        let [bump, read, record] = statements;
                        let mut conn = pool.get().map_err(|e| e.to_string())?;
                        let done = conn.transaction(|conn| {
                            diesel::sql_query(bump).bind::<Text, _>(&k).execute(conn)?;
                            let seq = diesel::sql_query(read)
                                .bind::<Text, _>(&k)
                                .get_result::<Seq>(conn)?
                                .seq;
                            let message = written(&k, seq);
                            outbox
                                .enqueue(conn, &message)
                                .map_err(|e| diesel::result::Error::QueryBuilderError(e.into()))?;
                            diesel::sql_query(record)
                                .bind::<Text, _>(message.id().to_string())
                                .bind::<Text, _>(&k)
                                .bind::<BigInt, _>(seq)
                                .execute(conn)?;
                            if commit {
                                Ok(())
                            } else {
                                Err(diesel::result::Error::RollbackTransaction)
                            }
                        });
                        match done {
                            Ok(()) | Err(diesel::result::Error::RollbackTransaction) => Ok(()),
                            Err(e) => Err(e.to_string()),
                        }
                    })
                    .await
                    .expect("a diesel writer panicked")
                });
                writes.count(commit, attempt.is_ok()).await;
                continue;
            }
            let attempt = on_db!(Db, &self.db, |pool, outbox| async {
                let mut tx = pool.begin().await?;
                sqlx::query(&bump).bind(&k).execute(&mut *tx).await?;
                let seq: i64 = sqlx::query_scalar(&read)
                    .bind(&k)
                    .fetch_one(&mut *tx)
                    .await?;
                let message = written(&k, seq);
                outbox
                    .enqueue(&mut tx, &message)
                    .await
                    .map_err(|e| sqlx::Error::Protocol(e.to_string()))?;
                sqlx::query(&record)
                    .bind(message.id().to_string())
                    .bind(&k)
                    .bind(seq)
                    .execute(&mut *tx)
                    .await?;
                if commit {
                    tx.commit().await
                } else {
                    tx.rollback().await
                }
            }
            .await);
            writes.count(commit, attempt.is_ok()).await;
        }
    }

    /// Every committed message by id, from the ledger.
    pub(crate) async fn committed(&self) -> HashMap<String, Committed> {
        let query = format!("SELECT id, k, seq FROM {}_ledger", self.table);
        let rows: Vec<(String, String, i64)> = on_db!(Db, &self.db, |pool, _outbox| {
            sqlx::query_as(&query).fetch_all(pool).await
        })
        .expect("read the ledger");
        rows.into_iter()
            .map(|(id, key, seq)| (id, Committed { key, seq }))
            .collect()
    }

    /// Rows in each status, as `(pending or leased, published, dead)`; `None` while the
    /// database cannot be reached. (Counted in SQL: MariaDB's status column has a binary
    /// collation, which sqlx reads as bytes.)
    pub(crate) async fn statuses(&self) -> Option<(i64, i64, i64)> {
        let count = |statuses: &str| format!("COUNT(CASE WHEN status IN ({statuses}) THEN 1 END)");
        let query = format!(
            "SELECT {}, {}, {} FROM {}",
            count("'pending', 'leased'"),
            count("'published'"),
            count("'dead'"),
            self.table
        );
        on_db!(Db, &self.db, |pool, _outbox| {
            sqlx::query_as(&query).fetch_one(pool).await
        })
        .ok()
    }

    /// Rows leased by the relay process `pid` (its lease owner is `relay-<pid>-…`); 0 while
    /// the database cannot be reached.
    pub(crate) async fn leased_by(&self, pid: u32) -> i64 {
        let query = self.sql(&format!(
            "SELECT COUNT(*) FROM {} WHERE status = 'leased' AND lease_owner LIKE ?",
            self.table
        ));
        let owner = format!("relay-{pid}-%");
        on_db!(Db, &self.db, |pool, _outbox| {
            sqlx::query_scalar(&query)
                .bind(&owner)
                .fetch_one(pool)
                .await
        })
        .unwrap_or(0)
    }

    /// Ends every connection to the database but the battery's own (PostgreSQL:
    /// `pg_terminate_backend`; MariaDB: `KILL CONNECTION`). Returns how many it ended.
    pub(crate) async fn kill_connections(&self) -> usize {
        match &self.db {
            Db::Postgres(pool, _) => sqlx::query_scalar::<_, bool>(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                 WHERE datname = current_database() AND application_name <> 'outbox-battery' \
                 AND pid <> pg_backend_pid()",
            )
            .fetch_all(pool)
            .await
            .map_or(0, |ended| ended.len()),
            Db::MySql(pool, _) => {
                let Ok(mut conn) = pool.acquire().await else {
                    return 0;
                };
                let others: Vec<i64> = sqlx::query_scalar(
                    "SELECT id FROM information_schema.processlist \
                     WHERE db = DATABASE() AND id <> CONNECTION_ID()",
                )
                .fetch_all(&mut *conn)
                .await
                .unwrap_or_default();
                let mut ended = 0;
                for id in others {
                    if sqlx::query(&format!("KILL CONNECTION {id}"))
                        .execute(&mut *conn)
                        .await
                        .is_ok()
                    {
                        ended += 1;
                    }
                }
                ended
            }
            Db::Sqlite(..) => 0,
        }
    }

    /// Drops the run's tables.
    pub(crate) async fn drop_tables(&self) {
        let t = &self.table;
        for table in [
            t.clone(),
            format!("{t}_k"),
            format!("{t}_ledger"),
            format!("{t}_keys"),
        ] {
            let statement = format!("DROP TABLE IF EXISTS {table}");
            let _ = on_db!(Db, &self.db, |pool, _outbox| {
                sqlx::query(&statement).execute(pool).await.map(|_| ())
            });
        }
    }
}

/// diesel's writer on the database at `url` (the relays' store URL), with a pool of
/// diesel's sync connections; PostgreSQL's are named as the battery's own, so faults
/// that end other sessions spare them as they spare the sqlx writers.
async fn diesel_db(kind: Database, url: &str, names: TableNames) -> DieselDb {
    let url = url.to_owned();
    tokio::task::spawn_blocking(move || {
        fn pool<C: diesel::r2d2::R2D2Connection + 'static>()
        -> diesel::r2d2::Builder<ConnectionManager<C>> {
            Pool::builder()
                .max_size(8)
                .connection_timeout(Duration::from_secs(10))
        }
        let shown = outbox::redact::url(&url);
        match kind {
            Database::Postgres => {
                let separator = if url.contains('?') { '&' } else { '?' };
                let named = format!("{url}{separator}application_name=outbox-battery");
                let pool = pool()
                    .build(ConnectionManager::new(named))
                    .unwrap_or_else(|e| {
                        outbox_test_support::no_server(kind.server(), kind.env_var(), &shown, e)
                    });
                DieselDb::Postgres(pool, outbox::diesel::postgres::PgOutbox::with_names(names))
            }
            Database::Sqlite => {
                let path = url.strip_prefix("sqlite:").unwrap_or(&url).to_owned();
                let pool = pool()
                    .connection_customizer(Box::new(outbox::diesel::sqlite::Pragmas {
                        busy_timeout: Duration::from_secs(10),
                    }))
                    .build(ConnectionManager::new(path))
                    .unwrap_or_else(|e| {
                        outbox_test_support::no_server(kind.server(), kind.env_var(), &shown, e)
                    });
                DieselDb::Sqlite(
                    pool,
                    outbox::diesel::sqlite::SqliteOutbox::with_names(names),
                )
            }
            Database::Mysql => {
                let pool = pool()
                    .build(ConnectionManager::new(url.clone()))
                    .unwrap_or_else(|e| {
                        outbox_test_support::no_server(kind.server(), kind.env_var(), &shown, e)
                    });
                DieselDb::MySql(pool, outbox::diesel::mysql::MysqlOutbox::with_names(names))
            }
        }
    })
    .await
    .expect("the connecting task")
}

/// The name of partition key `i`.
fn key(i: usize) -> String {
    format!("k{i:04}")
}

/// Waits for `connecting` (a small pool on `url`), or exits loudly naming the server
/// that is missing.
async fn connect<DB: sqlx::Database>(
    kind: Database,
    url: &str,
    connecting: impl Future<Output = Result<sqlx::Pool<DB>, sqlx::Error>>,
) -> sqlx::Pool<DB> {
    let (server, var, url) = (kind.server(), kind.env_var(), outbox::redact::url(url));
    match tokio::time::timeout(Duration::from_secs(15), connecting).await {
        Ok(Ok(pool)) => pool,
        Ok(Err(e)) => outbox_test_support::no_server(server, var, &url, e),
        Err(_) => outbox_test_support::no_server(server, var, &url, "timeout"),
    }
}

/// The battery's own pools: a few connections, quick to give up.
fn pool_options<DB: sqlx::Database>() -> sqlx::pool::PoolOptions<DB> {
    sqlx::pool::PoolOptions::new()
        .max_connections(8)
        .acquire_timeout(Duration::from_secs(10))
}
