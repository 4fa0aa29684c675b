//! Configuration: a TOML file with `OUTBOX_…` environment overrides.
//!
//! ```toml
//! [store]
//! url = "postgres://app@db/app"      # or sqlite:outbox.db, mysql://…
//! table = "outbox"                   # optional; schema = "…" too
//!
//! [relay]
//! batch_size = 100
//! concurrency = 2
//! lease = "30s"
//! poll_interval = "1s"
//! ordering = "per-key"               # or "unordered" (default)
//! dead_head = "skip"                 # or "halt"
//!
//! [retry]
//! initial_delay = "1s"
//! max_delay = "5m"
//! max_attempts = 25
//! max_age = "3d"
//!
//! [routes.billing]                   # destination "billing"
//! url = "https://billing.example.com/hooks"
//!
//! [routes.events]
//! url = "redis://127.0.0.1:6379/"
//! ```
//!
//! Every value can be overridden by an environment variable named `OUTBOX_` followed by the
//! path in upper case, with `__` between parts: `OUTBOX_STORE__URL`,
//! `OUTBOX_RELAY__BATCH_SIZE`, `OUTBOX_ROUTES__BILLING__URL` (route names are matched in
//! lower case). Numbers and booleans are recognised; everything else is a string. Names
//! without `__` (such as `OUTBOX_CONFIG`) are not overrides; a name with `__` whose first
//! part is not a section (`store`, `relay`, `retry`, `routes`, `metrics`) is an error, so a
//! typo does not go unnoticed.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use outbox_core::{DeadHead, Ordering, RetryPolicy};
use serde::Deserialize;

use crate::Error;

/// The whole configuration of a relay process.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct Config {
    /// Where the outbox table lives.
    pub store: StoreConfig,
    /// How the relay claims and publishes.
    #[serde(default)]
    pub relay: RelayConfig,
    /// Backoff and giving up.
    #[serde(default)]
    pub retry: RetryConfig,
    /// Destination name → sink settings; the `url` scheme picks the sink.
    #[serde(default)]
    pub routes: BTreeMap<String, toml::Table>,
    /// The metrics and health endpoint of the `outbox relay` command.
    #[serde(default)]
    pub metrics: MetricsConfig,
}

/// Where the outbox table lives.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct StoreConfig {
    /// `postgres://…`, `sqlite:…` or `mysql://…`.
    pub url: String,
    /// The schema (PostgreSQL), database (MySQL) or attached database (SQLite).
    #[serde(default)]
    pub schema: Option<String>,
    /// The outbox table (default `outbox`).
    #[serde(default)]
    pub table: Option<String>,
    /// The inbox table (default `outbox_inbox`).
    #[serde(default)]
    pub inbox_table: Option<String>,
    /// Pool size (default 8).
    #[serde(default = "default_connections")]
    pub max_connections: u32,
    /// `keep` (default) or `delete` published rows.
    #[serde(default)]
    pub published_rows: PublishedRowsSetting,
}

fn default_connections() -> u32 {
    8
}

impl fmt::Debug for StoreConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreConfig")
            .field("url", &redact_url(&self.url))
            .field("schema", &self.schema)
            .field("table", &self.table)
            .field("inbox_table", &self.inbox_table)
            .field("max_connections", &self.max_connections)
            .field("published_rows", &self.published_rows)
            .finish()
    }
}

/// What to do with published rows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PublishedRowsSetting {
    /// Keep them until a purge.
    #[default]
    Keep,
    /// Delete them at once.
    Delete,
}

/// How the relay claims and publishes; see [`outbox_core::RelayBuilder`].
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct RelayConfig {
    /// The lease owner name (default: `relay-<pid>-<random>`).
    pub owner: Option<String>,
    /// Rows per claim.
    pub batch_size: usize,
    /// Workers.
    pub concurrency: usize,
    /// Lease length.
    #[serde(with = "duration")]
    pub lease: Duration,
    /// Publish timeout (default: half the lease).
    #[serde(with = "optional_duration")]
    pub publish_timeout: Option<Duration>,
    /// Poll interval, the fallback when no wakeup arrives.
    #[serde(with = "duration")]
    pub poll_interval: Duration,
    /// How long shutdown waits for in-flight batches.
    #[serde(with = "duration")]
    pub shutdown_grace: Duration,
    /// Claim every destination and dead-letter those without a route (default: claim
    /// only routed destinations, leaving the rest to other relays).
    pub dead_letter_unrouted: bool,
    /// `unordered` or `per-key`.
    pub ordering: OrderingSetting,
    /// With `per-key`: `skip` or `halt` on a dead head.
    pub dead_head: DeadHeadSetting,
    /// Listen for wakeups where the store supports it (PostgreSQL LISTEN/NOTIFY).
    pub wakeups: bool,
}

impl Default for RelayConfig {
    fn default() -> Self {
        Self {
            owner: None,
            batch_size: 100,
            concurrency: 1,
            lease: Duration::from_secs(30),
            publish_timeout: None,
            poll_interval: Duration::from_secs(1),
            shutdown_grace: Duration::from_secs(10),
            dead_letter_unrouted: false,
            ordering: OrderingSetting::Unordered,
            dead_head: DeadHeadSetting::Skip,
            wakeups: true,
        }
    }
}

/// The ordering mode.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OrderingSetting {
    /// No ordering.
    #[default]
    Unordered,
    /// Per partition key, in commit order.
    PerKey,
}

/// The dead-head policy of per-key ordering.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeadHeadSetting {
    /// Go on with the next message.
    #[default]
    Skip,
    /// Hold the key until the dead letter is replayed or discarded.
    Halt,
}

impl RelayConfig {
    /// The ordering as the core types it.
    pub fn ordering(&self) -> Ordering {
        match (self.ordering, self.dead_head) {
            (OrderingSetting::Unordered, _) => Ordering::Unordered,
            (OrderingSetting::PerKey, DeadHeadSetting::Skip) => Ordering::PerKey(DeadHead::Skip),
            (OrderingSetting::PerKey, DeadHeadSetting::Halt) => Ordering::PerKey(DeadHead::Halt),
        }
    }
}

/// Backoff and giving up; see [`RetryPolicy`].
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct RetryConfig {
    /// First backoff.
    #[serde(with = "duration")]
    pub initial_delay: Duration,
    /// Backoff cap.
    #[serde(with = "duration")]
    pub max_delay: Duration,
    /// Attempts before dead-lettering.
    pub max_attempts: u32,
    /// Dead-letter when the next attempt would start later than this after creation.
    #[serde(with = "optional_duration")]
    pub max_age: Option<Duration>,
}

impl Default for RetryConfig {
    fn default() -> Self {
        Self {
            initial_delay: Duration::from_secs(1),
            max_delay: Duration::from_secs(300),
            max_attempts: 25,
            max_age: Some(Duration::from_secs(3 * 24 * 3600)),
        }
    }
}

impl RetryConfig {
    /// The policy.
    pub fn policy(&self) -> RetryPolicy {
        RetryPolicy::default()
            .initial_delay(self.initial_delay)
            .max_delay(self.max_delay)
            .max_attempts(self.max_attempts)
            .max_age(self.max_age)
    }
}

/// The metrics endpoint.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct MetricsConfig {
    /// Address for `/metrics` and `/healthz`, e.g. `127.0.0.1:9464`; none by default.
    pub listen: Option<String>,
}

impl Config {
    /// Parses TOML text, then applies `OUTBOX_…` overrides from `env`.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] naming the file position or the setting that is wrong.
    pub fn from_toml(
        text: &str,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, Error> {
        let mut table: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| Error::Config(one_line(&e.to_string())))?;
        for (name, value) in env {
            // Only `OUTBOX_<SECTION>__…` names are overrides; `OUTBOX_CONFIG` and other
            // single-segment names belong to other tools (or to the CLI itself).
            let Some(path) = name.strip_prefix("OUTBOX_") else {
                continue;
            };
            if !path.contains("__") {
                continue;
            }
            let parts: Vec<String> = path.split("__").map(str::to_lowercase).collect();
            if !SECTIONS.contains(&parts[0].as_str()) {
                return Err(Error::Config(format!(
                    "environment variable {name}: unknown section {:?} (expected one of {})",
                    parts[0],
                    SECTIONS.join(", ")
                )));
            }
            if parts.iter().any(String::is_empty) {
                return Err(Error::Config(format!(
                    "environment variable {name}: empty path segment"
                )));
            }
            set_path(&mut table, &parts, parse_env_value(&value), &name)?;
        }
        Config::deserialize(toml::Value::Table(table))
            .map_err(|e| Error::Config(one_line(&e.to_string())))
    }

    /// Reads `path` and applies the process environment's `OUTBOX_…` overrides.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] if the file cannot be read or is invalid.
    pub fn load(path: &std::path::Path) -> Result<Self, Error> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::Config(format!("cannot read {}: {e}", path.display())))?;
        Self::from_toml(&text, std::env::vars())
    }
}

/// The top-level sections an `OUTBOX_<SECTION>__…` override may name.
const SECTIONS: [&str; 5] = ["store", "relay", "retry", "routes", "metrics"];

fn set_path(
    table: &mut toml::Table,
    parts: &[String],
    value: toml::Value,
    name: &str,
) -> Result<(), Error> {
    let (last, parents) = parts.split_last().expect("non-empty");
    let mut current = table;
    for part in parents {
        let entry = current
            .entry(part.clone())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        current = entry.as_table_mut().ok_or_else(|| {
            Error::Config(format!(
                "environment variable {name}: {part} is not a table"
            ))
        })?;
    }
    current.insert(last.clone(), value);
    Ok(())
}

fn parse_env_value(value: &str) -> toml::Value {
    if let Ok(n) = value.parse::<i64>() {
        toml::Value::Integer(n)
    } else if let Ok(b) = value.parse::<bool>() {
        toml::Value::Boolean(b)
    } else if let Ok(f) = value.parse::<f64>() {
        toml::Value::Float(f)
    } else {
        toml::Value::String(value.to_owned())
    }
}

fn one_line(message: &str) -> String {
    message.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `url` with its secrets replaced by `***`: the password in the user info and the values
/// of query parameters that carry credentials (`password`, `sslpassword`, tokens,
/// signatures). A URL that does not parse is not shown at all.
pub(crate) fn redact_url(url: &str) -> String {
    const SECRET_PARAMS: &[&str] = &[
        "password",
        "sslpassword",
        "pass",
        "secret",
        "token",
        "access_token",
        "auth",
        "x-amz-security-token",
        "x-amz-signature",
        "x-amz-credential",
        "sig",
        "signature",
    ];
    let Ok(mut parsed) = url::Url::parse(url) else {
        return "<a URL that does not parse>".to_owned();
    };
    if parsed.password().is_some() {
        let _ = parsed.set_password(Some("***"));
    }
    if parsed.query().is_some() {
        let pairs: Vec<(String, String)> = parsed
            .query_pairs()
            .map(|(k, v)| {
                let secret = SECRET_PARAMS.contains(&k.to_ascii_lowercase().as_str());
                let v = if secret { "***".into() } else { v.into_owned() };
                (k.into_owned(), v)
            })
            .collect();
        parsed.query_pairs_mut().clear().extend_pairs(pairs);
    }
    parsed.to_string()
}

/// Parses `500ms`, `30s`, `5m`, `2h`, `3d` (one unit, whole numbers).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("{text:?} has no unit (ms, s, m, h, d)"))?;
    let (number, unit) = text.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} does not start with a whole number"))?;
    let seconds = match unit {
        "ms" => return Ok(Duration::from_millis(n)),
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => {
            return Err(format!(
                "{text:?} has an unknown unit {unit:?} (ms, s, m, h, d)"
            ));
        }
    };
    n.checked_mul(seconds)
        .map(Duration::from_secs)
        .ok_or_else(|| format!("{text:?} is too long"))
}

mod duration {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(d)?;
        super::parse_duration(&text).map_err(serde::de::Error::custom)
    }
}

mod optional_duration {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Duration>, D::Error> {
        match Option::<String>::deserialize(d)? {
            None => Ok(None),
            Some(text) if text == "none" => Ok(None),
            Some(text) => super::parse_duration(&text)
                .map(Some)
                .map_err(serde::de::Error::custom),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = "[store]\nurl = \"sqlite:outbox.db\"\n";

    #[test]
    fn urls_are_shown_without_their_secrets() {
        for (url, shown) in [
            (
                "postgres://app@db.internal/app",
                "postgres://app@db.internal/app",
            ),
            ("postgres://app:hunter2@db/app", "postgres://app:***@db/app"),
            (
                "postgres://db/app?password=hunter2&application_name=relay",
                "postgres://db/app?password=***&application_name=relay",
            ),
            (
                "postgres://u@db/app?sslpassword=hunter2",
                "postgres://u@db/app?sslpassword=***",
            ),
            (
                "https://sqs.example.com/q?X-Amz-Security-Token=hunter2",
                "https://sqs.example.com/q?X-Amz-Security-Token=***",
            ),
            ("sqlite:outbox.db", "sqlite:outbox.db"),
        ] {
            assert_eq!(redact_url(url), shown);
        }
        assert!(!redact_url("postgres://u:hunter2@[bad").contains("hunter2"));
    }

    #[test]
    fn defaults_and_durations() {
        let c = Config::from_toml(MINIMAL, []).unwrap();
        assert_eq!(c.relay.batch_size, 100);
        assert_eq!(c.relay.ordering(), Ordering::Unordered);
        let c = Config::from_toml(
            "[store]\nurl = \"x\"\n[relay]\nlease = \"2m\"\npoll_interval = \"250ms\"\nordering = \"per-key\"\ndead_head = \"halt\"\n[retry]\nmax_age = \"none\"\n",
            [],
        )
        .unwrap();
        assert_eq!(c.relay.lease, Duration::from_secs(120));
        assert_eq!(c.relay.poll_interval, Duration::from_millis(250));
        assert_eq!(c.relay.ordering(), Ordering::PerKey(DeadHead::Halt));
        assert_eq!(c.retry.max_age, None);
    }

    #[test]
    fn environment_overrides_any_value() {
        let env = [
            (
                "OUTBOX_STORE__URL".to_owned(),
                "postgres://u:secret@h/db".to_owned(),
            ),
            ("OUTBOX_RELAY__BATCH_SIZE".to_owned(), "7".to_owned()),
            (
                "OUTBOX_ROUTES__BILLING__URL".to_owned(),
                "https://example.com/hook".to_owned(),
            ),
            ("UNRELATED".to_owned(), "x".to_owned()),
            ("OUTBOX_CONFIG".to_owned(), "/etc/outbox.toml".to_owned()),
            (
                "OUTBOX_TEST_POSTGRES_URL".to_owned(),
                "postgres://elsewhere".to_owned(),
            ),
        ];
        let c = Config::from_toml(MINIMAL, env).unwrap();
        assert_eq!(c.store.url, "postgres://u:secret@h/db");
        assert_eq!(c.relay.batch_size, 7);
        assert_eq!(
            c.routes["billing"]["url"].as_str(),
            Some("https://example.com/hook")
        );
        let debug = format!("{c:?}");
        assert!(!debug.contains("secret"), "{debug}");
        assert!(debug.contains("u:***@h/db"), "{debug}");
    }

    #[test]
    fn bad_input_gives_one_line_errors() {
        for (text, needle) in [
            (
                "[store]\nurl = \"x\"\n[relay]\nlease = \"30 parsecs\"\n",
                "unknown unit",
            ),
            (
                "[store]\nurl = \"x\"\n[relay]\nbatch_size = \"many\"\n",
                "batch_size",
            ),
            (
                "[store]\nurl = \"x\"\n[relay]\nbtach_size = 1\n",
                "btach_size",
            ),
            ("[relay]\nbatch_size = 1\n", "store"),
            ("[store\nurl = 1", "TOML"),
        ] {
            let err = Config::from_toml(text, []).unwrap_err().to_string();
            assert!(!err.contains('\n'), "one line: {err}");
            assert!(
                err.to_lowercase().contains(&needle.to_lowercase()),
                "{needle}: {err}"
            );
        }
    }

    #[test]
    fn a_misspelt_section_in_the_environment_is_an_error() {
        let env = [("OUTBOX_STROE__URL".to_owned(), "x".to_owned())];
        let err = Config::from_toml(MINIMAL, env).unwrap_err().to_string();
        assert!(
            err.contains("OUTBOX_STROE__URL") && err.contains("unknown section"),
            "{err}"
        );
    }

    #[test]
    fn durations_parse_strictly() {
        assert_eq!(parse_duration("3d"), Ok(Duration::from_secs(259_200)));
        for bad in [
            "",
            "s",
            "10",
            "1.5s",
            "-1s",
            "10 s",
            "99999999999999999999s",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }
}
