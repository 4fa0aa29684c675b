//! What the workload examples share: finding the servers, fresh table names, cleaning up,
//! running a relay in the background and waiting for it to finish its work.

use std::time::Duration;

use outbox::amqp::client as amqp;
use outbox::kafka::client as kafka;
use outbox::redis::client as redis;
use outbox::{DestinationStats, StoreStats};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use tokio::task::JoinHandle;

/// The error type of the examples.
pub(crate) type Error = Box<dyn std::error::Error + Send + Sync>;

const POSTGRES_VAR: &str = "OUTBOX_TEST_POSTGRES_URL";
const POSTGRES_DEFAULT: &str = "postgres://postgres@127.0.0.1:5432/test";
const REDIS_VAR: &str = "OUTBOX_TEST_REDIS_URL";
const REDIS_DEFAULT: &str = "redis://127.0.0.1:6379/";
const AMQP_VAR: &str = "OUTBOX_TEST_AMQP_URL";
const AMQP_DEFAULT: &str = "amqp://guest:guest@127.0.0.1:5672/outbox-test";
const KAFKA_VAR: &str = "OUTBOX_TEST_KAFKA_BROKERS";
const KAFKA_DEFAULT: &str = "127.0.0.1:9092";
const SQS_VAR: &str = "OUTBOX_TEST_SQS_ENDPOINT";
const SQS_DEFAULT: &str = "http://127.0.0.1:4566";

/// The SSRF guard of the HTTP sink refuses private and loopback addresses unless an
/// endpoint allows them. Every example talks to servers on loopback, so it allows this.
pub(crate) const LOOPBACK: &str = "127.0.0.1/32";

/// The PostgreSQL URL: `OUTBOX_TEST_POSTGRES_URL`, or the one `scripts/services.sh` sets up.
pub(crate) fn postgres_url() -> String {
    std::env::var(POSTGRES_VAR).unwrap_or_else(|_| POSTGRES_DEFAULT.to_owned())
}

/// The Redis URL: `OUTBOX_TEST_REDIS_URL`, or the one `scripts/services.sh` sets up.
pub(crate) fn redis_url() -> String {
    std::env::var(REDIS_VAR).unwrap_or_else(|_| REDIS_DEFAULT.to_owned())
}

/// The error for a server that did not answer at `url` (`var` names the setting, the
/// server is `what`): the cause, and how to start one.
fn not_reachable(
    server: &str,
    url: &str,
    var: &str,
    what: &str,
    e: &dyn std::fmt::Display,
) -> Error {
    format!(
        "{server} is not reachable at {} ({e}). Start it with `scripts/services.sh`, \
         or point {var} at {what}.",
        outbox::redact::url(url)
    )
    .into()
}

/// Connects to PostgreSQL, or fails with a message that says how to start it.
pub(crate) async fn postgres() -> Result<PgPool, Error> {
    let url = postgres_url();
    PgPoolOptions::new()
        .max_connections(8)
        .acquire_timeout(Duration::from_secs(10))
        .connect(&url)
        .await
        .map_err(|e| not_reachable("PostgreSQL", &url, POSTGRES_VAR, "a server", &e))
}

/// Connects to Redis, or fails with a message that says how to start it.
pub(crate) async fn redis() -> Result<redis::aio::MultiplexedConnection, Error> {
    let url = redis_url();
    let missing =
        |e: &dyn std::fmt::Display| not_reachable("Redis", &url, REDIS_VAR, "a server", e);
    let client = redis::Client::open(url.as_str()).map_err(|e| missing(&e))?;
    match tokio::time::timeout(
        Duration::from_secs(5),
        client.get_multiplexed_async_connection(),
    )
    .await
    {
        Ok(Ok(conn)) => Ok(conn),
        Ok(Err(e)) => Err(missing(&e)),
        Err(_) => Err(missing(&"no answer within 5 s")),
    }
}

/// The RabbitMQ URL: `OUTBOX_TEST_AMQP_URL`, or the one `scripts/services.sh` sets up.
pub(crate) fn amqp_url() -> String {
    std::env::var(AMQP_VAR).unwrap_or_else(|_| AMQP_DEFAULT.to_owned())
}

/// Connects to RabbitMQ and opens a channel, or fails with a message that says how to
/// start it.
pub(crate) async fn amqp() -> Result<(amqp::Connection, amqp::Channel), Error> {
    let url = amqp_url();
    let missing =
        |e: &dyn std::fmt::Display| not_reachable("RabbitMQ", &url, AMQP_VAR, "a broker", e);
    let connect = amqp::Connection::connect(&url, amqp::ConnectionProperties::default());
    let connection = match tokio::time::timeout(Duration::from_secs(5), connect).await {
        Ok(Ok(connection)) => connection,
        Ok(Err(e)) => return Err(missing(&e)),
        Err(_) => return Err(missing(&"no answer within 5 s")),
    };
    let channel = connection.create_channel().await?;
    Ok((connection, channel))
}

/// The Kafka brokers: `OUTBOX_TEST_KAFKA_BROKERS`, or the one `scripts/services.sh` starts.
pub(crate) fn kafka_brokers() -> String {
    std::env::var(KAFKA_VAR).unwrap_or_else(|_| KAFKA_DEFAULT.to_owned())
}

/// Creates `topic` (the operator's job; the sink creates none), or fails with a message
/// that says how to start a broker.
pub(crate) async fn kafka_topic(topic: &str, partitions: i32) -> Result<(), Error> {
    use kafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    let brokers = kafka_brokers();
    let admin: AdminClient<kafka::client::DefaultClientContext> = kafka::ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .create()?;
    if let Err(e) = admin.inner().fetch_metadata(None, Duration::from_secs(5)) {
        return Err(format!(
            "Kafka is not reachable at {brokers} ({e}). Start it with `scripts/services.sh`, \
             or point {KAFKA_VAR} at a broker."
        )
        .into());
    }
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
    for result in admin.create_topics([&new], &options).await? {
        result.map_err(|(topic, code)| format!("create topic {topic}: {code}"))?;
    }
    Ok(())
}

/// The SQS endpoint: `OUTBOX_TEST_SQS_ENDPOINT`, or the emulator `scripts/services.sh`
/// starts (moto, which takes any credentials).
pub(crate) fn sqs_endpoint() -> String {
    std::env::var(SQS_VAR).unwrap_or_else(|_| SQS_DEFAULT.to_owned())
}

/// A client for the SQS endpoint, with the emulator's test credentials.
pub(crate) fn sqs_client() -> outbox::sqs::client::Client {
    use outbox::sqs::client::config::{BehaviorVersion, Credentials, Region};
    let config = outbox::sqs::client::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .endpoint_url(sqs_endpoint())
        .credentials_provider(Credentials::new("test", "test", None, None, "example"))
        .build();
    outbox::sqs::client::Client::from_conf(config)
}

/// Creates the FIFO queue `name` (the operator's job; the sink creates none) and returns
/// its URL, or fails with a message that says how to start an emulator.
pub(crate) async fn sqs_fifo_queue(name: &str) -> Result<String, Error> {
    use outbox::sqs::client::types::QueueAttributeName;
    let create = sqs_client()
        .create_queue()
        .queue_name(name)
        .attributes(QueueAttributeName::FifoQueue, "true")
        .send();
    match tokio::time::timeout(Duration::from_secs(10), create).await {
        Ok(Ok(created)) => Ok(created.queue_url().unwrap_or_default().to_owned()),
        Ok(Err(e)) => Err(format!(
            "SQS is not reachable at {} ({}). Start the emulator with `scripts/services.sh`, \
             or point {SQS_VAR} at one.",
            sqs_endpoint(),
            outbox::sqs::client::error::DisplayErrorContext(e)
        )
        .into()),
        Err(_) => Err(format!("SQS at {} did not answer within 10 s", sqs_endpoint()).into()),
    }
}

/// Deletes the SQS queue `name` if it is there.
pub(crate) async fn delete_sqs_queue(name: &str) -> Result<(), Error> {
    let client = sqs_client();
    let Ok(found) = client.get_queue_url().queue_name(name).send().await else {
        return Ok(());
    };
    client
        .delete_queue()
        .set_queue_url(found.queue_url().map(str::to_owned))
        .send()
        .await?;
    Ok(())
}

/// `prefix_<12 hex digits>`: a table, stream or key name no other run uses.
pub(crate) fn fresh(prefix: &str) -> String {
    let hex = uuid::Uuid::new_v4().simple().to_string();
    format!("{prefix}_{}", &hex[..12])
}

/// Drops an outbox table created by `PgOutbox::migrate`, with what per-key ordering adds
/// beside it (the key counter table and the numbering function), and forgets its
/// migration records.
pub(crate) async fn drop_outbox(pool: &PgPool, table: &str) -> Result<(), Error> {
    for statement in [
        format!("DROP TABLE IF EXISTS \"{table}\", \"{table}_keys\""),
        format!("DROP FUNCTION IF EXISTS \"{table}_assign_seq\"()"),
    ] {
        sqlx::query(&statement).execute(pool).await?;
    }
    forget_migrations(pool, table).await
}

/// Drops an inbox table created by `PgInbox::migrate` and forgets its migration records.
pub(crate) async fn drop_inbox(pool: &PgPool, table: &str) -> Result<(), Error> {
    sqlx::query(&format!("DROP TABLE IF EXISTS \"{table}\""))
        .execute(pool)
        .await?;
    forget_migrations(pool, table).await
}

async fn forget_migrations(pool: &PgPool, table: &str) -> Result<(), Error> {
    sqlx::query("DELETE FROM outbox_migrations WHERE id LIKE $1")
        .bind(format!("{table}/%"))
        .execute(pool)
        .await?;
    Ok(())
}

/// Deletes a stream and the dedupe keys the Redis sink set for it (they would expire on
/// their own after the dedupe window): `outbox:dedupe:<stream length>:<stream>:<key>`.
pub(crate) async fn delete_stream(
    conn: &mut redis::aio::MultiplexedConnection,
    stream: &str,
) -> Result<(), Error> {
    let pattern = format!("outbox:dedupe:{}:{stream}:*", stream.len());
    let mut keys = vec![stream.to_owned()];
    let mut cursor = 0_u64;
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(conn)
            .await?;
        keys.extend(batch);
        if next == 0 {
            break;
        }
        cursor = next;
    }
    let _: i64 = redis::cmd("DEL").arg(&keys).query_async(conn).await?;
    Ok(())
}

/// Drops plain tables.
pub(crate) async fn drop_tables(pool: &PgPool, tables: &[&str]) -> Result<(), Error> {
    for table in tables {
        sqlx::query(&format!("DROP TABLE IF EXISTS \"{table}\""))
            .execute(pool)
            .await?;
    }
    Ok(())
}

/// Waits until nothing is pending or leased and exactly `finished` rows are published or
/// dead; returns the totals.
pub(crate) async fn settle(
    store: &impl StoreStats,
    finished: u64,
    limit: Duration,
) -> Result<DestinationStats, Error> {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let total = store.stats().await?.total();
        if total.backlog() == 0 && total.published + total.dead == finished {
            return Ok(total);
        }
        if tokio::time::Instant::now() > deadline {
            return Err(format!(
                "the relay did not finish within {limit:?}: expected {finished} published or dead rows, have {total:?}"
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Serves `router` on a fresh loopback port; returns `http://127.0.0.1:<port>` and the
/// server task (abort it to stop the server).
pub(crate) async fn serve(router: axum::Router) -> Result<(String, JoinHandle<()>), Error> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    let task = tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, router).await {
            eprintln!("server stopped: {error}");
        }
    });
    Ok((base, task))
}

/// The first `n` characters of `text`, with `…` when cut.
pub(crate) fn clip(text: &str, n: usize) -> String {
    let mut chars = text.chars();
    let head: String = chars.by_ref().take(n).collect();
    if chars.next().is_some() {
        format!("{head}…")
    } else {
        head
    }
}
