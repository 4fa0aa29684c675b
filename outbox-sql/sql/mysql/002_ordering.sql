-- Per-key ordering. Each row with a partition key gets `seq`, its position within the
-- key, when it is enqueued: the enqueue first bumps the key's counter row here (an
-- upsert that hands the new value back through LAST_INSERT_ID) in the caller's
-- transaction, then inserts the row with that number. InnoDB holds the counter row's
-- lock until that transaction ends, so a second writer of the same key waits for the
-- first to commit or roll back before it gets its number: `seq` order is commit order.
-- Writers of different keys lock different rows and do not wait for each other.
-- The key has the outbox column's type and collation, so both compare keys alike.
CREATE TABLE IF NOT EXISTS {outbox_keys} (
    partition_key VARCHAR(255) NOT NULL,
    last_seq      BIGINT       NOT NULL,
    PRIMARY KEY (partition_key)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
