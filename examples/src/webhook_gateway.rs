//! Webhook gateway: an HTTP API accepts events and answers 2xx only once the event and
//! its deliveries are committed; a relay fans each event out to the subscribed endpoints
//! as signed webhooks; a broken endpoint's deliveries dead-letter and are replayed once it
//! is fixed.
//!
//! The gateway keeps events, subscriptions and the outbox in PostgreSQL. `POST /v1/events`
//! looks up who subscribed to the event type and, in **one transaction**, records the
//! event and writes one outbox row per subscribed endpoint ([`fan_out`]). Only after the
//! commit does it answer `202 Accepted`: a client that got a 2xx can be sure every
//! delivery will happen, and a client that got nothing retries with the same
//! `idempotency-key` and is told "already accepted" instead of creating a second event.
//!
//! Three customers subscribed, each with its own endpoint and signing secret. Every
//! endpoint verifies the Standard Webhooks signature with [`WebhookReceiver`] and
//! deduplicates with a [`PgInbox`] inside its own transaction:
//!
//! - **acme** is healthy;
//! - **globex** is down for its first three requests (503). Its circuit breaker opens
//!   after three failures in a row and keeps the relay off globex for the cool-down
//!   instead of hammering it; the first request after that goes through;
//! - **initech** deployed its receiver with a stale signing secret, so it refuses every
//!   delivery with 401. A 4xx is permanent: those deliveries are dead-lettered at once,
//!   and acme and globex are not held up. Initech fixes its secret, and the operator
//!   replays initech's dead letters — here with [`DeadLetters::replay_dead`], which is
//!   what `outbox dead replay --destination webhooks/initech` runs.

use std::collections::HashSet;
use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use outbox::TableNames;
use outbox::http::{HttpSink, HttpSinkConfig, fan_out};
use outbox::layers::{CircuitConfig, SinkExt};
use outbox::postgres::{PgInbox, PgNotifier, PgOutbox};
use outbox::receiver::WebhookReceiver;
use outbox::{DeadLetterFilter, DeadLetters, Relay, RetryPolicy, deterministic_key};
use serde_json::json;
use sqlx::PgPool;
use uuid::Uuid;

use crate::support::{self, Error, LOOPBACK};

/// A subscriber's endpoint behind its circuit breaker.
type Circuit = outbox::layers::CircuitBreaker<HttpSink>;

/// How long globex's circuit stays open after three failures in a row.
pub const GLOBEX_COOL_DOWN: Duration = Duration::from_secs(1);
/// The destination whose deliveries dead-letter and are replayed.
pub const BROKEN_DESTINATION: &str = "webhooks/initech";

const ACME_SECRET: &str = "whsec_vxVzeKsUm7Og2xNA9w3XW7Uqf7H2KgkA";
const GLOBEX_SECRET: &str = "whsec_QiJDyCE9mliYf3aUQZhopP5LD0HZu6iv";
const INITECH_SECRET: &str = "whsec_CnyFsHK84I91A9FB1fi6ABg7a6IPmCzV";
/// What initech's receiver was deployed with by mistake.
const INITECH_STALE_SECRET: &str = "whsec_jUDXSCjgO/b3BwOxfVfhG6vIvKcoeBJQ";

/// The event types the gateway offers.
const EVENT_TYPES: &[&str] = &["invoice.paid", "customer.created"];
/// Who subscribed to what.
const SUBSCRIPTIONS: &[(&str, &str)] = &[
    ("acme", "invoice.paid"),
    ("acme", "customer.created"),
    ("globex", "invoice.paid"),
    ("initech", "invoice.paid"),
    ("initech", "customer.created"),
];
/// Event ids are UUIDv5(namespace, tenant, the client's idempotency key).
const EVENT_NAMESPACE: Uuid = Uuid::from_u128(0x7765_6268_6f6f_6b2d_6761_7465_7761_7921);
const TENANT: &str = "shopco";

/// How the dead letters are replayed after the endpoint was fixed.
#[derive(Debug, Clone)]
pub enum Replay {
    /// In process, with [`DeadLetters::replay_dead`].
    Api,
    /// With this `outbox` CLI binary: `outbox --store … --table … dead replay
    /// --destination webhooks/initech` (first with `--dry-run`).
    Cli(PathBuf),
}

/// What happened, counted from what the API answered and the endpoints applied.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    /// Events the API accepted (202).
    pub accepted: u64,
    /// Retried POSTs the API recognised by their idempotency key (200, nothing enqueued).
    pub retried_posts: u64,
    /// Requests the API refused (4xx, nothing enqueued).
    pub rejected: u64,
    /// Accepted events whose outbox rows were already committed when the 2xx arrived.
    pub committed_before_ack: u64,
    /// Outbox rows: one per (event, subscribed endpoint).
    pub deliveries: u64,
    /// Deliveries dead-lettered before the fix.
    pub dead: u64,
    /// Dead letters replayed.
    pub replayed: u64,
    /// Distinct (endpoint, event) side effects applied by the endpoints.
    pub delivered: u64,
    /// Deliveries an endpoint never applied.
    pub lost: u64,
    /// Deliveries the endpoints' inboxes recognised as copies and ignored.
    pub duplicates_ignored: u64,
    /// How long globex got no request after its last failure: its circuit's cool-down.
    pub globex_quiet: Duration,
    /// What the CLI printed, in [`Replay::Cli`] mode.
    pub cli_output: Vec<String>,
}

impl Summary {
    /// Whether globex's circuit opened: no request for at least the cool-down after the
    /// third failure (retries alone would have come back within a few hundred ms).
    pub fn circuit_opened(&self) -> bool {
        self.globex_quiet >= GLOBEX_COOL_DOWN
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "accepted={} retried_posts={} rejected={} committed_before_ack={} deliveries={} dead={} replayed={} delivered={} circuit_opened={} lost={}",
            self.accepted,
            self.retried_posts,
            self.rejected,
            self.committed_before_ack,
            self.deliveries,
            self.dead,
            self.replayed,
            self.delivered,
            self.circuit_opened(),
            self.lost
        )
    }
}

// ---------------------------------------------------------------------------------------
// The gateway API.
// ---------------------------------------------------------------------------------------

#[derive(Clone)]
struct Gateway {
    pool: PgPool,
    outbox: PgOutbox,
    notifier: PgNotifier,
    events: String,
    subscriptions: String,
}

fn answer(status: StatusCode, body: serde_json::Value) -> Response {
    (status, axum::Json(body)).into_response()
}

async fn post_event(
    State(gateway): State<Gateway>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    match gateway.accept(&headers, &body).await {
        Ok(response) => response,
        // Nothing was committed: the client must retry.
        Err(error) => answer(
            StatusCode::SERVICE_UNAVAILABLE,
            json!({ "error": error.to_string() }),
        ),
    }
}

impl Gateway {
    async fn accept(&self, headers: &HeaderMap, body: &[u8]) -> Result<Response, Error> {
        let Some(client_key) = headers.get("idempotency-key").and_then(|v| v.to_str().ok()) else {
            return Ok(answer(
                StatusCode::BAD_REQUEST,
                json!({ "error": "idempotency-key header required" }),
            ));
        };
        let event: serde_json::Value = match serde_json::from_slice(body) {
            Ok(event) => event,
            Err(e) => {
                return Ok(answer(
                    StatusCode::BAD_REQUEST,
                    json!({ "error": e.to_string() }),
                ));
            }
        };
        let kind = event["type"].as_str().unwrap_or_default();
        if !EVENT_TYPES.contains(&kind) {
            return Ok(answer(
                StatusCode::UNPROCESSABLE_ENTITY,
                json!({ "error": format!("unknown event type {kind:?}") }),
            ));
        }
        let event_id = deterministic_key(EVENT_NAMESPACE, &[TENANT, client_key]).to_string();

        let mut tx = self.pool.begin().await?;
        let endpoints: Vec<String> = sqlx::query_scalar(&format!(
            "SELECT endpoint FROM {} WHERE event_type = $1 ORDER BY endpoint",
            self.subscriptions
        ))
        .bind(kind)
        .fetch_all(&mut *tx)
        .await?;
        let inserted = sqlx::query(&format!(
            "INSERT INTO {} (tenant, client_key, event_id, event_type, deliveries) VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (tenant, client_key) DO NOTHING",
            self.events
        ))
        .bind(TENANT)
        .bind(client_key)
        .bind(&event_id)
        .bind(kind)
        .bind(endpoints.len() as i32)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if inserted == 0 {
            // A retry of a request we already committed: the same answer, nothing new.
            tx.rollback().await?;
            let deliveries: i32 = sqlx::query_scalar(&format!(
                "SELECT deliveries FROM {} WHERE tenant = $1 AND client_key = $2",
                self.events
            ))
            .bind(TENANT)
            .bind(client_key)
            .fetch_one(&self.pool)
            .await?;
            return Ok(answer(
                StatusCode::OK,
                json!({ "event_id": event_id, "deliveries": deliveries, "duplicate": true }),
            ));
        }

        // One row per subscribed endpoint, all sharing the event id as their idempotency
        // key (it becomes the signed `webhook-id` endpoints deduplicate on). Each row is
        // delivered, retried and dead-lettered on its own.
        let payload = json!({ "type": kind, "id": event_id, "data": event["data"] });
        let destinations = endpoints.iter().map(|e| format!("webhooks/{e}"));
        let rows = fan_out(destinations, kind, |m| {
            m.json(&payload)
                .tenant_id(TENANT)
                .idempotency_key(event_id.clone())
        })?;
        self.outbox.enqueue_all(&mut tx, &rows).await?;
        tx.commit().await?;
        // Only now may the client hear "accepted". Then wake the relays (in this process
        // or any other) instead of leaving the rows to their next poll.
        self.notifier.notify();
        Ok(answer(
            StatusCode::ACCEPTED,
            json!({ "event_id": event_id, "deliveries": rows.len() }),
        ))
    }
}

// ---------------------------------------------------------------------------------------
// The subscribed endpoints (the customers' servers).
// ---------------------------------------------------------------------------------------

#[derive(Clone)]
struct Endpoint {
    name: &'static str,
    pool: PgPool,
    inbox: PgInbox,
    received: String,
    receiver: Arc<RwLock<WebhookReceiver>>,
    /// Requests still to refuse with 503 (the endpoint is down).
    outage: Arc<AtomicU32>,
    /// Arrival time and answer of every request.
    log: Arc<Mutex<Vec<(Instant, StatusCode)>>>,
    duplicates: Arc<AtomicU64>,
}

async fn receive_webhook(
    State(endpoint): State<Endpoint>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> (StatusCode, String) {
    let arrived = Instant::now();
    let (status, why) = match endpoint.handle(&headers, &body).await {
        Ok(status) => (status, String::new()),
        Err((status, why)) => (status, why),
    };
    endpoint.log.lock().expect("log").push((arrived, status));
    (status, why)
}

impl Endpoint {
    fn new(
        name: &'static str,
        pool: &PgPool,
        inbox: &PgInbox,
        received: &str,
        secret: &str,
    ) -> Result<Self, Error> {
        Ok(Self {
            name,
            pool: pool.clone(),
            inbox: inbox.clone(),
            received: received.to_owned(),
            receiver: Arc::new(RwLock::new(
                WebhookReceiver::from_secrets([secret])?.consumer(name),
            )),
            outage: Arc::default(),
            log: Arc::default(),
            duplicates: Arc::default(),
        })
    }

    /// The answer to one delivery; an error carries the reason the sender gets to see.
    async fn handle(
        &self,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Result<StatusCode, (StatusCode, String)> {
        let unavailable = |what: &str| (StatusCode::SERVICE_UNAVAILABLE, what.to_owned());
        let down = self
            .outage
            .fetch_update(AtomicOrdering::SeqCst, AtomicOrdering::SeqCst, |n| {
                n.checked_sub(1)
            });
        if down.is_ok() {
            return Err(unavailable("down for maintenance"));
        }
        let receiver = self.receiver.read().expect("receiver").clone();
        // Verify before touching the database: unsigned requests never reach the inbox.
        let webhook = receiver
            .verify(headers, body)
            .map_err(|e| (e.status(), e.to_string()))?; // 401: permanent for the sender
        let event_id = webhook.id.clone();
        let mut tx = self
            .pool
            .begin()
            .await
            .map_err(|_| unavailable("database unavailable"))?;
        let received = receiver
            .record(&self.inbox, &mut tx, webhook)
            .await
            .map_err(|e| (e.status(), e.to_string()))?;
        if received.is_new() {
            let kind = serde_json::from_slice::<serde_json::Value>(body)
                .ok()
                .and_then(|v| v["type"].as_str().map(str::to_owned))
                .unwrap_or_default();
            let applied = sqlx::query(&format!(
                "INSERT INTO {} (endpoint, event_id, event_type) VALUES ($1, $2, $3)",
                self.received
            ))
            .bind(self.name)
            .bind(&event_id)
            .bind(kind)
            .execute(&mut *tx)
            .await;
            applied.map_err(|_| unavailable("database unavailable"))?;
        } else {
            self.duplicates.fetch_add(1, AtomicOrdering::SeqCst);
        }
        tx.commit()
            .await
            .map_err(|_| unavailable("database unavailable"))?;
        Ok(StatusCode::NO_CONTENT)
    }
}

// ---------------------------------------------------------------------------------------
// The story.
// ---------------------------------------------------------------------------------------

struct Names {
    outbox: String,
    inbox: String,
    events: String,
    subscriptions: String,
    received: String,
}

/// Runs the whole story against the PostgreSQL of `scripts/services.sh`, replaying the
/// dead letters as `replay` says.
///
/// # Errors
///
/// PostgreSQL is missing, the CLI failed, or any database, network or configuration
/// failure.
pub async fn run(replay: Replay) -> Result<Summary, Error> {
    let pool = support::postgres().await?;
    let names = Names {
        outbox: support::fresh("gateway_outbox"),
        inbox: support::fresh("gateway_inbox"),
        events: support::fresh("gateway_events"),
        subscriptions: support::fresh("gateway_subscriptions"),
        received: support::fresh("gateway_received"),
    };
    let result = story(&pool, &names, replay).await;
    // Clean up whatever happened; the story's own error comes first.
    let cleaned = async {
        support::drop_outbox(&pool, &names.outbox).await?;
        support::drop_inbox(&pool, &names.inbox).await?;
        support::drop_tables(
            &pool,
            &[&names.events, &names.subscriptions, &names.received],
        )
        .await
    }
    .await;
    let summary = result?;
    cleaned?;
    Ok(summary)
}

async fn story(pool: &PgPool, names: &Names, replay: Replay) -> Result<Summary, Error> {
    // The gateway's database.
    let outbox = PgOutbox::with_names(pool.clone(), TableNames::default().outbox(&names.outbox)?);
    outbox.migrate().await?;
    for ddl in [
        format!(
            "CREATE TABLE {} (tenant text, client_key text, event_id text NOT NULL, event_type text NOT NULL, \
             deliveries int NOT NULL, PRIMARY KEY (tenant, client_key))",
            names.events
        ),
        format!(
            "CREATE TABLE {} (endpoint text NOT NULL, event_type text NOT NULL)",
            names.subscriptions
        ),
        // The endpoints' side effects (each customer would have its own database).
        format!(
            "CREATE TABLE {} (endpoint text NOT NULL, event_id text NOT NULL, event_type text NOT NULL)",
            names.received
        ),
    ] {
        sqlx::query(&ddl).execute(pool).await?;
    }
    for (endpoint, kind) in SUBSCRIPTIONS {
        sqlx::query(&format!(
            "INSERT INTO {} (endpoint, event_type) VALUES ($1, $2)",
            names.subscriptions
        ))
        .bind(endpoint)
        .bind(kind)
        .execute(pool)
        .await?;
    }

    // The customers' endpoints.
    let inbox = PgInbox::with_names(TableNames::default().inbox(&names.inbox)?);
    inbox.migrate(pool).await?;
    let acme = Endpoint::new("acme", pool, &inbox, &names.received, ACME_SECRET)?;
    let globex = Endpoint::new("globex", pool, &inbox, &names.received, GLOBEX_SECRET)?;
    globex.outage.store(3, AtomicOrdering::SeqCst);
    let initech = Endpoint::new(
        "initech",
        pool,
        &inbox,
        &names.received,
        INITECH_STALE_SECRET,
    )?;
    let mut servers = Vec::new();
    let mut urls = Vec::new();
    for endpoint in [&acme, &globex, &initech] {
        let app = axum::Router::new()
            .route("/hooks", axum::routing::post(receive_webhook))
            .with_state(endpoint.clone());
        let (base, server) = support::serve(app).await?;
        urls.push(format!("{base}/hooks"));
        servers.push(server);
    }

    // The relay: one signed endpoint per subscriber, each with its own circuit breaker.
    let endpoint =
        |url: &str, secret: &str| HttpSinkConfig::new(url).secret(secret).allow(LOOPBACK);
    let acme_sink = Arc::new(
        HttpSink::new(endpoint(&urls[0], ACME_SECRET))?
            .circuit_breaker(CircuitConfig::default()) // 5 failures in a row → 30 s open
            .named("webhooks/acme"),
    );
    let globex_sink = Arc::new(
        // One request at a time: a fragile server.
        HttpSink::new(endpoint(&urls[1], GLOBEX_SECRET).max_in_flight(1))?
            .circuit_breaker(
                CircuitConfig::default()
                    .failures(3)
                    .cool_down(GLOBEX_COOL_DOWN),
            )
            .named("webhooks/globex"),
    );
    let initech_sink = Arc::new(
        HttpSink::new(endpoint(&urls[2], INITECH_SECRET))?
            .circuit_breaker(
                CircuitConfig::default()
                    .failures(5)
                    .cool_down(Duration::from_secs(10)),
            )
            .named(BROKEN_DESTINATION),
    );
    let circuits = [
        ("webhooks/acme", Arc::clone(&acme_sink)),
        ("webhooks/globex", Arc::clone(&globex_sink)),
        (BROKEN_DESTINATION, Arc::clone(&initech_sink)),
    ];
    // LISTEN/NOTIFY: the API's commits wake the relay, wherever it runs.
    let listener = outbox.listen().await?.ok_or("PostgreSQL listens")?;
    let relay = Relay::builder(outbox.clone())
        .route("webhooks/acme", acme_sink)
        .route("webhooks/globex", globex_sink)
        .route(BROKEN_DESTINATION, initech_sink)
        .wakeup(listener.wakeup())
        .poll_interval(Duration::from_millis(250))
        .retry(RetryPolicy::exponential(
            Duration::from_millis(100),
            Duration::from_secs(1),
        ))
        .build()?;
    let running = relay.spawn();

    // The gateway API.
    let gateway = Gateway {
        pool: pool.clone(),
        outbox: outbox.clone(),
        notifier: outbox.notifier(),
        events: names.events.clone(),
        subscriptions: names.subscriptions.clone(),
    };
    let app = axum::Router::new()
        .route("/v1/events", axum::routing::post(post_event))
        .with_state(gateway);
    let (api, api_server) = support::serve(app).await?;
    servers.push(api_server);

    let result = drive(pool, names, &outbox, &api, &initech, &circuits, replay).await;
    running.stop().await?;
    for server in servers {
        server.abort();
    }
    drop(listener);
    let mut summary = result?;

    // What the endpoints applied.
    let applied: Vec<(String, String)> = sqlx::query_as(&format!(
        "SELECT endpoint, event_id FROM {}",
        names.received
    ))
    .fetch_all(pool)
    .await?;
    let distinct: HashSet<&(String, String)> = applied.iter().collect();
    if distinct.len() != applied.len() {
        return Err(format!(
            "{} side effects for {} deliveries: an inbox let a copy through",
            applied.len(),
            distinct.len()
        )
        .into());
    }
    let expected: Vec<(String, String)> = sqlx::query_as(&format!(
        "SELECT s.endpoint, e.event_id FROM {} e JOIN {} s ON s.event_type = e.event_type",
        names.events, names.subscriptions
    ))
    .fetch_all(pool)
    .await?;
    summary.lost = expected.iter().filter(|d| !distinct.contains(d)).count() as u64;
    summary.delivered = distinct.len() as u64;
    summary.duplicates_ignored = [&acme, &globex, &initech]
        .iter()
        .map(|e| e.duplicates.load(AtomicOrdering::SeqCst))
        .sum();

    // Globex: how long after its last failure the next request came.
    let log = globex.log.lock().expect("log").clone();
    let last_failure = log.iter().rposition(|(_, s)| s.is_server_error());
    summary.globex_quiet = match last_failure {
        Some(i) if i + 1 < log.len() => log[i + 1].0.duration_since(log[i].0),
        _ => Duration::ZERO,
    };
    println!(
        "globex: {} requests, {} refused while it was down; after the last failure its circuit kept requests off for {:.2} s (cool-down {:?})",
        log.len(),
        log.iter().filter(|(_, s)| s.is_server_error()).count(),
        summary.globex_quiet.as_secs_f64(),
        GLOBEX_COOL_DOWN
    );
    Ok(summary)
}

/// The client's requests, the dead letters, the fix and the replay.
async fn drive(
    pool: &PgPool,
    names: &Names,
    outbox: &PgOutbox,
    api: &str,
    initech: &Endpoint,
    circuits: &[(&str, Arc<Circuit>); 3],
    replay: Replay,
) -> Result<Summary, Error> {
    let mut summary = Summary::default();
    let client = reqwest::Client::new();
    let requests = [
        (
            "k-1",
            "invoice.paid",
            json!({ "invoice": "inv-1", "cents": 4_900 }),
        ),
        ("k-2", "customer.created", json!({ "customer": "cus-1" })),
        (
            "k-3",
            "invoice.paid",
            json!({ "invoice": "inv-2", "cents": 12_000 }),
        ),
        // The client timed out on k-2 and sends it again.
        ("k-2", "customer.created", json!({ "customer": "cus-1" })),
        // Nobody can subscribe to this: refused, nothing enqueued.
        ("k-4", "invoice.voided", json!({ "invoice": "inv-0" })),
        ("k-5", "customer.created", json!({ "customer": "cus-2" })),
        (
            "k-6",
            "invoice.paid",
            json!({ "invoice": "inv-3", "cents": 750 }),
        ),
    ];
    for (key, kind, data) in requests {
        let body = json!({ "type": kind, "data": data });
        let response = client
            .post(format!("{api}/v1/events"))
            .header("idempotency-key", key)
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await?;
        let status = response.status();
        let answer: serde_json::Value = serde_json::from_slice(&response.bytes().await?)?;
        println!("POST /v1/events {key} {kind}: {status} {answer}");
        match status.as_u16() {
            202 => {
                summary.accepted += 1;
                // The 2xx came after the commit, so the rows must be visible right now.
                let rows: i64 = sqlx::query_scalar(&format!(
                    "SELECT count(*) FROM {} WHERE idempotency_key = $1",
                    names.outbox
                ))
                .bind(answer["event_id"].as_str().unwrap_or_default())
                .fetch_one(pool)
                .await?;
                if rows > 0 && Some(rows) == answer["deliveries"].as_i64() {
                    summary.committed_before_ack += 1;
                }
            }
            200 if answer["duplicate"] == true => summary.retried_posts += 1,
            400..=499 => summary.rejected += 1,
            _ => return Err(format!("the gateway answered {status}: {answer}").into()),
        }
    }

    // Everything either delivered or dead: initech's deliveries are dead letters.
    let deliveries: i64 = sqlx::query_scalar(&format!(
        "SELECT coalesce(sum(deliveries), 0)::bigint FROM {}",
        names.events
    ))
    .fetch_one(pool)
    .await?;
    summary.deliveries = deliveries as u64;
    let totals = support::settle(outbox, summary.deliveries, Duration::from_secs(60)).await?;
    summary.dead = totals.dead;
    let dead = outbox
        .list_dead(
            &DeadLetterFilter::all().destination(BROKEN_DESTINATION),
            100,
        )
        .await?;
    println!(
        "{} published, {} dead letters, all for {BROKEN_DESTINATION}:",
        totals.published,
        dead.len()
    );
    for letter in &dead {
        println!(
            "  {} {}: {}",
            letter.message.event_type,
            letter.message.idempotency_key,
            support::clip(&letter.reason, 90)
        );
    }

    // Initech deploys the right secret; the operator replays its dead letters.
    *initech.receiver.write().expect("receiver") =
        WebhookReceiver::from_secrets([INITECH_SECRET])?.consumer(initech.name);
    let store_url = support::postgres_url();
    let command = format!(
        "outbox --store {} --table {} dead replay --destination {BROKEN_DESTINATION}",
        outbox::redact::url(&store_url),
        names.outbox
    );
    summary.replayed = match replay {
        Replay::Api => {
            println!(
                "initech fixed its secret; replaying its dead letters (the CLI equivalent: `{command}`)"
            );
            let n = outbox
                .replay_dead(&DeadLetterFilter::all().destination(BROKEN_DESTINATION))
                .await?;
            outbox.notify().await?;
            n
        }
        Replay::Cli(binary) => {
            println!("initech fixed its secret; replaying its dead letters: `{command}`");
            let (n, lines) = replay_with_cli(&binary, &store_url, &names.outbox).await?;
            summary.cli_output = lines;
            n
        }
    };
    let totals = support::settle(outbox, summary.deliveries, Duration::from_secs(60)).await?;
    if totals.dead != 0 {
        return Err(format!("{} deliveries still dead after the replay", totals.dead).into());
    }
    for (destination, circuit) in circuits {
        let health = circuit.health();
        println!(
            "  {destination}: circuit {:?}, {} failures in a row",
            health.circuit, health.consecutive_failures
        );
    }
    Ok(summary)
}

/// Runs `outbox … dead replay --destination webhooks/initech`, first with `--dry-run`;
/// returns how many were replayed and what the CLI printed.
async fn replay_with_cli(
    binary: &PathBuf,
    store_url: &str,
    table: &str,
) -> Result<(u64, Vec<String>), Error> {
    let mut lines = Vec::new();
    for dry_run in [true, false] {
        let mut command = tokio::process::Command::new(binary);
        command.args([
            "--store",
            store_url,
            "--table",
            table,
            "dead",
            "replay",
            "--destination",
            BROKEN_DESTINATION,
        ]);
        if dry_run {
            command.arg("--dry-run");
        }
        // The CLI reads OUTBOX_CONFIG; this run names its store on the command line.
        command.env_remove("OUTBOX_CONFIG").kill_on_drop(true);
        let output = tokio::time::timeout(Duration::from_secs(60), command.output())
            .await
            .map_err(|_| "`outbox dead replay` did not finish within 60 s")??;
        let stdout = String::from_utf8_lossy(&output.stdout).trim().to_owned();
        if !output.status.success() {
            return Err(format!(
                "`outbox dead replay` exited with {}: {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            )
            .into());
        }
        println!("  outbox: {stdout}");
        lines.push(stdout);
    }
    // "replayed 5 dead letter(s)"
    let replayed = lines
        .last()
        .and_then(|line| line.strip_prefix("replayed "))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| format!("unexpected CLI output {lines:?}"))?;
    Ok((replayed, lines))
}
