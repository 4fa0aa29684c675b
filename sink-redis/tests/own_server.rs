//! The Redis sink against `redis-server` processes of the test's own (never the shared
//! one): killed with SIGKILL in the middle of a relay run and started again on the same
//! port; filled to `maxmemory` under `noeviction`; a replica that goes away under `WAIT`;
//! passwords and ACLs; TLS (with a `tls-*` feature).

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use chrono::Utc;
use outbox_engine::{
    FailureClass, MemoryStore, MessageId, NewMessage, Outcome, Relay, RetryPolicy, Status,
    StoreStats,
};
use outbox_sink_redis::client as redis;
use outbox_sink_redis::{RedisSink, RedisSinkConfig};

mod common;
use common::{OwnRedis, eventually, reader, server_info, xrange};
use outbox_engine::testkit::publish;

const MESSAGES: usize = 1_500;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_mid_run_and_restarted_loses_nothing() {
    let mut server = OwnRedis::start(&[]).await;
    let stream = "events";
    let sink = RedisSink::connect(
        RedisSinkConfig::new(server.url())
            .stream(stream)
            .connect_timeout(Duration::from_millis(300))
            .response_timeout(Duration::from_millis(800)),
    )
    .await
    .expect("sink on the private server");

    let store = MemoryStore::new();
    let relay = Relay::builder(store.clone())
        .route("events", sink)
        .batch_size(25)
        .concurrency(2)
        .lease(Duration::from_secs(5))
        .publish_timeout(Duration::from_secs(2))
        .poll_interval(Duration::from_millis(20))
        .wakeup(store.wakeup())
        .retry(
            RetryPolicy::exponential(Duration::from_millis(20), Duration::from_millis(300))
                .max_attempts(10_000),
        )
        .build()
        .unwrap();
    let running = relay.spawn();

    // A producer enqueues steadily for about three seconds.
    let producer_store = store.clone();
    let producer = tokio::spawn(async move {
        let mut ids = Vec::with_capacity(MESSAGES);
        for n in 0..MESSAGES {
            let message = NewMessage::builder("events", "tick")
                .json(&serde_json::json!({ "n": n }))
                .build()
                .unwrap();
            ids.push(producer_store.enqueue(message).unwrap());
            if n % 5 == 0 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        ids
    });

    // Kill Redis once the relay is demonstrably publishing, keep it down, start it again.
    let published = |store: &MemoryStore| store.ids_with_status(Status::Published).len();
    eventually(
        Duration::from_secs(20),
        "the relay publishes before the kill",
        || async { published(&store) >= 100 },
    )
    .await;
    server.kill();
    // A reply that arrived just before the kill may still be completing; after that,
    // nothing can become published until Redis is back. Take the count once it held
    // for 300 ms.
    let settling = Instant::now();
    let mut last = (Instant::now(), published(&store));
    let at_kill = loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = published(&store);
        if now != last.1 {
            last = (Instant::now(), now);
        } else if last.0.elapsed() >= Duration::from_millis(300) {
            break now;
        }
        assert!(
            settling.elapsed() < Duration::from_secs(5),
            "timed out after 5s waiting for the published count to settle after the kill"
        );
    };
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let while_down = published(&store);
    assert_eq!(
        while_down, at_kill,
        "nothing can be acknowledged while Redis is down"
    );
    server.restart().await;

    let enqueued: Vec<MessageId> = producer.await.unwrap();
    eventually(
        Duration::from_secs(60),
        "every message published",
        || async {
            let total = store.stats().await.unwrap().total();
            total.published == MESSAGES as u64
        },
    )
    .await;
    running.stop().await.unwrap();

    let total = store.stats().await.unwrap().total();
    assert_eq!(total.dead, 0, "{total:?}");
    let retried = store.rows().iter().filter(|r| r.row.attempts > 1).count();
    assert!(
        retried > 0,
        "the outage must have failed and retried some publishes"
    );

    // Count Jepsen-style against what Redis holds after the restart.
    let mut conn = reader(&server.url()).await;
    let entries = xrange(&mut conn, stream).await;
    let mut counts: HashMap<String, usize> = HashMap::new();
    for entry in &entries {
        *counts.entry(entry.text("id").unwrap()).or_default() += 1;
    }
    let expected: HashSet<String> = enqueued.iter().map(ToString::to_string).collect();
    let lost = expected
        .iter()
        .filter(|id| !counts.contains_key(*id))
        .count();
    let unexpected = counts.keys().filter(|id| !expected.contains(*id)).count();
    let duplicated = counts.values().filter(|n| **n > 1).count();
    eprintln!(
        "restart: enqueued {} received {} lost {lost} unexpected {unexpected} duplicated {duplicated} retried {retried} published at kill {at_kill}",
        expected.len(),
        entries.len()
    );
    assert_eq!(lost, 0, "lost messages");
    assert_eq!(unexpected, 0, "unexpected messages");
    assert_eq!(
        duplicated, 0,
        "the dedupe window (kept in the AOF) suppresses re-sends"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_redis_fails_retryably_and_recovers_when_memory_frees() {
    let server = OwnRedis::start(&["--maxmemory-policy", "noeviction"]).await;
    let mut conn = reader(&server.url()).await;
    let info: String = redis::cmd("INFO")
        .arg("memory")
        .query_async(&mut conn)
        .await
        .unwrap();
    let used: u64 = info
        .lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(used + 512 * 1024)
        .query_async(&mut conn)
        .await
        .unwrap();

    let sink = RedisSink::connect(RedisSinkConfig::new(server.url()).stream("full"))
        .await
        .unwrap();
    let mut published = Vec::new();
    let mut refused = Vec::new();
    let started = Instant::now();
    while refused.is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "Redis never ran out of memory"
        );
        let batch: Vec<_> = (0..10)
            .map(|_| {
                NewMessage::builder("events", "big")
                    .bytes(vec![0xab; 16 * 1024], "application/octet-stream")
                    .build()
                    .unwrap()
                    .into_message(Utc::now())
            })
            .collect();
        let outcomes = publish(&sink, &batch).await;
        for (message, outcome) in batch.into_iter().zip(outcomes) {
            match outcome {
                Outcome::Published { .. } => published.push(message),
                Outcome::Failed(failure) => {
                    assert!(failure.retryable, "OOM is retryable: {failure}");
                    assert_eq!(failure.class, FailureClass::Unavailable, "{failure}");
                    assert!(failure.message.starts_with("OOM"), "{failure}");
                    assert_eq!(failure.retry_after, Some(Duration::from_secs(1)));
                    refused.push(message);
                }
            }
        }
    }

    // Memory frees up (a consumer trimmed, an operator raised the limit): the retry goes
    // through, and nothing refused was half-written.
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(0)
        .query_async(&mut conn)
        .await
        .unwrap();
    let outcomes = publish(&sink, &refused).await;
    assert!(outcomes.iter().all(Outcome::is_published), "{outcomes:?}");
    let entries = xrange(&mut conn, "full").await;
    assert_eq!(entries.len(), published.len() + refused.len());
    let ids: HashSet<String> = entries.iter().map(|e| e.text("id").unwrap()).collect();
    assert_eq!(ids.len(), entries.len(), "no message appended twice");
    for m in published.iter().chain(&refused) {
        assert!(ids.contains(&m.id.to_string()));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_that_is_not_met_fails_retryably_and_the_resend_is_not_duplicated() {
    let primary = OwnRedis::start(&["--repl-diskless-sync-delay", "0"]).await;
    let replica_of = ["--replicaof", "127.0.0.1", &primary.port.to_string()].map(str::to_owned);
    let mut replica =
        OwnRedis::start(&replica_of.iter().map(String::as_str).collect::<Vec<_>>()).await;
    let mut conn = reader(&primary.url()).await;
    let synced = |url: String| async move {
        eventually(Duration::from_secs(20), "the replica is in sync", || {
            let url = url.clone();
            async move {
                let mut c = reader(&url).await;
                server_info(&mut c, "replication", "master_link_status").await == "up"
            }
        })
        .await;
    };
    synced(replica.url()).await;

    // A sink pointed at the replica refuses to start.
    let err = RedisSink::connect(RedisSinkConfig::new(replica.url()).stream("events"))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("replica"), "{err}");

    let sink = RedisSink::connect(
        RedisSinkConfig::new(primary.url())
            .stream("events")
            .durability(outbox_sink_redis::Durability::wait(
                1,
                Duration::from_millis(1_500),
            )),
    )
    .await
    .expect("one replica is connected");
    let batch: Vec<_> = outbox_engine::testkit::numbered("events", "e", 5)
        .into_iter()
        .map(|m| m.into_message(Utc::now()))
        .collect();
    // A starved test machine can miss even a generous wait; a re-send is then a dedupe
    // hit, so retrying here is what the relay would do.
    let mut acknowledged = false;
    for _ in 0..5 {
        let outcomes = publish(&sink, &batch[..2]).await;
        if outcomes.iter().all(Outcome::is_published) {
            acknowledged = true;
            break;
        }
    }
    assert!(acknowledged, "the in-sync replica acknowledges");
    assert_eq!(xrange(&mut conn, "events").await.len(), 2);

    // The replica goes away: the appends happen, the acknowledgement does not.
    replica.kill();
    eventually(Duration::from_secs(20), "the primary notices", || {
        let mut conn = conn.clone();
        async move { server_info(&mut conn, "replication", "connected_slaves").await == "0" }
    })
    .await;
    let outcomes = publish(&sink, &batch[2..]).await;
    for outcome in &outcomes {
        match outcome {
            Outcome::Failed(f) => {
                assert!(f.retryable, "{f}");
                assert_eq!(f.class, FailureClass::Unavailable);
                assert!(f.message.contains("WAIT 1 1500"), "{f}");
                assert!(f.message.contains("0 of 1"), "{f}");
            }
            other => panic!("published without the replica's acknowledgement: {other:?}"),
        }
    }
    assert_eq!(
        xrange(&mut conn, "events").await.len(),
        5,
        "appended, unacknowledged"
    );

    // The replica returns; the relay's re-send is acknowledged and appends nothing new.
    replica.restart().await;
    synced(replica.url()).await;
    let mut outcomes = Vec::new();
    for _ in 0..5 {
        outcomes = publish(&sink, &batch[2..]).await;
        if outcomes.iter().all(Outcome::is_published) {
            break;
        }
    }
    assert!(
        outcomes.iter().all(Outcome::is_published),
        "the returned replica acknowledges the re-send: {outcomes:?}"
    );
    let entries = xrange(&mut conn, "events").await;
    assert_eq!(entries.len(), 5, "no duplicates after the re-send");
    let mut replica_conn = reader(&replica.url()).await;
    eventually(
        Duration::from_secs(20),
        "the replica has every entry",
        || {
            let mut c = replica_conn.clone();
            async move { xrange(&mut c, "events").await.len() == 5 }
        },
    )
    .await;
    let _ = &mut replica_conn;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwords_and_acl_permissions() {
    let server = OwnRedis::start(&["--requirepass", "s3cret-pw"]).await;
    let url_with = |userinfo: &str| format!("redis://{userinfo}@127.0.0.1:{}/", server.port);

    // A wrong password stops the route at start, without showing the password.
    let err = RedisSink::connect(RedisSinkConfig::new(url_with(":wrong-pw")).stream("s"))
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(err, outbox_sink_redis::RedisSinkError::Connect { .. }),
        "{err:?}"
    );
    assert!(!text.contains("wrong-pw") && text.contains("***"), "{text}");

    let admin = RedisSink::connect(RedisSinkConfig::new(url_with(":s3cret-pw")).stream("s"))
        .await
        .expect("the right password");
    let message = || {
        NewMessage::builder("events", "e")
            .json(&1)
            .build()
            .unwrap()
            .into_message(Utc::now())
    };
    assert!(publish(&admin, &[message()]).await[0].is_published());

    // An ACL user that may not append: every message fails retryably (route-wide, an
    // operator's fix), never dead-lettered and never published.
    let mut conn = reader(&url_with(":s3cret-pw")).await;
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("relay")
        .arg("on")
        .arg(">relay-pw")
        .arg("~*")
        .arg("+@all")
        .arg("-xadd")
        .query_async(&mut conn)
        .await
        .unwrap();
    for dedupe in [Some(Duration::from_secs(60)), None] {
        let limited = RedisSink::connect(
            RedisSinkConfig::new(url_with("relay:relay-pw"))
                .stream("s")
                .dedupe_window(dedupe),
        )
        .await
        .expect("the user may connect");
        let outcomes = publish(&limited, &[message(), message()]).await;
        for outcome in outcomes {
            match outcome {
                Outcome::Failed(f) => {
                    assert!(f.retryable, "{f}");
                    assert_eq!(f.class, FailureClass::Config, "{f}");
                    // NOPERM, or inside the dedupe script Redis 7's ERR form of it.
                    assert!(
                        f.message.starts_with("NOPERM") || f.message.contains("can't run"),
                        "{f}"
                    );
                }
                other => panic!("published without permission: {other:?}"),
            }
        }
    }
    assert_eq!(xrange(&mut conn, "s").await.len(), 1);
}

#[cfg(any(feature = "tls-rustls", feature = "tls-native-tls"))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_a_private_ca_and_a_client_certificate() {
    use outbox_sink_redis::RedisSinkError;
    use redis::{ClientTlsConfig, TlsCertificates};

    #[cfg(feature = "tls-rustls")]
    let _ = rustls::crypto::ring::default_provider().install_default();
    let server = OwnRedis::start_tls(&[]).await;
    let file = |name: &str| server.dir.join(name);
    let config = RedisSinkConfig::new(server.url())
        .stream("tls")
        .connect_timeout(Duration::from_secs(2))
        .tls_ca_file(file("ca.pem"))
        .tls_client_cert(file("client.pem"), file("client.key"));
    let sink = RedisSink::connect(config.clone())
        .await
        .expect("a TLS route with the CA and a client certificate starts");
    let message = NewMessage::builder("events", "e")
        .bytes(vec![0, 1, 2, 0xff], "application/octet-stream")
        .build()
        .unwrap()
        .into_message(Utc::now());
    let outcomes = publish(&sink, std::slice::from_ref(&message)).await;
    assert!(outcomes[0].is_published(), "{outcomes:?}");

    let certificates = TlsCertificates {
        client_tls: Some(ClientTlsConfig {
            client_cert: std::fs::read(file("client.pem")).unwrap(),
            client_key: std::fs::read(file("client.key")).unwrap(),
        }),
        root_cert: Some(std::fs::read(file("ca.pem")).unwrap()),
    };
    let client = redis::Client::build_with_tls(server.url(), certificates).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let entries = xrange(&mut conn, "tls").await;
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].get("payload"), Some(&message.payload[..]));

    // No client certificate: the server refuses the handshake.
    let mut no_cert = config.clone();
    no_cert.tls_cert_file = None;
    no_cert.tls_key_file = None;
    let err = RedisSink::connect(no_cert).await.unwrap_err();
    assert!(matches!(err, RedisSinkError::Connect { .. }), "{err:?}");
    // The system roots do not know the private CA.
    let mut no_ca = config.clone();
    no_ca.tls_ca_file = None;
    let err = RedisSink::connect(no_ca).await.unwrap_err();
    assert!(matches!(err, RedisSinkError::Connect { .. }), "{err:?}");
    // A CA file that is not there.
    let err = RedisSink::connect(config.tls_ca_file(file("missing.pem")))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            RedisSinkError::InvalidSetting {
                setting: "tls_ca_file",
                ..
            }
        ),
        "{err:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_server_fails_what_was_sent_retryably_and_keeps_permanent_refusals() {
    let mut server = OwnRedis::start(&[]).await;
    let sink = RedisSink::connect(
        RedisSinkConfig::new(server.url())
            .stream("s")
            .max_payload_bytes(100)
            .connect_timeout(Duration::from_millis(200)),
    )
    .await
    .unwrap();
    server.kill();
    let message = |size: usize| {
        NewMessage::builder("events", "e")
            .bytes(vec![b'x'; size], "text/plain")
            .build()
            .unwrap()
            .into_message(Utc::now())
    };
    let outcomes = publish(&sink, &[message(1_000), message(10)]).await;
    match &outcomes[..] {
        [Outcome::Failed(large), Outcome::Failed(down)] => {
            assert_eq!(
                (large.class, large.retryable),
                (FailureClass::TooLarge, false)
            );
            assert!(down.retryable, "{down}");
            assert!(
                matches!(down.class, FailureClass::Connection | FailureClass::Timeout),
                "{down}"
            );
        }
        other => panic!("{other:?}"),
    }
    // And it comes back by itself once the server does.
    server.restart().await;
    let mut published = false;
    for _ in 0..50 {
        if publish(&sink, &[message(10)]).await[0].is_published() {
            published = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(published, "the sink reconnects after a restart");
}
