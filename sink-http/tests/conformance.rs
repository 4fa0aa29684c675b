//! The shared sink conformance suite against a real HTTP server on loopback.

mod common;

use common::{Recorded, SECRET, TestServer};
use outbox_engine::Headers;
use outbox_engine::testkit::publish;
use outbox_engine::testkit::{Delivered, SinkHarness, sink_suite};
use outbox_engine::webhooks::{Secret, Verifier, idempotency_key};
use outbox_sink_http::{HttpSink, headers};

struct HttpHarness {
    server: TestServer,
    sink: HttpSink,
    verifier: Verifier,
}

impl HttpHarness {
    async fn new() -> Self {
        let server = TestServer::start().await;
        let sink = common::sink(common::config(server.url("/hooks")).secret(SECRET));
        Self {
            server,
            sink,
            verifier: Verifier::new(vec![Secret::parse(SECRET).unwrap()]),
        }
    }

    /// Translates a request back into what the message was, checking its signature.
    fn delivered(&self, r: &Recorded) -> Delivered {
        let lookup = |name: &str| r.header(name);
        let now = chrono::Utc::now().timestamp();
        let webhook = self
            .verifier
            .verify(lookup, &r.body, now)
            .unwrap_or_else(|e| panic!("request does not verify: {e}"));
        // The signed identity: the key, percent-encoded where the `webhook-id` needs it.
        let key = idempotency_key(webhook.id).into_owned();
        assert_eq!(
            r.header(headers::IDEMPOTENCY_KEY),
            Some(key.as_str()),
            "webhook-id carries the idempotency key"
        );
        let transport = ["user-agent", "accept", "accept-encoding"];
        let own: Headers = r
            .headers
            .iter()
            .filter(|(name, _)| {
                !headers::is_reserved(name.as_str()) && !transport.contains(&name.as_str())
            })
            .map(|(name, value)| (name.to_string(), value.to_str().unwrap().to_owned()))
            .collect();
        Delivered {
            id: r
                .header(headers::MESSAGE_ID)
                .expect("message id")
                .to_owned(),
            idempotency_key: key,
            event_type: r
                .header(headers::EVENT_TYPE)
                .expect("event type")
                .to_owned(),
            payload: r.body.to_vec(),
            headers: own,
        }
    }
}

impl SinkHarness for HttpHarness {
    type Sink = HttpSink;

    fn sink(&self) -> &HttpSink {
        &self.sink
    }

    async fn received(&self) -> Vec<Delivered> {
        self.server
            .requests()
            .iter()
            .map(|r| self.delivered(r))
            .collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_sink_passes_the_sink_suite() {
    sink_suite::run_all(HttpHarness::new).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn content_type_and_method_reach_the_server() {
    let h = HttpHarness::new().await;
    let batch = sink_suite::messages("suite", 1);
    assert!(publish(&h.sink, &batch).await[0].is_published());
    let got = &h.server.requests()[0];
    assert_eq!(got.method, "POST");
    assert_eq!(got.uri.path(), "/hooks");
    assert_eq!(got.header("content-type"), Some("application/json"));
    assert_eq!(
        got.header("traceparent"),
        batch[0].headers.get("traceparent").map(String::as_str)
    );
    assert_eq!(h.delivered(got), Delivered::expected(&batch[0]));
}
