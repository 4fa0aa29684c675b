//! The traits whose methods you call on stores, sinks and inboxes, imported at once and
//! unnamed (`as _`), so `use outbox_engine::prelude::*;` (or `outbox::prelude::*`) brings
//! their methods into scope without taking any name.
//!
//! ```
//! use outbox_engine::prelude::*;
//! use outbox_engine::{MemoryStore, testkit::RecordingSink};
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
//! let store = MemoryStore::new();
//! store.notify().await?; // `Backend::notify`
//! assert_eq!(store.stats().await?.total().pending, 0); // `StoreStats::stats`
//! let _limited = RecordingSink::new().concurrency_limit(2); // `SinkExt`
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # })?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub use crate::backend::Backend as _;
pub use crate::layers::SinkExt as _;
pub use crate::receive::Inbox as _;
pub use crate::sink::{ReportingSink as _, Sink as _};
pub use crate::store::{
    DeadLetters as _, FindMessages as _, Purge as _, Store as _, StoreStats as _,
};
