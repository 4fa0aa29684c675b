//! The core of a transactional outbox: the message model, the [`Store`] and [`Sink`]
//! traits, the [`Relay`] that moves messages from one to the other, and a test kit.
//!
//! An application inserts a message in the same database transaction as its business
//! change (with a backend crate such as `outbox-sqlx`). A [`Relay`] claims committed rows
//! under a lease, publishes them through the [`Sink`] of their route, and marks a row
//! published only after the sink acknowledged it. Delivery is at-least-once with a stable
//! idempotency key that receivers deduplicate on.
//!
//! On the consuming side, [`receive`] holds what every receiver shares whatever the
//! broker: the [`Inbox`] that deduplicates inside the consumer's transaction and the
//! [`Received`] identity of a delivered message.
//!
//! This crate depends on no database, broker or HTTP client.
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! use outbox_engine::{MemoryStore, NewMessage, Relay, testkit::RecordingSink};
//!
//! let store = MemoryStore::new();
//! store.enqueue(
//!     NewMessage::builder("billing", "invoice.paid")
//!         .json(&serde_json::json!({ "invoice": 42 }))
//!         .build()?,
//! )?;
//!
//! let sink = RecordingSink::new();
//! let relay = Relay::builder(store.clone()).route("billing", sink.clone()).build()?;
//! let report = relay.drain().await?;
//! assert_eq!(report.published, 1);
//! assert_eq!(sink.messages()[0].event_type, "invoice.paid");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```
//!
//! The `testkit` feature adds the conformance suites every store and sink must pass,
//! plus [`testkit::RecordingSink`] and [`testkit::FlakySink`] for your own tests.

#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod activity;
pub mod backend;
mod clock;
pub mod duration;
mod error;
mod health;
pub mod layers;
mod memory;
mod message;
pub mod prelude;
pub mod receive;
pub mod redact;
pub mod registry;
mod relay;
mod retry;
pub mod series;
pub mod settings;
mod sink;
pub mod state;
mod store;
pub mod template;
#[cfg(feature = "rustls")]
#[cfg_attr(docsrs, doc(cfg(feature = "rustls")))]
pub mod tls;
#[cfg(feature = "opentelemetry")]
#[cfg_attr(docsrs, doc(cfg(feature = "opentelemetry")))]
pub mod trace;
mod wakeup;
pub mod webhooks;

#[cfg(feature = "testkit")]
pub mod testkit;

pub use backend::{AnyStore, Backend, DynStore, Listener};
pub use clock::{Clock, ManualClock, SystemClock};
pub use error::{ConfigError, MessageError, StoreError, StoreErrorKind};
pub use health::{DEFAULT_MAX_FAILING, LagObjective, RelayHealth, Unhealthy};
pub use memory::{MemoryStore, RowSnapshot};
pub use message::{
    Availability, Headers, Limits, Message, MessageId, NewMessage, NewMessageBuilder, Waited,
    WaitedSince, check_destination_name, deterministic_key,
};
pub use receive::{Delivery, Inbox, NotAnOutboxMessage, Received};
pub use registry::{PublishedRows, StoreSettings};
pub use relay::{BatchReport, Relay, RelayBuilder, RunningRelay};
pub use retry::{Decision, RetryPolicy, full_jitter};
pub use sink::{
    BoxFuture, DEFAULT_PUBLISH_TIMEOUT, DynSink, Failure, FailureClass, Outcome, Outcomes,
    PublishContext, ReportingSink, Sink, Stopper,
};
pub use state::{Lease, LeaseToken, Status};
pub use store::{
    Capabilities, Claim, ClaimRequest, CompleteAction, CompleteReport, Completion, DeadHead,
    DeadLetter, DeadLetterFilter, DeadLetters, DestinationGauges, DestinationStats, FindMessages,
    FoundMessage, Gauges, MessageOrder, Purge, PurgeRequest, Rejected, Stats, Store, StoreStats,
    Wakeups, purge_all,
};
pub use wakeup::{Wakeup, WakeupListener};
