//! Shared test helpers: where Redis is, fresh stream names, a stream reader that decodes
//! entries independently of the sink's own code, and a private `redis-server` process.
#![allow(dead_code, unreachable_pub)]

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use outbox_engine::testkit::Delivered;
use outbox_sink_redis::client::{self as redis, Value, aio::MultiplexedConnection};
use outbox_sink_redis::{RedisSink, RedisSinkConfig, RedisSinkError};
use outbox_test_support::ChildGuard;

pub const URL_VAR: &str = "OUTBOX_TEST_REDIS_URL";
pub const DEFAULT_URL: &str = "redis://127.0.0.1:6379/";
pub const REDIS_SERVER: &str = "/usr/bin/redis-server";

/// The shared test Redis, from `OUTBOX_TEST_REDIS_URL` or the default that
/// `scripts/services.sh` provides.
pub fn url() -> String {
    std::env::var(URL_VAR).unwrap_or_else(|_| DEFAULT_URL.to_owned())
}

/// Explains which server is missing and how to start it, then fails the test.
pub fn no_server(url: &str, error: impl std::fmt::Display) -> ! {
    panic!(
        "Redis is not reachable at {url} ({error}).\n\
         These tests need a real Redis: run `scripts/services.sh` (it installs and starts it),\n\
         or point {URL_VAR} at one. Use `scripts/test.sh` to start services and run everything."
    )
}

/// A stream name no other test uses.
pub fn fresh_name(prefix: &str) -> String {
    format!("outbox-test:{prefix}:{:016x}", fastrand::u64(..))
}

/// A plain connection for reading back and for setting up, failing loudly without Redis.
pub async fn reader(url: &str) -> MultiplexedConnection {
    let client = redis::Client::open(url).unwrap_or_else(|e| no_server(url, e));
    match tokio::time::timeout(
        Duration::from_secs(5),
        client.get_multiplexed_async_connection(),
    )
    .await
    {
        Ok(Ok(conn)) => conn,
        Ok(Err(e)) => no_server(url, e),
        Err(_) => no_server(url, "connection timed out"),
    }
}

/// Connects a sink; a missing server fails the test with instructions.
pub async fn sink(config: RedisSinkConfig) -> RedisSink {
    let url = config.url.clone();
    match RedisSink::connect(config).await {
        Ok(sink) => sink,
        Err(e @ RedisSinkError::Connect { .. }) => no_server(&url, e),
        Err(e) => panic!("sink did not start: {e}"),
    }
}

/// One stream entry: its id and its field/value pairs in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub id: String,
    pub fields: Vec<(String, Vec<u8>)>,
}

impl Entry {
    pub fn get(&self, name: &str) -> Option<&[u8]> {
        self.fields
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_slice())
    }

    pub fn text(&self, name: &str) -> Option<String> {
        self.get(name)
            .map(|v| String::from_utf8(v.to_vec()).expect("UTF-8 field"))
    }

    /// The message's headers in the default layout (`h:` fields), in field order.
    pub fn headers(&self) -> impl Iterator<Item = (String, String)> + '_ {
        self.fields.iter().filter_map(|(name, value)| {
            name.strip_prefix("h:")
                .map(|h| (h.to_owned(), String::from_utf8(value.clone()).unwrap()))
        })
    }

    /// Decodes the default layout (`h:` header fields) to what the suite compares.
    pub fn delivered(&self) -> Delivered {
        self.delivered_with(self.headers().collect(), "payload")
    }

    /// Decodes the JSON header layout (`headers` field) with the payload in `payload_field`.
    pub fn delivered_json(&self, payload_field: &str) -> Delivered {
        let headers: BTreeMap<String, String> =
            serde_json::from_slice(self.get("headers").expect("headers field")).unwrap();
        self.delivered_with(headers, payload_field)
    }

    fn delivered_with(&self, headers: BTreeMap<String, String>, payload_field: &str) -> Delivered {
        Delivered {
            id: self.text("id").unwrap_or_default(),
            idempotency_key: self.text("idempotency_key").unwrap_or_default(),
            event_type: self.text("event_type").unwrap_or_default(),
            payload: self.get(payload_field).unwrap_or_default().to_vec(),
            headers,
        }
    }
}

/// Decodes one entry `[id, [field, value, ...]]` as XRANGE / XREADGROUP return it.
pub fn entry(value: &Value) -> Entry {
    let Value::Array(parts) = value else {
        panic!("entry is not an array: {value:?}")
    };
    let [Value::BulkString(id), Value::Array(flat)] = parts.as_slice() else {
        panic!("unexpected entry shape: {value:?}")
    };
    assert!(flat.len() % 2 == 0, "odd field list: {flat:?}");
    let fields = flat
        .chunks(2)
        .map(|pair| match pair {
            [Value::BulkString(name), Value::BulkString(value)] => {
                (String::from_utf8(name.clone()).unwrap(), value.clone())
            }
            other => panic!("unexpected field pair {other:?}"),
        })
        .collect();
    Entry {
        id: String::from_utf8(id.clone()).unwrap(),
        fields,
    }
}

/// Every entry of `stream`, oldest first.
pub async fn xrange(conn: &mut MultiplexedConnection, stream: &str) -> Vec<Entry> {
    let reply: Value = redis::cmd("XRANGE")
        .arg(stream)
        .arg("-")
        .arg("+")
        .query_async(conn)
        .await
        .expect("XRANGE");
    match reply {
        Value::Array(entries) => entries.iter().map(entry).collect(),
        other => panic!("unexpected XRANGE reply {other:?}"),
    }
}

/// A field of the server's `INFO section` answer, trimmed (empty when absent).
pub async fn server_info(conn: &mut MultiplexedConnection, section: &str, field: &str) -> String {
    let info: String = redis::cmd("INFO")
        .arg(section)
        .query_async(conn)
        .await
        .unwrap();
    info.lines()
        .find_map(|l| {
            l.strip_prefix(&format!("{field}:"))
                .map(|v| v.trim().to_owned())
        })
        .unwrap_or_default()
}

pub async fn xlen(conn: &mut MultiplexedConnection, stream: &str) -> usize {
    redis::cmd("XLEN")
        .arg(stream)
        .query_async(conn)
        .await
        .expect("XLEN")
}

pub async fn del(conn: &mut MultiplexedConnection, keys: &[String]) {
    if !keys.is_empty() {
        let _: i64 = redis::cmd("DEL")
            .arg(keys)
            .query_async(conn)
            .await
            .expect("DEL");
    }
}

/// Waits until `check` is true, polling, or panics after `limit` with `what`.
pub async fn eventually<F, Fut>(limit: Duration, what: &str, check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    outbox_test_support::wait_until(what, limit, check).await
}

/// A `redis-server` of this test's own on a free loopback port, with the AOF in a private
/// directory (`appendfsync always`, so a killed server keeps every acknowledged write and
/// a lost message can only be the sink's fault). Killed and cleaned up on drop.
pub struct OwnRedis {
    pub port: u16,
    pub dir: PathBuf,
    extra: Vec<String>,
    tls: bool,
    child: Option<ChildGuard>,
}

impl OwnRedis {
    /// Starts a server; `extra` are further `--name value` arguments.
    pub async fn start(extra: &[&str]) -> Self {
        Self::start_with(extra, false).await
    }

    /// Starts a server that listens with TLS only and requires client certificates;
    /// `ca.pem`, `client.pem` and `client.key` in [`dir`](Self::dir) are what a client
    /// needs (made with the `openssl` command).
    pub async fn start_tls(extra: &[&str]) -> Self {
        Self::start_with(extra, true).await
    }

    async fn start_with(extra: &[&str], tls: bool) -> Self {
        if !std::path::Path::new(REDIS_SERVER).exists() {
            panic!(
                "{REDIS_SERVER} is not installed; these tests start their own Redis.\n\
                 Run `scripts/services.sh` (it installs redis-server), or `apt-get install redis-server`."
            );
        }
        let port = {
            let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
            listener.local_addr().unwrap().port()
        };
        let dir = std::env::temp_dir().join(format!(
            "outbox-redis-{}-{:08x}",
            std::process::id(),
            fastrand::u32(..)
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        if tls {
            outbox_test_support::make_certificates(&dir);
        }
        let mut server = Self {
            port,
            dir,
            extra: extra.iter().map(|s| (*s).to_owned()).collect(),
            tls,
            child: None,
        };
        server.spawn().await;
        server
    }

    pub fn url(&self) -> String {
        if self.tls {
            format!("rediss://127.0.0.1:{}/", self.port)
        } else {
            format!("redis://127.0.0.1:{}/", self.port)
        }
    }

    async fn spawn(&mut self) {
        let mut command = Command::new(REDIS_SERVER);
        if self.tls {
            let file = |name: &str| self.dir.join(name).to_str().unwrap().to_owned();
            command
                .args(["--port", "0", "--tls-port", &self.port.to_string()])
                .args(["--tls-cert-file", &file("server.pem")])
                .args(["--tls-key-file", &file("server.key")])
                .args(["--tls-ca-cert-file", &file("ca.pem")])
                .args(["--tls-auth-clients", "yes"]);
        } else {
            command.args(["--port", &self.port.to_string()]);
        }
        let child = ChildGuard::spawn(
            format!("redis-server on port {}", self.port),
            command
                .args(["--bind", "127.0.0.1"])
                .args(["--save", ""])
                .args(["--appendonly", "yes"])
                .args(["--appendfsync", "always"])
                .args(["--dir", self.dir.to_str().unwrap()])
                .args(&self.extra)
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
        );
        self.child = Some(child);
        if self.tls {
            // Listening is enough: an empty server is ready as soon as it accepts.
            let start = Instant::now();
            while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
                assert!(
                    start.elapsed() < Duration::from_secs(10),
                    "own TLS redis-server on port {} did not come up",
                    self.port
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            return;
        }
        let url = self.url();
        let client = redis::Client::open(url.as_str()).unwrap();
        let start = Instant::now();
        loop {
            let attempt = tokio::time::timeout(
                Duration::from_millis(500),
                client.get_multiplexed_async_connection(),
            )
            .await;
            if let Ok(Ok(mut conn)) = attempt {
                match redis::cmd("PING").query_async::<Value>(&mut conn).await {
                    Ok(_) => return,
                    // The server answered (NOAUTH on a server with a password).
                    Err(e) if e.code().is_some() => return,
                    Err(_) => {}
                }
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "own redis-server on port {} did not come up",
                self.port
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// SIGKILL: no shutdown, no final save.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill();
        }
    }

    /// Starts the server again on the same port and directory.
    pub async fn restart(&mut self) {
        self.kill();
        self.spawn().await;
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
