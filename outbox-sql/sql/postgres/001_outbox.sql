-- The outbox table. Times are the database clock; ids are UUIDv7 (time-ordered).
-- For leased rows `available_at` holds the lease deadline, so one partial index on
-- (available_at, id) serves both the due path and the lapsed-lease reclaim path.
-- Finished rows (published, dead) have available_at NULL.
CREATE TABLE IF NOT EXISTS {outbox} (
    id              uuid        PRIMARY KEY,
    destination     text        NOT NULL,
    event_type      text        NOT NULL,
    aggregate_type  text,
    aggregate_id    text,
    partition_key   text,
    tenant_id       text,
    idempotency_key text        NOT NULL,
    payload         bytea       NOT NULL,
    content_type    text        NOT NULL,
    headers         jsonb       NOT NULL DEFAULT '{}',
    status          text        NOT NULL DEFAULT 'pending'
                                CHECK (status IN ('pending', 'leased', 'published', 'dead')),
    attempts        integer     NOT NULL DEFAULT 0,
    available_at    timestamptz,
    lease_owner     text,
    lease_token     uuid,
    lease_until     timestamptz,
    last_error      text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    published_at    timestamptz,
    dead_at         timestamptz
);
CREATE INDEX IF NOT EXISTS {outbox_due_idx} ON {outbox} (available_at, id)
    WHERE status IN ('pending', 'leased');
CREATE INDEX IF NOT EXISTS {outbox_dead_idx} ON {outbox} (dead_at)
    WHERE status = 'dead';
CREATE INDEX IF NOT EXISTS {outbox_published_idx} ON {outbox} (published_at)
    WHERE status = 'published';
