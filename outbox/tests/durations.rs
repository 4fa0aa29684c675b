//! Every duration of `outbox.toml` takes the same forms, and a bare number is refused with
//! a message saying to add a unit: relay and retry settings, route policies, and the
//! HTTP and Redis sinks' own settings.

use std::time::Duration;

use outbox::Config;

const FORMS: [(&str, Duration); 5] = [
    ("250ms", Duration::from_millis(250)),
    ("1.5s", Duration::from_millis(1500)),
    ("2m", Duration::from_secs(120)),
    ("1d", Duration::from_secs(86_400)),
    ("1h 30m", Duration::from_secs(5_400)),
];

const BASE: &str = "[store]\nurl = \"sqlite::memory:\"\n";

/// The config with `key = value` in `section` (a `routes.r` section gets a `url`).
fn config(section: &str, key: &str, value: &str) -> Result<Config, String> {
    let url = match section {
        "routes.r" | "routes.r.circuit" | "routes.r.rate_limit" => {
            "url = \"https://example.com/hook\"\n"
        }
        "routes.redis" | "routes.redis.durability" => "url = \"redis://127.0.0.1:6379/\"\n",
        _ => "",
    };
    let (table, extra) = match section {
        "routes.r.circuit" => (
            "routes.r",
            format!("circuit = {{ failures = 3, cool_down = {value} }}\n"),
        ),
        "routes.r.rate_limit" => (
            "routes.r",
            format!("rate_limit = {{ per_second = 10, max_wait = {value} }}\n"),
        ),
        "routes.redis.durability" => (
            "routes.redis",
            format!("durability = {{ mode = \"wait\", replicas = 0, timeout = {value} }}\n"),
        ),
        _ => (section, format!("{key} = {value}\n")),
    };
    Config::from_toml(
        &format!("{BASE}[{table}]\n{url}{extra}"),
        std::iter::empty::<(&str, &str)>(),
    )
    .map_err(|e| e.to_string())
}

/// What `key` parsed to, reading it the way the relay, the policies or the sink do.
fn read(config: &Config, section: &str, key: &str) -> Result<Duration, String> {
    let relay = &config.relay;
    let retry = &config.retry;
    let missing = || format!("{section}.{key} missing");
    match (section, key) {
        ("relay", "lease") => relay.lease.ok_or_else(missing),
        ("relay", "publish_timeout") => relay.publish_timeout.ok_or_else(missing),
        ("relay", "poll_interval") => relay.poll_interval.ok_or_else(missing),
        ("relay", "shutdown_grace") => relay.shutdown_grace.ok_or_else(missing),
        ("retry", "initial_delay") => retry.initial_delay.ok_or_else(missing),
        ("retry", "max_delay") => retry.max_delay.ok_or_else(missing),
        ("retry", "max_age") => retry.max_age.ok_or_else(missing),
        ("routes.r", "timeout") => policy(config)?.timeout.ok_or_else(missing),
        ("routes.r.circuit", _) => Ok(policy(config)?.circuit.ok_or_else(missing)?.cool_down),
        ("routes.r.rate_limit", _) => Ok(policy(config)?.rate_limit.ok_or_else(missing)?.max_wait),
        ("routes.r", _) => {
            let http: outbox::http::HttpSinkConfig = config.routes["r"]
                .sink_settings("r")
                .parse()
                .map_err(|e| e.to_string())?;
            Ok(match key {
                "request_timeout" => http.request_timeout,
                "connect_timeout" => http.connect_timeout,
                _ => http.max_retry_after,
            })
        }
        ("routes.redis" | "routes.redis.durability", _) => {
            let redis: outbox::redis::RedisSinkConfig = config.routes["redis"]
                .sink_settings("redis")
                .parse()
                .map_err(|e| e.to_string())?;
            Ok(match key {
                "dedupe_window" => redis.dedupe_window.ok_or_else(missing)?,
                "connect_timeout" => redis.connect_timeout,
                "response_timeout" => redis.response_timeout,
                _ => match redis.durability {
                    outbox::redis::Durability::Wait { timeout, .. } => timeout,
                    other => return Err(format!("unexpected durability {other:?}")),
                },
            })
        }
        _ => Err(format!(
            "{section}.{key} is not a duration setting of this test"
        )),
    }
}

fn policy(config: &Config) -> Result<outbox::layers::RoutePolicy, String> {
    config.routes["r"].policy("r").map_err(|e| e.to_string())
}

const KEYS: &[(&str, &str)] = &[
    ("relay", "lease"),
    ("relay", "publish_timeout"),
    ("relay", "poll_interval"),
    ("relay", "shutdown_grace"),
    ("retry", "initial_delay"),
    ("retry", "max_delay"),
    ("retry", "max_age"),
    ("routes.r", "timeout"),
    ("routes.r.circuit", "cool_down"),
    ("routes.r.rate_limit", "max_wait"),
    ("routes.r", "request_timeout"),
    ("routes.r", "connect_timeout"),
    ("routes.r", "max_retry_after"),
    ("routes.redis", "dedupe_window"),
    ("routes.redis", "connect_timeout"),
    ("routes.redis", "response_timeout"),
    ("routes.redis.durability", "timeout"),
];

#[test]
fn every_duration_takes_the_same_forms() {
    for (section, key) in KEYS {
        for (form, expected) in FORMS {
            let parsed = config(section, key, &format!("\"{form}\""))
                .and_then(|c| read(&c, section, key))
                .unwrap_or_else(|e| panic!("{section}.{key} = {form:?}: {e}"));
            assert_eq!(parsed, expected, "{section}.{key} = {form:?}");
        }
    }
}

#[test]
fn a_bare_number_is_refused_with_a_unit_hint() {
    for (section, key) in KEYS {
        for bare in ["250", "\"250\""] {
            let error = config(section, key, bare)
                .and_then(|c| read(&c, section, key))
                .expect_err(&format!("{section}.{key} = {bare} must be refused"));
            assert!(error.contains("unit"), "{section}.{key} = {bare}: {error}");
        }
    }
}
