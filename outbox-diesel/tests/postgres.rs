//! diesel's writer and inbox on a real PostgreSQL: the shared diesel tests
//! ([`diesel_tests!`]), plus the store and ordering suites in the rotate layout.
#![cfg(feature = "postgres")]

mod common;

use diesel::PgConnection;
use outbox_diesel::PublishedRows;
use outbox_diesel::postgres::PgOutbox;
use outbox_engine::testkit::{inbox_suite, store_suite};
use outbox_sql::Dialect;

const VAR: &str = "OUTBOX_TEST_POSTGRES_URL";
const BUSINESS_TABLE: &str = "CREATE TABLE {table} (id bigint PRIMARY KEY)";
const BUSINESS_INSERT: &str = "INSERT INTO {table} (id) VALUES ($1)";

fn url() -> String {
    outbox_test_support::server_url(VAR, "postgres://postgres@127.0.0.1:5432/test")
}

async fn harness(mode: PublishedRows) -> common::Harness<PgConnection> {
    let names = common::names("diesel_outbox");
    // In rotate mode the slots age with the rows.
    let slots = match mode {
        PublishedRows::Rotate => {
            "WITH slots AS (UPDATE {outbox_fn:slots} SET since = since - $1 * interval '1 millisecond') "
        }
        _ => "",
    };
    let shift = names.render(
        Dialect::Postgres,
        &(slots.to_owned()
            + "UPDATE {outbox} SET created_at = created_at - $1 * interval '1 millisecond', \
         available_at = available_at - $1 * interval '1 millisecond', \
         lease_until = lease_until - $1 * interval '1 millisecond', \
         published_at = published_at - $1 * interval '1 millisecond', \
         dead_at = dead_at - $1 * interval '1 millisecond'"),
    );
    let pool = common::pool::<PgConnection>("PostgreSQL", VAR, &url(), 4);
    let writer = PgOutbox::with_names(names).published_rows(mode);
    let (url, name) = (url(), "diesel-postgres");
    common::Harness::open(
        writer,
        pool,
        &outbox_sqlx::POSTGRES,
        &url,
        name,
        mode,
        shift,
    )
    .await
}

async fn inbox(connections: u32) -> common::InboxParts<PgConnection> {
    let names = outbox_sql::TableNames::default()
        .inbox(&common::fresh_table("diesel_inbox"))
        .unwrap();
    let pool = common::pool::<PgConnection>("PostgreSQL", VAR, &url(), connections);
    let age = "UPDATE {inbox} SET received_at = received_at - $1 * interval '1 second'";
    common::InboxParts::migrated(&names, pool, age, url(), None).await
}

fn async_url(_: &common::Harness<PgConnection>) -> String {
    url()
}

async fn sqlx_writer(
    h: &common::Harness<PgConnection>,
) -> (sqlx::PgPool, outbox_sqlx::postgres::PgOutbox) {
    let pool = sqlx::PgPool::connect(&url()).await.expect("sqlx pool");
    let names = h.writer.names().clone();
    (
        pool.clone(),
        outbox_sqlx::postgres::PgOutbox::with_names(pool, names),
    )
}

crate::diesel_tests!();

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_the_store_and_ordering_suites_in_rotate_mode() {
    store_suite::run_all(|| harness(PublishedRows::Rotate)).await;
    store_suite::run_ordering(|| harness(PublishedRows::Rotate)).await;
}
