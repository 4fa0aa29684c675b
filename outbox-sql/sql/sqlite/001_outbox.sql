-- The outbox table. Times are unix milliseconds (INTEGER); ids and tokens are UUID text.
-- For leased rows `available_at` holds the lease deadline, so one partial index on
-- (available_at, id) serves both the due path and the lapsed-lease reclaim path.
-- Finished rows (published, dead) have available_at NULL. `seq` numbers the rows of one
-- partition key in commit order (see 002_ordering); NULL for rows without a key.
CREATE TABLE IF NOT EXISTS {outbox} (
    id              TEXT    PRIMARY KEY NOT NULL,
    destination     TEXT    NOT NULL,
    event_type      TEXT    NOT NULL,
    aggregate_type  TEXT,
    aggregate_id    TEXT,
    partition_key   TEXT,
    tenant_id       TEXT,
    idempotency_key TEXT    NOT NULL,
    payload         BLOB    NOT NULL,
    content_type    TEXT    NOT NULL,
    headers         TEXT    NOT NULL DEFAULT '{}',
    status          TEXT    NOT NULL DEFAULT 'pending'
                            CHECK (status IN ('pending', 'leased', 'published', 'dead')),
    attempts        INTEGER NOT NULL DEFAULT 0,
    available_at    INTEGER,
    lease_owner     TEXT,
    lease_token     TEXT,
    lease_until     INTEGER,
    last_error      TEXT,
    created_at      INTEGER NOT NULL,
    published_at    INTEGER,
    dead_at         INTEGER,
    seq             INTEGER
);
CREATE INDEX IF NOT EXISTS {outbox_due_idx} ON {outbox_table} (available_at, id)
    WHERE status IN ('pending', 'leased');
CREATE INDEX IF NOT EXISTS {outbox_dead_idx} ON {outbox_table} (dead_at)
    WHERE status = 'dead';
CREATE INDEX IF NOT EXISTS {outbox_published_idx} ON {outbox_table} (published_at)
    WHERE status = 'published';
