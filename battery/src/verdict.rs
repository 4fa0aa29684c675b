//! Counting, Jepsen-style: what committed (the ledger the writers kept in their own
//! transactions) against what the consumer received (every delivery, in arrival order).

use std::collections::{HashMap, HashSet};
use std::fmt;

/// One committed message, as the ledger recorded it: its partition key and its number
/// among that key's commits (1, 2, 3, … in commit order, numbered by the writers' own
/// key row, not by the outbox).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Committed {
    /// The partition key.
    pub key: String,
    /// The commit's number within its key.
    pub seq: i64,
}

/// The counts of one battery run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Messages whose transaction committed.
    pub committed: usize,
    /// Deliveries the consumer recorded, duplicates included.
    pub deliveries: usize,
    /// Committed, never received.
    pub lost: usize,
    /// Received, never committed (a rolled-back message announced, or garbage).
    pub unexpected: usize,
    /// Deliveries of a message received before.
    pub duplicates: usize,
    /// First deliveries of a message that arrived after a later commit of the same key
    /// had arrived. Counted on first deliveries: a consumer deduplicates re-sends (with an
    /// inbox), and what it then sees per key must be commit order.
    pub out_of_order: usize,
}

impl Counts {
    /// Counts `deliveries` (message ids in arrival order) against `committed`.
    ///
    /// ```
    /// use std::collections::HashMap;
    /// use outbox_battery::verdict::{Committed, Counts};
    ///
    /// let committed = HashMap::from([
    ///     ("a".to_owned(), Committed { key: "k".into(), seq: 1 }),
    ///     ("b".to_owned(), Committed { key: "k".into(), seq: 2 }),
    /// ]);
    /// let counts = Counts::of(&committed, &["b".into(), "a".into(), "a".into()]);
    /// assert_eq!((counts.lost, counts.duplicates, counts.out_of_order), (0, 1, 1));
    /// ```
    pub fn of(committed: &HashMap<String, Committed>, deliveries: &[String]) -> Self {
        let mut seen: HashSet<&str> = HashSet::with_capacity(deliveries.len());
        let mut latest: HashMap<&str, i64> = HashMap::new();
        let mut counts = Self {
            committed: committed.len(),
            deliveries: deliveries.len(),
            ..Self::default()
        };
        for id in deliveries {
            if !seen.insert(id) {
                counts.duplicates += 1;
                continue;
            }
            let Some(commit) = committed.get(id) else {
                counts.unexpected += 1;
                continue;
            };
            let latest = latest.entry(&commit.key).or_insert(i64::MIN);
            if commit.seq < *latest {
                counts.out_of_order += 1;
            } else {
                *latest = commit.seq;
            }
        }
        counts.lost = committed
            .keys()
            .filter(|id| !seen.contains(id.as_str()))
            .count();
        counts
    }

    /// Whether nothing committed was lost and nothing uncommitted was announced.
    pub fn safe(&self) -> bool {
        self.lost == 0 && self.unexpected == 0
    }
}

impl fmt::Display for Counts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "committed={} deliveries={} lost={} unexpected={} duplicates={} out_of_order={}",
            self.committed,
            self.deliveries,
            self.lost,
            self.unexpected,
            self.duplicates,
            self.out_of_order
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ledger(rows: &[(&str, &str, i64)]) -> HashMap<String, Committed> {
        rows.iter()
            .map(|(id, key, seq)| {
                let commit = Committed {
                    key: (*key).to_owned(),
                    seq: *seq,
                };
                ((*id).to_owned(), commit)
            })
            .collect()
    }

    fn ids(list: &[&str]) -> Vec<String> {
        list.iter().map(|id| (*id).to_owned()).collect()
    }

    #[test]
    fn every_commit_received_once_in_order_is_clean() {
        let committed = ledger(&[("a", "k", 1), ("b", "k", 2), ("c", "j", 1)]);
        let counts = Counts::of(&committed, &ids(&["a", "c", "b"]));
        assert_eq!(
            counts,
            Counts {
                committed: 3,
                deliveries: 3,
                ..Counts::default()
            }
        );
        assert!(counts.safe());
    }

    #[test]
    fn a_commit_never_received_is_lost_and_a_stranger_is_unexpected() {
        let committed = ledger(&[("a", "k", 1), ("b", "k", 2)]);
        let counts = Counts::of(&committed, &ids(&["a", "rolled-back"]));
        assert_eq!((counts.lost, counts.unexpected), (1, 1));
        assert!(!counts.safe());
    }

    #[test]
    fn re_sends_are_duplicates_and_only_first_deliveries_are_ordered() {
        let committed = ledger(&[("a", "k", 1), ("b", "k", 2), ("c", "k", 3)]);
        // A relay killed after sending a and b re-sends both: a duplicate pair, in order.
        let counts = Counts::of(&committed, &ids(&["a", "b", "a", "b", "c"]));
        assert_eq!((counts.duplicates, counts.out_of_order), (2, 0));
        // c overtook b: one first delivery out of order.
        let counts = Counts::of(&committed, &ids(&["a", "c", "b"]));
        assert_eq!((counts.duplicates, counts.out_of_order), (0, 1));
    }
}
