//! Shared test helpers: where NATS is, a client of its own for streams and reading back
//! (independently of the sink's code), and a sink that fails loudly without a server.
#![allow(dead_code, unreachable_pub)]

use std::time::Duration;

use outbox_engine::testkit::Delivered;
use outbox_sink_nats::client::jetstream::{self, stream};
use outbox_sink_nats::{NatsSink, NatsSinkConfig, NatsSinkError, read_parts};
use outbox_test_support::{no_server, server_url};

pub const URL_VAR: &str = "OUTBOX_TEST_NATS_URL";
pub const DEFAULT_URL: &str = "nats://127.0.0.1:4222";

/// The test server, from `OUTBOX_TEST_NATS_URL` or the default `scripts/services.sh` gives.
pub fn url() -> String {
    server_url(URL_VAR, DEFAULT_URL)
}

/// A name no other test uses, fit for a stream (`A-Z`, digits, `_`) and a subject token.
pub fn fresh_name(prefix: &str) -> String {
    format!("OUTBOX_TEST_{prefix}_{:016x}", fastrand::u64(..)).to_uppercase()
}

/// The test side of the server: its own connection and JetStream context.
pub struct Server {
    pub client: outbox_sink_nats::client::Client,
    pub jetstream: jetstream::Context,
}

impl Server {
    pub async fn connect() -> Self {
        Self::connect_to(&url()).await
    }

    pub async fn connect_to(url: &str) -> Self {
        let connecting = outbox_sink_nats::client::connect(url);
        let client = match tokio::time::timeout(Duration::from_secs(10), connecting).await {
            Ok(Ok(client)) => client,
            Ok(Err(e)) => no_server("NATS", URL_VAR, url, e),
            Err(_) => no_server("NATS", URL_VAR, url, "connection timed out"),
        };
        Self::of(client)
    }

    /// The test side on a client connected already (with credentials, say).
    pub fn of(client: outbox_sink_nats::client::Client) -> Self {
        let jetstream = jetstream::new(client.clone());
        Self { client, jetstream }
    }

    /// A fresh file-backed stream binding `NAME.>`, with a two-minute duplicate window;
    /// returns its name (also the subjects' first token).
    pub async fn stream(&self, prefix: &str) -> String {
        self.stream_with(prefix, |_| {}).await
    }

    /// As [`stream`](Self::stream), with the config adjusted by `adjust`.
    pub async fn stream_with(
        &self,
        prefix: &str,
        adjust: impl FnOnce(&mut stream::Config),
    ) -> String {
        let name = fresh_name(prefix);
        let mut config = stream::Config {
            name: name.clone(),
            subjects: vec![format!("{name}.>")],
            storage: stream::StorageType::File,
            duplicate_window: Duration::from_secs(120),
            ..Default::default()
        };
        adjust(&mut config);
        self.jetstream
            .create_stream(config)
            .await
            .expect("create the test stream");
        name
    }

    /// Every message the stream holds, in stream order.
    pub async fn take(&self, stream: &str) -> Vec<jetstream::message::StreamMessage> {
        let mut handle = self.jetstream.get_stream(stream).await.expect("the stream");
        let last = handle
            .info()
            .await
            .expect("stream info")
            .state
            .last_sequence;
        let mut got = Vec::new();
        for sequence in 1..=last {
            if let Ok(message) = handle.get_raw_message(sequence).await {
                got.push(message);
            }
        }
        got
    }

    pub async fn delete(&self, streams: &[String]) {
        for stream in streams {
            let _ = self.jetstream.delete_stream(stream).await;
        }
    }
}

/// A stored message as the sink suite compares it, decoded with the crate's consumer
/// helper.
pub fn delivered(message: &jetstream::message::StreamMessage) -> Delivered {
    let received = read_parts(Some(&message.headers), &message.payload).expect("an outbox message");
    Delivered::from(received)
}

/// Connects a sink; a missing server fails the test with instructions.
pub async fn sink(config: NatsSinkConfig) -> NatsSink {
    let url = config.url.clone();
    match NatsSink::connect(config).await {
        Ok(sink) => sink,
        Err(e @ NatsSinkError::Connect { .. }) => no_server("NATS", URL_VAR, &url, e),
        Err(e) => panic!("sink did not start: {e}"),
    }
}
