//! Model-based property test of the row state machine, through the in-memory store.
//!
//! Random sequences of claims, sink acks, completions, releases, relay crashes, replays
//! and clock jumps run against `MemoryStore` and against an independent model written
//! here. After every step the store must equal the model; completions by a relay whose
//! lease was taken over must change nothing; at the end, a recovery relay finishes every
//! row: nothing is lost and nothing was published without a sink ack.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use outbox_engine::state::RowState;
use outbox_engine::{
    ClaimRequest, Clock, Completion, DeadLetterFilter, DeadLetters, LeaseToken, ManualClock,
    MemoryStore, MessageId, NewMessage, Status, Store,
};
use proptest::prelude::*;

const WORKERS: usize = 3;
const LEASE_SECS: i64 = 30;

#[derive(Debug, Clone)]
enum Op {
    Enqueue {
        n: usize,
        delay_secs: u64,
    },
    Claim {
        worker: usize,
        batch: usize,
    },
    Ack {
        worker: usize,
        mask: u8,
    },
    Complete {
        worker: usize,
        choices: u8,
        delay_secs: u64,
    },
    Release {
        worker: usize,
    },
    Crash {
        worker: usize,
    },
    Advance {
        secs: u64,
    },
    Replay,
}

fn op() -> impl Strategy<Value = Op> {
    let w = 0..WORKERS;
    prop_oneof![
        2 => (1..4usize, prop_oneof![Just(0u64), 0..50u64]).prop_map(|(n, delay_secs)| Op::Enqueue { n, delay_secs }),
        4 => (w.clone(), 1..6usize).prop_map(|(worker, batch)| Op::Claim { worker, batch }),
        3 => (w.clone(), any::<u8>()).prop_map(|(worker, mask)| Op::Ack { worker, mask }),
        3 => (w.clone(), any::<u8>(), 0..60u64).prop_map(|(worker, choices, delay_secs)| Op::Complete { worker, choices, delay_secs }),
        1 => w.clone().prop_map(|worker| Op::Release { worker }),
        1 => w.prop_map(|worker| Op::Crash { worker }),
        2 => (0..45u64).prop_map(|secs| Op::Advance { secs }),
        1 => Just(Op::Replay),
    ]
}

/// What the model expects of one row.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Expect {
    Pending { due: i64 },
    Leased { token: LeaseToken, until: i64 },
    Published,
    Dead,
}

struct Model {
    now: i64,
    rows: BTreeMap<MessageId, (Expect, u32)>,
    /// What each worker holds: its token and claimed ids.
    held: Vec<Option<(LeaseToken, Vec<MessageId>)>>,
    /// Ids a sink acknowledged (the only ones that may ever be published).
    acked: HashSet<MessageId>,
}

impl Model {
    fn claimable(&self, id: &MessageId) -> bool {
        match self.rows[id].0 {
            Expect::Pending { due } => due <= self.now,
            Expect::Leased { until, .. } => until <= self.now,
            _ => false,
        }
    }
}

struct World {
    store: MemoryStore,
    clock: ManualClock,
    start: chrono::DateTime<chrono::Utc>,
    model: Model,
}

impl World {
    fn new() -> Self {
        let clock = ManualClock::new();
        Self {
            store: MemoryStore::with_clock(clock.clone()),
            start: clock.now(),
            clock,
            model: Model {
                now: 0,
                rows: BTreeMap::new(),
                held: vec![None; WORKERS],
                acked: HashSet::new(),
            },
        }
    }

    fn secs(&self, t: chrono::DateTime<chrono::Utc>) -> i64 {
        (t - self.start).num_milliseconds() / 1000
    }

    async fn apply(&mut self, op: &Op) {
        let m = &mut self.model;
        match *op {
            Op::Enqueue { n, delay_secs } => {
                let msgs: Vec<_> = (0..n)
                    .map(|i| {
                        NewMessage::builder("d", "e")
                            .json(&i)
                            .delay(Duration::from_secs(delay_secs))
                            .build()
                            .unwrap()
                    })
                    .collect();
                for msg in &msgs {
                    m.rows.insert(
                        msg.id(),
                        (
                            Expect::Pending {
                                due: m.now + delay_secs as i64,
                            },
                            0,
                        ),
                    );
                }
                self.store.enqueue_all(msgs).unwrap();
            }
            Op::Claim { worker, batch } => {
                let expected: Vec<MessageId> = m
                    .rows
                    .keys()
                    .filter(|id| m.claimable(id))
                    .take(batch)
                    .copied()
                    .collect();
                let claim = self
                    .store
                    .claim(&ClaimRequest::new(
                        format!("w{worker}"),
                        batch,
                        Duration::from_secs(LEASE_SECS as u64),
                    ))
                    .await
                    .unwrap();
                let got: Vec<MessageId> = claim.messages.iter().map(|x| x.id).collect();
                assert_eq!(
                    got, expected,
                    "claim returns exactly the due rows, oldest first"
                );
                for msg in &claim.messages {
                    let row = m.rows.get_mut(&msg.id).unwrap();
                    row.1 += 1;
                    assert_eq!(msg.attempts, row.1, "attempts on the claimed message");
                    row.0 = Expect::Leased {
                        token: claim.lease.token,
                        until: m.now + LEASE_SECS,
                    };
                }
                // A worker that claims again has abandoned (crashed out of) its old batch.
                m.held[worker] = (!got.is_empty()).then_some((claim.lease.token, got));
            }
            Op::Ack { worker, mask } => {
                if let Some((_, ids)) = &m.held[worker] {
                    for (i, id) in ids.iter().enumerate() {
                        if mask & (1 << (i % 8)) != 0 {
                            m.acked.insert(*id);
                        }
                    }
                }
            }
            Op::Complete {
                worker,
                choices,
                delay_secs,
            } => {
                let Some((token, ids)) = m.held[worker].take() else {
                    return;
                };
                let completions: Vec<Completion> = ids
                    .iter()
                    .enumerate()
                    .map(|(i, id)| {
                        if m.acked.contains(id) {
                            Completion::published(*id)
                        } else if choices & (1 << (i % 8)) != 0 && i % 2 == 0 {
                            Completion::retry(*id, Duration::from_secs(delay_secs), "retryable")
                        } else if choices & (1 << (i % 8)) != 0 {
                            Completion::defer(*id, Duration::from_secs(delay_secs), "not sent")
                        } else {
                            Completion::dead(*id, "permanent")
                        }
                    })
                    .collect();
                let before = self.store.rows();
                let report = self.store.complete(token, &completions).await.unwrap();
                let mut stale = Vec::new();
                for c in &completions {
                    let row = m.rows.get_mut(&c.id).unwrap();
                    if !matches!(row.0, Expect::Leased { token: t, .. } if t == token) {
                        stale.push(c.id);
                        continue;
                    }
                    row.0 = match &c.action {
                        outbox_engine::CompleteAction::Published => Expect::Published,
                        outbox_engine::CompleteAction::Retry { delay, .. } => Expect::Pending {
                            due: m.now + delay.as_secs() as i64,
                        },
                        outbox_engine::CompleteAction::Defer { delay, .. } => {
                            row.1 -= 1; // not sent: the attempt is given back
                            Expect::Pending {
                                due: m.now + delay.as_secs() as i64,
                            }
                        }
                        outbox_engine::CompleteAction::Dead { .. } => Expect::Dead,
                    };
                }
                assert_eq!(
                    report.stale, stale,
                    "stale completions are reported, id by id"
                );
                assert_eq!(report.applied, completions.len() - stale.len());
                let after = self.store.rows();
                for (b, a) in before.iter().zip(&after) {
                    if stale.contains(&b.message.id) {
                        assert_eq!(b, a, "a fenced completion changed row {}", b.message.id);
                    }
                }
            }
            Op::Release { worker } => {
                let Some((token, ids)) = m.held[worker].take() else {
                    return;
                };
                let report = self.store.release(token, &ids).await.unwrap();
                let mut applied = 0;
                for id in &ids {
                    let row = m.rows.get_mut(id).unwrap();
                    if matches!(row.0, Expect::Leased { token: t, .. } if t == token) {
                        row.0 = Expect::Pending { due: m.now };
                        row.1 -= 1;
                        applied += 1;
                    }
                }
                assert_eq!(report.applied, applied);
            }
            Op::Crash { worker } => m.held[worker] = None,
            Op::Advance { secs } => {
                self.clock.advance(Duration::from_secs(secs));
                m.now += secs as i64;
            }
            Op::Replay => {
                let n = self
                    .store
                    .replay_dead(&DeadLetterFilter::all())
                    .await
                    .unwrap();
                let mut expected = 0;
                for row in m.rows.values_mut() {
                    if row.0 == Expect::Dead {
                        *row = (Expect::Pending { due: m.now }, 0);
                        expected += 1;
                    }
                }
                assert_eq!(n, expected);
            }
        }
        self.check();
    }

    /// The store equals the model, row by row.
    fn check(&self) {
        let rows = self.store.rows();
        assert_eq!(
            rows.len(),
            self.model.rows.len(),
            "no row appears or disappears"
        );
        for snap in rows {
            let (expect, attempts) = &self.model.rows[&snap.message.id];
            assert_eq!(
                snap.row.attempts, *attempts,
                "attempts of {}",
                snap.message.id
            );
            let actual = match &snap.row.state {
                RowState::Pending { available_at } => Expect::Pending {
                    due: self.secs(*available_at),
                },
                RowState::Leased(lease) => Expect::Leased {
                    token: lease.token,
                    until: self.secs(lease.until),
                },
                RowState::Published { .. } => Expect::Published,
                RowState::Dead { .. } => Expect::Dead,
            };
            assert_eq!(&actual, expect, "state of {}", snap.message.id);
            if actual == Expect::Published {
                assert!(
                    self.model.acked.contains(&snap.message.id),
                    "published without a sink ack"
                );
            }
        }
    }

    /// A healthy relay arrives after everything else died: it must finish every row.
    async fn recover(&mut self) {
        self.clock.advance(Duration::from_secs(3600));
        self.model.now += 3600;
        loop {
            let claim = self
                .store
                .claim(&ClaimRequest::new("recovery", 50, Duration::from_secs(30)))
                .await
                .unwrap();
            if claim.messages.is_empty() {
                break;
            }
            let done: Vec<_> = claim
                .messages
                .iter()
                .map(|m| Completion::published(m.id))
                .collect();
            self.model.acked.extend(claim.messages.iter().map(|m| m.id));
            let report = self.store.complete(claim.lease.token, &done).await.unwrap();
            assert!(report.stale.is_empty());
        }
        let mut finished: HashMap<Status, usize> = HashMap::new();
        for snap in self.store.rows() {
            *finished.entry(snap.row.status()).or_default() += 1;
            if snap.row.status() == Status::Published {
                assert!(
                    self.model.acked.contains(&snap.message.id),
                    "published without a sink ack"
                );
            }
        }
        let total = finished.get(&Status::Published).unwrap_or(&0)
            + finished.get(&Status::Dead).unwrap_or(&0);
        assert_eq!(
            total,
            self.model.rows.len(),
            "every row ends published or dead: none lost ({finished:?})"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn store_follows_the_state_machine(ops in proptest::collection::vec(op(), 1..80)) {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(async {
            let mut world = World::new();
            for op in &ops {
                world.apply(op).await;
            }
            world.recover().await;
        });
    }
}
