//! Who may do what: the token (a bearer token or the password of basic auth), the CSRF
//! token of the forms, the same-origin check of changes, and the headers every answer
//! carries.

use std::sync::Arc;

use axum::extract::{OriginalUri, Request, State};
use axum::http::header::{
    AUTHORIZATION, CACHE_CONTROL, CONTENT_SECURITY_POLICY, HOST, ORIGIN, REFERRER_POLICY,
    WWW_AUTHENTICATE, X_CONTENT_TYPE_OPTIONS, X_FRAME_OPTIONS,
};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine;
use subtle::ConstantTimeEq;

use crate::pages::Base;
use crate::{DashboardError, MIN_TOKEN_BYTES, Shared};

/// No scripts, nothing from elsewhere, forms only to this origin, never in a frame.
const POLICY: &str = "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

#[derive(Clone)]
pub(crate) struct Access {
    token: String,
    /// The CSRF token of this process's forms: random, never derived from the token.
    pub(crate) csrf: String,
    pub(crate) public_read: bool,
    /// The `Host` values the dashboard answers to (lowercase; an entry without a port
    /// matches any port). Empty: any host, and no public reads.
    pub(crate) hosts: Vec<String>,
}

/// Whether the request carried the token; handlers hide payloads without it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Authorized(pub(crate) bool);

impl Access {
    pub(crate) fn new(token: String) -> Result<Self, DashboardError> {
        if token.len() < MIN_TOKEN_BYTES || !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(DashboardError::WeakToken);
        }
        Ok(Self {
            token,
            csrf: format!(
                "{}{}",
                uuid::Uuid::new_v4().simple(),
                uuid::Uuid::new_v4().simple()
            ),
            public_read: false,
            hosts: Vec::new(),
        })
    }

    /// Whether the request's `Host` is one the dashboard answers to. A page that a DNS
    /// name of an attacker's now points at (DNS rebinding) arrives with that name.
    fn host_allowed(&self, headers: &HeaderMap) -> bool {
        if self.hosts.is_empty() {
            return true;
        }
        let Some(host) = headers.get(HOST).and_then(|v| v.to_str().ok()) else {
            return false;
        };
        let host = host.to_ascii_lowercase();
        let name = host
            .rsplit_once(':')
            .filter(|(_, port)| port.bytes().all(|b| b.is_ascii_digit()));
        self.hosts
            .iter()
            .any(|allowed| *allowed == host || name.is_some_and(|(name, _)| name == allowed))
    }

    /// Whether `headers` carry the token, as a bearer token or a basic-auth password.
    fn authorized(&self, headers: &HeaderMap) -> bool {
        let Some(value) = headers.get(AUTHORIZATION).and_then(|v| v.to_str().ok()) else {
            return false;
        };
        let given = if let Some(token) = value.strip_prefix("Bearer ") {
            token.trim().as_bytes().to_vec()
        } else if let Some(encoded) = value.strip_prefix("Basic ") {
            let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(encoded.trim())
            else {
                return false;
            };
            match decoded.iter().position(|&b| b == b':') {
                Some(colon) => decoded[colon + 1..].to_vec(),
                None => return false,
            }
        } else {
            return false;
        };
        given.ct_eq(self.token.as_bytes()).into()
    }

    /// Whether a form's `csrf` field is this process's token.
    pub(crate) fn csrf_matches(&self, given: &str) -> bool {
        given.as_bytes().ct_eq(self.csrf.as_bytes()).into()
    }
}

/// Asks for the token where it is needed, refuses cross-site changes, and sets the
/// security headers on every answer.
pub(crate) async fn guard(
    State(shared): State<Arc<Shared>>,
    mut request: Request,
    next: Next,
) -> Response {
    let authorized = shared.access.authorized(request.headers());
    let changes = request.method() != Method::GET && request.method() != Method::HEAD;
    // Public reads need a list of the dashboard's host names to check requests against.
    let public = shared.access.public_read && !shared.access.hosts.is_empty();
    let mut response = if !shared.access.host_allowed(request.headers()) {
        (
            StatusCode::MISDIRECTED_REQUEST,
            "this dashboard does not answer to that host name (see the dashboard's `hosts`)\n",
        )
            .into_response()
    } else if !authorized && (changes || !public) {
        (
            StatusCode::UNAUTHORIZED,
            [(
                WWW_AUTHENTICATE,
                HeaderValue::from_static("Basic realm=\"outbox dashboard\", charset=\"UTF-8\""),
            )],
            "the dashboard needs its token: a bearer token, or the password of basic auth\n",
        )
            .into_response()
    } else if changes && !same_origin(request.headers()) {
        (
            StatusCode::FORBIDDEN,
            "a change must come from the dashboard's own pages\n",
        )
            .into_response()
    } else if !origin_is_host(request.headers()) {
        // A script of another site reading a page (a navigation sends no `Origin`).
        (
            StatusCode::FORBIDDEN,
            "the dashboard's pages are not for other sites to read\n",
        )
            .into_response()
    } else {
        let base = base(&request);
        request.extensions_mut().insert(Authorized(authorized));
        request.extensions_mut().insert(base);
        next.run(request).await
    };
    let headers = response.headers_mut();
    headers.insert(CONTENT_SECURITY_POLICY, HeaderValue::from_static(POLICY));
    headers.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    // `same-origin`: with `no-referrer`, browsers send `Origin: null` on the forms' POSTs.
    headers.insert(REFERRER_POLICY, HeaderValue::from_static("same-origin"));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// Where the router is mounted: the original path less the part this router matched.
fn base(request: &Request) -> Base {
    let inner = request.uri().path();
    let original = request
        .extensions()
        .get::<OriginalUri>()
        .map_or(inner, |uri| uri.0.path());
    let prefix = original.strip_suffix(inner).unwrap_or("");
    Base(prefix.trim_end_matches('/').to_owned())
}

/// A browser says where a request comes from: `Sec-Fetch-Site`, and `Origin` on every
/// POST. Clients that send neither (curl, scripts with the token) are not browsers.
fn same_origin(headers: &HeaderMap) -> bool {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(site) = header("sec-fetch-site")
        && !matches!(site, "same-origin" | "none")
    {
        return false;
    }
    origin_is_host(headers)
}

/// Whether `Origin`, when there is one, names the host the request was sent to.
fn origin_is_host(headers: &HeaderMap) -> bool {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    match (header(ORIGIN.as_str()), header(HOST.as_str())) {
        (None, _) => true,
        (Some(origin), Some(host)) => url::Url::parse(origin).is_ok_and(|origin| {
            let port = origin.port().map(|p| format!(":{p}")).unwrap_or_default();
            origin
                .host_str()
                .is_some_and(|h| format!("{h}{port}").eq_ignore_ascii_case(host))
        }),
        (Some(_), None) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, value.parse().unwrap());
        }
        map
    }

    #[test]
    fn the_token_is_accepted_as_bearer_or_basic_password_only() {
        let access = Access::new("s3cret-token-of-24-bytes".into()).unwrap();
        let basic = |credentials: &str| {
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(credentials)
            )
        };
        for (value, expected) in [
            ("Bearer s3cret-token-of-24-bytes".to_owned(), true),
            (basic("ops:s3cret-token-of-24-bytes"), true),
            (basic(":s3cret-token-of-24-bytes"), true),
            ("Bearer s3cret-token-of-24-byteS".to_owned(), false),
            (basic("s3cret-token-of-24-bytes"), false),
            (basic("ops:s3cret-token-of-24-bytes-and-more"), false),
            ("Basic !!!".to_owned(), false),
            ("s3cret-token-of-24-bytes".to_owned(), false),
        ] {
            let map = headers(&[("authorization", &value)]);
            assert_eq!(access.authorized(&map), expected, "{value}");
        }
        assert!(!access.authorized(&HeaderMap::new()));
        assert!(Access::new("short".into()).is_err());
        assert!(Access::new("sixteen bytes with spaces".into()).is_err());
    }

    #[test]
    fn changes_must_come_from_the_same_origin() {
        assert!(same_origin(&HeaderMap::new()), "not a browser");
        assert!(same_origin(&headers(&[
            ("origin", "http://127.0.0.1:9465"),
            ("host", "127.0.0.1:9465"),
            ("sec-fetch-site", "same-origin"),
        ])));
        assert!(!same_origin(&headers(&[
            ("origin", "https://evil.example"),
            ("host", "127.0.0.1:9465"),
        ])));
        assert!(!same_origin(&headers(&[
            ("origin", "http://127.0.0.1:9465"),
            ("host", "127.0.0.1:9465"),
            ("sec-fetch-site", "cross-site"),
        ])));
        assert!(!same_origin(&headers(&[
            ("origin", "null"),
            ("host", "127.0.0.1:9465")
        ])));
    }
}
