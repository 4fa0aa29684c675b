//! The [`NatsSink`]: a batch pipelined to JetStream, each message marked from its own
//! `PubAck`.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::connection::State;
use async_nats::jetstream::context::{
    ContextBuilder, GetStreamByNameErrorKind, PublishAckFuture, PublishErrorKind,
};
use async_nats::jetstream::message::PublishMessage;
use async_nats::{ConnectErrorKind, ConnectOptions, HeaderMap, HeaderName, HeaderValue, Subject};
use outbox_engine::receive::fields::PREFIX as HEADER_PREFIX;
use outbox_engine::receive::metadata_fields;
use outbox_engine::{Failure, FailureClass, Message, Outcome, PublishContext, Sink};
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::config::{Checked, Login, NatsSinkConfig, check_subject};
use crate::error::{NatsSinkError, classify};

/// The prefix of the headers NATS and JetStream read (`Nats-Msg-Id`,
/// `Nats-Expected-Stream`, …); a message header may not use it.
pub(crate) const NATS_PREFIX: &str = "Nats-";
/// How long a permission violation the server reported for a subject explains a missing
/// `PubAck` for it.
const DENIAL_MEMORY: Duration = Duration::from_secs(60);
/// Acks one connection may wait for at once; a publish waits for room beyond that.
const MAX_ACKS_IN_FLIGHT: usize = 10_000;

/// Publishes outbox messages to NATS JetStream.
///
/// Build one with [`connect`](Self::connect) (or [`from_url`](Self::from_url)), which
/// validates the configuration, connects, checks that the account has JetStream and that
/// a stream binds a fixed subject, so a misconfigured route fails at start-up instead of
/// at the first batch. Clones share one connection, which reconnects by itself after the
/// server restarts or the network drops; while it is down, messages fail retryably
/// without being sent and without using up an attempt.
///
/// Each [`publish`](Sink::publish) sends the whole batch without waiting between
/// messages, in order on one connection (so a stream stores them in that order), then
/// collects the `PubAck`s. A message is published only on its `PubAck`. Its
/// `Nats-Msg-Id` header is the idempotency key, so when the relay sends a message again
/// (after a crash between the ack and the mark, say), a stream with a duplicate window
/// stores it once and answers `duplicate: true`; the sink reports that message as
/// published and counts it in `outbox_nats_duplicates_total`. The receipt is
/// `STREAM/SEQUENCE`.
///
/// ```no_run
/// use outbox_engine::{MemoryStore, Relay};
/// use outbox_sink_nats::{NatsSink, NatsSinkConfig};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let sink = NatsSink::connect(
///     NatsSinkConfig::new("nats://127.0.0.1:4222").subject("orders.{event_type}"),
/// )
/// .await?;
/// let store = MemoryStore::new();
/// let relay = Relay::builder(store).route("orders", sink).build()?;
/// relay.drain().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct NatsSink {
    inner: Arc<Inner>,
}

struct Inner {
    config: NatsSinkConfig,
    checked: Checked,
    /// The subject, when the template names one.
    fixed_subject: Option<Subject>,
    /// The URL with its credentials hidden, for messages.
    url: String,
    client: async_nats::Client,
    jetstream: async_nats::jetstream::Context,
    /// Subjects the server refused with a permission violation, and when it said so.
    denied: Arc<Mutex<HashMap<String, Instant>>>,
}

impl fmt::Debug for NatsSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsSink")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl NatsSink {
    /// Validates `config`, connects, and checks the server.
    ///
    /// Start-up checks: the credentials, NKey and TLS files can be read; the server
    /// accepts the login; the account has JetStream; a stream binds the subject when the
    /// template is fixed.
    ///
    /// # Errors
    ///
    /// A [`NatsSinkError`] saying what is wrong; the route must not start.
    pub async fn connect(config: NatsSinkConfig) -> Result<Self, NatsSinkError> {
        let checked = config.check()?;
        metrics::describe_counter!(
            "outbox_nats_duplicates_total",
            "Re-sends that JetStream's duplicate window already held (PubAck with duplicate: true)."
        );
        let url = outbox_engine::redact::url(&config.url);
        let denied = Arc::new(Mutex::new(HashMap::new()));
        let options = connect_options(&config, &checked, Arc::clone(&denied)).await?;
        let connecting = tokio::time::timeout(
            config.connect_timeout,
            options.connect(checked.address.as_str()),
        );
        let client = match connecting.await {
            Ok(Ok(client)) => client,
            Ok(Err(e)) => {
                let retryable = !matches!(
                    e.kind(),
                    ConnectErrorKind::Authentication
                        | ConnectErrorKind::AuthorizationViolation
                        | ConnectErrorKind::Tls
                        | ConnectErrorKind::ServerParse
                );
                return Err(NatsSinkError::Connect {
                    url,
                    reason: e.to_string(),
                    retryable,
                });
            }
            Err(_) => {
                return Err(NatsSinkError::Connect {
                    url,
                    reason: format!(
                        "no connection within the connect timeout ({:?})",
                        config.connect_timeout
                    ),
                    retryable: true,
                });
            }
        };
        let jetstream = ContextBuilder::new()
            .timeout(config.ack_timeout)
            .max_ack_inflight(MAX_ACKS_IN_FLIGHT)
            .backpressure_on_inflight(true)
            .build(client.clone());
        let inner = Inner {
            fixed_subject: checked.subject.fixed().map(Subject::from),
            config,
            checked,
            url,
            client,
            jetstream,
            denied,
        };
        inner.start_up().await?;
        Ok(Self {
            inner: Arc::new(inner),
        })
    }

    /// [`NatsSinkConfig::from_url`] followed by [`connect`](Self::connect).
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), outbox_sink_nats::NatsSinkError> {
    /// let sink = outbox_sink_nats::NatsSink::from_url("nats://127.0.0.1:4222?subject=orders").await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As for [`NatsSinkConfig::from_url`] and [`connect`](Self::connect).
    pub async fn from_url(url: &str) -> Result<Self, NatsSinkError> {
        Self::connect(NatsSinkConfig::from_url(url)?).await
    }

    /// The configuration this sink runs with.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), outbox_sink_nats::NatsSinkError> {
    /// let sink = outbox_sink_nats::NatsSink::from_url("nats://127.0.0.1:4222?subject=orders").await?;
    /// assert_eq!(sink.config().subject, "orders");
    /// # Ok(())
    /// # }
    /// ```
    pub fn config(&self) -> &NatsSinkConfig {
        &self.inner.config
    }
}

impl Sink for NatsSink {
    async fn publish(
        &self,
        batch: &[Message],
        cx: &PublishContext,
    ) -> Result<Vec<Outcome>, Failure> {
        Ok(self.inner.publish(batch, cx.deadline()).await)
    }
}

impl Inner {
    async fn start_up(&self) -> Result<(), NatsSinkError> {
        let deadline = Instant::now() + self.config.connect_timeout;
        let no_jetstream = |reason: String| NatsSinkError::NoJetStream {
            url: self.url.clone(),
            reason,
        };
        // The account's JetStream info, read raw: its fields differ between server versions.
        let info = self.client.request("$JS.API.INFO", bytes::Bytes::new());
        match tokio::time::timeout_at(deadline, info).await {
            Ok(Ok(reply)) => {
                let answer: serde_json::Value =
                    serde_json::from_slice(&reply.payload).unwrap_or_default();
                if let Some(error) = answer.get("error") {
                    let reason = error
                        .get("description")
                        .and_then(serde_json::Value::as_str)
                        .unwrap_or("the JetStream API answered with an error");
                    return Err(no_jetstream(reason.to_owned()));
                }
            }
            Ok(Err(e)) => return Err(no_jetstream(e.to_string())),
            Err(_) => return Err(no_jetstream("the JetStream API did not answer".to_owned())),
        }
        if let Some(subject) = self.checked.subject.fixed() {
            let found =
                tokio::time::timeout_at(deadline, self.jetstream.stream_by_subject(&subject)).await;
            match found {
                Ok(Ok(_)) => {}
                Ok(Err(e)) if e.kind() == GetStreamByNameErrorKind::NotFound => {
                    return Err(NatsSinkError::NoStream {
                        subject,
                        url: self.url.clone(),
                    });
                }
                Ok(Err(e)) => return Err(no_jetstream(e.to_string())),
                Err(_) => {
                    return Err(no_jetstream("the JetStream API did not answer".to_owned()));
                }
            }
        }
        Ok(())
    }

    async fn publish(&self, batch: &[Message], deadline: Instant) -> Vec<Outcome> {
        let mut outcomes: Vec<Option<Outcome>> = vec![None; batch.len()];
        if self.client.connection_state() != State::Connected {
            let failure = Failure::retryable(
                FailureClass::Connection,
                format!(
                    "not connected to the NATS server at {}; reconnecting",
                    self.url
                ),
            )
            .deferred()
            .with_retry_after(Duration::from_secs(1));
            return vec![failure.into(); batch.len()];
        }

        // Send everything in order, then collect the acks. A subject rendered from its
        // message is kept for the ack's classification; a fixed one is the route's.
        let mut subjects: Vec<Option<Subject>> = vec![None; batch.len()];
        let mut pending: Vec<(usize, PublishAckFuture)> = Vec::with_capacity(batch.len());
        // One deadline for every send: what it cuts short stays unreported.
        let send = async {
            for (index, message) in batch.iter().enumerate() {
                let (subject, publish) = match self.prepare(message) {
                    Ok(prepared) => prepared,
                    Err(failure) => {
                        outcomes[index] = Some(failure.into());
                        continue;
                    }
                };
                if self.fixed_subject.is_none() {
                    subjects[index] = Some(subject.clone());
                }
                match self.jetstream.send_publish(subject, publish).await {
                    Ok(ack) => pending.push((index, ack)),
                    Err(e) => outcomes[index] = Some(classify(&e).into()),
                }
            }
        };
        let _ = tokio::time::timeout_at(deadline, send).await;

        let mut duplicates = 0u64;
        let mut bound: HashMap<String, Failure> = HashMap::new();
        // One deadline for every ack: what it cuts short stays unreported.
        let collect = async {
            for (index, ack) in pending {
                let acked = ack.await;
                let subject = self.subject_of(&subjects, index);
                outcomes[index] = Some(match acked {
                    Ok(ack) => {
                        duplicates += u64::from(ack.duplicate);
                        Outcome::published_with(if ack.duplicate {
                            format!("{}/{} (duplicate)", ack.stream, ack.sequence)
                        } else {
                            format!("{}/{}", ack.stream, ack.sequence)
                        })
                    }
                    Err(e) if e.kind() == PublishErrorKind::StreamNotFound => {
                        if let Some(failure) = bound.get(subject) {
                            failure.clone().into()
                        } else {
                            let failure = self.no_responders(subject, deadline).await;
                            bound.insert(subject.to_owned(), failure.clone());
                            failure.into()
                        }
                    }
                    Err(e)
                        if e.kind() == PublishErrorKind::TimedOut && self.was_denied(subject) =>
                    {
                        denied(subject).into()
                    }
                    Err(e) => classify(&e).into(),
                });
            }
        };
        let _ = tokio::time::timeout_at(deadline, collect).await;
        if duplicates > 0 {
            metrics::counter!("outbox_nats_duplicates_total").increment(duplicates);
            debug!(
                url = %self.url,
                duplicates,
                "JetStream already had re-sent messages (their Nats-Msg-Id was in the duplicate window)"
            );
        }
        // What the deadline cut short: refused, if the server said so for the subject.
        outcomes
            .into_iter()
            .enumerate()
            .map(|(index, outcome)| match outcome {
                Some(outcome) => outcome,
                None if self.was_denied(self.subject_of(&subjects, index)) => {
                    denied(self.subject_of(&subjects, index)).into()
                }
                None => Outcome::retryable(
                    FailureClass::Timeout,
                    "no PubAck before the publish deadline; the message may have been stored",
                ),
            })
            .collect()
    }

    /// The subject the message at `index` went to.
    fn subject_of<'a>(&'a self, subjects: &'a [Option<Subject>], index: usize) -> &'a str {
        subjects[index]
            .as_deref()
            .or(self.fixed_subject.as_deref())
            .unwrap_or_default()
    }

    /// The failure for a message that met "no responders": permanent only when the
    /// JetStream API answers that no stream binds `subject`. While the API itself does not
    /// answer (a server starting, JetStream off), it is retryable.
    async fn no_responders(&self, subject: &str, deadline: Instant) -> Failure {
        let found =
            tokio::time::timeout_at(deadline, self.jetstream.stream_by_subject(subject)).await;
        match found {
            Ok(Err(e)) if e.kind() == GetStreamByNameErrorKind::NotFound => Failure::permanent(
                FailureClass::Unroutable,
                format!(
                    "no JetStream stream binds subject {subject:?}; create a stream for it, or fix the route's subject template"
                ),
            ),
            Ok(Ok(stream)) => Failure::retryable(
                FailureClass::Unavailable,
                format!(
                    "stream {stream:?} binds subject {subject:?} but did not answer (no responders); it may be starting"
                ),
            ),
            Ok(Err(e)) => Failure::retryable(
                FailureClass::Unavailable,
                format!(
                    "no responders for subject {subject:?}, and the JetStream API did not answer: {e}"
                ),
            ),
            Err(_) => Failure::retryable(
                FailureClass::Unavailable,
                format!(
                    "no responders for subject {subject:?}, and the JetStream API did not answer in time"
                ),
            ),
        }
    }

    fn was_denied(&self, subject: &str) -> bool {
        let mut denied = self.denied.lock().unwrap_or_else(|e| e.into_inner());
        denied.retain(|_, at| at.elapsed() < DENIAL_MEMORY);
        denied.contains_key(subject)
    }

    /// The subject and the publish for `message`; a failure here is the message's own
    /// and permanent.
    fn prepare(&self, message: &Message) -> Result<(Subject, PublishMessage), Failure> {
        let subject = match &self.fixed_subject {
            Some(subject) => subject.clone(),
            None => {
                let subject = self.checked.subject.render(message).map_err(|e| {
                    Failure::permanent(FailureClass::Config, format!("subject {e}"))
                })?;
                check_subject(&subject)
                    .map_err(|reason| Failure::permanent(FailureClass::Config, reason))?;
                Subject::from(subject)
            }
        };

        let mut headers = HeaderMap::new();
        let bad = |name: &str, what: &str| {
            Failure::permanent(
                FailureClass::Serialization,
                format!(
                    "header {name:?} has {what} that NATS headers cannot carry (control characters, `:` in a name, or a line break)"
                ),
            )
        };
        let parse = |name: &str, text: &str| -> Result<HeaderValue, Failure> {
            text.parse().map_err(|_| bad(name, "a value"))
        };
        // JetStream's duplicate window keys on `Nats-Msg-Id`; the sink's own header
        // names are parsed once.
        let id = message.id.to_string();
        let own = std::iter::once(("Nats-Msg-Id", message.idempotency_key.as_str()))
            .chain(metadata_fields(message, &id));
        for (name, text) in own {
            headers.insert(own_header(name), parse(name, text)?);
        }
        for (name, text) in &message.headers {
            for reserved in [HEADER_PREFIX, NATS_PREFIX] {
                if name
                    .get(..reserved.len())
                    .is_some_and(|p| p.eq_ignore_ascii_case(reserved))
                {
                    return Err(Failure::permanent(
                        FailureClass::Serialization,
                        format!(
                            "header {name:?} uses the prefix `{reserved}`, which the NATS sink reserves for its own headers and JetStream's"
                        ),
                    ));
                }
            }
            let parsed: HeaderName = name.parse().map_err(|_| bad(name, "a name"))?;
            headers.insert(parsed, parse(name, text)?);
        }
        let publish = PublishMessage::build()
            .headers(headers)
            .payload(bytes::Bytes::copy_from_slice(&message.payload));
        Ok((subject, publish))
    }
}

/// The client's options: a name, timeouts, the login, TLS, and an event callback that
/// remembers the subjects the server refused.
async fn connect_options(
    config: &NatsSinkConfig,
    checked: &Checked,
    denied: Arc<Mutex<HashMap<String, Instant>>>,
) -> Result<ConnectOptions, NatsSinkError> {
    let file_error =
        |setting: &'static str, path: &std::path::Path, reason: String| NatsSinkError::File {
            setting,
            path: path.display().to_string(),
            reason,
        };
    let url = outbox_engine::redact::url(&config.url);
    let mut options = ConnectOptions::new()
        .name(format!("outbox-relay-{}", std::process::id()))
        .connection_timeout(config.connect_timeout)
        .max_reconnects(None)
        .require_tls(checked.tls)
        .event_callback(move |event| {
            let denied = Arc::clone(&denied);
            let url = url.clone();
            async move {
                match event {
                    async_nats::Event::ServerError(async_nats::ServerError::Other(text)) => {
                        if let Some(subject) = denied_subject(&text) {
                            warn!(url = %url, subject = %subject, "the NATS server refused a publish: permissions violation");
                            denied
                                .lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .insert(subject, Instant::now());
                        } else {
                            warn!(url = %url, error = %text, "the NATS server reported an error");
                        }
                    }
                    async_nats::Event::Disconnected => {
                        warn!(url = %url, "disconnected from the NATS server; reconnecting");
                    }
                    async_nats::Event::Connected => debug!(url = %url, "connected to the NATS server"),
                    other => debug!(url = %url, event = %other, "NATS client event"),
                }
            }
        });
    match &checked.login {
        Login::None => {}
        Login::Token(token) => options = options.token(token.clone()),
        Login::UserPassword(user, password) => {
            options = options.user_and_password(user.clone(), password.clone());
        }
    }
    if let Some(path) = &config.credentials_file {
        options = options
            .credentials_file(path)
            .await
            .map_err(|e| file_error("credentials_file", path, e.to_string()))?;
    }
    if let Some(path) = &config.nkey_seed_file {
        let seed = std::fs::read_to_string(path)
            .map_err(|e| file_error("nkey_seed_file", path, e.to_string()))?;
        let seed = seed.trim();
        if !seed.starts_with('S') {
            return Err(file_error(
                "nkey_seed_file",
                path,
                "does not hold an NKey seed (a seed starts with `S`, e.g. `SU…` for a user)"
                    .to_owned(),
            ));
        }
        options = options.nkey(seed.to_owned());
    }
    if checked.tls {
        // Built here, with ring: async-nats's own builder takes the process's default
        // provider, and panics when the application's rustls has two.
        let client = config
            .tls_cert_file
            .as_deref()
            .zip(config.tls_key_file.as_deref());
        let tls = outbox_engine::tls::client_config(config.tls_ca_file.as_deref(), client)
            .map_err(|e| NatsSinkError::File {
                setting: e.setting,
                path: e.path,
                reason: e.reason,
            })?;
        options = options.tls_client_config(tls);
    }
    Ok(options)
}

/// The name of one of the sink's own headers (`Nats-Msg-Id` and the `outbox-…` fields,
/// all valid header names), without copying it.
fn own_header(name: &'static str) -> HeaderName {
    HeaderName::from_static(name)
}

/// The failure of a message to `subject`, which the server refused to take from this
/// connection.
fn denied(subject: &str) -> Failure {
    Failure::permanent(
        FailureClass::Rejected,
        format!(
            "the NATS server refused to let this connection publish to {subject:?} (Permissions Violation for Publish)"
        ),
    )
}

/// The subject of a server error `Permissions Violation for Publish to "subject"`.
fn denied_subject(text: &str) -> Option<String> {
    let lower = text.to_ascii_lowercase();
    let at = lower.find("permissions violation for publish to")?;
    let rest = &text[at..];
    let start = rest.find('"')? + 1;
    let end = start + rest[start..].find('"')?;
    Some(rest[start..end].to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_denied_subject_is_read_from_the_servers_error() {
        assert_eq!(
            denied_subject("Permissions Violation for Publish to \"orders.paid\"").as_deref(),
            Some("orders.paid")
        );
        assert_eq!(
            denied_subject("permissions violation for publish to \"a.b\" using queue \"q\"")
                .as_deref(),
            Some("a.b")
        );
        assert_eq!(
            denied_subject("Permissions Violation for Subscription to \"x\""),
            None
        );
    }
}
