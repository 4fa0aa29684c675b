//! Shared test helpers: where the servers are, fresh table names, message factories.
#![allow(dead_code, unreachable_pub, unused_imports)]

use outbox_engine::NewMessage;

pub use outbox_test_support::{no_server, server_url as url};

#[cfg(feature = "postgres")]
pub mod relay_process;

/// A table name no other test uses.
pub fn fresh_table(prefix: &str) -> String {
    format!("{prefix}_{:016x}", fastrand::u64(..))
}

/// A test's retry policy: backoffs from `initial_ms` up to `max_ms` milliseconds (chain
/// `.max_attempts(n)`).
pub fn backoff_ms(initial_ms: u64, max_ms: u64) -> outbox_engine::RetryPolicy {
    outbox_engine::RetryPolicy::exponential(
        std::time::Duration::from_millis(initial_ms),
        std::time::Duration::from_millis(max_ms),
    )
}

/// A small JSON message for `destination`.
pub fn message(destination: &str, n: u64) -> NewMessage {
    NewMessage::builder(destination, "test.event")
        .json(&serde_json::json!({ "n": n }))
        .build()
        .expect("valid message")
}

/// A row as another program writes it, straight into the table: its id and its `headers`
/// column text.
pub struct ForeignRow {
    pub id: String,
    pub headers: String,
}

/// `n` rows for destination `orders` with empty headers, except `poison` (index → headers
/// text) which the relay cannot read.
pub fn foreign_rows(n: usize, poison: &[(usize, &str)]) -> Vec<ForeignRow> {
    (0..n)
        .map(|i| ForeignRow {
            id: outbox_engine::MessageId::new().to_string(),
            headers: poison
                .iter()
                .find(|(at, _)| *at == i)
                .map_or("{}", |(_, headers)| headers)
                .to_owned(),
        })
        .collect()
}

/// The relay publishes every readable row and dead-letters each unreadable one alone, with
/// a reason naming `column`; nothing stays leased. `poisoned` are the unreadable rows' ids
/// as stored.
pub async fn unreadable_rows_are_dead_lettered_alone<S>(
    store: S,
    total: usize,
    poisoned: &[String],
    column: &str,
) where
    S: outbox_engine::Store + outbox_engine::StoreStats + outbox_engine::DeadLetters + Clone,
{
    use outbox_engine::DeadLetterFilter;
    let (report, sink) = outbox_engine::testkit::drain(store.clone(), "orders").await;
    let good = total - poisoned.len();
    assert_eq!(
        (report.published, report.dead),
        (good, poisoned.len()),
        "every readable row published, each unreadable one dead: {report:?}"
    );
    let stats = store.stats().await.expect("stats").total();
    assert_eq!(
        (stats.published, stats.dead, stats.leased, stats.pending),
        (good as u64, poisoned.len() as u64, 0, 0),
        "nothing left leased or pending"
    );
    let delivered: std::collections::HashSet<String> =
        sink.messages().iter().map(|m| m.id.to_string()).collect();
    assert_eq!(delivered.len(), good, "each readable row delivered once");
    assert!(
        poisoned.iter().all(|id| !delivered.contains(id)),
        "no unreadable row was sent"
    );
    let dead = store
        .list_dead(&DeadLetterFilter::all(), 100)
        .await
        .expect("list dead letters");
    let listed: Vec<String> = dead.iter().map(|d| d.message.id.to_string()).collect();
    for d in &dead {
        assert!(
            d.reason.contains(&format!("column {column}")),
            "the reason names the column: {:?}",
            d.reason
        );
    }
    // A dead letter whose headers were unreadable is still listed (without headers).
    if column == "headers" {
        let mut want = poisoned.to_vec();
        want.sort();
        let mut listed = listed;
        listed.sort();
        assert_eq!(listed, want, "the dead letters are listed");
    }
}

/// The table refuses each row in `headers` (bad `headers` text), and an upper-case id when
/// `id_error` is given, with an error containing the matching text; a readable row is
/// accepted. `insert` writes rows as another program would.
pub async fn refuses_unreadable_rows<F, Fut>(
    insert: F,
    headers: &[&str],
    headers_error: &str,
    id_error: Option<&str>,
) where
    F: Fn(Vec<ForeignRow>) -> Fut,
    Fut: std::future::Future<Output = Result<(), sqlx::Error>>,
{
    for bad in headers {
        let error = insert(foreign_rows(1, &[(0, bad)]))
            .await
            .expect_err(bad)
            .to_string();
        assert!(error.contains(headers_error), "{bad}: {error}");
    }
    if let Some(id_error) = id_error {
        let mut upper = foreign_rows(1, &[]);
        upper[0].id = upper[0].id.to_uppercase();
        let error = insert(upper).await.expect_err("upper case id").to_string();
        assert!(error.contains(id_error), "{error}");
    }
    insert(foreign_rows(1, &[(0, r#"{"x-trace": "abc"}"#)]))
        .await
        .expect("a readable row is accepted");
}

/// The rows a writer inserted with only destination `orders`, an event type and payload
/// `{}` are each delivered once with the table's defaults: a UUIDv7 id, the id as the
/// idempotency key, `application/json`, no headers.
pub async fn minimal_rows_are_delivered<S>(store: S, rows: usize)
where
    S: outbox_engine::Store + Clone,
{
    let (report, sink) = outbox_engine::testkit::drain(store, "orders").await;
    assert_eq!((report.published, report.dead), (rows, 0), "{report:?}");
    let messages = sink.messages();
    assert_eq!(messages.len(), rows, "each row delivered once");
    for m in &messages {
        assert_eq!(m.id.as_uuid().get_version_num(), 7, "a UUIDv7 id: {}", m.id);
        assert_eq!(
            m.idempotency_key,
            m.id.to_string(),
            "the key defaults to the id"
        );
        assert_eq!(m.content_type, "application/json");
        assert!(m.headers.is_empty(), "no headers: {:?}", m.headers);
        assert_eq!(m.payload, b"{}");
    }
}

/// A row with a bad value in one column was refused with an error naming that column
/// (`needle`, e.g. the constraint `…_event_type_check` or the text `column event_type`).
pub fn assert_refused(result: Result<(), sqlx::Error>, column: &str, needle: &str) {
    match result {
        Ok(()) => panic!("a bad {column} was accepted"),
        Err(error) => {
            // Servers quote names differently (`column 'x'`, `"t_x_check"`).
            let text = error.to_string().replace(['\'', '"', '`'], "");
            assert!(text.contains(needle), "the error names {column}: {text}");
        }
    }
}

/// `n` random inputs for `deterministic_key`: a namespace and 0 to 4 parts mixing ASCII,
/// `:`, digits and multi-byte characters, so lengths and separators are exercised.
pub fn random_key_inputs(n: usize) -> Vec<(uuid::Uuid, Vec<String>)> {
    const ALPHABET: &[char] = &[
        'a', 'Z', '0', '9', ':', '-', ' ', 'é', '€', '😀', '\\', '"', '\'',
    ];
    let seed = fastrand::u64(..);
    eprintln!("random_key_inputs seed {seed}");
    let mut rng = fastrand::Rng::with_seed(seed);
    (0..n)
        .map(|_| {
            let namespace = uuid::Uuid::from_u128(rng.u128(..));
            let parts = (0..rng.usize(0..5))
                .map(|_| {
                    let len = if rng.u8(..) < 10 {
                        rng.usize(50..200)
                    } else {
                        rng.usize(0..12)
                    };
                    (0..len)
                        .map(|_| ALPHABET[rng.usize(..ALPHABET.len())])
                        .collect()
                })
                .collect();
            (namespace, parts)
        })
        .collect()
}

/// The INSERT a foreign writer would run for one `orders` row into `table`: destination,
/// event type and `payload` (a SQL literal), with `column` set to the SQL expression
/// `value` (replacing one of those or adding a column); every other column is left to the
/// table.
pub fn insert_sql(table: &str, payload: &str, column: &str, value: &str) -> String {
    let mut values = vec![
        ("destination", "'orders'"),
        ("event_type", "'order.paid'"),
        ("payload", payload),
    ];
    match values.iter_mut().find(|(c, _)| *c == column) {
        Some(slot) => slot.1 = value,
        None => values.push((column, value)),
    }
    let columns: Vec<&str> = values.iter().map(|(c, _)| *c).collect();
    let exprs: Vec<&str> = values.iter().map(|(_, v)| *v).collect();
    format!(
        "INSERT INTO {table} ({}) VALUES ({})",
        columns.join(", "),
        exprs.join(", ")
    )
}

/// An sqlx inbox under the inbox suite: transactions from `pool`, records aged by the
/// dialect's `age` statement.
pub struct SqlxInbox<DB: sqlx::Database, I> {
    pub pool: sqlx::Pool<DB>,
    pub inbox: I,
    /// How a transaction starts (SQLite consumers begin `IMMEDIATE`); `None`: `BEGIN`.
    pub begin: Option<&'static str>,
    /// Moves every record's `received_at` back by the bound number of seconds.
    pub age: String,
    /// Dropped with the harness (a guard that drops the test's tables, say).
    pub cleanup: Option<Box<dyn Send + Sync>>,
}

impl<DB, I> outbox_engine::testkit::InboxHarness for SqlxInbox<DB, I>
where
    DB: sqlx::Database,
    I: outbox_engine::Inbox<Connection = DB::Connection>,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> <DB as sqlx::Database>::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
{
    type Inbox = I;
    type Tx = sqlx::Transaction<'static, DB>;

    fn inbox(&self) -> &I {
        &self.inbox
    }

    async fn begin(&self) -> Self::Tx {
        let tx = match self.begin {
            Some(statement) => self.pool.begin_with(statement).await,
            None => self.pool.begin().await,
        };
        tx.expect("begin a transaction")
    }

    fn conn(tx: &mut Self::Tx) -> &mut DB::Connection {
        tx
    }

    async fn commit(tx: Self::Tx) -> Result<(), outbox_engine::StoreError> {
        tx.commit().await.map_err(|e| {
            outbox_engine::StoreError::new(outbox_engine::StoreErrorKind::Other, e.to_string())
        })
    }

    async fn rollback(tx: Self::Tx) {
        tx.rollback().await.expect("rollback");
    }

    async fn age(&self, by: std::time::Duration) {
        let mut conn = self.pool.acquire().await.expect("connection");
        sqlx::query(&self.age)
            .bind(i64::try_from(by.as_secs()).expect("seconds"))
            .execute(&mut *conn)
            .await
            .expect("age the inbox records");
    }
}

/// Enqueues `messages` on the caller's connection with one dialect's outbox.
pub type Enqueue<'a, DB> = dyn for<'c> Fn(
        &'c mut <DB as sqlx::Database>::Connection,
        Vec<NewMessage>,
    ) -> outbox_engine::BoxFuture<'c, Result<(), outbox_engine::StoreError>>
    + Send
    + Sync
    + 'a;

/// Producer atomicity, for any dialect: 1,000 business transactions, about 30% rolled
/// back, each inserting a business row (`insert`, one placeholder, into a table created
/// with `create`; both have `{table}`) and enqueueing one message (every tenth
/// transaction two, one statement); then the business rows equal the committed
/// transactions, and the relay delivers exactly the committed transactions' messages.
pub async fn producer_atomicity<DB, S>(
    pool: &sqlx::Pool<DB>,
    store: S,
    create: &str,
    insert: &str,
    enqueue: &Enqueue<'_, DB>,
) where
    DB: sqlx::Database,
    S: outbox_engine::Store + Clone,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'c> &'c sqlx::Pool<DB>: sqlx::Executor<'c, Database = DB>,
    for<'q> i64: sqlx::Encode<'q, DB> + sqlx::Decode<'q, DB> + sqlx::Type<DB>,
    for<'q> <DB as sqlx::Database>::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    (i64,): for<'r> sqlx::FromRow<'r, DB::Row>,
{
    use std::collections::HashSet;

    let table = fresh_table("orders");
    sqlx::query(&create.replace("{table}", &table))
        .execute(pool)
        .await
        .expect("create the business table");
    let insert = insert.replace("{table}", &table);
    let mut committed = 0_i64;
    let mut expected = HashSet::new();
    for n in 0..1000_i64 {
        let mut tx = pool.begin().await.expect("begin");
        sqlx::query(&insert)
            .bind(n)
            .execute(&mut *tx)
            .await
            .expect("business insert");
        let mut messages = vec![message("orders", n as u64)];
        if n % 10 == 0 {
            messages.push(message("orders", n as u64));
        }
        let ids: Vec<_> = messages.iter().map(NewMessage::id).collect();
        enqueue(&mut tx, messages).await.expect("enqueue");
        if fastrand::f64() < 0.3 {
            tx.rollback().await.expect("rollback");
        } else {
            tx.commit().await.expect("commit");
            committed += 1;
            expected.extend(ids);
        }
    }
    let (business_rows,): (i64,) = sqlx::query_as(&format!("SELECT COUNT(*) FROM {table}"))
        .fetch_one(pool)
        .await
        .expect("count");
    sqlx::query(&format!("DROP TABLE {table}"))
        .execute(pool)
        .await
        .expect("drop the business table");
    let counts = (1000, committed, business_rows);
    outbox_engine::testkit::assert_only_committed_messages(store, "orders", counts, &expected)
        .await;
}

/// Enqueues one message into the outbox `S` on a connection (a transaction).
pub type EnqueueInto<'a, DB, S> = dyn for<'c> Fn(
        &'c S,
        &'c mut <DB as sqlx::Database>::Connection,
        NewMessage,
    ) -> outbox_engine::BoxFuture<'c, Result<(), outbox_engine::StoreError>>
    + Send
    + Sync
    + 'a;

/// A dialect's hostile-identifier run; see [`hostile_identifiers`].
pub struct Hostile<'a, DB: sqlx::Database, S> {
    pub pool: &'a sqlx::Pool<DB>,
    /// A table that is not an outbox, created with one row by `create_canary` (which has
    /// `{canary}`); its name comes up first, and migrating onto it must fail with kind
    /// `Schema` and change nothing.
    pub canary: &'a str,
    pub create_canary: &'a str,
    /// Fragments this dialect treats specially, besides the common ones.
    pub fragments: &'a [&'a str],
    /// How many names to try.
    pub tries: u64,
    /// `SELECT COUNT(*) FROM <catalog> WHERE <table name> = <placeholder>`: 1 for a table
    /// with exactly that name.
    pub exists: &'a str,
    /// The store on some table names.
    pub store: &'a dyn Fn(outbox_sql::TableNames) -> S,
    pub enqueue: &'a EnqueueInto<'a, DB, S>,
}

/// Hostile names, for any dialect: random concatenations of quotes, comments, statement
/// separators, placeholders, template markers, NUL, emoji and the canary's name are
/// either refused by [`TableNames`](outbox_sql::TableNames) or used exactly as quoted
/// (the table exists under exactly that name, and every fourth one runs an enqueue of
/// keyed messages, an ordered claim, a completion and stats); the canary keeps its row.
/// Returns the names whose tables were created, for the caller to drop.
pub async fn hostile_identifiers<DB, S>(h: Hostile<'_, DB, S>) -> Vec<outbox_sql::TableNames>
where
    DB: sqlx::Database,
    S: outbox_engine::Backend + outbox_engine::Store + outbox_engine::StoreStats,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'c> &'c sqlx::Pool<DB>: sqlx::Executor<'c, Database = DB>,
    for<'q> i64: sqlx::Decode<'q, DB> + sqlx::Type<DB>,
    for<'q> String: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> <DB as sqlx::Database>::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    (i64,): for<'r> sqlx::FromRow<'r, DB::Row>,
{
    use std::collections::HashSet;
    use std::time::Duration;

    use outbox_engine::{ClaimRequest, Completion, DeadHead, MessageOrder, StoreErrorKind};

    for statement in [h.create_canary, "INSERT INTO {canary} VALUES (1)"] {
        sqlx::query(&statement.replace("{canary}", h.canary))
            .execute(h.pool)
            .await
            .expect("create the canary");
    }
    let drop_canary = format!("; DROP TABLE {}; -- ", h.canary);
    let mut fragments = vec![
        "\"",
        "\"\"",
        "'",
        ";",
        "--",
        "/*",
        "*/",
        " ",
        "DROP TABLE ",
        h.canary,
        &drop_canary,
        "\0",
        "\\",
        "`",
        "$1",
        "\n",
        "é",
        "😀",
        "outbox",
        "\"; DROP TABLE ",
        ")",
        "(",
        "{outbox}",
        "%s",
        "x",
    ];
    fragments.extend_from_slice(h.fragments);
    let mut rng = fastrand::Rng::with_seed(11);
    let (mut rejected, mut used, mut canary_tries) = (0, 0, 0);
    let mut seen = HashSet::new();
    let mut created = Vec::new();
    for i in 0..h.tries {
        let mut name = String::new();
        for _ in 0..rng.usize(1..6) {
            name.push_str(fragments[rng.usize(..fragments.len())]);
        }
        if i % 2 == 0 {
            name = format!("\"{name}\"");
        }
        if i == 0 {
            name = h.canary.to_owned();
        }
        let Ok(names) = outbox_sql::TableNames::default().outbox(&name) else {
            rejected += 1;
            continue;
        };
        let exact = names.outbox_name().name().to_owned();
        let outbox = (h.store)(names.clone());
        if exact == h.canary {
            let error = outbox
                .migrate()
                .await
                .expect_err("migrating onto the canary");
            assert_eq!(error.kind(), StoreErrorKind::Schema, "{error}");
            canary_tries += 1;
            continue;
        }
        if !seen.insert(exact.clone()) {
            continue;
        }
        outbox
            .migrate()
            .await
            .unwrap_or_else(|e| panic!("valid name {name:?} failed to migrate: {e}"));
        created.push(names);
        let (found,): (i64,) = sqlx::query_as(h.exists)
            .bind(exact.clone())
            .fetch_one(h.pool)
            .await
            .expect("look the table up");
        assert_eq!(found, 1, "table created under exactly the name {exact:?}");
        if used % 4 == 0 {
            let keyed = |key: &str| {
                NewMessage::builder("orders", "test.event")
                    .json(&i)
                    .partition_key(key)
                    .build()
                    .expect("valid message")
            };
            let (one, two) = (keyed("k1"), keyed("k2"));
            for message in [&one, &two] {
                let mut tx = h.pool.begin().await.expect("begin");
                (h.enqueue)(&outbox, &mut tx, message.clone())
                    .await
                    .unwrap_or_else(|e| panic!("enqueue into {exact:?}: {e}"));
                tx.commit().await.expect("commit");
            }
            let ordered = MessageOrder::PerKey(DeadHead::Halt);
            let claim = outbox
                .claim(&ClaimRequest::new("r", 5, Duration::from_secs(30)).ordering(ordered))
                .await
                .unwrap_or_else(|e| panic!("claim from {exact:?}: {e}"));
            assert_eq!(claim.messages.len(), 2, "claimed from {exact:?}");
            let done = [
                Completion::published(one.id()),
                Completion::dead(two.id(), "x"),
            ];
            let report = outbox.complete(claim.lease.token, &done).await.unwrap();
            assert_eq!(report.applied, 2, "completed in {exact:?}");
            let stats = outbox.stats().await.unwrap();
            let orders = stats.destination("orders").expect("orders counted");
            assert_eq!(
                (orders.published, orders.dead, orders.halted_keys),
                (1, 1, 0),
                "{exact:?} is its own table"
            );
        }
        used += 1;
    }
    eprintln!("hostile names: rejected={rejected} used={used}");
    assert!(canary_tries >= 1, "the canary's own name was tried");
    assert!(
        rejected > 100 && used > 100,
        "both paths exercised: rejected={rejected} used={used}"
    );
    let (canary_rows,): (i64,) = sqlx::query_as(&format!("SELECT COUNT(*) FROM {}", h.canary))
        .fetch_one(h.pool)
        .await
        .expect("count the canary");
    assert_eq!(canary_rows, 1, "the canary table survived");
    created
}

/// A dialect's run of [`counter_cleanup_keeps_commit_order`].
pub struct CounterCleanup<'a, DB: sqlx::Database, S> {
    pub pool: &'a sqlx::Pool<DB>,
    /// A migrated store on a fresh table.
    pub store: S,
    pub enqueue: std::sync::Arc<EnqueueInto<'static, DB, S>>,
}

/// Eight writers commit messages of one key while an ordered relay publishes them (a
/// tenth of the attempts fail and are retried) and a purger forgets the key's counter
/// whenever the key is idle. Each writer transaction first bumps a witness row, whose
/// lock it holds until it commits, so the witness values are the commit order; the
/// message carries its value. The receiver must see 1, 2, 3, … with nothing lost, and
/// the purger must have forgotten the counter while the writers ran.
pub async fn counter_cleanup_keeps_commit_order<DB, S>(h: CounterCleanup<'_, DB, S>)
where
    DB: sqlx::Database,
    S: outbox_engine::Store + outbox_engine::Purge + Clone + 'static,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'c> &'c sqlx::Pool<DB>: sqlx::Executor<'c, Database = DB>,
    for<'q> i64: sqlx::Decode<'q, DB> + sqlx::Type<DB>,
    for<'q> <DB as sqlx::Database>::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    (i64,): for<'r> sqlx::FromRow<'r, DB::Row>,
{
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::time::Duration;

    use outbox_engine::testkit::{FlakySink, RecordingSink};
    use outbox_engine::{DeadHead, MessageOrder, PurgeRequest, Relay};

    const WRITERS: u64 = 8;
    const ROUNDS: u64 = 25;
    const PER_ROUND: u64 = 3;

    let witness = fresh_table("witness");
    for statement in [
        format!("CREATE TABLE {witness} (id INT PRIMARY KEY, v BIGINT NOT NULL)"),
        format!("INSERT INTO {witness} VALUES (1, 0)"),
    ] {
        sqlx::query(&statement)
            .execute(h.pool)
            .await
            .expect("witness table");
    }

    let sink = RecordingSink::new();
    let relay = Relay::builder(h.store.clone())
        .route("orders", FlakySink::new(sink.clone()).retryable_rate(0.1))
        .ordering(MessageOrder::PerKey(DeadHead::Skip))
        .batch_size(10)
        .concurrency(2)
        .poll_interval(Duration::from_millis(5))
        .retry(backoff_ms(2, 10).max_attempts(10_000))
        .build()
        .expect("relay");
    let relay = relay.spawn();

    // Published rows stay (a day is far off): every row a purge deletes is a counter.
    let purging = Arc::new(AtomicBool::new(true));
    let forgotten = Arc::new(AtomicU64::new(0));
    let purger = tokio::spawn({
        let (store, purging, forgotten) = (h.store.clone(), purging.clone(), forgotten.clone());
        async move {
            let request = PurgeRequest::published_older_than(Duration::from_secs(86_400));
            while purging.load(Ordering::Relaxed) {
                let n = store.purge(&request).await.expect("purge");
                forgotten.fetch_add(n, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_micros(fastrand::u64(0..1_000))).await;
            }
        }
    });

    let bump = format!("UPDATE {witness} SET v = v + 1 WHERE id = 1");
    let read = format!("SELECT v FROM {witness} WHERE id = 1");
    for round in 0..ROUNDS {
        let mut writers = tokio::task::JoinSet::new();
        for _ in 0..WRITERS {
            let (pool, store, enqueue) = (h.pool.clone(), h.store.clone(), h.enqueue.clone());
            let (bump, read) = (bump.clone(), read.clone());
            writers.spawn(async move {
                for _ in 0..PER_ROUND {
                    tokio::time::sleep(Duration::from_micros(fastrand::u64(0..500))).await;
                    let mut tx = pool.begin().await.expect("begin");
                    sqlx::query(&bump)
                        .execute(&mut *tx)
                        .await
                        .expect("bump the witness");
                    let (v,): (i64,) = sqlx::query_as(&read)
                        .fetch_one(&mut *tx)
                        .await
                        .expect("witness");
                    let message = NewMessage::builder("orders", "order.changed")
                        .json(&serde_json::json!({ "v": v }))
                        .partition_key("order-1")
                        .build()
                        .expect("message");
                    enqueue(&store, &mut tx, message).await.expect("enqueue");
                    tx.commit().await.expect("commit");
                }
            });
        }
        while let Some(done) = writers.join_next().await {
            done.expect("writer");
        }
        let committed = ((round + 1) * WRITERS * PER_ROUND) as usize;
        assert!(
            sink.wait_for(committed, Duration::from_secs(30)).await,
            "round {round}: waited 30 s for {committed} deliveries, saw {}",
            sink.len()
        );
        // The relay marks the last rows soon after they arrive: the key falls idle in
        // this pause, or while the next round's writers begin, as the purger looks.
        tokio::time::sleep(Duration::from_millis(fastrand::u64(0..20))).await;
    }
    purging.store(false, Ordering::Relaxed);
    purger.await.expect("purger");
    relay.stop().await.expect("relay");

    let received: Vec<Option<i64>> = sink
        .messages()
        .iter()
        .map(|m| {
            serde_json::from_slice::<serde_json::Value>(&m.payload).expect("json")["v"].as_i64()
        })
        .collect();
    let total = (ROUNDS * WRITERS * PER_ROUND) as i64;
    let first_wrong = (1..=total)
        .map(Some)
        .zip(&received)
        .position(|(want, got)| want != *got);
    assert!(
        first_wrong.is_none() && received.len() == total as usize,
        "received once each in commit order: {} of {total} received, first out of order at \
         delivery {first_wrong:?}: {:?}",
        received.len(),
        first_wrong.map(|at| &received[at..received.len().min(at + 8)])
    );
    let forgotten = forgotten.load(Ordering::Relaxed);
    eprintln!("counter cleanup: {total} messages, counter forgotten {forgotten} times");
    assert!(
        forgotten >= 3,
        "the purger forgot the key's counter between the writers' rounds ({forgotten} times)"
    );
    sqlx::query(&format!("DROP TABLE {witness}"))
        .execute(h.pool)
        .await
        .expect("drop witness");
}

/// `url` behind a fault proxy, and the settings a driver opens a one-connection pool
/// with, on a fresh outbox table of that name.
pub async fn behind_proxy(
    url: &str,
    table: &str,
) -> (
    outbox_engine::StoreSettings,
    outbox_test_support::proxy::Proxy,
) {
    let mut proxied = url.to_owned();
    let proxy = outbox_test_support::proxy::in_front(&mut proxied).await;
    let mut settings = outbox_engine::StoreSettings::new(proxied);
    settings.table = Some(table.to_owned());
    settings.max_connections = 1;
    (settings, proxy)
}

/// Counts the rows of a harness's table, as the database sees them.
pub type CountRows<'a> = dyn Fn() -> outbox_engine::BoxFuture<'a, i64> + Sync + 'a;

/// Counts the rows per `(destination, status)`, as the database sees them.
pub type CountByStatus<'a> =
    dyn Fn() -> outbox_engine::BoxFuture<'a, Vec<(String, String, i64)>> + Sync + 'a;

/// One message with every field set (binary payload with quotes, backslash and high
/// bytes; non-ASCII aggregate and tenant; a deterministic key; a trace header), enqueued in
/// a transaction and drained: it arrives exactly as written, once, created in UTC, and its
/// row is counted published.
pub async fn delivers_every_field<H>(h: &H)
where
    H: outbox_engine::testkit::StoreHarness,
{
    use outbox_engine::testkit::RecordingSink;
    use outbox_engine::{Relay, StoreStats};

    let payload = vec![0, 255, 10, 13, b'\'', b'\\', 0x80, 0xfe];
    let message = NewMessage::builder("orders", "order.paid")
        .bytes(payload.clone(), "application/octet-stream")
        .aggregate("order", "o-1 ü")
        .partition_key("o-1")
        .tenant_id("tenant-😀")
        .header("x-a", "1")
        .header(
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        )
        .deterministic_key(uuid::Uuid::NAMESPACE_OID, &["o-1", "paid"])
        .build()
        .unwrap();
    h.enqueue(vec![message.clone()]).await.unwrap();
    let sink = RecordingSink::new();
    let relay = Relay::builder(h.store().clone())
        .route("orders", sink.clone())
        .build()
        .unwrap();
    let report = relay.drain().await.unwrap();
    assert_eq!((report.claimed, report.published), (1, 1));
    let got = sink.messages();
    assert_eq!(got.len(), 1, "delivered once");
    let got = &got[0];
    assert_eq!(got.id, message.id());
    assert_eq!(got.destination, "orders");
    assert_eq!(got.event_type, "order.paid");
    assert_eq!(got.payload, payload, "binary payload is exact");
    assert_eq!(got.content_type, "application/octet-stream");
    assert_eq!(got.aggregate_type.as_deref(), Some("order"));
    assert_eq!(got.aggregate_id.as_deref(), Some("o-1 ü"));
    assert_eq!(got.partition_key.as_deref(), Some("o-1"));
    assert_eq!(got.tenant_id.as_deref(), Some("tenant-😀"));
    assert_eq!(got.idempotency_key, message.idempotency_key());
    assert_eq!(&got.headers, message.headers());
    assert_eq!(got.attempts, 1);
    let age = chrono::Utc::now() - got.created_at;
    assert!(
        age >= chrono::Duration::seconds(-5) && age < chrono::Duration::seconds(60),
        "created_at is the database's UTC time, not a local time: {}",
        got.created_at
    );
    let stats = h.store().stats().await.unwrap();
    assert_eq!(stats.destination("orders").unwrap().published, 1);
}

/// Stats count each state as the table holds it (`by_sql` groups the rows by destination
/// and status), sorted by destination, with the oldest unfinished row's time in UTC.
pub async fn stats_match_the_table<H>(h: &H, by_sql: &CountByStatus<'_>)
where
    H: outbox_engine::testkit::StoreHarness,
{
    use std::time::Duration;

    use outbox_engine::{ClaimRequest, Completion, Store, StoreStats};

    let a: Vec<_> = (0..7).map(|n| message("a", n)).collect();
    let oldest = a[0].id();
    h.enqueue(a).await.unwrap();
    h.enqueue((0..3).map(|n| message("b", n)).collect())
        .await
        .unwrap();
    let request = ClaimRequest::new("r", 3, Duration::from_secs(30)).destinations(vec!["a".into()]);
    let claim = h.store().claim(&request).await.unwrap();
    let ids: Vec<_> = claim.messages.iter().map(|m| m.id).collect();
    assert_eq!(ids[0], oldest, "oldest first");
    let completions = [Completion::published(ids[0]), Completion::dead(ids[1], "x")];
    h.store()
        .complete(claim.lease.token, &completions)
        .await
        .unwrap();
    let stats = h.store().stats().await.unwrap();
    let names: Vec<_> = stats
        .destinations
        .iter()
        .map(|d| d.destination.as_str())
        .collect();
    assert_eq!(names, ["a", "b"], "sorted by destination");
    let count = |d: &str| {
        let d = stats.destination(d).unwrap();
        (d.pending, d.leased, d.published, d.dead)
    };
    assert_eq!(count("a"), (4, 1, 1, 1));
    assert_eq!(count("b"), (3, 0, 0, 0));
    let rows = by_sql().await;
    assert_eq!(rows.iter().map(|r| r.2).sum::<i64>(), 10);
    for (destination, status, n) in &rows {
        let d = stats.destination(destination).unwrap();
        let counted = match status.as_str() {
            "pending" => d.pending,
            "leased" => d.leased,
            "published" => d.published,
            "dead" => d.dead,
            other => panic!("unknown status {other}"),
        };
        assert_eq!(counted as i64, *n, "{destination} {status}");
    }
    assert_eq!(stats.total().backlog(), 8);
    let age = chrono::Utc::now() - stats.total().oldest_pending_created_at.unwrap();
    assert!(
        age >= chrono::Duration::seconds(-5) && age < chrono::Duration::seconds(60),
        "the oldest unfinished row's time is in UTC: {age}"
    );
}

/// With published rows deleted: a drained table is empty; of mixed completions only the
/// published row goes, and repeating them is stale; a relay whose lease was taken over
/// deletes nothing. `rows` counts the table's rows.
pub async fn delete_on_publish_removes_rows<H>(h: &H, rows: &CountRows<'_>)
where
    H: outbox_engine::testkit::StoreHarness,
{
    use std::collections::HashSet;
    use std::time::Duration;

    use outbox_engine::testkit::RecordingSink;
    use outbox_engine::{ClaimRequest, Completion, Relay, Store, StoreStats};

    h.enqueue((0..5).map(|n| message("orders", n)).collect())
        .await
        .unwrap();
    let relay = Relay::builder(h.store().clone())
        .route("orders", RecordingSink::new())
        .build()
        .unwrap();
    assert_eq!(relay.drain().await.unwrap().published, 5);
    assert_eq!(rows().await, 0, "published rows are deleted");

    let mixed: Vec<_> = (0..3).map(|n| message("orders", n)).collect();
    let ids: Vec<_> = mixed.iter().map(NewMessage::id).collect();
    h.enqueue(mixed).await.unwrap();
    let request = ClaimRequest::new("t", 10, Duration::from_secs(30));
    let claim = h.store().claim(&request).await.unwrap();
    let completions = [
        Completion::published(ids[0]),
        Completion::retry(ids[1], Duration::from_secs(60), "503"),
        Completion::dead(ids[2], "400"),
    ];
    let report = h.store().complete(claim.lease.token, &completions).await;
    assert_eq!(report.map(|r| (r.applied, r.stale.len())).unwrap(), (3, 0));
    assert_eq!(rows().await, 2, "only the published row was deleted");
    let again = h
        .store()
        .complete(claim.lease.token, &completions)
        .await
        .unwrap();
    assert_eq!(again.applied, 0);
    assert_eq!(
        again.stale.iter().copied().collect::<HashSet<_>>(),
        ids.iter().copied().collect::<HashSet<_>>(),
        "a deleted row and finished rows are all reported stale"
    );
    let stats = h.store().stats().await.unwrap();
    let orders = stats.destination("orders").unwrap();
    assert_eq!(
        (orders.pending, orders.leased, orders.published, orders.dead),
        (1, 0, 0, 1)
    );

    let fenced: Vec<_> = (0..2).map(|n| message("fenced", n)).collect();
    let publish: Vec<_> = fenced
        .iter()
        .map(|m| Completion::published(m.id()))
        .collect();
    h.enqueue(fenced).await.unwrap();
    let request = request.destinations(vec!["fenced".into()]);
    let old = h.store().claim(&request).await.unwrap();
    h.advance(Duration::from_secs(31)).await;
    let new = h.store().claim(&request).await.unwrap();
    assert_eq!(new.messages.len(), 2, "lapsed lease reclaimed");
    let stale = h.store().complete(old.lease.token, &publish).await.unwrap();
    assert_eq!((stale.applied, stale.stale.len()), (0, 2));
    assert_eq!(rows().await, 4, "the fenced delete removed nothing");
    let done = h.store().complete(new.lease.token, &publish).await.unwrap();
    assert_eq!((done.applied, done.stale.len()), (2, 0));
    assert_eq!(rows().await, 2);
}

/// Runs the schema's first `count` migrations for `names` on `pool`, unrecorded: a table
/// as an older release left it.
pub async fn older_table<DB>(
    pool: &sqlx::Pool<DB>,
    dialect: outbox_sql::Dialect,
    names: &outbox_sql::TableNames,
    count: usize,
) where
    DB: sqlx::Database,
    for<'c> &'c sqlx::Pool<DB>: sqlx::Executor<'c, Database = DB>,
{
    let migrations =
        outbox_sql::outbox_migrations(dialect, names, outbox_engine::PublishedRows::Keep);
    for statement in migrations[..count].iter().flat_map(|m| &m.statements) {
        sqlx::raw_sql(statement).execute(pool).await.unwrap();
    }
}

/// The tests every database runs, one body each (tokio's `rt_common` pattern). The file
/// that expands it defines:
/// - `async fn harness(mode: PublishedRows) -> Harness`: a fresh outbox table (in a
///   database of its own where the dialect needs one), whose harness has the `outbox`,
///   and `rows()` and `by_status()` as the database counts them;
/// - `async fn older_harness() -> Harness`: the same, but holding only the schema's first
///   two migrations, as an older release left it (`migrate` not yet run);
/// - `async fn insert_with(h: &Harness, column: &str, value: &str)`: one row written as
///   a foreign writer would, with `column` set to the SQL expression `value`;
/// - `BUSINESS_TABLE` and `BUSINESS_INSERT`: a business table's `CREATE` and its
///   one-placeholder `INSERT`, both with `{table}`.
///
/// It takes the dialect's own refusal checks (`test: "column" = "SQL value";`), written
/// in its SQL; the checks whose SQL every dialect shares are here.
#[macro_export]
macro_rules! sqlx_tests {
    ($($test:ident: $column:literal = $value:literal;)*) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn delete_on_publish_removes_rows() {
            let h = harness(outbox_sqlx::PublishedRows::Delete).await;
            let rows = || -> outbox_engine::BoxFuture<'_, i64> { Box::pin(h.rows()) };
            common::delete_on_publish_removes_rows(&h, &rows).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn stats_match_the_table() {
            let h = harness(outbox_sqlx::PublishedRows::Keep).await;
            let by_status = || -> outbox_engine::BoxFuture<'_, Vec<(String, String, i64)>> {
                Box::pin(h.by_status())
            };
            common::stats_match_the_table(&h, &by_status).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn producer_atomicity_with_rollbacks() {
            let h = harness(outbox_sqlx::PublishedRows::Keep).await;
            let outbox = h.outbox.clone();
            common::producer_atomicity(
                h.outbox.pool(),
                h.outbox.clone(),
                BUSINESS_TABLE,
                BUSINESS_INSERT,
                &move |conn, messages| {
                    let outbox = outbox.clone();
                    Box::pin(async move { outbox.enqueue_all(conn, &messages).await.map(drop) })
                },
            )
            .await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn counter_cleanup_under_concurrent_writers_keeps_commit_order() {
            let h = harness(outbox_sqlx::PublishedRows::Keep).await;
            common::counter_cleanup_keeps_commit_order(common::CounterCleanup {
                pool: h.outbox.pool(),
                store: h.outbox.clone(),
                enqueue: std::sync::Arc::new(|outbox, conn, message| {
                    Box::pin(async move { outbox.enqueue(conn, &message).await })
                }),
            })
            .await;
        }

        /// A table migrated by a version before the writers' migration (001 and 002
        /// only), with a row in it, is upgraded in place: the old row is still delivered,
        /// and a minimal row now gets the defaults and the checks.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn an_older_table_is_upgraded_in_place() {
            let h = older_harness().await;
            let old = outbox_engine::NewMessage::builder("orders", "order.paid")
                .bytes(b"{}".to_vec(), "application/json")
                .build()
                .unwrap();
            let mut tx = h.outbox.pool().begin().await.unwrap();
            h.outbox.enqueue(&mut tx, &old).await.unwrap();
            tx.commit().await.unwrap();
            h.outbox.migrate().await.expect("upgrade");
            insert_with(&h, "destination", "'orders'").await.unwrap();
            common::assert_refused(
                insert_with(&h, "event_type", "''").await,
                "event_type",
                "column event_type",
            );
            common::minimal_rows_are_delivered(h.outbox.clone(), 2).await;
        }

        $crate::sqlx_tests!(@refuses
            refuses_a_destination_outside_the_route_alphabet: "destination" = "'orders and more'";
            refuses_an_empty_event_type: "event_type" = "''";
            refuses_an_empty_partition_key: "partition_key" = "''";
            refuses_an_empty_idempotency_key: "idempotency_key" = "''";
            refuses_an_empty_content_type: "content_type" = "''";
            refuses_headers_that_are_not_strings: "headers" = "'{\"x-n\": 1}'";
            refuses_header_names_that_are_not_tokens: "headers" = "'{\"x n\": \"1\"}'";
            $($test: $column = $value;)*
        );
    };
    (@refuses $($test:ident: $column:literal = $value:literal;)*) => {$(
        /// The table refuses a row with this value, naming the column.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $test() {
            let h = harness(outbox_sqlx::PublishedRows::Keep).await;
            let needle = format!("column {}", $column);
            common::assert_refused(insert_with(&h, $column, $value).await, $column, &needle);
        }
    )*};
}
