//! The [`RedisSink`]: one pipelined round trip per batch, one outcome per message.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox_engine::{Failure, FailureClass, Message, Outcome, PublishContext, Sink};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Cmd, Pipeline, Script, Value};
use tracing::{debug, warn};

use crate::config::{
    Durability, FieldLayout, HeaderLayout, METADATA_FIELDS, RedisSinkConfig, StreamTemplate,
};
use crate::error::{RedisSinkError, classify, classify_reply};

/// The dedupe script (see `xadd_dedupe.lua` beside this file).
const DEDUPE_SCRIPT: &str = include_str!("xadd_dedupe.lua");

/// How often the connection manager retries one reconnect before failing the calls that
/// wait for it. The relay's retry policy is the real backoff; this only rides out a blip.
const RECONNECT_RETRIES: usize = 2;

/// The oldest server the sink accepts: streams need 5.0, the dedupe script's `KEEPTTL`
/// needs 6.0.
const MIN_VERSION: (u32, u32) = (6, 0);

/// Publishes outbox messages to Redis Streams.
///
/// Build one with [`connect`](Self::connect) (or [`from_url`](Self::from_url)), which
/// validates the configuration, connects, and checks that the server can do what the
/// route asks, so a misconfigured route fails at start-up instead of at the first batch.
/// Clones share one connection, which reconnects by itself after the server restarts or
/// the network drops, and is replaced after a round trip that got no reply in time (a
/// connection that fell silent without being closed is otherwise never noticed).
///
/// Each [`publish`](Sink::publish) sends the whole batch as one pipeline (one round
/// trip): one `XADD` per message, or one call of the dedupe script per message when the
/// dedupe window is on, followed by `WAIT`/`WAITAOF` when durability is configured. Every
/// message gets its own outcome from its own reply; a message is published only when
/// Redis answered its command with an entry id (and the durability wait, if any, was
/// met). The receipt is the stream entry id; for a message suppressed as a duplicate it is
/// the id of the first entry.
///
/// ```no_run
/// use outbox_engine::{MemoryStore, Relay};
/// use outbox_sink_redis::{RedisSink, RedisSinkConfig};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let sink = RedisSink::connect(
///     RedisSinkConfig::new("redis://127.0.0.1:6379/")
///         .stream("events.{destination}")
///         .maxlen(Some(1_000_000)),
/// )
/// .await?;
/// let store = MemoryStore::new();
/// let relay = Relay::builder(store).route("orders", sink).build()?;
/// relay.drain().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct RedisSink {
    inner: Arc<Inner>,
}

struct Inner {
    conn: Mutex<ConnectionManager>,
    /// Set when a round trip got no reply in time. The connection may have gone silent
    /// for good (a peer that vanished without a reset, a NAT that forgot the flow), which
    /// the manager does not notice by itself: the next round trip opens a fresh one.
    silent: AtomicBool,
    client: redis::Client,
    manager: ConnectionManagerConfig,
    config: RedisSinkConfig,
    template: StreamTemplate,
    /// Present when the dedupe window is on.
    script: Option<Script>,
    server_version: String,
    /// The largest argument the server accepts (`proto-max-bulk-len`): a bigger one makes
    /// it drop the connection, failing the whole pipeline.
    max_argument: usize,
    /// The URL with the password hidden, for messages.
    url: String,
}

impl fmt::Debug for RedisSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisSink")
            .field("config", &self.inner.config)
            .field("server_version", &self.inner.server_version)
            .finish_non_exhaustive()
    }
}

impl RedisSink {
    /// Validates `config`, connects, and checks the server.
    ///
    /// Start-up checks: the server is Redis 6.0 or newer and a primary (writes to a
    /// replica would be refused or lost); the dedupe script loads (when the window is on);
    /// the durability setting can be honoured (`WAITAOF` needs Redis 7.2, and
    /// `appendonly yes` when `local` is set; `WAIT`/`WAITAOF` need at least the requested
    /// replicas connected) and the server accepts the wait command; a fixed stream key is
    /// unused or already a stream.
    ///
    /// # Errors
    ///
    /// A [`RedisSinkError`] saying what is wrong; the route must not start.
    pub async fn connect(config: RedisSinkConfig) -> Result<Self, RedisSinkError> {
        let template = config.validate()?;
        let url = outbox_engine::redact::url(&config.url);
        let client = open_client(&config, &url)?;
        let connect_error = |source| RedisSinkError::Connect {
            url: url.clone(),
            source,
        };
        let manager = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(config.connect_timeout))
            .set_response_timeout(Some(config.response_timeout))
            .set_number_of_retries(RECONNECT_RETRIES)
            .set_min_delay(Duration::from_millis(100))
            .set_max_delay(Duration::from_secs(1));
        let mut conn = client
            .get_connection_manager_with_config(manager.clone())
            .await
            .map_err(connect_error)?;

        let server: String = redis::cmd("INFO")
            .arg("server")
            .query_async(&mut conn)
            .await
            .map_err(connect_error)?;
        let server_version = info_field(&server, "redis_version")
            .unwrap_or_default()
            .to_owned();
        let version =
            parse_version(&server_version).ok_or_else(|| RedisSinkError::Unsupported {
                url: url.clone(),
                reason: format!("cannot read the server version from INFO ({server_version:?})"),
            })?;
        if version < MIN_VERSION {
            return Err(RedisSinkError::Unsupported {
                url,
                reason: format!(
                    "the sink needs Redis {}.{} or newer; this server is {server_version}",
                    MIN_VERSION.0, MIN_VERSION.1
                ),
            });
        }
        let replication: String = redis::cmd("INFO")
            .arg("replication")
            .query_async(&mut conn)
            .await
            .map_err(connect_error)?;
        if info_field(&replication, "role") == Some("slave") {
            return Err(RedisSinkError::Unsupported {
                url,
                reason: "the server is a replica; point the sink at the primary".to_owned(),
            });
        }

        let script = match config.dedupe_window {
            Some(_) => {
                let script = Script::new(DEDUPE_SCRIPT);
                load_script(&mut conn, &script)
                    .await
                    .map_err(|source| RedisSinkError::Unsupported {
                        url: url.clone(),
                        reason: format!(
                            "the dedupe script does not load ({source}); turn the dedupe window off or allow Lua scripts"
                        ),
                    })?;
                Some(script)
            }
            None => None,
        };

        check_durability(
            &mut conn,
            config.durability,
            version,
            &server_version,
            &replication,
            &url,
        )
        .await?;

        let max_argument = max_argument(&mut conn).await;

        if let Some(key) = template.fixed() {
            let found: String = redis::cmd("TYPE")
                .arg(&key)
                .query_async(&mut conn)
                .await
                .map_err(connect_error)?;
            if found != "none" && found != "stream" {
                return Err(RedisSinkError::WrongType { key, url, found });
            }
        }

        Ok(Self {
            inner: Arc::new(Inner {
                conn: Mutex::new(conn),
                silent: AtomicBool::new(false),
                client,
                manager,
                config,
                template,
                script,
                server_version,
                max_argument,
                url,
            }),
        })
    }

    /// [`RedisSinkConfig::from_url`] followed by [`connect`](Self::connect).
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), outbox_sink_redis::RedisSinkError> {
    /// let sink = outbox_sink_redis::RedisSink::from_url(
    ///     "redis://127.0.0.1:6379/0?stream=events.{event_type}&maxlen=100000",
    /// )
    /// .await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As for [`RedisSinkConfig::from_url`] and [`connect`](Self::connect).
    pub async fn from_url(url: &str) -> Result<Self, RedisSinkError> {
        Self::connect(RedisSinkConfig::from_url(url)?).await
    }

    /// The configuration this sink runs with.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), outbox_sink_redis::RedisSinkError> {
    /// let sink = outbox_sink_redis::RedisSink::from_url("redis://127.0.0.1/?stream=events").await?;
    /// assert_eq!(sink.config().stream, "events");
    /// # Ok(())
    /// # }
    /// ```
    pub fn config(&self) -> &RedisSinkConfig {
        &self.inner.config
    }

    /// The server's version as it reported it at start-up, e.g. `7.0.15`.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), outbox_sink_redis::RedisSinkError> {
    /// let sink = outbox_sink_redis::RedisSink::from_url("redis://127.0.0.1/").await?;
    /// println!("Redis {}", sink.server_version());
    /// # Ok(())
    /// # }
    /// ```
    pub fn server_version(&self) -> &str {
        &self.inner.server_version
    }

    /// The stream key `message` is appended to.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// use outbox_engine::NewMessage;
    ///
    /// let sink = outbox_sink_redis::RedisSink::from_url("redis://127.0.0.1/?stream=shop.{event_type}").await?;
    /// let message = NewMessage::builder("orders", "order.paid").build()?.into_message(chrono::Utc::now());
    /// assert_eq!(sink.stream_key(&message)?, "shop.order.paid");
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// The permanent [`Config`](FailureClass::Config) failure `publish` gives the message
    /// when the template cannot be rendered for it.
    pub fn stream_key(&self, message: &Message) -> Result<String, Failure> {
        self.inner.stream_key(message)
    }
}

impl Sink for RedisSink {
    async fn publish(
        &self,
        batch: &[Message],
        cx: &PublishContext,
    ) -> Result<Vec<Outcome>, Failure> {
        match tokio::time::timeout_at(cx.deadline(), self.inner.publish(batch)).await {
            Ok(outcomes) => outcomes,
            Err(_) => {
                self.inner.silent.store(true, Ordering::Relaxed);
                Err(Failure::retryable(
                    FailureClass::Timeout,
                    "no reply from Redis before the publish deadline; the entries may have been appended",
                ))
            }
        }
    }
}

impl Inner {
    /// The shared connection; a fresh one first if the last round trip went unanswered
    /// (if that fails, the old one, and the next call tries again).
    async fn connection(&self) -> ConnectionManager {
        if self.silent.swap(false, Ordering::Relaxed) {
            let fresh = self
                .client
                .get_connection_manager_with_config(self.manager.clone())
                .await;
            match fresh {
                Ok(fresh) => {
                    debug!(url = %self.url, "replaced a connection that stopped answering");
                    *self.conn.lock().unwrap_or_else(|e| e.into_inner()) = fresh;
                }
                Err(_) => self.silent.store(true, Ordering::Relaxed),
            }
        }
        self.conn.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn stream_key(&self, message: &Message) -> Result<String, Failure> {
        self.template
            .render(message)
            .map_err(|reason| Failure::permanent(FailureClass::Config, reason))
    }

    /// Never `Err`: a failed round trip fails the messages that were sent, and the
    /// messages refused before sending keep their permanent failures.
    async fn publish(&self, batch: &[Message]) -> Result<Vec<Outcome>, Failure> {
        let mut outcomes: Vec<Option<Outcome>> = vec![None; batch.len()];
        let mut pipe = Pipeline::with_capacity(batch.len() + 1);
        let mut sent = Vec::with_capacity(batch.len());
        for (i, message) in batch.iter().enumerate() {
            match self.command(message) {
                Ok(cmd) => {
                    pipe.add_command(cmd);
                    sent.push(i);
                }
                Err(failure) => outcomes[i] = Some(Outcome::Failed(failure)),
            }
        }
        if !sent.is_empty() {
            if let Some(wait) = self.wait_command() {
                pipe.add_command(wait);
            }
            pipe.ignore_errors();
            let (replies, wait_reply) = match self.round_trip(&pipe, sent.len()).await {
                Ok(replies) => replies,
                Err(failure) => {
                    let appended = self.appended_before(batch, &sent).await;
                    for (i, entry) in sent.into_iter().zip(appended) {
                        outcomes[i] = Some(match entry {
                            Some(id) => Outcome::published_with(id),
                            None => Outcome::Failed(failure.clone()),
                        });
                    }
                    return Ok(finish(outcomes));
                }
            };
            let shortfall = wait_reply.and_then(|reply| self.durability_shortfall(reply));
            if let Some(failure) = &shortfall {
                warn!(url = %self.url, %failure, "durability wait not met; the batch will be retried");
            }
            let mut duplicates = 0usize;
            for (i, reply) in sent.into_iter().zip(replies) {
                outcomes[i] = Some(match entry_reply(reply) {
                    Ok((id, new)) => {
                        duplicates += usize::from(!new);
                        match &shortfall {
                            Some(failure) => Outcome::Failed(failure.clone()),
                            None => Outcome::published_with(id),
                        }
                    }
                    Err(failure) => Outcome::Failed(failure),
                });
            }
            if duplicates > 0 {
                debug!(
                    duplicates,
                    "re-sent messages found in the dedupe window; not appended again"
                );
            }
        }
        Ok(finish(outcomes))
    }

    /// Sends the pipeline; if the script cache was flushed (a restart, `SCRIPT FLUSH`),
    /// loads the script and sends the whole batch again. That is safe: a `NOSCRIPT` reply
    /// means the script did not run, and the messages whose script did run are found in
    /// the dedupe window.
    async fn round_trip(
        &self,
        pipe: &Pipeline,
        entries: usize,
    ) -> Result<(Vec<Value>, Option<Value>), Failure> {
        let mut conn = self.connection().await;
        let mut replies = self.send(&mut conn, pipe, entries).await?;
        if let Some(script) = &self.script {
            let noscript = |v: &Value| matches!(v, Value::ServerError(e) if e.code() == "NOSCRIPT");
            if replies.0.iter().any(noscript) {
                debug!("dedupe script missing from the server's cache; loading it again");
                load_script(&mut conn, script)
                    .await
                    .map_err(|e| classify(&e))?;
                replies = self.send(&mut conn, pipe, entries).await?;
            }
        }
        Ok(replies)
    }

    async fn send(
        &self,
        conn: &mut ConnectionManager,
        pipe: &Pipeline,
        entries: usize,
    ) -> Result<(Vec<Value>, Option<Value>), Failure> {
        let mut replies: Vec<Value> = pipe.query_async(conn).await.map_err(|e| {
            if e.is_timeout() {
                self.silent.store(true, Ordering::Relaxed);
            }
            classify(&e)
        })?;
        if replies.len() != pipe.len() {
            return Err(Failure::retryable(
                FailureClass::Other,
                format!(
                    "Redis sent {} replies for {} commands",
                    replies.len(),
                    pipe.len()
                ),
            ));
        }
        let wait_reply = (replies.len() > entries).then(|| replies.remove(entries));
        Ok((replies, wait_reply))
    }

    /// After a round trip failed half-way (the connection dropped), the entry ids of the
    /// `sent` messages that were appended before it did, found through their dedupe keys
    /// on a fresh round trip; `None` for the others, and for all of them when the dedupe
    /// window is off, a durability wait is configured (an appended entry is not yet
    /// durable), or the check fails too.
    async fn appended_before(&self, batch: &[Message], sent: &[usize]) -> Vec<Option<String>> {
        let unknown = vec![None; sent.len()];
        if self.script.is_none() || self.config.durability != Durability::None {
            return unknown;
        }
        let mut pipe = Pipeline::with_capacity(sent.len());
        for &i in sent {
            let Ok(stream) = self.stream_key(&batch[i]) else {
                return unknown;
            };
            pipe.cmd("GET").arg(dedupe_key(
                &self.config.dedupe_prefix,
                &stream,
                &batch[i].idempotency_key,
            ));
        }
        let mut conn = self.connection().await;
        match pipe.query_async::<Vec<Option<String>>>(&mut conn).await {
            Ok(found) if found.len() == sent.len() => {
                let appended = found.iter().flatten().count();
                if appended > 0 {
                    debug!(
                        appended,
                        "found entries appended before the connection dropped"
                    );
                }
                found
            }
            _ => unknown,
        }
    }

    /// The command that appends `message`, or the permanent failure that keeps it from
    /// being sent at all.
    fn command(&self, message: &Message) -> Result<Cmd, Failure> {
        if message.payload.len() > self.config.max_payload_bytes {
            return Err(Failure::permanent(
                FailureClass::TooLarge,
                format!(
                    "payload is {} bytes, the route's limit is {} (max_payload_bytes)",
                    message.payload.len(),
                    self.config.max_payload_bytes
                ),
            ));
        }
        let largest = largest_argument(&self.config.fields, message);
        if largest > self.max_argument {
            // Sent, it would make the server drop the connection and fail the whole batch.
            return Err(Failure::permanent(
                FailureClass::TooLarge,
                format!(
                    "an entry field is {largest} bytes; the Redis server accepts at most {} bytes per argument (proto-max-bulk-len)",
                    self.max_argument
                ),
            ));
        }
        let stream = self.stream_key(message)?;
        let mut cmd;
        match (&self.script, self.config.dedupe_window) {
            (Some(script), Some(window)) => {
                cmd = redis::cmd("EVALSHA");
                cmd.arg(script.get_hash())
                    .arg(2)
                    .arg(&stream)
                    .arg(dedupe_key(
                        &self.config.dedupe_prefix,
                        &stream,
                        &message.idempotency_key,
                    ))
                    .arg(window.as_millis().max(1).to_string())
                    .arg(
                        self.config
                            .maxlen
                            .map(|n| n.to_string())
                            .unwrap_or_default(),
                    )
                    .arg(if self.config.durability == Durability::None {
                        "0"
                    } else {
                        "1"
                    });
            }
            _ => {
                cmd = redis::cmd("XADD");
                cmd.arg(&stream);
                if let Some(n) = self.config.maxlen {
                    cmd.arg("MAXLEN").arg("~").arg(n);
                }
                cmd.arg("*");
            }
        }
        write_fields(&mut cmd, &self.config.fields, message);
        Ok(cmd)
    }

    fn wait_command(&self) -> Option<Cmd> {
        match self.config.durability {
            Durability::None => None,
            Durability::Wait { replicas, timeout } => {
                let mut cmd = redis::cmd("WAIT");
                cmd.arg(replicas).arg(millis(timeout));
                Some(cmd)
            }
            Durability::WaitAof {
                local,
                replicas,
                timeout,
            } => {
                let mut cmd = redis::cmd("WAITAOF");
                cmd.arg(u8::from(local)).arg(replicas).arg(millis(timeout));
                Some(cmd)
            }
        }
    }

    /// `None` when the wait reply shows the durability was reached, else the retryable
    /// failure every message of the batch gets.
    fn durability_shortfall(&self, reply: Value) -> Option<Failure> {
        let requested = self.config.durability.describe();
        let int = |v: &Value| match v {
            Value::Int(n) => Some(*n),
            _ => None,
        };
        let reached = match (&self.config.durability, &reply) {
            (Durability::Wait { replicas, .. }, Value::Int(got)) => {
                if *got >= i64::from(*replicas) {
                    return None;
                }
                format!("{got} of {replicas} replicas acknowledged")
            }
            (
                Durability::WaitAof {
                    local, replicas, ..
                },
                Value::Array(items),
            ) if items.len() == 2 && items.iter().all(|v| int(v).is_some()) => {
                let (got_local, got_replicas) = (int(&items[0])?, int(&items[1])?);
                if got_local >= i64::from(*local) && got_replicas >= i64::from(*replicas) {
                    return None;
                }
                format!(
                    "local fsync {got_local} of {}, replica fsyncs {got_replicas} of {replicas}",
                    u8::from(*local)
                )
            }
            (_, Value::ServerError(e)) => {
                format!(
                    "the server refused it: {} {}",
                    e.code(),
                    e.details().unwrap_or("")
                )
            }
            (_, other) => format!("unexpected reply {other:?}"),
        };
        Some(Failure::retryable(
            FailureClass::Unavailable,
            format!(
                "durability {requested} not reached: {reached}; the entries were appended and will be re-sent"
            ),
        ))
    }
}

/// Every message's outcome; a message without one (which would be a bug) fails retryably.
fn finish(outcomes: Vec<Option<Outcome>>) -> Vec<Outcome> {
    outcomes
        .into_iter()
        .map(|o| {
            o.unwrap_or_else(|| {
                Outcome::retryable(FailureClass::Other, "no reply for this message")
            })
        })
        .collect()
}

/// Appends the entry's field/value pairs; the layout is documented on [`FieldLayout`].
fn write_fields(cmd: &mut Cmd, fields: &FieldLayout, message: &Message) {
    cmd.arg(&fields.id).arg(message.id.to_string());
    cmd.arg(&fields.idempotency_key)
        .arg(&message.idempotency_key);
    cmd.arg(&fields.event_type).arg(&message.event_type);
    cmd.arg(&fields.content_type).arg(&message.content_type);
    if fields.metadata {
        let values = [
            &message.partition_key,
            &message.tenant_id,
            &message.aggregate_type,
            &message.aggregate_id,
        ];
        for (name, value) in METADATA_FIELDS.iter().zip(values) {
            if let Some(value) = value {
                cmd.arg(*name).arg(value);
            }
        }
    }
    match &fields.headers {
        HeaderLayout::Prefixed { prefix } => {
            for (name, value) in &message.headers {
                cmd.arg(format!("{prefix}{name}")).arg(value);
            }
        }
        HeaderLayout::Json { field } => {
            // A map of strings always serialises.
            let json = serde_json::to_string(&message.headers).unwrap_or_else(|_| "{}".into());
            cmd.arg(field).arg(json);
        }
    }
    cmd.arg(&fields.payload).arg(message.payload.as_slice());
}

/// The size of the largest field value [`write_fields`] sends for `message`.
fn largest_argument(fields: &FieldLayout, message: &Message) -> usize {
    let headers = match &fields.headers {
        HeaderLayout::Prefixed { .. } => message.headers.values().map(String::len).max(),
        HeaderLayout::Json { .. } => serde_json::to_string(&message.headers)
            .ok()
            .map(|j| j.len()),
    };
    message.payload.len().max(headers.unwrap_or(0))
}

/// The server's `proto-max-bulk-len`, or Redis's default (512 MiB) when `CONFIG GET` is
/// not allowed (managed services often rename or forbid it).
async fn max_argument(conn: &mut ConnectionManager) -> usize {
    const DEFAULT: usize = 512 * 1024 * 1024;
    let reply: redis::RedisResult<Vec<String>> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("proto-max-bulk-len")
        .query_async(conn)
        .await;
    match reply {
        Ok(pair) => pair.get(1).and_then(|v| v.parse().ok()).unwrap_or(DEFAULT),
        Err(error) => {
            debug!(%error, "cannot read proto-max-bulk-len; assuming Redis's default");
            DEFAULT
        }
    }
}

/// The dedupe key of (stream, idempotency key). The stream's byte length comes first so
/// that no two pairs share a key, whatever characters they contain.
fn dedupe_key(prefix: &str, stream: &str, idempotency_key: &str) -> String {
    format!("{prefix}{}:{stream}:{idempotency_key}", stream.len())
}

/// Reads one entry's reply: the entry id and whether it is a new entry.
fn entry_reply(reply: Value) -> Result<(String, bool), Failure> {
    let text = |bytes: Vec<u8>| {
        String::from_utf8(bytes)
            .map_err(|_| Failure::retryable(FailureClass::Other, "entry id is not UTF-8"))
    };
    match reply {
        Value::ServerError(error) => Err(classify_reply(
            error.code(),
            error.details().unwrap_or_default(),
        )),
        Value::BulkString(id) => Ok((text(id)?, true)),
        Value::SimpleString(id) => Ok((id, true)),
        Value::Array(items) => match <[Value; 2]>::try_from(items) {
            Ok([Value::BulkString(id), Value::Int(new)]) => Ok((text(id)?, new == 1)),
            Ok([Value::SimpleString(id), Value::Int(new)]) => Ok((id, new == 1)),
            other => Err(Failure::retryable(
                FailureClass::Other,
                format!("unexpected script reply {other:?}"),
            )),
        },
        other => Err(Failure::retryable(
            FailureClass::Other,
            format!("unexpected XADD reply {other:?}"),
        )),
    }
}

fn open_client(config: &RedisSinkConfig, url: &str) -> Result<redis::Client, RedisSinkError> {
    let invalid_url = |e: redis::RedisError| RedisSinkError::InvalidUrl {
        url: url.to_owned(),
        reason: e.to_string(),
    };
    #[cfg(any(feature = "tls-rustls", feature = "tls-native-tls"))]
    if config.tls_ca_file.is_some() || config.tls_cert_file.is_some() {
        let read = |setting: &'static str, path: &std::path::Path| {
            std::fs::read(path).map_err(|e| RedisSinkError::InvalidSetting {
                setting,
                reason: format!("cannot read {}: {e}", path.display()),
            })
        };
        let client_tls = match (&config.tls_cert_file, &config.tls_key_file) {
            (Some(cert), Some(key)) => Some(redis::ClientTlsConfig {
                client_cert: read("tls_cert_file", cert)?,
                client_key: read("tls_key_file", key)?,
            }),
            _ => None,
        };
        let root_cert = match &config.tls_ca_file {
            Some(ca) => Some(read("tls_ca_file", ca)?),
            None => None,
        };
        let certificates = redis::TlsCertificates {
            client_tls,
            root_cert,
        };
        return redis::Client::build_with_tls(config.url.as_str(), certificates)
            .map_err(invalid_url);
    }
    redis::Client::open(config.url.as_str()).map_err(invalid_url)
}

async fn load_script(conn: &mut ConnectionManager, script: &Script) -> redis::RedisResult<()> {
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(DEDUPE_SCRIPT)
        .query_async(conn)
        .await?;
    if sha != script.get_hash() {
        return Err(redis::RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "SCRIPT LOAD returned an unexpected hash",
            sha,
        )));
    }
    Ok(())
}

async fn check_durability(
    conn: &mut ConnectionManager,
    durability: Durability,
    version: (u32, u32),
    server_version: &str,
    replication: &str,
    url: &str,
) -> Result<(), RedisSinkError> {
    let unavailable = |reason: String| RedisSinkError::DurabilityUnavailable {
        requested: durability.describe(),
        url: url.to_owned(),
        reason,
    };
    let (replicas, mut probe) = match durability {
        Durability::None => return Ok(()),
        Durability::Wait { replicas, .. } => (replicas, redis::cmd("WAIT")),
        Durability::WaitAof {
            local, replicas, ..
        } => {
            if version < (7, 2) {
                return Err(unavailable(format!(
                    "WAITAOF needs Redis 7.2 or newer and this server is {server_version}; upgrade it, or choose Durability::Wait (replication only)"
                )));
            }
            if local {
                let persistence: String = redis::cmd("INFO")
                    .arg("persistence")
                    .query_async(conn)
                    .await
                    .map_err(|e| unavailable(format!("INFO persistence failed: {e}")))?;
                if info_field(&persistence, "aof_enabled") != Some("1") {
                    return Err(unavailable(
                        "a local fsync wait needs `appendonly yes` on the server".to_owned(),
                    ));
                }
            }
            let mut probe = redis::cmd("WAITAOF");
            probe.arg(u8::from(local));
            (replicas, probe)
        }
    };
    let connected: u32 = info_field(replication, "connected_slaves")
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    if connected < replicas {
        return Err(unavailable(format!(
            "it asks for {replicas} replica acknowledgement(s) and the server has {connected} connected replica(s)"
        )));
    }
    // Ask once, with nothing written yet on this connection: the server must accept the
    // command (renamed commands, ACLs, proxies that do not support it).
    probe
        .arg(replicas)
        .arg(millis(durability.timeout().unwrap_or_default()));
    probe
        .query_async::<Value>(conn)
        .await
        .map_err(|e| unavailable(format!("the server refused the wait command: {e}")))?;
    Ok(())
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// Reads `name:value` from an `INFO` reply.
fn info_field<'a>(info: &'a str, name: &str) -> Option<&'a str> {
    info.lines().find_map(|line| {
        line.strip_prefix(name)
            .and_then(|rest| rest.strip_prefix(':'))
            .map(str::trim)
    })
}

/// `7.0.15` → `(7, 0)`.
fn parse_version(text: &str) -> Option<(u32, u32)> {
    let mut parts = text.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

#[cfg(test)]
mod tests;
