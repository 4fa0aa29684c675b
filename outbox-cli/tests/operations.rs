//! What an operator of `outbox relay` relies on, against PostgreSQL and a real HTTP
//! receiver: the commit-to-publish histogram measures from the commit, `/readyz` follows
//! the lag objective, and a dead letter is logged with its root cause.

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use outbox::postgres::PgOutbox;
use outbox::{NewMessage, TableNames};
use outbox_test_support::{ChildGuard, wait_for, wait_until};

mod common;

const LIMIT: Duration = Duration::from_secs(30);

struct Setup {
    pool: sqlx::PgPool,
    outbox: PgOutbox,
    table: String,
    dir: tempfile::TempDir,
    metrics: String,
    pg_url: String,
}

async fn setup(prefix: &str) -> Setup {
    let pg_url = std::env::var("OUTBOX_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let pool = sqlx::PgPool::connect(&pg_url).await.unwrap_or_else(|e| {
        panic!("PostgreSQL is not reachable at {pg_url} ({e}); run scripts/services.sh")
    });
    let table = format!("{prefix}_{:016x}", fastrand::u64(..));
    let outbox = PgOutbox::with_names(pool.clone(), TableNames::default().outbox(&table).unwrap());
    outbox.migrate().await.unwrap();
    let metrics = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap().to_string()
    };
    Setup {
        pool,
        outbox,
        table,
        dir: tempfile::tempdir().unwrap(),
        metrics,
        pg_url,
    }
}

impl Setup {
    /// Starts `outbox relay` on a config of the store, the metrics address and `rest`;
    /// its stderr goes to `relay.log` in the test's folder.
    fn relay(&self, rest: &str, rust_log: &str) -> ChildGuard {
        let config = self.dir.path().join("outbox.toml");
        std::fs::write(
            &config,
            format!(
                "[store]\nurl = \"{}\"\ntable = \"{}\"\n\n[metrics]\nlisten = \"{}\"\n\n{rest}",
                self.pg_url, self.table, self.metrics
            ),
        )
        .unwrap();
        let log = std::fs::File::create(self.log_path()).unwrap();
        ChildGuard::spawn(
            "outbox relay",
            Command::new(env!("CARGO_BIN_EXE_outbox"))
                .args(["--config", config.to_str().unwrap(), "relay"])
                .env_remove("OUTBOX_CONFIG")
                .env("RUST_LOG", rust_log)
                .stderr(Stdio::from(log)),
        )
    }

    fn log_path(&self) -> std::path::PathBuf {
        self.dir.path().join("relay.log")
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    async fn get(&self, path: &str) -> String {
        common::http_get(&self.metrics, path).await
    }
}

/// The value of the sample whose line starts with `prefix` (name and labels).
fn sample(metrics: &str, prefix: &str) -> Option<f64> {
    metrics
        .lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// A receiver that answers 503 while `refuse` is set and 204 otherwise.
async fn switchable_receiver(refuse: Arc<AtomicBool>) -> String {
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move || {
            let refuse = refuse.clone();
            async move {
                if refuse.load(Ordering::SeqCst) {
                    axum::http::StatusCode::SERVICE_UNAVAILABLE
                } else {
                    axum::http::StatusCode::NO_CONTENT
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

fn message(n: usize) -> NewMessage {
    NewMessage::builder("events", "invoice.paid")
        .json(&n)
        .build()
        .unwrap()
}

/// A transaction that sleeps 2 s between its INSERT and its COMMIT: the histogram of
/// `outbox_commit_to_publish_seconds` records about the publish delay, labelled
/// `since="commit"`, not the 2 s the transaction stayed open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commit_to_publish_latency_is_measured_from_the_commit() {
    let s = setup("latency").await;
    let tracked: String = sqlx::query_scalar("SHOW track_commit_timestamp")
        .fetch_one(&s.pool)
        .await
        .unwrap();
    assert_eq!(
        tracked, "on",
        "PostgreSQL keeps no commit timestamps; scripts/services.sh turns track_commit_timestamp on"
    );
    let refuse = Arc::new(AtomicBool::new(false));
    let hook = switchable_receiver(refuse).await;
    let mut relay = s.relay(
        &format!(
            "[relay]\npoll_interval = \"100ms\"\n\n[routes.events]\nurl = \"{hook}\"\nallow = [\"127.0.0.1/32\"]\n"
        ),
        "warn",
    );
    wait_until("the relay's /metrics", LIMIT, || async {
        s.get("/healthz").await.starts_with("HTTP/1.1 200")
    })
    .await;

    let mut tx = s.pool.begin().await.unwrap();
    s.outbox.enqueue(&mut tx, &message(1)).await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    tx.commit().await.unwrap();

    let count = "outbox_commit_to_publish_seconds_count{destination=\"events\",since=\"commit\"}";
    let metrics = wait_for("one latency sample since the commit", LIMIT, || async {
        let metrics = s.get("/metrics").await;
        sample(&metrics, count)
            .filter(|n| *n >= 1.0)
            .map(|_| metrics)
    })
    .await;
    let sum = sample(
        &metrics,
        "outbox_commit_to_publish_seconds_sum{destination=\"events\",since=\"commit\"}",
    )
    .expect("the histogram's sum");
    assert!(
        sum < 1.5,
        "the latency counts from the commit (the transaction was open 2 s before it): {sum} s"
    );
    assert!(
        metrics.contains("outbox_commit_to_publish_seconds_bucket{destination=\"events\",since=\"commit\",le=\"0.5\"}"),
        "a histogram with buckets, not a summary:\n{metrics}"
    );
    let exit = relay.terminate(LIMIT);
    assert!(exit.is_some_and(|e| e.success()), "clean exit: {exit:?}");
}

/// `/readyz` answers 503 naming the destination once its oldest pending row passes the
/// threshold (the receiver refuses), and 200 again after the drain; `/healthz` stays 200,
/// and the gauges follow the table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_fails_while_a_destination_lags_and_recovers_after_the_drain() {
    let s = setup("readyz").await;
    let refuse = Arc::new(AtomicBool::new(true));
    let hook = switchable_receiver(refuse.clone()).await;
    let mut relay = s.relay(
        &format!(
            "[relay]\npoll_interval = \"100ms\"\ngauge_interval = \"200ms\"\n\n\
             [retry]\ninitial_delay = \"100ms\"\nmax_delay = \"300ms\"\nmax_attempts = 1000\n\n\
             [health]\nmax_pending_age = \"2s\"\n\n\
             [routes.events]\nurl = \"{hook}\"\nallow = [\"127.0.0.1/32\"]\n"
        ),
        "warn",
    );
    wait_until("/readyz answering 200 on an empty table", LIMIT, || async {
        s.get("/readyz").await.starts_with("HTTP/1.1 200")
    })
    .await;
    let mut tx = s.pool.begin().await.unwrap();
    s.outbox
        .enqueue_all(&mut tx, &[message(1), message(2), message(3)])
        .await
        .unwrap();
    tx.commit().await.unwrap();

    let failing = wait_for("/readyz answering 503", LIMIT, || async {
        let response = s.get("/readyz").await;
        response.starts_with("HTTP/1.1 503").then_some(response)
    })
    .await;
    assert!(
        failing.contains("destination events: oldest pending row is"),
        "the answer names the lagging destination: {failing}"
    );
    assert!(
        s.get("/healthz").await.starts_with("HTTP/1.1 200"),
        "still alive"
    );
    let backlog = "outbox_backlog{destination=\"events\"}";
    assert_eq!(
        sample(&s.get("/metrics").await, backlog),
        Some(3.0),
        "the backlog gauge counts the 3 rows"
    );

    refuse.store(false, Ordering::SeqCst);
    wait_until("/readyz answering 200 after the drain", LIMIT, || async {
        s.get("/readyz").await.starts_with("HTTP/1.1 200")
    })
    .await;
    wait_until("the backlog gauge back to 0", LIMIT, || async {
        sample(&s.get("/metrics").await, backlog) == Some(0.0)
    })
    .await;
    let published: i64 = sqlx::query_scalar(&format!(
        "SELECT count(*) FROM {} WHERE status = 'published'",
        s.table
    ))
    .fetch_one(&s.pool)
    .await
    .unwrap();
    assert_eq!(published, 3, "the 3 rows are published");
    let exit = relay.terminate(LIMIT);
    assert!(exit.is_some_and(|e| e.success()), "clean exit: {exit:?}");
}

/// With `RUST_LOG=info`, a message that cannot be delivered (nothing listens on its
/// endpoint, one attempt allowed) is logged as dead-lettered with its id, destination,
/// attempt and the root cause.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_is_logged_with_its_root_cause() {
    let s = setup("deadlog").await;
    let closed = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap().to_string()
    }; // dropped: nothing listens there
    let mut relay = s.relay(
        &format!(
            "[relay]\npoll_interval = \"100ms\"\n\n[retry]\nmax_attempts = 1\n\n\
             [routes.events]\nurl = \"http://{closed}/hook\"\nallow = [\"127.0.0.1/32\"]\n"
        ),
        "info",
    );
    let mut tx = s.pool.begin().await.unwrap();
    let m = message(1);
    s.outbox.enqueue(&mut tx, &m).await.unwrap();
    tx.commit().await.unwrap();
    let id = m.id().to_string();
    let line = wait_for(
        "a dead-letter line in the relay's stderr",
        LIMIT,
        || async {
            s.log()
                .lines()
                .find(|l| l.contains("dead-lettered") && l.contains(&id))
                .map(str::to_owned)
        },
    )
    .await;
    for expected in ["destination=\"events\"", "attempt=1"] {
        assert!(line.contains(expected), "{expected} in: {line}");
    }
    assert!(
        line.to_lowercase().contains("refused"),
        "the root cause (connection refused) in: {line}"
    );
    let exit = relay.terminate(LIMIT);
    assert!(exit.is_some_and(|e| e.success()), "clean exit: {exit:?}");
}
