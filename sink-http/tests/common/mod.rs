//! Test helpers: a real HTTP server on loopback that records every request and answers
//! as told, a canary listener that counts connections, and message factories.
#![allow(dead_code, unreachable_pub)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use chrono::Utc;
use outbox_engine::{Message, NewMessage};
use outbox_sink_http::{HttpSink, HttpSinkConfig};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// One request as the server saw it.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub at: Instant,
    pub method: Method,
    pub uri: Uri,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Recorded {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// What the server answers.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub delay: Duration,
}

impl Reply {
    pub fn status(status: u16) -> Self {
        Self {
            status,
            headers: Vec::new(),
            body: Vec::new(),
            delay: Duration::ZERO,
        }
    }

    pub fn ok() -> Self {
        Self::status(200)
    }

    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Self {
        self.body = body.into();
        self
    }

    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }
}

type Behaviour = Arc<dyn Fn(&Recorded, usize) -> Reply + Send + Sync>;

#[derive(Clone)]
struct Shared {
    log: Arc<Mutex<Vec<Recorded>>>,
    behaviour: Arc<Mutex<Behaviour>>,
    in_flight: Arc<AtomicUsize>,
    max_in_flight: Arc<AtomicUsize>,
}

/// A recording HTTP server on 127.0.0.1.
pub struct TestServer {
    pub addr: SocketAddr,
    shared: Shared,
    task: JoinHandle<()>,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn handle(
    State(shared): State<Shared>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let now = shared.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    shared.max_in_flight.fetch_max(now, Ordering::SeqCst);
    let recorded = Recorded {
        at: Instant::now(),
        method,
        uri,
        headers,
        body,
    };
    let (reply, index) = {
        let mut log = shared.log.lock().unwrap();
        log.push(recorded.clone());
        let behaviour = Arc::clone(&shared.behaviour.lock().unwrap());
        (behaviour(&recorded, log.len() - 1), log.len() - 1)
    };
    let _ = index;
    if !reply.delay.is_zero() {
        tokio::time::sleep(reply.delay).await;
    }
    shared.in_flight.fetch_sub(1, Ordering::SeqCst);
    let mut response = (StatusCode::from_u16(reply.status).unwrap(), reply.body).into_response();
    for (name, value) in reply.headers {
        response.headers_mut().insert(
            axum::http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            HeaderValue::from_str(&value).unwrap(),
        );
    }
    response
}

impl TestServer {
    /// A server answering every request with 200.
    pub async fn start() -> Self {
        Self::with(|_, _| Reply::ok()).await
    }

    /// A server answering with `behaviour(request, index)`.
    pub async fn with(
        behaviour: impl Fn(&Recorded, usize) -> Reply + Send + Sync + 'static,
    ) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shared = Shared {
            log: Arc::default(),
            behaviour: Arc::new(Mutex::new(Arc::new(behaviour))),
            in_flight: Arc::default(),
            max_in_flight: Arc::default(),
        };
        let app = Router::new().fallback(handle).with_state(shared.clone());
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Self { addr, shared, task }
    }

    /// Replaces the behaviour.
    pub fn set(&self, behaviour: impl Fn(&Recorded, usize) -> Reply + Send + Sync + 'static) {
        *self.shared.behaviour.lock().unwrap() = Arc::new(behaviour);
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.shared.log.lock().unwrap().clone()
    }

    pub fn count(&self) -> usize {
        self.shared.log.lock().unwrap().len()
    }

    pub fn max_in_flight(&self) -> usize {
        self.shared.max_in_flight.load(Ordering::SeqCst)
    }
}

/// A listener on every local address (`[::]`, dual-stack) that only counts connections.
pub struct Canary {
    pub port: u16,
    connections: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl Drop for Canary {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Canary {
    pub async fn start() -> Self {
        let listener = TcpListener::bind("[::]:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let connections = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&connections);
        let task = tokio::spawn(async move {
            while let Ok((socket, peer)) = listener.accept().await {
                counter.fetch_add(1, Ordering::SeqCst);
                eprintln!("canary: connection from {peer}");
                drop(socket);
            }
        });
        Self {
            port,
            connections,
            task,
        }
    }

    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

/// Settings for a route to `url` that allow 127.0.0.1 (the test servers) and nothing
/// else private.
pub fn config(url: impl Into<String>) -> HttpSinkConfig {
    HttpSinkConfig::new(url).allow("127.0.0.1/32")
}

/// The sink for `config`, which must be valid.
pub fn sink(config: HttpSinkConfig) -> HttpSink {
    HttpSink::new(config).expect("valid sink")
}

/// A claimed-form JSON message for `dest`.
pub fn message(dest: &str, n: u64) -> Message {
    NewMessage::builder(dest, "test.event")
        .json(&serde_json::json!({ "n": n }))
        .build()
        .unwrap()
        .into_message(Utc::now())
}

pub const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
pub const OLD_SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";
