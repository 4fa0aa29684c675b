//! The shop and its shipping consumer against a real Redis (`OUTBOX_TEST_REDIS_URL`,
//! default `redis://127.0.0.1:6379/`, which `scripts/services.sh` provides): committed
//! orders are shipped once each, a rolled-back order never, and the whole stream read
//! again ships nothing twice.

use std::time::{Duration, Instant};

use outbox::Delivery;
use outbox::redis::client::streams::StreamRangeReply;
use outbox::redis::client::{self as redis, AsyncCommands};
use outbox::sqlite::{SqliteInbox, SqliteOutbox};
use outbox::sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};
use outbox::sqlx::{self, SqlitePool};
use outside_sqlite_redis::{Shipping, place_order, relay};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn committed_orders_ship_once_and_rolled_back_ones_never() {
    let redis_url = std::env::var("OUTBOX_TEST_REDIS_URL")
        .unwrap_or_else(|_| "redis://127.0.0.1:6379/".to_owned());
    let client = redis::Client::open(redis_url.as_str()).unwrap();
    let mut conn = tokio::time::timeout(
        Duration::from_secs(10),
        client.get_multiplexed_async_connection(),
    )
    .await
    .expect("Redis answers within 10 s")
    .unwrap_or_else(|e| panic!("no Redis at {redis_url} ({e}); scripts/services.sh starts one"));
    let stream = format!("outside:orders:{}", std::process::id());
    let _: () = conn.del(&stream).await.unwrap();
    let _: () = conn
        .xgroup_create_mkstream(&stream, "shipping", "$")
        .await
        .unwrap();

    let dir = tempdir();
    let shop = sqlite(&dir, "shop.db").await;
    sqlx::query("CREATE TABLE orders (id INTEGER PRIMARY KEY, status TEXT NOT NULL)")
        .execute(&shop)
        .await
        .unwrap();
    let outbox = SqliteOutbox::new(shop.clone());
    outbox.migrate().await.unwrap();

    let warehouse = sqlite(&dir, "warehouse.db").await;
    sqlx::query("CREATE TABLE shipments (order_id INTEGER NOT NULL)")
        .execute(&warehouse)
        .await
        .unwrap();
    let inbox = SqliteInbox::new();
    inbox.migrate(&warehouse).await.unwrap();
    let mut shipping = Shipping {
        redis: conn.clone(),
        pool: warehouse.clone(),
        inbox,
        stream: stream.clone(),
        group: "shipping".to_owned(),
    };

    let relay = relay(outbox.clone(), &redis_url, &stream).await.unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(relay.run(async {
        let _ = stopped.await;
    }));
    for id in 1..=5 {
        place_order(&shop, &outbox, id, id != 3).await.unwrap();
    }

    let deadline = Instant::now() + Duration::from_secs(30);
    let mut read = 0;
    while read < 4 {
        read += shipping.poll().await.unwrap();
        assert!(
            Instant::now() < deadline,
            "waited 30 s for the 4 committed orders in the stream; read {read}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        shipped(&warehouse).await,
        [1, 2, 4, 5],
        "order 3 rolled back"
    );

    // The stream delivers again (a consumer crashed before XACK, say): nothing ships twice.
    let again: StreamRangeReply = conn.xrange_all(&stream).await.unwrap();
    assert_eq!(again.ids.len(), 4, "one entry per committed order");
    for entry in &again.ids {
        assert_eq!(shipping.handle(entry).await.unwrap(), Delivery::Duplicate);
    }
    assert_eq!(shipped(&warehouse).await, [1, 2, 4, 5]);

    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(30), running)
        .await
        .expect("the relay stops within 30 s")
        .unwrap();
    let _: () = conn.del(&stream).await.unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

async fn shipped(pool: &SqlitePool) -> Vec<i64> {
    sqlx::query_scalar("SELECT order_id FROM shipments ORDER BY order_id")
        .fetch_all(pool)
        .await
        .unwrap()
}

async fn sqlite(dir: &std::path::Path, file: &str) -> SqlitePool {
    let options = SqliteConnectOptions::new()
        .filename(dir.join(file))
        .create_if_missing(true);
    SqlitePoolOptions::new()
        .connect_with(options)
        .await
        .unwrap()
}

/// A fresh directory for this test's databases.
fn tempdir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("outside-sqlite-redis-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
