//! `outbox dashboard` on PostgreSQL, driven by headless Chromium: 100 dead letters across
//! three destinations; the count the page shows for a filter equals what `outbox dead list
//! --json` lists; replaying the filtered set through the confirmation leaves exactly those
//! rows pending; the page's numbers follow. Without the token the action endpoints answer
//! 401 and change nothing; a payload holding `<script>` is shown as text. The waiting page
//! shows retrying rows with their error and next attempt, and marks the rows no route
//! serves.
//!
//! Needs PostgreSQL, Chromium and playwright-core (`scripts/services.sh` installs them:
//! `OUTBOX_TEST_CHROMIUM`, `OUTBOX_TEST_PLAYWRIGHT_PATH`). With `OUTBOX_SCREENSHOTS_DIR`
//! set, the browser also saves the screenshots `docs/` shows.

use std::process::{Command, Stdio};
use std::time::Duration;

use outbox::postgres::PgOutbox;
use outbox::{NewMessage, TableNames};
use outbox_test_support::{ChildGuard, output_within, server_url, wait_for, wait_until};

mod common;

const TOKEN: &str = "dashboard-test-token-0123456789";
const SCRIPT_PAYLOAD: &str = "<script>alert('owned')</script>";

/// `(destination, reason, how many)`: 100 dead letters across three destinations.
const DEAD: &[(&str, &str, usize)] = &[
    ("billing", "HTTP 404 Not Found: no such invoice", 23),
    ("billing", "HTTP 503 Service Unavailable", 17),
    ("sms", "HTTP 404 unknown number", 21),
    ("sms", "HTTP 400 bad template", 14),
    ("email", "550 mailbox unavailable", 25),
];

struct Setup {
    pool: sqlx::PgPool,
    table: String,
    dir: tempfile::TempDir,
    addr: String,
    config: std::path::PathBuf,
    script_id: String,
}

async fn setup() -> Setup {
    let url = outbox_test_support::postgres_url();
    let pool = outbox_test_support::postgres_pool().await;
    let table = format!("dashboard_{:016x}", fastrand::u64(..));
    let store = PgOutbox::with_names(pool.clone(), TableNames::default().outbox(&table).unwrap());
    store.migrate().await.unwrap();

    let mut messages = Vec::new();
    let mut fates = Vec::new();
    for (destination, reason, n) in DEAD {
        for i in 0..*n {
            let payload = if *destination == "email" && i == 0 {
                SCRIPT_PAYLOAD.to_owned()
            } else {
                format!("{{\"n\":{i}}}")
            };
            messages.push(
                NewMessage::builder(*destination, "order.paid")
                    .bytes(payload.into_bytes(), "text/plain")
                    .build()
                    .unwrap(),
            );
            fates.push(common::Fate::Dead(reason));
        }
    }
    let script_id = messages[DEAD[..4].iter().map(|d| d.2).sum::<usize>()]
        .id()
        .to_string();
    common::settle(&store, &messages, &fates).await;

    let dir = tempfile::tempdir().unwrap();
    let addr = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap().to_string()
    };
    let config = dir.path().join("outbox.toml");
    std::fs::write(
        &config,
        format!(
            "[store]\nurl = \"{url}\"\ntable = \"{table}\"\n\n[dashboard]\nlisten = \"{addr}\"\ntoken_env = \"OUTBOX_TEST_DASHBOARD_TOKEN\"\n"
        ),
    )
    .unwrap();
    Setup {
        pool,
        table,
        dir,
        addr,
        config,
        script_id,
    }
}

impl Setup {
    /// `outbox dashboard`.
    fn dashboard(&self) -> ChildGuard {
        self.outbox("dashboard", &self.config)
    }

    /// `outbox relay` with the same store and dashboard, and `routes`.
    fn relay(&self, routes: &str) -> ChildGuard {
        let config = self.dir.path().join("relay.toml");
        let base = std::fs::read_to_string(&self.config).unwrap();
        std::fs::write(&config, format!("{base}\n{routes}")).unwrap();
        self.outbox("relay", &config)
    }

    fn outbox(&self, command: &str, config: &std::path::Path) -> ChildGuard {
        let log = std::fs::File::create(self.dir.path().join(format!("{command}.log"))).unwrap();
        ChildGuard::spawn(
            format!("outbox {command}"),
            Command::new(env!("CARGO_BIN_EXE_outbox"))
                .args(["--config", config.to_str().unwrap(), command])
                .env_remove("OUTBOX_CONFIG")
                .env("OUTBOX_TEST_DASHBOARD_TOKEN", TOKEN)
                .stdout(Stdio::null())
                .stderr(Stdio::from(log)),
        )
    }

    async fn started(&self) {
        let addr = self.addr.clone();
        wait_until(
            "the dashboard to answer on its address",
            Duration::from_secs(30),
            || {
                let addr = addr.clone();
                async move { !common::http_get(&addr, "/").await.is_empty() }
            },
        )
        .await;
    }

    /// `status = 'dead'` and `status = 'pending'` rows matching a destination and reason text.
    async fn rows(&self, destination: &str, text: &str) -> (i64, i64) {
        sqlx::query_as(&format!(
            "SELECT count(*) FILTER (WHERE status = 'dead'), count(*) FILTER (WHERE status = 'pending') \
             FROM {} WHERE destination = $1 AND strpos(last_error, $2) > 0",
            self.table
        ))
        .bind(destination)
        .bind(text)
        .fetch_one(&self.pool)
        .await
        .unwrap()
    }

    async fn drop_table(&self) {
        sqlx::query(&format!("DROP TABLE {} CASCADE", self.table))
            .execute(&self.pool)
            .await
            .unwrap();
    }
}

/// Runs `browser.cjs` with `args` (and the screenshot folder, when asked for one).
fn browser(args: &[&str]) -> std::process::Output {
    let chromium = server_url("OUTBOX_TEST_CHROMIUM", "/usr/bin/chromium");
    let playwright = server_url(
        "OUTBOX_TEST_PLAYWRIGHT_PATH",
        &format!(
            "{}/.cache/outbox-browser/node_modules",
            std::env::var("HOME").unwrap_or_default()
        ),
    );
    assert!(
        std::path::Path::new(&chromium).exists()
            && std::path::Path::new(&playwright)
                .join("playwright-core")
                .exists(),
        "this test needs Chromium ({chromium}) and playwright-core in {playwright}: run scripts/services.sh"
    );
    let mut node = Command::new(server_url("OUTBOX_TEST_NODE", "node"));
    node.arg(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/dashboard/browser.cjs"
    ))
    .args(args)
    .args(std::env::var("OUTBOX_SCREENSHOTS_DIR").ok())
    .env("NODE_PATH", &playwright)
    .env("OUTBOX_TEST_CHROMIUM", &chromium);
    let run = output_within("the browser script", Duration::from_secs(90), &mut node);
    assert!(
        run.status.success(),
        "browser script failed: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    run
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filtered_replay_in_the_browser_matches_the_cli_and_the_table() {
    let setup = setup().await;
    let _dashboard = setup.dashboard();
    setup.started().await;

    // What the CLI lists for the filter.
    let listed = output_within(
        "outbox dead list",
        Duration::from_secs(30),
        Command::new(env!("CARGO_BIN_EXE_outbox")).args([
            "--config",
            setup.config.to_str().unwrap(),
            "dead",
            "list",
            "--destination",
            "billing",
            "--error-contains",
            "404",
            "--limit",
            "1000",
            "--json",
        ]),
    );
    assert!(listed.status.success(), "{listed:?}");
    let cli_count = String::from_utf8(listed.stdout).unwrap().lines().count();
    assert_eq!(cli_count, 23);

    let run = browser(&[
        &format!("http://{}", setup.addr),
        TOKEN,
        "billing",
        "404",
        &setup.script_id,
    ]);
    let seen: serde_json::Value = serde_json::from_slice(&run.stdout).unwrap();
    eprintln!("browser saw: {seen}");
    assert_eq!(seen["shown"], cli_count, "the page's count is the CLI's");
    assert_eq!(seen["rows"], cli_count, "one page holds them all");
    assert_eq!(seen["confirm"], cli_count, "the confirmation says how many");
    assert_eq!(seen["done"], cli_count, "and that many were replayed");
    assert_eq!(seen["after"], 0, "the filter matches nothing any more");
    assert_eq!(seen["overviewDead"], "40");
    assert_eq!(seen["overviewDeadAfter"], "17", "the overview follows");
    assert_eq!(seen["payloadText"], SCRIPT_PAYLOAD, "the payload is text");
    assert_eq!(seen["dialogs"], serde_json::json!([]), "no script ran");

    // In the table: exactly the filtered rows are pending; the others are untouched.
    assert_eq!(setup.rows("billing", "404").await, (0, 23));
    assert_eq!(setup.rows("billing", "503").await, (17, 0));
    assert_eq!(setup.rows("sms", "404").await, (21, 0));
    setup.drop_table().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_token_actions_answer_401_and_change_nothing() {
    let setup = setup().await;
    let _dashboard = setup.dashboard();
    setup.started().await;
    let dead_before = setup.rows("billing", "HTTP").await;

    for path in ["/dead/review", "/dead/apply"] {
        let body = "do=discard-all&destination=billing";
        let response = common::http(
            &setup.addr,
            &format!(
                "POST {path} HTTP/1.1\r\nhost: {}\r\ncontent-type: application/x-www-form-urlencoded\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                setup.addr,
                body.len()
            ),
        )
        .await;
        assert!(response.starts_with("HTTP/1.1 401"), "{path}: {response}");
        assert!(
            response
                .to_ascii_lowercase()
                .contains("www-authenticate: basic")
        );
    }
    let page = common::http_get(&setup.addr, "/dead").await;
    assert!(page.starts_with("HTTP/1.1 401"), "{page}");
    assert!(!page.contains("billing"));
    assert_eq!(
        setup.rows("billing", "HTTP").await,
        dead_before,
        "nothing changed"
    );

    // With the token, the message page shows the script payload escaped.
    let page = common::http(
        &setup.addr,
        &format!(
            "GET /messages/{} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {TOKEN}\r\nconnection: close\r\n\r\n",
            setup.script_id
        ),
    )
    .await;
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    assert!(page.contains("&lt;script&gt;alert('owned')&lt;/script&gt;"));
    assert!(!page.contains(SCRIPT_PAYLOAD));
    assert!(!page.contains(TOKEN), "the token is never rendered");
    setup.drop_table().await;
}

/// A database that stops answering (here a proxy that goes silent in front of PostgreSQL)
/// makes every page answer 503 within the dashboard's 5-second deadline, never hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_page_answers_503_in_time_when_the_database_stops_answering() {
    let setup = setup().await;
    let mut text = std::fs::read_to_string(&setup.config).unwrap();
    let proxy = outbox_test_support::proxy::in_front(&mut text).await;
    let config = setup.dir.path().join("through-proxy.toml");
    std::fs::write(&config, text).unwrap();
    let _dashboard = setup.outbox("dashboard", &config);
    setup.started().await;
    proxy.set(outbox_test_support::proxy::Net::Silence);
    let pages = [
        "/".to_owned(),
        "/dead".to_owned(),
        "/lookup?q=x".to_owned(),
        format!("/messages/{}", setup.script_id),
    ];
    for path in pages {
        let started = std::time::Instant::now();
        let request = format!(
            "GET {path} HTTP/1.1\r\nhost: {}\r\nauthorization: Bearer {TOKEN}\r\nconnection: close\r\n\r\n",
            setup.addr
        );
        // `common::http` gives up after 5 s, the dashboard's own deadline: read longer here.
        let exchange = async {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut socket = tokio::net::TcpStream::connect(&setup.addr).await?;
            socket.write_all(request.as_bytes()).await?;
            let mut page = String::new();
            socket.read_to_string(&mut page).await?;
            std::io::Result::Ok(page)
        };
        let page = tokio::time::timeout(Duration::from_secs(20), exchange)
            .await
            .unwrap_or_else(|_| panic!("{path}: no answer within 20 s"))
            .unwrap();
        let took = started.elapsed();
        assert!(page.starts_with("HTTP/1.1 503"), "{path}: {page}");
        assert!(took < Duration::from_secs(8), "{path} took {took:?}");
    }
    proxy.set(outbox_test_support::proxy::Net::Pass);
    setup.drop_table().await;
}

/// The waiting page in Chromium: rows retrying after a 503 with their error and next
/// attempt, leased rows, and rows of a destination no route serves, marked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_waiting_page_shows_why_rows_wait() {
    let setup = setup().await;
    let store = PgOutbox::with_names(
        setup.pool.clone(),
        TableNames::default().outbox(&setup.table).unwrap(),
    );
    let busy = "HTTP 503 Service Unavailable: the ledger is closing its books (Retry-After: 600)";
    let mut messages = Vec::new();
    let mut fates = Vec::new();
    for (destination, fate, n) in [
        ("billing", common::Fate::Retry(busy), 6),
        ("sms", common::Fate::Leased, 2),
        ("ledger", common::Fate::Pending, 3),
    ] {
        for i in 0..n {
            messages.push(
                NewMessage::builder(destination, "invoice.paid")
                    .json(&serde_json::json!({ "invoice": i }))
                    .build()
                    .unwrap(),
            );
            fates.push(fate);
        }
    }
    common::settle(&store, &messages, &fates).await;
    let config = setup.dir.path().join("routed.toml");
    let base = std::fs::read_to_string(&setup.config).unwrap();
    std::fs::write(
        &config,
        format!(
            "{base}\n[routes.billing]\nurl = \"https://billing.example.com/hooks\"\n\n\
             [routes.sms]\nurl = \"https://sms.example.com/hooks\"\n"
        ),
    )
    .unwrap();
    let _dashboard = setup.outbox("dashboard", &config);
    setup.started().await;

    let run = browser(&["waiting", &format!("http://{}", setup.addr), TOKEN]);
    let seen: serde_json::Value = serde_json::from_slice(&run.stdout).unwrap();
    eprintln!("browser saw: {seen}");
    assert_eq!(seen["rows"], 11, "every waiting row, none of the 100 dead");
    assert_eq!(seen["unrouted"], 3, "the ledger rows are marked");
    assert_eq!(seen["retrying"], 6, "the billing rows show their error");
    assert_eq!(
        seen["nextAttempts"], 6,
        "and their next attempt, minutes away"
    );
    setup.drop_table().await;
}

/// In `outbox relay`, the overview shows the relay's heartbeat, publish rate and latency.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_serves_its_rate_and_latency_on_the_dashboard() {
    let setup = setup().await;
    let (url, received) = common::recording_receiver(1..5).await;
    let store = PgOutbox::with_names(
        setup.pool.clone(),
        TableNames::default().outbox(&setup.table).unwrap(),
    );
    let messages: Vec<_> = outbox::testkit::numbered("billing", "invoice.paid", 300);
    let mut tx = setup.pool.begin().await.unwrap();
    store.enqueue_all(&mut tx, &messages).await.unwrap();
    tx.commit().await.unwrap();
    let _relay = setup.relay(&format!(
        "[relay]\npoll_interval = \"100ms\"\n\n[routes.billing]\nurl = \"{url}\"\nallow = [\"127.0.0.1\"]\n"
    ));
    setup.started().await;
    // The receiver counts a delivery before the relay records its completion: wait
    // for the page itself to count all 300.
    let request = format!(
        "GET / HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {TOKEN}\r\nconnection: close\r\n\r\n"
    );
    let (page, billing) = wait_for(
        "the overview to count the 300 published messages",
        Duration::from_secs(60),
        || {
            let (addr, request) = (setup.addr.clone(), request.clone());
            async move {
                let page = common::http(&addr, &request).await;
                let at = page.find("<td>billing</td>")?;
                let row = page[at..][..page[at..].find("</tr>")?].to_owned();
                row.contains("<td class=\"n\">5.0</td>")
                    .then_some((page, row))
            }
        },
    )
    .await;
    assert!(received.lock().unwrap().len() >= 300);
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    assert!(
        page.contains("Relay heartbeat: <span class=\"ok\">"),
        "{page}"
    );
    let cells: Vec<&str> = billing.split("<td class=\"n\">").skip(1).collect();
    let text = |i: usize| cells[i][..cells[i].find("</td>").unwrap()].to_owned();
    let rate: f64 = text(5).parse().unwrap();
    assert!(
        (300.0 / 60.0 - 0.05..=300.0 / 60.0 + 0.05).contains(&rate),
        "300 in the last minute: {billing}"
    );
    assert!(
        text(6).starts_with("≤ ") && text(7).starts_with("≤ "),
        "p50 and p99: {billing}"
    );
    assert!(
        billing.contains("<rect x="),
        "the chart has a bar: {billing}"
    );
    if std::env::var_os("OUTBOX_SCREENSHOTS_DIR").is_some() {
        browser(&["screenshot", &format!("http://{}", setup.addr), TOKEN]);
    }
    setup.drop_table().await;
}
