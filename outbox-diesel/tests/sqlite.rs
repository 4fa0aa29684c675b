//! diesel's writer and inbox on a real SQLite file (WAL, busy timeout, a pool of
//! connections): the shared diesel tests ([`diesel_tests!`]).
#![cfg(feature = "sqlite")]

mod common;

use std::time::Duration;

use diesel::SqliteConnection;
use diesel::r2d2::{ConnectionManager, Pool};
use outbox_diesel::PublishedRows;
use outbox_diesel::sqlite::{Pragmas, SqliteOutbox};
use outbox_engine::testkit::{inbox_suite, store_suite};
use outbox_sql::Dialect;

const BUSINESS_TABLE: &str = "CREATE TABLE {table} (id INTEGER PRIMARY KEY)";
const BUSINESS_INSERT: &str = "INSERT INTO {table} (id) VALUES (?1)";

/// A pool on a fresh database file, removed with the pool's last user.
fn pool() -> (Pool<ConnectionManager<SqliteConnection>>, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("a temporary folder");
    (pool_at(&dir), dir)
}

fn path(dir: &tempfile::TempDir) -> String {
    dir.path()
        .join("outbox.db")
        .to_str()
        .expect("a path")
        .to_owned()
}

fn pool_at(dir: &tempfile::TempDir) -> Pool<ConnectionManager<SqliteConnection>> {
    Pool::builder()
        .max_size(8)
        .min_idle(Some(0))
        .connection_timeout(Duration::from_secs(10))
        .connection_customizer(Box::new(Pragmas {
            busy_timeout: Duration::from_secs(10),
        }))
        .build(ConnectionManager::<SqliteConnection>::new(path(dir)))
        .expect("a SQLite pool")
}

async fn harness(mode: PublishedRows) -> common::Harness<SqliteConnection> {
    let names = common::names("outbox");
    let shift = names.render(
        Dialect::Sqlite,
        "UPDATE {outbox} SET created_at = created_at - ?1, available_at = available_at - ?1, \
         lease_until = lease_until - ?1, published_at = published_at - ?1, dead_at = dead_at - ?1",
    );
    let (pool, dir) = pool();
    let writer = SqliteOutbox::with_names(names).published_rows(mode);
    let (url, name) = (format!("sqlite:{}", path(&dir)), "diesel-sqlite");
    let mut h =
        common::Harness::open(writer, pool, &outbox_sqlx::SQLITE, &url, name, mode, shift).await;
    h.keep = Some(Box::new(dir));
    h
}

async fn inbox(_connections: u32) -> common::InboxParts<SqliteConnection> {
    let names = outbox_sql::TableNames::default();
    let (pool, dir) = pool();
    let age = "UPDATE {inbox} SET received_at = received_at - ?1 * 1000";
    common::InboxParts::migrated(&names, pool, age, path(&dir), Some(Box::new(dir))).await
}

/// The database file of `h`.
fn async_url(h: &common::Harness<SqliteConnection>) -> String {
    h.keep
        .as_ref()
        .and_then(|k| k.downcast_ref::<tempfile::TempDir>())
        .map(path)
        .expect("the database folder")
}

async fn sqlx_writer(
    h: &common::Harness<SqliteConnection>,
) -> (sqlx::SqlitePool, outbox_sqlx::sqlite::SqliteOutbox) {
    let options = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(async_url(h))
        .busy_timeout(Duration::from_secs(10));
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(2)
        .connect_with(options)
        .await
        .expect("sqlx pool");
    let names = h.writer.names().clone();
    (
        pool.clone(),
        outbox_sqlx::sqlite::SqliteOutbox::with_names(pool, names),
    )
}

crate::diesel_tests!();
