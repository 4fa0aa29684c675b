//! Enqueue where keyed messages are numbered by a counter row in the writer's
//! transaction (SQLite, MySQL), written once over [`KeyedDialect`].

use outbox_engine::{NewMessage, StoreError};
use outbox_sql::values::KeyNumbers;

use crate::dialect::KeyedDialect;
use crate::store::SqlOutbox;

impl<DB: KeyedDialect> SqlOutbox<DB> {
    /// Inserts `message` on `conn` — normally your open transaction (`&mut tx`). Runs one
    /// `INSERT`, preceded for a message with a partition key by one statement that
    /// numbers it (see the dialect module's "per-key ordering"); never commits and uses
    /// no other connection. (On a connection outside a transaction each statement commits
    /// by itself: the numbering and the insert then commit separately, so two enqueues of
    /// one key that overlap in time are ordered by their numbers, which need not be the
    /// order their rows became visible. Enqueue keyed messages inside a transaction.)
    ///
    /// # Errors
    ///
    /// [`StoreError`] of kind `Constraint` if the id exists, `Conflict` for a deadlock or
    /// lock wait on the key (MySQL), or the database's error. The failed insert inserted
    /// nothing (the key's counter may have moved on, which is harmless); roll your
    /// transaction back as for any failed statement.
    pub async fn enqueue(
        &self,
        conn: &mut DB::Connection,
        message: &NewMessage,
    ) -> Result<(), StoreError> {
        let seq = match message.partition_key() {
            Some(key) => Some(DB::next_seq(self, conn, key, 1).await?),
            None => None,
        };
        DB::insert(self, conn, message, seq).await
    }

    /// Numbers the keyed messages of a batch: one counter bump per distinct key, in
    /// sorted key order (so two batches take shared keys in the same order), numbers
    /// handed out in slice order. `None` for messages without a key.
    pub(crate) async fn number(
        &self,
        conn: &mut DB::Connection,
        messages: &[NewMessage],
    ) -> Result<Vec<Option<i64>>, StoreError> {
        let mut numbers = KeyNumbers::of(messages);
        for (key, count) in numbers.wanted() {
            let last = DB::next_seq(self, conn, key, count).await?;
            numbers.set_last(key, last);
        }
        Ok(numbers.numbers(messages))
    }
}
