//! The diesel store and inbox on a real MariaDB / MySQL: the store, ordering and inbox
//! suites.
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
    let pool = common::pool::<MysqlConnection>("MySQL/MariaDB", VAR, &url(), 10);
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
    let outbox = MysqlOutbox::with_names(pool, names).published_rows(mode);
    outbox.migrate().await.expect("migrate");
    common::Harness {
        outbox,
        name: "diesel-mysql",
        mode,
        shift,
        shift_binds: 5,
        per_key: true,
        keep: Some(Box::new(cleanup)),
    }
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
        inbox.migrate(&pool).await.expect("migrate the inbox");
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
        h.outbox.clone(),
        "CREATE TABLE {table} (id BIGINT PRIMARY KEY) ENGINE = InnoDB",
        "INSERT INTO {table} (id) VALUES (?)",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_table_is_shared_with_the_sqlx_backend() {
    let h = harness(PublishedRows::Keep).await;
    let pool = sqlx::MySqlPool::connect(&url()).await.expect("sqlx pool");
    let sqlx_store =
        outbox_sqlx::mysql::MySqlOutbox::with_names(pool.clone(), h.outbox.names().clone());
    sqlx_store.migrate().await.expect("sqlx migrate");
    h.outbox.migrate().await.expect("diesel migrate again");
    let store = sqlx_store.clone();
    common::shared_with_sqlx(h.outbox.clone(), sqlx_store, |messages| async move {
        let mut tx = pool.begin().await.expect("begin");
        store
            .enqueue_all(&mut tx, &messages)
            .await
            .expect("enqueue");
        tx.commit().await.expect("commit");
    })
    .await;
}

/// A claim stuck on a silent connection keeps its thread and connection (a diesel call
/// cannot be cancelled), and its transaction keeps the row locked; the driver's store
/// opens a fresh pool, and its sessions' 30 s `wait_timeout` frees the row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_database_costs_the_relay_a_lease_not_its_pool() {
    use outbox_test_support::proxy::Net;

    let table = common::fresh_table("diesel_silent");
    let pool = sqlx::MySqlPool::connect(&url()).await.expect("sqlx pool");
    let direct = outbox_sqlx::mysql::MySqlOutbox::with_names(
        pool.clone(),
        outbox_sql::TableNames::default().outbox(&table).unwrap(),
    );
    direct.migrate().await.expect("migrate");
    let mut tx = pool.begin().await.unwrap();
    let message = outbox_engine::NewMessage::builder("orders", "order.paid")
        .json(&1)
        .build()
        .unwrap();
    direct.enqueue(&mut tx, &message).await.unwrap();
    tx.commit().await.unwrap();

    let (store, proxy) =
        common::behind_proxy(&outbox_diesel::MYSQL, &format!("diesel+{}", url()), &table).await;
    let mut lock = pool.acquire().await.unwrap();
    sqlx::query(&format!("LOCK TABLES `{table}` WRITE"))
        .execute(&mut *lock)
        .await
        .unwrap();
    let silence = async {
        proxy.set(Net::Silence);
        sqlx::query("UNLOCK TABLES")
            .execute(&mut *lock)
            .await
            .unwrap();
    };
    store_suite::silent_database_costs_a_lease_not_the_pool(store, silence, || {
        proxy.set(Net::Pass);
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
            inbox.migrate(&pool).await.expect("migrate the inbox");
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
