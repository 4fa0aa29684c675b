//! What an outbox backend does besides the relay's calls, and the type-erased store.
//!
//! [`Backend`] is what operators and the front crate need of a store: create or upgrade
//! its table, and wakeups through the database. [`DynStore`] is the object-safe twin of
//! every store trait together, implemented for every store that has them all, so a store
//! chosen at run time (by URL) is an `Arc<dyn DynStore>`, and `Arc<dyn DynStore>` is a
//! store again.

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::sync::Arc;

use crate::error::StoreError;
use crate::message::MessageId;
use crate::sink::BoxFuture;
use crate::state::LeaseToken;
use crate::store::{
    Capabilities, Claim, ClaimRequest, CompleteReport, Completion, DeadLetter, DeadLetterFilter,
    DeadLetters, FindMessages, FoundMessage, Gauges, Purge, PurgeRequest, Stats, Store, StoreStats,
};
use crate::wakeup::Wakeup;

/// A wakeup fed by the database (PostgreSQL LISTEN/NOTIFY, say), alive as long as this
/// value is: dropping it stops the listening.
pub struct Listener {
    wakeup: Wakeup,
    _alive: Box<dyn Any + Send + Sync>,
}

impl Listener {
    /// A listener raising `wakeup`, kept running by `alive` (its connection or task).
    pub fn new(wakeup: Wakeup, alive: impl Any + Send + Sync) -> Self {
        Self {
            wakeup,
            _alive: Box::new(alive),
        }
    }

    /// The signal it raises.
    pub fn wakeup(&self) -> Wakeup {
        self.wakeup.clone()
    }
}

impl fmt::Debug for Listener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Listener").finish_non_exhaustive()
    }
}

/// A store's operations outside the relay: its schema and its wakeups.
pub trait Backend: Send + Sync {
    /// Creates or upgrades the table (idempotent, safe to run concurrently).
    fn migrate(&self) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// A wakeup the database raises when rows are enqueued, if the store has one (the
    /// default has none: relays poll).
    fn listen(&self) -> impl Future<Output = Result<Option<Listener>, StoreError>> + Send {
        async { Ok(None) }
    }

    /// Wakes listening relays after a change made outside an enqueue (a dead-letter
    /// replay, say). The default does nothing: relays find the rows at their next poll.
    fn notify(&self) -> impl Future<Output = Result<(), StoreError>> + Send {
        async { Ok(()) }
    }
}

/// Every store trait at once, object-safe: implemented for each store that implements
/// [`Store`], [`StoreStats`], [`DeadLetters`], [`FindMessages`], [`Purge`] and [`Backend`].
pub trait DynStore: Send + Sync + 'static {
    /// See [`Store::capabilities`].
    fn capabilities_dyn(&self) -> Capabilities;
    /// See [`Store::claim`].
    fn claim_dyn<'a>(
        &'a self,
        request: &'a ClaimRequest,
    ) -> BoxFuture<'a, Result<Claim, StoreError>>;
    /// See [`Store::complete`].
    fn complete_dyn<'a>(
        &'a self,
        token: LeaseToken,
        completions: &'a [Completion],
    ) -> BoxFuture<'a, Result<CompleteReport, StoreError>>;
    /// See [`Store::release`].
    fn release_dyn<'a>(
        &'a self,
        token: LeaseToken,
        ids: &'a [MessageId],
    ) -> BoxFuture<'a, Result<CompleteReport, StoreError>>;
    /// See [`StoreStats::stats`].
    fn stats_dyn(&self) -> BoxFuture<'_, Result<Stats, StoreError>>;
    /// See [`Store::gauges`].
    fn gauges_dyn(&self, limit: usize) -> BoxFuture<'_, Result<Option<Gauges>, StoreError>>;
    /// See [`DeadLetters::list_dead`].
    fn list_dead_dyn<'a>(
        &'a self,
        filter: &'a DeadLetterFilter,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<DeadLetter>, StoreError>>;
    /// See [`DeadLetters::count_dead`].
    fn count_dead_dyn<'a>(
        &'a self,
        filter: &'a DeadLetterFilter,
    ) -> BoxFuture<'a, Result<u64, StoreError>>;
    /// See [`DeadLetters::replay_dead`].
    fn replay_dead_dyn<'a>(
        &'a self,
        filter: &'a DeadLetterFilter,
    ) -> BoxFuture<'a, Result<u64, StoreError>>;
    /// See [`DeadLetters::discard_dead`].
    fn discard_dead_dyn<'a>(
        &'a self,
        filter: &'a DeadLetterFilter,
    ) -> BoxFuture<'a, Result<u64, StoreError>>;
    /// See [`FindMessages::find_messages`].
    fn find_messages_dyn<'a>(
        &'a self,
        key: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<FoundMessage>, StoreError>>;
    /// See [`FindMessages::list_waiting`].
    fn list_waiting_dyn<'a>(
        &'a self,
        filter: &'a DeadLetterFilter,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<FoundMessage>, StoreError>>;
    /// See [`Purge::purge`].
    fn purge_dyn<'a>(&'a self, request: &'a PurgeRequest)
    -> BoxFuture<'a, Result<u64, StoreError>>;
    /// See [`Backend::migrate`].
    fn migrate_dyn(&self) -> BoxFuture<'_, Result<(), StoreError>>;
    /// See [`Backend::listen`].
    fn listen_dyn(&self) -> BoxFuture<'_, Result<Option<Listener>, StoreError>>;
    /// See [`Backend::notify`].
    fn notify_dyn(&self) -> BoxFuture<'_, Result<(), StoreError>>;
    /// The concrete store, for `downcast_ref` (to enqueue with
    /// its own connection types, say).
    fn as_any(&self) -> &dyn Any;
}

impl<S> DynStore for S
where
    S: Store + StoreStats + DeadLetters + FindMessages + Purge + Backend,
{
    fn capabilities_dyn(&self) -> Capabilities {
        self.capabilities()
    }
    fn claim_dyn<'a>(
        &'a self,
        request: &'a ClaimRequest,
    ) -> BoxFuture<'a, Result<Claim, StoreError>> {
        Box::pin(self.claim(request))
    }
    fn complete_dyn<'a>(
        &'a self,
        token: LeaseToken,
        completions: &'a [Completion],
    ) -> BoxFuture<'a, Result<CompleteReport, StoreError>> {
        Box::pin(self.complete(token, completions))
    }
    fn release_dyn<'a>(
        &'a self,
        token: LeaseToken,
        ids: &'a [MessageId],
    ) -> BoxFuture<'a, Result<CompleteReport, StoreError>> {
        Box::pin(self.release(token, ids))
    }
    fn stats_dyn(&self) -> BoxFuture<'_, Result<Stats, StoreError>> {
        Box::pin(self.stats())
    }
    fn gauges_dyn(&self, limit: usize) -> BoxFuture<'_, Result<Option<Gauges>, StoreError>> {
        Box::pin(self.gauges(limit))
    }
    fn list_dead_dyn<'a>(
        &'a self,
        filter: &'a DeadLetterFilter,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<DeadLetter>, StoreError>> {
        Box::pin(self.list_dead(filter, limit))
    }
    fn count_dead_dyn<'a>(
        &'a self,
        filter: &'a DeadLetterFilter,
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(self.count_dead(filter))
    }
    fn replay_dead_dyn<'a>(
        &'a self,
        filter: &'a DeadLetterFilter,
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(self.replay_dead(filter))
    }
    fn discard_dead_dyn<'a>(
        &'a self,
        filter: &'a DeadLetterFilter,
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(self.discard_dead(filter))
    }
    fn find_messages_dyn<'a>(
        &'a self,
        key: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<FoundMessage>, StoreError>> {
        Box::pin(self.find_messages(key, limit))
    }
    fn list_waiting_dyn<'a>(
        &'a self,
        filter: &'a DeadLetterFilter,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<FoundMessage>, StoreError>> {
        Box::pin(self.list_waiting(filter, limit))
    }
    fn purge_dyn<'a>(
        &'a self,
        request: &'a PurgeRequest,
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(self.purge(request))
    }
    fn migrate_dyn(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(self.migrate())
    }
    fn listen_dyn(&self) -> BoxFuture<'_, Result<Option<Listener>, StoreError>> {
        Box::pin(self.listen())
    }
    fn notify_dyn(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(self.notify())
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// A store chosen at run time: a cheap-to-clone handle to any [`DynStore`], and a store
/// itself (every store trait), so a relay runs over it like over a concrete store.
///
/// ```
/// use outbox_engine::{AnyStore, MemoryStore, Relay, testkit::RecordingSink};
///
/// let store = AnyStore::new(MemoryStore::new());
/// assert!(store.downcast_ref::<MemoryStore>().is_some());
/// let relay = Relay::builder(store).route("billing", RecordingSink::new()).build()?;
/// # Ok::<(), outbox_engine::ConfigError>(())
/// ```
#[derive(Clone)]
pub struct AnyStore(Arc<dyn DynStore>);

impl AnyStore {
    /// Wraps a concrete store.
    pub fn new(store: impl DynStore) -> Self {
        Self(Arc::new(store))
    }

    /// Wraps a store that is already shared.
    pub fn from_arc(store: Arc<dyn DynStore>) -> Self {
        Self(store)
    }

    /// The concrete store, if it is a `T` (to enqueue with its own connection types).
    pub fn downcast_ref<T: 'static>(&self) -> Option<&T> {
        self.0.as_any().downcast_ref()
    }
}

impl fmt::Debug for AnyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AnyStore")
            .field("store", &self.capabilities().store)
            .finish_non_exhaustive()
    }
}

impl Store for AnyStore {
    fn capabilities(&self) -> Capabilities {
        self.0.capabilities_dyn()
    }
    async fn claim(&self, request: &ClaimRequest) -> Result<Claim, StoreError> {
        self.0.claim_dyn(request).await
    }
    async fn complete(
        &self,
        token: LeaseToken,
        completions: &[Completion],
    ) -> Result<CompleteReport, StoreError> {
        self.0.complete_dyn(token, completions).await
    }
    async fn release(
        &self,
        token: LeaseToken,
        ids: &[MessageId],
    ) -> Result<CompleteReport, StoreError> {
        self.0.release_dyn(token, ids).await
    }
    async fn gauges(&self, limit: usize) -> Result<Option<Gauges>, StoreError> {
        self.0.gauges_dyn(limit).await
    }
}

impl StoreStats for AnyStore {
    async fn stats(&self) -> Result<Stats, StoreError> {
        self.0.stats_dyn().await
    }
}

impl DeadLetters for AnyStore {
    async fn list_dead(
        &self,
        filter: &DeadLetterFilter,
        limit: usize,
    ) -> Result<Vec<DeadLetter>, StoreError> {
        self.0.list_dead_dyn(filter, limit).await
    }
    async fn count_dead(&self, filter: &DeadLetterFilter) -> Result<u64, StoreError> {
        self.0.count_dead_dyn(filter).await
    }
    async fn replay_dead(&self, filter: &DeadLetterFilter) -> Result<u64, StoreError> {
        self.0.replay_dead_dyn(filter).await
    }
    async fn discard_dead(&self, filter: &DeadLetterFilter) -> Result<u64, StoreError> {
        self.0.discard_dead_dyn(filter).await
    }
}

impl FindMessages for AnyStore {
    async fn find_messages(
        &self,
        key: &str,
        limit: usize,
    ) -> Result<Vec<FoundMessage>, StoreError> {
        self.0.find_messages_dyn(key, limit).await
    }
    async fn list_waiting(
        &self,
        filter: &DeadLetterFilter,
        limit: usize,
    ) -> Result<Vec<FoundMessage>, StoreError> {
        self.0.list_waiting_dyn(filter, limit).await
    }
}

impl Purge for AnyStore {
    async fn purge(&self, request: &PurgeRequest) -> Result<u64, StoreError> {
        self.0.purge_dyn(request).await
    }
}

impl Backend for AnyStore {
    async fn migrate(&self) -> Result<(), StoreError> {
        self.0.migrate_dyn().await
    }
    async fn listen(&self) -> Result<Option<Listener>, StoreError> {
        self.0.listen_dyn().await
    }
    async fn notify(&self) -> Result<(), StoreError> {
        self.0.notify_dyn().await
    }
}
