//! Commerce notifications: order status changes → WhatsApp-style template messages through
//! a rate-limited messaging API, and ads-conversion events on a Redis stream.
//!
//! The shop keeps its orders in PostgreSQL. Every status change (cash on delivery
//! confirmed, shipped, out for delivery, delivered) updates the order and enqueues the
//! customer message **in the same transaction**. Each message's idempotency key is
//! derived from `(order id, status)` (UUIDv5), so the same transition always carries the
//! same key, and the messaging provider, which deduplicates on the `idempotency-key`
//! header, bills it once however often it arrives.
//!
//! After a busy hour the relay starts and drains the backlog through the provider, a
//! local server here that plays the provider's part: it allows 25 messages per second per
//! account and answers 429 beyond that, refuses a bad phone number with 400 and an
//! unapproved template with 404, and deduplicates by idempotency key. The relay sends at
//! 20 per second, so it is never throttled. The two refused messages become dead letters
//! at once (a 4xx will not get better by retrying) while every other message goes on.
//!
//! The courier's webhook that marks an order delivered writes **two** outbox rows in one
//! transaction: the customer's "delivered" message (HTTP route) and an ads-conversion
//! event (Redis Streams route). The courier sends one of its webhooks twice, and the shop
//! replays one "shipped" transition: neither is billed twice, and the conversion stream
//! holds one entry per delivered order (the Redis sink suppresses the re-sent key).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use outbox::TableNames;
use outbox::http::{HttpSink, HttpSinkConfig};
use outbox::layers::{RateLimit, SinkExt};
use outbox::postgres::PgOutbox;
use outbox::redis::{RedisSink, RedisSinkConfig, client as redis};
use outbox::{
    DeadHead, DeadLetterFilter, DeadLetters, MessageOrder, NewMessage, Relay, RetryPolicy,
    StoreStats, deterministic_key,
};
use serde_json::json;
use sqlx::PgPool;
use uuid::Uuid;

use crate::support::{self, Error, LOOPBACK};

/// The route of customer messages (the messaging provider's HTTP API).
pub const WHATSAPP: &str = "whatsapp";
/// The route of ads-conversion events (a Redis stream).
pub const CONVERSIONS: &str = "ads-conversions";
/// The rate the relay sends at (messages per second)…
pub const SEND_RATE: f64 = 20.0;
/// …and how many it may send at once after a quiet period.
pub const SEND_BURST: u32 = 5;
/// The provider's limit per account: a little above what we send.
const PROVIDER_RATE: f64 = 25.0;
const PROVIDER_BURST: f64 = 10.0;
const API_TOKEN: &str = "demo-access-token";

/// The namespace of this shop's idempotency keys. Any service that computes
/// `UUIDv5(namespace, order id, status)` gets the same key for the same transition.
const KEY_NAMESPACE: Uuid = Uuid::from_u128(0x6f72_6465_722d_7374_6174_7573_2d6b_6579);

/// The templates the provider has approved for this account.
const APPROVED_TEMPLATES: &[&str] = &["cod_confirmation", "order_shipped", "order_delivered"];

/// The message template for each order status.
fn template(status: &str) -> &'static str {
    match status {
        "cod_confirmed" => "cod_confirmation",
        "shipped" => "order_shipped",
        // Submitted to the provider, but not approved yet: the provider refuses it.
        "out_for_delivery" => "out_for_delivery_v2",
        _ => "order_delivered",
    }
}

/// What happened, counted from what the provider and the ads stream saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// Outbox rows committed (every one ended published or dead).
    pub rows: u64,
    /// Messages the provider billed.
    pub billed: u64,
    /// Requests the provider recognised by their idempotency key and did not bill again.
    pub duplicates_dropped: u64,
    /// Status transitions billed more than once (a different key for the same transition).
    pub billed_twice: u64,
    /// Dead letters (permanent 4xx answers).
    pub dead: u64,
    /// Entries in the ads-conversion stream.
    pub conversions: u64,
    /// Committed transitions that were neither billed nor dead-lettered, plus delivered
    /// orders without a conversion entry.
    pub lost: u64,
    /// Requests the provider received.
    pub requests: u64,
    /// Requests the provider answered with 429.
    pub throttled: u64,
    /// From the relay's start to the provider's last request.
    pub drain_time: Duration,
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "rows={} billed={} duplicates_dropped={} billed_twice={} dead={} conversions={} lost={}",
            self.rows,
            self.billed,
            self.duplicates_dropped,
            self.billed_twice,
            self.dead,
            self.conversions,
            self.lost
        )
    }
}

// ---------------------------------------------------------------------------------------
// The shop: orders and their outbox, in one PostgreSQL database.
// ---------------------------------------------------------------------------------------

struct Shop {
    pool: PgPool,
    outbox: PgOutbox,
    orders: String,
    /// Every transition whose transaction committed: `(order id, status)`.
    committed: Vec<(String, String)>,
}

/// The customer message for `status`. The key depends only on the order and the status,
/// so enqueueing the same transition again produces the same key.
fn customer_message(order: &str, phone: &str, status: &str) -> Result<NewMessage, Error> {
    Ok(NewMessage::builder(WHATSAPP, format!("order.{status}"))
        .json(&json!({
            "to": phone,
            "template": template(status),
            "language": "en",
            "params": [order],
        }))
        .aggregate("order", order)
        // One order's messages go out in commit order: never "delivered" before "shipped".
        .partition_key(order)
        .deterministic_key(KEY_NAMESPACE, &[order, status])
        .build()?)
}

impl Shop {
    /// A status change: the order update and its customer message commit together.
    async fn change_status(&mut self, order: &str, status: &str) -> Result<(), Error> {
        let mut tx = self.pool.begin().await?;
        let phone: String = sqlx::query_scalar(&format!(
            "UPDATE {} SET status = $2 WHERE id = $1 RETURNING phone",
            self.orders
        ))
        .bind(order)
        .bind(status)
        .fetch_one(&mut *tx)
        .await?;
        self.outbox
            .enqueue(&mut tx, &customer_message(order, &phone, status)?)
            .await?;
        tx.commit().await?;
        self.committed.push((order.to_owned(), status.to_owned()));
        Ok(())
    }

    /// The body of the courier's "delivered" webhook: one transaction, two outbox rows.
    async fn courier_delivered(&mut self, order: &str) -> Result<(), Error> {
        let mut tx = self.pool.begin().await?;
        let (phone, total_cents): (String, i64) = sqlx::query_as(&format!(
            "UPDATE {} SET status = 'delivered' WHERE id = $1 RETURNING phone, total_cents",
            self.orders
        ))
        .bind(order)
        .fetch_one(&mut *tx)
        .await?;
        let conversion = NewMessage::builder(CONVERSIONS, "purchase")
            .json(&json!({ "order": order, "value_cents": total_cents, "currency": "NGN" }))
            .aggregate("order", order)
            .deterministic_key(KEY_NAMESPACE, &[order, "conversion"])
            .build()?;
        let rows = [customer_message(order, &phone, "delivered")?, conversion];
        self.outbox.enqueue_all(&mut tx, &rows).await?;
        tx.commit().await?;
        self.committed
            .push((order.to_owned(), "delivered".to_owned()));
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------
// The messaging provider (what a WhatsApp Business API vendor does, in miniature).
// ---------------------------------------------------------------------------------------

#[derive(Default)]
struct Provider {
    state: Mutex<ProviderState>,
}

struct ProviderState {
    tokens: f64,
    refilled: Instant,
    /// Idempotency key → the provider's message id.
    sent: HashMap<String, String>,
    /// `(order, template)` of every billed message.
    ledger: Vec<(String, String)>,
    requests: Vec<Instant>,
    throttled: u64,
    duplicates: u64,
}

impl Default for ProviderState {
    fn default() -> Self {
        Self {
            tokens: PROVIDER_BURST,
            refilled: Instant::now(),
            sent: HashMap::new(),
            ledger: Vec::new(),
            requests: Vec::new(),
            throttled: 0,
            duplicates: 0,
        }
    }
}

fn refuse(status: StatusCode, code: u32, message: &str) -> Response {
    let body = json!({ "error": { "code": code, "message": message } });
    (status, axum::Json(body)).into_response()
}

fn is_e164(phone: &str) -> bool {
    phone.strip_prefix('+').is_some_and(|digits| {
        (8..=15).contains(&digits.len()) && digits.bytes().all(|b| b.is_ascii_digit())
    })
}

async fn send_message(
    State(provider): State<Arc<Provider>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let mut s = provider.state.lock().expect("provider lock");
    let now = Instant::now();
    s.requests.push(now);
    if header("authorization") != Some(&format!("Bearer {API_TOKEN}")) {
        return refuse(StatusCode::UNAUTHORIZED, 190, "invalid access token");
    }
    // The account's rate limit: a token bucket.
    s.tokens = (s.tokens + now.duration_since(s.refilled).as_secs_f64() * PROVIDER_RATE)
        .min(PROVIDER_BURST);
    s.refilled = now;
    if s.tokens < 1.0 {
        s.throttled += 1;
        let mut response = refuse(StatusCode::TOO_MANY_REQUESTS, 130429, "rate limit hit");
        response
            .headers_mut()
            .insert("retry-after", axum::http::HeaderValue::from_static("1"));
        return response;
    }
    s.tokens -= 1.0;
    let Some(key) = header("idempotency-key") else {
        return refuse(
            StatusCode::BAD_REQUEST,
            100,
            "idempotency-key header required",
        );
    };
    // Seen this key before: answer as the first time, bill nothing.
    if let Some(id) = s.sent.get(key).cloned() {
        s.duplicates += 1;
        return axum::Json(json!({ "messages": [{ "id": id }], "deduplicated": true }))
            .into_response();
    }
    let Ok(request) = serde_json::from_slice::<serde_json::Value>(&body) else {
        return refuse(StatusCode::BAD_REQUEST, 100, "body is not JSON");
    };
    let to = request["to"].as_str().unwrap_or_default();
    let name = request["template"].as_str().unwrap_or_default();
    if !is_e164(to) {
        return refuse(
            StatusCode::BAD_REQUEST,
            131026,
            &format!("recipient {to:?} is not a valid phone number"),
        );
    }
    if !APPROVED_TEMPLATES.contains(&name) {
        return refuse(
            StatusCode::NOT_FOUND,
            132001,
            &format!("template {name:?} does not exist or is not approved"),
        );
    }
    let id = format!("wamid.{:04}", s.ledger.len() + 1);
    let order = request["params"][0].as_str().unwrap_or_default().to_owned();
    s.sent.insert(key.to_owned(), id.clone());
    s.ledger.push((order, name.to_owned()));
    axum::Json(json!({ "messages": [{ "id": id }] })).into_response()
}

// ---------------------------------------------------------------------------------------
// The story.
// ---------------------------------------------------------------------------------------

struct Names {
    outbox: String,
    orders: String,
    stream: String,
}

/// Runs the whole story against the servers of `scripts/services.sh` and returns what the
/// provider and the ads stream saw.
///
/// # Errors
///
/// A server is missing, or any database, network or configuration failure.
pub async fn run() -> Result<Summary, Error> {
    let pool = support::postgres().await?;
    let mut redis_conn = support::redis().await?;
    let names = Names {
        outbox: support::fresh("commerce_outbox"),
        orders: support::fresh("commerce_orders"),
        stream: support::fresh("ads_conversions"),
    };
    let result = story(&pool, &mut redis_conn, &names).await;
    // Clean up whatever happened; the story's own error comes first.
    let cleaned = async {
        support::drop_outbox(&pool, &names.outbox).await?;
        support::drop_tables(&pool, &[&names.orders]).await?;
        support::delete_stream(&mut redis_conn, &names.stream).await
    }
    .await;
    let summary = result?;
    cleaned?;
    Ok(summary)
}

async fn story(
    pool: &PgPool,
    redis_conn: &mut redis::aio::MultiplexedConnection,
    names: &Names,
) -> Result<Summary, Error> {
    let outbox = PgOutbox::with_names(pool.clone(), TableNames::default().outbox(&names.outbox)?);
    outbox.migrate().await?;
    sqlx::query(&format!(
        "CREATE TABLE {} (id text PRIMARY KEY, phone text NOT NULL, status text NOT NULL, total_cents bigint NOT NULL)",
        names.orders
    ))
    .execute(pool)
    .await?;
    let mut shop = Shop {
        pool: pool.clone(),
        outbox: outbox.clone(),
        orders: names.orders.clone(),
        committed: Vec::new(),
    };

    // Ten cash-on-delivery orders; order 1007 was typed without its country code.
    let orders: Vec<String> = (1001..=1010).map(|n| format!("ord-{n}")).collect();
    for (i, order) in orders.iter().enumerate() {
        let phone = if order == "ord-1007" {
            "0803 555 0107".to_owned()
        } else {
            format!("+234803555{:04}", 1001 + i)
        };
        sqlx::query(&format!(
            "INSERT INTO {} (id, phone, status, total_cents) VALUES ($1, $2, 'placed', $3)",
            names.orders
        ))
        .bind(order)
        .bind(phone)
        .bind(12_500_i64 * (i as i64 + 1))
        .execute(pool)
        .await?;
    }

    // A busy hour of status changes, each its own transaction.
    for order in &orders {
        shop.change_status(order, "cod_confirmed").await?;
    }
    for order in &orders[..6] {
        shop.change_status(order, "shipped").await?;
    }
    // A retried admin action replays a transition: same (order, status), same key.
    shop.change_status(&orders[2], "shipped").await?;
    shop.change_status(&orders[1], "out_for_delivery").await?;
    for order in &orders[..4] {
        shop.courier_delivered(order).await?;
    }
    // The courier did not get our 200 in time and sends its webhook again.
    shop.courier_delivered(&orders[0]).await?;
    let rows = outbox.stats().await?.total().pending;
    println!(
        "shop: {} status changes committed, {rows} outbox rows waiting",
        shop.committed.len()
    );

    // The messaging provider, on loopback.
    let provider = Arc::new(Provider::default());
    let app = axum::Router::new()
        .route("/v1/messages", axum::routing::post(send_message))
        .with_state(Arc::clone(&provider));
    let (base, server) = support::serve(app).await?;

    // The relay: the provider's API with our account's rate limit, and the ads stream.
    let whatsapp = HttpSink::new(
        HttpSinkConfig::new(format!("{base}/v1/messages"))
            .header("authorization", format!("Bearer {API_TOKEN}"))
            .request_timeout(Duration::from_secs(5))
            .allow(LOOPBACK),
    )?
    .rate_limited(RateLimit::per_second(SEND_RATE).burst(SEND_BURST));
    let conversions =
        RedisSink::connect(RedisSinkConfig::new(support::redis_url()).stream(names.stream.clone()))
            .await?;
    let relay = Relay::builder(outbox.clone())
        .route(WHATSAPP, whatsapp)
        .route(CONVERSIONS, conversions)
        .ordering(MessageOrder::PerKey(DeadHead::Skip))
        .poll_interval(Duration::from_millis(100))
        .retry(RetryPolicy::exponential(
            Duration::from_millis(100),
            Duration::from_secs(1),
        ))
        .build()?;
    let started = Instant::now();
    let running = relay.spawn();
    let totals = support::settle(&outbox, rows, Duration::from_secs(60)).await;
    running.stop().await?;
    server.abort();
    let totals = totals?;

    // What the provider saw.
    let (billed_keys, ledger, requests, throttled, duplicates, last_request) = {
        let s = provider.state.lock().expect("provider lock");
        (
            s.sent.keys().cloned().collect::<HashSet<_>>(),
            s.ledger.clone(),
            s.requests.len() as u64,
            s.throttled,
            s.duplicates,
            s.requests.last().copied(),
        )
    };
    let drain_time = last_request.map_or(Duration::ZERO, |t| t.duration_since(started));
    let mut per_transition: HashMap<&(String, String), u64> = HashMap::new();
    for entry in &ledger {
        *per_transition.entry(entry).or_default() += 1;
    }
    let billed_twice = per_transition.values().map(|n| n - 1).sum();
    println!(
        "provider: {requests} requests in {:.2} s (at {SEND_RATE}/s with a burst of {SEND_BURST}, no faster than {:.2} s), \
         {} billed, {duplicates} recognised by idempotency key and not billed, {throttled} throttled",
        drain_time.as_secs_f64(),
        requests.saturating_sub(u64::from(SEND_BURST)) as f64 / SEND_RATE,
        ledger.len()
    );

    // The dead letters: refused for good, with the provider's answer as the reason.
    let dead = outbox.list_dead(&DeadLetterFilter::all(), 100).await?;
    println!(
        "dead letters ({}), while everything else flowed:",
        dead.len()
    );
    for letter in &dead {
        println!(
            "  {} {}: {}",
            letter.message.event_type,
            letter.message.aggregate_id.as_deref().unwrap_or("?"),
            support::clip(&letter.reason, 110)
        );
    }
    let dead_keys: HashSet<&str> = dead
        .iter()
        .map(|d| d.message.idempotency_key.as_str())
        .collect();

    // What the ads pipeline reads: one entry per delivered order.
    let entries: Vec<(String, HashMap<String, Vec<u8>>)> = redis::cmd("XRANGE")
        .arg(&names.stream)
        .arg("-")
        .arg("+")
        .query_async(redis_conn)
        .await?;
    let converted: BTreeSet<String> = entries
        .iter()
        .filter_map(|(_, fields)| fields.get("payload"))
        .filter_map(|p| serde_json::from_slice::<serde_json::Value>(p).ok())
        .filter_map(|v| v["order"].as_str().map(str::to_owned))
        .collect();
    println!(
        "ads stream {}: {} conversion entries ({})",
        names.stream,
        entries.len(),
        converted.iter().cloned().collect::<Vec<_>>().join(", ")
    );

    // Lost: a committed transition that is neither billed nor a dead letter, or a
    // delivered order without its conversion.
    let mut lost = 0;
    let transitions: HashSet<&(String, String)> = shop.committed.iter().collect();
    for (order, status) in transitions {
        let key = deterministic_key(KEY_NAMESPACE, &[order, status]).to_string();
        if !billed_keys.contains(&key) && !dead_keys.contains(key.as_str()) {
            lost += 1;
        }
        if status == "delivered" && !converted.contains(order) {
            lost += 1;
        }
    }

    Ok(Summary {
        rows: totals.published + totals.dead,
        billed: ledger.len() as u64,
        duplicates_dropped: duplicates,
        billed_twice,
        dead: totals.dead,
        conversions: entries.len() as u64,
        lost,
        requests,
        throttled,
        drain_time,
    })
}
