//! diesel's writer and inbox on a real PostgreSQL: the store and ordering suites with
//! every message enqueued through diesel and drained by the relay store, and the inbox
//! suite.
#![cfg(feature = "postgres")]

mod common;

use diesel::PgConnection;
use outbox_diesel::PublishedRows;
use outbox_diesel::postgres::{PgInbox, PgOutbox};
use outbox_engine::testkit::{inbox_suite, store_suite};
use outbox_sql::Dialect;

const VAR: &str = "OUTBOX_TEST_POSTGRES_URL";

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
    common::Harness::open(
        writer,
        pool,
        &outbox_sqlx::POSTGRES,
        &url(),
        "diesel-postgres",
        mode,
        shift,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_passes_the_store_suite() {
    store_suite::run_all(|| harness(PublishedRows::Keep)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_passes_the_store_and_ordering_suites_in_delete_mode() {
    store_suite::run_all(|| harness(PublishedRows::Delete)).await;
    store_suite::run_ordering(|| harness(PublishedRows::Delete)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_passes_the_store_and_ordering_suites_in_rotate_mode() {
    store_suite::run_all(|| harness(PublishedRows::Rotate)).await;
    store_suite::run_ordering(|| harness(PublishedRows::Rotate)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_passes_the_ordering_suite() {
    store_suite::run_ordering(|| harness(PublishedRows::Keep)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_passes_the_inbox_suite() {
    inbox_suite::run_all(|| async {
        let names = outbox_sql::TableNames::default()
            .inbox(&common::fresh_table("diesel_inbox"))
            .unwrap();
        let pool = common::pool::<PgConnection>("PostgreSQL", VAR, &url(), 12);
        let inbox = PgInbox::with_names(names.clone());
        common::migrate_inbox(&inbox, &pool).await;
        common::InboxOf {
            inbox: common::SyncInbox(inbox),
            pool,
            age: names.render(
                Dialect::Postgres,
                "UPDATE {inbox} SET received_at = received_at - $1 * interval '1 second'",
            ),
            keep: None,
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_producer_atomicity() {
    let h = harness(PublishedRows::Keep).await;
    common::producer_atomicity(
        &h,
        "CREATE TABLE {table} (id bigint PRIMARY KEY)",
        "INSERT INTO {table} (id) VALUES ($1)",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_table_is_shared_with_the_sqlx_writer() {
    let h = harness(PublishedRows::Keep).await;
    let pool = sqlx::PgPool::connect(&url()).await.expect("sqlx pool");
    let sqlx_writer =
        outbox_sqlx::postgres::PgOutbox::with_names(pool.clone(), h.writer.names().clone());
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
    async fn postgres_passes_the_store_and_ordering_suites_enqueueing_on_diesel_async() {
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
    async fn postgres_passes_the_inbox_suite_on_diesel_async() {
        inbox_suite::run_all(|| async {
            let names = outbox_sql::TableNames::default()
                .inbox(&common::fresh_table("diesel_inbox"))
                .unwrap();
            let pool = common::pool::<PgConnection>("PostgreSQL", VAR, &url(), 2);
            let inbox = PgInbox::with_names(names.clone());
            common::migrate_inbox(&inbox, &pool).await;
            common::AsyncInboxOf {
                inbox,
                url: url(),
                pool,
                age: names.render(
                    Dialect::Postgres,
                    "UPDATE {inbox} SET received_at = received_at - $1 * interval '1 second'",
                ),
                keep: None,
            }
        })
        .await;
    }
}
