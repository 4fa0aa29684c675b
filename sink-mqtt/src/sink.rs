//! The [`MqttSink`]: QoS 1 publishes, each message marked from its own `PUBACK`.
//!
//! rumqttc runs the protocol (connect, keep-alive, packet ids, flow control); the sink
//! drives one rumqttc event loop per connection and matches each `PUBACK` to its message:
//! rumqttc announces every publish it writes (`Outgoing::Publish(pkid)`) in the order the
//! publishes were handed to it, so the sink hands them over one at a time, queues each
//! message's waiter in the same order, and binds the waiter to the packet id when the
//! announcement comes. When the connection fails, the event loop is dropped with
//! everything it held, every waiting message fails retryably, and the next publish
//! connects afresh: nothing is re-sent behind the relay's back.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use outbox_engine::receive::fields::PREFIX as HEADER_PREFIX;
use outbox_engine::receive::metadata_fields;
use outbox_engine::{Failure, FailureClass, Message, Outcome, PublishContext, Sink};
use rumqttc::v5::mqttbytes::v5::{ConnectReturnCode, Packet, PubAckReason, PublishProperties};
use tokio::sync::oneshot;
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::config::{Checked, MqttSinkConfig, Protocol, check_topic};
use crate::error::{MqttSinkError, puback_failure};

/// The longest pause between two connection attempts.
const MAX_RECONNECT_PAUSE: Duration = Duration::from_secs(5);
/// Publishes rumqttc may hold before the sink waits to hand it more.
const REQUEST_QUEUE: usize = 1_000;
/// Room for the topic and properties above the payload (base64 in a 3.1.1 envelope) in
/// the largest packet the sink writes.
const PACKET_OVERHEAD: usize = 128 * 1024;

/// Publishes outbox messages to an MQTT broker with QoS 1.
///
/// Build one with [`connect`](Self::connect) (or [`from_url`](Self::from_url)), which
/// validates the configuration and connects, so a broker that refuses the login or the
/// protocol version fails the route at start-up. Clones share one connection (one client
/// id); after it fails, the next publish connects again, pausing between failed attempts
/// (up to 5 s), and messages that meet the pause fail as deferred, without using up an
/// attempt.
///
/// Each [`publish`](Sink::publish) hands the whole batch to the connection in order, then
/// waits for the `PUBACK`s. A message is published only on its `PUBACK` (on MQTT 5, with
/// a success reason code; `0x10`, no matching subscribers, counts as success: the broker
/// took the message). The session is clean: a relay that restarts re-sends from its table
/// what was not acknowledged, so the client keeps nothing to re-send itself. The receipt
/// is the topic.
///
/// ```no_run
/// use outbox_engine::{MemoryStore, Relay};
/// use outbox_sink_mqtt::{MqttSink, MqttSinkConfig};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let sink = MqttSink::connect(
///     MqttSinkConfig::new("mqtt://127.0.0.1:1883").topic("shop/{event_type}"),
/// )
/// .await?;
/// let store = MemoryStore::new();
/// let relay = Relay::builder(store).route("orders", sink).build()?;
/// relay.drain().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct MqttSink {
    inner: Arc<Inner>,
}

struct Inner {
    config: MqttSinkConfig,
    checked: Checked,
    /// The TLS client configuration, for `mqtts://`.
    tls: Option<Arc<rumqttc::tokio_rustls::rustls::ClientConfig>>,
    client_id: String,
    /// The URL with the password hidden, for messages.
    url: String,
    connection: tokio::sync::Mutex<Connection>,
}

/// The current session, and the record of failed attempts to open one.
#[derive(Default)]
struct Connection {
    session: Option<Arc<Session>>,
    failures: u32,
    /// When the last attempt failed, the (jittered) pause drawn then, and why.
    last_failure: Option<(Instant, Duration, String)>,
}

impl fmt::Debug for MqttSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MqttSink")
            .field("config", &self.inner.config)
            .field("client_id", &self.inner.client_id)
            .finish_non_exhaustive()
    }
}

impl MqttSink {
    /// Validates `config` and connects.
    ///
    /// # Errors
    ///
    /// An [`MqttSinkError`] saying what is wrong; the route must not start.
    pub async fn connect(config: MqttSinkConfig) -> Result<Self, MqttSinkError> {
        let checked = config.check()?;
        let client_id = if config.client_id.is_empty() {
            format!(
                "outbox-{:x}-{:06x}",
                std::process::id(),
                fastrand::u32(..0xff_ffff)
            )
        } else {
            config.client_id.clone()
        };
        let tls = if checked.tls {
            let client = config
                .tls_cert_file
                .as_deref()
                .zip(config.tls_key_file.as_deref());
            let tls = outbox_engine::tls::client_config(config.tls_ca_file.as_deref(), client)
                .map_err(|e| MqttSinkError::TlsFile {
                    setting: e.setting,
                    path: e.path,
                    reason: e.reason,
                })?;
            Some(Arc::new(tls))
        } else {
            None
        };
        let inner = Inner {
            url: outbox_engine::redact::url(&config.url),
            config,
            checked,
            tls,
            client_id,
            connection: tokio::sync::Mutex::new(Connection::default()),
        };
        let session = inner.open().await.map_err(|e| e.into_error(&inner.url))?;
        inner.connection.lock().await.session = Some(Arc::new(session));
        Ok(Self {
            inner: Arc::new(inner),
        })
    }

    /// [`MqttSinkConfig::from_url`] followed by [`connect`](Self::connect).
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), outbox_sink_mqtt::MqttSinkError> {
    /// let sink = outbox_sink_mqtt::MqttSink::from_url("mqtt://127.0.0.1:1883?topic=orders").await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As for [`MqttSinkConfig::from_url`] and [`connect`](Self::connect).
    pub async fn from_url(url: &str) -> Result<Self, MqttSinkError> {
        Self::connect(MqttSinkConfig::from_url(url)?).await
    }

    /// The configuration this sink runs with.
    pub fn config(&self) -> &MqttSinkConfig {
        &self.inner.config
    }

    /// The MQTT client identifier this sink connects with.
    pub fn client_id(&self) -> &str {
        &self.inner.client_id
    }
}

impl Sink for MqttSink {
    async fn publish(
        &self,
        batch: &[Message],
        cx: &PublishContext,
    ) -> Result<Vec<Outcome>, Failure> {
        Ok(self.inner.publish(batch, cx.deadline()).await)
    }
}

/// A message ready to hand over: where to, the payload and the MQTT 5 properties.
struct Prepared {
    index: usize,
    topic: String,
    payload: Bytes,
    properties: PublishProperties,
    /// The packet's size as written, for the broker's maximum.
    size: usize,
}

impl Inner {
    async fn publish(&self, batch: &[Message], deadline: Instant) -> Vec<Outcome> {
        let mut outcomes: Vec<Option<Outcome>> = vec![None; batch.len()];
        let mut ready = Vec::with_capacity(batch.len());
        for (index, message) in batch.iter().enumerate() {
            match self.prepare(index, message) {
                Ok(prepared) => ready.push(prepared),
                Err(failure) => outcomes[index] = Some(failure.into()),
            }
        }
        if ready.is_empty() {
            return finish(outcomes);
        }
        let session = match self.session(deadline).await {
            Ok(session) => session,
            Err(failure) => {
                for p in &ready {
                    outcomes[p.index] = Some(failure.clone().into());
                }
                return finish(outcomes);
            }
        };
        let mut waiting = Vec::with_capacity(ready.len());
        {
            let _one_sender = session.sending.lock().await;
            for p in ready {
                if let Some(max) = session.max_packet
                    && p.size > max
                {
                    outcomes[p.index] = Some(Outcome::permanent(
                        FailureClass::TooLarge,
                        format!(
                            "the message makes a {}-byte packet; the broker accepts at most {max} bytes",
                            p.size
                        ),
                    ));
                    continue;
                }
                let (tx, rx) = oneshot::channel();
                if let Err(reason) = session.expect(tx) {
                    outcomes[p.index] = Some(not_sent(&reason).into());
                    continue;
                }
                let handed = tokio::time::timeout_at(deadline, session.client.publish(&p)).await;
                match handed {
                    Ok(Ok(())) => waiting.push((p.index, p.topic, rx)),
                    Ok(Err(reason)) => {
                        session.forget_last();
                        outcomes[p.index] = Some(not_sent(&reason).into());
                    }
                    // Not handed over before the deadline: neither is the rest.
                    Err(_) => {
                        session.forget_last();
                        break;
                    }
                }
            }
        }
        for (index, topic, rx) in waiting {
            let Ok(answer) = tokio::time::timeout_at(deadline, rx).await else {
                break;
            };
            outcomes[index] = Some(match answer {
                Ok(Ok(())) => Outcome::published_with(topic),
                Ok(Err(failure)) => failure.into(),
                Err(_) => Outcome::retryable(
                    FailureClass::Connection,
                    "the connection closed before the PUBACK; the message may have arrived",
                ),
            });
        }
        finish(outcomes)
    }

    /// Checks and lays out one message; a failure here is the message's own and permanent.
    fn prepare(&self, index: usize, message: &Message) -> Result<Prepared, Failure> {
        if message.payload.len() > self.config.max_payload_bytes {
            return Err(Failure::permanent(
                FailureClass::TooLarge,
                format!(
                    "payload is {} bytes, the route's max_payload_bytes is {}",
                    message.payload.len(),
                    self.config.max_payload_bytes
                ),
            ));
        }
        let topic = self
            .checked
            .topic
            .render(message)
            .map_err(|e| Failure::permanent(FailureClass::Config, format!("topic {e}")))?;
        check_topic(&topic).map_err(|reason| Failure::permanent(FailureClass::Config, reason))?;

        let id = message.id.to_string();
        let mut fields: Vec<(String, String)> = metadata_fields(message, &id)
            .into_iter()
            .map(|(name, value)| (name.to_owned(), value.to_owned()))
            .collect();
        for (name, value) in &message.headers {
            if name
                .get(..HEADER_PREFIX.len())
                .is_some_and(|p| p.eq_ignore_ascii_case(HEADER_PREFIX))
            {
                return Err(Failure::permanent(
                    FailureClass::Serialization,
                    format!(
                        "header {name:?} uses the prefix `{HEADER_PREFIX}`, which the MQTT sink reserves for its own properties"
                    ),
                ));
            }
            fields.push((name.clone(), value.clone()));
        }
        if let Some((name, _)) = fields
            .iter()
            .find(|(name, value)| name.contains('\0') || value.contains('\0'))
        {
            return Err(Failure::permanent(
                FailureClass::Serialization,
                format!("header {name:?} holds NUL, which MQTT strings cannot carry"),
            ));
        }
        let (payload, properties) = match self.config.protocol {
            Protocol::V5 => {
                let properties = PublishProperties {
                    content_type: (!message.content_type.is_empty())
                        .then(|| message.content_type.clone()),
                    user_properties: fields,
                    ..PublishProperties::default()
                };
                (Bytes::copy_from_slice(&message.payload), properties)
            }
            Protocol::V311 => (
                crate::receive::envelope(&fields, &message.payload).into(),
                PublishProperties::default(),
            ),
        };
        let strings = |list: &[(String, String)]| -> usize {
            list.iter().map(|(n, v)| 5 + n.len() + v.len()).sum()
        };
        let size = 5
            + 2
            + topic.len()
            + 2
            + 4
            + strings(&properties.user_properties)
            + properties.content_type.as_ref().map_or(0, |c| 3 + c.len())
            + payload.len();
        // rumqttc fails the whole connection on a packet over its limit: refuse it here.
        if size > self.packet_limit() {
            return Err(Failure::permanent(
                FailureClass::TooLarge,
                format!(
                    "the message makes a {size}-byte packet (its headers and topic with the payload); the route allows {}",
                    self.packet_limit()
                ),
            ));
        }
        Ok(Prepared {
            index,
            topic,
            payload,
            properties,
            size,
        })
    }

    /// The largest packet the sink writes: the largest payload, as base64 in a 3.1.1
    /// envelope, with room for the topic and properties.
    fn packet_limit(&self) -> usize {
        self.config.max_payload_bytes.div_ceil(3) * 4 + PACKET_OVERHEAD
    }

    /// The open session, or a new one; while the last attempt's pause runs, a deferred
    /// failure instead.
    async fn session(&self, deadline: Instant) -> Result<Arc<Session>, Failure> {
        let mut connection = self.connection.lock().await;
        if let Some(session) = &connection.session
            && session.is_open()
        {
            return Ok(Arc::clone(session));
        }
        connection.session = None;
        if let Some((at, pause, last)) = &connection.last_failure {
            let pause = *pause;
            if at.elapsed() < pause {
                return Err(Failure::retryable(
                    FailureClass::Connection,
                    format!(
                        "not connected to the MQTT broker at {}; waiting before connecting again (last attempt: {last})",
                        self.url
                    ),
                )
                .deferred()
                .with_retry_after(pause - at.elapsed()));
            }
        }
        let attempt = tokio::time::timeout_at(deadline, self.open()).await;
        let failed = match attempt {
            Ok(Ok(session)) => {
                if connection.failures > 0 {
                    warn!(url = %self.url, after_failures = connection.failures, "reconnected to the MQTT broker");
                }
                connection.failures = 0;
                connection.last_failure = None;
                let session = Arc::new(session);
                connection.session = Some(Arc::clone(&session));
                return Ok(session);
            }
            Ok(Err(e)) => e.reason,
            Err(_) => "no CONNACK before the publish deadline".to_owned(),
        };
        connection.failures = connection.failures.saturating_add(1);
        let pause = outbox_engine::full_jitter(reconnect_pause(connection.failures));
        connection.last_failure = Some((Instant::now(), pause, failed.clone()));
        warn!(url = %self.url, error = %failed, failures = connection.failures, "cannot connect to the MQTT broker");
        Err(Failure::retryable(
            FailureClass::Connection,
            format!(
                "cannot connect to the MQTT broker at {}: {failed}",
                self.url
            ),
        )
        .deferred()
        .with_retry_after(pause))
    }

    /// Connects, waits for the `CONNACK`, and starts the task that drives the
    /// connection.
    async fn open(&self) -> Result<Session, Refused> {
        let limit = self.config.connect_timeout;
        let seconds = limit.as_secs().max(1);
        let (host, port) = (self.checked.host.clone(), self.checked.port);
        let keep_alive = self.config.keep_alive;
        let packet = self.packet_limit();
        let flight = Arc::new(Mutex::new(Flight::default()));
        let (client, max_packet, driver) = match self.config.protocol {
            Protocol::V5 => {
                let mut options = rumqttc::v5::MqttOptions::new(&self.client_id, host, port);
                options
                    .set_keep_alive(keep_alive)
                    .set_clean_start(true)
                    .set_connection_timeout(seconds)
                    .set_max_packet_size(Some(1024 * 1024));
                if let Some((user, password)) = &self.checked.login {
                    options.set_credentials(user, password);
                }
                if let Some(tls) = &self.tls {
                    options.set_transport(transport(tls));
                }
                let (client, mut events) = rumqttc::v5::AsyncClient::new(options, REQUEST_QUEUE);
                let first = tokio::time::timeout(limit, events.poll()).await;
                let first = match first {
                    Ok(Ok(rumqttc::v5::Event::Incoming(Packet::ConnAck(ack)))) => {
                        if ack.code != ConnectReturnCode::Success {
                            return Err(Refused::code(format!("{:?}", ack.code), false));
                        }
                        Ok(ack.properties.and_then(|p| p.max_packet_size))
                    }
                    Ok(Ok(other)) => {
                        Err(Refused::other(format!("expected CONNACK, got {other:?}")))
                    }
                    Ok(Err(rumqttc::v5::ConnectionError::ConnectionRefused(code))) => {
                        Err(Refused::v5(code))
                    }
                    Ok(Err(e)) => Err(Refused::other(e.to_string())),
                    Err(_) => Err(Refused::other(format!("no CONNACK within {limit:?}"))),
                }?;
                let driver = tokio::spawn(drive_v5(events, Arc::clone(&flight), self.url.clone()));
                (Client::V5(client), first, driver)
            }
            Protocol::V311 => {
                let mut options = rumqttc::MqttOptions::new(&self.client_id, host, port);
                options
                    .set_keep_alive(keep_alive)
                    .set_clean_session(true)
                    .set_max_packet_size(1024 * 1024, packet);
                if let Some((user, password)) = &self.checked.login {
                    options.set_credentials(user, password);
                }
                if let Some(tls) = &self.tls {
                    options.set_transport(transport(tls));
                }
                let (client, mut events) = rumqttc::AsyncClient::new(options, REQUEST_QUEUE);
                let first = tokio::time::timeout(limit, events.poll()).await;
                let first = match first {
                    Ok(Ok(rumqttc::Event::Incoming(rumqttc::Packet::ConnAck(ack)))) => {
                        if ack.code != rumqttc::ConnectReturnCode::Success {
                            return Err(Refused::code(format!("{:?}", ack.code), false));
                        }
                        Ok(None)
                    }
                    Ok(Ok(other)) => {
                        Err(Refused::other(format!("expected CONNACK, got {other:?}")))
                    }
                    Ok(Err(rumqttc::ConnectionError::ConnectionRefused(code))) => {
                        Err(Refused::v4(code))
                    }
                    Ok(Err(e)) => Err(Refused::other(e.to_string())),
                    Err(_) => Err(Refused::other(format!("no CONNACK within {limit:?}"))),
                }?;
                let driver = tokio::spawn(drive_v4(events, Arc::clone(&flight), self.url.clone()));
                (Client::V4(client), first, driver)
            }
        };
        Ok(Session {
            client,
            flight,
            sending: tokio::sync::Mutex::new(()),
            max_packet: max_packet.map(|m| m as usize),
            driver: driver.abort_handle(),
        })
    }
}

fn transport(tls: &Arc<rumqttc::tokio_rustls::rustls::ClientConfig>) -> rumqttc::Transport {
    rumqttc::Transport::tls_with_config(rumqttc::TlsConfiguration::Rustls(Arc::clone(tls)))
}

fn finish(outcomes: Vec<Option<Outcome>>) -> Vec<Outcome> {
    outcomes
        .into_iter()
        .map(|outcome| {
            outcome.unwrap_or_else(|| {
                Outcome::retryable(
                    FailureClass::Timeout,
                    "no PUBACK before the publish deadline; the message may have arrived",
                )
            })
        })
        .collect()
}

/// The failure of a message that was never handed to the connection.
fn not_sent(reason: &str) -> Failure {
    Failure::retryable(
        FailureClass::Connection,
        format!("not sent: the connection to the MQTT broker closed ({reason})"),
    )
    .deferred()
    .with_retry_after(Duration::from_millis(100))
}

fn reconnect_pause(failures: u32) -> Duration {
    let exp = failures.saturating_sub(1).min(6);
    (Duration::from_millis(100) * 2u32.pow(exp)).min(MAX_RECONNECT_PAUSE)
}

/// Why a connection could not be opened.
struct Refused {
    reason: String,
    retryable: bool,
}

impl Refused {
    fn other(reason: String) -> Self {
        Self {
            reason,
            retryable: true,
        }
    }

    fn code(code: String, retryable: bool) -> Self {
        Self {
            reason: format!("the broker refused the connection: {code}"),
            retryable,
        }
    }

    fn v5(code: ConnectReturnCode) -> Self {
        use ConnectReturnCode as C;
        let retryable = matches!(
            code,
            C::ServerUnavailable
                | C::ServerBusy
                | C::ServiceUnavailable
                | C::ConnectionRateExceeded
                | C::QuotaExceeded
                | C::UnspecifiedError
                | C::ImplementationSpecificError
        );
        let hint = if matches!(
            code,
            C::UnsupportedProtocolVersion | C::RefusedProtocolVersion
        ) {
            " (the broker does not speak MQTT 5: set protocol = \"3.1.1\")"
        } else {
            ""
        };
        Self::code(format!("{code:?}{hint}"), retryable)
    }

    fn v4(code: rumqttc::ConnectReturnCode) -> Self {
        let retryable = code == rumqttc::ConnectReturnCode::ServiceUnavailable;
        Self::code(format!("{code:?}"), retryable)
    }

    fn into_error(self, url: &str) -> MqttSinkError {
        MqttSinkError::Connect {
            url: url.to_owned(),
            reason: self.reason,
            retryable: self.retryable,
        }
    }
}

/// A client of either protocol version.
enum Client {
    V5(rumqttc::v5::AsyncClient),
    V4(rumqttc::AsyncClient),
}

impl Client {
    /// Hands `p` to the event loop (QoS 1, not retained).
    async fn publish(&self, p: &Prepared) -> Result<(), String> {
        match self {
            Self::V5(client) => client
                .publish_with_properties(
                    p.topic.clone(),
                    rumqttc::v5::mqttbytes::QoS::AtLeastOnce,
                    false,
                    p.payload.clone(),
                    p.properties.clone(),
                )
                .await
                .map_err(|e| e.to_string()),
            Self::V4(client) => client
                .publish_bytes(
                    p.topic.clone(),
                    rumqttc::QoS::AtLeastOnce,
                    false,
                    p.payload.clone(),
                )
                .await
                .map_err(|e| e.to_string()),
        }
    }
}

/// What a message waits on: `Ok` on its `PUBACK`, or why it failed.
type Waiter = oneshot::Sender<Result<(), Failure>>;

/// One connection: its client, the messages waiting for an announcement or an ack, and
/// the task that drives it (aborted when the session is dropped).
struct Session {
    client: Client,
    flight: Arc<Mutex<Flight>>,
    /// One batch hands its messages over at a time, so that the waiters queue in the
    /// order rumqttc announces the publishes.
    sending: tokio::sync::Mutex<()>,
    /// The broker's maximum packet size, when it announced one (MQTT 5).
    max_packet: Option<usize>,
    driver: tokio::task::AbortHandle,
}

impl Drop for Session {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

#[derive(Default)]
struct Flight {
    /// Messages handed over whose publish rumqttc has not announced yet, in order.
    queued: VecDeque<Waiter>,
    /// Announced messages by packet id, waiting for their `PUBACK`.
    sent: HashMap<u16, Waiter>,
    /// Why the connection closed, once it did.
    closed: Option<String>,
}

impl Session {
    fn is_open(&self) -> bool {
        self.lock().closed.is_none()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Flight> {
        self.flight.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues the waiter of a message about to be handed over.
    fn expect(&self, waiter: Waiter) -> Result<(), String> {
        let mut flight = self.lock();
        if let Some(reason) = &flight.closed {
            return Err(reason.clone());
        }
        flight.queued.push_back(waiter);
        Ok(())
    }

    /// Takes back the waiter of the message just queued, which was not handed over.
    fn forget_last(&self) {
        self.lock().queued.pop_back();
    }
}

/// What the driver saw.
enum Seen {
    Sent(u16),
    Acked(u16, Result<(), Failure>),
    Other,
}

impl Flight {
    fn see(&mut self, seen: Seen) {
        match seen {
            Seen::Sent(pkid) => {
                if let Some(waiter) = self.queued.pop_front() {
                    self.sent.insert(pkid, waiter);
                }
            }
            Seen::Acked(pkid, result) => {
                if let Some(waiter) = self.sent.remove(&pkid) {
                    let _ = waiter.send(result);
                }
            }
            Seen::Other => {}
        }
    }

    /// Ends the session: every waiting message fails retryably.
    fn close(&mut self, reason: String) {
        let failure = Failure::retryable(
            FailureClass::Connection,
            format!(
                "the connection closed before the PUBACK ({reason}); the message may have arrived"
            ),
        );
        for waiter in self
            .queued
            .drain(..)
            .chain(self.sent.drain().map(|(_, w)| w))
        {
            let _ = waiter.send(Err(failure.clone()));
        }
        self.closed = Some(reason);
    }
}

async fn drive_v5(mut events: rumqttc::v5::EventLoop, flight: Arc<Mutex<Flight>>, url: String) {
    use rumqttc::v5::{Event, mqttbytes::v5::Packet as P};
    loop {
        let seen = match events.poll().await {
            Ok(Event::Outgoing(rumqttc::Outgoing::Publish(pkid))) => Seen::Sent(pkid),
            Ok(Event::Incoming(P::PubAck(ack))) => Seen::Acked(
                ack.pkid,
                match ack.reason {
                    PubAckReason::Success | PubAckReason::NoMatchingSubscribers => Ok(()),
                    other => Err(puback_failure(reason_code(other))),
                },
            ),
            Ok(Event::Incoming(P::Disconnect(disconnect))) => {
                close(
                    &flight,
                    &url,
                    format!("the broker disconnected: {:?}", disconnect.reason_code),
                );
                return;
            }
            Ok(_) => Seen::Other,
            Err(e) => {
                close(&flight, &url, e.to_string());
                return;
            }
        };
        flight.lock().unwrap_or_else(|e| e.into_inner()).see(seen);
    }
}

async fn drive_v4(mut events: rumqttc::EventLoop, flight: Arc<Mutex<Flight>>, url: String) {
    use rumqttc::{Event, Outgoing, Packet as P};
    loop {
        let seen = match events.poll().await {
            Ok(Event::Outgoing(Outgoing::Publish(pkid))) => Seen::Sent(pkid),
            Ok(Event::Incoming(P::PubAck(ack))) => Seen::Acked(ack.pkid, Ok(())),
            Ok(_) => Seen::Other,
            Err(e) => {
                close(&flight, &url, e.to_string());
                return;
            }
        };
        flight.lock().unwrap_or_else(|e| e.into_inner()).see(seen);
    }
}

fn close(flight: &Mutex<Flight>, url: &str, reason: String) {
    debug!(url = %url, reason = %reason, "MQTT connection closed");
    flight
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .close(reason);
}

/// The wire value of a `PUBACK` reason.
fn reason_code(reason: PubAckReason) -> u8 {
    match reason {
        PubAckReason::Success => 0x00,
        PubAckReason::NoMatchingSubscribers => 0x10,
        PubAckReason::UnspecifiedError => 0x80,
        PubAckReason::ImplementationSpecificError => 0x83,
        PubAckReason::NotAuthorized => 0x87,
        PubAckReason::TopicNameInvalid => 0x90,
        PubAckReason::PacketIdentifierInUse => 0x91,
        PubAckReason::QuotaExceeded => 0x97,
        PubAckReason::PayloadFormatInvalid => 0x99,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acks_meet_their_own_messages_and_a_close_fails_the_rest() {
        let mut flight = Flight::default();
        let (a, mut a_rx) = oneshot::channel();
        let (b, mut b_rx) = oneshot::channel();
        let (c, mut c_rx) = oneshot::channel();
        flight.queued.extend([a, b, c]);
        flight.see(Seen::Sent(7));
        flight.see(Seen::Sent(3));
        flight.see(Seen::Acked(3, Ok(())));
        assert!(
            matches!(b_rx.try_recv(), Ok(Ok(()))),
            "the second message's ack"
        );
        assert!(a_rx.try_recv().is_err(), "the first still waits");
        flight.close("reset".to_owned());
        assert!(matches!(a_rx.try_recv(), Ok(Err(f)) if f.retryable));
        assert!(matches!(c_rx.try_recv(), Ok(Err(f)) if f.retryable));
        assert!(flight.closed.is_some());
    }

    #[test]
    fn reconnect_pauses_grow_and_stop_at_the_cap() {
        assert_eq!(reconnect_pause(1), Duration::from_millis(100));
        assert_eq!(reconnect_pause(40), MAX_RECONNECT_PAUSE);
    }
}
