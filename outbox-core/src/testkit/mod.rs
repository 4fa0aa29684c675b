//! Test kit: the conformance suites every store and sink runs, and fakes for your own
//! tests.
//!
//! - [`store_suite`]: plain async checks of the [`Store`](crate::Store) contract, run by
//!   the in-memory store here and by every SQL store against a real database.
//! - [`sink_suite`]: the same for [`Sink`](crate::Sink)s against a real receiver.
//! - [`inbox_suite`]: the same for [`Inbox`](crate::Inbox)es; [`MemoryInbox`] is an
//!   in-memory one with transactions for consumers' tests.
//! - [`RecordingSink`] acknowledges and records everything; [`FlakySink`] fails on
//!   purpose, retryably or permanently, and can be slow.
//! - [`ManualClock`](crate::ManualClock) moves time only when told.

mod inbox;
pub mod inbox_suite;
pub mod sink_suite;
mod sinks;
pub mod store_suite;

pub use inbox::{MemoryInbox, MemoryInboxTx};
pub use inbox_suite::{InboxHarness, MemoryInboxHarness};
pub use sink_suite::{BinaryPayloads, Delivered, SinkHarness};
pub use sinks::{FlakySink, FlakyStats, RecordingSink};
pub use store_suite::{MemoryHarness, StoreHarness};
