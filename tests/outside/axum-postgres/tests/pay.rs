//! The service against a real PostgreSQL (`OUTBOX_TEST_POSTGRES_URL`, which
//! `scripts/services.sh` provides): two orders paid through the API reach billing once
//! each, a second payment of the same order is refused and sends nothing.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use outbox::postgres::{PgInbox, PgOutbox};
use outbox::receiver::WebhookReceiver;
use outbox::sqlx::{self, PgPool};
use outside_axum_postgres::{Billing, Shop, billing, relay, shop};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paid_orders_reach_billing_once_each() {
    let server = std::env::var("OUTBOX_TEST_POSTGRES_URL").expect(
        "OUTBOX_TEST_POSTGRES_URL must name a PostgreSQL server; scripts/services.sh starts one",
    );
    let admin = PgPool::connect(&server)
        .await
        .expect("PostgreSQL at OUTBOX_TEST_POSTGRES_URL");
    let database = format!("outside_axum_{}", std::process::id());
    sqlx::query(&format!("DROP DATABASE IF EXISTS {database} WITH (FORCE)"))
        .execute(&admin)
        .await
        .unwrap();
    sqlx::query(&format!("CREATE DATABASE {database}"))
        .execute(&admin)
        .await
        .unwrap();
    let (base, _) = server.rsplit_once('/').expect("a URL with a database");
    let pool = PgPool::connect(&format!("{base}/{database}"))
        .await
        .unwrap();

    for statement in [
        "CREATE TABLE shop_orders (id bigint PRIMARY KEY, status text NOT NULL)",
        "CREATE TABLE invoices (order_id bigint NOT NULL)",
        "INSERT INTO shop_orders VALUES (1, 'new'), (2, 'new'), (3, 'new')",
    ] {
        sqlx::query(statement).execute(&pool).await.unwrap();
    }
    let outbox = PgOutbox::new(pool.clone());
    outbox.migrate().await.unwrap();
    let inbox = PgInbox::new();
    inbox.migrate(&pool).await.unwrap();

    let billing_at = serve(billing(Billing {
        pool: pool.clone(),
        receiver: WebhookReceiver::from_secrets([SECRET])
            .unwrap()
            .consumer("billing"),
        inbox,
    }))
    .await;
    let shop_at = serve(shop(Shop {
        pool: pool.clone(),
        outbox: outbox.clone(),
    }))
    .await;
    let relay = relay(
        outbox,
        &format!("http://{billing_at}/hooks/billing"),
        SECRET,
    )
    .await
    .unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(relay.run(async {
        let _ = stopped.await;
    }));

    assert_eq!(post(shop_at, "/orders/1/pay").await, 202);
    assert_eq!(post(shop_at, "/orders/2/pay").await, 202);
    assert_eq!(post(shop_at, "/orders/2/pay").await, 409, "paid twice");

    let deadline = Instant::now() + Duration::from_secs(30);
    let invoiced = wait_for(deadline, "billing to invoice orders 1 and 2", async || {
        let invoiced: Vec<i64> =
            sqlx::query_scalar("SELECT order_id FROM invoices ORDER BY order_id")
                .fetch_all(&pool)
                .await
                .unwrap();
        if invoiced.len() >= 2 {
            Ok(invoiced)
        } else {
            Err(format!("invoiced {invoiced:?}"))
        }
    })
    .await;
    assert_eq!(invoiced, [1, 2]);
    // The relay marks a row once billing's answer is back, which can be just after the
    // invoice is written.
    wait_for(deadline, "every row to be marked published", async || {
        let unpublished: i64 =
            sqlx::query_scalar("SELECT count(*) FROM outbox WHERE status <> 'published'")
                .fetch_one(&pool)
                .await
                .unwrap();
        if unpublished == 0 {
            Ok(())
        } else {
            Err(format!("{unpublished} are not"))
        }
    })
    .await;

    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(30), running)
        .await
        .expect("the relay stops within 30 s")
        .unwrap();
    pool.close().await;
    sqlx::query(&format!("DROP DATABASE {database} WITH (FORCE)"))
        .execute(&admin)
        .await
        .unwrap();
}

/// Polls `reached` every 50 ms until it gives a value; fails at `deadline` naming `what`
/// it waited for and what it saw last.
async fn wait_for<T>(
    deadline: Instant,
    what: &str,
    mut reached: impl AsyncFnMut() -> Result<T, String>,
) -> T {
    loop {
        let seen = match reached().await {
            Ok(value) => return value,
            Err(seen) => seen,
        };
        assert!(Instant::now() < deadline, "waited 30 s for {what}; {seen}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Serves `app` on a loopback port of its own.
async fn serve(app: axum::Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    address
}

/// POSTs to `path` with no body and returns the status code.
async fn post(address: SocketAddr, path: &str) -> u16 {
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: shop\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).await.unwrap();
    reply
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP reply: {reply:?}"))
}
