//! The [`SqsSink`]: batches of up to 10 entries with `SendMessageBatch`, each message
//! marked from its own entry of the answer.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use aws_config::BehaviorVersion;
use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_sdk_sqs::Client;
use aws_sdk_sqs::config::{Credentials, Region};
use aws_sdk_sqs::types::{MessageAttributeValue, QueueAttributeName, SendMessageBatchRequestEntry};
use outbox_engine::{
    BoxFuture, Failure, FailureClass, Message, Outcome, Outcomes, PublishContext, ReportingSink,
};
use sha2::{Digest, Sha256};
use tracing::warn;

use crate::config::{Checked, Queue, SqsSinkConfig, is_sqs_id};
use crate::error::{CallFailure, SqsSinkError, call_failure, entry_failure};
use crate::receive::{Layout, layout};

/// The most entries one `SendMessageBatch` takes.
pub const MAX_BATCH_ENTRIES: usize = 10;

/// The most bytes of messages (bodies and attributes) one `SendMessageBatch` takes, at
/// the time of writing: 1 MiB.
pub const MAX_BATCH_BYTES: usize = 1_048_576;

/// How many requests of one batch are in flight at once on a standard queue.
const MAX_REQUESTS_IN_FLIGHT: usize = 10;

/// Publishes outbox messages to one SQS queue.
///
/// Build one with [`connect`](Self::connect) (or [`from_url`](Self::from_url)), which
/// validates the configuration, resolves the queue's URL and reads its attributes
/// (`MaximumMessageSize`, `FifoQueue`), so a misconfigured route fails at start-up
/// instead of at the first batch. Clones share one client.
///
/// Each [`publish`](outbox_engine::Sink::publish) lays every message out (body and attributes, see the
/// crate docs), refuses those SQS would refuse, and sends the rest in requests of at most
/// [`MAX_BATCH_ENTRIES`] entries and [`MAX_BATCH_BYTES`], in batch order (one request at a
/// time on a FIFO queue, up to 10 at once on a standard queue). A message is published only
/// when its own entry is in the answer's `Successful` list; the receipt is the SQS
/// message id (`id@sequence-number` on a FIFO queue). The SDK's own retries are off: the
/// relay retries, with its backoff, its metrics and its limits.
///
/// ```no_run
/// use outbox_engine::{MemoryStore, Relay};
/// use outbox_sink_sqs::SqsSink;
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let sink = SqsSink::from_url("sqs://eu-west-1/invoices.fifo").await?;
/// let relay = Relay::builder(MemoryStore::new()).route("invoices", sink).build()?;
/// relay.drain().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct SqsSink {
    inner: Arc<Inner>,
}

struct Inner {
    config: SqsSinkConfig,
    checked: Checked,
    client: Client,
    queue_url: String,
    fifo: bool,
    max_message_size: usize,
}

impl fmt::Debug for SqsSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqsSink")
            .field("config", &self.inner.config)
            .field("queue_url", &self.inner.queue_url)
            .field("fifo", &self.inner.fifo)
            .field("max_message_size", &self.inner.max_message_size)
            .finish_non_exhaustive()
    }
}

impl SqsSink {
    /// Validates `config`, makes the client, and reads the queue.
    ///
    /// # Errors
    ///
    /// An [`SqsSinkError`] saying what is wrong; the route must not start.
    pub async fn connect(config: SqsSinkConfig) -> Result<Self, SqsSinkError> {
        let checked = config.check()?;
        let shown = match &checked.queue {
            Queue::Named { name, .. } => name.clone(),
            Queue::Url(url) => url.clone(),
        };
        let mut loader = aws_config::defaults(BehaviorVersion::latest())
            .retry_config(RetryConfig::disabled())
            .timeout_config(
                TimeoutConfig::builder()
                    .connect_timeout(checked.connect_timeout)
                    .build(),
            );
        if let Some(region) = &checked.region {
            loader = loader.region(Region::new(region.clone()));
        }
        if let Some(profile) = &checked.profile {
            loader = loader.profile_name(profile);
        }
        if let Some(endpoint) = &checked.endpoint {
            loader = loader.endpoint_url(endpoint);
        }
        if let Some(c) = &checked.credentials {
            loader = loader.credentials_provider(Credentials::new(
                c.access_key_id.clone(),
                c.secret_access_key.clone(),
                c.session_token.clone(),
                None,
                "outbox-sink-sqs configuration",
            ));
        }
        let timeout = checked.connect_timeout;
        let shared = tokio::time::timeout(timeout, loader.load())
            .await
            .map_err(|_| SqsSinkError::Connect {
                queue: shown.clone(),
                reason: format!("the AWS configuration did not load within {timeout:?}"),
                retryable: true,
            })?;
        if shared.region().is_none() {
            return Err(SqsSinkError::NoRegion { queue: shown });
        }
        let client = Client::new(&shared);
        let connect_error = |failure: Failure| SqsSinkError::Connect {
            queue: shown.clone(),
            reason: failure.message,
            retryable: failure.retryable && failure.class != FailureClass::Config,
        };
        let late = || SqsSinkError::Connect {
            queue: shown.clone(),
            reason: format!("no answer within connect_timeout ({timeout:?})"),
            retryable: true,
        };
        let queue_url = match &checked.queue {
            Queue::Url(url) => url.clone(),
            Queue::Named { name, account } => {
                let answer = tokio::time::timeout(
                    timeout,
                    client
                        .get_queue_url()
                        .queue_name(name)
                        .set_queue_owner_aws_account_id(account.clone())
                        .send(),
                )
                .await
                .map_err(|_| late())?;
                match answer {
                    Ok(found) => found.queue_url().unwrap_or_default().to_owned(),
                    Err(e)
                        if e.as_service_error()
                            .is_some_and(|s| s.is_queue_does_not_exist()) =>
                    {
                        return Err(SqsSinkError::QueueNotFound { queue: shown });
                    }
                    Err(e) => return Err(connect_error(failure_of(&e))),
                }
            }
        };
        let answer = tokio::time::timeout(
            timeout,
            client
                .get_queue_attributes()
                .queue_url(&queue_url)
                .attribute_names(QueueAttributeName::MaximumMessageSize)
                .attribute_names(QueueAttributeName::FifoQueue)
                .send(),
        )
        .await
        .map_err(|_| late())?;
        let attributes = match answer {
            Ok(answer) => answer.attributes().cloned().unwrap_or_default(),
            Err(e)
                if e.as_service_error()
                    .is_some_and(|s| s.is_queue_does_not_exist()) =>
            {
                return Err(SqsSinkError::QueueNotFound { queue: shown });
            }
            Err(e) => return Err(connect_error(failure_of(&e))),
        };
        let max_message_size = attributes
            .get(&QueueAttributeName::MaximumMessageSize)
            .and_then(|v| v.parse::<usize>().ok())
            .filter(|&size| size > 0)
            .ok_or_else(|| SqsSinkError::Connect {
                queue: shown.clone(),
                reason: "the queue's attributes carry no MaximumMessageSize".to_owned(),
                retryable: false,
            })?;
        // A FIFO queue's name ends with `.fifo`; an answer that leaves the attribute out
        // must not make the sink send FIFO messages without their group ids.
        let fifo = attributes
            .get(&QueueAttributeName::FifoQueue)
            .is_some_and(|v| v == "true")
            || queue_url.ends_with(".fifo");
        Ok(Self {
            inner: Arc::new(Inner {
                config,
                checked,
                client,
                queue_url,
                fifo,
                max_message_size,
            }),
        })
    }

    /// [`connect`](Self::connect)s with the configuration in one URL.
    ///
    /// # Errors
    ///
    /// As for [`SqsSinkConfig::from_url`] and [`connect`](Self::connect).
    pub async fn from_url(url: &str) -> Result<Self, SqsSinkError> {
        Self::connect(SqsSinkConfig::from_url(url)?).await
    }

    /// The configuration this sink was built from.
    pub fn config(&self) -> &SqsSinkConfig {
        &self.inner.config
    }

    /// The queue's URL, as SQS gave it at start-up.
    pub fn queue_url(&self) -> &str {
        &self.inner.queue_url
    }

    /// Whether the queue is a FIFO queue.
    pub fn is_fifo(&self) -> bool {
        self.inner.fifo
    }

    /// The queue's `MaximumMessageSize`, read at start-up.
    pub fn max_message_size(&self) -> usize {
        self.inner.max_message_size
    }
}

fn failure_of<E>(error: &aws_sdk_sqs::error::SdkError<E>) -> Failure
where
    E: aws_sdk_sqs::error::ProvideErrorMetadata + std::error::Error + 'static,
{
    match call_failure(error) {
        CallFailure::Split(f) | CallFailure::All(f) => f,
    }
}

/// `text` as a FIFO group or deduplication id: itself when SQS takes it (1 to 128
/// printable ASCII characters), otherwise `sha256-` and its hash in hex, the same for the
/// same text.
pub fn sqs_id(text: &str) -> String {
    if is_sqs_id(text) {
        return text.to_owned();
    }
    let digest = Sha256::digest(text.as_bytes());
    let mut id = String::with_capacity(7 + 64);
    id.push_str("sha256-");
    for byte in digest {
        id.push_str(&format!("{byte:02x}"));
    }
    id
}

/// One message ready to send: its index in the batch and its entry.
struct Entry {
    index: usize,
    size: usize,
    entry: SendMessageBatchRequestEntry,
}

impl Inner {
    fn entry(&self, index: usize, message: &Message) -> Result<Entry, Failure> {
        let Layout {
            body,
            attributes,
            size,
        } = layout(message, self.checked.binary)?;
        if size > self.max_message_size {
            return Err(Failure::permanent(
                FailureClass::TooLarge,
                format!(
                    "{size} bytes (body and attributes) is over the queue's MaximumMessageSize of {} bytes",
                    self.max_message_size
                ),
            ));
        }
        let attributes: HashMap<String, MessageAttributeValue> = attributes
            .into_iter()
            .map(|(name, value)| {
                let value = MessageAttributeValue::builder()
                    .data_type("String")
                    .string_value(value)
                    .build()
                    .expect("the data type is set");
                (name, value)
            })
            .collect();
        let mut entry = SendMessageBatchRequestEntry::builder()
            // Ids are positions in the request, set when the request is made.
            .id("0")
            .message_body(body)
            .set_message_attributes(Some(attributes));
        if self.fifo {
            let group = message
                .partition_key
                .as_deref()
                .unwrap_or(&self.checked.default_group);
            entry = entry
                .message_group_id(sqs_id(group))
                .message_deduplication_id(sqs_id(&message.idempotency_key));
        }
        Ok(Entry {
            index,
            size,
            entry: entry.build().expect("id and body are set"),
        })
    }

    /// Sends `entries` as one request and reports each entry's outcome; a request SQS
    /// refused for a reason one entry may cause is sent again as two halves.
    fn send<'a>(
        &'a self,
        entries: Vec<Entry>,
        cx: &'a PublishContext,
        outcomes: &'a Outcomes,
    ) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let request: Vec<SendMessageBatchRequestEntry> = entries
                .iter()
                .enumerate()
                .map(|(position, e)| {
                    let mut entry = e.entry.clone();
                    entry.id = position.to_string();
                    entry
                })
                .collect();
            let call = self
                .client
                .send_message_batch()
                .queue_url(&self.queue_url)
                .set_entries(Some(request))
                .send();
            let answer = match tokio::time::timeout_at(cx.deadline(), call).await {
                Ok(Ok(answer)) => answer,
                Ok(Err(error)) => {
                    match call_failure(&error) {
                        CallFailure::Split(failure) if entries.len() > 1 => {
                            warn!(
                                entries = entries.len(),
                                reason = %failure.message,
                                "SQS refused a whole request; sending it again as two halves"
                            );
                            let mut first = entries;
                            let second = first.split_off(first.len() / 2);
                            self.send(first, cx, outcomes).await;
                            self.send(second, cx, outcomes).await;
                        }
                        CallFailure::Split(failure) | CallFailure::All(failure) => {
                            for e in &entries {
                                outcomes.report(e.index, failure.clone().into());
                            }
                        }
                    }
                    return;
                }
                Err(_elapsed) => {
                    for e in &entries {
                        outcomes.report(
                            e.index,
                            Outcome::retryable(
                                FailureClass::Timeout,
                                "no answer from SQS by the publish deadline; the message may have been sent",
                            ),
                        );
                    }
                    return;
                }
            };
            // Each entry's answer, matched by position; an entry named twice or in both
            // lists gets no trust (retried), one named nowhere is retried too.
            let mut results: Vec<Option<Outcome>> = vec![None; entries.len()];
            let mut seen = vec![0u8; entries.len()];
            let position = |id: &str| {
                id.parse::<usize>()
                    .ok()
                    .filter(|&p| p < entries.len() && p.to_string() == id)
            };
            for ok in answer.successful() {
                if let Some(p) = position(ok.id()) {
                    seen[p] = seen[p].saturating_add(1);
                    let receipt = match ok.sequence_number() {
                        Some(sequence) => format!("{}@{sequence}", ok.message_id()),
                        None => ok.message_id().to_owned(),
                    };
                    results[p] = Some(Outcome::published_with(receipt));
                }
            }
            for failed in answer.failed() {
                if let Some(p) = position(failed.id()) {
                    seen[p] = seen[p].saturating_add(1);
                    results[p] = Some(
                        entry_failure(failed.code(), failed.message(), failed.sender_fault())
                            .into(),
                    );
                }
            }
            for (p, e) in entries.iter().enumerate() {
                let outcome = match (seen[p], results[p].take()) {
                    (1, Some(outcome)) => outcome,
                    (0, _) => Outcome::retryable(
                        FailureClass::Unavailable,
                        "SQS's answer has no result for this entry",
                    ),
                    _ => Outcome::retryable(
                        FailureClass::Unavailable,
                        "SQS's answer names this entry more than once",
                    ),
                };
                outcomes.report(e.index, outcome);
            }
        })
    }

    async fn publish(&self, batch: &[Message], cx: &PublishContext, outcomes: &Outcomes) {
        let mut requests: Vec<Vec<Entry>> = Vec::new();
        let mut bytes = 0;
        for (index, message) in batch.iter().enumerate() {
            let entry = match self.entry(index, message) {
                Ok(entry) => entry,
                Err(failure) => {
                    outcomes.report(index, failure.into());
                    continue;
                }
            };
            match requests.last_mut() {
                Some(last)
                    if last.len() < MAX_BATCH_ENTRIES && bytes + entry.size <= MAX_BATCH_BYTES =>
                {
                    bytes += entry.size;
                    last.push(entry);
                }
                _ => {
                    bytes = entry.size;
                    requests.push(vec![entry]);
                }
            }
        }
        if self.fifo {
            // In order, one request at a time: a group's messages reach SQS in batch order.
            for entries in requests {
                if let Some(reason) = cx.stopped() {
                    let stop =
                        Failure::retryable(FailureClass::Unavailable, reason.to_owned()).deferred();
                    for e in &entries {
                        outcomes.report(e.index, stop.clone().into());
                    }
                    continue;
                }
                self.send(entries, cx, outcomes).await;
            }
        } else {
            use futures_util::StreamExt as _;
            futures_util::stream::iter(requests)
                .for_each_concurrent(MAX_REQUESTS_IN_FLIGHT, |entries| {
                    self.send(entries, cx, outcomes)
                })
                .await;
        }
    }
}

impl ReportingSink for SqsSink {
    async fn publish_each(&self, batch: &[Message], cx: &PublishContext, outcomes: &Outcomes) {
        self.inner.publish(batch, cx, outcomes).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_sqs_refuses_become_a_stable_hash() {
        assert_eq!(sqs_id("tenant-7"), "tenant-7");
        let long = "k".repeat(200);
        assert_eq!(sqs_id(&long), sqs_id(&long));
        assert_eq!(sqs_id(&long).len(), 71);
        assert!(is_sqs_id(&sqs_id(&long)));
        assert_ne!(sqs_id("tenant 7"), sqs_id("tenant 8"));
        assert!(sqs_id("tenant 7").starts_with("sha256-"));
    }
}
