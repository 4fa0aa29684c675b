//! What a relay published lately, for dashboards: per destination, the messages published
//! and their commit-to-publish latency in 10-second windows over the last 10 minutes.
//! Kept in memory by each relay (see [`RelayHealth::activity`](crate::RelayHealth::activity));
//! metrics remain the place for long-term figures.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};

/// The length of one window.
pub const WINDOW: Duration = Duration::from_secs(10);
/// How many windows a relay keeps (10 minutes).
pub const WINDOWS: usize = 60;

/// Upper bounds of the latency buckets in milliseconds, in 1-2-5 steps from 1 ms to about
/// 83 minutes; slower messages count in a last, open bucket.
const BOUNDS_MS: [u64; 20] = [
    1, 2, 5, 10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 20_000, 50_000, 100_000,
    200_000, 500_000, 1_000_000, 5_000_000,
];

/// A histogram of commit-to-publish latencies with fixed buckets.
///
/// ```
/// use std::time::Duration;
/// use outbox_engine::activity::Latency;
///
/// let mut latency = Latency::default();
/// for ms in [1, 3, 3, 4, 40] {
///     latency.record(Duration::from_millis(ms));
/// }
/// assert_eq!(latency.count(), 5);
/// assert_eq!(latency.quantile(0.5), Some(Duration::from_millis(5)));  // at most 5 ms
/// assert_eq!(latency.quantile(0.99), Some(Duration::from_millis(50)));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Latency {
    buckets: [u64; BOUNDS_MS.len() + 1],
}

impl Latency {
    /// Counts one latency.
    pub fn record(&mut self, latency: Duration) {
        let ms = u64::try_from(latency.as_millis()).unwrap_or(u64::MAX);
        let bucket = BOUNDS_MS
            .iter()
            .position(|&bound| ms <= bound)
            .unwrap_or(BOUNDS_MS.len());
        self.buckets[bucket] += 1;
    }

    /// Adds `other`'s counts to these.
    pub fn merge(&mut self, other: &Self) {
        for (mine, theirs) in self.buckets.iter_mut().zip(other.buckets) {
            *mine += theirs;
        }
    }

    /// Latencies counted.
    pub fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }

    /// An upper bound of the `q` quantile (`0.0..=1.0`): the bound of the bucket that holds
    /// it (the largest bound for the open bucket); `None` when nothing was counted.
    pub fn quantile(&self, q: f64) -> Option<Duration> {
        let total = self.count();
        if total == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (bucket, n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= rank {
                let bound = BOUNDS_MS[bucket.min(BOUNDS_MS.len() - 1)];
                return Some(Duration::from_millis(bound));
            }
        }
        None
    }
}

/// What one relay published to one destination in one window.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ActivityWindow {
    /// The window's start.
    pub start: DateTime<Utc>,
    /// The destination.
    pub destination: String,
    /// Messages published (completions applied).
    pub published: u64,
    /// Their commit-to-publish latency, as the relay's histogram measures it.
    pub latency: Latency,
}

#[derive(Debug)]
struct Slot {
    /// Seconds since the epoch divided by the window length.
    index: i64,
    destinations: BTreeMap<String, (u64, Latency)>,
}

/// The recent windows, oldest first; shared by clones.
#[derive(Debug, Clone, Default)]
pub(crate) struct Activity(Arc<Mutex<VecDeque<Slot>>>);

impl Activity {
    /// Counts `published` (destination, latency) pairs in the window of `now`.
    pub(crate) fn record<'a>(
        &self,
        now: DateTime<Utc>,
        published: impl IntoIterator<Item = (&'a str, Duration)>,
    ) {
        let index = now.timestamp().div_euclid(WINDOW.as_secs() as i64);
        let mut slots = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if slots.back().is_none_or(|slot| slot.index < index) {
            slots.push_back(Slot {
                index,
                destinations: BTreeMap::new(),
            });
        }
        while slots
            .front()
            .is_some_and(|slot| slot.index <= index - WINDOWS as i64)
        {
            slots.pop_front();
        }
        // A clock that stepped back counts in the newest window.
        let slot = slots.back_mut().expect("a window was just pushed");
        for (destination, latency) in published {
            let (count, histogram) = match slot.destinations.get_mut(destination) {
                Some(entry) => entry,
                None => slot.destinations.entry(destination.to_owned()).or_default(),
            };
            *count += 1;
            histogram.record(latency);
        }
    }

    /// The windows of the last [`WINDOWS`] × [`WINDOW`] before `now`, oldest first; windows
    /// in which nothing was published are left out.
    pub(crate) fn windows(&self, now: DateTime<Utc>) -> Vec<ActivityWindow> {
        let newest = now.timestamp().div_euclid(WINDOW.as_secs() as i64);
        let slots = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        slots
            .iter()
            .filter(|slot| slot.index > newest - WINDOWS as i64)
            .flat_map(|slot| {
                let start = Utc
                    .timestamp_opt(slot.index * WINDOW.as_secs() as i64, 0)
                    .single()
                    .unwrap_or_default();
                slot.destinations
                    .iter()
                    .map(move |(destination, (published, latency))| ActivityWindow {
                        start,
                        destination: destination.clone(),
                        published: *published,
                        latency: latency.clone(),
                    })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> DateTime<Utc> {
        Utc.timestamp_opt(1_700_000_000 + seconds, 0).unwrap()
    }

    #[test]
    fn windows_count_per_destination_and_forget_after_ten_minutes() {
        let activity = Activity::default();
        let ms = Duration::from_millis;
        activity.record(
            at(0),
            [("billing", ms(3)), ("billing", ms(30)), ("audit", ms(1))],
        );
        activity.record(at(5), [("billing", ms(3))]);
        activity.record(at(12), [("billing", ms(700))]);

        let windows = activity.windows(at(15));
        let summary: Vec<_> = windows
            .iter()
            .map(|w| (w.start, w.destination.as_str(), w.published))
            .collect();
        assert_eq!(
            summary,
            vec![
                (at(0), "audit", 1),
                (at(0), "billing", 3),
                (at(10), "billing", 1)
            ]
        );
        assert_eq!(windows[1].latency.quantile(0.5), Some(ms(5)));
        assert_eq!(windows[1].latency.quantile(1.0), Some(ms(50)));
        assert_eq!(windows[2].latency.quantile(0.5), Some(ms(1_000)));

        assert_eq!(
            activity.windows(at(599)).len(),
            3,
            "still within ten minutes"
        );
        assert_eq!(
            activity.windows(at(605)).len(),
            1,
            "the first window is gone"
        );
        activity.record(at(1_000), [("billing", ms(1))]);
        assert_eq!(
            activity.windows(at(1_000)).len(),
            1,
            "old windows are dropped"
        );
    }

    #[test]
    fn quantiles_are_bucket_bounds() {
        let mut latency = Latency::default();
        assert_eq!(latency.quantile(0.5), None);
        latency.record(Duration::from_secs(10_000));
        assert_eq!(
            latency.quantile(0.5),
            Some(Duration::from_millis(5_000_000))
        );
        let mut merged = Latency::default();
        merged.record(Duration::ZERO);
        merged.merge(&latency);
        assert_eq!(merged.count(), 2);
        assert_eq!(merged.quantile(0.5), Some(Duration::from_millis(1)));
    }
}
