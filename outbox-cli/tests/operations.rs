//! What an operator of `outbox relay` relies on, against PostgreSQL and a real HTTP
//! receiver: the commit-to-publish histogram measures from the commit, every series has
//! its help text, `/readyz` follows the store and `/slo` the lag objective, and a dead
//! letter is logged with its root cause.

use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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
    let pg_url = outbox_test_support::postgres_url();
    let pool = outbox_test_support::postgres_pool().await;
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
        self.relay_on(&self.table, rest, rust_log)
    }

    /// [`relay`](Self::relay) on outbox table `table`.
    fn relay_on(&self, table: &str, rest: &str, rust_log: &str) -> ChildGuard {
        let config = self.dir.path().join("outbox.toml");
        std::fs::write(
            &config,
            format!(
                "[store]\nurl = \"{}\"\ntable = \"{table}\"\n\n[metrics]\nlisten = \"{}\"\n\n{rest}",
                self.pg_url, self.metrics
            ),
        )
        .unwrap();
        let log = std::fs::File::create(self.log_path()).unwrap();
        ChildGuard::spawn(
            "outbox relay",
            common::relay_command(&config)
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
    let version = env!("CARGO_PKG_VERSION");
    assert!(
        metrics.contains(&format!("outbox_build_info{{version=\"{version}\"}} 1")),
        "outbox_build_info names the version:\n{metrics}"
    );
    let series: std::collections::BTreeSet<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("outbox_"))
        .map(|l| l.split(['{', ' ']).next().unwrap())
        .map(|name| {
            ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| name.strip_suffix(suffix))
                .unwrap_or(name)
        })
        .collect();
    assert!(series.len() >= 8, "the relay's series: {series:?}");
    for name in series {
        assert!(
            metrics.contains(&format!("# HELP {name} "))
                && metrics.contains(&format!("# TYPE {name} ")),
            "{name} has HELP and TYPE lines:\n{metrics}"
        );
    }
    let exit = relay.terminate(LIMIT);
    assert!(exit.is_some_and(|e| e.success()), "clean exit: {exit:?}");
}

/// `/slo` answers 503 naming the destination once its oldest pending row passes the
/// threshold (the receiver refuses), and 200 again after the drain; `/readyz` and
/// `/healthz` stay 200 meanwhile (the objective does not gate readiness by default), and
/// the gauges follow the table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slo_fails_while_a_destination_lags_and_recovers_after_the_drain() {
    let s = setup("slo").await;
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
    wait_until(
        "/readyz and /slo answering 200 on an empty table",
        LIMIT,
        || async {
            s.get("/readyz").await.starts_with("HTTP/1.1 200")
                && s.get("/slo").await.starts_with("HTTP/1.1 200")
        },
    )
    .await;
    let mut tx = s.pool.begin().await.unwrap();
    s.outbox
        .enqueue_all(&mut tx, &[message(1), message(2), message(3)])
        .await
        .unwrap();
    tx.commit().await.unwrap();

    let failing = wait_for("/slo answering 503", LIMIT, || async {
        let response = s.get("/slo").await;
        response.starts_with("HTTP/1.1 503").then_some(response)
    })
    .await;
    assert!(
        failing.contains("destination events: oldest pending row is"),
        "the answer names the lagging destination: {failing}"
    );
    for path in ["/readyz", "/healthz"] {
        let answer = s.get(path).await;
        assert!(
            answer.starts_with("HTTP/1.1 200"),
            "{path} while lagging: {answer}"
        );
    }
    let backlog = "outbox_backlog{destination=\"events\"}";
    assert_eq!(
        sample(&s.get("/metrics").await, backlog),
        Some(3.0),
        "the backlog gauge counts the 3 rows"
    );

    refuse.store(false, Ordering::SeqCst);
    wait_until("/slo answering 200 after the drain", LIMIT, || async {
        s.get("/slo").await.starts_with("HTTP/1.1 200")
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

/// A row for a destination no route serves leaves `/readyz` at 200, shows in
/// `outbox_unrouted_rows`, and does not miss the objective even when it gates readiness;
/// a relay whose outbox table does not exist is not ready, and says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_follows_the_store_not_unrouted_rows() {
    let s = setup("ready").await;
    let mut tx = s.pool.begin().await.unwrap();
    let unrouted = NewMessage::builder("nobody", "invoice.paid")
        .json(&1)
        .build()
        .unwrap();
    s.outbox.enqueue(&mut tx, &unrouted).await.unwrap();
    tx.commit().await.unwrap();
    let hook = switchable_receiver(Arc::default()).await;
    let routes = format!(
        "[relay]\npoll_interval = \"100ms\"\ngauge_interval = \"200ms\"\n\n\
         [health]\nmax_pending_age = \"1s\"\ngates_readiness = true\n\n\
         [routes.events]\nurl = \"{hook}\"\nallow = [\"127.0.0.1/32\"]\n"
    );
    let mut relay = s.relay(&routes, "warn");
    wait_until("outbox_unrouted_rows counting the row", LIMIT, || async {
        sample(
            &s.get("/metrics").await,
            "outbox_unrouted_rows{destination=\"nobody\"}",
        ) == Some(1.0)
    })
    .await;
    // The row is older than the objective's 1 s by now, and the gauges are fresh.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    for path in ["/readyz", "/slo"] {
        let answer = s.get(path).await;
        assert!(
            answer.starts_with("HTTP/1.1 200"),
            "{path} with an unrouted row: {answer}"
        );
    }
    assert!(relay.terminate(LIMIT).is_some(), "graceful stop");

    let mut relay = s.relay_on("no_such_outbox", &routes, "error");
    // Before the first claim is answered, /readyz says so; then it names the store's error.
    let answer = wait_for(
        "/readyz answering 503 with the store's error",
        LIMIT,
        || async {
            let answer = s.get("/readyz").await;
            (answer.starts_with("HTTP/1.1 503") && answer.contains("the store fails to claim"))
                .then_some(answer)
        },
    )
    .await;
    assert!(
        answer.contains("the store fails to claim") && answer.contains("no_such_outbox"),
        "the reason names the missing table: {answer}"
    );
    assert!(
        s.get("/healthz").await.starts_with("HTTP/1.1 200"),
        "alive all the same: it keeps trying"
    );
    assert!(relay.terminate(LIMIT).is_some(), "graceful stop");
}

/// A receiver that answers 503 with `Retry-After: 20` for 20 s gets, in that window, the
/// requests already in flight when it first refused (at most `max_in_flight` per worker,
/// all within a second of the first refusal) and after them at most one request, the
/// probe at the end of the pause: the whole route pauses, not each message. Afterwards
/// every message is delivered and none is dead-lettered; the pause is logged and counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overloaded_receiver_pauses_the_whole_route() {
    const WINDOW: Duration = Duration::from_secs(20);
    let s = setup("overload").await;
    let refusing = Arc::new(AtomicBool::new(true));
    let refused: Arc<std::sync::Mutex<Vec<std::time::Instant>>> = Arc::default();
    let delivered = Arc::new(AtomicU64::new(0));
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post({
            let (refusing, refused, delivered) =
                (refusing.clone(), refused.clone(), delivered.clone());
            move || {
                let (refusing, refused, delivered) =
                    (refusing.clone(), refused.clone(), delivered.clone());
                async move {
                    if refusing.load(Ordering::SeqCst) {
                        refused.lock().unwrap().push(std::time::Instant::now());
                        (
                            axum::http::StatusCode::SERVICE_UNAVAILABLE,
                            [("retry-after", "20")],
                        )
                    } else {
                        delivered.fetch_add(1, Ordering::SeqCst);
                        (axum::http::StatusCode::NO_CONTENT, [("retry-after", "0")])
                    }
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hook = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    let (workers, max_in_flight) = (2u64, 8u64);
    let mut relay = s.relay(
        &format!(
            "[relay]\npoll_interval = \"100ms\"\nconcurrency = {workers}\n\n\
             [retry]\ninitial_delay = \"100ms\"\nmax_delay = \"1s\"\nmax_attempts = 5\n\n\
             [routes.events]\nurl = \"{hook}\"\nallow = [\"127.0.0.1/32\"]\nmax_in_flight = {max_in_flight}\n"
        ),
        "warn",
    );
    wait_until("the relay's /readyz", LIMIT, || async {
        s.get("/readyz").await.starts_with("HTTP/1.1 200")
    })
    .await;
    let messages: Vec<NewMessage> = (0..500).map(message).collect();
    let mut tx = s.pool.begin().await.unwrap();
    s.outbox.enqueue_all(&mut tx, &messages).await.unwrap();
    tx.commit().await.unwrap();
    wait_until("the first refusal", LIMIT, || async {
        !refused.lock().unwrap().is_empty()
    })
    .await;
    tokio::time::sleep(WINDOW).await;
    refusing.store(false, Ordering::SeqCst);
    let refusals = refused.lock().unwrap().clone();
    let during = refusals.len() as u64;
    let after_the_wave = refusals
        .iter()
        .filter(|t| **t > refusals[0] + Duration::from_secs(1))
        .count();

    let counts = || async {
        sqlx::query_as::<_, (i64, i64)>(&format!(
            "SELECT count(*) FILTER (WHERE status = 'published'), count(*) FILTER (WHERE status = 'dead') FROM {}",
            s.table
        ))
        .fetch_one(&s.pool)
        .await
        .unwrap()
    };
    // The receiver counts a delivery before the relay marks it: wait for the table.
    wait_until("every message delivered and marked", LIMIT * 2, || async {
        counts().await.0 == 500
    })
    .await;
    assert!(delivered.load(Ordering::SeqCst) >= 500);
    let bound = workers * max_in_flight + 1;
    assert!(
        during <= bound,
        "{during} requests while the receiver asked to wait 20 s (bound: {bound}, the first \
         wave in flight and one probe)"
    );
    assert!(
        after_the_wave <= 1,
        "{after_the_wave} requests after the first second of the refusal: one probe per Retry-After at most"
    );
    assert_eq!(counts().await, (500, 0), "all published, none dead");
    let pauses = sample(
        &s.get("/metrics").await,
        "outbox_route_pauses_total{route=\"events\"}",
    );
    assert!(
        pauses.is_some_and(|n| n >= 1.0),
        "pauses counted: {pauses:?}"
    );
    assert!(relay.terminate(LIMIT).is_some(), "graceful stop");
    assert!(s.log().contains("route paused"), "logged:\n{}", s.log());
    eprintln!(
        "overload: {during} requests in the 20 s refusal window (bound {bound}), \
         {after_the_wave} after its first second"
    );
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
