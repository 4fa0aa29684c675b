//! `nats+tls://` with a private CA and a client certificate, and an NKey login, against
//! private `nats-server`s.

use std::time::Duration;

use outbox_engine::testkit::{publish, sink_suite};
use outbox_sink_nats::{NatsSink, NatsSinkConfig, NatsSinkError};
use outbox_test_support::make_certificates;
use outbox_test_support::servers::PrivateServer;

mod common;
use common::Server;

/// A stream binding `EVENTS.>` on the server at `url`, made through `client`.
async fn stream(client: outbox_sink_nats::client::Client) {
    Server::of(client)
        .jetstream
        .create_stream(outbox_sink_nats::client::jetstream::stream::Config {
            name: "EVENTS".to_owned(),
            subjects: vec!["EVENTS.>".to_owned()],
            ..Default::default()
        })
        .await
        .expect("create the stream");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_tls_with_a_private_ca_and_a_client_certificate() {
    let dir = tempfile::tempdir().unwrap();
    make_certificates(dir.path());
    let file = |name: &str| dir.path().join(name);
    let server = PrivateServer::nats(
        dir.path(),
        &format!(
            "tls {{ cert_file: {:?}, key_file: {:?}, ca_file: {:?}, verify: true }}",
            file("server.pem").display().to_string(),
            file("server.key").display().to_string(),
            file("ca.pem").display().to_string()
        ),
    );
    let url = server.url.replace("nats://", "nats+tls://");
    let config = NatsSinkConfig::new(&url)
        .subject("EVENTS.{event_type}")
        .connect_timeout(Duration::from_secs(5));
    let sink = NatsSink::connect(
        config
            .clone()
            .tls_ca_file(file("ca.pem"))
            .tls_client_cert(file("client.pem"), file("client.key")),
    )
    .await
    .expect("connects over TLS with the private CA and the client certificate");

    // The sink connected with no process-wide provider installed (this test's rustls has
    // two, so none could be chosen); the test's own client needs one.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let admin = outbox_sink_nats::client::ConnectOptions::new()
        .require_tls(true)
        .add_root_certificates(file("ca.pem"))
        .add_client_certificate(file("client.pem"), file("client.key"))
        .connect(server.url.replace("nats://", "tls://"))
        .await
        .expect("the test's own client connects over TLS");
    stream(admin).await;
    let outcomes = publish(&sink, &sink_suite::messages("tls", 3)).await;
    assert!(outcomes.iter().all(|o| o.is_published()), "{outcomes:?}");

    let refused = NatsSink::connect(config.clone().tls_ca_file(file("ca.pem"))).await;
    assert!(
        matches!(refused, Err(NatsSinkError::Connect { .. })),
        "without the client certificate: {refused:?}"
    );
    let missing = NatsSink::connect(config.tls_ca_file(file("nowhere.pem"))).await;
    assert!(
        matches!(
            missing,
            Err(NatsSinkError::File {
                setting: "tls_ca_file",
                ..
            })
        ),
        "{missing:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_nkey_seed_file_logs_in_and_its_seed_is_never_shown() {
    let user = nkeys::KeyPair::new_user();
    let seed = user.seed().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let server = PrivateServer::nats(
        dir.path(),
        &format!(
            "authorization {{ users = [ {{ nkey: {} }} ] }}",
            user.public_key()
        ),
    );
    let admin = outbox_sink_nats::client::ConnectOptions::with_nkey(seed.clone())
        .connect(&server.url)
        .await
        .expect("the test's own client logs in with the NKey");
    stream(admin).await;

    let seed_file = dir.path().join("relay.nk");
    std::fs::write(&seed_file, format!("{seed}\n")).unwrap();
    let config = NatsSinkConfig::new(&server.url).subject("EVENTS.orders");
    let sink = NatsSink::connect(config.clone().nkey_seed_file(&seed_file))
        .await
        .expect("logs in with the seed file");
    assert!(!format!("{sink:?}").contains(&seed), "Debug shows no seed");
    let outcomes = publish(&sink, &sink_suite::messages("nkey", 2)).await;
    assert!(outcomes.iter().all(|o| o.is_published()), "{outcomes:?}");

    // Another user's seed is refused at start-up, without being shown.
    let other = nkeys::KeyPair::new_user().seed().unwrap();
    std::fs::write(&seed_file, &other).unwrap();
    let refused = NatsSink::connect(config.nkey_seed_file(&seed_file))
        .await
        .unwrap_err();
    assert!(
        matches!(refused, NatsSinkError::Connect { .. }),
        "{refused}"
    );
    assert!(
        !refused.is_retryable(),
        "a refused login needs a change: {refused}"
    );
    assert!(!refused.to_string().contains(&other), "{refused}");
}
