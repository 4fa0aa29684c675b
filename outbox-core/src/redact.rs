//! Showing URLs without their secrets, for `Debug` output, logs and error messages.

/// Query parameters whose values are credentials, compared case-insensitively.
const SECRET_PARAMS: &[&str] = &[
    "password",
    "sslpassword",
    "pass",
    "secret",
    "token",
    "access_token",
    "auth",
    "key",
    "api_key",
    "secret_access_key",
    "session_token",
    "aws_secret_access_key",
    "aws_session_token",
    "x-amz-security-token",
    "x-amz-signature",
    "x-amz-credential",
    "sig",
    "signature",
];

/// `url` with its secrets replaced by `***`: the password in the user info and the values
/// of query parameters that carry credentials (`password`, `sslpassword`, tokens,
/// signatures). A URL that does not parse is not shown at all.
///
/// ```
/// use outbox_engine::redact;
///
/// assert_eq!(redact::url("postgres://app:hunter2@db/app"), "postgres://app:***@db/app");
/// assert_eq!(redact::url("postgres://app@db/app"), "postgres://app@db/app");
/// assert_eq!(
///     redact::url("postgres://db/app?sslpassword=hunter2&application_name=relay"),
///     "postgres://db/app?sslpassword=***&application_name=relay"
/// );
/// assert!(!redact::url("postgres://u:hunter2@[bad").contains("hunter2"));
/// ```
pub fn url(url: &str) -> String {
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

/// Only where `url` points: scheme, host and port, credentials replaced, path and query
/// left out (`/…`). For endpoints whose path is itself a secret (chat webhooks, signed
/// URLs).
///
/// ```
/// use outbox_engine::redact;
///
/// assert_eq!(redact::endpoint("https://hooks.example.com/"), "https://hooks.example.com/");
/// assert_eq!(redact::endpoint("http://u:p@127.0.0.1:8080/T1/secret?x=1"), "http://***@127.0.0.1:8080/…");
/// ```
pub fn endpoint(url: &str) -> String {
    let Ok(parsed) = url::Url::parse(url) else {
        return "<a URL that does not parse>".to_owned();
    };
    let creds = if parsed.username().is_empty() && parsed.password().is_none() {
        ""
    } else {
        "***@"
    };
    let host = parsed.host_str().unwrap_or("");
    let port = parsed.port().map(|p| format!(":{p}")).unwrap_or_default();
    let rest = if parsed.path() == "/" && parsed.query().is_none() {
        "/"
    } else {
        "/…"
    };
    format!("{}://{creds}{host}{port}{rest}", parsed.scheme())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_shown_without_their_secrets() {
        for (raw, shown) in [
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
                "https://sqs.example.com/q?X-Amz-Security-Token=hunter2",
                "https://sqs.example.com/q?X-Amz-Security-Token=***",
            ),
            ("redis://:hunter2@cache:6379/0", "redis://:***@cache:6379/0"),
            ("sqlite:outbox.db", "sqlite:outbox.db"),
        ] {
            assert_eq!(url(raw), shown);
        }
        assert!(!url("postgres://u:hunter2@[bad").contains("hunter2"));
        assert_eq!(endpoint("not a url"), "<a URL that does not parse>");
    }
}
