//! `drain`, `clauses` and `ordered`: how fast a backlog empties.
//!
//! `drain` preloads N messages, then empties the table several ways at the same batch
//! size and worker count: the relay with a no-op sink (delete-on-publish); the raw SQL
//! ceiling (the two statements a lease-based relay needs — claim with `FOR UPDATE SKIP
//! LOCKED`, then batch delete — returning two columns, then every column the relay
//! reads, then the same committed asynchronously as the relay's are); the relay's own
//! two statements run raw; and the peer (`pgmq.read` + `pgmq.delete`). Each drain also
//! reports its CPU per message in this process and in PostgreSQL. `clauses` prices the
//! relay's statements clause by clause with raw loops. `ordered` preloads N
//! messages over 1,000 partition keys and compares the relay with per-key ordering
//! against the same relay unordered.

use std::sync::atomic::Ordering as Atomic;
use std::time::{Duration, Instant};

use outbox_engine::{DeadHead, MessageOrder, NewMessage, Relay};
use outbox_sqlx::PublishedRows;
use outbox_sqlx::postgres::PgOutbox;
use sqlx::{PgPool, Row};

use crate::Scale;
use crate::report::{Report, interleaved, median};
use crate::setup::{Bench, BoxError, Cpu, NoopSink, memory_mib};

/// A drain's rate and the CPU it cost per message, in the benchmark's process (the relay
/// or the raw loop) and in PostgreSQL.
#[derive(Clone, Copy)]
struct Drained {
    rate: f64,
    client_us: f64,
    database_us: f64,
}

impl Drained {
    /// The median of each figure over a drainer's rounds.
    fn median(rounds: &[Self]) -> Self {
        let of = |figure: fn(&Self) -> f64| median(&rounds.iter().map(figure).collect::<Vec<_>>());
        Self {
            rate: of(|d| d.rate),
            client_us: of(|d| d.client_us),
            database_us: of(|d| d.database_us),
        }
    }

    fn measure(n: usize, started: Instant, cpu: Cpu) -> Self {
        let rate = n as f64 / started.elapsed().as_secs_f64();
        let (client_us, database_us) = cpu.per_message_since(n);
        Self {
            rate,
            client_us,
            database_us,
        }
    }
}

const CONFIGS: [(usize, usize); 3] = [(100, 2), (500, 2), (1000, 1)];
/// What `drain` empties the backlog with, in the order of its columns.
const DRAINERS: [&str; 6] = [
    "relay",
    "raw",
    "raw, relay's columns",
    "raw, relay's columns, asynchronous commit",
    "the relay's SQL",
    "pgmq",
];
const KEYS: usize = 1_000;

pub(crate) async fn install_pgmq(pool: &PgPool, queue: &str) -> Result<(), BoxError> {
    let ext = pgmq::PGMQueueExt::new_with_pool(pool.clone()).await;
    ext.install_sql_from_embedded()
        .await
        .map_err(|e| format!("installing pgmq SQL: {e}"))?;
    sqlx::query("SELECT pgmq.drop_queue($1)")
        .bind(queue)
        .execute(pool)
        .await
        .ok();
    sqlx::query("SELECT pgmq.create($1)")
        .bind(queue)
        .execute(pool)
        .await?;
    Ok(())
}

pub(crate) async fn run(
    bench: &Bench,
    scale: Scale,
    report: &mut Report,
    ordered: bool,
) -> Result<(), BoxError> {
    let n = scale.drain_rows;
    let mut rows = Vec::new();
    let mut json = serde_json::Map::new();
    if ordered {
        let (batch, workers) = (500, 2);
        let rates = interleaved(2, scale.rounds, async |mode| {
            let order = if mode == 0 {
                MessageOrder::Unordered
            } else {
                MessageOrder::PerKey(DeadHead::Skip)
            };
            Ok(relay_drain(bench, n, batch, workers, Some(order))
                .await?
                .rate)
        })
        .await?;
        let (unordered, per_key) = (median(&rates[0]), median(&rates[1]));
        rows.push(vec![
            batch.to_string(),
            workers.to_string(),
            "unordered".into(),
            format!("{unordered:.0}"),
            "1.00".into(),
        ]);
        rows.push(vec![
            batch.to_string(),
            workers.to_string(),
            "per-key".into(),
            format!("{per_key:.0}"),
            format!("{:.2}", per_key / unordered),
        ]);
        json.insert("keys".into(), KEYS.into());
        json.insert("unordered_msgs_per_s".into(), unordered.into());
        json.insert("ordered_msgs_per_s".into(), per_key.into());
        json.insert(
            "ordered_over_unordered".into(),
            (per_key / unordered).into(),
        );
        report.section(
            "ordered",
            &format!(
                "Relay drain of {n} messages over {KEYS} partition keys, no-op sink, messages/s, the median of {} interleaved rounds.",
                scale.rounds.max(1)
            ),
            &["batch", "workers", "ordering", "messages/s", "vs unordered"],
            rows,
            serde_json::Value::Object(json),
        );
        return Ok(());
    }
    install_pgmq(&bench.pool, "bench_drain_q").await?;
    let (mut cpu_rows, mut cpu_json) = (Vec::new(), serde_json::Map::new());
    let narrow = RawSql::minimal(LEASE, "t.id, t.payload", false);
    let wide = RawSql::minimal(LEASE, RELAY_COLUMNS, false);
    let wide_async = RawSql::minimal(LEASE, RELAY_COLUMNS, true);
    let relay_sql = RawSql::relay();
    for (batch, workers) in CONFIGS {
        let samples = interleaved(
            DRAINERS.len(),
            scale.rounds,
            async |drainer| match drainer {
                0 => relay_drain(bench, n, batch, workers, None).await,
                1 => raw_drain(bench, n, batch, workers, &narrow).await,
                2 => raw_drain(bench, n, batch, workers, &wide).await,
                3 => raw_drain(bench, n, batch, workers, &wide_async).await,
                4 => raw_drain(bench, n, batch, workers, &relay_sql).await,
                _ => pgmq_drain(bench, n, batch, workers).await,
            },
        )
        .await?;
        let medians: Vec<Drained> = samples.iter().map(|s| Drained::median(s)).collect();
        let [relay, raw, raw_wide, raw_async, raw_relay, peer] = medians[..] else {
            unreachable!("one median per drainer")
        };
        let (peak, _) = memory_mib();
        let ratio = |of: Drained| format!("{:.2}", relay.rate / of.rate);
        rows.push(vec![
            batch.to_string(),
            workers.to_string(),
            format!("{:.0}", relay.rate),
            format!("{:.0}", raw.rate),
            ratio(raw),
            format!("{:.0}", raw_wide.rate),
            ratio(raw_wide),
            format!("{:.0}", raw_async.rate),
            ratio(raw_async),
            format!("{:.0}", raw_relay.rate),
            ratio(raw_relay),
            format!("{:.0}", peer.rate),
            ratio(peer),
            format!("{peak:.0}"),
        ]);
        let mut cpu = serde_json::Map::new();
        for ((name, drained), rounds) in DRAINERS.iter().zip(&medians).zip(&samples) {
            cpu_rows.push(vec![
                batch.to_string(),
                workers.to_string(),
                (*name).to_owned(),
                format!("{:.0}", drained.rate),
                format!("{:.1}", drained.client_us),
                format!("{:.1}", drained.database_us),
            ]);
            let rates: Vec<f64> = rounds.iter().map(|d| d.rate).collect();
            cpu.insert(
                (*name).to_owned(),
                serde_json::json!({ "msgs_per_s": drained.rate, "msgs_per_s_rounds": rates, "client_cpu_us_per_msg": drained.client_us, "database_cpu_us_per_msg": drained.database_us }),
            );
        }
        json.insert(
            format!("b{batch}_w{workers}"),
            serde_json::json!({ "relay": relay.rate, "raw": raw.rate, "relay_over_raw": relay.rate / raw.rate, "raw_relay_columns": raw_wide.rate, "relay_over_raw_relay_columns": relay.rate / raw_wide.rate, "raw_relay_columns_async": raw_async.rate, "relay_over_raw_relay_columns_async": relay.rate / raw_async.rate, "raw_relay_statements": raw_relay.rate, "relay_over_raw_relay_statements": relay.rate / raw_relay.rate, "pgmq": peer.rate, "relay_over_pgmq": relay.rate / peer.rate, "peak_rss_mib": peak }),
        );
        cpu_json.insert(format!("b{batch}_w{workers}"), cpu.into());
    }
    report.section(
        "drain",
        &format!("Emptying a backlog of {n} messages, messages/s, the median of {} rounds; each round runs every drainer in turn, starting at a different one. Raw = claim with SKIP LOCKED + batch delete, no application logic, returning id and payload; *raw, relay's columns* is the same SQL returning every column the relay reads (what a real relay must fetch), which splits the gap into data and relay logic; *async* is that SQL committed without waiting for the WAL flush, as the relay's unordered claims and its completions are (decision 0049); *the relay's SQL* runs the relay's own claim and fenced delete with nothing around them, which splits the rest into statements and client work. Peak RSS is the whole benchmark process.", scale.rounds.max(1)),
        &["batch", "workers", "relay", "raw SQL", "relay / raw", "raw, relay's columns", "relay / that", "async", "relay / that", "the relay's SQL", "relay / that", "pgmq", "relay / pgmq", "peak RSS MiB"],
        rows,
        serde_json::Value::Object(json),
    );
    report.section(
        "drain-cpu",
        "Where a drain's time goes: CPU per message in the benchmark's process (the relay, or the loop running raw SQL) and in every PostgreSQL process, over the drains above (medians of the rounds). The two share 2 cores, so CPU the relay spends is CPU the database does not get.",
        &["batch", "workers", "drained by", "messages/s", "client CPU µs/msg", "database CPU µs/msg"],
        cpu_rows,
        serde_json::Value::Object(cpu_json),
    );
    Ok(())
}

/// `scale`: the same backlog drained by 1, 2 and 4 independent relays (each its own
/// pool, one worker, batch 500) sharing one table with no coordinator.
pub(crate) async fn scale(
    bench: &Bench,
    scale: Scale,
    report: &mut Report,
) -> Result<(), BoxError> {
    let n = scale.drain_rows;
    let mut rows = Vec::new();
    let mut json = serde_json::Map::new();
    let mut single = 0.0;
    for relays in [1usize, 2, 4] {
        let outbox = bench
            .fresh_outbox("bench_scale_outbox", PublishedRows::Delete)
            .await?;
        preload(&outbox, &bench.pool, n, false).await?;
        let sink = NoopSink::default();
        let mut running = Vec::new();
        for i in 0..relays {
            let pool = sqlx::postgres::PgPoolOptions::new()
                .max_connections(3)
                .connect(&bench.url)
                .await?;
            let own = outbox_sqlx::postgres::PgOutbox::with_names(pool, outbox.names().clone())
                .published_rows(PublishedRows::Delete);
            let relay = Relay::builder(own)
                .owner(format!("bench-scale-{i}"))
                .route("bench", sink.clone())
                .batch_size(500)
                .poll_interval(Duration::from_millis(20))
                .build()?;
            let count = sink.count.clone();
            running.push(tokio::spawn(relay.run(async move {
                while count.load(Atomic::Relaxed) < n {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            })));
        }
        let started = Instant::now();
        for r in running {
            r.await?;
        }
        let rate = n as f64 / started.elapsed().as_secs_f64();
        if relays == 1 {
            single = rate;
        }
        rows.push(vec![
            relays.to_string(),
            format!("{rate:.0}"),
            format!("{:.2}", rate / single),
        ]);
        json.insert(format!("relays_{relays}"), rate.into());
    }
    report.section(
        "scale",
        &format!("{n} messages drained by independent relays sharing one table (no coordinator), each with its own pool, one worker, batch 500, no-op sink; messages/s. The database runs on the same 2 cores."),
        &["relays", "messages/s", "vs one relay"],
        rows,
        serde_json::Value::Object(json),
    );
    Ok(())
}

pub(crate) async fn preload(
    outbox: &PgOutbox,
    pool: &PgPool,
    n: usize,
    keyed: bool,
) -> Result<(), BoxError> {
    for start in (0..n).step_by(1000) {
        let messages: Vec<NewMessage> = (start..(start + 1000).min(n))
            .map(|i| {
                let b = NewMessage::builder("bench", "bench.event")
                    .json(&serde_json::json!({ "n": i }));
                let b = if keyed {
                    b.partition_key(format!("key-{}", i % KEYS))
                } else {
                    b
                };
                b.build().expect("valid")
            })
            .collect();
        let mut tx = pool.begin().await?;
        outbox.enqueue_all(&mut tx, &messages).await?;
        tx.commit().await?;
    }
    sqlx::query("VACUUM ANALYZE").execute(pool).await.ok();
    Ok(())
}

/// Drains with the relay; `ordering` None means an unkeyed backlog, unordered.
async fn relay_drain(
    bench: &Bench,
    n: usize,
    batch: usize,
    workers: usize,
    ordering: Option<MessageOrder>,
) -> Result<Drained, BoxError> {
    let outbox = bench.fresh_outbox(TABLE, PublishedRows::Delete).await?;
    preload(&outbox, &bench.pool, n, ordering.is_some()).await?;
    let sink = NoopSink::default();
    let relay = Relay::builder(outbox)
        .route("bench", sink.clone())
        .batch_size(batch)
        .concurrency(workers)
        .poll_interval(Duration::from_millis(20))
        .ordering(ordering.unwrap_or_default())
        .build()?;
    let count = sink.count.clone();
    let (cpu, started) = (Cpu::now(), Instant::now());
    relay
        .run(async move {
            while count.load(Atomic::Relaxed) < n {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
    Ok(Drained::measure(n, started, cpu))
}

/// The two statements a raw drain runs: a claim that takes the batch size, the lease
/// owner, the lease token and the lease in milliseconds (as the relay's does), and a
/// delete that takes the token and the claimed ids. Statements that need fewer parameters
/// cast the ones they ignore, so each is prepared with the same types.
struct RawSql {
    claim: String,
    delete: String,
}

/// The table every drain empties.
const TABLE: &str = "bench_drain_outbox";
/// The columns the relay reads from a claimed row, in its order.
const RELAY_COLUMNS: &str = "t.id, t.destination, t.event_type, t.aggregate_type, t.aggregate_id, t.partition_key, t.tenant_id, t.idempotency_key, t.payload, t.content_type, t.headers::text AS headers, t.attempts, t.created_at";

impl RawSql {
    /// The least a lease-based drain runs: claim with `FOR UPDATE SKIP LOCKED`, setting
    /// `set` and returning `columns`, then delete by id; both committed asynchronously
    /// with `asynchronous`.
    fn minimal(set: &str, columns: &str, asynchronous: bool) -> Self {
        let commit = if asynchronous {
            outbox_sql::postgres::COMMIT_ASYNC
        } else {
            ""
        };
        Self {
            claim: format!(
                "UPDATE {TABLE} t SET {set} \
                 WHERE t.id = ANY(ARRAY(SELECT id FROM {TABLE} WHERE status IN ('pending', 'leased') AND available_at <= now() \
                 ORDER BY available_at, id LIMIT $1 FOR UPDATE SKIP LOCKED)) AND $2::text IS NOT NULL{commit} RETURNING {columns}"
            ),
            delete: format!(
                "DELETE FROM {TABLE} WHERE id = ANY($2) AND $1::uuid IS NOT NULL{commit}"
            ),
        }
    }

    /// The relay's own claim and fenced delete, as it binds them.
    fn relay() -> Self {
        let relay = relay_statements();
        Self {
            claim: relay.claim,
            delete: relay.delete_published,
        }
    }
}

/// The lease a minimal claim takes: status, token and deadline.
const LEASE: &str =
    "status = 'leased', lease_token = $3, available_at = now() + $4 * interval '1 millisecond'";

fn relay_statements() -> outbox_sql::postgres::Statements {
    let names = outbox_sql::TableNames::default()
        .outbox(TABLE)
        .expect("a valid table name");
    outbox_sql::postgres::Statements::new(&names)
}

async fn raw_drain(
    bench: &Bench,
    n: usize,
    batch: usize,
    workers: usize,
    sql: &RawSql,
) -> Result<Drained, BoxError> {
    let outbox = bench.fresh_outbox(TABLE, PublishedRows::Delete).await?;
    preload(&outbox, &bench.pool, n, false).await?;
    let (cpu, started) = (Cpu::now(), Instant::now());
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..workers {
        let (pool, claim, delete) = (bench.pool.clone(), sql.claim.clone(), sql.delete.clone());
        tasks.spawn(async move {
            loop {
                let token = uuid::Uuid::new_v4();
                let claimed = sqlx::query(&claim)
                    .bind(batch as i64)
                    .bind("bench-raw")
                    .bind(token)
                    .bind(30_000_i64)
                    .fetch_all(&pool)
                    .await?;
                if claimed.is_empty() {
                    return Ok::<(), sqlx::Error>(());
                }
                let ids: Vec<uuid::Uuid> = claimed.iter().map(|r| r.get(0)).collect();
                sqlx::query(&delete)
                    .bind(token)
                    .bind(ids)
                    .fetch_all(&pool)
                    .await?;
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    Ok(Drained::measure(n, started, cpu))
}

async fn pgmq_drain(
    bench: &Bench,
    n: usize,
    batch: usize,
    workers: usize,
) -> Result<Drained, BoxError> {
    let pool = &bench.pool;
    sqlx::query("SELECT pgmq.purge_queue('bench_drain_q')")
        .execute(pool)
        .await?;
    for start in (0..n).step_by(1000) {
        let msgs: Vec<String> = (start..(start + 1000).min(n))
            .map(|i| serde_json::json!({ "n": i }).to_string())
            .collect();
        sqlx::query("SELECT pgmq.send_batch('bench_drain_q', $1::jsonb[])")
            .bind(msgs)
            .execute(pool)
            .await?;
    }
    sqlx::query("VACUUM ANALYZE").execute(pool).await.ok();
    let (cpu, started) = (Cpu::now(), Instant::now());
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..workers {
        let pool = pool.clone();
        tasks.spawn(async move {
            loop {
                let ids: Vec<i64> =
                    sqlx::query_scalar("SELECT msg_id FROM pgmq.read('bench_drain_q', 30, $1)")
                        .bind(batch as i32)
                        .fetch_all(&pool)
                        .await?;
                if ids.is_empty() {
                    return Ok::<(), sqlx::Error>(());
                }
                sqlx::query("SELECT pgmq.delete('bench_drain_q', $1::bigint[])")
                    .bind(ids)
                    .execute(&pool)
                    .await?;
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    Ok(Drained::measure(n, started, cpu))
}

/// `clauses`: what each clause of the relay's two statements costs, found by draining the
/// same backlog with raw loops that add the clauses one at a time (interleaved rounds,
/// medians), all committed asynchronously as the relay's statements are.
pub(crate) async fn clauses(
    bench: &Bench,
    scale: Scale,
    report: &mut Report,
) -> Result<(), BoxError> {
    let owned = format!(
        "{LEASE}, lease_owner = $2, lease_until = now() + $4 * interval '1 millisecond', attempts = t.attempts + 1"
    );
    let stamped = format!(
        "{owned}, committed_at = COALESCE(t.committed_at, CASE WHEN (SELECT current_setting('track_commit_timestamp') = 'on') THEN pg_xact_commit_timestamp(t.xmin) END)"
    );
    let waited = format!(
        "{RELAY_COLUMNS}, CAST(date_part('epoch', now() - COALESCE(t.committed_at, t.created_at)) * 1000 AS bigint) AS waited_ms, CAST(CASE WHEN t.committed_at IS NULL THEN 0 ELSE 1 END AS bigint) AS from_commit"
    );
    let relay = relay_statements();
    let with_delete = |claim: RawSql, delete: &str| RawSql {
        claim: claim.claim,
        delete: delete.to_owned(),
    };
    let fenced = format!(
        "DELETE FROM {TABLE} WHERE id = ANY($2) AND status = 'leased' AND lease_token = $1{}",
        outbox_sql::postgres::COMMIT_ASYNC
    );
    let drainers: [(&str, RawSql); 7] = [
        (
            "claim, delete (the baseline)",
            RawSql::minimal(LEASE, RELAY_COLUMNS, true),
        ),
        (
            "+ lease owner, expiry, attempt",
            RawSql::minimal(&owned, RELAY_COLUMNS, true),
        ),
        (
            "+ commit time stamped",
            RawSql::minimal(&stamped, RELAY_COLUMNS, true),
        ),
        ("+ wait returned", RawSql::minimal(&stamped, &waited, true)),
        (
            "baseline claim, delete fenced by the token",
            with_delete(RawSql::minimal(LEASE, RELAY_COLUMNS, true), &fenced),
        ),
        (
            "baseline claim, the relay's delete (fenced, reporting)",
            with_delete(
                RawSql::minimal(LEASE, RELAY_COLUMNS, true),
                &relay.delete_published,
            ),
        ),
        ("the relay's claim and delete", RawSql::relay()),
    ];
    let n = scale.drain_rows;
    // A clause costs a few percent: thrice the usual rounds, for medians that hold still.
    let rounds = scale.rounds.max(1) * 3;
    let mut rows = Vec::new();
    let mut json = serde_json::Map::new();
    for (batch, workers) in [(500, 2), (1000, 1)] {
        let samples = interleaved(drainers.len(), rounds, async |d| {
            raw_drain(bench, n, batch, workers, &drainers[d].1).await
        })
        .await?;
        let medians: Vec<Drained> = samples.iter().map(|s| Drained::median(s)).collect();
        let base = medians[0];
        let mut figures = serde_json::Map::new();
        for ((name, _), (drained, rounds)) in drainers.iter().zip(medians.iter().zip(&samples)) {
            rows.push(vec![
                batch.to_string(),
                workers.to_string(),
                (*name).to_owned(),
                format!("{:.0}", drained.rate),
                format!("{:.2}", drained.rate / base.rate),
                format!("{:.1}", drained.database_us),
                format!("{:+.1}", drained.database_us - base.database_us),
            ]);
            let rates: Vec<f64> = rounds.iter().map(|d| d.rate).collect();
            figures.insert(
                (*name).to_owned(),
                serde_json::json!({ "msgs_per_s": drained.rate, "msgs_per_s_rounds": rates, "over_baseline": drained.rate / base.rate, "database_cpu_us_per_msg": drained.database_us, "client_cpu_us_per_msg": drained.client_us }),
            );
        }
        json.insert(format!("b{batch}_w{workers}"), figures.into());
    }
    report.section(
        "clauses",
        &format!("A backlog of {n} messages emptied by raw loops (claim with SKIP LOCKED, then delete; no decoding), each adding one clause of the relay's statements to the baseline, all committed asynchronously: messages/s and PostgreSQL's CPU per message, the median of {} rounds; each round runs every loop in turn, starting at a different one. The first four add the claim's clauses cumulatively; the next two change the delete alone; the last is the relay's two statements.", rounds),
        &["batch", "workers", "statements", "messages/s", "/ baseline", "database CPU µs/msg", "against the baseline"],
        rows,
        serde_json::Value::Object(json),
    );
    Ok(())
}
