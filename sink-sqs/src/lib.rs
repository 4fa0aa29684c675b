//! Amazon SQS sink for the outbox relay.
//!
//! An [`SqsSink`] publishes outbox messages to one SQS queue with `SendMessageBatch`
//! (up to 10 entries and 1 MiB per request) and answers one
//! [`Outcome`](outbox_engine::Outcome) per message from that message's own entry of
//! SQS's answer: a batch can partly fail while the call returns 200.
//!
//! ```no_run
//! use outbox_engine::{MemoryStore, NewMessage, Relay};
//! use outbox_sink_sqs::SqsSink;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let sink = SqsSink::from_url("sqs://eu-west-1/invoices.fifo").await?;
//!
//! let store = MemoryStore::new();
//! store.enqueue(
//!     NewMessage::builder("invoices", "invoice.paid")
//!         .partition_key("tenant-7")
//!         .json(&serde_json::json!({ "invoice": 1042 }))
//!         .build()?,
//! )?;
//! let relay = Relay::builder(store).route("invoices", sink).build()?;
//! relay.drain().await?; // group `tenant-7`, deduplicated by the idempotency key
//! # Ok(())
//! # }
//! ```
//!
//! For a local emulator: `sqs+http://127.0.0.1:4566/000000000000/invoices` with
//! `region` and static credentials set (see [`SqsSinkConfig`]).
//!
//! # What it guarantees
//!
//! | capability | |
//! |---|---|
//! | one outcome per message, from its own entry of the answer (`Successful` / `Failed`) | ✅ |
//! | `Failed` with `SenderFault = true` → dead letter with SQS's code; otherwise retried | ✅ |
//! | a request refused as a whole because of one entry is sent again as halves, so only that entry fails | ✅ |
//! | sizes checked against the queue's own `MaximumMessageSize`, read at start-up | ✅ |
//! | receipt: the SQS message id (`id@sequence-number` on FIFO) | ✅ |
//! | FIFO: group id = partition key (or `default_group`), deduplication id = idempotency key | ✅ |
//! | FIFO: one key's messages in commit order under per-key ordering; SQS drops a re-send within its 5-minute window | ✅ |
//! | id, idempotency key, event type, content type, tenant, aggregate and headers as message attributes | ✅ |
//! | what SQS would refuse (11 attributes, characters outside its set, an oversized message) refused before sending | ✅ |
//! | binary payloads | ✅ with `binary = "base64"`; refused by default |
//! | credentials from the standard AWS chain (env, profile, web identity, container, IMDS) or static | ✅ |
//! | `DelaySeconds` | ❌ (the outbox delays itself: `NewMessage::delay` holds the row until due) |
//! | queues created by the sink | ❌ (a queue is checked at start-up, never created) |
//!
//! The AWS SDK's own crates log the access key id of the credentials they resolve (at
//! `info`, `debug` and `trace`). The `outbox` CLI keeps them at `warn` unless `RUST_LOG`
//! names them; an application with its own subscriber should do the same, e.g.
//! `aws_config=warn,aws_sigv4=warn,aws_smithy_runtime=warn,aws_smithy_runtime_api=warn`.
//!
//! # Message layout
//!
//! | SQS | from the message |
//! |---|---|
//! | body | payload as text; with `binary = "base64"`, a payload that is not SQS text in base64, with attribute `outbox-body-encoding = base64` |
//! | attribute `outbox-id` | id (UUIDv7) |
//! | attribute `outbox-idempotency-key` | idempotency key |
//! | attributes `outbox-event-type`, `outbox-content-type` | event type, content type |
//! | attributes `outbox-partition-key`, `outbox-tenant-id`, `outbox-aggregate-type`, `outbox-aggregate-id` | when the message has them |
//! | other attributes | the message's headers, one each, when they fit in SQS's 10 attributes (and are legal attribute names with values) |
//! | attribute `outbox-headers` | otherwise: every header, as one JSON object |
//! | `MessageGroupId` (FIFO) | partition key, or `default_group` |
//! | `MessageDeduplicationId` (FIFO) | idempotency key |
//!
//! Every attribute is of type `String`. A group or deduplication id that SQS would refuse
//! (over 128 characters, or characters other than printable ASCII) is sent as
//! `sha256-` and the hex SHA-256 of the text ([`sqs_id`]): the same key always gives the
//! same id. Consumers read messages back with [`read_message`] as an
//! [`outbox_engine::Received`], for deduplication in an inbox.
//!
//! Errors and their classification are in [`error`].

#![cfg_attr(docsrs, feature(doc_cfg))]

mod config;
pub mod error;
mod receive;
mod sink;

pub use config::{Binary, DEFAULT_GROUP, SqsSinkConfig};
pub use error::SqsSinkError;
pub use receive::{
    BODY_ENCODING_ATTRIBUTE, HEADERS_ATTRIBUTE, MAX_ATTRIBUTES, read_message, read_parts,
};
pub use sink::{MAX_BATCH_BYTES, MAX_BATCH_ENTRIES, SqsSink, sqs_id};

outbox_engine::route_sink!(
    SqsSink,
    ["sqs", "sqs+https", "sqs+http"],
    SqsSinkConfig,
    SqsSinkError
);

/// The `aws-sdk-sqs` client crate this sink is built on, for matching versions.
pub use aws_sdk_sqs as client;
