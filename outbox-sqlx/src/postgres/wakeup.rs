//! Wakeups on PostgreSQL: NOTIFY after commit, a coalescing notifier, and a LISTEN
//! connection that raises a relay's [`Wakeup`].

use std::sync::Arc;
use std::time::Duration;

use outbox_engine::{Listener, StoreError, Wakeup};
use outbox_sql::Dialect;
use outbox_sql::postgres::NOTIFY_CHANNEL;
use sqlx::postgres::PgListener;
use tokio::sync::watch;
use tracing::{debug, warn};

use super::PgOutbox;
use crate::error::classify;

/// The NOTIFY behind [`SqlOutbox::notify`](crate::SqlOutbox::notify) on PostgreSQL.
/// Sent after commit: a NOTIFY inside the transaction would serialise all committing
/// transactions on the notification queue lock.
pub(super) async fn notify(store: &PgOutbox) -> Result<(), StoreError> {
    sqlx::query(&store.sql.notify)
        .bind(label(store))
        .execute(&store.pool)
        .await
        .map_err(classify)?;
    Ok(())
}

impl PgOutbox {
    /// A coalescing notifier: [`PgNotifier::notify`] never blocks; calls while a NOTIFY
    /// is in flight, or soon after one, cause one more NOTIFY a little later. A lone
    /// commit's NOTIFY goes out at once. Under load (a call after every commit) the gap
    /// between NOTIFYs follows the rate of calls: about 1 ms per thousand calls per
    /// second, from 1 ms up to 10 ms (5 ms at 5,000 commits/s), so each NOTIFY wakes
    /// the relays for many rows instead of one NOTIFY and one claim per commit taxing
    /// the writers' database. Needs a Tokio runtime. The background task ends when every
    /// clone of the notifier is dropped, after sending the NOTIFY still owed.
    pub fn notifier(&self) -> PgNotifier {
        let (raise, mut raised) = watch::channel(0_u64);
        let outbox = self.clone();
        tokio::spawn(async move {
            let (mut seen, mut since) = (0_u64, tokio::time::Instant::now());
            // `changed` reports a raise not yet seen even after the last sender is gone,
            // so the task sends the NOTIFY it owes before it ends.
            while raised.changed().await.is_ok() {
                let sent = tokio::time::Instant::now();
                let calls = raised.borrow_and_update().wrapping_sub(seen);
                seen = seen.wrapping_add(calls);
                let gap = notify_gap(calls, sent - since);
                since = sent;
                if let Err(error) = outbox.notify().await {
                    warn!(%error, "outbox NOTIFY failed; relays will find the rows on their next poll");
                }
                tokio::time::sleep_until(sent + gap).await;
            }
        });
        PgNotifier {
            raise: Arc::new(raise),
        }
    }
}

/// The LISTEN connection behind [`Backend::listen`](outbox_engine::Backend::listen): a
/// dedicated connection (never inside a transaction) that raises the wakeup on each NOTIFY
/// for this table. It reconnects by itself after a connection loss and raises the wakeup
/// once after each reconnect, since notifications sent meanwhile are lost. Dropping the
/// [`Listener`] stops it.
pub(super) async fn listener(store: &PgOutbox) -> Result<Listener, StoreError> {
    let mut listener = PgListener::connect_with(&store.pool)
        .await
        .map_err(classify)?;
    listener.listen(NOTIFY_CHANNEL).await.map_err(classify)?;
    let wakeup = Wakeup::new();
    let signal = wakeup.clone();
    let label = label(store);
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
                    tokio::time::sleep(outbox_engine::full_jitter(backoff)).await;
                    backoff = (backoff * 2).min(Duration::from_secs(10));
                }
            }
        }
    });
    Ok(Listener::new(wakeup, AbortOnDrop(task)))
}

/// The NOTIFY payload: the qualified table name, so listeners of other tables ignore it.
fn label(outbox: &PgOutbox) -> String {
    outbox.names.render(Dialect::Postgres, "{outbox}")
}

/// The gap a [`PgOutbox::notifier`] leaves after a NOTIFY, given the `calls` made in the
/// `elapsed` time since the one before: 1 ms per call per millisecond, within 1–10 ms.
fn notify_gap(calls: u64, elapsed: Duration) -> Duration {
    let per_ms = calls as f64 / elapsed.as_secs_f64().max(1e-6) / 1000.0;
    Duration::from_secs_f64(per_ms.clamp(1.0, 10.0) / 1000.0)
}

/// Sends coalesced NOTIFYs from a background task; see [`PgOutbox::notifier`].
#[derive(Debug, Clone)]
pub struct PgNotifier {
    raise: Arc<watch::Sender<u64>>,
}

impl PgNotifier {
    /// Asks for a NOTIFY soon; returns at once. Call after your transaction committed.
    pub fn notify(&self) {
        self.raise
            .send_modify(|calls| *calls = calls.wrapping_add(1));
    }
}

#[derive(Debug)]
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gap_follows_the_rate_of_calls_within_bounds() {
        let ms = Duration::from_millis;
        assert_eq!(notify_gap(1, ms(500)), ms(1), "a lone call: the floor");
        assert_eq!(notify_gap(2, ms(1)), ms(2), "2,000 calls/s");
        assert_eq!(notify_gap(25, ms(5)), ms(5), "5,000 calls/s");
        assert_eq!(
            notify_gap(1_000, ms(10)),
            ms(10),
            "100,000 calls/s: the ceiling"
        );
        assert_eq!(notify_gap(3, Duration::ZERO), ms(10), "no time measured");
    }
}
