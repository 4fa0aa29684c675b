//! A web dashboard for an outbox table, for operators who would rather not write SQL.
//!
//! - **Overview**: per destination, the backlog, leased rows, the oldest pending age, dead
//!   letters and halted keys (the store's gauges, read through its indexes on each view);
//!   with a relay attached ([`Dashboard::relay`]), its heartbeat and what it published in
//!   the last ten minutes: a rate chart and commit-to-publish p50 / p99.
//! - **Dead letters**: the filters of `outbox dead list` (destination, event type, time
//!   range, error text), pages of 50, a message's detail (headers, payload preview capped
//!   at 64 KiB, attempts, last error), and **replay** or **discard** for a selection or a
//!   whole filter, after a confirmation page that says how many rows it will touch.
//! - **Waiting**: the rows not yet published (pending, retrying, leased) under the same
//!   filters, each with its attempts, last error and next attempt: why a backlog does not
//!   move. Destinations no route of the relay serves are marked, here and on the overview
//!   ([`Dashboard::routes`]).
//! - **Lookup** of a message by id or idempotency key, whatever its state.
//!
//! The filters' parameters are the flags of `outbox dead list` (`destination`,
//! `event-type`, `error-contains`, `since`, `until`); a page refuses one it does not know.
//!
//! Plain server-rendered HTML with no scripts and nothing loaded from elsewhere: it works
//! offline, and the content security policy forbids scripts outright.
//!
//! **Security.** Every request needs the token, as `Authorization: Bearer <token>` or as
//! the password of HTTP basic auth (any user name; browsers ask for it), unless
//! [`public_read`](Dashboard::public_read) opens the pages that show no payloads. Changing
//! rows always needs the token, a CSRF token from the page's form and a same-origin
//! request. Values are escaped (a payload holding `<script>` shows as text); the token and
//! the store's credentials are never rendered.
//!
//! ```no_run
//! # async fn demo(store: outbox_engine::AnyStore) -> Result<(), Box<dyn std::error::Error>> {
//! use outbox_dashboard::Dashboard;
//!
//! let dashboard = Dashboard::new(store, std::env::var("OUTBOX_DASHBOARD_TOKEN")?)?;
//! // Mounted in your own axum app (link to `/outbox/`, with the slash):
//! let app = axum::Router::new().nest("/outbox", dashboard.router());
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:9465").await?;
//! axum::serve(listener, app).await?;
//! # Ok(())
//! # }
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]

use std::sync::Arc;

use axum::Router;
use axum::routing::{get, post};
use outbox_engine::{AnyStore, RelayHealth};

mod auth;
mod filter;
mod pages;
mod routes;

use auth::Access;

/// The shortest token accepted, in bytes.
pub const MIN_TOKEN_BYTES: usize = 16;

/// Why a dashboard cannot be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DashboardError {
    /// The token is shorter than [`MIN_TOKEN_BYTES`] or holds characters that cannot
    /// travel in a header.
    #[error(
        "the dashboard token must be at least {MIN_TOKEN_BYTES} bytes of visible ASCII (generate one with `openssl rand -hex 24`)"
    )]
    WeakToken,
}

/// The dashboard of one outbox table; [`router`](Self::router) serves it.
#[derive(Clone)]
pub struct Dashboard {
    shared: Shared,
}

#[derive(Clone)]
struct Shared {
    store: AnyStore,
    access: Access,
    relay: Option<RelayHealth>,
    /// The destinations that have a route, when known.
    routes: Option<Vec<String>>,
}

impl std::fmt::Debug for Dashboard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dashboard")
            .field("token", &"[redacted]")
            .field("public_read", &self.shared.access.public_read)
            .field("hosts", &self.shared.access.hosts)
            .field("relay", &self.shared.relay.is_some())
            .finish_non_exhaustive()
    }
}

impl Dashboard {
    /// A dashboard of `store` that asks for `token` on every request.
    ///
    /// # Errors
    ///
    /// [`DashboardError::WeakToken`] for a token shorter than [`MIN_TOKEN_BYTES`].
    pub fn new(store: AnyStore, token: impl Into<String>) -> Result<Self, DashboardError> {
        Ok(Self {
            shared: Shared {
                store,
                access: Access::new(token.into())?,
                relay: None,
                routes: None,
            },
        })
    }

    /// Lets anyone who reaches the dashboard read the overview, the dead-letter lists and
    /// lookups without the token; payloads, headers and every change still need it. Takes
    /// effect only with [`hosts`](Self::hosts): a page whose DNS name was pointed at the
    /// dashboard (DNS rebinding) could read it otherwise.
    #[must_use]
    pub fn public_read(mut self, open: bool) -> Self {
        self.shared.access.public_read = open;
        self
    }

    /// The host names the dashboard answers to, as browsers send them in `Host`
    /// (`ops.example.com`, `127.0.0.1:9465`; a name without a port matches any port).
    /// Requests for any other name are refused with 421. Without this list every name is
    /// answered, and public reads are off.
    ///
    /// ```
    /// # fn demo(store: outbox_engine::AnyStore) -> Result<(), outbox_dashboard::DashboardError> {
    /// let dashboard = outbox_dashboard::Dashboard::new(store, "a-token-of-at-least-16-bytes")?
    ///     .hosts(["127.0.0.1:9465", "localhost:9465"])
    ///     .public_read(true);
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn hosts<S: AsRef<str>>(mut self, hosts: impl IntoIterator<Item = S>) -> Self {
        self.shared.access.hosts = hosts
            .into_iter()
            .map(|h| h.as_ref().trim().to_ascii_lowercase())
            .filter(|h| !h.is_empty())
            .collect();
        self
    }

    /// Shows this relay's heartbeat and what it published lately (from
    /// [`RelayHealth::activity`]) on the overview.
    #[must_use]
    pub fn relay(mut self, health: RelayHealth) -> Self {
        self.shared.relay = Some(health);
        self
    }

    /// The destinations the relay has routes for: the others are marked "no route" (rows
    /// for them wait until a relay with such a route runs).
    #[must_use]
    pub fn routes<S: Into<String>>(mut self, destinations: impl IntoIterator<Item = S>) -> Self {
        self.shared.routes = Some(destinations.into_iter().map(Into::into).collect());
        self
    }

    /// The dashboard's routes, to serve alone or to `nest` under a path of your app.
    pub fn router(&self) -> Router {
        let shared = Arc::new(self.shared.clone());
        Router::new()
            .route("/", get(routes::overview))
            .route("/dead", get(routes::dead_letters))
            .route("/waiting", get(routes::waiting))
            .route("/dead/review", post(routes::review_page))
            .route("/dead/apply", post(routes::apply))
            .route("/messages/{id}", get(routes::message))
            .route("/lookup", get(routes::lookup))
            .layer(axum::middleware::from_fn_with_state(
                shared.clone(),
                auth::guard,
            ))
            .with_state(shared)
    }
}
