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

/// The enqueue statement stays prepared on its connection: diesel's statement cache keys
/// it by its text, so enqueues after the first reuse the first one's prepared form
/// instead of parsing and planning it again.
#[test]
fn an_enqueue_is_prepared_once_per_connection() {
    use diesel::sql_types::BigInt;
    use diesel::{Connection, RunQueryDsl};

    #[derive(diesel::QueryableByName)]
    struct Count {
        #[diesel(sql_type = BigInt)]
        n: i64,
    }
    let schema = common::fresh_table("diesel_prepared");
    let names = outbox_sql::TableNames::default().schema(&schema).unwrap();
    let writer = PgOutbox::with_names(names);
    let mut conn = PgConnection::establish(&url())
        .unwrap_or_else(|e| panic!("no PostgreSQL at {VAR} ({e}); scripts/services.sh starts one"));
    diesel::sql_query(format!("CREATE SCHEMA {schema}"))
        .execute(&mut conn)
        .unwrap();
    writer.migrate(&mut conn).unwrap();
    let prepared = |conn: &mut PgConnection| {
        diesel::sql_query(
            "SELECT count(*) AS n FROM pg_prepared_statements WHERE statement LIKE 'INSERT INTO%'",
        )
        .get_result::<Count>(conn)
        .unwrap()
        .n
    };
    let before = prepared(&mut conn);
    for order in 0..5 {
        let message = outbox_engine::NewMessage::builder("billing", "order.paid")
            .json(&order)
            .build()
            .unwrap();
        writer.enqueue(&mut conn, &message).unwrap();
    }
    let rows: Count = diesel::sql_query(format!("SELECT count(*) AS n FROM {schema}.outbox"))
        .get_result(&mut conn)
        .unwrap();
    assert_eq!(rows.n, 5, "every enqueue inserted its row");
    assert_eq!(
        prepared(&mut conn) - before,
        1,
        "five enqueues, one prepared INSERT on the connection"
    );
    diesel::sql_query(format!("DROP SCHEMA {schema} CASCADE"))
        .execute(&mut conn)
        .unwrap();
}
