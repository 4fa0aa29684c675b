//! Relays in child processes: the `main` of a test file that re-runs itself as those
//! children (the crash and ordering stress tests), and for the PostgreSQL-only ordering
//! stress test the server's pool and the table a test sink records deliveries in.

use std::future::Future;
use std::pin::Pin;

use outbox_engine::{Failure, FailureClass};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

const URL_VAR: &str = "OUTBOX_TEST_POSTGRES_URL";
const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// A pool of `size` connections to the test server, or a loud failure naming it.
pub async fn pool(size: u32) -> PgPool {
    let url = super::url(URL_VAR, DEFAULT_URL);
    match PgPoolOptions::new()
        .max_connections(size)
        .connect(&url)
        .await
    {
        Ok(pool) => pool,
        Err(e) => super::no_server("PostgreSQL", URL_VAR, &url, e),
    }
}

/// Records `ids` as delivered in the table `received` (a `uuid` column `id`), as a test
/// sink's broker; a failed insert is a retryable connection failure.
pub async fn record(pool: &PgPool, received: &str, ids: Vec<uuid::Uuid>) -> Result<(), Failure> {
    sqlx::query(&format!(
        "INSERT INTO {received} (id) SELECT * FROM UNNEST($1::uuid[])"
    ))
    .bind(ids)
    .execute(pool)
    .await
    .map(drop)
    .map_err(|e| Failure::retryable(FailureClass::Connection, e.to_string()))
}

/// Drops the test's `tables`.
pub async fn drop_tables(pool: &PgPool, tables: &[&str]) {
    let sql = format!("DROP TABLE {}", tables.join(", "));
    sqlx::query(&sql)
        .execute(pool)
        .await
        .expect("drop the tables");
}

/// A test of a file run by [`main`]: its name, and the body the parent process runs.
pub type Test = (&'static str, fn() -> Pin<Box<dyn Future<Output = ()>>>);

/// The `main` of a test file that re-runs itself as child processes: with `child_var`
/// set, runs `child` on its value until the parent is gone; otherwise runs the selected
/// `tests` as the parent. Each on a runtime with two worker threads.
pub fn main<C>(child_var: &str, child: impl FnOnce(String) -> C, tests: Vec<Test>)
where
    C: Future<Output = ()>,
{
    let runtime = || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    };
    if let Ok(value) = std::env::var(child_var) {
        outbox_test_support::exit_with_parent();
        runtime().block_on(child(value));
        return;
    }
    let tests = tests
        .into_iter()
        .map(|(name, parent)| {
            let run: Box<dyn FnOnce() + Send> = Box::new(move || runtime().block_on(parent()));
            (name.to_owned(), run)
        })
        .collect();
    outbox_test_support::run_tests(tests);
}
