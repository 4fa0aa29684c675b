//! The concurrency layer: at most N publish calls in flight at once.

use std::sync::Arc;

use tokio::sync::Semaphore;

use crate::message::Message;
use crate::sink::{Failure, FailureClass, Outcome, Outcomes, PublishContext, Sink};

/// Lets at most `calls` publish calls reach the inner sink at once (relay workers share
/// it). A call that finds no free slot before its deadline sends nothing: its messages
/// fail retryably, deferred (the attempt does not count).
#[derive(Debug, Clone)]
pub struct ConcurrencyLimit<S> {
    inner: S,
    slots: Arc<Semaphore>,
    calls: usize,
}

impl<S> ConcurrencyLimit<S> {
    /// Wraps `inner`; `calls` is at least 1.
    pub fn new(inner: S, calls: usize) -> Self {
        let calls = calls.max(1);
        Self {
            inner,
            slots: Arc::new(Semaphore::new(calls)),
            calls,
        }
    }

    fn refused(&self, len: usize) -> Vec<Outcome> {
        let failure = Failure::retryable(
            FailureClass::Unavailable,
            format!(
                "not sent: the route's {} publish slot(s) stayed busy until the deadline",
                self.calls
            ),
        )
        .deferred();
        vec![failure.into(); len]
    }
}

impl<S: Sink> Sink for ConcurrencyLimit<S> {
    async fn publish(
        &self,
        batch: &[Message],
        cx: &PublishContext,
    ) -> Result<Vec<Outcome>, Failure> {
        match tokio::time::timeout_at(cx.deadline(), self.slots.acquire()).await {
            Ok(Ok(_slot)) => self.inner.publish(batch, cx).await,
            _ => Ok(self.refused(batch.len())),
        }
    }

    async fn publish_reporting(&self, batch: &[Message], cx: &PublishContext, outcomes: &Outcomes) {
        match tokio::time::timeout_at(cx.deadline(), self.slots.acquire()).await {
            Ok(Ok(_slot)) => self.inner.publish_reporting(batch, cx, outcomes).await,
            _ => outcomes.report_all(batch.len(), Ok(self.refused(batch.len()))),
        }
    }
}
