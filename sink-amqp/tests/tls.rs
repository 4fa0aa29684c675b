//! `amqps://` with a private CA and a client certificate, against the test RabbitMQ behind
//! a TLS terminator (`socat`, which verifies the client's certificate) on loopback.
#![cfg(any(feature = "tls-rustls", feature = "tls-native-tls"))]

use std::net::TcpListener;
use std::process::Command;
use std::time::Duration;

use outbox_engine::{NewMessage, PublishContext, Sink};
use outbox_sink_amqp::{AmqpSink, AmqpSinkConfig, AmqpSinkError};
use outbox_test_support::{ChildGuard, make_certificates, wait_until};

mod common;
use common::{Broker, delivered, url};

/// `socat` listening with TLS on a free port, forwarding to the broker's plain port.
struct Terminator {
    _child: ChildGuard,
    port: u16,
    dir: std::path::PathBuf,
}

impl Terminator {
    async fn start() -> Self {
        let dir = std::env::temp_dir().join(format!("outbox-amqp-tls-{:016x}", fastrand::u64(..)));
        std::fs::create_dir_all(&dir).unwrap();
        make_certificates(&dir);
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let broker = url::Url::parse(&url()).unwrap();
        let upstream = format!(
            "TCP:{}:{}",
            broker.host_str().unwrap(),
            broker.port().unwrap_or(5672)
        );
        let file = |name: &str| dir.join(name).display().to_string();
        let listen = format!(
            "OPENSSL-LISTEN:{port},bind=127.0.0.1,reuseaddr,fork,cert={},key={},cafile={},verify=1",
            file("server.pem"),
            file("server.key"),
            file("ca.pem")
        );
        let child = ChildGuard::spawn(
            "socat",
            Command::new("socat").args([listen.as_str(), upstream.as_str()]),
        );
        wait_until("socat to listen", Duration::from_secs(10), || async {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        })
        .await;
        Self {
            _child: child,
            port,
            dir,
        }
    }

    fn url(&self) -> String {
        let mut tls = url::Url::parse(&url()).unwrap();
        tls.set_scheme("amqps").unwrap();
        tls.set_port(Some(self.port)).unwrap();
        tls.to_string()
    }

    fn file(&self, name: &str) -> std::path::PathBuf {
        self.dir.join(name)
    }
}

impl Drop for Terminator {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqps_with_a_private_ca_and_a_client_certificate() {
    let terminator = Terminator::start().await;
    let broker = Broker::connect().await;
    let queue = broker.queue("tls").await;
    let config = AmqpSinkConfig::new(terminator.url())
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
    let outcomes = sink
        .publish(std::slice::from_ref(&message), &PublishContext::default())
        .await
        .unwrap();
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
