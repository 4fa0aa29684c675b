//! Harnesses of the conformance suites for every dialect: each message enqueued through
//! diesel (sync or diesel-async), the relay side the sqlx store of the same database, as
//! a `diesel+` URL opens it.
#![allow(dead_code, unreachable_pub)]

use std::time::Duration;

use diesel::RunQueryDsl;
use diesel::connection::TransactionManager;
use diesel::r2d2::{ConnectionManager, Pool, PooledConnection};
use outbox_diesel::{DieselDialect, DieselInbox, DieselOutbox, PublishedRows, TableNames};
use outbox_engine::registry::StoreDriver;
use outbox_engine::testkit::{InboxHarness, StoreHarness};
use outbox_engine::{AnyStore, NewMessage, StoreError, StoreErrorKind, StoreSettings};

pub fn fresh_table(prefix: &str) -> String {
    format!("{prefix}_{:016x}", fastrand::u64(..))
}

/// A pool of `C` on `url`, or a loud failure naming the server.
pub fn pool<C: DieselDialect>(
    what: &str,
    var: &str,
    url: &str,
    size: u32,
) -> Pool<ConnectionManager<C>> {
    // No idle connections kept beyond use: each suite check builds a pool of its own.
    Pool::builder()
        .max_size(size)
        .min_idle(Some(0))
        .connection_timeout(Duration::from_secs(10))
        .build(ConnectionManager::<C>::new(url))
        .unwrap_or_else(|e| outbox_test_support::no_server(what, var, url, e))
}

/// Runs `work` on a pooled connection in the blocking pool.
pub async fn blocking<C, T>(
    pool: &Pool<ConnectionManager<C>>,
    work: impl FnOnce(&mut C) -> T + Send + 'static,
) -> T
where
    C: DieselDialect,
    T: Send + 'static,
{
    let pool = pool.clone();
    tokio::task::spawn_blocking(move || work(&mut pool.get().expect("a connection")))
        .await
        .expect("blocking task")
}

/// The relay store of the same database on `url`, on `table`, as a `diesel+` URL opens it
/// (the sqlx store's driver); diesel has migrated the table already.
pub async fn relay_store(
    driver: &StoreDriver,
    url: &str,
    table: &str,
    mode: PublishedRows,
) -> AnyStore {
    let mut settings = StoreSettings::new(url);
    settings.table = Some(table.to_owned());
    // Enough for the store suite's eight concurrent claimers.
    settings.max_connections = 10;
    settings.published_rows = mode;
    (driver.connect)(&settings)
        .await
        .expect("the relay store opens")
}

/// The store suite's harness: a fresh outbox table migrated and written through diesel,
/// claimed and completed by the relay store; `advance` moves its times back by the
/// dialect's `shift` statement (one `$1`/`?` bind: milliseconds).
pub struct Harness<C: DieselDialect> {
    pub writer: DieselOutbox<C>,
    /// The writer's connections.
    pub pool: Pool<ConnectionManager<C>>,
    pub store: AnyStore,
    pub name: &'static str,
    pub shift: String,
    /// How many times `shift` takes the milliseconds (MySQL's `?` are positional).
    pub shift_binds: usize,
    /// Kept alive as long as the harness (a database file's folder).
    pub keep: Option<Box<dyn std::any::Any + Send + Sync>>,
}

impl<C: DieselDialect> Harness<C> {
    /// Migrates `writer`'s table on a connection of `pool`, then opens the relay store.
    #[allow(clippy::too_many_arguments)]
    pub async fn open(
        writer: DieselOutbox<C>,
        pool: Pool<ConnectionManager<C>>,
        driver: &StoreDriver,
        url: &str,
        name: &'static str,
        mode: PublishedRows,
        shift: String,
    ) -> Self {
        let migrating = writer.clone();
        blocking(&pool, move |conn| migrating.migrate(conn))
            .await
            .expect("diesel migrates the table");
        let table = writer.names().outbox_name().name().to_owned();
        let store = relay_store(driver, url, &table, mode).await;
        Self {
            writer,
            pool,
            store,
            name,
            shift,
            shift_binds: 1,
            keep: None,
        }
    }
}

impl<C: DieselDialect> StoreHarness for Harness<C>
where
    i64: diesel::serialize::ToSql<diesel::sql_types::BigInt, C::Backend>,
    diesel::query_builder::BoxedSqlQuery<'static, C::Backend, diesel::query_builder::SqlQuery>:
        diesel::query_dsl::methods::ExecuteDsl<C>,
{
    type Store = AnyStore;

    fn store(&self) -> &AnyStore {
        &self.store
    }

    fn name(&self) -> String {
        self.name.to_owned()
    }

    async fn enqueue(&self, messages: Vec<NewMessage>) -> Result<(), StoreError> {
        let writer = self.writer.clone();
        blocking(&self.pool, move |conn| {
            let mut failed = None;
            let done = conn.transaction(|conn| {
                writer.enqueue_all(conn, &messages).map_err(|e| {
                    failed = Some(e);
                    diesel::result::Error::RollbackTransaction
                })
            });
            match (done, failed) {
                (_, Some(error)) => Err(error),
                (Ok(_), None) => Ok(()),
                (Err(e), None) => Err(StoreError::new(StoreErrorKind::Other, e.to_string())),
            }
        })
        .await
    }

    async fn advance(&self, by: Duration) {
        let ms = i64::try_from(by.as_millis()).expect("ms");
        let (shift, binds) = (self.shift.clone(), self.shift_binds);
        blocking(&self.pool, move |conn| {
            let mut query = diesel::sql_query(shift).into_boxed();
            for _ in 0..binds {
                query = query.bind::<diesel::sql_types::BigInt, _>(ms);
            }
            query.execute(conn).expect("shift the row times")
        })
        .await;
    }
}

/// The inbox suite's harness: transactions begun and ended by hand on pooled
/// connections, each sync call made in the blocking pool (the suite runs deliveries
/// concurrently in one task, which a call blocking the task would deadlock).
pub struct InboxOf<C: DieselDialect> {
    pub inbox: SyncInbox<C>,
    pub pool: Pool<ConnectionManager<C>>,
    /// Moves the records' times back: one bind, seconds.
    pub age: String,
    /// Kept alive as long as the harness (a database file's folder).
    pub keep: Option<Box<dyn std::any::Any + Send + Sync>>,
}

/// [`DieselInbox`]'s sync calls, awaited from async code on a connection moved into the
/// blocking pool and back.
pub struct SyncInbox<C: DieselDialect>(pub DieselInbox<C>);

/// A pooled connection with an open transaction, lent to one call at a time.
pub struct Held<C: DieselDialect>(Option<PooledConnection<ConnectionManager<C>>>);

impl<C: DieselDialect> Held<C> {
    async fn with<T: Send + 'static>(
        &mut self,
        work: impl FnOnce(&mut C) -> T + Send + 'static,
    ) -> T {
        let mut conn = self.0.take().expect("the connection is back");
        let (conn, out) = tokio::task::spawn_blocking(move || {
            let out = work(&mut conn);
            (conn, out)
        })
        .await
        .expect("blocking task");
        self.0 = Some(conn);
        out
    }
}

impl<C> outbox_engine::Inbox for SyncInbox<C>
where
    C: DieselDialect,
    String: diesel::serialize::ToSql<diesel::sql_types::Text, C::Backend>,
    i64: diesel::serialize::ToSql<diesel::sql_types::BigInt, C::Backend>,
{
    type Connection = Held<C>;

    async fn record(
        &self,
        conn: &mut Held<C>,
        consumer: &str,
        key: &str,
    ) -> Result<outbox_engine::Delivery, StoreError> {
        let (inbox, consumer, key) = (self.0.clone(), consumer.to_owned(), key.to_owned());
        conn.with(move |conn| inbox.record(conn, &consumer, &key))
            .await
    }

    async fn purge(
        &self,
        conn: &mut Held<C>,
        older_than: Duration,
        batch_size: usize,
    ) -> Result<u64, StoreError> {
        let inbox = self.0.clone();
        conn.with(move |conn| inbox.purge(conn, older_than, batch_size))
            .await
    }
}

impl<C> InboxHarness for InboxOf<C>
where
    C: DieselDialect,
    SyncInbox<C>: outbox_engine::Inbox<Connection = Held<C>>,
    i64: diesel::serialize::ToSql<diesel::sql_types::BigInt, C::Backend>,
    diesel::query_builder::BoxedSqlQuery<'static, C::Backend, diesel::query_builder::SqlQuery>:
        diesel::query_dsl::methods::ExecuteDsl<C>,
{
    type Inbox = SyncInbox<C>;
    type Tx = Held<C>;

    fn inbox(&self) -> &SyncInbox<C> {
        &self.inbox
    }

    async fn begin(&self) -> Held<C> {
        // A plain BEGIN: the inbox's record is the first statement, a write, so SQLite
        // takes its write lock there.
        let pool = self.pool.clone();
        tokio::task::spawn_blocking(move || {
            let mut conn = pool.get().expect("a connection");
            C::TransactionManager::begin_transaction(&mut *conn).expect("begin");
            Held(Some(conn))
        })
        .await
        .expect("begin task")
    }

    fn conn(tx: &mut Held<C>) -> &mut Held<C> {
        tx
    }

    async fn commit(mut tx: Held<C>) -> Result<(), StoreError> {
        tx.with(|conn| C::TransactionManager::commit_transaction(conn))
            .await
            .map_err(|e| StoreError::new(StoreErrorKind::Other, e.to_string()))
    }

    async fn rollback(mut tx: Held<C>) {
        tx.with(|conn| C::TransactionManager::rollback_transaction(conn))
            .await
            .expect("rollback");
    }

    async fn age(&self, by: Duration) {
        age_records(&self.pool, &self.age, by).await;
    }
}

/// Moves every inbox record's `received_at` back by `by` with the dialect's `age`
/// statement (one bind: seconds), on a connection of `pool`.
async fn age_records<C>(pool: &Pool<ConnectionManager<C>>, age: &str, by: Duration)
where
    C: DieselDialect,
    i64: diesel::serialize::ToSql<diesel::sql_types::BigInt, C::Backend>,
    diesel::query_builder::BoxedSqlQuery<'static, C::Backend, diesel::query_builder::SqlQuery>:
        diesel::query_dsl::methods::ExecuteDsl<C>,
{
    let seconds = i64::try_from(by.as_secs()).expect("seconds");
    let age = age.to_owned();
    blocking(pool, move |conn| {
        diesel::sql_query(age)
            .into_boxed()
            .bind::<diesel::sql_types::BigInt, _>(seconds)
            .execute(conn)
            .expect("age the inbox records")
    })
    .await;
}

/// Creates `inbox`'s table on a connection of `pool`.
pub async fn migrate_inbox<C: DieselDialect>(
    inbox: &DieselInbox<C>,
    pool: &Pool<ConnectionManager<C>>,
) {
    let inbox = inbox.clone();
    blocking(pool, move |conn| inbox.migrate(conn))
        .await
        .expect("migrate the inbox");
}

/// Table names with a fresh outbox table.
pub fn names(prefix: &str) -> TableNames {
    TableNames::default()
        .outbox(&fresh_table(prefix))
        .expect("a valid name")
}

/// Runs `statements` when dropped (a test's tables, say), on a connection of `pool`.
pub struct DropAfter<C: DieselDialect> {
    pub pool: Pool<ConnectionManager<C>>,
    pub statements: Vec<String>,
}

impl<C: DieselDialect> Drop for DropAfter<C> {
    fn drop(&mut self) {
        if let Ok(mut conn) = self.pool.get() {
            for statement in &self.statements {
                let _ = diesel::connection::SimpleConnection::batch_execute(&mut *conn, statement);
            }
        }
    }
}

/// The store suite with every enqueue made on a diesel-async connection, inside its
/// `transaction(async |conn| …)`; the relay side is the same relay store.
#[cfg(feature = "async")]
pub struct AsyncHarness<C: DieselDialect> {
    pub sync: Harness<C>,
    /// What the async connection connects to.
    pub url: String,
}

/// A diesel-async connection to `url`, with SQLite's busy timeout set where it applies.
#[cfg(feature = "async")]
pub async fn connect<A: diesel_async::AsyncConnection>(
    url: &str,
    sqlite: bool,
) -> Result<A, StoreError> {
    let mut conn = A::establish(url)
        .await
        .map_err(|e| StoreError::new(StoreErrorKind::Unavailable, e.to_string()))?;
    if sqlite {
        conn.batch_execute("PRAGMA busy_timeout = 10000")
            .await
            .map_err(|e| StoreError::new(StoreErrorKind::Other, e.to_string()))?;
    }
    Ok(conn)
}

/// A transaction's failure: diesel's own, or the enqueue's.
#[cfg(feature = "async")]
pub enum TxError {
    Diesel(diesel::result::Error),
    Store(StoreError),
}

#[cfg(feature = "async")]
impl From<diesel::result::Error> for TxError {
    fn from(error: diesel::result::Error) -> Self {
        Self::Diesel(error)
    }
}

#[cfg(feature = "async")]
impl<C> StoreHarness for AsyncHarness<C>
where
    C: outbox_diesel::AsyncDialect,
    C::Async: diesel_async::AsyncConnection,
    Harness<C>: StoreHarness<Store = AnyStore>,
{
    type Store = AnyStore;

    fn store(&self) -> &AnyStore {
        &self.sync.store
    }

    fn name(&self) -> String {
        format!("{}-async", self.sync.name)
    }

    async fn enqueue(&self, messages: Vec<NewMessage>) -> Result<(), StoreError> {
        use diesel_async::AsyncConnection;
        let sqlite = self.sync.name.contains("sqlite");
        let mut conn: C::Async = connect(&self.url, sqlite).await?;
        let outbox = &self.sync.writer;
        let messages = &messages;
        conn.transaction::<_, TxError, _>(async |conn| {
            outbox
                .enqueue_all_async(conn, messages)
                .await
                .map_err(TxError::Store)
        })
        .await
        .map(|_| ())
        .map_err(|e| match e {
            TxError::Store(e) => e,
            TxError::Diesel(e) => StoreError::new(StoreErrorKind::Other, e.to_string()),
        })
    }

    async fn advance(&self, by: Duration) {
        self.sync.advance(by).await;
    }
}

/// The inbox suite on diesel-async connections: the inbox's own `Inbox` implementation,
/// transactions begun and ended through diesel-async's transaction manager.
#[cfg(feature = "async")]
pub struct AsyncInboxOf<C: DieselDialect> {
    pub inbox: DieselInbox<C>,
    pub url: String,
    /// A sync pool for ageing the records.
    pub pool: Pool<ConnectionManager<C>>,
    pub age: String,
    pub keep: Option<Box<dyn std::any::Any + Send + Sync>>,
}

#[cfg(feature = "async")]
impl<C> InboxHarness for AsyncInboxOf<C>
where
    C: outbox_diesel::AsyncDialect,
    C::Async: diesel_async::AsyncConnection,
    DieselInbox<C>: outbox_engine::Inbox<Connection = C::Async>,
    i64: diesel::serialize::ToSql<diesel::sql_types::BigInt, C::Backend>,
    diesel::query_builder::BoxedSqlQuery<'static, C::Backend, diesel::query_builder::SqlQuery>:
        diesel::query_dsl::methods::ExecuteDsl<C>,
{
    type Inbox = DieselInbox<C>;
    type Tx = C::Async;

    fn inbox(&self) -> &DieselInbox<C> {
        &self.inbox
    }

    async fn begin(&self) -> C::Async {
        use diesel_async::{AsyncConnection, TransactionManager};
        let mut conn: C::Async = connect(&self.url, self.url.ends_with(".db"))
            .await
            .expect("connect");
        <C::Async as AsyncConnection>::TransactionManager::begin_transaction(&mut conn)
            .await
            .expect("begin");
        conn
    }

    fn conn(tx: &mut C::Async) -> &mut C::Async {
        tx
    }

    async fn commit(mut tx: C::Async) -> Result<(), StoreError> {
        use diesel_async::{AsyncConnection, TransactionManager};
        <C::Async as AsyncConnection>::TransactionManager::commit_transaction(&mut tx)
            .await
            .map_err(|e| StoreError::new(StoreErrorKind::Other, e.to_string()))
    }

    async fn rollback(mut tx: C::Async) {
        use diesel_async::{AsyncConnection, TransactionManager};
        <C::Async as AsyncConnection>::TransactionManager::rollback_transaction(&mut tx)
            .await
            .expect("rollback");
    }

    async fn age(&self, by: Duration) {
        age_records(&self.pool, &self.age, by).await;
    }
}

/// A small JSON message for `orders`, keyed by `key` when given.
pub fn order(n: i64, key: Option<&str>) -> NewMessage {
    let builder = NewMessage::builder("orders", "order.placed")
        .json(&serde_json::json!({ "order": n }))
        .header("x-order", n.to_string());
    match key {
        Some(key) => builder.partition_key(key),
        None => builder,
    }
    .build()
    .expect("valid message")
}

/// 1,000 business transactions on diesel connections, about 30% rolled back, every tenth
/// enqueueing two messages: the business rows equal the committed transactions, and the
/// relay delivers exactly the committed messages. `create` and `insert` are the business
/// table's statements, `{table}` in them replaced, `insert` taking the order number.
pub async fn producer_atomicity<C>(h: &Harness<C>, create: &str, insert: &str)
where
    C: DieselDialect,
    i64: diesel::serialize::ToSql<diesel::sql_types::BigInt, C::Backend>,
    diesel::query_builder::BoxedSqlQuery<'static, C::Backend, diesel::query_builder::SqlQuery>:
        diesel::query_dsl::methods::ExecuteDsl<C> + diesel::query_dsl::LoadQuery<'static, C, Count>,
{
    use std::collections::HashSet;

    let table = fresh_table("orders");
    let (create, insert) = (
        create.replace("{table}", &table),
        insert.replace("{table}", &table),
    );
    let writer = h.writer.clone();
    let count = format!("SELECT COUNT(*) AS n FROM {table}");
    let drop = format!("DROP TABLE {table}");
    let (committed, expected, business_rows) = blocking(&h.pool, move |conn| {
        diesel::connection::SimpleConnection::batch_execute(conn, &create)
            .expect("create the business table");
        let (mut committed, mut expected) = (0_i64, HashSet::new());
        for n in 0..1000_i64 {
            let mut messages = vec![order(n, None)];
            if n % 10 == 0 {
                messages.push(order(n, Some("twice")));
            }
            let ids: Vec<_> = messages.iter().map(NewMessage::id).collect();
            let rollback = fastrand::f64() < 0.3;
            let done = conn.transaction(|conn| {
                diesel::sql_query(&insert)
                    .into_boxed()
                    .bind::<diesel::sql_types::BigInt, _>(n)
                    .execute(conn)?;
                writer.enqueue_all(conn, &messages).expect("enqueue");
                if rollback {
                    Err(diesel::result::Error::RollbackTransaction)
                } else {
                    Ok(())
                }
            });
            match (done, rollback) {
                (Ok(()), false) => {
                    committed += 1;
                    expected.extend(ids);
                }
                (Err(diesel::result::Error::RollbackTransaction), true) => {}
                (other, _) => panic!("transaction {n}: {other:?}"),
            }
        }
        let rows: Vec<Count> = diesel::sql_query(count)
            .into_boxed()
            .load(conn)
            .expect("count");
        diesel::connection::SimpleConnection::batch_execute(conn, &drop)
            .expect("drop the business table");
        (committed, expected, rows[0].n)
    })
    .await;
    let counts = (1000, committed, business_rows);
    let store = h.store.clone();
    outbox_engine::testkit::assert_only_committed_messages(store, "orders", counts, &expected)
        .await;
}

/// A `COUNT(*) AS n` row.
#[derive(diesel::QueryableByName)]
pub struct Count {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    pub n: i64,
}

/// The messages `sink` received, checked against `sent` field by field (ids, keys,
/// headers, payloads, partition keys).
pub fn same_messages(sent: &[NewMessage], sink: &outbox_engine::testkit::RecordingSink) {
    let got = sink.messages();
    assert_eq!(got.len(), sent.len(), "every message once");
    for m in sent {
        let g = got.iter().find(|g| g.id == m.id()).expect("delivered");
        assert_eq!(g.idempotency_key, m.idempotency_key());
        assert_eq!(g.payload, m.payload());
        assert_eq!(&g.headers, m.headers());
        assert_eq!(g.partition_key.as_deref(), m.partition_key());
        assert_eq!(g.event_type, m.event_type());
    }
}

/// One table, both writers: a table the relay store migrated takes diesel's migrations
/// as done, and messages enqueued through diesel and through sqlx on the same keys are
/// all drained by the relay store, every field intact (keyed messages numbered by
/// whichever side enqueued them, from the one counter).
pub async fn shared_with_sqlx<C, F, Fut>(h: &Harness<C>, sqlx_enqueue: F)
where
    C: DieselDialect,
    F: FnOnce(Vec<NewMessage>) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    outbox_engine::Backend::migrate(&h.store)
        .await
        .expect("the relay store's migrate accepts diesel's table");
    let again = h.writer.clone();
    blocking(&h.pool, move |conn| again.migrate(conn))
        .await
        .expect("diesel's migrate accepts it again");
    let batch = |from: i64| -> Vec<NewMessage> {
        (from..from + 20)
            .map(|n| order(n, (n % 3 == 0).then_some("key-3")))
            .collect()
    };
    let through_diesel = batch(0);
    let writer = h.writer.clone();
    let sent = through_diesel.clone();
    blocking(&h.pool, move |conn| {
        conn.transaction(|conn| {
            writer.enqueue_all(conn, &sent[..10]).expect("enqueue ten");
            for m in &sent[10..] {
                writer.enqueue(conn, m).expect("enqueue one");
            }
            Ok::<_, diesel::result::Error>(())
        })
        .expect("commit")
    })
    .await;
    let through_sqlx = batch(100);
    sqlx_enqueue(through_sqlx.clone()).await;
    let (_, sink) = outbox_engine::testkit::drain(h.store.clone(), "orders").await;
    let sent: Vec<NewMessage> = through_diesel.into_iter().chain(through_sqlx).collect();
    same_messages(&sent, &sink);
}

/// A fresh inbox table under test, as each database's file opens it: the inbox, a sync
/// pool, the statement that ages its records (one bind, seconds), what diesel-async
/// connects to, and what to keep alive as long as the harness.
pub struct InboxParts<C: DieselDialect> {
    pub inbox: DieselInbox<C>,
    pub pool: Pool<ConnectionManager<C>>,
    pub age: String,
    pub url: String,
    pub keep: Option<Box<dyn std::any::Any + Send + Sync>>,
}

impl<C: DieselDialect> InboxParts<C> {
    /// An inbox on `names`, migrated on a connection of `pool`, its records aged by
    /// `age` (with `{inbox}`; one bind: seconds).
    pub async fn migrated(
        names: &TableNames,
        pool: Pool<ConnectionManager<C>>,
        age: &str,
        url: String,
        keep: Option<Box<dyn std::any::Any + Send + Sync>>,
    ) -> Self {
        let inbox = DieselInbox::with_names(names.clone());
        migrate_inbox(&inbox, &pool).await;
        let age = names.render(C::DIALECT, age);
        Self {
            inbox,
            pool,
            age,
            url,
            keep,
        }
    }

    /// The inbox suite's harness on the sync pool.
    pub fn sync(self) -> InboxOf<C> {
        InboxOf {
            inbox: SyncInbox(self.inbox),
            pool: self.pool,
            age: self.age,
            keep: self.keep,
        }
    }

    /// The inbox suite's harness on diesel-async connections.
    #[cfg(feature = "async")]
    pub fn on_async(self) -> AsyncInboxOf<C> {
        AsyncInboxOf {
            inbox: self.inbox,
            url: self.url,
            pool: self.pool,
            age: self.age,
            keep: self.keep,
        }
    }
}

/// The tests every database runs, one body each (tokio's `rt_common` pattern). The file
/// that expands it defines:
/// - `async fn harness(mode: PublishedRows) -> common::Harness<Conn>`;
/// - `async fn inbox(connections: u32) -> common::InboxParts<Conn>`;
/// - `fn async_url(h: &common::Harness<Conn>) -> String`;
/// - `async fn sqlx_writer(h: &common::Harness<Conn>) -> (sqlx pool, sqlx outbox)` on the
///   same table;
/// - `BUSINESS_TABLE` and `BUSINESS_INSERT`: a business table's `CREATE` and its
///   one-placeholder `INSERT`, both with `{table}`.
#[macro_export]
macro_rules! diesel_tests {
    () => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn passes_the_store_suite() {
            store_suite::run_all(|| harness(PublishedRows::Keep)).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn passes_the_ordering_suite() {
            store_suite::run_ordering(|| harness(PublishedRows::Keep)).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn passes_the_store_and_ordering_suites_in_delete_mode() {
            store_suite::run_all(|| harness(PublishedRows::Delete)).await;
            store_suite::run_ordering(|| harness(PublishedRows::Delete)).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn passes_the_inbox_suite() {
            inbox_suite::run_all(|| async { inbox(12).await.sync() }).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn producer_atomicity() {
            let h = harness(PublishedRows::Keep).await;
            common::producer_atomicity(&h, BUSINESS_TABLE, BUSINESS_INSERT).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn the_table_is_shared_with_the_sqlx_writer() {
            let h = harness(PublishedRows::Keep).await;
            let (pool, sqlx_writer) = sqlx_writer(&h).await;
            common::shared_with_sqlx(&h, |messages| async move {
                let mut tx = pool.begin().await.expect("begin");
                sqlx_writer
                    .enqueue_all(&mut tx, &messages)
                    .await
                    .expect("enqueue");
                tx.commit().await.expect("commit");
            })
            .await;
        }

        #[cfg(feature = "async")]
        mod on_diesel_async {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn passes_the_store_and_ordering_suites_enqueueing_on_diesel_async() {
                let h = || async {
                    let sync = harness(PublishedRows::Keep).await;
                    let url = async_url(&sync);
                    common::AsyncHarness { sync, url }
                };
                store_suite::run_all(h).await;
                store_suite::run_ordering(h).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn passes_the_inbox_suite_on_diesel_async() {
                inbox_suite::run_all(|| async { inbox(2).await.on_async() }).await;
            }
        }
    };
}
