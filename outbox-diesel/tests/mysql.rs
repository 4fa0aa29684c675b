//! diesel's writer and inbox on a real MariaDB / MySQL: the shared diesel tests
//! ([`diesel_tests!`]).
#![cfg(feature = "mysql")]

mod common;

use diesel::MysqlConnection;
use outbox_diesel::PublishedRows;
use outbox_diesel::mysql::MysqlOutbox;
use outbox_engine::testkit::{inbox_suite, store_suite};
use outbox_sql::Dialect;

const VAR: &str = "OUTBOX_TEST_MYSQL_URL";
const BUSINESS_TABLE: &str = "CREATE TABLE {table} (id BIGINT PRIMARY KEY) ENGINE = InnoDB";
const BUSINESS_INSERT: &str = "INSERT INTO {table} (id) VALUES (?)";

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
    let (url, name) = (url(), "diesel-mysql");
    let mut h =
        common::Harness::open(writer, pool, &outbox_sqlx::MYSQL, &url, name, mode, shift).await;
    h.shift_binds = 5;
    h.keep = Some(Box::new(cleanup));
    h
}

async fn inbox(connections: u32) -> common::InboxParts<MysqlConnection> {
    let names = outbox_sql::TableNames::default()
        .inbox(&common::fresh_table("diesel_inbox"))
        .unwrap();
    let pool = common::pool::<MysqlConnection>("MySQL/MariaDB", VAR, &url(), connections);
    let table = names.inbox_name().name().to_owned();
    let age = "UPDATE {inbox} SET received_at = received_at - INTERVAL ? SECOND";
    let cleanup = common::DropAfter {
        pool: pool.clone(),
        statements: vec![
            names.render(Dialect::MySql, "DROP TABLE IF EXISTS {inbox}"),
            format!("DELETE FROM outbox_migrations WHERE id LIKE '{table}/%'"),
        ],
    };
    common::InboxParts::migrated(&names, pool, age, url(), Some(Box::new(cleanup))).await
}

fn async_url(_: &common::Harness<MysqlConnection>) -> String {
    url()
}

async fn sqlx_writer(
    h: &common::Harness<MysqlConnection>,
) -> (sqlx::MySqlPool, outbox_sqlx::mysql::MySqlOutbox) {
    let pool = sqlx::MySqlPool::connect(&url()).await.expect("sqlx pool");
    let names = h.writer.names().clone();
    (
        pool.clone(),
        outbox_sqlx::mysql::MySqlOutbox::with_names(pool, names),
    )
}

crate::diesel_tests!();
