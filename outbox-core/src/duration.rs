//! The one duration grammar of every setting: humantime's, with a unit always required.
//!
//! `250ms`, `1.5s`, `2m`, `1h 30m`, `1d` are durations; a bare number is an error that
//! says to add a unit, because `"250"` could mean milliseconds or seconds.
//!
//! Use it as a serde `with` module on `Duration` fields, or [`optional`] on
//! `Option<Duration>` fields:
//!
//! ```
//! use std::time::Duration;
//!
//! #[derive(serde::Deserialize)]
//! struct Settings {
//!     #[serde(with = "outbox_engine::duration")]
//!     lease: Duration,
//! }
//!
//! let s: Settings = serde_json::from_str(r#"{ "lease": "1m 30s" }"#).unwrap();
//! assert_eq!(s.lease, Duration::from_secs(90));
//! assert!(outbox_engine::duration::parse("250").unwrap_err().contains("needs a unit"));
//! ```

use std::time::Duration;

use serde::{Deserialize, Deserializer, Serializer};

/// Parses a duration such as `250ms`, `1.5s`, `2m`, `1h 30m` or `1d`.
///
/// # Errors
///
/// A message that says what is wrong (a bare number needs a unit). It never quotes the
/// text, which could be a secret put in the wrong place.
pub fn parse(text: &str) -> Result<Duration, String> {
    let trimmed = text.trim();
    if !trimmed.is_empty() && trimmed.chars().all(|c| c.is_ascii_digit() || c == '.') {
        return Err(
            "a duration needs a unit: add one, e.g. 250ms or 30s (units: ms, s, m, h, d)"
                .to_owned(),
        );
    }
    humantime::parse_duration(trimmed).map_err(|_| {
        "not a duration: write a number and a unit, e.g. 250ms, 1.5s, 2m, 1h 30m, 1d".to_owned()
    })
}

/// Formats a duration the way [`parse`] reads it.
pub fn format(duration: Duration) -> String {
    humantime::format_duration(duration).to_string()
}

/// Deserializes a `Duration` from a string in the grammar of [`parse`].
///
/// # Errors
///
/// The deserializer's error carrying [`parse`]'s message, or "expected a duration string"
/// for a number.
pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
    let text = DurationText::deserialize(deserializer)?;
    parse(&text.0).map_err(serde::de::Error::custom)
}

/// Serializes a `Duration` as [`format()`] writes it.
///
/// # Errors
///
/// The serializer's.
pub fn serialize<S: Serializer>(duration: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&format(*duration))
}

/// The same for `Option<Duration>` (a missing or null value is `None`).
pub mod optional {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    /// Deserializes an optional duration.
    ///
    /// # Errors
    ///
    /// As for [`super::deserialize`].
    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<Duration>, D::Error> {
        Option::<super::DurationText>::deserialize(deserializer)?
            .map(|text| super::parse(&text.0).map_err(serde::de::Error::custom))
            .transpose()
    }

    /// Serializes an optional duration.
    ///
    /// # Errors
    ///
    /// The serializer's.
    pub fn serialize<S: Serializer>(
        duration: &Option<Duration>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match duration {
            Some(d) => super::serialize(d, serializer),
            None => serializer.serialize_none(),
        }
    }
}

/// For `#[serde(deserialize_with = "outbox_engine::duration::or_off::deserialize")]`: an
/// optional duration that a table turns off with `"off"` (or `"none"`, `"0"`, or null),
/// as a URL option does, since TOML has no null.
///
/// ```
/// #[derive(serde::Deserialize)]
/// struct Settings {
///     #[serde(deserialize_with = "outbox_engine::duration::or_off::deserialize")]
///     window: Option<std::time::Duration>,
/// }
/// let on: Settings = serde_json::from_str(r#"{ "window": "10m" }"#).unwrap();
/// assert_eq!(on.window, Some(std::time::Duration::from_secs(600)));
/// let off: Settings = serde_json::from_str(r#"{ "window": "off" }"#).unwrap();
/// assert_eq!(off.window, None);
/// ```
pub mod or_off {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    /// Deserializes a duration or `"off"`.
    ///
    /// # Errors
    ///
    /// As for [`super::deserialize`].
    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<Duration>, D::Error> {
        Option::<super::DurationText>::deserialize(deserializer)?
            .filter(|text| !matches!(text.0.as_str(), "off" | "none" | "0"))
            .map(|text| super::parse(&text.0).map_err(serde::de::Error::custom))
            .transpose()
    }
}

/// A duration as text; a number in its place is refused with the unit hint.
struct DurationText(String);

impl<'de> Deserialize<'de> for DurationText {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = DurationText;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a duration with a unit, e.g. \"250ms\", \"1.5s\", \"2m\"")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(DurationText(v.to_owned()))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Self::Value, E> {
                Err(E::custom(parse(&v.to_string()).unwrap_err()))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Self::Value, E> {
                Err(E::custom(parse(&v.to_string()).unwrap_err()))
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Self::Value, E> {
                Err(E::custom(parse(&v.to_string()).unwrap_err()))
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_grammar() {
        let ms = Duration::from_millis;
        for (text, expected) in [
            ("250ms", ms(250)),
            ("1.5s", ms(1500)),
            ("2m", ms(120_000)),
            ("1d", ms(86_400_000)),
            ("1h 30m", ms(5_400_000)),
            (" 10s ", ms(10_000)),
        ] {
            assert_eq!(parse(text), Ok(expected), "{text}");
            assert_eq!(parse(&format(expected)), Ok(expected), "{text} round trip");
        }
        for bare in ["250", "1.5", "0"] {
            assert!(parse(bare).unwrap_err().contains("add one"), "{bare}");
        }
        let soon = parse("soon").unwrap_err();
        assert!(
            soon.contains("not a duration") && !soon.contains("soon"),
            "{soon}"
        );
        assert!(parse("").is_err());
    }
}
