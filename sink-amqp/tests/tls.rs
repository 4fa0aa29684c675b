//! `amqps://` with a private CA and a client certificate, against the test RabbitMQ behind
//! a TLS terminator (`socat`, which verifies the client's certificate) on loopback.
#![cfg(any(feature = "tls-rustls", feature = "tls-native-tls"))]

use std::time::Duration;

use outbox_engine::NewMessage;
use outbox_sink_amqp::{AmqpSink, AmqpSinkConfig, AmqpSinkError};
use outbox_test_support::TlsTerminator;

mod common;
use common::{Broker, delivered, url};
use outbox_engine::testkit::publish;

/// The test broker's URL, as `amqps://` through `terminator`.
fn tls_url(terminator: &TlsTerminator) -> String {
    let mut tls = url::Url::parse(&url()).unwrap();
    tls.set_scheme("amqps").unwrap();
    tls.set_port(Some(terminator.port)).unwrap();
    tls.to_string()
}

/// A TLS terminator in front of the test broker.
async fn terminator() -> TlsTerminator {
    let broker = url::Url::parse(&url()).unwrap();
    TlsTerminator::start(&format!(
        "{}:{}",
        broker.host_str().unwrap(),
        broker.port().unwrap_or(5672)
    ))
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqps_with_a_private_ca_and_a_client_certificate() {
    let terminator = terminator().await;
    let broker = Broker::connect().await;
    let queue = broker.queue("tls").await;
    let config = AmqpSinkConfig::new(tls_url(&terminator))
        .routing_key(queue.clone())
        .connect_timeout(Duration::from_secs(5));

    let sink = AmqpSink::connect(
        config
            .clone()
            .tls_ca_file(terminator.file("ca.pem"))
            .tls_client_cert(terminator.file("client.pem"), terminator.file("client.key")),
    )
    .await
    .expect("connects over TLS with the private CA and the client certificate");
    let message = NewMessage::builder("tls", "over.tls")
        .json(&"secret cargo")
        .build()
        .unwrap()
        .into_message(chrono::Utc::now());
    let outcomes = publish(&sink, std::slice::from_ref(&message)).await;
    assert!(outcomes[0].is_published(), "{outcomes:?}");
    let got = broker.take(&queue).await;
    assert_eq!(got.len(), 1);
    assert_eq!(delivered(&got[0]).id, message.id.to_string());

    // The broker's certificate is not signed by a system root: refused without the CA.
    let unverified = AmqpSink::connect(
        config
            .clone()
            .tls_client_cert(terminator.file("client.pem"), terminator.file("client.key")),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(unverified, AmqpSinkError::Connect { .. }),
        "{unverified}"
    );
    // The terminator wants a client certificate: refused without one.
    let anonymous = AmqpSink::connect(config.clone().tls_ca_file(terminator.file("ca.pem")))
        .await
        .unwrap_err();
    assert!(
        matches!(anonymous, AmqpSinkError::Connect { .. }),
        "{anonymous}"
    );
    assert!(
        !anonymous.to_string().contains("guest:guest"),
        "{anonymous}"
    );
    // A missing file is named, before any connection.
    let missing = AmqpSink::connect(config.tls_ca_file(terminator.file("nope.pem")))
        .await
        .unwrap_err();
    assert!(
        matches!(
            missing,
            AmqpSinkError::TlsFile {
                setting: "tls_ca_file",
                ..
            }
        ),
        "{missing}"
    );
    broker.cleanup(&[queue], &[]).await;
}
