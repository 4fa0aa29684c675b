//! Every metric series the relay records, with its type, help text and what to alert on:
//! [`describe`] gives a recorder (Prometheus' `# HELP` and `# TYPE` lines) all of them.
//!
//! ```
//! // Once, after installing a recorder (`metrics_exporter_prometheus`, say):
//! outbox_engine::series::describe();
//! assert!(outbox_engine::series::SERIES.iter().any(|s| s.name == "outbox_backlog"));
//! ```

use metrics::Unit;

/// The kind of a series.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up (Prometheus `counter`, name ends in `_total`).
    Counter,
    /// A value read now.
    Gauge,
    /// A distribution in buckets.
    Histogram,
}

/// One series the relay records.
#[derive(Debug, Clone, Copy)]
pub struct Series {
    /// Its name.
    pub name: &'static str,
    /// Counter, gauge or histogram.
    pub kind: Kind,
    /// Its labels.
    pub labels: &'static [&'static str],
    /// What it measures (the `# HELP` line).
    pub help: &'static str,
    /// What an operator alerts on, if anything.
    pub alert: &'static str,
}

const fn series(
    name: &'static str,
    kind: Kind,
    labels: &'static [&'static str],
    help: &'static str,
    alert: &'static str,
) -> Series {
    Series {
        name,
        kind,
        labels,
        help,
        alert,
    }
}

use Kind::{Counter, Gauge, Histogram};

/// Every series, the six an operator watches first at the top.
pub const SERIES: &[Series] = &[
    series(
        "outbox_oldest_pending_age_seconds",
        Gauge,
        &["destination"],
        "Age of the oldest row of a destination waiting to be published, from the store's gauges.",
        "above the destination's lag objective for a few minutes",
    ),
    series(
        "outbox_backlog",
        Gauge,
        &["destination"],
        "Rows of a destination not yet published (pending, retrying or leased), from the store's gauges.",
        "growing for longer than a burst lasts",
    ),
    series(
        "outbox_commit_to_publish_seconds",
        Histogram,
        &["destination", "since"],
        "Time from a message's commit to its publish; since says where the store measured from (commit, transaction_start or insert).",
        "p99 above the lag objective",
    ),
    series(
        "outbox_messages_retried_total",
        Counter,
        &["destination", "class"],
        "Publishes that failed and will be tried again, by failure class.",
        "a class rising steadily (the route's receiver or broker is failing)",
    ),
    series(
        "outbox_relay_heartbeat_seconds",
        Gauge,
        &[],
        "Unix time of the latest worker loop turn.",
        "older than a few poll intervals plus a lease (the relay is stuck or gone)",
    ),
    series(
        "outbox_dead_letters",
        Gauge,
        &["destination"],
        "Dead-lettered rows of a destination, from the store's gauges.",
        "above zero, or rising (see `outbox dead list`)",
    ),
    series(
        "outbox_messages_published_total",
        Counter,
        &["destination"],
        "Messages published and marked.",
        "",
    ),
    series(
        "outbox_messages_dead_total",
        Counter,
        &["destination", "class"],
        "Messages dead-lettered, by failure class.",
        "any increase",
    ),
    series(
        "outbox_messages_deferred_total",
        Counter,
        &["destination", "class"],
        "Messages not sent and put back without spending an attempt (rate limit, open circuit), by class.",
        "",
    ),
    series(
        "outbox_publish_duration_seconds",
        Histogram,
        &["destination"],
        "Time one batch took to publish to a destination's sink.",
        "p99 near the publish timeout",
    ),
    series(
        "outbox_batch_size",
        Histogram,
        &[],
        "Rows per non-empty claim.",
        "",
    ),
    series(
        "outbox_claims_total",
        Counter,
        &[],
        "Claims answered by the store, empty ones included.",
        "",
    ),
    series(
        "outbox_store_errors_total",
        Counter,
        &[],
        "Claims, completions and gauge reads the store failed.",
        "rising (the database is unreachable, or its table is missing)",
    ),
    series(
        "outbox_lease_conflicts_total",
        Counter,
        &[],
        "Completions refused because the row's lease had passed to another relay (its publish may be a duplicate).",
        "rising: leases shorter than batches take",
    ),
    series(
        "outbox_route_pauses_total",
        Counter,
        &["route"],
        "Pauses of a route its receiver asked for (a retry-after, or a throttle).",
        "rising for long (the receiver is overloaded)",
    ),
    series(
        "outbox_leased",
        Gauge,
        &["destination"],
        "Rows of a destination leased by a relay now.",
        "",
    ),
    series(
        "outbox_halted_keys",
        Gauge,
        &["destination"],
        "Partition keys whose head row is dead-lettered, so their later rows wait (per-key ordering).",
        "above zero",
    ),
    series(
        "outbox_unrouted_rows",
        Gauge,
        &["destination"],
        "Rows waiting for a destination no route of this relay serves.",
        "above zero (a route is missing, or another relay serves it)",
    ),
    series(
        "outbox_gauges_truncated",
        Gauge,
        &[],
        "1 when the store's gauges stopped at their row limit and undercount.",
        "",
    ),
    series(
        "outbox_build_info",
        Gauge,
        &["version"],
        "Always 1; the version of the relay's engine as a label.",
        "",
    ),
];

/// Describes every series of [`SERIES`] to the installed recorder (help text and unit)
/// and sets `outbox_build_info`. Call it once after installing the recorder; a recorder
/// installed later misses the descriptions.
pub fn describe() {
    for s in SERIES {
        let unit = if s.name.ends_with("_seconds") {
            Some(Unit::Seconds)
        } else {
            None
        };
        match (s.kind, unit) {
            (Counter, _) => metrics::describe_counter!(s.name, s.help),
            (Gauge, Some(unit)) => metrics::describe_gauge!(s.name, unit, s.help),
            (Gauge, None) => metrics::describe_gauge!(s.name, s.help),
            (Histogram, Some(unit)) => metrics::describe_histogram!(s.name, unit, s.help),
            (Histogram, None) => metrics::describe_histogram!(s.name, s.help),
        }
    }
    metrics::gauge!("outbox_build_info", "version" => env!("CARGO_PKG_VERSION")).set(1.0);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `metrics::…!("outbox_…"` in the engine's source is in the table.
    #[test]
    fn every_series_recorded_in_the_source_is_described() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src");
        let mut recorded = Vec::new();
        for entry in walk(std::path::Path::new(dir)) {
            let text = std::fs::read_to_string(&entry).unwrap();
            for kind in ["counter!(\"", "gauge!(\"", "histogram!(\""] {
                for (at, _) in text.match_indices(kind) {
                    let rest = &text[at + kind.len()..];
                    let name = &rest[..rest.find('"').unwrap()];
                    recorded.push(name.to_owned());
                }
            }
        }
        assert!(
            recorded.len() > 10,
            "found the recorded series: {recorded:?}"
        );
        for name in recorded {
            assert!(
                SERIES.iter().any(|s| s.name == name),
                "{name} is recorded but not described in SERIES"
            );
        }
    }

    /// `docs/METRICS.md` is this table, rendered; `OUTBOX_WRITE_REFERENCE=1` writes it.
    #[test]
    fn the_metrics_reference_is_the_table() {
        let mut text = String::from(
            "<!-- Generated from outbox_engine::series::SERIES by a test in \
             outbox-core/src/series.rs; do not edit. -->\n\n# Metrics\n\n\
             Every series a relay records, in the order an operator looks at them: the first six \
             answer \"is it keeping up?\". `outbox relay` serves them on `[metrics] listen` at \
             `/metrics` with their `# HELP` lines; an embedding application gets the same from \
             `outbox::endpoints`. Sinks add their own (`outbox_nats_duplicates_total`).\n\n\
             | series | type | labels | what it measures | alert when |\n|---|---|---|---|---|\n",
        );
        for s in SERIES {
            let kind = match s.kind {
                Kind::Counter => "counter",
                Kind::Gauge => "gauge",
                Kind::Histogram => "histogram",
            };
            text.push_str(&format!(
                "| `{}` | {kind} | {} | {} | {} |\n",
                s.name,
                s.labels.join(", "),
                s.help,
                s.alert
            ));
        }
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/METRICS.md");
        if std::env::var_os("OUTBOX_WRITE_REFERENCE").is_some() {
            std::fs::write(path, &text).unwrap();
        }
        assert!(
            std::fs::read_to_string(path).unwrap_or_default() == text,
            "docs/METRICS.md is not SERIES; regenerate it with \
             `OUTBOX_WRITE_REFERENCE=1 cargo test -p outbox-engine --lib series`"
        );
    }

    fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
        let mut files = Vec::new();
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                files.extend(walk(&path));
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
        files
    }
}
