//! The handlers: read the store, check the form, and hand the figures to `pages`.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Extension;
use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Path, Request, State};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Redirect, Response};
use outbox_engine::{
    Backend, DeadLetterFilter, DeadLetters, FindMessages, Store, StoreError, StoreErrorKind,
};

use crate::Shared;
use crate::auth::Authorized;
use crate::filter::{ListFilter, Params, message_id};
use crate::pages::{self, Base, Change, Review};

/// Dead letters (and waiting rows) per page.
pub(crate) const PAGE: usize = 50;
/// At most this many unfinished and dead rows are read per gauge (as the relay does).
const GAUGE_LIMIT: usize = 50_000;
/// At most this many messages a lookup lists.
const LOOKUP_LIMIT: usize = 50;

/// How long a page waits for the store before answering 503: a database that stopped
/// answering must not hold a page (or the operator) for the pool's own timeouts.
const STORE_DEADLINE: Duration = Duration::from_secs(5);

type AppState = State<Arc<Shared>>;

/// `query`, or a timeout error once [`STORE_DEADLINE`] passed.
async fn within<T>(query: impl Future<Output = Result<T, StoreError>>) -> Result<T, StoreError> {
    tokio::time::timeout(STORE_DEADLINE, query)
        .await
        .unwrap_or_else(|_| {
            Err(StoreError::new(
                StoreErrorKind::Timeout,
                format!("no answer within {} s", STORE_DEADLINE.as_secs()),
            ))
        })
}

fn store_error(error: &StoreError) -> Response {
    pages::problem(
        StatusCode::SERVICE_UNAVAILABLE,
        &format!("the store answered with an error: {error}"),
    )
}

fn bad_request(reason: String) -> Response {
    pages::problem(StatusCode::BAD_REQUEST, &reason)
}

/// A page, or the page that answers instead (a bad request, a store error).
type Page = Result<Response, Response>;

/// `query`'s answer, or the store's error page when it failed or [`STORE_DEADLINE`] passed.
async fn read<T>(query: impl Future<Output = Result<T, StoreError>>) -> Result<T, Response> {
    within(query).await.map_err(|error| store_error(&error))
}

/// The query string's parameters.
impl<S: Send + Sync> FromRequestParts<S> for Params {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Infallible> {
        Ok(Params::parse(
            parts.uri.query().unwrap_or_default().as_bytes(),
        ))
    }
}

pub(crate) async fn overview(State(shared): AppState, Extension(base): Extension<Base>) -> Page {
    let gauges = read(shared.store.gauges(GAUGE_LIMIT)).await?;
    let capabilities = shared.store.capabilities();
    Ok(pages::overview(
        &base,
        &capabilities,
        gauges.as_ref(),
        shared.relay.as_ref(),
        shared.routes.as_deref(),
    )
    .into_response())
}

pub(crate) async fn waiting(
    State(shared): AppState,
    Extension(base): Extension<Base>,
    params: Params,
) -> Page {
    params.only(&["after"]).map_err(bad_request)?;
    let filter = ListFilter::from_params(&params).map_err(bad_request)?;
    let mut page_filter = filter.to_filter();
    if let Some(after) = params.one("after") {
        page_filter = page_filter.after_id(message_id(after).map_err(bad_request)?);
    }
    let rows = read(shared.store.list_waiting(&page_filter, PAGE)).await?;
    Ok(pages::waiting(&base, &filter, &rows, shared.routes.as_deref()).into_response())
}

pub(crate) async fn dead_letters(
    State(shared): AppState,
    Extension(base): Extension<Base>,
    params: Params,
) -> Page {
    params
        .only(&["after", "replayed", "discarded"])
        .map_err(bad_request)?;
    let filter = ListFilter::from_params(&params).map_err(bad_request)?;
    let mut page_filter = filter.to_filter();
    if let Some(after) = params.one("after") {
        page_filter = page_filter.after_id(message_id(after).map_err(bad_request)?);
    }
    let count = read(shared.store.count_dead(&filter.to_filter())).await?;
    let letters = read(shared.store.list_dead(&page_filter, PAGE)).await?;
    let done = ["replayed", "discarded"]
        .into_iter()
        .find_map(|verb| Some((verb, params.one(verb)?.parse::<u64>().ok()?)));
    Ok(
        pages::dead_letters(&base, &filter, count, &letters, done, &shared.access.csrf)
            .into_response(),
    )
}

/// What a form asks: the change, and either the selected ids or the list's filter.
fn review(params: &Params) -> Result<Review, String> {
    params.only(&["csrf", "do", "id"])?;
    let (change, scope) = params
        .one("do")
        .and_then(|action| action.split_once('-'))
        .ok_or("the form names no action")?;
    let change = match change {
        "replay" => Change::Replay,
        "discard" => Change::Discard,
        other => return Err(format!("{other:?} is not an action")),
    };
    let list = ListFilter::from_params(params)?;
    let (ids, filter) = match scope {
        "selected" => {
            let ids = params.ids("id")?;
            if ids.is_empty() {
                return Err("select at least one dead letter".to_owned());
            }
            (ids.clone(), DeadLetterFilter::all().ids(ids))
        }
        "all" => (Vec::new(), list.to_filter()),
        other => return Err(format!("{other:?} is not a scope")),
    };
    Ok(Review {
        change,
        ids,
        list,
        filter,
    })
}

/// The change a posted form asks for, once its CSRF token checks out.
pub(crate) struct Checked(Review);

impl FromRequest<Arc<Shared>> for Checked {
    type Rejection = Response;

    async fn from_request(request: Request, shared: &Arc<Shared>) -> Result<Self, Response> {
        let body = Bytes::from_request(request, shared)
            .await
            .map_err(IntoResponse::into_response)?;
        let params = Params::parse(&body);
        if !params
            .one("csrf")
            .is_some_and(|token| shared.access.csrf_matches(token))
        {
            return Err(pages::problem(
                StatusCode::FORBIDDEN,
                "the form is stale or forged (no valid CSRF token): reload the page and try again",
            ));
        }
        review(&params).map(Checked).map_err(bad_request)
    }
}

pub(crate) async fn review_page(
    State(shared): AppState,
    Extension(base): Extension<Base>,
    Checked(review): Checked,
) -> Page {
    let count = read(shared.store.count_dead(&review.filter)).await?;
    Ok(pages::confirm(&base, &review, count, &shared.access.csrf).into_response())
}

pub(crate) async fn apply(
    State(shared): AppState,
    Extension(base): Extension<Base>,
    Checked(review): Checked,
) -> Page {
    let count = match review.change {
        Change::Replay => read(shared.store.replay_dead(&review.filter)).await?,
        Change::Discard => read(shared.store.discard_dead(&review.filter)).await?,
    };
    if review.change == Change::Replay {
        // Wake listening relays; without wakeups they find the rows at their next poll.
        let _ = within(shared.store.notify()).await;
    }
    let verb = match review.change {
        Change::Replay => "replayed",
        Change::Discard => "discarded",
    };
    let query = review.list.query(&[(verb, count.to_string())]);
    Ok(Redirect::to(&format!("{}/dead?{query}", base.0)).into_response())
}

pub(crate) async fn message(
    State(shared): AppState,
    Extension(base): Extension<Base>,
    Extension(Authorized(authorized)): Extension<Authorized>,
    Path(id): Path<String>,
) -> Page {
    message_id(&id).map_err(bad_request)?;
    let found = read(shared.store.find_messages(&id, 1)).await?;
    Ok(match found.first() {
        Some(found) => {
            pages::message(&base, found, authorized, &shared.access.csrf).into_response()
        }
        None => pages::problem(StatusCode::NOT_FOUND, "no message has this id"),
    })
}

pub(crate) async fn lookup(
    State(shared): AppState,
    Extension(base): Extension<Base>,
    params: Params,
) -> Page {
    let key = params.one("q").unwrap_or_default().to_owned();
    if key.is_empty() {
        return Ok(pages::lookup(&base, &key, &[]).into_response());
    }
    let found = read(shared.store.find_messages(&key, LOOKUP_LIMIT)).await?;
    Ok(pages::lookup(&base, &key, &found).into_response())
}
