//! End to end on PostgreSQL: enqueue in a transaction → relay → signed HTTP delivery →
//! a receiver that verifies and deduplicates with the inbox inside its own transaction.
//! Exactly one side effect per committed message, although the relay delivers some
//! messages more than once.

mod common;

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::{FromRef, State};
use axum::http::StatusCode;
use axum::routing::post;
use common::SECRET;
use outbox_engine::testkit::publish;
use outbox_engine::{ClaimRequest, NewMessage, Relay, RetryPolicy, Store, StoreStats};
use outbox_receiver::{WebhookReceiver, WebhookRequest};
use outbox_sink_http::HttpSink;
use outbox_sqlx::TableNames;
use outbox_sqlx::postgres::{PgInbox, PgOutbox};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use tokio::net::TcpListener;

const URL_VAR: &str = "OUTBOX_TEST_POSTGRES_URL";
const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";
const DESTINATION: &str = "billing-hooks";

async fn pool() -> PgPool {
    let url = std::env::var(URL_VAR).unwrap_or_else(|_| DEFAULT_URL.to_owned());
    match PgPoolOptions::new()
        .max_connections(8)
        .acquire_timeout(Duration::from_secs(10))
        .connect(&url)
        .await
    {
        Ok(pool) => pool,
        Err(e) => panic!(
            "PostgreSQL is not reachable at {url} ({e}).\n\
             This test needs a real PostgreSQL: run `scripts/services.sh` (it installs and starts it),\n\
             or point {URL_VAR} at one. Use `scripts/test.sh` to start services and run everything."
        ),
    }
}

fn fresh(prefix: &str) -> String {
    format!("{prefix}_{:016x}", fastrand::u64(..))
}

/// The receiving service: its own transaction records the delivery in the inbox and
/// applies the side effect (a row in `effects`) only for a new delivery.
#[derive(Clone)]
struct Billing {
    pool: PgPool,
    receiver: WebhookReceiver,
    inbox: PgInbox,
    effects: String,
    /// Webhook ids whose first delivery commits and then answers 500 anyway.
    fail_after_commit: Arc<Mutex<HashSet<String>>>,
    requests: Arc<AtomicUsize>,
    duplicates: Arc<AtomicUsize>,
}

impl FromRef<Billing> for WebhookReceiver {
    fn from_ref(app: &Billing) -> Self {
        app.receiver.clone()
    }
}

async fn invoice_paid(State(app): State<Billing>, request: WebhookRequest) -> StatusCode {
    app.requests.fetch_add(1, Ordering::SeqCst);
    let id = request.webhook.id.clone();
    let Ok(mut tx) = app.pool.begin().await else {
        return StatusCode::SERVICE_UNAVAILABLE;
    };
    let received = match app
        .receiver
        .record(&app.inbox, &mut tx, request.webhook)
        .await
    {
        Ok(received) => received,
        Err(e) => return e.status(),
    };
    if received.is_new() {
        let insert = format!(
            "INSERT INTO {} (webhook_id, body) VALUES ($1, $2)",
            app.effects
        );
        let body = String::from_utf8_lossy(&request.body).into_owned();
        if sqlx::query(&insert)
            .bind(&id)
            .bind(body)
            .execute(&mut *tx)
            .await
            .is_err()
        {
            return StatusCode::SERVICE_UNAVAILABLE;
        }
    } else {
        app.duplicates.fetch_add(1, Ordering::SeqCst);
    }
    if tx.commit().await.is_err() {
        return StatusCode::SERVICE_UNAVAILABLE;
    }
    // The side effect is committed, but the answer is lost: the relay must redeliver.
    if app.fail_after_commit.lock().unwrap().remove(&id) {
        return StatusCode::INTERNAL_SERVER_ERROR;
    }
    StatusCode::NO_CONTENT
}

async fn start_billing(app: Billing) -> SocketAddr {
    let router = Router::new()
        .route("/hooks/invoice", post(invoice_paid))
        .with_state(app);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    addr
}

fn invoice(n: u64) -> NewMessage {
    NewMessage::builder(DESTINATION, "invoice.paid")
        .json(&serde_json::json!({ "invoice": n, "amount_cents": 1999 + n }))
        .tenant_id("acme")
        .build()
        .unwrap()
}

async fn enqueue(outbox: &PgOutbox, messages: &[NewMessage], commit: bool) {
    let mut tx = outbox.pool().begin().await.unwrap();
    outbox.enqueue_all(&mut tx, messages).await.unwrap();
    if commit {
        tx.commit().await.unwrap();
    } else {
        tx.rollback().await.unwrap();
    }
}

async fn published(outbox: &PgOutbox) -> u64 {
    let stats = outbox.stats().await.unwrap();
    stats.destination(DESTINATION).map_or(0, |d| d.published)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_one_side_effect_per_committed_message_despite_redeliveries() {
    let pool = pool().await;
    let inbox_table = fresh("http_inbox");
    let names = TableNames::default()
        .outbox(&fresh("http_outbox"))
        .unwrap()
        .inbox(&inbox_table)
        .unwrap();
    let outbox = PgOutbox::with_names(pool.clone(), names.clone());
    outbox.migrate().await.unwrap();
    let inbox = PgInbox::with_names(names);
    inbox.migrate(&pool).await.unwrap();
    let effects = fresh("http_effects");
    sqlx::query(&format!(
        "CREATE TABLE {effects} (webhook_id text NOT NULL, body text NOT NULL)"
    ))
    .execute(&pool)
    .await
    .unwrap();

    let app = Billing {
        pool: pool.clone(),
        receiver: WebhookReceiver::from_secrets([SECRET])
            .unwrap()
            .consumer("billing"),
        inbox,
        effects: effects.clone(),
        fail_after_commit: Arc::default(),
        requests: Arc::default(),
        duplicates: Arc::default(),
    };
    let addr = start_billing(app.clone()).await;
    let sink: HttpSink = common::sink(format!("http://{addr}/hooks/invoice"), |c| c.secret(SECRET));

    // 20 messages commit; 5 roll back and must never be delivered.
    let committed: Vec<NewMessage> = (0..20).map(invoice).collect();
    let rolled_back: Vec<NewMessage> = (100..105).map(invoice).collect();
    enqueue(&outbox, &committed, true).await;
    enqueue(&outbox, &rolled_back, false).await;
    // Every fourth message's first answer is lost after its side effect committed.
    app.fail_after_commit.lock().unwrap().extend(
        committed
            .iter()
            .step_by(4)
            .map(|m| m.idempotency_key().to_owned()),
    );

    let relay = Relay::builder(outbox.clone())
        .route(DESTINATION, sink.clone())
        .batch_size(7)
        .retry(RetryPolicy::exponential(
            Duration::from_millis(50),
            Duration::from_millis(100),
        ))
        .build()
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while published(&outbox).await < 20 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not all published in time"
        );
        relay.drain().await.unwrap();
        tokio::time::sleep(Duration::from_millis(60)).await;
    }
    assert!(
        app.fail_after_commit.lock().unwrap().is_empty(),
        "every lost answer was retried"
    );

    // A relay that claims, delivers and dies before marking anything: after its lease
    // lapses, another relay delivers the same rows again.
    let crashed: Vec<NewMessage> = (200..205).map(invoice).collect();
    enqueue(&outbox, &crashed, true).await;
    let claim = outbox
        .claim(&ClaimRequest::new(
            "relay-that-dies",
            10,
            Duration::from_millis(300),
        ))
        .await
        .unwrap();
    assert_eq!(claim.messages.len(), 5);
    let outcomes = publish(&sink, &claim.messages).await;
    assert!(outcomes.iter().all(|o| o.is_published()));
    drop(claim); // no completion: the relay "crashed"
    tokio::time::sleep(Duration::from_millis(400)).await;
    relay.drain().await.unwrap();
    assert_eq!(published(&outbox).await, 25);

    // Counted on the receiver's database.
    let rows: Vec<(String, String)> =
        sqlx::query_as(&format!("SELECT webhook_id, body FROM {effects}"))
            .fetch_all(&pool)
            .await
            .unwrap();
    let mut per_key: HashMap<&str, usize> = HashMap::new();
    for (key, _) in &rows {
        *per_key.entry(key.as_str()).or_default() += 1;
    }
    let expected: HashSet<&str> = committed
        .iter()
        .chain(&crashed)
        .map(NewMessage::idempotency_key)
        .collect();
    let unexpected: Vec<_> = per_key.keys().filter(|k| !expected.contains(*k)).collect();
    let lost: Vec<_> = expected
        .iter()
        .filter(|k| !per_key.contains_key(*k))
        .collect();
    let duplicated: Vec<_> = per_key.iter().filter(|(_, n)| **n > 1).collect();
    eprintln!(
        "requests {}, duplicates absorbed {}, effects {}, lost {}, unexpected {}, duplicated {}",
        app.requests.load(Ordering::SeqCst),
        app.duplicates.load(Ordering::SeqCst),
        rows.len(),
        lost.len(),
        unexpected.len(),
        duplicated.len()
    );
    assert!(lost.is_empty(), "lost: {lost:?}");
    assert!(
        unexpected.is_empty(),
        "unexpected (rolled back?): {unexpected:?}"
    );
    assert!(
        duplicated.is_empty(),
        "duplicated side effects: {duplicated:?}"
    );
    assert_eq!(rows.len(), 25);
    // The redeliveries really happened: 5 lost answers + 5 re-sent after the crash.
    assert_eq!(app.duplicates.load(Ordering::SeqCst), 10);
    assert_eq!(app.requests.load(Ordering::SeqCst), 35);
    // Bodies arrived intact.
    for (key, body) in &rows {
        let sent = committed
            .iter()
            .chain(&crashed)
            .find(|m| m.idempotency_key() == key)
            .unwrap();
        assert_eq!(body.as_bytes(), sent.payload());
    }
    let inbox_rows: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM {inbox_table}"))
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(inbox_rows, 25);
}
