-- Per-key ordering. Each row with a partition key gets `seq`, its position within the
-- key, when it is enqueued: the enqueue first bumps the key's counter row here (an
-- upsert returning the new value) in the caller's transaction, then inserts the row with
-- that number. SQLite has one writer at a time, so the transaction that numbered a row
-- commits before any other can number the next one: `seq` order is commit order.
CREATE TABLE IF NOT EXISTS {outbox_keys} (
    partition_key TEXT    PRIMARY KEY NOT NULL,
    last_seq      INTEGER NOT NULL
) WITHOUT ROWID;
-- The ordered claim asks, per candidate, whether an earlier row of its key still holds
-- the key back; only unfinished and dead rows can, so the index leaves published ones out.
CREATE INDEX IF NOT EXISTS {outbox_key_idx} ON {outbox_table} (partition_key, seq)
    WHERE status IN ('pending', 'leased', 'dead');
