//! Showing URLs without their secrets, for `Debug` output, logs and error messages.

/// Where `url` points, in a form safe for `Debug` output, logs and error messages: the
/// scheme, host and port, `***@` for any user info, `/…` for any path, and the names of
/// the query keys with their values left out. Paths and query values can be secrets
/// (chat webhooks, signed URLs, tokens), and which ones are is not ours to guess. A URL
/// that does not parse is not shown at all.
///
/// ```
/// use outbox_engine::redact;
///
/// assert_eq!(redact::url("postgres://app:hunter2@db/app"), "postgres://***@db/…");
/// assert_eq!(redact::url("https://hooks.example.com/"), "https://hooks.example.com/");
/// assert_eq!(
///     redact::url("https://hooks.example.com:8443/T0/B0/XyZ?token=t0k3n&channel=ops"),
///     "https://hooks.example.com:8443/…?token=…&channel=…"
/// );
/// assert_eq!(redact::url("sqlite:outbox.db?mode=rwc"), "sqlite:…?mode=…");
/// assert!(!redact::url("postgres://u:hunter2@[bad").contains("hunter2"));
/// ```
pub fn url(url: &str) -> String {
    let Ok(parsed) = url::Url::parse(url) else {
        return "<a URL that does not parse>".to_owned();
    };
    let mut shown = format!("{}:", parsed.scheme());
    if parsed.cannot_be_a_base() {
        if !parsed.path().is_empty() {
            shown.push('…');
        }
    } else {
        shown.push_str("//");
        if !parsed.username().is_empty() || parsed.password().is_some() {
            shown.push_str("***@");
        }
        shown.push_str(parsed.host_str().unwrap_or(""));
        if let Some(port) = parsed.port() {
            shown.push_str(&format!(":{port}"));
        }
        shown.push_str(if parsed.path() == "/" || parsed.path().is_empty() {
            "/"
        } else {
            "/…"
        });
    }
    if parsed.query().is_some() {
        let keys: Vec<String> = parsed
            .query_pairs()
            .map(|(key, _)| format!("{key}=…"))
            .collect();
        shown.push('?');
        shown.push_str(&keys.join("&"));
    }
    shown
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_shown_by_where_they_point_only() {
        for (raw, shown) in [
            (
                "postgres://app@db.internal/app",
                "postgres://***@db.internal/…",
            ),
            (
                "postgres://db/app?password=hunter2&application_name=relay",
                "postgres://db/…?password=…&application_name=…",
            ),
            (
                "https://sqs.example.com/q?X-Amz-Security-Token=hunter2",
                "https://sqs.example.com/…?X-Amz-Security-Token=…",
            ),
            ("redis://:hunter2@cache:6379/0", "redis://***@cache:6379/…"),
            ("redis://cache:6379", "redis://cache:6379/"),
            ("unix:///tmp/r.sock?db=1&pass=pw", "unix:///…?db=…&pass=…"),
            ("sqlite:outbox.db", "sqlite:…"),
            ("sqlite::memory:", "sqlite:…"),
            (
                "htps://hooks.example.com/services/T0/B0/s3cr3t",
                "htps://hooks.example.com/…",
            ),
        ] {
            assert_eq!(url(raw), shown, "{raw}");
        }
        assert_eq!(url("not a url"), "<a URL that does not parse>");
    }
}
