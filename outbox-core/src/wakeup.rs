//! A wakeup signal: raised when new rows may be due, so relays skip the rest of a poll.

use std::sync::Arc;

use tokio::sync::watch;

/// A cloneable wakeup signal. Any number of sources raise it ([`notify`](Wakeup::notify));
/// every relay worker that [`subscribe`](Wakeup::subscribe)d sees each raise, even one that
/// happened while it was busy, so no wakeup is lost between a claim and the next wait.
/// Raises coalesce: a thousand raises during one claim cause one extra claim.
///
/// ```
/// # tokio_test_shim::block_on(async {
/// use outbox_engine::Wakeup;
///
/// let wakeup = Wakeup::new();
/// let mut listener = wakeup.subscribe();
/// wakeup.notify();
/// listener.wait().await; // returns at once: the raise above was not lost
/// # });
/// # mod tokio_test_shim { pub fn block_on<F: std::future::Future>(f: F) -> F::Output {
/// #   tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(f) } }
/// ```
#[derive(Debug, Clone)]
pub struct Wakeup {
    sender: Arc<watch::Sender<u64>>,
}

impl Default for Wakeup {
    fn default() -> Self {
        Self::new()
    }
}

impl Wakeup {
    /// A new signal with no listeners.
    pub fn new() -> Self {
        Self {
            sender: Arc::new(watch::Sender::new(0)),
        }
    }

    /// Raises the signal.
    pub fn notify(&self) {
        self.sender.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// A listener that sees raises from now on.
    pub fn subscribe(&self) -> WakeupListener {
        WakeupListener {
            receiver: self.sender.subscribe(),
        }
    }
}

/// One listener of a [`Wakeup`].
#[derive(Debug)]
pub struct WakeupListener {
    receiver: watch::Receiver<u64>,
}

impl WakeupListener {
    /// Waits until the signal is raised after the last `wait` (or `subscribe`).
    pub async fn wait(&mut self) {
        // The sender lives as long as any `Wakeup` clone; if every clone is gone no raise
        // can come, so wait forever and let the poll timer win.
        if self.receiver.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// Forgets raises seen so far (call right before claiming).
    pub fn mark_seen(&mut self) {
        self.receiver.borrow_and_update();
    }
}
