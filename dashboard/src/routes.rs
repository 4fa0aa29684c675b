//! The handlers: read the store, check the form, and hand the figures to `pages`.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Extension;
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use outbox_engine::{
    Backend, DeadLetterFilter, DeadLetters, FindMessages, Store, StoreError, StoreErrorKind,
};

use crate::Shared;
use crate::auth::Authorized;
use crate::filter::{ListFilter, Params, message_id};
use crate::pages::{self, Base, Change, Review};

/// Dead letters per page.
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

fn bad_request(reason: &str) -> Response {
    pages::problem(StatusCode::BAD_REQUEST, reason)
}

pub(crate) async fn overview(
    State(shared): AppState,
    Extension(base): Extension<Base>,
) -> Response {
    match within(shared.store.gauges(GAUGE_LIMIT)).await {
        Ok(gauges) => {
            let capabilities = shared.store.capabilities();
            pages::overview(&base, &capabilities, gauges.as_ref(), shared.relay.as_ref())
                .into_response()
        }
        Err(error) => store_error(&error),
    }
}

pub(crate) async fn dead_letters(
    State(shared): AppState,
    Extension(base): Extension<Base>,
    RawQuery(query): RawQuery,
) -> Response {
    let params = Params::parse(query.unwrap_or_default().as_bytes());
    let filter = match ListFilter::from_params(&params) {
        Ok(filter) => filter,
        Err(reason) => return bad_request(&reason),
    };
    let mut page_filter = filter.to_filter();
    if let Some(after) = params.one("after") {
        match message_id(after) {
            Ok(id) => page_filter = page_filter.after_id(id),
            Err(reason) => return bad_request(&reason),
        }
    }
    let count = match within(shared.store.count_dead(&filter.to_filter())).await {
        Ok(count) => count,
        Err(error) => return store_error(&error),
    };
    let letters = match within(shared.store.list_dead(&page_filter, PAGE)).await {
        Ok(letters) => letters,
        Err(error) => return store_error(&error),
    };
    let done = ["replayed", "discarded"]
        .into_iter()
        .find_map(|verb| Some((verb, params.one(verb)?.parse::<u64>().ok()?)));
    pages::dead_letters(&base, &filter, count, &letters, done, &shared.access.csrf).into_response()
}

/// What a form asks: the change, and either the selected ids or the list's filter.
fn review(params: &Params) -> Result<Review, String> {
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

/// The change a posted form asks for, once its CSRF token checks out; otherwise the
/// status and reason to answer with.
fn checked(shared: &Shared, body: &Bytes) -> Result<Review, (StatusCode, String)> {
    let params = Params::parse(body);
    if !params
        .one("csrf")
        .is_some_and(|token| shared.access.csrf_matches(token))
    {
        return Err((
            StatusCode::FORBIDDEN,
            "the form is stale or forged (no valid CSRF token): reload the page and try again"
                .to_owned(),
        ));
    }
    review(&params).map_err(|reason| (StatusCode::BAD_REQUEST, reason))
}

pub(crate) async fn review_page(
    State(shared): AppState,
    Extension(base): Extension<Base>,
    body: Bytes,
) -> Response {
    let review = match checked(&shared, &body) {
        Ok(review) => review,
        Err((status, reason)) => return pages::problem(status, &reason),
    };
    match within(shared.store.count_dead(&review.filter)).await {
        Ok(count) => pages::confirm(&base, &review, count, &shared.access.csrf).into_response(),
        Err(error) => store_error(&error),
    }
}

pub(crate) async fn apply(
    State(shared): AppState,
    Extension(base): Extension<Base>,
    body: Bytes,
) -> Response {
    let review = match checked(&shared, &body) {
        Ok(review) => review,
        Err((status, reason)) => return pages::problem(status, &reason),
    };
    let done = match review.change {
        Change::Replay => within(shared.store.replay_dead(&review.filter)).await,
        Change::Discard => within(shared.store.discard_dead(&review.filter)).await,
    };
    let count = match done {
        Ok(count) => count,
        Err(error) => return store_error(&error),
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
    Redirect::to(&format!("{}/dead?{query}", base.0)).into_response()
}

pub(crate) async fn message(
    State(shared): AppState,
    Extension(base): Extension<Base>,
    Extension(Authorized(authorized)): Extension<Authorized>,
    Path(id): Path<String>,
) -> Response {
    if let Err(reason) = message_id(&id) {
        return bad_request(&reason);
    }
    match within(shared.store.find_messages(&id, 1)).await {
        Ok(found) => match found.first() {
            Some(found) => {
                pages::message(&base, found, authorized, &shared.access.csrf).into_response()
            }
            None => pages::problem(StatusCode::NOT_FOUND, "no message has this id"),
        },
        Err(error) => store_error(&error),
    }
}

pub(crate) async fn lookup(
    State(shared): AppState,
    Extension(base): Extension<Base>,
    RawQuery(query): RawQuery,
) -> Response {
    let params = Params::parse(query.unwrap_or_default().as_bytes());
    let key = params.one("q").unwrap_or_default().to_owned();
    if key.is_empty() {
        return pages::lookup(&base, &key, &[]).into_response();
    }
    match within(shared.store.find_messages(&key, LOOKUP_LIMIT)).await {
        Ok(found) => pages::lookup(&base, &key, &found).into_response(),
        Err(error) => store_error(&error),
    }
}
