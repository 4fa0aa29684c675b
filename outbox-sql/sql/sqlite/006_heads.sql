-- The per-key ordered claim looks up the head of each (key, destination) pair, the row of
-- the pair with the lowest `seq` that is still pending, leased or dead, with one search of
-- this index per pair, and the unkeyed due rows with one read of the next. Together they
-- replace the key index of 002 (partition_key, seq), which carried unkeyed rows too.
CREATE INDEX IF NOT EXISTS {outbox_trg:head_idx} ON {outbox_table} (partition_key, destination, seq)
    WHERE partition_key IS NOT NULL AND status IN ('pending', 'leased', 'dead');
CREATE INDEX IF NOT EXISTS {outbox_trg:unkeyed_idx} ON {outbox_table} (available_at, id)
    WHERE partition_key IS NULL AND status IN ('pending', 'leased');
DROP INDEX IF EXISTS {outbox_key_idx};
