//! `outbox relay` publishing to an `amqps://` route: the CLI's TLS feature, a private CA
//! and a client certificate from the config file, through a TLS terminator that verifies
//! clients, in front of the test RabbitMQ.

use std::collections::HashSet;
use std::time::Duration;

use outbox::NewMessage;
use outbox::TableNames;
use outbox::postgres::PgOutbox;
use outbox_test_support::{ChildGuard, TlsTerminator, wait_until};

mod common;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_binary_publishes_to_an_amqps_route() {
    let pg_url = outbox_test_support::postgres_url();
    let pool = outbox_test_support::postgres_pool().await;
    let table = format!("tls_{:016x}", fastrand::u64(..));
    let outbox = PgOutbox::with_names(pool.clone(), TableNames::default().outbox(&table).unwrap());
    outbox.migrate().await.unwrap();
    let messages: Vec<NewMessage> = outbox::testkit::numbered("ledger", "invoice.paid", 50);
    let mut tx = pool.begin().await.unwrap();
    outbox.enqueue_all(&mut tx, &messages).await.unwrap();
    tx.commit().await.unwrap();

    let (url, queue, got) = common::amqp_consumer().await;
    let broker = url::Url::parse(&url).unwrap();
    let terminator = TlsTerminator::start(&format!(
        "{}:{}",
        broker.host_str().unwrap(),
        broker.port().unwrap_or(5672)
    ))
    .await;
    let mut tls = broker.clone();
    tls.set_scheme("amqps").unwrap();
    tls.set_port(Some(terminator.port)).unwrap();

    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("outbox.toml");
    let path = |name: &str| terminator.file(name).display().to_string();
    std::fs::write(
        &config,
        format!(
            "[store]\nurl = \"{pg_url}\"\ntable = \"{table}\"\n\n[relay]\npoll_interval = \"100ms\"\n\n\
             [routes.ledger]\nurl = \"{tls}\"\nrouting_key = \"{queue}\"\n\
             tls_ca_file = \"{}\"\ntls_cert_file = \"{}\"\ntls_key_file = \"{}\"\n",
            path("ca.pem"),
            path("client.pem"),
            path("client.key"),
        ),
    )
    .unwrap();
    let mut relay = ChildGuard::spawn(
        "outbox relay",
        common::relay_command(&config).env("RUST_LOG", "error"),
    );
    wait_until(
        "every message delivered over amqps://",
        Duration::from_secs(60),
        || async { got.lock().unwrap().len() >= messages.len() },
    )
    .await;
    assert!(
        relay.terminate(Duration::from_secs(20)).is_some(),
        "graceful stop"
    );
    let delivered: HashSet<String> = got.lock().unwrap().iter().cloned().collect();
    let committed: HashSet<String> = messages.iter().map(|m| m.id().to_string()).collect();
    assert_eq!(delivered, committed);
    common::delete_amqp_queue(&url, &queue).await;
    sqlx::query(&format!("DROP TABLE {table}, {table}_keys"))
        .execute(&pool)
        .await
        .unwrap();
}
