//! What a running relay tells its operators: the store's gauges as metrics, and health by
//! Kubernetes' meaning — alive while its workers beat, ready while its store answers its
//! claims — with the lag objective (pending ages, failing routes) as an alert of its own
//! that gates readiness only when the operator asks for it.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use chrono::Utc;
use tokio::time::Instant;
use tracing::warn;

use crate::activity::{Activity, ActivityWindow};
use crate::error::StoreError;
use crate::store::Gauges;

/// How often and how far the relay reads the store's gauges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GaugeSettings {
    pub(crate) interval: Duration,
    pub(crate) limit: usize,
}

impl Default for GaugeSettings {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(10),
            limit: 50_000,
        }
    }
}

/// A lag objective: how old a pending row of a routed destination may get, in general and
/// per destination, how long every publish of a route may fail, and how long the workers
/// may go without a beat. [`RelayHealth::objective`] checks it; readiness includes it
/// only with [`gates_readiness`](Self::gates_readiness).
///
/// ```
/// use std::time::Duration;
/// use outbox_engine::LagObjective;
///
/// let objective = LagObjective::new()
///     .max_pending_age(Duration::from_secs(300))
///     .destination("billing", Duration::from_secs(30));
/// assert_eq!(objective.threshold("billing"), Some(Duration::from_secs(30)));
/// assert_eq!(objective.threshold("audit"), Some(Duration::from_secs(300)));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LagObjective {
    max_pending_age: Option<Duration>,
    destinations: BTreeMap<String, Duration>,
    max_heartbeat_age: Option<Duration>,
    max_failing: Option<Duration>,
    gates_readiness: bool,
}

/// How long every publish of a route may fail before the relay is not ready, unless the
/// objective says otherwise ([`LagObjective::max_failing`]).
pub const DEFAULT_MAX_FAILING: Duration = Duration::from_secs(60);

impl LagObjective {
    /// No age limit; the heartbeat limit is the relay's default.
    pub fn new() -> Self {
        Self::default()
    }

    /// The oldest pending age every destination must stay under.
    pub fn max_pending_age(mut self, age: Duration) -> Self {
        self.max_pending_age = Some(age);
        self
    }

    /// The oldest pending age `destination` must stay under, in place of the general one.
    pub fn destination(mut self, destination: impl Into<String>, age: Duration) -> Self {
        self.destinations.insert(destination.into(), age);
        self
    }

    /// How long the workers may go without a beat before the relay is not alive (default:
    /// three leases, at least two minutes: a worker beats before each claim, and a batch
    /// ends within its lease).
    pub fn max_heartbeat_age(mut self, age: Duration) -> Self {
        self.max_heartbeat_age = Some(age);
        self
    }

    /// How long every publish of one route may fail (a broker or receiver down, no
    /// message getting through) before the relay is not ready. Default
    /// [`DEFAULT_MAX_FAILING`].
    pub fn max_failing(mut self, duration: Duration) -> Self {
        self.max_failing = Some(duration);
        self
    }

    /// Makes [`RelayHealth::ready`] fail while the objective is missed, too. Off by
    /// default: a backlog is an alert for an operator, not a reason for an orchestrator to
    /// hold back or restart the relay that is working it off.
    pub fn gates_readiness(mut self, gates: bool) -> Self {
        self.gates_readiness = gates;
        self
    }

    /// The threshold that applies to `destination`, if any.
    pub fn threshold(&self, destination: &str) -> Option<Duration> {
        self.destinations
            .get(destination)
            .copied()
            .or(self.max_pending_age)
    }
}

/// Why a relay is not alive or not ready; its `Display` lists every reason, one per line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unhealthy {
    /// One sentence per failed check.
    pub reasons: Vec<String>,
}

impl fmt::Display for Unhealthy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reasons.join("\n"))
    }
}

impl std::error::Error for Unhealthy {}

#[derive(Debug)]
struct State {
    started: Instant,
    lease: Duration,
    interval: Duration,
    heartbeat: Option<Instant>,
    stopped: bool,
    gauges: Option<(Instant, Gauges)>,
    /// Routes whose publishes fail since a time, with no publish through since.
    failing: BTreeMap<String, Failing>,
    /// The destinations the relay has routes for.
    routes: BTreeSet<String>,
    /// The latest claim's answer: `None` before the first, else the error that failed it.
    store: Option<Result<(), String>>,
}

/// A route that fails: since when, how often, and the class of the first failure.
#[derive(Debug)]
struct Failing {
    since: Instant,
    failures: u64,
    class: &'static str,
}

/// A handle on a relay's health, cheap to clone; take it with
/// [`Relay::health`](crate::Relay::health) before running the relay, and serve
/// [`alive`](Self::alive) and [`ready`](Self::ready) from your health endpoints.
#[derive(Debug, Clone)]
pub struct RelayHealth {
    state: Arc<Mutex<State>>,
    activity: Activity,
}

impl RelayHealth {
    pub(crate) fn new(
        lease: Duration,
        gauges: GaugeSettings,
        routes: impl IntoIterator<Item = String>,
    ) -> Self {
        Self {
            state: Arc::new(Mutex::new(State {
                started: Instant::now(),
                lease,
                interval: gauges.interval,
                heartbeat: None,
                stopped: false,
                gauges: None,
                failing: BTreeMap::new(),
                routes: routes.into_iter().collect(),
                store: None,
            })),
            activity: Activity::default(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts published messages with their commit-to-publish latency.
    pub(crate) fn published<'a>(&self, published: impl IntoIterator<Item = (&'a str, Duration)>) {
        self.activity.record(Utc::now(), published);
    }

    /// What this relay published in the last ten minutes, per destination and 10-second
    /// window, oldest first (windows without a publish are left out): for dashboards.
    pub fn activity(&self) -> Vec<ActivityWindow> {
        self.activity.windows(Utc::now())
    }

    pub(crate) fn beat(&self) {
        self.state().heartbeat = Some(Instant::now());
    }

    pub(crate) fn stop(&self) {
        self.state().stopped = true;
    }

    /// Counts a failed attempt to publish to `destination`; true for the first failure
    /// since the route last published (or ever).
    pub(crate) fn route_failed(&self, destination: &str, class: &'static str) -> bool {
        let mut state = self.state();
        if let Some(failing) = state.failing.get_mut(destination) {
            failing.failures += 1;
            return false;
        }
        let failing = Failing {
            since: Instant::now(),
            failures: 1,
            class,
        };
        state.failing.insert(destination.to_owned(), failing);
        true
    }

    /// Counts a publish to `destination`; if the route was failing, how long and how
    /// many attempts failed.
    pub(crate) fn route_published(&self, destination: &str) -> Option<(Duration, u64)> {
        let mut state = self.state();
        if state.failing.is_empty() {
            return None;
        }
        let failing = state.failing.remove(destination)?;
        Some((failing.since.elapsed(), failing.failures))
    }

    /// Records how the latest claim went.
    pub(crate) fn claimed(&self, answer: Result<(), &StoreError>) {
        self.state().store = Some(answer.map_err(ToString::to_string));
    }

    fn record(&self, gauges: Gauges) {
        self.state().gauges = Some((Instant::now(), gauges));
    }

    /// How long ago a worker last beat; `None` before the first beat.
    pub fn heartbeat_age(&self) -> Option<Duration> {
        self.state().heartbeat.map(|beat| beat.elapsed())
    }

    /// The latest gauges read and how long ago; `None` until the first read, or when the
    /// store has none.
    pub fn gauges(&self) -> Option<(Duration, Gauges)> {
        self.state()
            .gauges
            .as_ref()
            .map(|(at, gauges)| (at.elapsed(), gauges.clone()))
    }

    /// Liveness: the relay runs and a worker beat within the objective's heartbeat limit.
    ///
    /// # Errors
    ///
    /// [`Unhealthy`] saying which.
    pub fn alive(&self, objective: &LagObjective) -> Result<(), Unhealthy> {
        let state = self.state();
        let limit = objective
            .max_heartbeat_age
            .unwrap_or((state.lease * 3).max(Duration::from_secs(120)));
        let reason = if state.stopped {
            Some("the relay is stopping".to_owned())
        } else {
            let since = state.heartbeat.unwrap_or(state.started).elapsed();
            (since > limit).then(|| {
                format!(
                    "no worker beat for {} (limit {})",
                    humantime::format_duration(round(since)),
                    humantime::format_duration(limit)
                )
            })
        };
        match reason {
            Some(reason) => Err(Unhealthy {
                reasons: vec![reason],
            }),
            None => Ok(()),
        }
    }

    /// Readiness: alive, and the latest claim got an answer from the store (so the store
    /// is reachable and its table is there, in the shape this relay reads); with
    /// [`LagObjective::gates_readiness`], the [`objective`](Self::objective) met as well.
    ///
    /// # Errors
    ///
    /// [`Unhealthy`] listing every failed check.
    pub fn ready(&self, objective: &LagObjective) -> Result<(), Unhealthy> {
        let mut reasons = self
            .alive(objective)
            .err()
            .map(|u| u.reasons)
            .unwrap_or_default();
        match &self.state().store {
            Some(Ok(())) => {}
            Some(Err(error)) => reasons.push(format!("the store fails to claim: {error}")),
            None => reasons.push("no claim has been answered yet".to_owned()),
        }
        if objective.gates_readiness
            && let Err(missed) = self.objective(objective)
        {
            reasons.extend(missed.reasons);
        }
        if reasons.is_empty() {
            Ok(())
        } else {
            Err(Unhealthy { reasons })
        }
    }

    /// The lag objective: no route failing every publish for longer than the objective's
    /// [`max_failing`](LagObjective::max_failing), the gauges fresh (read within three
    /// intervals), and each routed destination's oldest pending age within its threshold.
    /// Rows of a destination no route serves do not count (the `outbox_unrouted_rows`
    /// gauge shows them).
    ///
    /// # Errors
    ///
    /// [`Unhealthy`] listing every miss.
    pub fn objective(&self, objective: &LagObjective) -> Result<(), Unhealthy> {
        let mut reasons = Vec::new();
        let wants_ages = objective.max_pending_age.is_some() || !objective.destinations.is_empty();
        let state = self.state();
        let max_failing = objective.max_failing.unwrap_or(DEFAULT_MAX_FAILING);
        for (destination, failing) in &state.failing {
            let since = failing.since.elapsed();
            if since > max_failing {
                reasons.push(format!(
                    "destination {destination}: no publish got through for {} ({} failed attempts, first failure: {}; limit {})",
                    humantime::format_duration(round(since)),
                    failing.failures,
                    failing.class,
                    humantime::format_duration(max_failing)
                ));
            }
        }
        match &state.gauges {
            Some((at, gauges)) if at.elapsed() <= state.interval * 3 => {
                for d in &gauges.destinations {
                    if !state.routes.contains(&d.destination) {
                        continue;
                    }
                    if let (Some(age), Some(limit)) =
                        (d.oldest_pending_age, objective.threshold(&d.destination))
                        && age > limit
                    {
                        reasons.push(format!(
                            "destination {}: oldest pending row is {} old (limit {})",
                            d.destination,
                            humantime::format_duration(round(age)),
                            humantime::format_duration(limit)
                        ));
                    }
                }
            }
            Some((at, _)) if wants_ages => reasons.push(format!(
                "the store's gauges were last read {} ago",
                humantime::format_duration(round(at.elapsed()))
            )),
            None if wants_ages && state.started.elapsed() > state.interval * 3 => {
                reasons.push(
                    "no gauges to check the lag against (the reads fail, gauges are off, or the store has none)"
                        .to_owned(),
                )
            }
            _ => {}
        }
        if reasons.is_empty() {
            Ok(())
        } else {
            Err(Unhealthy { reasons })
        }
    }
}

fn round(d: Duration) -> Duration {
    Duration::from_secs(d.as_secs())
}

/// Reads the store's gauges through `read` (given the row limit) every interval, exports
/// them as metrics and keeps them for [`RelayHealth::ready`], until `stop` turns true.
/// Ends at once if the store has none.
pub(crate) async fn export_gauges<F: Future<Output = Result<Option<Gauges>, StoreError>>>(
    read: impl Fn(usize) -> F,
    settings: GaugeSettings,
    health: RelayHealth,
    routes: Vec<String>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let routes: BTreeSet<String> = routes.into_iter().collect();
    // Destinations exported before are set back to zero when their rows are gone.
    let mut exported = routes.clone();
    while !*stop.borrow() {
        match read(settings.limit).await {
            Ok(None) => return,
            Ok(Some(gauges)) => {
                export(&gauges, &routes, &mut exported);
                health.record(gauges);
            }
            Err(error) => {
                warn!(%error, "could not read the store's gauges");
                metrics::counter!("outbox_store_errors_total").increment(1);
            }
        }
        tokio::select! {
            () = tokio::time::sleep(settings.interval) => {}
            _ = stop.changed() => {}
        }
    }
}

fn export(gauges: &Gauges, routes: &BTreeSet<String>, exported: &mut BTreeSet<String>) {
    metrics::gauge!("outbox_gauges_truncated").set(if gauges.truncated { 1.0 } else { 0.0 });
    let mut seen = BTreeSet::new();
    for d in &gauges.destinations {
        let destination = d.destination.clone();
        metrics::gauge!("outbox_backlog", "destination" => destination.clone())
            .set(d.backlog() as f64);
        metrics::gauge!("outbox_leased", "destination" => destination.clone()).set(d.leased as f64);
        metrics::gauge!("outbox_dead_letters", "destination" => destination.clone())
            .set(d.dead as f64);
        metrics::gauge!("outbox_halted_keys", "destination" => destination.clone())
            .set(d.halted_keys as f64);
        let age = d.oldest_pending_age.map_or(0.0, |a| a.as_secs_f64());
        metrics::gauge!("outbox_oldest_pending_age_seconds", "destination" => destination.clone())
            .set(age);
        let unrouted = if routes.contains(&destination) {
            0
        } else {
            d.backlog()
        };
        metrics::gauge!("outbox_unrouted_rows", "destination" => destination.clone())
            .set(unrouted as f64);
        seen.insert(destination);
    }
    for destination in exported.difference(&seen) {
        for name in [
            "outbox_backlog",
            "outbox_leased",
            "outbox_dead_letters",
            "outbox_halted_keys",
            "outbox_oldest_pending_age_seconds",
            "outbox_unrouted_rows",
        ] {
            metrics::gauge!(name, "destination" => destination.clone()).set(0.0);
        }
    }
    exported.extend(seen);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::DestinationGauges;

    fn gauges(age: Duration) -> Gauges {
        let mut billing = DestinationGauges::new("billing");
        billing.pending = 1;
        billing.oldest_pending_age = Some(age);
        Gauges {
            destinations: vec![billing],
            truncated: false,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn alive_follows_beats_and_ready_follows_fresh_gauges_and_thresholds() {
        let health = RelayHealth::new(
            Duration::from_secs(30),
            GaugeSettings::default(),
            ["billing".to_owned()],
        );
        let objective = LagObjective::new()
            .max_pending_age(Duration::from_secs(3600))
            .destination("billing", Duration::from_secs(60))
            .max_heartbeat_age(Duration::from_secs(10))
            .gates_readiness(true);
        health.beat();
        health.claimed(Ok(()));
        health.record(gauges(Duration::from_secs(5)));
        assert_eq!(health.ready(&objective), Ok(()));

        tokio::time::advance(Duration::from_secs(11)).await;
        let dead = health.alive(&objective).unwrap_err().to_string();
        assert!(dead.starts_with("no worker beat for 11s"), "{dead}");

        health.beat();
        health.record(gauges(Duration::from_secs(61)));
        assert_eq!(health.alive(&objective), Ok(()));
        let lagging = health.ready(&objective).unwrap_err().to_string();
        assert!(
            lagging.contains("destination billing: oldest pending row is 1m 1s old (limit 1m)"),
            "{lagging}"
        );

        health.record(gauges(Duration::from_secs(1)));
        assert_eq!(health.ready(&objective), Ok(()));
        tokio::time::advance(Duration::from_secs(31)).await;
        health.beat();
        let stale = health.ready(&objective).unwrap_err().to_string();
        assert!(stale.contains("gauges were last read 31s ago"), "{stale}");

        health.stop();
        assert!(
            health.alive(&objective).is_err(),
            "a stopping relay is not alive"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn readiness_follows_the_store_and_leaves_the_objective_to_alerts_unless_gated() {
        let health = RelayHealth::new(
            Duration::from_secs(30),
            GaugeSettings::default(),
            ["billing".to_owned()],
        );
        let objective = LagObjective::new().max_pending_age(Duration::from_secs(60));
        health.beat();
        let waiting = health.ready(&objective).unwrap_err().to_string();
        assert_eq!(waiting, "no claim has been answered yet");

        let missing = StoreError::new(
            crate::error::StoreErrorKind::Schema,
            "relation \"outbox\" does not exist",
        );
        health.claimed(Err(&missing));
        let failing = health.ready(&objective).unwrap_err().to_string();
        assert!(
            failing.starts_with("the store fails to claim: store Schema error: relation"),
            "{failing}"
        );

        health.claimed(Ok(()));
        health.record(gauges(Duration::from_secs(600)));
        assert_eq!(
            health.ready(&objective),
            Ok(()),
            "a lagging destination is an alert, not unreadiness"
        );
        let missed = health.objective(&objective).unwrap_err().to_string();
        assert!(missed.contains("destination billing: oldest pending row is 10m old"));
        assert!(
            health
                .ready(&objective.clone().gates_readiness(true))
                .is_err()
        );

        let unrouted = RelayHealth::new(
            Duration::from_secs(30),
            GaugeSettings::default(),
            ["audit".to_owned()],
        );
        unrouted.beat();
        unrouted.claimed(Ok(()));
        unrouted.record(gauges(Duration::from_secs(600)));
        let gated = objective.gates_readiness(true);
        assert_eq!(
            unrouted.ready(&gated),
            Ok(()),
            "rows of a destination no route serves do not count, even gated"
        );
    }
}
