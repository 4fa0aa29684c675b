//! What a pool that serves the relay needs beyond sqlx's defaults.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use sqlx::Connection;
use sqlx::pool::PoolConnectionMetadata;

/// How long a connection given back to the pool may take to answer its test.
const RELEASE_CHECK: Duration = Duration::from_secs(5);

/// Tests a connection given back to a pool within 5 s, and has it closed if it does not
/// answer: pass it to [`PoolOptions::after_release`](sqlx::pool::PoolOptions::after_release).
///
/// sqlx tests every connection given back to a pool with a round trip that has no
/// deadline. On a connection that fell silent (no reply and no reset: a vanished host, a
/// firewall that forgot the flow), that test waits until the operating system gives up on
/// the socket, about 15 minutes with Linux's defaults, and holds a pool slot all along.
/// The relay gives up on a store call after its lease and its connection goes back to the
/// pool, so without this check every silent connection would cost a slot; a few would
/// leave the relay with none. With it, a silent connection is closed after 5 s, and a
/// live one pays one more short round trip, before sqlx's own test.
///
/// The pools that the store drivers open ([`POSTGRES`](crate::POSTGRES),
/// [`MYSQL`](crate::MYSQL)) use it. Add it to a pool you build for a relay:
///
/// ```no_run
/// # async fn example() -> Result<(), sqlx::Error> {
/// use sqlx::postgres::{PgPoolOptions, Postgres};
///
/// let pool = PgPoolOptions::new()
///     .after_release(outbox_sqlx::release_check::<Postgres>)
///     .connect("postgres://localhost/app")
///     .await?;
/// let outbox = outbox_sqlx::postgres::PgOutbox::new(pool);
/// # Ok(())
/// # }
/// ```
pub fn release_check<DB: sqlx::Database>(
    connection: &mut DB::Connection,
    _: PoolConnectionMetadata,
) -> Pin<Box<dyn Future<Output = Result<bool, sqlx::Error>> + Send + '_>> {
    Box::pin(async move {
        match tokio::time::timeout(RELEASE_CHECK, connection.ping()).await {
            Ok(answer) => answer.map(|()| true),
            Err(_) => Err(sqlx::Error::Io(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the connection did not answer within 5 s",
            ))),
        }
    })
}
