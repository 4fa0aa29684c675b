//! The timeout layer: one publish call gets at most a fixed time.

use std::time::Duration;

use tokio::time::Instant;

use crate::message::Message;
use crate::sink::{Failure, FailureClass, Outcomes, PublishContext, ReportingSink, Sink, Tracker};

/// Gives each publish call at most `timeout` (or less, when the relay's deadline comes
/// first): the inner sink sees the tighter deadline, and the messages it has not answered
/// when it passes fail retryably as timeouts.
#[derive(Debug, Clone)]
pub struct Timeout<S> {
    inner: S,
    timeout: Duration,
}

impl<S> Timeout<S> {
    /// Wraps `inner`.
    pub fn new(inner: S, timeout: Duration) -> Self {
        Self { inner, timeout }
    }
}

impl<S: Sink> ReportingSink for Timeout<S> {
    async fn publish_each(&self, batch: &[Message], cx: &PublishContext, outcomes: &Outcomes) {
        let cx = cx.narrowed(Instant::now() + self.timeout);
        let tracker = Tracker::new(batch.len(), outcomes, |_, _| {});
        let call = self.inner.publish_reporting(batch, &cx, tracker.outcomes());
        if tokio::time::timeout_at(cx.deadline(), call).await.is_err() {
            tracker.fail_rest(&Failure::retryable(
                FailureClass::Timeout,
                format!("no answer within the route's timeout ({:?})", self.timeout),
            ));
        }
    }
}
