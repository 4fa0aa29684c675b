//! A [`Publication`]: one claimed batch on its way through the sinks, handing out each
//! message's outcome as a [`Done`] as it arrives.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tracing::{Instrument, info_span};

use super::Inner;
use crate::message::Message;
use crate::sink::{DynSink, Failure, FailureClass, Outcome, Outcomes, PublishContext};
use crate::store::Store;

/// A message of a claimed batch with its outcome.
pub(super) struct Done {
    batch: Arc<[Message]>,
    index: usize,
    pub(super) outcome: Outcome,
}

impl Done {
    pub(super) fn message(&self) -> &Message {
        &self.batch[self.index]
    }
}

/// What a sink reported for its group: one message's outcome, or every message's in order.
enum Reported {
    One(usize, Outcome),
    All(Vec<Outcome>),
}

/// One claimed batch on its way through the sinks: one task per sink group, each
/// reporting outcomes as they arrive, plus the relay's own verdicts (no route, claimed
/// too often), known at once.
pub(super) struct Publication {
    /// Each group's messages, as its sink sees them (shared with the task, not copied).
    groups: Vec<Arc<[Message]>>,
    /// Which messages of each group have an outcome.
    reported: Vec<Vec<bool>>,
    /// Each task ends with whether the publish timeout cut it short.
    tasks: JoinSet<bool>,
    task_group: HashMap<tokio::task::Id, usize>,
    /// Each group's outcomes as its sink reports them.
    receiver: mpsc::UnboundedReceiver<(usize, Reported)>,
    verdicts: Vec<Done>,
    timeout: Duration,
}

impl Publication {
    pub(super) fn start<S: Store>(relay: &Inner<S>, messages: Vec<Message>) -> Self {
        let mut verdicts = (Vec::new(), Vec::new());
        let mut by_sink: Vec<(Arc<dyn DynSink>, Vec<Message>)> = Vec::new();
        let limit = relay.retry.attempt_limit();
        for message in messages {
            if message.attempts > limit {
                // The claim counts an attempt, and a relay dead-letters a row at the first
                // claim past the limit: a row past it by more came that way.
                let reason = if message.attempts == limit.saturating_add(1) {
                    // Claimed again and again without a completion: it crashes or hangs relays.
                    format!(
                        "claimed {} times without completing (relay crash or lease loss each time)",
                        message.attempts
                    )
                } else {
                    format!(
                        "the row arrived with attempts = {} (above the limit of {limit}): written so, or the limit was lowered since",
                        message.attempts - 1
                    )
                };
                verdicts.0.push(message);
                verdicts
                    .1
                    .push(Outcome::permanent(FailureClass::Other, reason));
                continue;
            }
            match relay.routes.get(&message.destination) {
                Some(sink) => match by_sink.iter_mut().find(|(s, _)| Arc::ptr_eq(s, sink)) {
                    Some((_, group)) => group.push(message),
                    None => by_sink.push((Arc::clone(sink), vec![message])),
                },
                None => {
                    let reason = format!("no route for destination {:?}", message.destination);
                    verdicts.0.push(message);
                    verdicts
                        .1
                        .push(Outcome::permanent(FailureClass::UnknownDestination, reason));
                }
            }
        }
        let judged: Arc<[Message]> = verdicts.0.into();
        let verdicts = verdicts
            .1
            .into_iter()
            .enumerate()
            .map(|(index, outcome)| Done {
                batch: Arc::clone(&judged),
                index,
                outcome,
            })
            .collect();
        let (sender, receiver) = mpsc::unbounded_channel();
        let mut publication = Self {
            groups: Vec::with_capacity(by_sink.len()),
            reported: Vec::with_capacity(by_sink.len()),
            tasks: JoinSet::new(),
            task_group: HashMap::new(),
            receiver,
            verdicts,
            timeout: relay.publish_timeout,
        };
        // Each group runs as its own task, so a panicking sink fails its own messages, not
        // the worker, and a slow sink holds back only its own messages.
        for (group, (sink, members)) in by_sink.into_iter().enumerate() {
            let batch: Arc<[Message]> = members.into();
            let (sender, whole) = (sender.clone(), sender.clone());
            let outcomes = Outcomes::batched(
                move |index, outcome| {
                    let _ = sender.send((group, Reported::One(index, outcome)));
                },
                move |all| {
                    let _ = whole.send((group, Reported::All(all)));
                },
            );
            let (shared, timeout) = (Arc::clone(&batch), publication.timeout);
            let destination = batch[0].destination.clone();
            let span = info_span!(
                "outbox_publish",
                destination = %destination,
                count = batch.len(),
                ids = ?batch.iter().map(|m| m.id).collect::<Vec<_>>()
            );
            #[cfg(feature = "opentelemetry")]
            crate::trace::link_messages(&span, &batch);
            let handle = publication.tasks.spawn(
                async move {
                    // The sink is told the deadline; the timeout is the backstop if it
                    // ignores it.
                    let cx = PublishContext::timeout(timeout);
                    let started = tokio::time::Instant::now();
                    let publish = sink.publish_reporting_dyn(&shared, &cx, &outcomes);
                    let timed_out = tokio::time::timeout_at(cx.deadline(), publish).await.is_err();
                    metrics::histogram!("outbox_publish_duration_seconds", "destination" => destination)
                        .record(started.elapsed().as_secs_f64());
                    timed_out
                }
                .instrument(span),
            );
            publication.task_group.insert(handle.id(), group);
            publication.reported.push(vec![false; batch.len()]);
            publication.groups.push(batch);
        }
        publication
    }

    /// The outcomes that arrived since the last call, waiting for at least one; `None`
    /// once every message has its outcome.
    pub(super) async fn next_outcomes(&mut self) -> Option<Vec<Done>> {
        let mut ready = std::mem::take(&mut self.verdicts);
        loop {
            self.take_reported(&mut ready);
            if !ready.is_empty() {
                return Some(ready);
            }
            if self.tasks.is_empty() {
                return None;
            }
            tokio::select! {
                Some((group, reported)) = self.receiver.recv() => {
                    self.accept_reported(group, reported, &mut ready);
                }
                Some(joined) = self.tasks.join_next_with_id() => {
                    // Whatever the task reported before it ended is already queued.
                    self.take_reported(&mut ready);
                    let (id, failure) = match joined {
                        Ok((id, true)) => (id, Failure::retryable(
                            FailureClass::Timeout,
                            format!("publish timed out after {:?}", self.timeout),
                        )),
                        Ok((id, false)) => (id, Failure::retryable(
                            FailureClass::Other,
                            "the sink reported no outcome for this message",
                        )),
                        Err(error) => (error.id(), Failure::retryable(
                            FailureClass::Other,
                            format!("sink task failed: {error}"),
                        )),
                    };
                    let group = self.task_group[&id];
                    self.finish(group, failure, &mut ready);
                }
            }
        }
    }

    /// Moves every queued report into `ready`.
    fn take_reported(&mut self, ready: &mut Vec<Done>) {
        while let Ok((group, reported)) = self.receiver.try_recv() {
            self.accept_reported(group, reported, ready);
        }
    }

    fn accept_reported(&mut self, group: usize, reported: Reported, ready: &mut Vec<Done>) {
        match reported {
            Reported::One(index, outcome) => self.accept(group, index, outcome, ready),
            Reported::All(outcomes) => {
                ready.reserve(outcomes.len());
                for (index, outcome) in outcomes.into_iter().enumerate() {
                    self.accept(group, index, outcome, ready);
                }
            }
        }
    }

    /// Keeps the first outcome reported for a message; later ones and bad indexes are
    /// ignored.
    fn accept(&mut self, group: usize, index: usize, outcome: Outcome, ready: &mut Vec<Done>) {
        if let Some(reported) = self.reported[group].get_mut(index)
            && !*reported
        {
            *reported = true;
            ready.push(Done {
                batch: Arc::clone(&self.groups[group]),
                index,
                outcome,
            });
        }
    }

    /// A group's task ended (returned, timed out or panicked): every message it left
    /// without an outcome gets `failure`.
    fn finish(&mut self, group: usize, failure: Failure, ready: &mut Vec<Done>) {
        for index in 0..self.groups[group].len() {
            self.accept(group, index, failure.clone().into(), ready);
        }
    }
}
