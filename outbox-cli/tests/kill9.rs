//! `outbox relay` killed with SIGKILL again and again mid-batch, in front of a webhook
//! receiver that answers each request after a short random delay, and in front of
//! RabbitMQ, Kafka, SQS, NATS JetStream and MQTT: nothing committed is lost, and the re-sends
//! (duplicates) stay bounded by what was in flight at each kill; in front of JetStream,
//! the stream's duplicate window takes the re-sends and its consumer sees each message
//! once. Prints `kill9 <sink>: kills=… committed=… deliveries=… duplicates=… lost=…`.

use std::collections::HashSet;
use std::time::Duration;

use outbox::NewMessage;
use outbox::TableNames;
use outbox::postgres::PgOutbox;
use outbox_test_support::{ChildGuard, wait_until};

mod common;

const KILLS: usize = 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_loses_nothing_and_resends_only_what_was_in_flight() {
    // The receiver: records every delivery on arrival, answers after 5-40 ms.
    let (hook, got) = common::recording_receiver(5..40).await;
    let route = format!("url = \"{hook}\"\nallow = [\"127.0.0.1/32\"]\n");
    kill_loop("http", &route, got, 500, None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_in_front_of_amqp_loses_nothing() {
    let (url, queue, got) = common::amqp_consumer().await;
    let route = format!("url = \"{url}\"\nrouting_key = \"{queue}\"\n");
    // RabbitMQ takes messages fast: more of them per cycle, so that each kill lands mid-batch.
    kill_loop("amqp", &route, got, 3_000, None).await;
    common::delete_amqp_queue(&url, &queue).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_in_front_of_kafka_loses_nothing() {
    let (brokers, topic, got) = common::kafka_consumer().await;
    let route = format!("url = \"kafka://{brokers}/{topic}\"\n");
    kill_loop("kafka", &route, got, 5_000, None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_in_front_of_sqs_loses_nothing() {
    let (_moto, queue_url, got) = common::sqs_consumer().await;
    // Region and credentials come from the relay's environment (the standard AWS chain;
    // `kill_loop` sets AWS_REGION, AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY).
    let route =
        format!("url = \"sqs+{queue_url}\"\nrate_limit = {{ per_second = 25, burst = 10 }}\n");
    // moto scans its whole queue for every message sent and received, so once messages
    // arrive faster than its consumer takes them out it slows down until it stops
    // answering (on a slow day it took fewer than 60 a second). The route's rate limit keeps
    // the queue short; 50 messages per cycle still leave each kill mid-batch.
    kill_loop("sqs", &route, got, 50, None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_in_front_of_nats_loses_nothing_and_jetstream_stores_each_message_once() {
    let url = outbox_test_support::server_url("OUTBOX_TEST_NATS_URL", "nats://127.0.0.1:4222");
    let (stream, got) = common::nats_consumer(&url).await;
    let route = format!("url = \"{url}\"\nsubject = \"{stream}.events\"\n");
    let run = kill_loop(
        "nats",
        &route,
        got,
        3_000,
        Some("outbox_nats_duplicates_total"),
    )
    .await;
    assert_eq!(
        run.duplicates, 0,
        "the duplicate window kept every re-send out of the stream"
    );
    assert!(
        run.reported > 0.0,
        "the relays' PubAcks reported re-sends as duplicates (outbox_nats_duplicates_total)"
    );
    common::delete_nats_stream(&url, &stream).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_in_front_of_mqtt_loses_nothing() {
    // A private broker: configured to queue whatever the test's subscriber has not taken yet,
    // where mosquitto's default drops QoS 1 messages beyond 1,000 after acknowledging them.
    let dir = tempfile::tempdir().unwrap();
    let broker = outbox_test_support::servers::PrivateServer::mosquitto(dir.path(), "");
    let (topic, got) = common::mqtt_consumer(&broker.url).await;
    let route = format!("url = \"{}\"\ntopic = \"{topic}/events\"\n", broker.url);
    kill_loop("mqtt", &route, got, 3_000, None).await;
}

/// What a kill loop saw.
struct KillRun {
    /// Deliveries beyond the first of each message.
    duplicates: usize,
    /// The relays' `resends_metric`, summed over every relay process.
    reported: f64,
}

/// Runs the kill loop with `route` (the TOML of route `hooks`) while `got` records the
/// ids the receiver gets; before each start of the relay, `per_cycle` more messages are
/// committed, so every kill finds work in flight. With `resends_metric`, each relay serves
/// `/metrics`, and the counter of that name is read just before each relay's end.
async fn kill_loop(
    sink: &str,
    route: &str,
    got: common::Received,
    per_cycle: usize,
    resends_metric: Option<&str>,
) -> KillRun {
    let pg_url = outbox_test_support::postgres_url();
    let pool = outbox_test_support::postgres_pool().await;
    let table = format!("kill9_{:016x}", fastrand::u64(..));
    let outbox = PgOutbox::with_names(pool.clone(), TableNames::default().outbox(&table).unwrap());
    outbox.migrate().await.unwrap();
    let mut committed: HashSet<String> = HashSet::new();
    let mut commit_more = async |n: usize| {
        let messages: Vec<NewMessage> = outbox::testkit::numbered("hooks", "order.paid", n);
        for chunk in messages.chunks(1_000) {
            let mut tx = pool.begin().await.unwrap();
            outbox.enqueue_all(&mut tx, chunk).await.unwrap();
            tx.commit().await.unwrap();
        }
        committed.extend(messages.iter().map(|m| m.id().to_string()));
    };

    let dir = std::env::temp_dir().join(format!("outbox-{table}"));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("outbox.toml");
    let metrics = resends_metric.map(|_| {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap().to_string()
    });
    let metrics_table = metrics
        .as_ref()
        .map(|addr| format!("[metrics]\nlisten = \"{addr}\"\n\n"))
        .unwrap_or_default();
    std::fs::write(
        &config,
        format!(
            "[store]\nurl = \"{pg_url}\"\ntable = \"{table}\"\n\n[relay]\nbatch_size = 100\nconcurrency = 2\nlease = \"2s\"\npoll_interval = \"100ms\"\n\n\
             {metrics_table}[routes.hooks]\n{route}"
        ),
    )
    .unwrap();
    // The running relay's `resends_metric` (0 when it has none yet or does not answer).
    let reported_now = || {
        let metrics = metrics.clone();
        async move {
            let (Some(addr), Some(name)) = (metrics, resends_metric) else {
                return 0.0;
            };
            common::http_get(&addr, "/metrics")
                .await
                .lines()
                .find_map(|line| line.strip_prefix(name)?.trim().parse::<f64>().ok())
                .unwrap_or(0.0)
        }
    };
    let mut reported = 0.0;
    let start_relay = || {
        ChildGuard::spawn(
            "outbox relay",
            common::relay_command(&config)
                .env("RUST_LOG", "error")
                .env("AWS_REGION", "us-east-1")
                .env("AWS_ACCESS_KEY_ID", "test")
                .env("AWS_SECRET_ACCESS_KEY", "test"),
        )
    };
    // Rows leased by the relay process `pid` (its owner name is `relay-<pid>-…`).
    let leased_by = |pid: u32| {
        let pool = pool.clone();
        let table = table.clone();
        async move {
            sqlx::query_scalar::<_, i64>(&format!(
                "SELECT count(*) FROM {table} WHERE status = 'leased' AND lease_owner LIKE $1"
            ))
            .bind(format!("relay-{pid}-%"))
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };

    let published = || {
        let pool = pool.clone();
        let table = table.clone();
        async move {
            sqlx::query_scalar::<_, i64>(&format!(
                "SELECT count(*) FROM {table} WHERE status = 'published'"
            ))
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };

    let mut kills = 0;
    let mut leased_at_kills = 0;
    while kills < KILLS {
        commit_more(per_cycle).await;
        let before = published().await;
        let mut relay = start_relay();
        let pid = relay.id();
        // Kill only once this relay published something and holds leases: mid-batch. (The
        // table, not the receiver, says what was published: a receiver may lag behind.)
        wait_until(
            "the relay to publish and hold leases",
            Duration::from_secs(30),
            || async { published().await > before + 20 && leased_by(pid).await > 0 },
        )
        .await;
        tokio::time::sleep(Duration::from_millis(fastrand::u64(0..300))).await;
        reported += reported_now().await;
        relay.kill();
        kills += 1;
        leased_at_kills += leased_by(pid).await;
    }
    let count = committed.len();
    let mut relay = start_relay();
    wait_until(
        "every committed message published",
        Duration::from_secs(120),
        || async { published().await == count as i64 },
    )
    .await;
    reported += reported_now().await;
    assert!(
        relay.terminate(Duration::from_secs(20)).is_some(),
        "graceful stop"
    );

    // The test's consumers may trail the relay (the AMQP one fetches one message per
    // round trip), so they get a while to catch up; if they never do, the counts below
    // say what is missing.
    let _ = tokio::time::timeout(Duration::from_secs(120), async {
        while got.lock().unwrap().iter().collect::<HashSet<_>>().len() < count {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    let deliveries = got.lock().unwrap().clone();
    let distinct: HashSet<String> = deliveries.iter().cloned().collect();
    let lost = committed.difference(&distinct).count();
    let unexpected = distinct.difference(&committed).count();
    let duplicates = deliveries.len() - distinct.len();
    eprintln!(
        "kill9 {sink}: kills={kills} committed={count} deliveries={} duplicates={duplicates} \
         leased_at_kills={leased_at_kills} lost={lost} unexpected={unexpected} \
         resends_reported={reported}",
        deliveries.len()
    );
    assert!(
        kills == KILLS,
        "the relay was killed mid-batch {KILLS} times ({kills})"
    );
    assert_eq!(lost, 0, "every committed message was delivered");
    assert_eq!(
        unexpected, 0,
        "nothing was delivered that was not committed"
    );
    assert!(
        duplicates as i64 <= leased_at_kills,
        "re-sends ({duplicates}) are bounded by the rows leased at the kills ({leased_at_kills})"
    );
    sqlx::query(&format!("DROP TABLE {table}, {table}_keys"))
        .execute(&pool)
        .await
        .unwrap();
    let _ = std::fs::remove_dir_all(dir);
    KillRun {
        duplicates,
        reported,
    }
}
