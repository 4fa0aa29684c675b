//! Orders → outbox (SQLite) → relay → signed webhook → verifying, deduplicating receiver.

use std::collections::HashSet;
use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use outbox::http::{HttpSink, HttpSinkConfig};
use outbox::receiver::WebhookReceiver;
use outbox::sqlite::{SqliteInbox, SqliteOutbox};
use outbox::{DeadLetterFilter, DeadLetters, NewMessage, Outbox, RetryPolicy, StoreStats};
use sqlx::SqlitePool;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};

/// A demo signing secret (generate your own: 24+ random bytes, base64, `whsec_` prefix).
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const ORDERS: i64 = 10;
/// The order whose first delivery fails with a 503 before the receiver commits.
const FLAKY_ORDER: i64 = 3;
/// The order whose first acknowledgement is lost after the receiver committed.
const LOST_ACK_ORDER: i64 = 5;
/// The order the receiver refuses for good (422).
const REFUSED_ORDER: i64 = 7;

/// What the receiver saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    /// Messages whose side effect the receiver applied.
    pub published: u64,
    /// Messages dead-lettered.
    pub dead: u64,
    /// Deliveries the inbox recognised as copies and ignored.
    pub duplicates_ignored: u64,
    /// Committed orders whose message neither took effect nor was dead-lettered.
    pub lost: u64,
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "published={} dead={} duplicates_ignored={} lost={}",
            self.published, self.dead, self.duplicates_ignored, self.lost
        )
    }
}

type Error = Box<dyn std::error::Error + Send + Sync>;

async fn sqlite(path: PathBuf) -> Result<SqlitePool, Error> {
    let _ = std::fs::remove_file(&path);
    let options = SqliteConnectOptions::new()
        .filename(&path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_secs(10));
    Ok(SqlitePoolOptions::new()
        .max_connections(4)
        .connect_with(options)
        .await?)
}

/// The receiving service: its own database, its own inbox.
#[derive(Clone)]
struct Receiver {
    pool: SqlitePool,
    inbox: SqliteInbox,
    verifier: WebhookReceiver,
    failed_once: Arc<Mutex<HashSet<i64>>>,
    duplicates: Arc<Mutex<u64>>,
}

async fn handle(
    State(r): State<Receiver>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> StatusCode {
    let Ok(event) = serde_json::from_slice::<serde_json::Value>(&body) else {
        return StatusCode::BAD_REQUEST;
    };
    let order = event["order"].as_i64().unwrap_or_default();
    if order == REFUSED_ORDER {
        println!("receiver: order {order} refused for good (422 unknown customer)");
        return StatusCode::UNPROCESSABLE_ENTITY; // retrying cannot help
    }
    if order == FLAKY_ORDER && r.failed_once.lock().expect("lock").insert(-order) {
        println!("receiver: order {order} failed before committing (503); the relay retries");
        return StatusCode::SERVICE_UNAVAILABLE;
    }
    let Ok(mut tx) = r.pool.begin().await else {
        return StatusCode::SERVICE_UNAVAILABLE;
    };
    let received = match r.verifier.receive(&r.inbox, &mut tx, &headers, &body).await {
        Ok(received) => received,
        Err(error) => return error.status(),
    };
    if received.is_new() {
        println!("receiver: order {order} verified, recorded in the inbox, email sent");
        let applied = sqlx::query("INSERT INTO emails_sent (order_id) VALUES (?)")
            .bind(order)
            .execute(&mut *tx)
            .await;
        if applied.is_err() {
            return StatusCode::SERVICE_UNAVAILABLE;
        }
    } else {
        println!("receiver: order {order} delivered again; the inbox knows it, ignored");
        *r.duplicates.lock().expect("lock") += 1;
    }
    if tx.commit().await.is_err() {
        return StatusCode::SERVICE_UNAVAILABLE;
    }
    if order == LOST_ACK_ORDER && r.failed_once.lock().expect("lock").insert(order) {
        println!("receiver: order {order} committed, but its answer is lost (500)");
        return StatusCode::INTERNAL_SERVER_ERROR;
    }
    StatusCode::NO_CONTENT
}

/// Runs the whole story in `dir` and returns what the receiver saw.
///
/// # Errors
///
/// Any database, network or configuration failure.
pub async fn run(dir: PathBuf) -> Result<Summary, Error> {
    std::fs::create_dir_all(&dir)?;

    // The receiving service, on loopback.
    let receiver_db = sqlite(dir.join("receiver.db")).await?;
    let inbox = SqliteInbox::new();
    inbox.migrate(&receiver_db).await?;
    sqlx::query("CREATE TABLE emails_sent (order_id INTEGER NOT NULL)")
        .execute(&receiver_db)
        .await?;
    let receiver = Receiver {
        pool: receiver_db.clone(),
        inbox,
        verifier: WebhookReceiver::from_secrets([SECRET])?.consumer("mailer"),
        failed_once: Arc::default(),
        duplicates: Arc::default(),
    };
    let app = axum::Router::new()
        .route("/webhooks", axum::routing::post(handle))
        .with_state(receiver.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/webhooks", listener.local_addr()?);
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    // The order service: business row and outbox row in one transaction.
    let shop_db = sqlite(dir.join("shop.db")).await?;
    sqlx::query("CREATE TABLE orders (id INTEGER PRIMARY KEY, total_cents INTEGER NOT NULL)")
        .execute(&shop_db)
        .await?;
    let outbox = SqliteOutbox::new(shop_db.clone());
    outbox.migrate().await?;

    // The relay: signed webhooks; loopback is allowed explicitly (the SSRF guard refuses
    // private addresses by default).
    let webhooks = HttpSink::new(
        HttpSinkConfig::new(url)
            .secret(SECRET)
            .allow("127.0.0.1/32"),
    )?;
    let relay = Outbox::builder(outbox.clone())
        .route("mailer", webhooks)
        .relay(|relay| {
            relay
                .poll_interval(Duration::from_millis(200))
                .retry(RetryPolicy::exponential(
                    Duration::from_millis(50),
                    Duration::from_millis(200),
                ))
        })
        .build()
        .await?;
    let running = tokio::spawn(relay.run(std::future::pending()));

    for order in 1..=ORDERS {
        let mut tx = shop_db.begin().await?;
        sqlx::query("INSERT INTO orders (id, total_cents) VALUES (?, ?)")
            .bind(order)
            .bind(order * 1_000)
            .execute(&mut *tx)
            .await?;
        let message = NewMessage::builder("mailer", "order.created")
            .json(&serde_json::json!({ "order": order, "total_cents": order * 1_000 }))
            .partition_key(format!("order-{order}"))
            .build()?;
        outbox.enqueue(&mut tx, &message).await?;
        tx.commit().await?;
        outbox.notify().await?; // after commit: the relay claims now, not at its next poll
        println!("shop: order {order} committed with its outbox row, one SQLite transaction");
    }

    // Wait until every committed order is published or dead.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let total = outbox.stats().await?.total();
        if total.published + total.dead == ORDERS as u64 {
            break;
        }
        if tokio::time::Instant::now() > deadline {
            return Err(format!("not finished after 30 s: {total:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    running.abort();
    server.abort();

    let applied: Vec<i64> = sqlx::query_scalar("SELECT DISTINCT order_id FROM emails_sent")
        .fetch_all(&receiver_db)
        .await?;
    let effects: i64 = sqlx::query_scalar("SELECT count(*) FROM emails_sent")
        .fetch_one(&receiver_db)
        .await?;
    let committed: Vec<i64> = sqlx::query_scalar("SELECT id FROM orders")
        .fetch_all(&shop_db)
        .await?;
    let dead = outbox.list_dead(&DeadLetterFilter::all(), 100).await?;
    let mut dead_orders = Vec::new();
    for letter in &dead {
        let payload = serde_json::from_slice::<serde_json::Value>(&letter.message.payload)?;
        let order = payload["order"].as_i64().unwrap_or_default();
        println!("relay: order {order} dead-lettered ({})", letter.reason);
        dead_orders.push(order);
    }
    if effects != applied.len() as i64 {
        return Err(format!(
            "{effects} side effects for {} orders: the inbox let a copy through",
            applied.len()
        )
        .into());
    }
    let lost = committed
        .iter()
        .filter(|o| !applied.contains(o) && !dead_orders.contains(o))
        .count() as u64;
    let duplicates_ignored = *receiver.duplicates.lock().expect("lock");
    Ok(Summary {
        published: applied.len() as u64,
        dead: dead.len() as u64,
        duplicates_ignored,
        lost,
    })
}
