//! Orders → outbox with diesel → relay → webhook receiver that deduplicates with the
//! diesel inbox. The SQLite story uses diesel's sync connections; the PostgreSQL story
//! enqueues on diesel-async connections. Both roll back some orders on purpose. The
//! relay opens its store from a `diesel+` URL: the one relay store of that database.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use diesel::r2d2::{ConnectionManager, Pool};
use diesel::sql_types::BigInt;
use diesel::{RunQueryDsl, SqliteConnection};
use outbox::diesel::sqlite::{Pragmas, SqliteInbox, SqliteOutbox};
use outbox::http::{HttpSink, HttpSinkConfig};
use outbox::receiver::WebhookReceiver;
use outbox::{AnyStore, NewMessage, Outbox, StoreSettings, StoreStats};

type Error = Box<dyn std::error::Error + Send + Sync>;

/// A demo signing secret (generate your own: 24+ random bytes, base64, `whsec_` prefix).
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const ORDERS: i64 = 12;

/// What the stories end with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    /// Orders committed.
    pub committed: u64,
    /// Orders rolled back (their messages must never be sent).
    pub rolled_back: u64,
    /// Messages the receiver applied, once each.
    pub applied: u64,
    /// Committed orders whose message never took effect.
    pub lost: u64,
    /// Messages of rolled-back orders that reached the receiver.
    pub unexpected: u64,
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "committed={} rolled_back={} applied={} unexpected={} lost={}",
            self.committed, self.rolled_back, self.applied, self.unexpected, self.lost
        )
    }
}

/// Every third order is rolled back after its message was enqueued.
fn rolled_back(order: i64) -> bool {
    order % 3 == 0
}

fn order_message(order: i64) -> Result<NewMessage, Error> {
    Ok(NewMessage::builder("mailer", "order.created")
        .json(&serde_json::json!({ "order": order }))
        .partition_key(format!("order-{order}"))
        .build()?)
}

/// The receiving service: a SQLite database of its own, its diesel inbox.
#[derive(Clone)]
struct Receiver {
    pool: Pool<ConnectionManager<SqliteConnection>>,
    inbox: SqliteInbox,
    verifier: Arc<WebhookReceiver>,
}

async fn receive(
    State(r): State<Receiver>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> StatusCode {
    let webhook = match r.verifier.verify(&headers, &body) {
        Ok(webhook) => webhook,
        Err(error) => return error.status(),
    };
    let Some(order) = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v["order"].as_i64())
    else {
        return StatusCode::UNPROCESSABLE_ENTITY;
    };
    // The inbox record and the side effect commit together, in one diesel transaction.
    let applied = tokio::task::spawn_blocking(move || {
        let mut conn = r.pool.get()?;
        conn.immediate_transaction(|conn| {
            if r.inbox.record(conn, "mailer", &webhook.id)?.is_new() {
                diesel::sql_query("INSERT INTO emails_sent (order_id) VALUES (?1)")
                    .bind::<BigInt, _>(order)
                    .execute(conn)?;
            }
            Ok::<_, Error>(())
        })
    })
    .await;
    match applied {
        Ok(Ok(())) => StatusCode::NO_CONTENT,
        _ => StatusCode::SERVICE_UNAVAILABLE,
    }
}

fn sqlite_pool(path: &std::path::Path) -> Result<Pool<ConnectionManager<SqliteConnection>>, Error> {
    let _ = std::fs::remove_file(path);
    Ok(Pool::builder()
        .max_size(4)
        .connection_customizer(Box::new(Pragmas::default()))
        .build(ConnectionManager::<SqliteConnection>::new(
            path.to_str().ok_or("a UTF-8 path")?,
        ))?)
}

#[derive(diesel::QueryableByName)]
struct OrderId {
    #[diesel(sql_type = BigInt)]
    order_id: i64,
}

/// Starts the receiver on loopback; returns its URL, its pool and the server task.
async fn start_receiver(
    dir: &std::path::Path,
) -> Result<
    (
        String,
        Pool<ConnectionManager<SqliteConnection>>,
        tokio::task::JoinHandle<()>,
    ),
    Error,
> {
    let pool = sqlite_pool(&dir.join("receiver.db"))?;
    let inbox = SqliteInbox::new();
    let (setup, migrating) = (pool.clone(), inbox.clone());
    tokio::task::spawn_blocking(move || {
        let mut conn = setup.get()?;
        migrating.migrate(&mut conn)?;
        diesel::sql_query("CREATE TABLE emails_sent (order_id INTEGER NOT NULL)")
            .execute(&mut conn)?;
        Ok::<_, Error>(())
    })
    .await??;
    let receiver = Receiver {
        pool: pool.clone(),
        inbox,
        verifier: Arc::new(WebhookReceiver::from_secrets([SECRET])?.consumer("mailer")),
    };
    let app = axum::Router::new()
        .route("/webhooks", axum::routing::post(receive))
        .with_state(receiver);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/webhooks", listener.local_addr()?);
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok((url, pool, server))
}

/// The relay's store, opened from `url` (`diesel+sqlite:PATH`, `diesel+postgres://…`).
async fn relay_store(url: String, table: Option<String>) -> Result<AnyStore, Error> {
    let mut settings = StoreSettings::new(url);
    settings.table = table;
    Ok(outbox::Registry::default().connect_store(&settings).await?)
}

/// Runs a relay on `store` until every committed order's message went out, then sums up
/// what the receiver applied against the orders committed.
async fn settle(
    store: AnyStore,
    receiver_url: String,
    receiver_db: Pool<ConnectionManager<SqliteConnection>>,
    committed: Vec<i64>,
) -> Result<Summary, Error> {
    let webhooks = HttpSink::new(
        HttpSinkConfig::new(receiver_url)
            .secret(SECRET)
            .allow("127.0.0.1/32"),
    )?;
    let relay = Outbox::builder_any(store.clone())
        .route("mailer", webhooks)
        .relay(|relay| relay.poll_interval(Duration::from_millis(100)))
        .build()
        .await?;
    let running = tokio::spawn(relay.run(std::future::pending()));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while store.stats().await?.total().published < committed.len() as u64 {
        if tokio::time::Instant::now() > deadline {
            return Err("the relay did not publish every committed order within 30 s".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    running.abort();
    let applied: Vec<i64> = tokio::task::spawn_blocking(move || {
        let rows: Vec<OrderId> =
            diesel::sql_query("SELECT order_id FROM emails_sent").load(&mut receiver_db.get()?)?;
        Ok::<_, Error>(rows.into_iter().map(|r| r.order_id).collect())
    })
    .await??;
    Ok(Summary {
        committed: committed.len() as u64,
        rolled_back: (1..=ORDERS).filter(|o| rolled_back(*o)).count() as u64,
        applied: applied.len() as u64,
        lost: committed.iter().filter(|o| !applied.contains(o)).count() as u64,
        unexpected: applied.iter().filter(|o| !committed.contains(o)).count() as u64,
    })
}

/// The SQLite story, on diesel's sync connections; no server needed.
///
/// # Errors
///
/// Any database, network or configuration failure.
pub async fn run_sqlite(dir: std::path::PathBuf) -> Result<Summary, Error> {
    std::fs::create_dir_all(&dir)?;
    let (url, receiver_db, server) = start_receiver(&dir).await?;

    let path = dir.join("shop.db");
    let shop = sqlite_pool(&path)?;
    let writer = SqliteOutbox::new();
    let committed = tokio::task::spawn_blocking(move || {
        let mut conn = shop.get()?;
        writer.migrate(&mut conn)?;
        diesel::sql_query("CREATE TABLE orders (id INTEGER PRIMARY KEY)").execute(&mut conn)?;
        let mut committed = Vec::new();
        for order in 1..=ORDERS {
            // The order and its message commit together, or neither does.
            let done = conn.immediate_transaction(|conn| {
                diesel::sql_query("INSERT INTO orders (id) VALUES (?1)")
                    .bind::<BigInt, _>(order)
                    .execute(conn)?;
                writer.enqueue(conn, &order_message(order)?)?;
                if rolled_back(order) {
                    return Err::<(), Error>("payment declined".into());
                }
                Ok(())
            });
            if done.is_ok() {
                committed.push(order);
            }
        }
        Ok::<_, Error>(committed)
    })
    .await??;

    let store = relay_store(format!("diesel+sqlite:{}", path.display()), None).await?;
    let summary = settle(store, url, receiver_db, committed).await;
    server.abort();
    summary
}

/// The PostgreSQL story: orders and messages written on diesel-async connections inside
/// `transaction(async |conn| …)`, the table migrated on a diesel connection, the relay
/// on the PostgreSQL store a `diesel+postgres://` URL opens.
///
/// # Errors
///
/// Any database, network or configuration failure; PostgreSQL not reachable.
#[cfg(feature = "workloads")]
pub async fn run_postgres(dir: std::path::PathBuf) -> Result<Summary, Error> {
    use diesel_async::{AsyncConnection, AsyncPgConnection};
    use outbox::diesel::postgres::PgOutbox;

    std::fs::create_dir_all(&dir)?;
    let (url, receiver_db, server) = start_receiver(&dir).await?;

    let database = crate::support::postgres_url();
    let suffix = format!("{:08x}", fastrand::u32(..));
    let (orders, table) = (
        format!("diesel_orders_{suffix}"),
        format!("diesel_outbox_{suffix}"),
    );
    let outbox = PgOutbox::with_names(outbox::diesel::TableNames::default().outbox(&table)?);
    tokio::task::spawn_blocking({
        let (database, outbox) = (database.clone(), outbox.clone());
        move || {
            use diesel::Connection;
            let mut conn = diesel::PgConnection::establish(&database).map_err(|e| {
                format!("PostgreSQL is not reachable ({e}); start it with scripts/services.sh")
            })?;
            outbox.migrate(&mut conn)?;
            Ok::<_, Error>(())
        }
    })
    .await??;

    let mut conn = AsyncPgConnection::establish(&database).await?;
    let create = diesel::sql_query(format!("CREATE TABLE {orders} (id bigint PRIMARY KEY)"));
    diesel_async::RunQueryDsl::execute(create, &mut conn).await?;
    let mut committed = Vec::new();
    for order in 1..=ORDERS {
        let insert = format!("INSERT INTO {orders} (id) VALUES ($1)");
        let outbox = &outbox;
        let done = conn
            .transaction::<_, Error, _>(async |conn| {
                let insert = diesel::sql_query(insert).bind::<BigInt, _>(order);
                diesel_async::RunQueryDsl::execute(insert, conn).await?;
                outbox.enqueue_async(conn, &order_message(order)?).await?;
                if rolled_back(order) {
                    return Err("payment declined".into());
                }
                Ok(())
            })
            .await;
        if done.is_ok() {
            committed.push(order);
        }
    }

    let store = relay_store(format!("diesel+{database}"), Some(table.clone())).await?;
    let summary = settle(store, url, receiver_db, committed).await;
    server.abort();
    let drop = diesel::sql_query(format!("DROP TABLE {orders}, {table}, {table}_keys"));
    diesel_async::RunQueryDsl::execute(drop, &mut conn).await?;
    summary
}
