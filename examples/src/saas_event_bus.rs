//! SaaS event bus: billing events (tenant created, invoice issued, payment received,
//! invoice paid) published to one route, `billing-events`, first on Redis Streams, then
//! over HTTP, then to RabbitMQ, then to Kafka, then to an Amazon SQS FIFO queue — with the same code and only the relay's
//! configuration text changed.
//!
//! The billing service keeps tenants, invoices and the outbox in PostgreSQL. Each change
//! and its event commit in one transaction. Every event carries its tenant id, and its
//! partition key is its aggregate (`tenant:<id>`, `invoice:<id>`), so with per-key
//! ordering a consumer sees each invoice's events in the order they were committed, even
//! with two relay workers and a retried delivery in between.
//!
//! The relay is not written in code: it is built from a TOML text by the front crate
//! ([`outbox::Config::from_toml`], [`outbox::Outbox::from_config`]),
//! exactly as `outbox relay --config outbox.toml` builds it. On Monday the route's `url` is
//! `redis://…`: an analytics consumer reads the stream with a consumer group. On Tuesday
//! the text says `http://…` instead: a webhook consumer receives the same kind of events,
//! signed. On Wednesday it says `amqp://…`, with an exchange and a routing key template
//! (`{tenant_id}.{event_type}`): a ledger service consumes a queue bound to that exchange.
//! On Thursday it says `kafka://…/<topic>`: each record's key is its aggregate, so one
//! invoice's events share a partition, and a consumer group reads them in commit order.
//! On Friday it says `sqs://us-east-1/<queue>.fifo` (with an `endpoint` for the local
//! emulator): each message's group is its aggregate, so SQS hands one invoice's events out
//! in commit order. Nothing else changes. Every consumer deduplicates by event id, which matters
//! on Tuesday: one acknowledgement is lost on the way back, the relay delivers that event
//! again, and the consumer drops the copy. Tuesday's consumer is also briefly unavailable
//! for a partial-payment notice; the invoice's "paid" event waits for it.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use outbox::NewMessage;
use outbox::TableNames;
use outbox::amqp::client as amqp;
use outbox::postgres::{PgNotifier, PgOutbox};
use outbox::receiver::WebhookReceiver;
use outbox::redis::client as redis;
use serde_json::json;
use sqlx::PgPool;

use crate::support::{self, Error};
use outbox::RunningRelay;

mod consumers;

use consumers::{
    ConsumerView, HttpConsumer, read_group, read_queue, read_sqs, read_topic, receive_event,
};

/// The one route every billing event goes to.
pub const ROUTE: &str = "billing-events";
const SECRET: &str = "whsec_B+h76X6sHITVwENJnBjqzu1dikQVOG+H";
const GROUP: &str = "analytics";

/// What the consumers saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// Distinct events the Redis consumer read (Monday).
    pub redis_events: u64,
    /// Distinct events the HTTP consumer received (Tuesday).
    pub http_events: u64,
    /// Distinct events the RabbitMQ consumer received (Wednesday).
    pub amqp_events: u64,
    /// Distinct events the Kafka consumer group read (Thursday).
    pub kafka_events: u64,
    /// Distinct events the SQS consumer received (Friday).
    pub sqs_events: u64,
    /// Deliveries the consumers recognised by event id and dropped.
    pub duplicates_dropped: u64,
    /// Events that arrived before an earlier event of their aggregate.
    pub out_of_order: u64,
    /// Committed events no consumer saw.
    pub lost: u64,
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "redis_events={} http_events={} amqp_events={} kafka_events={} sqs_events={} duplicates_dropped={} out_of_order={} lost={}",
            self.redis_events,
            self.http_events,
            self.amqp_events,
            self.kafka_events,
            self.sqs_events,
            self.duplicates_dropped,
            self.out_of_order,
            self.lost
        )
    }
}

// ---------------------------------------------------------------------------------------
// The relay, from configuration only.
// ---------------------------------------------------------------------------------------

/// A TOML string (JSON string escapes are valid TOML).
fn toml_str(text: &str) -> String {
    serde_json::to_string(text).expect("strings serialize")
}

/// The relay's configuration file. Only the `[routes.billing-events]` table differs
/// between the days.
fn config_text(table: &str, route: &str) -> String {
    format!(
        r#"[store]
url = {store}
table = {table}

[relay]
concurrency = 2
poll_interval = "200ms"
ordering = "per-key"
dead_head = "skip"

[retry]
initial_delay = "100ms"
max_delay = "1s"

{route}"#,
        store = toml_str(&support::postgres_url()),
        table = toml_str(table),
    )
}

/// A relay running from `text`: what `outbox relay --config` does.
async fn start_relay(text: &str) -> Result<RunningRelay, Error> {
    // A deployed relay reads a file with `Config::load(path)`, which also applies
    // `OUTBOX_…` environment settings; here the text is all there is.
    let config = outbox::Config::from_toml(text, std::iter::empty::<(&str, &str)>())?;
    let outbox = outbox::Outbox::from_config(&config).await?;
    Ok(outbox.spawn())
}

// ---------------------------------------------------------------------------------------
// The billing service.
// ---------------------------------------------------------------------------------------

struct Billing {
    pool: PgPool,
    outbox: PgOutbox,
    notifier: PgNotifier,
    tenants: String,
    invoices: String,
    /// Ids of the events whose transaction committed.
    committed: Vec<String>,
}

/// A billing event: tenant id on the row, partition key = aggregate.
fn event(
    tenant: &str,
    aggregate: (&str, &str),
    event_type: &str,
    version: i64,
    data: serde_json::Value,
) -> Result<NewMessage, Error> {
    let (aggregate_type, aggregate_id) = aggregate;
    Ok(NewMessage::builder(ROUTE, event_type)
        .json(&json!({
            "tenant": tenant,
            "aggregate": format!("{aggregate_type}:{aggregate_id}"),
            "version": version,
            "data": data,
        }))
        .tenant_id(tenant)
        .aggregate(aggregate_type, aggregate_id)
        .partition_key(format!("{aggregate_type}:{aggregate_id}"))
        .build()?)
}

impl Billing {
    async fn commit(
        &mut self,
        mut tx: sqlx::Transaction<'_, sqlx::Postgres>,
        message: NewMessage,
    ) -> Result<(), Error> {
        self.outbox.enqueue(&mut tx, &message).await?;
        tx.commit().await?;
        self.committed.push(message.idempotency_key().to_owned());
        // The relay runs elsewhere: wake it (LISTEN/NOTIFY) instead of waiting for its poll.
        self.notifier.notify();
        Ok(())
    }

    async fn create_tenant(&mut self, tenant: &str, name: &str) -> Result<(), Error> {
        let mut tx = self.pool.begin().await?;
        sqlx::query(&format!(
            "INSERT INTO {} (id, name) VALUES ($1, $2)",
            self.tenants
        ))
        .bind(tenant)
        .bind(name)
        .execute(&mut *tx)
        .await?;
        let message = event(
            tenant,
            ("tenant", tenant),
            "tenant.created",
            1,
            json!({ "name": name }),
        )?;
        self.commit(tx, message).await
    }

    async fn issue_invoice(
        &mut self,
        tenant: &str,
        invoice: &str,
        cents: i64,
    ) -> Result<(), Error> {
        let mut tx = self.pool.begin().await?;
        sqlx::query(&format!(
            "INSERT INTO {} (id, tenant, total_cents, paid_cents, version) VALUES ($1, $2, $3, 0, 1)",
            self.invoices
        ))
        .bind(invoice)
        .bind(tenant)
        .bind(cents)
        .execute(&mut *tx)
        .await?;
        let message = event(
            tenant,
            ("invoice", invoice),
            "invoice.issued",
            1,
            json!({ "total_cents": cents }),
        )?;
        self.commit(tx, message).await
    }

    async fn record_payment(&mut self, invoice: &str, cents: i64) -> Result<(), Error> {
        let mut tx = self.pool.begin().await?;
        let (tenant, paid, total, version): (String, i64, i64, i64) = sqlx::query_as(&format!(
            "UPDATE {} SET paid_cents = paid_cents + $2, version = version + 1 WHERE id = $1 \
             RETURNING tenant, paid_cents, total_cents, version",
            self.invoices
        ))
        .bind(invoice)
        .bind(cents)
        .fetch_one(&mut *tx)
        .await?;
        let kind = if paid >= total {
            "invoice.paid"
        } else {
            "invoice.payment_received"
        };
        let message = event(
            &tenant,
            ("invoice", invoice),
            kind,
            version,
            json!({ "amount_cents": cents, "paid_cents": paid }),
        )?;
        self.commit(tx, message).await
    }

    /// One day of business: two new tenants, three invoices, four payments. Returns the
    /// ids of that day's events.
    async fn business_day(&mut self, day: &str) -> Result<Vec<String>, Error> {
        let first = self.committed.len();
        let acme = format!("acme-{day}");
        let umbrella = format!("umbrella-{day}");
        let (a1, a2, u1) = (
            format!("{acme}-inv1"),
            format!("{acme}-inv2"),
            format!("{umbrella}-inv1"),
        );
        self.create_tenant(&acme, "Acme Corp").await?;
        self.create_tenant(&umbrella, "Umbrella plc").await?;
        self.issue_invoice(&acme, &a1, 10_000).await?;
        self.issue_invoice(&acme, &a2, 5_000).await?;
        self.issue_invoice(&umbrella, &u1, 2_000).await?;
        self.record_payment(&a1, 4_000).await?; // partial
        self.record_payment(&u1, 2_000).await?;
        self.record_payment(&a1, 6_000).await?; // the rest: paid
        self.record_payment(&a2, 5_000).await?;
        Ok(self.committed[first..].to_vec())
    }
}

// ---------------------------------------------------------------------------------------
// The story.
// ---------------------------------------------------------------------------------------

struct Names {
    outbox: String,
    tenants: String,
    invoices: String,
    stream: String,
    exchange: String,
    queue: String,
    topic: String,
    sqs_queue: String,
}

/// Runs the whole story against the servers of `scripts/services.sh` and returns what the
/// consumers saw.
///
/// # Errors
///
/// A server is missing, or any database, network or configuration failure.
pub async fn run() -> Result<Summary, Error> {
    let pool = support::postgres().await?;
    let mut redis_conn = support::redis().await?;
    let (_amqp_connection, channel) = support::amqp().await?;
    let names = Names {
        outbox: support::fresh("saas_outbox"),
        tenants: support::fresh("saas_tenants"),
        invoices: support::fresh("saas_invoices"),
        stream: support::fresh("billing_events"),
        exchange: support::fresh("billing"),
        queue: support::fresh("ledger"),
        topic: support::fresh("billing-events"),
        sqs_queue: format!("{}.fifo", support::fresh("billing-events")),
    };
    let result = story(&pool, &mut redis_conn, &channel, &names).await;
    // Clean up whatever happened; the story's own error comes first.
    let cleaned = async {
        support::drop_outbox(&pool, &names.outbox).await?;
        support::drop_tables(&pool, &[&names.tenants, &names.invoices]).await?;
        support::delete_stream(&mut redis_conn, &names.stream).await?;
        channel
            .queue_delete(names.queue.as_str().into(), Default::default())
            .await?;
        channel
            .exchange_delete(names.exchange.as_str().into(), Default::default())
            .await?;
        support::delete_sqs_queue(&names.sqs_queue).await?;
        Ok::<_, Error>(())
    }
    .await;
    let summary = result?;
    cleaned?;
    Ok(summary)
}

async fn story(
    pool: &PgPool,
    redis_conn: &mut redis::aio::MultiplexedConnection,
    channel: &amqp::Channel,
    names: &Names,
) -> Result<Summary, Error> {
    let outbox = PgOutbox::with_names(pool.clone(), TableNames::default().outbox(&names.outbox)?);
    outbox.migrate().await?; // or `outbox migrate --config outbox.toml`
    for ddl in [
        format!(
            "CREATE TABLE {} (id text PRIMARY KEY, name text NOT NULL)",
            names.tenants
        ),
        format!(
            "CREATE TABLE {} (id text PRIMARY KEY, tenant text NOT NULL, total_cents bigint NOT NULL, \
             paid_cents bigint NOT NULL, version bigint NOT NULL)",
            names.invoices
        ),
    ] {
        sqlx::query(&ddl).execute(pool).await?;
    }
    let mut billing = Billing {
        pool: pool.clone(),
        notifier: outbox.notifier(),
        outbox: outbox.clone(),
        tenants: names.tenants.clone(),
        invoices: names.invoices.clone(),
        committed: Vec::new(),
    };

    // Monday: the route is a Redis stream, read by an analytics consumer group.
    let _: () = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(&names.stream)
        .arg(GROUP)
        .arg("0")
        .arg("MKSTREAM")
        .query_async(redis_conn)
        .await?;
    let redis_route = format!(
        "[routes.{ROUTE}]\nurl = {}\nstream = {}\n",
        toml_str(&support::redis_url()),
        toml_str(&names.stream)
    );
    let monday = run_day(
        &mut billing,
        &config_text(&names.outbox, &redis_route),
        "mon",
    )
    .await?;
    let mut redis_view = ConsumerView::default();
    read_group(redis_conn, &names.stream, &mut redis_view).await?;
    redis_view.print(&format!(
        "Redis consumer (group {GROUP} on stream {})",
        names.stream
    ));

    // Tuesday: the same route, now an HTTP endpoint. Only the configuration changed.
    let consumer = HttpConsumer {
        receiver: WebhookReceiver::from_secrets([SECRET])?.consumer("ledger"),
        view: Arc::default(),
        unavailable_once: Arc::new(AtomicBool::new(true)),
        lose_ack_once: Arc::new(AtomicBool::new(true)),
    };
    let app = axum::Router::new()
        .route("/events", axum::routing::post(receive_event))
        .with_state(consumer.clone());
    let (base, server) = support::serve(app).await?;
    let http_route = format!(
        "[routes.{ROUTE}]\nurl = {}\nsecrets = [{}]\nallow = [\"127.0.0.1/32\"]\n",
        toml_str(&format!("{base}/events")),
        toml_str(SECRET)
    );
    let tuesday = run_day(
        &mut billing,
        &config_text(&names.outbox, &http_route),
        "tue",
    )
    .await;
    server.abort();
    let tuesday = tuesday?;
    let http_view = std::mem::take(&mut *consumer.view.lock().expect("view"));
    http_view.print(&format!("HTTP consumer ({base}/events)"));

    // Wednesday: the same route, now a RabbitMQ exchange. The broker's topology is the
    // operator's: a topic exchange and the ledger's queue, bound to every routing key.
    declare_topology(channel, &names.exchange, &names.queue).await?;
    let amqp_route = format!(
        "[routes.{ROUTE}]\nurl = {}\nexchange = {}\nrouting_key = \"{{tenant_id}}.{{event_type}}\"\n",
        toml_str(&support::amqp_url()),
        toml_str(&names.exchange)
    );
    let wednesday = run_day(
        &mut billing,
        &config_text(&names.outbox, &amqp_route),
        "wed",
    )
    .await?;
    let mut amqp_view = ConsumerView::default();
    read_queue(channel, &names.queue, &mut amqp_view).await?;
    amqp_view.print(&format!("RabbitMQ consumer (queue {})", names.queue));

    // Thursday: the same route, now a Kafka topic (created by the operator). Records are
    // keyed by partition key, so each aggregate's events share a partition.
    support::kafka_topic(&names.topic, 3).await?;
    let kafka_route = format!(
        "[routes.{ROUTE}]\nurl = {}\n",
        toml_str(&format!(
            "kafka://{}/{}",
            support::kafka_brokers(),
            names.topic
        ))
    );
    let thursday = run_day(
        &mut billing,
        &config_text(&names.outbox, &kafka_route),
        "thu",
    )
    .await?;
    let mut kafka_view = ConsumerView::default();
    read_topic(&names.topic, thursday.len(), &mut kafka_view).await?;
    kafka_view.print(&format!(
        "Kafka consumer (group ledger on topic {})",
        names.topic
    ));

    // Friday: the same route, now an SQS FIFO queue (created by the operator). Each
    // message's group is its partition key, so SQS keeps each aggregate's order.
    let queue_url = support::sqs_fifo_queue(&names.sqs_queue).await?;
    let sqs_route = format!(
        "[routes.{ROUTE}]\nurl = {}\nendpoint = {}\naccess_key_id = \"test\"\nsecret_access_key = \"test\"\n",
        toml_str(&format!("sqs://us-east-1/{}", names.sqs_queue)),
        toml_str(&support::sqs_endpoint()),
    );
    let friday = run_day(&mut billing, &config_text(&names.outbox, &sqs_route), "fri").await?;
    let mut sqs_view = ConsumerView::default();
    read_sqs(&queue_url, friday.len(), &mut sqs_view).await?;
    sqs_view.print(&format!("SQS consumer (FIFO queue {})", names.sqs_queue));

    let views = [&redis_view, &http_view, &amqp_view, &kafka_view, &sqs_view];
    let untenanted: u64 = views.iter().map(|v| v.untenanted).sum();
    if untenanted > 0 {
        return Err(format!("{untenanted} events arrived without a tenant id").into());
    }
    let lost = monday
        .iter()
        .filter(|id| !redis_view.seen.contains(*id))
        .count()
        + tuesday
            .iter()
            .filter(|id| !http_view.seen.contains(*id))
            .count()
        + wednesday
            .iter()
            .filter(|id| !amqp_view.seen.contains(*id))
            .count()
        + thursday
            .iter()
            .filter(|id| !kafka_view.seen.contains(*id))
            .count()
        + friday
            .iter()
            .filter(|id| !sqs_view.seen.contains(*id))
            .count();
    Ok(Summary {
        redis_events: redis_view.events.len() as u64,
        http_events: http_view.events.len() as u64,
        amqp_events: amqp_view.events.len() as u64,
        kafka_events: kafka_view.events.len() as u64,
        sqs_events: sqs_view.events.len() as u64,
        duplicates_dropped: views.iter().map(|v| v.duplicates).sum(),
        out_of_order: views.iter().map(|v| v.out_of_order).sum(),
        lost: lost as u64,
    })
}

/// A durable topic exchange and a durable queue bound to it for every routing key.
async fn declare_topology(
    channel: &amqp::Channel,
    exchange: &str,
    queue: &str,
) -> Result<(), Error> {
    use amqp::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
    use amqp::types::FieldTable;
    let durable = ExchangeDeclareOptions {
        durable: true,
        ..ExchangeDeclareOptions::default()
    };
    channel
        .exchange_declare(
            exchange.into(),
            amqp::ExchangeKind::Topic,
            durable,
            FieldTable::default(),
        )
        .await?;
    channel
        .queue_declare(
            queue.into(),
            QueueDeclareOptions::durable(),
            FieldTable::default(),
        )
        .await?;
    channel
        .queue_bind(
            queue.into(),
            exchange.into(),
            "#".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await?;
    Ok(())
}

/// One day: start the relay from `config`, do the day's business, wait until the relay
/// published everything, stop it. The same code both days.
async fn run_day(billing: &mut Billing, config: &str, day: &str) -> Result<Vec<String>, Error> {
    let route: Vec<String> = config
        .split_once(&format!("[routes.{ROUTE}]"))
        .map_or("", |(_, route)| route.trim())
        .lines()
        .map(|line| {
            if line.starts_with("secrets") {
                "secrets = […]".to_owned()
            } else if line.starts_with("secret_access_key") {
                "secret_access_key = \"***\"".to_owned()
            } else if let Some(url) = line.strip_prefix("url = ") {
                format!("url = \"{}\"", outbox::redact::url(url.trim_matches('"')))
            } else {
                line.to_owned()
            }
        })
        .collect();
    println!("{day}: [routes.{ROUTE}] {}", route.join("; "));
    let relay = start_relay(config).await?;
    let events = billing.business_day(day).await;
    let settled = match &events {
        Ok(_) => support::settle(
            &billing.outbox,
            billing.committed.len() as u64,
            Duration::from_secs(60),
        )
        .await
        .map(|_| ()),
        Err(_) => Ok(()),
    };
    relay.stop().await?;
    settled?;
    events
}
