//! The [`AmqpSink`]: pipelined publishes per batch, each marked from its own confirm.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use lapin::message::BasicReturnMessage;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions};
use lapin::tcp::{OwnedIdentity, OwnedTLSConfig};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{
    BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, ExchangeKind,
    PublisherConfirm,
};
use outbox_engine::receive::fields::{self, PREFIX as HEADER_PREFIX};
use outbox_engine::receive::metadata_fields;
use outbox_engine::{Failure, FailureClass, Message, Outcome, PublishContext, Sink};
use tokio::sync::Mutex;
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::config::{AmqpSinkConfig, Checked, MAX_NAME_BYTES};
use crate::error::{AmqpSinkError, classify};

/// The longest pause between two reconnection attempts.
const MAX_RECONNECT_PAUSE: Duration = Duration::from_secs(5);

/// Publishes outbox messages to RabbitMQ (or any AMQP 0-9-1 broker with publisher
/// confirms).
///
/// Build one with [`connect`](Self::connect) (or [`from_url`](Self::from_url)), which
/// validates the configuration, connects, and checks that a fixed exchange exists, so a
/// misconfigured route fails at start-up instead of at the first batch. Clones share one
/// connection; each concurrent publish takes a channel of its own (in confirm mode) from
/// a small pool. After the broker closes the connection (a restart, an operator, a missed
/// heartbeat) the next publish reconnects, pausing between failed attempts (up to 5 s);
/// messages that meet a closed connection fail retryably and the relay tries them again.
///
/// Each [`publish`](Sink::publish) sends the whole batch on one channel without waiting
/// between messages, then collects the publisher confirms. A message is published only
/// when the broker acknowledged it **and** did not return it: every message is sent with
/// `mandatory`, so one that no queue receives comes back (`basic.return`) and is
/// dead-lettered as unroutable instead of being marked published on the broker's ack.
/// Outcomes are reported together once the batch's last confirm arrived. A message still
/// unsettled at the publish deadline fails retryably as a timeout; that includes a message
/// whose ack came while others of its batch were still out, because a `basic.return` for
/// it could still be on its way.
///
/// ```no_run
/// use outbox_engine::{MemoryStore, Relay};
/// use outbox_sink_amqp::{AmqpSink, AmqpSinkConfig};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let sink = AmqpSink::connect(
///     AmqpSinkConfig::new("amqp://guest:guest@127.0.0.1:5672/%2f")
///         .exchange("shop")
///         .routing_key("{event_type}"),
/// )
/// .await?;
/// let store = MemoryStore::new();
/// let relay = Relay::builder(store).route("orders", sink).build()?;
/// relay.drain().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct AmqpSink {
    inner: Arc<Inner>,
}

struct Inner {
    config: AmqpSinkConfig,
    checked: Checked,
    tls: OwnedTLSConfig,
    /// The URL with the password hidden, for messages.
    url: String,
    state: Mutex<State>,
}

/// The connection and its idle channels; `None` until (re)connected.
#[derive(Default)]
struct State {
    connection: Option<Connection>,
    idle: Vec<Channel>,
    /// Exchanges known to exist (checked once each; forgotten after a `404`).
    exchanges: HashSet<String>,
    /// Consecutive failed connection attempts, and when the last one ended.
    failures: u32,
    /// When the last attempt failed, the (jittered) pause drawn then, and why.
    last_failure: Option<(Instant, Duration, String)>,
}

impl fmt::Debug for AmqpSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AmqpSink")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl AmqpSink {
    /// Validates `config`, connects, and checks the broker.
    ///
    /// Start-up checks: the TLS files (if any) can be read; the broker accepts the
    /// credentials and the vhost; a channel can enter confirm mode; a fixed, non-default
    /// exchange exists (a passive declare, which creates nothing).
    ///
    /// # Errors
    ///
    /// An [`AmqpSinkError`] saying what is wrong; the route must not start.
    pub async fn connect(config: AmqpSinkConfig) -> Result<Self, AmqpSinkError> {
        let checked = config.check()?;
        let tls = tls_config(&config)?;
        let url = outbox_engine::redact::url(&config.url);
        let inner = Inner {
            config,
            checked,
            tls,
            url,
            state: Mutex::new(State::default()),
        };
        let deadline = Instant::now() + inner.config.connect_timeout;
        let connect_error = |source| AmqpSinkError::Connect {
            url: inner.url.clone(),
            source,
        };
        let started = tokio::time::timeout_at(deadline, inner.start_up()).await;
        match started {
            Ok(Ok(())) => Ok(Self {
                inner: Arc::new(inner),
            }),
            Ok(Err(StartUp::ExchangeNotFound(exchange))) => Err(AmqpSinkError::ExchangeNotFound {
                exchange,
                url: inner.url.clone(),
            }),
            Ok(Err(StartUp::Client(source))) => Err(connect_error(source)),
            Err(_) => Err(connect_error(timed_out(
                "the broker did not finish start-up",
            ))),
        }
    }

    /// [`AmqpSinkConfig::from_url`] followed by [`connect`](Self::connect).
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), outbox_sink_amqp::AmqpSinkError> {
    /// let sink = outbox_sink_amqp::AmqpSink::from_url(
    ///     "amqp://guest:guest@127.0.0.1:5672/%2f?exchange=shop&routing_key={event_type}",
    /// )
    /// .await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As for [`AmqpSinkConfig::from_url`] and [`connect`](Self::connect).
    pub async fn from_url(url: &str) -> Result<Self, AmqpSinkError> {
        Self::connect(AmqpSinkConfig::from_url(url)?).await
    }

    /// The configuration this sink runs with.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), outbox_sink_amqp::AmqpSinkError> {
    /// let sink = outbox_sink_amqp::AmqpSink::from_url("amqp://127.0.0.1/%2f?routing_key=orders").await?;
    /// assert_eq!(sink.config().routing_key, "orders");
    /// # Ok(())
    /// # }
    /// ```
    pub fn config(&self) -> &AmqpSinkConfig {
        &self.inner.config
    }
}

impl Sink for AmqpSink {
    /// Reports the whole batch when its last confirm arrived (or the deadline passed):
    /// the confirms of one batch arrive within milliseconds of each other, and one
    /// completion per batch costs the store far less than one per confirm.
    async fn publish(
        &self,
        batch: &[Message],
        cx: &PublishContext,
    ) -> Result<Vec<Outcome>, Failure> {
        let slots = std::sync::Mutex::new(vec![None; batch.len()]);
        let report = |index: usize, outcome: Outcome| {
            slots.lock().unwrap_or_else(|e| e.into_inner())[index] = Some(outcome);
        };
        let publish = self.inner.publish(batch, cx.deadline(), &report);
        // Cut short at the deadline: what was settled by then is kept.
        let _ = tokio::time::timeout_at(cx.deadline(), publish).await;
        let slots = slots.into_inner().unwrap_or_else(|e| e.into_inner());
        Ok(slots
            .into_iter()
            .map(|slot| {
                slot.unwrap_or_else(|| {
                    Outcome::retryable(
                        FailureClass::Timeout,
                        "no publisher confirm before the publish deadline; the message may have reached the broker",
                    )
                })
            })
            .collect())
    }
}

/// The size of the content header frame that carries `properties`, in bytes, as AMQP
/// 0-9-1 encodes the properties this sink sets: the frame's 8 bytes of framing, 14 of
/// class, weight, body size and property flags, then each property present.
fn header_frame_bytes(properties: &BasicProperties) -> usize {
    let short = |s: Option<&ShortString>| s.map_or(0, |s| 1 + s.as_str().len());
    let headers = properties.headers().as_ref().map_or(0, |table| {
        4 + table
            .inner()
            .iter()
            .map(|(name, value)| {
                1 + name.as_str().len()
                    + match value {
                        AMQPValue::LongString(s) => 1 + 4 + s.as_bytes().len(),
                        // The sink writes long strings only; anything else, generously.
                        _ => 1 + 4 + 256,
                    }
            })
            .sum::<usize>()
    });
    8 + 14
        + short(properties.content_type().as_ref())
        + headers
        + usize::from(properties.delivery_mode().is_some())
        + short(properties.message_id().as_ref())
        + 8 * usize::from(properties.timestamp().is_some())
        + short(properties.kind().as_ref())
}

fn too_large_for_a_frame(bytes: usize, frame_max: u32) -> Failure {
    Failure::permanent(
        FailureClass::TooLarge,
        format!(
            "the message's AMQP properties (its headers) need a {bytes}-byte header frame; the broker's frame size (frame_max) is {frame_max} bytes"
        ),
    )
}

/// A message ready to send: where to, and the AMQP properties.
struct Prepared {
    index: usize,
    exchange: String,
    routing_key: String,
    properties: BasicProperties,
}

impl Inner {
    async fn publish(
        &self,
        batch: &[Message],
        deadline: Instant,
        report: &(dyn Fn(usize, Outcome) + Sync),
    ) {
        let mut ready = Vec::with_capacity(batch.len());
        for (index, message) in batch.iter().enumerate() {
            match self.prepare(index, message) {
                Ok(prepared) => ready.push(prepared),
                Err(failure) => report(index, failure.into()),
            }
        }
        if ready.is_empty() {
            return;
        }
        let channel = {
            let mut state = self.state.lock().await;
            if let Err(e) = self
                .check_exchanges(&mut state, &mut ready, deadline, report)
                .await
            {
                let failure = not_sent(&state, &e);
                for p in &ready {
                    report(p.index, failure.clone().into());
                }
                return;
            }
            if ready.is_empty() {
                return;
            }
            match self.channel(&mut state, deadline).await {
                Ok(channel) => {
                    // The properties travel in one frame: a larger one makes the broker
                    // close the whole connection, so it is refused here, alone.
                    let frame_max = state
                        .connection
                        .as_ref()
                        .map(|c| c.configuration().frame_max());
                    if let Some(frame_max) = frame_max.filter(|&f| f > 0) {
                        ready.retain(|p| match header_frame_bytes(&p.properties) {
                            bytes if bytes > frame_max as usize => {
                                report(p.index, too_large_for_a_frame(bytes, frame_max).into());
                                false
                            }
                            _ => true,
                        });
                    }
                    if ready.is_empty() {
                        self.give_back(channel).await;
                        return;
                    }
                    channel
                }
                Err(e) => {
                    let failure = not_sent(&state, &e);
                    for p in &ready {
                        report(p.index, failure.clone().into());
                    }
                    return;
                }
            }
        };

        // Send everything, then collect the confirms in order.
        let mut pending = Vec::with_capacity(ready.len());
        let mut broken: Option<lapin::Error> = None;
        for p in &ready {
            if broken.is_some() {
                pending.push((p, None));
                continue;
            }
            match self.send(&channel, p, &batch[p.index]).await {
                Ok(confirm) => pending.push((p, Some(confirm))),
                Err(e) => {
                    broken = Some(e);
                    pending.push((p, None));
                }
            }
        }
        let mut confirmed = Vec::with_capacity(pending.len());
        let mut isolate = Vec::new();
        for (p, confirm) in pending {
            match confirm {
                Some(confirm) => match confirm.await {
                    Ok(confirmation) => confirmed.push((p, confirmation)),
                    Err(_) => isolate.push(p),
                },
                None => isolate.push(p),
            }
        }
        // lapin hands a `basic.return` to whichever confirm resolves next, which under a
        // `multiple` ack may be another message's: match returns to messages by id, once
        // every confirm of the batch is in.
        for (p, confirmation) in settle(confirmed, batch) {
            report(p.index, confirmation);
        }
        if isolate.is_empty() {
            self.give_back(channel).await;
            return;
        }

        // The channel (or the connection) closed under the batch. Send the messages
        // that got no confirm again one at a time, so each gets its own answer.
        debug!(
            url = %self.url,
            messages = isolate.len(),
            "channel closed during a batch; sending its unconfirmed messages one by one"
        );
        drop(channel);
        for p in isolate {
            let result = async {
                let mut state = self.state.lock().await;
                let channel = self.channel(&mut state, deadline).await?;
                drop(state);
                let confirm = self.send(&channel, p, &batch[p.index]).await?;
                let confirmation = confirm.await?;
                self.give_back(channel).await;
                Ok::<_, lapin::Error>(confirmation)
            }
            .await;
            let outcome = match result {
                Ok(confirmation) => settle(vec![(p, confirmation)], batch)
                    .pop()
                    .map(|(_, outcome)| outcome)
                    .expect("one in, one out"),
                Err(e) if self.connected().await => {
                    let failure = classify(&e);
                    if failure.class == FailureClass::Config {
                        // Perhaps the exchange was deleted: check it again next time.
                        self.state.lock().await.exchanges.remove(&p.exchange);
                    }
                    Outcome::Failed(failure)
                }
                // The broker closed the connection and said why: not the network's doing.
                Err(e) if matches!(e.kind(), lapin::ErrorKind::ProtocolError(_)) => {
                    Outcome::Failed(classify(&e))
                }
                Err(e) => Outcome::Failed(Failure::retryable(
                    FailureClass::Connection,
                    format!("connection to {} lost: {e}", self.url),
                )),
            };
            report(p.index, outcome);
        }
    }

    /// Makes sure every exchange the batch names exists before anything is sent: a
    /// publish to a missing exchange closes its channel, failing the whole batch's
    /// unconfirmed messages (and lapin may then send queued publishes after the
    /// `close-ok`, which makes the broker close the connection). Each new name is
    /// checked once with a passive declare on a channel of its own; messages for a
    /// missing one fail retryably here and leave `ready`.
    async fn check_exchanges(
        &self,
        state: &mut State,
        ready: &mut Vec<Prepared>,
        deadline: Instant,
        report: &(dyn Fn(usize, Outcome) + Sync),
    ) -> Result<(), lapin::Error> {
        let mut missing = HashSet::new();
        for p in ready.iter() {
            if p.exchange.is_empty()
                || state.exchanges.contains(&p.exchange)
                || missing.contains(&p.exchange)
            {
                continue;
            }
            let channel = self.channel(state, deadline).await?;
            let passive = ExchangeDeclareOptions {
                passive: true,
                ..ExchangeDeclareOptions::default()
            };
            let limit = deadline.min(Instant::now() + self.config.connect_timeout);
            let declared = tokio::time::timeout_at(
                limit,
                channel.exchange_declare(
                    p.exchange.as_str().into(),
                    ExchangeKind::Direct,
                    passive,
                    FieldTable::default(),
                ),
            )
            .await
            .map_err(|_| timed_out("checking an exchange timed out"))?;
            match declared {
                Ok(()) => {
                    state.exchanges.insert(p.exchange.clone());
                    state.idle.push(channel);
                }
                Err(e) if e.is_amqp_soft_error() => {
                    missing.insert(p.exchange.clone());
                }
                Err(e) => return Err(e),
            }
        }
        ready.retain(|p| {
            if !missing.contains(&p.exchange) {
                return true;
            }
            report(
                p.index,
                Outcome::retryable(
                    FailureClass::Config,
                    format!(
                        "exchange {:?} does not exist on the broker (404 NOT_FOUND); declare it, or fix the route's exchange template",
                        p.exchange
                    ),
                ),
            );
            false
        });
        Ok(())
    }

    /// Checks and renders one message; a failure here is the message's own and permanent.
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
        let render = |what: &str, template: &outbox_engine::template::Template| {
            let name = template
                .render(message)
                .map_err(|e| Failure::permanent(FailureClass::Config, format!("{what} {e}")))?;
            if name.len() > MAX_NAME_BYTES {
                return Err(Failure::permanent(
                    FailureClass::Config,
                    format!(
                        "{what} rendered from {:?} is {} bytes, AMQP allows {MAX_NAME_BYTES}",
                        template.as_str(),
                        name.len()
                    ),
                ));
            }
            Ok(name)
        };
        let exchange = render("exchange", &self.checked.exchange)?;
        let routing_key = render("routing key", &self.checked.routing_key)?;

        let mut headers = FieldTable::default();
        let id = message.id.to_string();
        // The id, event type and content type travel as AMQP properties instead.
        let in_properties = [fields::ID, fields::EVENT_TYPE, fields::CONTENT_TYPE];
        for (name, value) in metadata_fields(message, &id)
            .into_iter()
            .filter(|(name, _)| !in_properties.contains(name))
        {
            headers.insert(name.into(), AMQPValue::LongString(LongString::from(value)));
        }
        let short = |what: &str, text: &str| {
            ShortString::try_new(text).map_err(|_| {
                Failure::permanent(
                    FailureClass::Serialization,
                    format!(
                        "{what} is {} bytes, AMQP allows {MAX_NAME_BYTES}",
                        text.len()
                    ),
                )
            })
        };
        for (name, value) in &message.headers {
            if name
                .get(..HEADER_PREFIX.len())
                .is_some_and(|p| p.eq_ignore_ascii_case(HEADER_PREFIX))
            {
                return Err(Failure::permanent(
                    FailureClass::Serialization,
                    format!(
                        "header {name:?} uses the prefix `{HEADER_PREFIX}`, which the AMQP sink reserves for its own headers"
                    ),
                ));
            }
            headers.insert(
                short("a header name", name)?,
                AMQPValue::LongString(LongString::from(value.as_str())),
            );
        }
        let timestamp = u64::try_from(message.created_at.timestamp()).unwrap_or(0);
        let mut properties = BasicProperties::default()
            .with_message_id(ShortString::from(id))
            .with_type(short("the event type", &message.event_type)?)
            .with_timestamp(timestamp)
            .with_headers(headers);
        if !message.content_type.is_empty() && message.content_type.len() <= MAX_NAME_BYTES {
            properties = properties.with_content_type(message.content_type.as_str().into());
        }
        if self.config.persistent {
            properties = properties.with_delivery_mode(2);
        }
        Ok(Prepared {
            index,
            exchange,
            routing_key,
            properties,
        })
    }

    async fn send(
        &self,
        channel: &Channel,
        p: &Prepared,
        message: &Message,
    ) -> Result<PublisherConfirm, lapin::Error> {
        channel
            .basic_publish(
                p.exchange.as_str().into(),
                p.routing_key.as_str().into(),
                BasicPublishOptions {
                    mandatory: true,
                    ..BasicPublishOptions::default()
                },
                &message.payload,
                p.properties.clone(),
            )
            .await
    }

    async fn connected(&self) -> bool {
        let state = self.state.lock().await;
        state
            .connection
            .as_ref()
            .is_some_and(|c| c.status().connected())
    }

    /// An idle channel in confirm mode, (re)connecting first if needed. Refused while the
    /// broker blocks publishers; opening a channel is bounded by the deadline.
    async fn channel(&self, state: &mut State, deadline: Instant) -> Result<Channel, lapin::Error> {
        if !state
            .connection
            .as_ref()
            .is_some_and(|c| c.status().connected())
        {
            state.idle.clear();
            state.connection = None;
            let connection = self.reconnect(state, deadline).await?;
            state.connection = Some(connection);
        }
        let connection = state.connection.as_ref().expect("connected above");
        if connection.status().blocked() {
            return Err(lapin::Error::from(std::io::Error::other(BLOCKED)));
        }
        while let Some(channel) = state.idle.pop() {
            if channel.status().connected() {
                return Ok(channel);
            }
        }
        let limit = deadline.min(Instant::now() + self.config.connect_timeout);
        let open = async {
            let channel = connection.create_channel().await?;
            channel
                .confirm_select(ConfirmSelectOptions::default())
                .await?;
            Ok(channel)
        };
        match tokio::time::timeout_at(limit, open).await {
            Ok(result) => result,
            Err(_) => Err(timed_out("opening a channel timed out")),
        }
    }

    /// The start-up checks of [`AmqpSink::connect`].
    async fn start_up(&self) -> Result<(), StartUp> {
        let far = Instant::now() + self.config.connect_timeout;
        let channel = {
            let mut state = self.state.lock().await;
            self.channel(&mut state, far)
                .await
                .map_err(StartUp::Client)?
        };
        if let Some(exchange) = self.checked.exchange.fixed().filter(|e| !e.is_empty()) {
            let passive = ExchangeDeclareOptions {
                passive: true,
                ..ExchangeDeclareOptions::default()
            };
            let declared = channel
                .exchange_declare(
                    exchange.as_str().into(),
                    ExchangeKind::Direct,
                    passive,
                    FieldTable::default(),
                )
                .await;
            match declared {
                Ok(()) => {
                    self.state.lock().await.exchanges.insert(exchange);
                }
                Err(e) if e.is_amqp_soft_error() => {
                    return Err(StartUp::ExchangeNotFound(exchange));
                }
                Err(e) => return Err(StartUp::Client(e)),
            }
        }
        self.give_back(channel).await;
        Ok(())
    }

    async fn reconnect(
        &self,
        state: &mut State,
        deadline: Instant,
    ) -> Result<Connection, lapin::Error> {
        if let Some((at, pause, last)) = &state.last_failure
            && at.elapsed() < *pause
        {
            return Err(lapin::Error::from(std::io::Error::other(format!(
                "{WAITING}: the last attempt failed {} ms ago ({last})",
                at.elapsed().as_millis()
            ))));
        }
        let limit = deadline.min(Instant::now() + self.config.connect_timeout);
        let properties = ConnectionProperties::default()
            .with_connection_name(format!("outbox-relay-{}", std::process::id()).into());
        let runtime = lapin::runtime::default_runtime()?;
        let attempt = Connection::connect_uri_with_config(
            self.checked.uri.clone(),
            properties,
            self.tls.clone(),
            runtime,
        );
        let result = match tokio::time::timeout_at(limit, attempt).await {
            Ok(result) => result,
            Err(_) => Err(timed_out("connecting timed out")),
        };
        match &result {
            Ok(_) => {
                if state.failures > 0 {
                    warn!(url = %self.url, after_failures = state.failures, "reconnected to the AMQP broker");
                }
                state.failures = 0;
                state.last_failure = None;
            }
            Err(e) => {
                state.failures = state.failures.saturating_add(1);
                let pause = outbox_engine::full_jitter(reconnect_pause(state.failures));
                state.last_failure = Some((Instant::now(), pause, e.to_string()));
                warn!(url = %self.url, error = %e, failures = state.failures, "cannot connect to the AMQP broker");
            }
        }
        result
    }

    async fn give_back(&self, channel: Channel) {
        if channel.status().connected() {
            self.state.lock().await.idle.push(channel);
        }
    }
}

const BLOCKED: &str = "the broker blocks publishers (a memory or disk alarm)";
const WAITING: &str = "waiting before reconnecting";

/// The failure for messages that were never sent because no channel could be had: the
/// broker is down, refusing, or blocking publishers. Deferred, so waiting out an outage
/// does not use up the messages' attempts.
fn not_sent(state: &State, error: &lapin::Error) -> Failure {
    if error.to_string().contains(BLOCKED) {
        return Failure::retryable(FailureClass::Unavailable, BLOCKED)
            .deferred()
            .with_retry_after(Duration::from_secs(1));
    }
    let failure = classify(error);
    Failure::retryable(failure.class, failure.message)
        .deferred()
        .with_retry_after(state.last_failure.as_ref().map_or_else(
            || reconnect_pause(state.failures.max(1)),
            |(_, pause, _)| *pause,
        ))
}

fn reconnect_pause(failures: u32) -> Duration {
    let exp = failures.saturating_sub(1).min(6);
    (Duration::from_millis(100) * 2u32.pow(exp)).min(MAX_RECONNECT_PAUSE)
}

/// The outcomes of confirmed publishes. A message is unroutable when the broker returned
/// it (a `basic.return` with its message id came with any confirm of the list); otherwise
/// an ack publishes it and a nack is retryable.
fn settle<'a>(
    confirmed: Vec<(&'a Prepared, Confirmation)>,
    batch: &[Message],
) -> Vec<(&'a Prepared, Outcome)> {
    let mut returned: HashMap<String, BasicReturnMessage> = HashMap::new();
    let mut statuses = Vec::with_capacity(confirmed.len());
    for (p, confirmation) in confirmed {
        let (status, message) = match confirmation {
            Confirmation::Ack(message) => (Some(true), message),
            Confirmation::Nack(message) => (Some(false), message),
            Confirmation::NotRequested => (None, None),
        };
        if let Some(message) = message {
            // A return without a message id (not ours) stays with the confirm it came on.
            let id = message
                .delivery
                .properties
                .message_id()
                .as_ref()
                .map_or_else(
                    || batch[p.index].id.to_string(),
                    |id| id.as_str().to_owned(),
                );
            returned.insert(id, message);
        }
        statuses.push((p, status));
    }
    statuses
        .into_iter()
        .map(|(p, status)| {
            let outcome = match (returned.get(&batch[p.index].id.to_string()), status) {
                (Some(message), _) => Outcome::Failed(unroutable(message, p)),
                (None, Some(true)) => Outcome::published_with(format!(
                    "exchange {:?}, routing key {:?}",
                    p.exchange, p.routing_key
                )),
                (None, Some(false)) => Outcome::retryable(
                    FailureClass::Unavailable,
                    "the broker nacked the message (it could not take it; a queue may be unavailable)",
                ),
                (None, None) => Outcome::retryable(
                    FailureClass::Other,
                    "the channel was not in confirm mode; nothing confirms the message arrived",
                ),
            };
            (p, outcome)
        })
        .collect()
}

fn unroutable(returned: &BasicReturnMessage, p: &Prepared) -> Failure {
    Failure::permanent(
        FailureClass::Unroutable,
        format!(
            "returned by the broker: {} {} (exchange {:?}, routing key {:?}); no queue is bound for it",
            returned.reply_code,
            returned.reply_text.as_str(),
            p.exchange,
            p.routing_key
        ),
    )
}

fn timed_out(what: &str) -> lapin::Error {
    lapin::Error::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        what.to_owned(),
    ))
}

/// Why the start-up checks failed.
enum StartUp {
    Client(lapin::Error),
    ExchangeNotFound(String),
}

fn tls_config(config: &AmqpSinkConfig) -> Result<OwnedTLSConfig, AmqpSinkError> {
    let read = |setting: &'static str, path: &std::path::Path| {
        std::fs::read(path).map_err(|e| AmqpSinkError::TlsFile {
            setting,
            path: path.display().to_string(),
            reason: e.to_string(),
        })
    };
    let cert_chain = match &config.tls_ca_file {
        Some(path) => Some(String::from_utf8(read("tls_ca_file", path)?).map_err(|_| {
            AmqpSinkError::TlsFile {
                setting: "tls_ca_file",
                path: path.display().to_string(),
                reason: "not a PEM file (not UTF-8)".to_owned(),
            }
        })?),
        None => None,
    };
    let identity = match (&config.tls_cert_file, &config.tls_key_file) {
        (Some(cert), Some(key)) => Some(OwnedIdentity::PKCS8 {
            pem: read("tls_cert_file", cert)?,
            key: read("tls_key_file", key)?,
        }),
        _ => None,
    };
    Ok(OwnedTLSConfig {
        identity,
        cert_chain,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reconnect_pauses_grow_and_stop_at_the_cap() {
        assert_eq!(reconnect_pause(1), Duration::from_millis(100));
        assert_eq!(reconnect_pause(2), Duration::from_millis(200));
        assert_eq!(reconnect_pause(40), MAX_RECONNECT_PAUSE);
    }
}
