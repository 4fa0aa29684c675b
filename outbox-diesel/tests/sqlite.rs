//! diesel's writer and inbox on a real SQLite file (WAL, busy timeout, a pool of
//! connections): the store and ordering suites with every message enqueued through
//! diesel and drained by the relay store, and the inbox suite.
#![cfg(feature = "sqlite")]

mod common;

use std::time::Duration;

use diesel::SqliteConnection;
use diesel::r2d2::{ConnectionManager, Pool};
use outbox_diesel::PublishedRows;
use outbox_diesel::sqlite::{Pragmas, SqliteInbox, SqliteOutbox};
use outbox_engine::testkit::{inbox_suite, store_suite};
use outbox_sql::Dialect;

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
    let url = format!("sqlite:{}", path(&dir));
    let mut h = common::Harness::open(
        writer,
        pool,
        &outbox_sqlx::SQLITE,
        &url,
        "diesel-sqlite",
        mode,
        shift,
    )
    .await;
    h.keep = Some(Box::new(dir));
    h
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_passes_the_store_suite() {
    store_suite::run_all(|| harness(PublishedRows::Keep)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_passes_the_store_and_ordering_suites_in_delete_mode() {
    store_suite::run_all(|| harness(PublishedRows::Delete)).await;
    store_suite::run_ordering(|| harness(PublishedRows::Delete)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_passes_the_ordering_suite() {
    store_suite::run_ordering(|| harness(PublishedRows::Keep)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_passes_the_inbox_suite() {
    inbox_suite::run_all(|| async {
        let names = outbox_sql::TableNames::default();
        let (pool, dir) = pool();
        let inbox = SqliteInbox::with_names(names.clone());
        common::migrate_inbox(&inbox, &pool).await;
        common::InboxOf {
            inbox: common::SyncInbox(inbox),
            pool,
            age: names.render(
                Dialect::Sqlite,
                "UPDATE {inbox} SET received_at = received_at - ?1 * 1000",
            ),
            keep: Some(Box::new(dir)),
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_producer_atomicity() {
    let h = harness(PublishedRows::Keep).await;
    common::producer_atomicity(
        &h,
        "CREATE TABLE {table} (id INTEGER PRIMARY KEY)",
        "INSERT INTO {table} (id) VALUES (?1)",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_table_is_shared_with_the_sqlx_writer() {
    let h = harness(PublishedRows::Keep).await;
    let dir = h
        .keep
        .as_ref()
        .and_then(|k| k.downcast_ref::<tempfile::TempDir>())
        .expect("the database folder");
    let options = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(path(dir))
        .busy_timeout(Duration::from_secs(10));
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(2)
        .connect_with(options)
        .await
        .expect("sqlx pool");
    let sqlx_writer =
        outbox_sqlx::sqlite::SqliteOutbox::with_names(pool.clone(), h.writer.names().clone());
    common::shared_with_sqlx(&h, |messages| async move {
        let mut tx = pool.begin().await.expect("begin");
        sqlx_writer
            .enqueue_all(&mut tx, &messages)
            .await
            .expect("enqueue");
        tx.commit().await.expect("commit");
    })
    .await;
}

#[cfg(feature = "async")]
mod on_diesel_async {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sqlite_passes_the_store_and_ordering_suites_enqueueing_on_diesel_async() {
        let h = || async {
            let sync = harness(PublishedRows::Keep).await;
            let url = sync
                .keep
                .as_ref()
                .and_then(|k| k.downcast_ref::<tempfile::TempDir>())
                .map(path)
                .expect("the database folder");
            common::AsyncHarness { sync, url }
        };
        store_suite::run_all(h).await;
        store_suite::run_ordering(h).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sqlite_passes_the_inbox_suite_on_diesel_async() {
        inbox_suite::run_all(|| async {
            let names = outbox_sql::TableNames::default();
            let (pool, dir) = pool();
            let inbox = SqliteInbox::with_names(names.clone());
            common::migrate_inbox(&inbox, &pool).await;
            common::AsyncInboxOf {
                inbox,
                url: path(&dir),
                pool,
                age: names.render(
                    Dialect::Sqlite,
                    "UPDATE {inbox} SET received_at = received_at - ?1 * 1000",
                ),
                keep: Some(Box::new(dir)),
            }
        })
        .await;
    }
}
