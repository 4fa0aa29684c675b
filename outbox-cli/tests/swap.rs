//! The same `outbox relay` binary publishes to HTTP, then to Redis Streams, with only the
//! route's configuration changed; it serves `/metrics` and `/healthz` meanwhile and stops
//! gracefully on SIGTERM.

use std::time::Duration;

use outbox::NewMessage;
use outbox::TableNames;
use outbox::postgres::PgOutbox;
use outbox_test_support::{ChildGuard, wait_for, wait_until};

mod common;

/// A stream entry as XRANGE returns it: entry id and field/value pairs.
type StreamEntry = (String, Vec<(String, Vec<u8>)>);

fn env_or(var: &str, default: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| default.to_owned())
}

const LIMIT: Duration = Duration::from_secs(30);

fn start_relay(config: &std::path::Path) -> ChildGuard {
    ChildGuard::spawn("outbox relay", &mut common::relay_command(config))
}

fn stop_gracefully(mut relay: ChildGuard) {
    let exit = relay.terminate(LIMIT);
    assert!(
        exit.is_some_and(|e| e.success()),
        "the relay exits cleanly on SIGTERM: {exit:?}"
    );
}

/// The sum of `outbox_messages_published_total` over its labels, once the counter exists.
fn published_total(metrics: &str) -> Option<f64> {
    let values: Vec<f64> = metrics
        .lines()
        .filter(|l| l.starts_with("outbox_messages_published_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_relay_binary_publishes_to_http_then_redis_by_config_only() {
    let redis_url = env_or("OUTBOX_TEST_REDIS_URL", "redis://127.0.0.1:6379/");
    let pg_url = outbox_test_support::postgres_url();
    let pool = outbox_test_support::postgres_pool().await;
    let table = format!("swap_{:016x}", fastrand::u64(..));
    let outbox = PgOutbox::with_names(pool.clone(), TableNames::default().outbox(&table).unwrap());
    outbox.migrate().await.unwrap();
    let enqueue = |n: usize| {
        let (outbox, pool) = (outbox.clone(), pool.clone());
        async move {
            let messages: Vec<NewMessage> = outbox::testkit::numbered("events", "invoice.paid", n);
            let mut tx = pool.begin().await.unwrap();
            outbox.enqueue_all(&mut tx, &messages).await.unwrap();
            tx.commit().await.unwrap();
            messages
                .iter()
                .map(|m| m.id().to_string())
                .collect::<Vec<_>>()
        }
    };

    // An HTTP receiver that records the message ids it is given.
    let (hook, got) = common::recording_receiver(0..0).await;
    let metrics_addr = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap().to_string()
    };

    let dir = std::env::temp_dir().join(format!("outbox-swap-{table}"));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("outbox.toml");
    let common = format!(
        "[store]\nurl = \"{pg_url}\"\ntable = \"{table}\"\n\n[relay]\npoll_interval = \"100ms\"\n\n[metrics]\nlisten = \"{metrics_addr}\"\n\n"
    );
    let stream = format!("swap-{table}");
    // The configuration with `route` as the settings of the `events` route; then 5
    // messages committed and the relay started. Returns the messages' ids and the relay.
    let relay_to = async |route: String| {
        std::fs::write(&config, format!("{common}[routes.events]\n{route}")).unwrap();
        let ids = enqueue(5).await;
        (ids, start_relay(&config))
    };

    // 1. HTTP.
    let (first, relay) = relay_to(format!("url = \"{hook}\"\nallow = [\"127.0.0.1/32\"]\n")).await;
    wait_until("5 HTTP deliveries", LIMIT, || async {
        got.lock().unwrap().len() >= 5
    })
    .await;
    // The receiver has every message before the relay records the completion: wait for
    // the completion, as /metrics reports it.
    wait_for("5 publications on /metrics", LIMIT, || async {
        published_total(&common::http_get(&metrics_addr, "/metrics").await).filter(|n| *n >= 5.0)
    })
    .await;
    assert!(
        common::http_get(&metrics_addr, "/healthz")
            .await
            .starts_with("HTTP/1.1 200")
    );
    // A client that connects and sends nothing is dropped, not kept forever.
    let closed = async {
        use tokio::io::AsyncReadExt;
        let mut idle = tokio::net::TcpStream::connect(&metrics_addr).await.unwrap();
        let mut byte = [0u8; 1];
        idle.read(&mut byte).await
    };
    let read = tokio::time::timeout(Duration::from_secs(20), closed)
        .await
        .expect("the metrics server closes an idle connection within 20 s");
    assert!(
        matches!(read, Ok(0) | Err(_)),
        "closed without an answer: {read:?}"
    );
    stop_gracefully(relay);
    let mut http_ids = got.lock().unwrap().clone();
    http_ids.sort();
    let mut expected = first.clone();
    expected.sort();
    assert_eq!(http_ids, expected, "HTTP received exactly the first batch");

    // 2. The same binary, only the route's settings changed: Redis Streams.
    let (second, relay) = relay_to(format!("url = \"{redis_url}\"\nstream = \"{stream}\"\n")).await;
    let client = redis::Client::open(redis_url.as_str()).unwrap();
    let mut redis = client
        .get_multiplexed_async_connection()
        .await
        .unwrap_or_else(|e| {
            panic!("Redis is not reachable at {redis_url} ({e}); run scripts/services.sh")
        });
    wait_until("5 stream entries", LIMIT, || {
        let mut redis = redis.clone();
        let stream = stream.clone();
        async move {
            let len: usize = redis::cmd("XLEN")
                .arg(&stream)
                .query_async(&mut redis)
                .await
                .unwrap_or(0);
            len >= 5
        }
    })
    .await;
    stop_gracefully(relay);
    let entries: Vec<StreamEntry> = redis::cmd("XRANGE")
        .arg(&stream)
        .arg("-")
        .arg("+")
        .query_async(&mut redis)
        .await
        .unwrap();
    let mut redis_ids: Vec<String> = entries
        .iter()
        .filter_map(|(_, fields)| {
            fields
                .iter()
                .find(|(k, _)| k == "id")
                .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
        })
        .collect();
    redis_ids.sort();
    let mut expected = second.clone();
    expected.sort();
    assert_eq!(
        redis_ids, expected,
        "Redis received exactly the second batch"
    );
    assert_eq!(got.lock().unwrap().len(), 5, "nothing more went to HTTP");

    let _: () = redis::cmd("DEL")
        .arg(&stream)
        .query_async(&mut redis)
        .await
        .unwrap();
    sqlx::query(&format!("DROP TABLE {table}, {table}_keys"))
        .execute(&pool)
        .await
        .unwrap();
    let _ = std::fs::remove_dir_all(dir);
}
