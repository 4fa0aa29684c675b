//! A relay running in a task of its own, stopped through its handle.

use std::future::Future;

use tokio::sync::oneshot;
use tokio::task::{JoinError, JoinHandle};

use crate::sink::BoxFuture;

/// A relay running in a task of its own, from [`Relay::spawn`](crate::Relay::spawn).
///
/// [`stop`](Self::stop) shuts it down gracefully and waits for it. Dropping the handle
/// leaves the relay running, as dropping a `JoinHandle` leaves its task.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use outbox_engine::testkit::RecordingSink;
/// use outbox_engine::{MemoryStore, NewMessage, Relay};
///
/// let store = MemoryStore::new();
/// let sink = RecordingSink::new();
/// let relay = Relay::builder(store.clone())
///     .route("orders", sink.clone())
///     .wakeup(store.wakeup())
///     .build()
///     .unwrap();
/// let running = relay.spawn();
/// store.enqueue(NewMessage::builder("orders", "order.paid").build().unwrap()).unwrap();
/// while sink.is_empty() {
///     tokio::time::sleep(std::time::Duration::from_millis(5)).await;
/// }
/// running.stop().await.unwrap();
/// # });
/// ```
#[derive(Debug)]
#[must_use = "a dropped handle cannot stop the relay"]
pub struct RunningRelay {
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

impl RunningRelay {
    /// Spawns `run` on the current Tokio runtime, handing it the future that completes
    /// when [`stop`](Self::stop) is called: for a relay wrapped in something of its own
    /// (the front crate's `Outbox`), whose `run` takes a shutdown future as
    /// [`Relay::run`](crate::Relay::run) does.
    ///
    /// # Panics
    ///
    /// Outside a Tokio runtime.
    pub fn spawn<F, Fut>(run: F) -> Self
    where
        F: FnOnce(BoxFuture<'static, ()>) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let (stop, stopped) = oneshot::channel::<()>();
        let shutdown = Box::pin(async move {
            // A dropped handle is not a stop.
            if stopped.await.is_err() {
                std::future::pending::<()>().await;
            }
        });
        Self {
            stop,
            task: tokio::spawn(run(shutdown)),
        }
    }

    /// Shuts the relay down as [`Relay::run`](crate::Relay::run) does when its shutdown
    /// completes (in-flight batches finish within the shutdown grace, the leases of the
    /// rest are given back), and waits for it.
    ///
    /// # Errors
    ///
    /// The relay's task panicked, or its runtime was shut down first.
    pub async fn stop(self) -> Result<(), JoinError> {
        let _ = self.stop.send(());
        self.task.await
    }
}
