//! Shared test helpers: where the SQS emulator is (moto), a client and a reader built on
//! the AWS SDK directly (independently of the sink's code), an HTTP proxy in front of the
//! emulator that fails chosen entries the way AWS does, and private emulators a test
//! starts, stops and restarts itself.
#![allow(dead_code, unreachable_pub)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_sqs::Client;
use aws_sdk_sqs::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_sqs::types::{Message, MessageSystemAttributeName, QueueAttributeName};
use outbox_engine::testkit::Delivered;
use outbox_sink_sqs::client as aws_sdk_sqs;
use outbox_sink_sqs::{SqsSink, SqsSinkConfig, read_message};
use outbox_test_support::{ChildGuard, no_server, server_url};

pub const ENDPOINT_VAR: &str = "OUTBOX_TEST_SQS_ENDPOINT";
pub const DEFAULT_ENDPOINT: &str = "http://127.0.0.1:4566";
pub const REGION: &str = "us-east-1";

/// The test emulator's endpoint, from `OUTBOX_TEST_SQS_ENDPOINT` or the default
/// `scripts/services.sh` gives.
pub fn endpoint() -> String {
    server_url(ENDPOINT_VAR, DEFAULT_ENDPOINT)
}

/// A queue name no other test uses.
pub fn fresh_name(prefix: &str, fifo: bool) -> String {
    let name = format!("outbox-test-{prefix}-{:016x}", fastrand::u64(..));
    if fifo { format!("{name}.fifo") } else { name }
}

/// The sink's configuration for the queue at `queue_url` (as the emulator gave it),
/// reached through `endpoint` (the emulator itself or a proxy in front of it).
pub fn config_via(queue_url: &str, endpoint: &str) -> SqsSinkConfig {
    let path = queue_url
        .split_once("://")
        .and_then(|(_, rest)| rest.split_once('/'))
        .map(|(_, path)| path)
        .expect("a queue URL has a path");
    let endpoint = endpoint.trim_end_matches('/');
    SqsSinkConfig::new(format!("sqs+{endpoint}/{path}"))
        .region(REGION)
        .credentials("test", "test")
}

/// The sink's configuration for the queue at `queue_url`, straight to the emulator.
pub fn config(queue_url: &str) -> SqsSinkConfig {
    config_via(queue_url, &endpoint())
}

/// A connected sink, failing the test with the error when it cannot start.
pub async fn sink(config: SqsSinkConfig) -> SqsSink {
    match SqsSink::connect(config).await {
        Ok(sink) => sink,
        Err(e) => panic!("the SQS sink did not start: {e}"),
    }
}

/// The test side of the emulator: an SDK client, failing loudly without an emulator.
#[derive(Clone)]
pub struct Sqs {
    pub endpoint: String,
    pub client: Client,
}

impl Sqs {
    /// The shared test emulator.
    pub async fn connect() -> Self {
        Self::at(&endpoint()).await
    }

    /// The emulator at `endpoint`.
    pub async fn at(endpoint: &str) -> Self {
        let client = client(endpoint);
        let probe =
            tokio::time::timeout(Duration::from_secs(10), client.list_queues().send()).await;
        match probe {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => no_server(
                "an SQS emulator (moto_server)",
                ENDPOINT_VAR,
                endpoint,
                aws_sdk_sqs::error::DisplayErrorContext(e),
            ),
            Err(_) => no_server(
                "an SQS emulator (moto_server)",
                ENDPOINT_VAR,
                endpoint,
                "no answer within 10 s",
            ),
        }
        Self {
            endpoint: endpoint.to_owned(),
            client,
        }
    }

    /// A fresh queue; its URL.
    pub async fn queue(&self, prefix: &str, fifo: bool) -> String {
        self.queue_with(prefix, fifo, &[]).await
    }

    /// A fresh queue with extra attributes; its URL.
    pub async fn queue_with(
        &self,
        prefix: &str,
        fifo: bool,
        attributes: &[(QueueAttributeName, &str)],
    ) -> String {
        let mut request = self
            .client
            .create_queue()
            .queue_name(fresh_name(prefix, fifo));
        if fifo {
            request = request.attributes(QueueAttributeName::FifoQueue, "true");
        }
        for (name, value) in attributes {
            request = request.attributes(name.clone(), *value);
        }
        let created = request.send().await.expect("create queue");
        created.queue_url().expect("a queue URL").to_owned()
    }

    /// A reader that receives and deletes from `queue_url`.
    pub fn reader(&self, queue_url: &str) -> Reader {
        Reader {
            client: self.client.clone(),
            queue_url: queue_url.to_owned(),
            got: Vec::new(),
        }
    }
}

/// An SDK client for `endpoint` with the emulator's test credentials.
pub fn client(endpoint: &str) -> Client {
    let config = aws_sdk_sqs::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new(REGION))
        .endpoint_url(endpoint)
        .credentials_provider(Credentials::new("test", "test", None, None, "tests"))
        .build();
    Client::from_conf(config)
}

/// Receives every message of a queue (and deletes it, as a consumer would), keeping
/// what it got in arrival order.
pub struct Reader {
    client: Client,
    queue_url: String,
    pub got: Vec<Message>,
}

impl Reader {
    /// One receive round; returns how many messages arrived.
    pub async fn poll(&mut self) -> usize {
        let answer = self
            .client
            .receive_message()
            .queue_url(&self.queue_url)
            .max_number_of_messages(10)
            .wait_time_seconds(0)
            .message_attribute_names("All")
            .message_system_attribute_names(MessageSystemAttributeName::All)
            .send()
            .await
            .expect("receive");
        let messages = answer.messages().to_vec();
        delete_all(&self.client, &self.queue_url, &messages)
            .await
            .expect("delete");
        let n = messages.len();
        self.got.extend(messages);
        n
    }

    /// Waits until at least `n` messages arrived in all, failing the test after `limit`.
    pub async fn read(&mut self, n: usize, limit: Duration) -> &[Message] {
        let deadline = tokio::time::Instant::now() + limit;
        while self.got.len() < n {
            if self.poll().await == 0 {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "waited {limit:?} for {n} messages on {}, got {}",
                    self.queue_url,
                    self.got.len()
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        &self.got
    }

    /// Reads for `quiet` after the last message arrived: everything the queue holds.
    pub async fn drain(&mut self, quiet: Duration) -> &[Message] {
        let mut idle = tokio::time::Instant::now() + quiet;
        while tokio::time::Instant::now() < idle {
            if self.poll().await > 0 {
                idle = tokio::time::Instant::now() + quiet;
            } else {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        &self.got
    }
}

/// Deletes `messages` (received from `queue_url`) in one request.
pub async fn delete_all(
    client: &Client,
    queue_url: &str,
    messages: &[Message],
) -> Result<(), String> {
    if messages.is_empty() {
        return Ok(());
    }
    let entries = messages
        .iter()
        .enumerate()
        .map(|(i, m)| {
            aws_sdk_sqs::types::DeleteMessageBatchRequestEntry::builder()
                .id(i.to_string())
                .set_receipt_handle(m.receipt_handle().map(str::to_owned))
                .build()
                .unwrap()
        })
        .collect();
    client
        .delete_message_batch()
        .queue_url(queue_url)
        .set_entries(Some(entries))
        .send()
        .await
        .map(|_| ())
        .map_err(|e| aws_sdk_sqs::error::DisplayErrorContext(e).to_string())
}

/// What the conformance suite compares, read from an SQS message.
pub fn delivered(message: &Message) -> Delivered {
    let received = read_message(message).expect("an outbox message");
    Delivered::from(received)
}

/// A system attribute of a received message.
pub fn system(message: &Message, name: MessageSystemAttributeName) -> Option<String> {
    message.attributes().and_then(|a| a.get(&name)).cloned()
}

// ---------------------------------------------------------------------------------------
// A proxy that answers per entry the way AWS does
// ---------------------------------------------------------------------------------------

/// What the proxy does with one entry of a `SendMessageBatch`, chosen by a marker in
/// its body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Left out of the forwarded request and listed in `Failed` with `SenderFault = true`.
    Sender,
    /// The same with `SenderFault = false`, the first time the proxy sees the entry's
    /// outbox id; forwarded afterwards.
    ServerOnce,
    /// The whole request is refused with `InvalidParameterValue` while it holds this
    /// entry.
    PoisonRequest,
    /// Forwarded (the message is sent), but left out of the answer.
    Unanswered,
    /// Forwarded, and named twice in the answer's `Successful` list.
    Doubled,
}

impl Fault {
    /// The marker to put in a message body.
    pub fn marker(self) -> &'static str {
        match self {
            Self::Sender => "[[fault:sender]]",
            Self::ServerOnce => "[[fault:server-once]]",
            Self::PoisonRequest => "[[fault:poison]]",
            Self::Unanswered => "[[fault:unanswered]]",
            Self::Doubled => "[[fault:doubled]]",
        }
    }
}

/// The rules of AWS that moto does not enforce, checked by the proxy on every entry it
/// forwards: at most 10 attributes, no empty value, only characters SQS accepts.
pub fn aws_would_refuse(entry: &serde_json::Value) -> Option<String> {
    let legal = |text: &str| {
        text.chars().all(|c| {
            matches!(c, '\t' | '\n' | '\r' | ' '..='\u{D7FF}' | '\u{E000}'..='\u{FFFD}' | '\u{10000}'..)
        })
    };
    let body = entry["MessageBody"].as_str().unwrap_or_default();
    if body.is_empty() || !legal(body) {
        return Some("InvalidMessageContents".into());
    }
    let attributes = entry["MessageAttributes"].as_object();
    if attributes.is_some_and(|a| a.len() > 10) {
        return Some("InvalidParameterValue: more than 10 attributes".into());
    }
    for (name, value) in attributes.into_iter().flatten() {
        let text = value["StringValue"].as_str().unwrap_or_default();
        if text.is_empty() || !legal(text) || !legal(name) {
            return Some(format!("InvalidParameterValue: attribute {name}"));
        }
    }
    None
}

/// An HTTP proxy on loopback in front of the emulator. It forwards every request, and
/// in `SendMessageBatch` requests fails the entries whose body holds a [`Fault`] marker
/// as AWS would, and counts entries AWS would refuse ([`aws_would_refuse`]).
pub struct FaultProxy {
    pub endpoint: String,
    pub state: Arc<Mutex<ProxyState>>,
    server: tokio::task::JoinHandle<()>,
}

#[derive(Default, Debug)]
pub struct ProxyState {
    /// Outbox ids already failed once with `ServerOnce`.
    pub failed_once: Vec<String>,
    /// How many `SendMessageBatch` requests arrived, and their entry counts.
    pub batches: Vec<usize>,
    /// Entries that AWS would have refused, with the reason.
    pub refusable: Vec<String>,
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl FaultProxy {
    pub async fn start(upstream: &str) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr: SocketAddr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(ProxyState::default()));
        let app = axum::Router::new().fallback({
            let state = Arc::clone(&state);
            let upstream = upstream.trim_end_matches('/').to_owned();
            let http = reqwest::Client::new();
            move |request: axum::extract::Request| {
                let (state, upstream, http) = (Arc::clone(&state), upstream.clone(), http.clone());
                async move { forward(request, &upstream, &http, &state).await }
            }
        });
        let server = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Self {
            endpoint: format!("http://{addr}"),
            state,
            server,
        }
    }
}

async fn forward(
    request: axum::extract::Request,
    upstream: &str,
    http: &reqwest::Client,
    state: &Mutex<ProxyState>,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let (parts, body) = request.into_parts();
    let body = axum::body::to_bytes(body, 64 << 20).await.unwrap();
    let target = parts
        .headers
        .get("x-amz-target")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let mut failed = Vec::new();
    let (mut unanswered, mut doubled) = (Vec::new(), Vec::new());
    let mut body = body.to_vec();
    if target == "AmazonSQS.SendMessageBatch" {
        let mut request: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let entries = request["Entries"].as_array().cloned().unwrap_or_default();
        let mut state = state.lock().unwrap();
        state.batches.push(entries.len());
        if entries.iter().any(|e| {
            e["MessageBody"]
                .as_str()
                .is_some_and(|b| b.contains(Fault::PoisonRequest.marker()))
        }) {
            let answer = serde_json::json!({
                "__type": "com.amazonaws.sqs#InvalidParameterValue",
                "message": "one of the entries is refused",
            });
            return (
                axum::http::StatusCode::BAD_REQUEST,
                [("content-type", "application/x-amz-json-1.0")],
                answer.to_string(),
            )
                .into_response();
        }
        let mut kept = Vec::new();
        for entry in entries {
            let body = entry["MessageBody"].as_str().unwrap_or_default().to_owned();
            let id = entry["MessageAttributes"]["outbox-id"]["StringValue"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            if let Some(reason) = aws_would_refuse(&entry) {
                state.refusable.push(reason);
            }
            if body.contains(Fault::Unanswered.marker()) {
                unanswered.push(entry["Id"].clone());
            }
            if body.contains(Fault::Doubled.marker()) {
                doubled.push(entry["Id"].clone());
            }
            let fault = if body.contains(Fault::Sender.marker()) {
                Some(("InvalidParameterValue", true))
            } else if body.contains(Fault::ServerOnce.marker()) && !state.failed_once.contains(&id)
            {
                state.failed_once.push(id);
                Some(("InternalError", false))
            } else {
                None
            };
            match fault {
                Some((code, sender_fault)) => failed.push(serde_json::json!({
                    "Id": entry["Id"], "Code": code, "SenderFault": sender_fault,
                    "Message": "injected by the test proxy",
                })),
                None => kept.push(entry),
            }
        }
        if kept.is_empty() {
            let answer = serde_json::json!({ "Successful": [], "Failed": failed });
            return (
                [("content-type", "application/x-amz-json-1.0")],
                answer.to_string(),
            )
                .into_response();
        }
        request["Entries"] = serde_json::Value::Array(kept);
        body = serde_json::to_vec(&request).unwrap();
    }
    let mut upstream_request =
        http.request(parts.method.clone(), format!("{upstream}{}", parts.uri));
    for (name, value) in &parts.headers {
        if name != "host" && name != "content-length" {
            upstream_request = upstream_request.header(name, value);
        }
    }
    let answer = upstream_request.body(body).send().await.unwrap();
    let status = answer.status();
    let headers = answer.headers().clone();
    let mut bytes = answer.bytes().await.unwrap().to_vec();
    let rewrite = !(failed.is_empty() && unanswered.is_empty() && doubled.is_empty());
    if rewrite && status.is_success() {
        let mut answer: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        let mut successful = answer["Successful"].as_array().cloned().unwrap_or_default();
        successful.retain(|ok| !unanswered.contains(&ok["Id"]));
        let copies: Vec<serde_json::Value> = successful
            .iter()
            .filter(|ok| doubled.contains(&ok["Id"]))
            .cloned()
            .collect();
        successful.extend(copies);
        answer["Successful"] = serde_json::Value::Array(successful);
        let mut all_failed = answer["Failed"].as_array().cloned().unwrap_or_default();
        all_failed.extend(failed);
        answer["Failed"] = serde_json::Value::Array(all_failed);
        bytes = serde_json::to_vec(&answer).unwrap();
    }
    let mut response = axum::response::Response::builder().status(status.as_u16());
    for (name, value) in &headers {
        if name != "content-length" && name != "transfer-encoding" {
            response = response.header(name.as_str(), value.as_bytes());
        }
    }
    response.body(axum::body::Body::from(bytes)).unwrap()
}

// ---------------------------------------------------------------------------------------
// Private emulators
// ---------------------------------------------------------------------------------------

/// The moto_server binary, from `OUTBOX_TEST_MOTO` (scripts/services.sh prints it).
pub fn moto_binary() -> PathBuf {
    let path = std::env::var("OUTBOX_TEST_MOTO").unwrap_or_else(|_| {
        let home = std::env::var("HOME").unwrap_or_default();
        format!("{home}/.cache/outbox-tools/moto-venv/bin/moto_server")
    });
    let path = PathBuf::from(path);
    if !path.exists() {
        panic!(
            "this test starts its own SQS emulator and found no moto_server at {} \
             (run scripts/services.sh, or set OUTBOX_TEST_MOTO)",
            path.display()
        );
    }
    path
}

/// An emulator this test owns, on its own port, recording every request to a file so
/// that what it acknowledged can be replayed after a restart (moto keeps nothing itself).
pub struct PrivateMoto {
    pub port: u16,
    pub dir: tempfile::TempDir,
    child: Option<ChildGuard>,
}

impl PrivateMoto {
    pub async fn start() -> Self {
        let port = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap().port()
        };
        let mut moto = Self {
            port,
            dir: tempfile::tempdir().unwrap(),
            child: None,
        };
        moto.run().await;
        moto
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn recording(&self) -> PathBuf {
        self.dir.path().join("recording.jsonl")
    }

    async fn run(&mut self) {
        let mut command = Command::new(moto_binary());
        command
            .args(["-H", "127.0.0.1", "-p", &self.port.to_string()])
            .env("MOTO_ENABLE_RECORDING", "true")
            .env("MOTO_RECORDER_FILEPATH", self.recording())
            .current_dir(self.dir.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(self.dir.path().join("moto.log")).unwrap());
        self.child = Some(ChildGuard::spawn("moto_server", &mut command));
        let endpoint = self.endpoint();
        outbox_test_support::wait_until(
            &format!("moto_server on {endpoint}"),
            Duration::from_secs(30),
            || {
                let client = client(&endpoint);
                async move { client.list_queues().send().await.is_ok() }
            },
        )
        .await;
    }

    /// SIGKILLs the emulator: everything it held is gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill();
        }
    }

    /// Starts the emulator again on the same port and replays the recorded queue
    /// creations and sends (only those: receives and deletes are the test reader's), as a
    /// durable SQS would still hold them.
    pub async fn restart_and_replay(&mut self) -> usize {
        self.kill();
        let kept = keep_sends(&self.recording());
        self.run().await;
        let answer = reqwest::Client::new()
            .post(format!(
                "{}/moto-api/recorder/replay-recording",
                self.endpoint()
            ))
            .send()
            .await
            .expect("replay request");
        assert!(answer.status().is_success(), "replay: {}", answer.status());
        kept
    }
}

/// Rewrites a recording to its CreateQueue and SendMessage(Batch) requests; returns how
/// many it kept.
fn keep_sends(path: &Path) -> usize {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let kept: Vec<&str> = text
        .lines()
        .filter(|line| {
            let entry: serde_json::Value = serde_json::from_str(line).unwrap_or_default();
            let headers: HashMap<String, String> =
                serde_json::from_value(entry["headers"].clone()).unwrap_or_default();
            headers.iter().any(|(name, value)| {
                name.eq_ignore_ascii_case("x-amz-target")
                    && matches!(
                        value.as_str(),
                        "AmazonSQS.CreateQueue"
                            | "AmazonSQS.SendMessageBatch"
                            | "AmazonSQS.SendMessage"
                    )
            })
        })
        .collect();
    std::fs::write(path, kept.join("\n") + "\n").unwrap();
    kept.len()
}
