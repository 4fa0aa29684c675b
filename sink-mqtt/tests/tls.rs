//! `mqtts://` with a private CA and a client certificate, against a private mosquitto
//! whose TLS listener requires a client certificate signed by that CA.

use std::time::Duration;

use outbox_engine::testkit::{publish, sink_suite};
use outbox_sink_mqtt::{MqttSink, MqttSinkConfig, MqttSinkError};
use outbox_test_support::make_certificates;
use outbox_test_support::servers::PrivateServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqtts_with_a_private_ca_and_a_client_certificate() {
    let dir = tempfile::tempdir().unwrap();
    make_certificates(dir.path());
    let file = |name: &str| dir.path().join(name);
    let broker = PrivateServer::mosquitto(
        dir.path(),
        &format!(
            "cafile {}\ncertfile {}\nkeyfile {}\nrequire_certificate true",
            file("ca.pem").display(),
            file("server.pem").display(),
            file("server.key").display()
        ),
    );
    let url = broker.url.replace("mqtt://", "mqtts://");
    let config = MqttSinkConfig::new(&url)
        .topic("tls/{event_type}")
        .connect_timeout(Duration::from_secs(5));

    let sink = MqttSink::connect(
        config
            .clone()
            .tls_ca_file(file("ca.pem"))
            .tls_client_cert(file("client.pem"), file("client.key")),
    )
    .await
    .expect("connects over TLS with the private CA and the client certificate");
    let outcomes = publish(&sink, &sink_suite::messages("tls", 3)).await;
    assert!(outcomes.iter().all(|o| o.is_published()), "{outcomes:?}");

    // Without the client certificate the broker refuses the handshake.
    let refused = MqttSink::connect(config.clone().tls_ca_file(file("ca.pem"))).await;
    assert!(
        matches!(refused, Err(MqttSinkError::Connect { .. })),
        "{refused:?}"
    );
    // Against the system roots, the private CA's certificate is not trusted.
    let untrusted = MqttSink::connect(
        config
            .clone()
            .tls_client_cert(file("client.pem"), file("client.key")),
    )
    .await;
    assert!(
        matches!(untrusted, Err(MqttSinkError::Connect { .. })),
        "{untrusted:?}"
    );
    // A CA file that holds no certificate is named at start-up.
    std::fs::write(file("empty.pem"), "").unwrap();
    let empty = MqttSink::connect(config.tls_ca_file(file("empty.pem"))).await;
    assert!(
        matches!(
            empty,
            Err(MqttSinkError::TlsFile {
                setting: "tls_ca_file",
                ..
            })
        ),
        "{empty:?}"
    );
}
