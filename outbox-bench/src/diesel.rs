//! `diesel`: diesel's enqueue on PostgreSQL, against baselines in the same run: a
//! business transaction (one UPDATE) on diesel's `PgConnection` alone, with a raw
//! `INSERT` into the outbox table, and with `outbox-diesel`'s enqueue, at 1 and 4 clients
//! (threads, one connection each); rounds interleaved, medians reported. The figure of
//! merit is the enqueue's added cost over the raw insert's. (What diesel writes, the one
//! relay store drains: the `drain` scenario measures it.)

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering as Atomic};
use std::time::{Duration, Instant};

use diesel::r2d2::{ConnectionManager, Pool};
use diesel::sql_types::{Integer, Text};
use diesel::{Connection, PgConnection, RunQueryDsl};
use outbox_diesel::postgres::PgOutbox as DieselPgOutbox;
use outbox_engine::NewMessage;
use outbox_sqlx::PublishedRows;

use crate::Scale;
use crate::report::{Report, added_cost, enqueue_rows, interleaved_medians};
use crate::setup::{ACCOUNTS, Bench, BoxError};

/// An error that crosses threads (the blocking work's).
type SendError = Box<dyn std::error::Error + Send + Sync>;

fn local(error: SendError) -> BoxError {
    error
}
const MODES: [&str; 3] = ["business only", "+ raw INSERT", "+ diesel enqueue"];
const TABLE: &str = "bench_diesel_outbox";

pub(crate) async fn run(bench: &Bench, scale: Scale, report: &mut Report) -> Result<(), BoxError> {
    enqueue(bench, scale, report).await
}

fn diesel_pool(url: &str, size: u32) -> Result<Pool<ConnectionManager<PgConnection>>, SendError> {
    Ok(Pool::builder()
        .max_size(size)
        .build(ConnectionManager::<PgConnection>::new(url))?)
}

/// diesel's writer on a fresh table, migrated, and a pool of `size` connections.
async fn fresh(
    bench: &Bench,
    size: u32,
) -> Result<(DieselPgOutbox, Pool<ConnectionManager<PgConnection>>), BoxError> {
    sqlx::query(&format!(
        "DROP TABLE IF EXISTS {TABLE}, {TABLE}_keys CASCADE"
    ))
    .execute(&bench.pool)
    .await?;
    let names = outbox_diesel::TableNames::default().outbox(TABLE)?;
    let outbox = DieselPgOutbox::with_names(names).published_rows(PublishedRows::Delete);
    let (url, writer) = (bench.url.clone(), outbox.clone());
    let pool = tokio::task::spawn_blocking(move || -> Result<_, SendError> {
        let pool = diesel_pool(&url, size)?;
        writer.migrate(&mut *pool.get()?)?;
        Ok(pool)
    })
    .await?
    .map_err(local)?;
    Ok((outbox, pool))
}

async fn enqueue(bench: &Bench, scale: Scale, report: &mut Report) -> Result<(), BoxError> {
    bench.fresh_accounts("bench_diesel_accounts").await?;
    let (outbox, diesel) = fresh(bench, 8).await?;
    let mut rows = Vec::new();
    let mut json = serde_json::Map::new();
    for clients in [1usize, 4] {
        let tps = interleaved_medians(MODES.len(), scale.rounds, async |mode| {
            let (outbox, diesel) = (outbox.clone(), diesel.clone());
            let time = scale.enqueue_time;
            tokio::task::spawn_blocking(move || measure(&outbox, &diesel, mode, clients, time))
                .await?
                .map_err(local)
        })
        .await?;
        rows.extend(enqueue_rows(clients, &MODES, &tps));
        let added = added_cost(&tps, 2) / added_cost(&tps, 1).max(f64::EPSILON);
        rows.push(vec![
            clients.to_string(),
            "diesel enqueue / raw INSERT, added cost".to_owned(),
            String::new(),
            format!("{added:.2}"),
            String::new(),
        ]);
        json.insert(
            format!("clients_{clients}"),
            serde_json::json!({ "tps_business": tps[0], "tps_raw": tps[1], "tps_diesel": tps[2], "diesel_over_raw_added_cost": added }),
        );
    }
    sqlx::query("DROP TABLE bench_diesel_accounts")
        .execute(&bench.pool)
        .await?;
    report.section(
        "diesel-enqueue",
        "A business transaction (one UPDATE) on diesel's `PgConnection`, alone, with a raw INSERT into the outbox table, and with `outbox-diesel`'s `enqueue`, each client a thread with its own connection; medians of interleaved rounds. Target: the diesel enqueue's added cost ≤ 1.05 × the raw INSERT's.",
        &["clients", "mode", "tx/s", "vs business only", "added cost per tx"],
        rows,
        serde_json::Value::Object(json),
    );
    Ok(())
}

/// Transactions per second of `mode` with `clients` threads for `time`.
fn measure(
    outbox: &DieselPgOutbox,
    pool: &Pool<ConnectionManager<PgConnection>>,
    mode: usize,
    clients: usize,
    time: Duration,
) -> Result<f64, SendError> {
    let done = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    std::thread::scope(|scope| -> Result<(), SendError> {
        let mut threads = Vec::new();
        for client in 0..clients {
            let (outbox, done) = (outbox.clone(), Arc::clone(&done));
            threads.push(scope.spawn(move || -> Result<(), SendError> {
                let mut conn = pool.get()?;
                let mut n = client as i32;
                while started.elapsed() < time {
                    n = (n + 7919) % ACCOUNTS + 1;
                    conn.transaction(|conn| {
                        diesel::sql_query("UPDATE bench_diesel_accounts SET balance = balance + 1 WHERE id = $1")
                            .bind::<Integer, _>(n)
                            .execute(conn)?;
                        match mode {
                            1 => {
                                // As the sqlx enqueue bench: a UUIDv7 id bound by hand.
                                let id = uuid::Uuid::now_v7();
                                diesel::sql_query(format!(
                                    "INSERT INTO {TABLE} (id, destination, event_type, idempotency_key, payload, content_type, available_at) \
                                     VALUES ($1, 'bench', 'bench.event', $2, $3, 'application/json', now())"
                                ))
                                .bind::<diesel::sql_types::Uuid, _>(id)
                                .bind::<Text, _>(id.to_string())
                                .bind::<diesel::sql_types::Bytea, _>(format!("{{\"n\":{n}}}").into_bytes())
                                .execute(conn)?;
                            }
                            2 => {
                                let message = NewMessage::builder("bench", "bench.event")
                                    .json(&serde_json::json!({ "n": n }))
                                    .build()?;
                                outbox.enqueue(conn, &message)?;
                            }
                            _ => {}
                        }
                        Ok::<_, SendError>(())
                    })?;
                    done.fetch_add(1, Atomic::Relaxed);
                }
                Ok(())
            }));
        }
        for thread in threads {
            thread.join().map_err(|_| "a client thread panicked")??;
        }
        Ok(())
    })?;
    Ok(done.load(Atomic::Relaxed) as f64 / started.elapsed().as_secs_f64())
}
