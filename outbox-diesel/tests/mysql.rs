//! diesel's writer and inbox on a real MariaDB / MySQL: the store and ordering suites
//! with every message enqueued through diesel and drained by the relay store, and the
//! inbox suite.
#![cfg(feature = "mysql")]

mod common;

use diesel::MysqlConnection;
use outbox_diesel::PublishedRows;
use outbox_diesel::mysql::{MysqlInbox, MysqlOutbox};
use outbox_engine::testkit::{inbox_suite, store_suite};
use outbox_sql::Dialect;

const VAR: &str = "OUTBOX_TEST_MYSQL_URL";

fn url() -> String {
    outbox_test_support::server_url(VAR, "mysql://root@127.0.0.1:3306/test")
}

async fn harness(mode: PublishedRows) -> common::Harness<MysqlConnection> {
    let names = common::names("diesel_outbox");
    let shift = names.render(
        Dialect::MySql,
        "UPDATE {outbox} SET created_at = created_at - INTERVAL (? * 1000) MICROSECOND, \
         available_at = available_at - INTERVAL (? * 1000) MICROSECOND, \
         lease_until = lease_until - INTERVAL (? * 1000) MICROSECOND, \
         published_at = published_at - INTERVAL (? * 1000) MICROSECOND, \
         dead_at = dead_at - INTERVAL (? * 1000) MICROSECOND",
    );
    let pool = common::pool::<MysqlConnection>("MySQL/MariaDB", VAR, &url(), 4);
    let table = names.outbox_name().name().to_owned();
    let cleanup = common::DropAfter {
        pool: pool.clone(),
        statements: vec![
            names.render(
                Dialect::MySql,
                "DROP TABLE IF EXISTS {outbox}, {outbox_keys}",
            ),
            format!("DELETE FROM outbox_migrations WHERE id LIKE '{table}/%'"),
            format!("DROP FUNCTION IF EXISTS `{table}_uuidv7`"),
            format!("DROP FUNCTION IF EXISTS `{table}_key`"),
            format!("DROP PROCEDURE IF EXISTS `{table}_enqueue`"),
        ],
    };
    let writer = MysqlOutbox::with_names(names).published_rows(mode);
    let mut h = common::Harness::open(
        writer,
        pool,
        &outbox_sqlx::MYSQL,
        &url(),
        "diesel-mysql",
        mode,
        shift,
    )
    .await;
    h.shift_binds = 5;
    h.keep = Some(Box::new(cleanup));
    h
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_passes_the_store_suite() {
    store_suite::run_all(|| harness(PublishedRows::Keep)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_passes_the_store_and_ordering_suites_in_delete_mode() {
    store_suite::run_all(|| harness(PublishedRows::Delete)).await;
    store_suite::run_ordering(|| harness(PublishedRows::Delete)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_passes_the_ordering_suite() {
    store_suite::run_ordering(|| harness(PublishedRows::Keep)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mysql_passes_the_inbox_suite() {
    inbox_suite::run_all(|| async {
        let names = outbox_sql::TableNames::default()
            .inbox(&common::fresh_table("diesel_inbox"))
            .unwrap();
        let pool = common::pool::<MysqlConnection>("MySQL/MariaDB", VAR, &url(), 12);
        let inbox = MysqlInbox::with_names(names.clone());
        common::migrate_inbox(&inbox, &pool).await;
        let table = names.inbox_name().name().to_owned();
        common::InboxOf {
            inbox: common::SyncInbox(inbox),
            age: names.render(
                Dialect::MySql,
                "UPDATE {inbox} SET received_at = received_at - INTERVAL ? SECOND",
            ),
            keep: Some(Box::new(common::DropAfter {
                pool: pool.clone(),
                statements: vec![
                    names.render(Dialect::MySql, "DROP TABLE IF EXISTS {inbox}"),
                    format!("DELETE FROM outbox_migrations WHERE id LIKE '{table}/%'"),
                ],
            })),
            pool,
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_producer_atomicity() {
    let h = harness(PublishedRows::Keep).await;
    common::producer_atomicity(
        &h,
        "CREATE TABLE {table} (id BIGINT PRIMARY KEY) ENGINE = InnoDB",
        "INSERT INTO {table} (id) VALUES (?)",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_table_is_shared_with_the_sqlx_writer() {
    let h = harness(PublishedRows::Keep).await;
    let pool = sqlx::MySqlPool::connect(&url()).await.expect("sqlx pool");
    let sqlx_writer =
        outbox_sqlx::mysql::MySqlOutbox::with_names(pool.clone(), h.writer.names().clone());
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
    async fn mysql_passes_the_store_and_ordering_suites_enqueueing_on_diesel_async() {
        let h = || async {
            common::AsyncHarness {
                sync: harness(PublishedRows::Keep).await,
                url: url(),
            }
        };
        store_suite::run_all(h).await;
        store_suite::run_ordering(h).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn mysql_passes_the_inbox_suite_on_diesel_async() {
        inbox_suite::run_all(|| async {
            let names = outbox_sql::TableNames::default()
                .inbox(&common::fresh_table("diesel_inbox"))
                .unwrap();
            let pool = common::pool::<MysqlConnection>("MySQL/MariaDB", VAR, &url(), 2);
            let inbox = MysqlInbox::with_names(names.clone());
            common::migrate_inbox(&inbox, &pool).await;
            let table = names.inbox_name().name().to_owned();
            common::AsyncInboxOf {
                inbox,
                url: url(),
                age: names.render(
                    Dialect::MySql,
                    "UPDATE {inbox} SET received_at = received_at - INTERVAL ? SECOND",
                ),
                keep: Some(Box::new(common::DropAfter {
                    pool: pool.clone(),
                    statements: vec![
                        names.render(Dialect::MySql, "DROP TABLE IF EXISTS {inbox}"),
                        format!("DELETE FROM outbox_migrations WHERE id LIKE '{table}/%'"),
                    ],
                })),
                pool,
            }
        })
        .await;
    }
}
