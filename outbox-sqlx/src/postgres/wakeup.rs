//! Wakeups on PostgreSQL: NOTIFY after commit, a coalescing notifier, and a LISTEN
//! connection that raises a relay's [`Wakeup`].

use std::sync::Arc;
use std::time::Duration;

use outbox_engine::{StoreError, Wakeup};
use outbox_sql::Dialect;
use outbox_sql::postgres::NOTIFY_CHANNEL;
use sqlx::postgres::PgListener;
use tracing::{debug, warn};

use super::PgOutbox;
use crate::error::classify;

impl PgOutbox {
    /// Sends a wakeup to relays listening in other processes. Call it **after** your
    /// transaction committed: a NOTIFY inside the transaction would serialise all
    /// committing transactions on the notification queue lock. For many writers, use a
    /// coalescing [`notifier`](Self::notifier) instead.
    ///
    /// # Errors
    ///
    /// The database's error; the outbox rows are committed anyway and the relay's poll
    /// will find them.
    pub async fn notify(&self) -> Result<(), StoreError> {
        sqlx::query(&self.sql.notify)
            .bind(label(self))
            .execute(&self.pool)
            .await
            .map_err(classify)?;
        Ok(())
    }

    /// A coalescing notifier: [`PgNotifier::notify`] never blocks, and any number of calls
    /// while a NOTIFY is in flight cause one more NOTIFY. Needs a Tokio runtime; the
    /// background task stops when every clone of the notifier is dropped.
    pub fn notifier(&self) -> PgNotifier {
        let signal = Wakeup::new();
        let mut listener = signal.subscribe();
        let outbox = self.clone();
        let task = tokio::spawn(async move {
            loop {
                listener.wait().await;
                if let Err(error) = outbox.notify().await {
                    warn!(%error, "outbox NOTIFY failed; relays will find the rows on their next poll");
                }
            }
        });
        PgNotifier {
            signal,
            _task: Arc::new(AbortOnDrop(task)),
        }
    }

    /// Starts listening for NOTIFY wakeups on a dedicated connection (never inside a
    /// transaction) and returns a handle whose [`Wakeup`] you pass to the relay. The
    /// listener reconnects by itself after a connection loss and raises the wakeup once
    /// after each reconnect, since notifications sent meanwhile are lost.
    ///
    /// # Errors
    ///
    /// The first connection or `LISTEN` failed.
    pub async fn listen(&self) -> Result<PgWakeupListener, StoreError> {
        let mut listener = PgListener::connect_with(&self.pool)
            .await
            .map_err(classify)?;
        listener.listen(NOTIFY_CHANNEL).await.map_err(classify)?;
        let wakeup = Wakeup::new();
        let signal = wakeup.clone();
        let label = label(self);
        let task = tokio::spawn(async move {
            let mut backoff = Duration::from_millis(100);
            loop {
                match listener.try_recv().await {
                    Ok(Some(notification)) => {
                        backoff = Duration::from_millis(100);
                        if notification.payload() == label {
                            signal.notify();
                        }
                    }
                    Ok(None) => {
                        debug!("outbox listener connection lost; reconnecting");
                        signal.notify();
                    }
                    Err(error) => {
                        warn!(%error, "outbox listener failed; retrying");
                        signal.notify();
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(Duration::from_secs(10));
                    }
                }
            }
        });
        Ok(PgWakeupListener {
            wakeup,
            _task: AbortOnDrop(task),
        })
    }
}

/// The NOTIFY payload: the qualified table name, so listeners of other tables ignore it.
fn label(outbox: &PgOutbox) -> String {
    outbox.names.render(Dialect::Postgres, "{outbox}")
}

/// Sends coalesced NOTIFYs from a background task; see [`PgOutbox::notifier`].
#[derive(Debug, Clone)]
pub struct PgNotifier {
    signal: Wakeup,
    _task: Arc<AbortOnDrop>,
}

impl PgNotifier {
    /// Asks for a NOTIFY soon; returns at once. Call after your transaction committed.
    pub fn notify(&self) {
        self.signal.notify();
    }
}

/// A running LISTEN connection; see [`PgOutbox::listen`]. Dropping it stops listening.
#[derive(Debug)]
pub struct PgWakeupListener {
    wakeup: Wakeup,
    _task: AbortOnDrop,
}

impl PgWakeupListener {
    /// The signal raised on each NOTIFY for this table; pass it to the relay builder.
    pub fn wakeup(&self) -> Wakeup {
        self.wakeup.clone()
    }
}

#[derive(Debug)]
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
