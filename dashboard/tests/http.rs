//! The dashboard's HTTP contract over the in-memory store (the browser test in
//! `outbox-cli/tests/dashboard.rs` runs it on PostgreSQL): who may read and change what,
//! the confirmation flow, escaping, paging.

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use outbox_dashboard::Dashboard;
use outbox_engine::{
    AnyStore, ClaimRequest, Completion, DeadLetterFilter, DeadLetters, MemoryStore, NewMessage,
    Store, StoreStats,
};
use tower::ServiceExt;

const TOKEN: &str = "a-token-of-thirty-two-characters";

/// `n` dead letters on `destination`, each with `reason`.
async fn dead(store: &MemoryStore, destination: &str, n: usize, reason: &str, payload: &str) {
    let messages: Vec<_> = (0..n)
        .map(|_| {
            NewMessage::builder(destination, "order.paid")
                .bytes(payload.as_bytes().to_vec(), "text/plain")
                .header("x-trace", "<b>bold</b>")
                .build()
                .unwrap()
        })
        .collect();
    let ids: Vec<_> = messages.iter().map(NewMessage::id).collect();
    store.enqueue_all(messages).unwrap();
    let claim = store
        .claim(&ClaimRequest::new(
            "test",
            n,
            std::time::Duration::from_secs(30),
        ))
        .await
        .unwrap();
    let deaths: Vec<_> = ids.iter().map(|id| Completion::dead(*id, reason)).collect();
    store.complete(claim.lease.token, &deaths).await.unwrap();
}

struct App {
    store: MemoryStore,
    router: axum::Router,
}

impl App {
    fn new(public_read: bool) -> Self {
        let store = MemoryStore::new();
        let router = Dashboard::new(AnyStore::new(store.clone()), TOKEN)
            .unwrap()
            .hosts(["dashboard.test"])
            .public_read(public_read)
            .router();
        Self { store, router }
    }

    async fn call(&self, request: Request<Body>) -> (StatusCode, String, axum::http::HeaderMap) {
        let response = self.router.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let headers = response.headers().clone();
        let body = axum::body::to_bytes(response.into_body(), 1 << 24)
            .await
            .unwrap();
        (status, String::from_utf8(body.to_vec()).unwrap(), headers)
    }

    async fn get(&self, path: &str, token: bool) -> (StatusCode, String, axum::http::HeaderMap) {
        let mut request = Request::get(path).header(header::HOST, "dashboard.test");
        if token {
            request = request.header(header::AUTHORIZATION, format!("Bearer {TOKEN}"));
        }
        self.call(request.body(Body::empty()).unwrap()).await
    }

    async fn post(
        &self,
        path: &str,
        form: &str,
        token: bool,
        origin: Option<&str>,
    ) -> (StatusCode, String, axum::http::HeaderMap) {
        let mut request = Request::post(path)
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .header(header::HOST, "dashboard.test");
        if token {
            request = request.header(header::AUTHORIZATION, format!("Bearer {TOKEN}"));
        }
        if let Some(origin) = origin {
            request = request.header(header::ORIGIN, origin);
        }
        self.call(request.body(Body::from(form.to_owned())).unwrap())
            .await
    }

    async fn dead_count(&self) -> u64 {
        self.store
            .count_dead(&DeadLetterFilter::all())
            .await
            .unwrap()
    }
}

/// The CSRF token of a page's forms.
fn csrf(page: &str) -> String {
    let at = page
        .find("name=\"csrf\" value=\"")
        .expect("a form with a CSRF token")
        + 19;
    page[at..at + 64].to_owned()
}

#[tokio::test]
async fn without_the_token_nothing_is_read_or_changed() {
    let app = App::new(false);
    dead(&app.store, "billing", 3, "404 not found", "{}").await;
    let (_, page, _) = app.get("/dead", true).await;
    let form = format!("csrf={}&do=discard-all", csrf(&page));
    for path in ["/", "/dead", "/lookup?q=x"] {
        let (status, body, headers) = app.get(path, false).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{path}");
        assert!(
            headers[header::WWW_AUTHENTICATE]
                .to_str()
                .unwrap()
                .starts_with("Basic")
        );
        assert!(!body.contains("billing"));
    }
    for path in ["/dead/review", "/dead/apply"] {
        let (status, _, _) = app.post(path, &form, false, None).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{path}");
    }
    let (status, _, _) = app
        .call(
            Request::post("/dead/apply")
                .header(header::HOST, "dashboard.test")
                .header(
                    header::AUTHORIZATION,
                    "Bearer a-token-of-thirty-two-characterZ",
                )
                .body(Body::from(form.clone()))
                .unwrap(),
        )
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "a wrong token");
    assert_eq!(app.dead_count().await, 3, "nothing changed");

    // With the token, the same form goes through.
    let (status, _, headers) = app.post("/dead/apply", &form, true, None).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    assert_eq!(headers[header::LOCATION], "/dead?discarded=3");
    assert_eq!(app.dead_count().await, 0);
}

#[tokio::test]
async fn changes_need_the_pages_csrf_token_and_the_same_origin() {
    let app = App::new(false);
    dead(&app.store, "billing", 2, "500", "{}").await;
    let (_, page, _) = app.get("/dead", true).await;
    let token = csrf(&page);
    for form in [
        "do=replay-all".to_owned(),
        format!("csrf={}&do=replay-all", "0".repeat(64)),
    ] {
        let (status, _, _) = app.post("/dead/apply", &form, true, None).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{form}");
    }
    let form = format!("csrf={token}&do=replay-all");
    let (status, _, _) = app
        .post("/dead/apply", &form, true, Some("https://evil.example"))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "cross-origin");
    assert_eq!(app.dead_count().await, 2, "nothing changed");
    let (status, _, _) = app
        .post("/dead/apply", &form, true, Some("http://dashboard.test"))
        .await;
    assert_eq!(status, StatusCode::SEE_OTHER, "same origin");
    assert_eq!(app.dead_count().await, 0);
}

#[tokio::test]
async fn a_replay_is_confirmed_with_its_count_and_moves_exactly_the_filtered_rows() {
    let app = App::new(false);
    dead(&app.store, "billing", 4, "404 not found", "{}").await;
    dead(&app.store, "billing", 2, "503 unavailable", "{}").await;
    dead(&app.store, "sms", 3, "404 unknown number", "{}").await;
    let (status, page, _) = app
        .get("/dead?destination=billing&error-contains=404", true)
        .await;
    assert_eq!(status, StatusCode::OK);
    assert!(page.contains("<span id=\"match-count\">4</span>"), "{page}");
    assert_eq!(page.matches("class=\"letter\"").count(), 4);

    let form = format!(
        "csrf={}&do=replay-all&destination=billing&error-contains=404",
        csrf(&page)
    );
    let (status, confirm, _) = app.post("/dead/review", &form, true, None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        confirm.contains("<strong id=\"confirm-count\">4</strong>"),
        "{confirm}"
    );
    assert_eq!(app.dead_count().await, 9, "a review changes nothing");

    let (status, _, headers) = app.post("/dead/apply", &form, true, None).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    assert_eq!(
        headers[header::LOCATION],
        "/dead?destination=billing&error-contains=404&replayed=4"
    );
    let stats = app.store.stats().await.unwrap();
    let billing = stats.destination("billing").unwrap();
    assert_eq!((billing.pending, billing.dead), (4, 2));
    assert_eq!(stats.destination("sms").unwrap().dead, 3);

    // A selection: one of the sms dead letters.
    let (_, page, _) = app.get("/dead?destination=sms", true).await;
    let first = DeadLetterFilter::all().destination("sms");
    let id = app.store.list_dead(&first, 1).await.unwrap()[0].message.id;
    let form = format!(
        "csrf={}&do=discard-selected&id={id}&destination=sms",
        csrf(&page)
    );
    let (_, confirm, _) = app.post("/dead/review", &form, true, None).await;
    assert!(
        confirm.contains("<strong id=\"confirm-count\">1</strong>"),
        "{confirm}"
    );
    app.post("/dead/apply", &form, true, None).await;
    assert_eq!(
        app.store
            .stats()
            .await
            .unwrap()
            .destination("sms")
            .unwrap()
            .dead,
        2
    );
    let (status, _, _) = app
        .post(
            "/dead/review",
            &format!("csrf={}&do=discard-selected", csrf(&page)),
            true,
            None,
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "a selection of nothing");
}

/// A DNS-rebinding page reaches the dashboard under its own name: with public reads on,
/// a foreign `Host` is refused (with the token too), as is another site's script reading
/// a page; without a host list, public reads are off.
#[tokio::test]
async fn public_reads_answer_only_the_dashboards_own_host_names() {
    let app = App::new(true);
    dead(
        &app.store,
        "billing",
        1,
        "410 gone: receiver said <why>",
        "{}",
    )
    .await;
    let read = |host: &'static str, origin: Option<&'static str>, token: bool| {
        let mut request = Request::get("/dead").header(header::HOST, host);
        if let Some(origin) = origin {
            request = request.header(header::ORIGIN, origin);
        }
        if token {
            request = request.header(header::AUTHORIZATION, format!("Bearer {TOKEN}"));
        }
        request.body(Body::empty()).unwrap()
    };
    let (status, page, _) = app.call(read("dashboard.test", None, false)).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(page.contains("receiver said"), "{page}");
    let (status, page, _) = app.call(read("dashboard.test:9465", None, false)).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "a name without a port matches any port: {page}"
    );
    for (host, token) in [
        ("rebound.attacker.example:9465", false),
        ("rebound.attacker.example", true),
    ] {
        let (status, page, _) = app.call(read(host, None, token)).await;
        assert_eq!(status, StatusCode::MISDIRECTED_REQUEST, "{host}: {page}");
        assert!(!page.contains("receiver said"), "{page}");
    }
    let (status, page, _) = app
        .call(read(
            "dashboard.test",
            Some("https://attacker.example"),
            false,
        ))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{page}");

    let open_to_any_host = Dashboard::new(AnyStore::new(app.store.clone()), TOKEN)
        .unwrap()
        .public_read(true)
        .router();
    let response = open_to_any_host
        .oneshot(read("rebound.attacker.example", None, false))
        .await
        .unwrap();
    assert_eq!(
        response.status(),
        StatusCode::UNAUTHORIZED,
        "no hosts, no public reads"
    );
}

#[tokio::test]
async fn data_from_the_table_is_text_never_markup() {
    let app = App::new(true);
    dead(
        &app.store,
        "billing",
        1,
        "<img src=x onerror=alert(1)>",
        "<script>alert('x')</script>",
    )
    .await;
    let id = app
        .store
        .list_dead(&DeadLetterFilter::all(), 1)
        .await
        .unwrap()[0]
        .message
        .id;

    let (status, page, headers) = app.get(&format!("/messages/{id}"), true).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        page.contains("&lt;script&gt;alert('x')&lt;/script&gt;"),
        "{page}"
    );
    assert!(!page.contains("<script>"));
    assert!(
        page.contains("&lt;b&gt;bold&lt;/b&gt;"),
        "headers are escaped"
    );
    assert!(page.contains("&lt;img src=x onerror=alert(1)&gt;"));
    let policy = headers[header::CONTENT_SECURITY_POLICY].to_str().unwrap();
    assert!(policy.contains("default-src 'none'") && !policy.contains("script-src"));

    let (_, list, _) = app.get("/dead", false).await;
    assert!(list.contains("&lt;img src=x onerror=alert(1)&gt;") && !list.contains("<img"));

    // Public reading shows no payload and no headers without the token.
    let (status, page, _) = app.get(&format!("/messages/{id}"), false).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        !page.contains("alert('x')") && !page.contains("bold"),
        "{page}"
    );
    assert!(page.contains("need the dashboard's token"));
}

#[tokio::test]
async fn pages_of_fifty_and_lookups() {
    let app = App::new(false);
    dead(&app.store, "billing", 120, "410 gone", "{}").await;
    let mut seen = std::collections::HashSet::new();
    let mut path = "/dead".to_owned();
    for expected in [50, 50, 20] {
        let (_, page, _) = app.get(&path, true).await;
        assert_eq!(page.matches("class=\"letter\"").count(), expected);
        for row in page.split("class=\"letter\"").skip(1) {
            let at = row.find("value=\"").unwrap() + 7;
            assert!(
                seen.insert(row[at..at + 36].to_owned()),
                "no row on two pages"
            );
        }
        let link = "id=\"next-page\" href=\"";
        if let Some(at) = page.find(link) {
            let rest = &page[at + link.len()..];
            path = rest[..rest.find('"').unwrap()].replace("&amp;", "&");
        }
    }
    assert_eq!(seen.len(), 120);

    let letter = &app
        .store
        .list_dead(&DeadLetterFilter::all(), 1)
        .await
        .unwrap()[0];
    let (_, page, _) = app
        .get(
            &format!("/lookup?q={}", letter.message.idempotency_key),
            true,
        )
        .await;
    assert!(page.contains(&format!("/messages/{}", letter.message.id)));
    assert!(page.contains("dead"));
    let (_, page, _) = app.get("/lookup?q=nothing-here", true).await;
    assert!(page.contains("No message has the id or idempotency key"));
    let (status, _, _) = app.get("/messages/not-an-id", true).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _, _) = app.get("/dead?since=yesterday", true).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn nested_under_a_path_links_stay_inside_it() {
    let store = MemoryStore::new();
    dead(&store, "billing", 1, "404", "{}").await;
    let dashboard = Dashboard::new(AnyStore::new(store.clone()), TOKEN).unwrap();
    let router = axum::Router::new().nest("/ops/outbox", dashboard.router());
    let response = router
        .oneshot(
            Request::get("/ops/outbox/dead")
                .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let page = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap();
    let page = String::from_utf8(page.to_vec()).unwrap();
    assert!(
        page.contains("action=\"/ops/outbox/dead/review\""),
        "{page}"
    );
    assert!(page.contains("href=\"/ops/outbox/messages/"));
}

#[tokio::test]
async fn the_overview_shows_what_the_store_declares() {
    let app = App::new(false);
    let (status, page, _) = app.get("/", true).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    let declared = app.store.capabilities().to_string();
    assert!(
        declared.starts_with("memory: published rows keep"),
        "{declared}"
    );
    assert!(
        page.contains(&declared),
        "the overview names {declared:?}: {page}"
    );
}

/// The waiting page lists the rows not yet published with their attempts, last error and
/// next attempt, under the filters of `outbox dead list`; a destination no route serves
/// is marked there and on the overview; a parameter the page does not know is refused.
#[tokio::test]
async fn waiting_rows_show_why_a_backlog_does_not_move() {
    let store = MemoryStore::new();
    let messages: Vec<_> = ["billing", "billing", "ledger"]
        .iter()
        .map(|d| {
            NewMessage::builder(*d, "invoice.paid")
                .json(&1)
                .build()
                .unwrap()
        })
        .collect();
    let ids: Vec<_> = messages.iter().map(NewMessage::id).collect();
    store.enqueue_all(messages).unwrap();
    let claim = store
        .claim(
            &ClaimRequest::new("test", 10, std::time::Duration::from_secs(30))
                .destinations(vec!["billing".into()]),
        )
        .await
        .unwrap();
    let retry = Completion::retry(
        ids[0],
        std::time::Duration::from_secs(600),
        "HTTP 503 <busy>",
    );
    store.complete(claim.lease.token, &[retry]).await.unwrap();
    let app = App {
        store: store.clone(),
        router: Dashboard::new(AnyStore::new(store), TOKEN)
            .unwrap()
            .routes(["billing"])
            .router(),
    };

    let (status, page, _) = app.get("/waiting", true).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert_eq!(page.matches("<tr class=\"waiting\">").count(), 3, "{page}");
    assert!(
        page.contains("HTTP 503 &lt;busy&gt;"),
        "the last error, escaped: {page}"
    );
    assert!(
        page.contains("in 9m"),
        "the retry's next attempt, ten minutes out: {page}"
    );
    assert!(page.contains(">leased<"), "the leased row: {page}");
    assert_eq!(
        page.matches("no route").count(),
        1,
        "the ledger row is marked, the billing rows are not: {page}"
    );

    let (_, filtered, _) = app.get("/waiting?error-contains=503", true).await;
    assert_eq!(
        filtered.matches("<tr class=\"waiting\">").count(),
        1,
        "{filtered}"
    );
    let (_, ledger, _) = app.get("/waiting?destination=ledger", true).await;
    assert!(ledger.contains(&ids[2].to_string()) && !ledger.contains(&ids[0].to_string()));

    let (_, overview, _) = app.get("/", true).await;
    assert!(overview.contains("no route"), "{overview}");
    assert!(
        overview.contains("/waiting?destination=billing"),
        "the backlog links to its waiting rows: {overview}"
    );

    for path in [
        "/waiting?error=503",
        "/dead?event_type=order.paid",
        "/waiting?page=2",
    ] {
        let (status, page, _) = app.get(path, true).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {page}");
        assert!(page.contains("unknown parameter"), "{path}: {page}");
    }
}
