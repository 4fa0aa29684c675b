//! `enqueue`: a business transaction (one UPDATE) alone, with an SDK enqueue, with a raw
//! SQL INSERT into the same table, with a keyed (ordered) SDK enqueue, and with the peer
//! (`pgmq.send`), at several client counts. Modes are interleaved round by round and the
//! median is reported, so slow drifts of the machine hit every mode alike.

use std::time::Instant;

use outbox_engine::NewMessage;
use outbox_sqlx::PublishedRows;
use outbox_sqlx::postgres::PgOutbox;
use sqlx::PgPool;

use crate::Scale;
use crate::report::{Report, added_cost, enqueue_rows, interleaved_medians};
use crate::setup::{ACCOUNTS, Bench, BoxError};

static SDK_INSERT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
const MODES: [&str; 6] = [
    "business only",
    "+ raw INSERT",
    "+ SDK enqueue",
    "+ SDK enqueue, keyed",
    "+ pgmq.send",
    "+ the SDK's INSERT, bound by hand",
];

pub(crate) async fn run(bench: &Bench, scale: Scale, report: &mut Report) -> Result<(), BoxError> {
    let pool = &bench.pool;
    bench.fresh_accounts("bench_accounts").await?;
    let outbox = bench
        .fresh_outbox("bench_enqueue_outbox", PublishedRows::Keep)
        .await?;
    crate::drain::install_pgmq(pool, "bench_enqueue_q").await?;

    let mut rows = Vec::new();
    let mut json = serde_json::Map::new();
    for clients in [1usize, 4] {
        let tps = interleaved_medians(MODES.len(), scale.rounds, async |mode| {
            measure(pool, &outbox, mode, clients, scale).await
        })
        .await?;
        rows.extend(enqueue_rows(clients, &MODES, &tps));
        let sdk_vs_raw = tps[1] / tps[2];
        let cost_ratio = added_cost(&tps, 2) / added_cost(&tps, 1).max(f64::EPSILON);
        json.insert(
            format!("clients_{clients}"),
            serde_json::json!({
                "tps_business": tps[0], "tps_raw": tps[1], "tps_sdk": tps[2], "tps_sdk_keyed": tps[3], "tps_pgmq": tps[4], "tps_sdk_statement_by_hand": tps[5],
                "sdk_over_raw_time": sdk_vs_raw, "sdk_over_raw_added_cost": cost_ratio,
                "keyed_over_sdk_time": tps[2] / tps[3],
            }),
        );
    }
    report.section(
        "enqueue",
        "Business transaction (one UPDATE) with and without an outbox write, tx/s (median of rounds; each round starts at a different mode, so position effects cancel). \
         *Added cost* is the extra time per transaction over the business-only run, per client.",
        &["clients", "transaction", "tx/s", "vs business only", "added cost"],
        rows,
        serde_json::Value::Object(json),
    );
    Ok(())
}

async fn measure(
    pool: &PgPool,
    outbox: &PgOutbox,
    mode: usize,
    clients: usize,
    scale: Scale,
) -> Result<f64, BoxError> {
    let started = Instant::now();
    let deadline = started + scale.enqueue_time;
    let mut tasks = tokio::task::JoinSet::new();
    for client in 0..clients {
        let (pool, outbox) = (pool.clone(), outbox.clone());
        tasks.spawn(async move {
            let mut done = 0u64;
            let mut n = client as i32;
            while Instant::now() < deadline {
                n = n.wrapping_mul(1_103_515_245).wrapping_add(12_345) & 0x7fff_ffff;
                let account = n % ACCOUNTS + 1;
                one_transaction(&pool, &outbox, mode, account).await?;
                done += 1;
            }
            Ok::<u64, sqlx::Error>(done)
        });
    }
    let mut total = 0;
    while let Some(done) = tasks.join_next().await {
        total += done??;
    }
    Ok(total as f64 / started.elapsed().as_secs_f64())
}

async fn one_transaction(
    pool: &PgPool,
    outbox: &PgOutbox,
    mode: usize,
    account: i32,
) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin().await?;
    sqlx::query("UPDATE bench_accounts SET balance = balance + 1 WHERE id = $1")
        .bind(account)
        .execute(&mut *tx)
        .await?;
    let payload = serde_json::json!({ "account": account, "delta": 1 });
    match mode {
        0 => {}
        1 => {
            let id = uuid::Uuid::now_v7();
            sqlx::query(
                "INSERT INTO bench_enqueue_outbox (id, destination, event_type, idempotency_key, payload, content_type, available_at) \
                 VALUES ($1, 'accounts', 'account.credited', $2, $3, 'application/json', now())",
            )
            .bind(id)
            .bind(id.to_string())
            .bind(serde_json::to_vec(&payload).expect("json"))
            .execute(&mut *tx)
            .await?;
        }
        2 | 3 => {
            let mut builder = NewMessage::builder("accounts", "account.credited").json(&payload);
            if mode == 3 {
                builder = builder.partition_key(format!("account-{}", account % 1000));
            }
            let message = builder.build().expect("valid message");
            outbox
                .enqueue(&mut tx, &message)
                .await
                .map_err(|e| sqlx::Error::Protocol(e.to_string()))?;
        }
        5 => {
            // The exact statement and binds the SDK sends, without the message builder:
            // separates the statement's cost from the SDK's client-side work.
            let id = uuid::Uuid::now_v7();
            sqlx::query(SDK_INSERT.get_or_init(|| {
                outbox_sql::postgres::Statements::new(
                    &outbox_sql::TableNames::default()
                        .outbox("bench_enqueue_outbox")
                        .expect("name"),
                )
                .insert
            }))
            .bind(id)
            .bind("accounts")
            .bind("account.credited")
            .bind(None::<String>)
            .bind(None::<String>)
            .bind(None::<String>)
            .bind(None::<String>)
            .bind(id.to_string())
            .bind(serde_json::to_vec(&payload).expect("json"))
            .bind("application/json")
            .bind("{}")
            .bind(None::<chrono::DateTime<chrono::Utc>>)
            .bind(0_i64)
            .execute(&mut *tx)
            .await?;
        }
        _ => {
            sqlx::query("SELECT pgmq.send('bench_enqueue_q', $1::jsonb)")
                .bind(payload.to_string())
                .execute(&mut *tx)
                .await?;
        }
    }
    tx.commit().await
}
