//! Enqueue where keyed messages are numbered by a counter row in the writer's
//! transaction (SQLite, MySQL), written once over [`Keyed`]; see the sqlx store's
//! dialect modules for why the numbers follow commit order.

use outbox_engine::{NewMessage, StoreError};
use outbox_sql::values::KeyNumbers;

use crate::dialect::{Context, DieselDialect};
use crate::migrate::in_transaction;

/// A dialect that numbers keyed rows at enqueue.
pub(crate) trait Keyed: DieselDialect {
    /// Bumps the counter of `key` by `n`; returns the last of the `n` numbers.
    fn next_seq(&mut self, ctx: &Context<Self>, key: &str, n: usize) -> Result<i64, StoreError>;

    /// Inserts one message with its number.
    fn insert_one(
        &mut self,
        ctx: &Context<Self>,
        message: &NewMessage,
        seq: Option<i64>,
    ) -> Result<(), StoreError>;
}

/// Inserts `messages` on `conn`: one message directly, several inside a savepoint (a
/// nested diesel transaction) so that all of them or none are inserted. Keys are
/// numbered once each, in sorted key order, numbers handed out in slice order.
pub(crate) fn insert<C: Keyed>(
    conn: &mut C,
    ctx: &Context<C>,
    messages: &[NewMessage],
) -> Result<u64, StoreError> {
    match messages {
        [] => Ok(0),
        [one] => {
            let seq = one
                .partition_key()
                .map(|key| conn.next_seq(ctx, key, 1))
                .transpose()?;
            conn.insert_one(ctx, one, seq).map(|()| 1)
        }
        many => in_transaction(conn, |conn| {
            let seqs = numbers(conn, ctx, many)?;
            for (message, seq) in many.iter().zip(seqs) {
                conn.insert_one(ctx, message, seq)?;
            }
            Ok(many.len() as u64)
        }),
    }
}

/// The numbers of `messages`: one counter bump per distinct key, in sorted key order (so
/// two batches take shared keys in the same order), numbers handed out in slice order;
/// `None` for messages without a key.
pub(crate) fn numbers<C: Keyed>(
    conn: &mut C,
    ctx: &Context<C>,
    messages: &[NewMessage],
) -> Result<Vec<Option<i64>>, StoreError> {
    let mut numbers = KeyNumbers::of(messages);
    for (key, count) in numbers.wanted() {
        let last = conn.next_seq(ctx, key, count)?;
        numbers.set_last(key, last);
    }
    Ok(numbers.numbers(messages))
}
