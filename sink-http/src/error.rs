//! Classification: every HTTP answer and transport error becomes an [`Outcome`] that
//! says whether retrying can help.
//!
//! | what happened | outcome | class |
//! |---|---|---|
//! | 2xx | published, receipt `HTTP <code>` | — |
//! | 408 Request Timeout | retryable | `Timeout` |
//! | 425 Too Early | retryable | `Unavailable` |
//! | 429 Too Many Requests | retryable, overloaded | `RateLimited` |
//! | 503 Service Unavailable | retryable, overloaded | `Unavailable` |
//! | other 5xx | retryable | `Unavailable` |
//! | 413 Content Too Large | permanent | `TooLarge` |
//! | other 4xx | permanent, the (truncated) body in the reason | `Rejected` |
//! | 301, 308 (permanent redirect) | permanent: redirects are not followed | `Rejected` |
//! | other 3xx | retryable: redirects are not followed | `Other` |
//! | timeout (request or publish deadline) | retryable | `Timeout` |
//! | connection refused/reset, DNS failure, broken body | retryable | `Connection` |
//! | refused by the SSRF guard | permanent | `Config` |
//! | message cannot be turned into a request | permanent | `Serialization` |
//!
//! A retryable answer's `Retry-After` (delta-seconds or an HTTP-date) becomes the
//! failure's `retry_after`, capped by the sink's `max_retry_after`.

use std::error::Error as StdError;
use std::time::{Duration, SystemTime};

use outbox_engine::{Failure, FailureClass, Outcome};
use reqwest::StatusCode;
use reqwest::header::{HeaderMap, LOCATION, RETRY_AFTER};

use crate::ssrf::SsrfError;

/// The HTTP sink's error: its configuration is invalid. It names the setting and says
/// what is wrong, never quoting a secret; retrying cannot help.
///
/// ```
/// use outbox_sink_http::HttpSinkConfig;
///
/// let err = HttpSinkConfig::new("ftp://example.com/").build().unwrap_err();
/// assert_eq!(err.setting(), "url");
/// assert!(err.to_string().contains("http or https"));
/// assert!(!err.is_retryable());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {setting}: {reason}")]
pub struct HttpSinkError {
    setting: &'static str,
    reason: String,
}

impl HttpSinkError {
    pub(crate) fn config(setting: &'static str, reason: impl Into<String>) -> Self {
        Self {
            setting,
            reason: reason.into(),
        }
    }

    /// The setting, e.g. `url` or `secrets`.
    pub fn setting(&self) -> &'static str {
        self.setting
    }

    /// What is wrong.
    pub fn reason(&self) -> &str {
        &self.reason
    }

    /// Whether trying again can help: never, the configuration must change.
    pub fn is_retryable(&self) -> bool {
        false
    }
}

/// Reads a `Retry-After` value: delta-seconds (`120`) or an HTTP-date
/// (`Wed, 21 Oct 2015 07:28:00 GMT`, and the two obsolete date formats), relative to
/// `now`. A date in the past gives zero; anything else that does not parse gives `None`.
///
/// ```
/// use std::time::{Duration, SystemTime, UNIX_EPOCH};
/// use outbox_sink_http::parse_retry_after;
///
/// let now = UNIX_EPOCH + Duration::from_secs(1_445_412_400); // 2015-10-21 07:26:40 UTC
/// assert_eq!(parse_retry_after("120", now), Some(Duration::from_secs(120)));
/// assert_eq!(parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now), Some(Duration::from_secs(80)));
/// assert_eq!(parse_retry_after("Tue, 20 Oct 2015 07:28:00 GMT", now), Some(Duration::ZERO));
/// assert_eq!(parse_retry_after("soon", now), None);
/// assert_eq!(parse_retry_after("-5", now), None);
/// ```
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        // More digits than fit in a u64 are "very long"; the cap applies later.
        return Some(Duration::from_secs(value.parse().unwrap_or(u64::MAX)));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// What the sink needs from its settings to classify an answer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub(crate) max_error_body: usize,
    pub(crate) max_retry_after: Duration,
}

/// Classifies a response from its status, headers and (capped) body.
pub(crate) fn classify_response(
    status: StatusCode,
    headers: &HeaderMap,
    body: &[u8],
    limits: Limits,
) -> Outcome {
    let code = status.as_u16();
    if status.is_success() {
        return Outcome::published_with(format!("HTTP {code}"));
    }
    let label = status_label(status);
    if status.is_redirection() {
        let target = headers
            .get(LOCATION)
            .and_then(|v| v.to_str().ok())
            .map(location_origin)
            .unwrap_or_else(|| "no location".to_owned());
        let message = format!(
            "{label}: redirect to {target} not followed (redirects are disabled; point the route at the final URL)"
        );
        return if matches!(code, 301 | 308) {
            Outcome::permanent(FailureClass::Rejected, message)
        } else {
            with_retry_after(
                Failure::retryable(FailureClass::Other, message),
                headers,
                limits,
            )
            .into()
        };
    }
    let text = body_excerpt(body, limits.max_error_body);
    let message = if text.is_empty() {
        label
    } else {
        format!("{label}: {text}")
    };
    let retryable = |class| {
        with_retry_after(Failure::retryable(class, message.clone()), headers, limits).into()
    };
    let overloaded = |class| {
        let failure = Failure::retryable(class, message.clone()).overloaded();
        with_retry_after(failure, headers, limits).into()
    };
    match code {
        408 => retryable(FailureClass::Timeout),
        425 => retryable(FailureClass::Unavailable),
        // 429 and 503 speak for the endpoint: with or without Retry-After, the route pauses.
        429 => overloaded(FailureClass::RateLimited),
        503 => overloaded(FailureClass::Unavailable),
        413 => Outcome::permanent(FailureClass::TooLarge, message),
        400..=499 => Outcome::permanent(FailureClass::Rejected, message),
        500..=599 => retryable(FailureClass::Unavailable),
        _ => retryable(FailureClass::Other),
    }
}

fn status_label(status: StatusCode) -> String {
    match status.canonical_reason() {
        Some(reason) => format!("HTTP {} {reason}", status.as_u16()),
        None => format!("HTTP {}", status.as_u16()),
    }
}

fn with_retry_after(failure: Failure, headers: &HeaderMap, limits: Limits) -> Failure {
    let delay = headers
        .get(RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| parse_retry_after(v, SystemTime::now()));
    match delay {
        Some(delay) => failure.with_retry_after(delay.min(limits.max_retry_after)),
        None => failure,
    }
}

/// The scheme, host and port of a redirect target; its path and query are left out
/// because they can carry tokens.
fn location_origin(location: &str) -> String {
    match url::Url::parse(location) {
        Ok(url) => match (url.host_str(), url.port()) {
            (Some(host), Some(port)) => format!("{}://{host}:{port}/…", url.scheme()),
            (Some(host), None) => format!("{}://{host}/…", url.scheme()),
            _ => "a URL without a host".to_owned(),
        },
        Err(_) => "a relative location".to_owned(),
    }
}

/// The start of a body as one line of text: invalid UTF-8 replaced, control characters
/// turned into spaces, cut at `max` bytes on a character boundary.
pub(crate) fn body_excerpt(body: &[u8], max: usize) -> String {
    let text = String::from_utf8_lossy(&body[..body.len().min(max)]);
    let mut out: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let trimmed = out.trim_end().len();
    out.truncate(trimmed);
    let out = out.trim_start().to_owned();
    if body.len() > max {
        format!("{out}… (truncated)")
    } else {
        out
    }
}

/// Classifies an error from sending a request or reading its response.
///
/// The reason never contains the URL: endpoint URLs can carry tokens.
pub(crate) fn classify_error(err: &reqwest::Error) -> Failure {
    if let Some(ssrf) = find_source::<SsrfError>(err) {
        return Failure::permanent(FailureClass::Config, ssrf.to_string());
    }
    let detail = describe(err);
    if err.is_timeout() {
        Failure::retryable(
            FailureClass::Timeout,
            format!("request timed out: {detail}"),
        )
    } else if err.is_connect() {
        Failure::retryable(
            FailureClass::Connection,
            format!("connection failed: {detail}"),
        )
    } else if err.is_builder() {
        Failure::permanent(
            FailureClass::Serialization,
            format!("request could not be built: {detail}"),
        )
    } else {
        Failure::retryable(
            FailureClass::Connection,
            format!("request failed: {detail}"),
        )
    }
}

fn find_source<'a, T: StdError + 'static>(err: &'a (dyn StdError + 'static)) -> Option<&'a T> {
    let mut current = Some(err);
    while let Some(e) = current {
        if let Some(found) = e.downcast_ref::<T>() {
            return Some(found);
        }
        current = e.source();
    }
    None
}

/// The error's chain of causes, without reqwest's URL.
fn describe(err: &reqwest::Error) -> String {
    let mut parts = Vec::new();
    let mut current: Option<&(dyn StdError + 'static)> = err.source();
    while let Some(e) = current {
        let text = e.to_string();
        if !text.is_empty() && parts.last() != Some(&text) {
            parts.push(text);
        }
        current = e.source();
    }
    if parts.is_empty() {
        let text = err.to_string();
        let text = match text.split_once(" for url (") {
            Some((head, _)) => head.to_owned(),
            None => text,
        };
        parts.push(text);
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    const LIMITS: Limits = Limits {
        max_error_body: 16,
        max_retry_after: Duration::from_secs(600),
    };

    fn classify(code: u16, headers: &[(&'static str, &str)], body: &[u8]) -> Outcome {
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            map.insert(*name, HeaderValue::from_str(value).unwrap());
        }
        classify_response(StatusCode::from_u16(code).unwrap(), &map, body, LIMITS)
    }

    fn failure(outcome: Outcome) -> Failure {
        match outcome {
            Outcome::Failed(f) => f,
            other => panic!("expected a failure, got {other:?}"),
        }
    }

    #[test]
    fn success_codes_publish() {
        for code in [200, 201, 202, 204, 299] {
            assert_eq!(
                classify(code, &[], b""),
                Outcome::published_with(format!("HTTP {code}"))
            );
        }
    }

    #[test]
    fn retryable_codes_and_classes() {
        for (code, class) in [
            (408, FailureClass::Timeout),
            (425, FailureClass::Unavailable),
            (429, FailureClass::RateLimited),
            (500, FailureClass::Unavailable),
            (502, FailureClass::Unavailable),
            (503, FailureClass::Unavailable),
            (599, FailureClass::Unavailable),
        ] {
            let f = failure(classify(code, &[], b"busy"));
            assert!(f.retryable, "{code}");
            assert_eq!(f.class, class, "{code}");
            assert!(
                f.message.starts_with(&format!("HTTP {code}")),
                "{}",
                f.message
            );
            assert_eq!(f.retry_after, None);
            assert_eq!(
                f.overloaded,
                matches!(code, 429 | 503),
                "{code}: only 429 and 503 say the endpoint is overloaded"
            );
        }
    }

    #[test]
    fn permanent_codes_keep_a_truncated_body() {
        let f = failure(classify(400, &[], b"{\"error\":\"invalid phone number\"}"));
        assert!(!f.retryable);
        assert_eq!(f.class, FailureClass::Rejected);
        assert_eq!(
            f.message,
            "HTTP 400 Bad Request: {\"error\":\"invali… (truncated)"
        );
        let f = failure(classify(404, &[], b""));
        assert_eq!(f.message, "HTTP 404 Not Found");
        let f = failure(classify(413, &[], b"too big"));
        assert_eq!((f.class, f.retryable), (FailureClass::TooLarge, false));
        let f = failure(classify(422, &[], b"line\r\nbreak\0\xff"));
        assert_eq!(
            f.message,
            "HTTP 422 Unprocessable Entity: line  break \u{fffd}"
        );
    }

    #[test]
    fn redirects_are_failures_that_say_so() {
        let f = failure(classify(
            302,
            &[("location", "http://127.0.0.1:9/secret?token=x")],
            b"",
        ));
        assert!(f.retryable);
        assert!(f.message.contains("not followed"), "{}", f.message);
        assert!(f.message.contains("http://127.0.0.1:9/…"), "{}", f.message);
        assert!(!f.message.contains("token"), "{}", f.message);
        let f = failure(classify(301, &[("location", "/moved")], b""));
        assert!(!f.retryable);
        assert!(f.message.contains("relative location"), "{}", f.message);
    }

    #[test]
    fn retry_after_is_honoured_and_capped() {
        let f = failure(classify(429, &[("retry-after", "7")], b""));
        assert_eq!(f.retry_after, Some(Duration::from_secs(7)));
        let f = failure(classify(
            503,
            &[("retry-after", "999999999999999999999999")],
            b"",
        ));
        assert_eq!(f.retry_after, Some(Duration::from_secs(600)));
        let date = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(120));
        let f = failure(classify(503, &[("retry-after", &date)], b""));
        let got = f.retry_after.unwrap();
        assert!(
            got > Duration::from_secs(115) && got <= Duration::from_secs(120),
            "{got:?}"
        );
        let f = failure(classify(503, &[("retry-after", "later")], b""));
        assert_eq!(f.retry_after, None);
        // Not on permanent failures.
        let f = failure(classify(400, &[("retry-after", "7")], b""));
        assert_eq!(f.retry_after, None);
    }

    #[test]
    fn obsolete_date_formats() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(784_111_700);
        assert_eq!(
            parse_retry_after("Sunday, 06-Nov-94 08:49:37 GMT", now),
            Some(Duration::from_secs(77))
        );
        assert_eq!(
            parse_retry_after("Sun Nov  6 08:49:37 1994", now),
            Some(Duration::from_secs(77))
        );
    }

    #[test]
    fn excerpt_respects_char_boundaries() {
        assert_eq!(body_excerpt("ééé".as_bytes(), 3), "é\u{fffd}… (truncated)");
        assert_eq!(body_excerpt(b"  ok  ", 100), "ok");
    }
}
