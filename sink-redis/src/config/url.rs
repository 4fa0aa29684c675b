//! Reading a route from a URL: the sink's options come out of the query, the client's
//! own stay in it.

use std::time::Duration;

use super::{Durability, HeaderLayout, RedisSinkConfig, invalid};
use crate::error::RedisSinkError;

/// URL query options that belong to the Redis client, not to the sink.
const CLIENT_OPTIONS: &[&str] = &["protocol"];
/// Extra client options a `unix://` URL may carry.
const UNIX_CLIENT_OPTIONS: &[&str] = &["db", "user", "pass"];
/// URL query options [`RedisSinkConfig::from_url`] understands.
pub(super) const SINK_OPTIONS: &[&str] = &[
    "stream",
    "maxlen",
    "dedupe_window",
    "dedupe_prefix",
    "durability",
    "durability_timeout",
    "headers",
    "metadata",
    "fields.id",
    "fields.idempotency_key",
    "fields.event_type",
    "fields.content_type",
    "fields.payload",
    "max_payload_bytes",
    "connect_timeout",
    "response_timeout",
    "tls_ca_file",
    "tls_cert_file",
    "tls_key_file",
];

impl RedisSinkConfig {
    /// Moves the sink options of [`from_url`](Self::from_url) out of `self.url`'s query
    /// into the fields, keeping the client's own options in the URL; returns the
    /// settings they set.
    pub(crate) fn take_url_options(&mut self) -> Result<Vec<&'static str>, RedisSinkError> {
        let mut parsed = parse_url(&self.url)?;
        let mut durability_kind: Option<String> = None;
        let mut durability_timeout: Option<Duration> = None;
        let mut kept: Vec<(String, String)> = Vec::new();
        let mut set = Vec::new();
        for (name, value) in parsed.query_pairs() {
            let (name, value) = (name.into_owned(), value.into_owned());
            let setting = match name.as_str() {
                "stream" => {
                    self.stream = value;
                    "stream"
                }
                "maxlen" => {
                    self.maxlen = Some(parse_number("maxlen", &value)?);
                    "maxlen"
                }
                "dedupe_window" => {
                    self.dedupe_window = match value.as_str() {
                        "off" | "none" | "0" => None,
                        text => Some(parse_setting_duration("dedupe_window", text)?),
                    };
                    "dedupe_window"
                }
                "dedupe_prefix" => {
                    self.dedupe_prefix = value;
                    "dedupe_prefix"
                }
                "durability" => {
                    durability_kind = Some(value);
                    "durability"
                }
                "durability_timeout" => {
                    durability_timeout =
                        Some(parse_setting_duration("durability_timeout", &value)?);
                    "durability"
                }
                "headers" => {
                    self.fields.headers = HeaderLayout::parse(&value)?;
                    "fields"
                }
                "metadata" => {
                    self.fields.metadata = parse_flag("metadata", &value)?;
                    "fields"
                }
                "fields.id" => {
                    self.fields.id = value;
                    "fields"
                }
                "fields.idempotency_key" => {
                    self.fields.idempotency_key = value;
                    "fields"
                }
                "fields.event_type" => {
                    self.fields.event_type = value;
                    "fields"
                }
                "fields.content_type" => {
                    self.fields.content_type = value;
                    "fields"
                }
                "fields.payload" => {
                    self.fields.payload = value;
                    "fields"
                }
                "max_payload_bytes" => {
                    self.max_payload_bytes = parse_number("max_payload_bytes", &value)?;
                    "max_payload_bytes"
                }
                "connect_timeout" => {
                    self.connect_timeout = parse_setting_duration("connect_timeout", &value)?;
                    "connect_timeout"
                }
                "response_timeout" => {
                    self.response_timeout = parse_setting_duration("response_timeout", &value)?;
                    "response_timeout"
                }
                "tls_ca_file" => {
                    self.tls_ca_file = Some(value.into());
                    "tls_ca_file"
                }
                "tls_cert_file" => {
                    self.tls_cert_file = Some(value.into());
                    "tls_cert_file"
                }
                "tls_key_file" => {
                    self.tls_key_file = Some(value.into());
                    "tls_key_file"
                }
                _ if is_client_option(&parsed, &name) => {
                    kept.push((name, value));
                    continue;
                }
                _ => {
                    return Err(RedisSinkError::InvalidUrl {
                        url: outbox_engine::redact::url(&self.url),
                        reason: format!(
                            "unknown option `{name}` (sink options: {}; client options: {})",
                            SINK_OPTIONS.join(", "),
                            CLIENT_OPTIONS.join(", ")
                        ),
                    });
                }
            };
            if !set.contains(&setting) {
                set.push(setting);
            }
        }
        let timeout = durability_timeout.unwrap_or(Durability::DEFAULT_TIMEOUT);
        match durability_kind {
            Some(kind) => self.durability = Durability::parse(&kind, timeout)?,
            None if durability_timeout.is_some() => {
                return Err(invalid(
                    "durability_timeout",
                    "given without `durability=wait:<n>` or `durability=waitaof:<local>:<n>`",
                ));
            }
            None => {}
        }
        if kept.is_empty() {
            parsed.set_query(None);
        } else {
            parsed.query_pairs_mut().clear().extend_pairs(kept);
        }
        self.url = parsed.to_string();
        Ok(set)
    }
}

pub(super) fn is_client_option(url: &url::Url, name: &str) -> bool {
    CLIENT_OPTIONS.contains(&name)
        || (matches!(url.scheme(), "unix" | "redis+unix" | "valkey+unix")
            && UNIX_CLIENT_OPTIONS.contains(&name))
}

pub(super) fn parse_url(text: &str) -> Result<url::Url, RedisSinkError> {
    let url = url::Url::parse(text).map_err(|e| RedisSinkError::InvalidUrl {
        url: outbox_engine::redact::url(text),
        reason: e.to_string(),
    })?;
    match url.scheme() {
        "redis" | "rediss" | "valkey" | "valkeys" => {
            if url.host_str().is_none_or(str::is_empty) {
                return Err(RedisSinkError::InvalidUrl {
                    url: outbox_engine::redact::url(text),
                    reason: "missing host".to_owned(),
                });
            }
            let db = url.path().trim_matches('/');
            if !db.is_empty() && db.parse::<u16>().is_err() {
                return Err(RedisSinkError::InvalidUrl {
                    url: outbox_engine::redact::url(text),
                    reason: "the path must be a database number, such as `/0`".to_owned(),
                });
            }
        }
        "unix" | "redis+unix" | "valkey+unix" => {}
        other => {
            return Err(RedisSinkError::InvalidUrl {
                url: outbox_engine::redact::url(text),
                reason: format!(
                    "scheme `{other}` is not a Redis scheme (use redis://, rediss:// or unix://)"
                ),
            });
        }
    }
    Ok(url)
}

fn parse_number<T: std::str::FromStr>(
    setting: &'static str,
    text: &str,
) -> Result<T, RedisSinkError> {
    text.parse()
        .map_err(|_| invalid(setting, format!("{text:?} is not a non-negative integer")))
}

fn parse_flag(setting: &'static str, text: &str) -> Result<bool, RedisSinkError> {
    match text {
        "true" | "1" | "yes" => Ok(true),
        "false" | "0" | "no" => Ok(false),
        _ => Err(invalid(setting, "must be true or false")),
    }
}

fn parse_setting_duration(setting: &'static str, text: &str) -> Result<Duration, RedisSinkError> {
    parse_duration(text).map_err(|reason| invalid(setting, reason))
}

/// Parses a duration in `outbox_engine::duration`'s grammar (`250ms`, `1.5s`, `2m`, `1h 30m`).
pub(super) fn parse_duration(text: &str) -> Result<Duration, String> {
    outbox_engine::duration::parse(text)
}
