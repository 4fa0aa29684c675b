-- Writers in other languages (docs/writing-from-other-languages.md). A row needs only
-- destination, event_type and payload. SQLite cannot change a column's default in place
-- and its triggers cannot edit NEW, so a row written without (or with NULL) id,
-- idempotency_key, content_type, headers, created_at or, while pending, available_at is
-- inserted again, complete, by this trigger, and the incomplete original is dropped
-- (RAISE(IGNORE); the statement then reports no changed row and RETURNING returns
-- nothing). Defaults: a fresh UUIDv7, the id, application/json, {}, now, now. The Rust
-- path sets every column and never fires it. Trigger bodies name tables without a
-- schema: SQLite resolves them in the trigger's own schema. Triggers are dropped and
-- created again on each migrate (one transaction), so their definitions stay current.
DROP TRIGGER IF EXISTS {outbox_trg:fill};
CREATE TRIGGER {outbox_trg:fill} BEFORE INSERT ON {outbox_table}
WHEN NEW.id IS NULL OR NEW.idempotency_key IS NULL OR NEW.content_type IS NULL
  OR NEW.headers IS NULL OR NEW.created_at IS NULL OR (NEW.available_at IS NULL AND NEW.status = 'pending') {body_tag}
BEGIN
    INSERT INTO {outbox_table} (id, destination, event_type, aggregate_type, aggregate_id,
        partition_key, tenant_id, idempotency_key, payload, content_type, headers, status,
        attempts, available_at, created_at, seq)
    SELECT u.id, NEW.destination, NEW.event_type, NEW.aggregate_type, NEW.aggregate_id,
        NEW.partition_key, NEW.tenant_id, COALESCE(NEW.idempotency_key, u.id), NEW.payload,
        COALESCE(NEW.content_type, 'application/json'), COALESCE(NEW.headers, '{}'), NEW.status,
        NEW.attempts,
        CASE WHEN NEW.status = 'pending' THEN COALESCE(NEW.available_at, u.now) ELSE NEW.available_at END,
        COALESCE(NEW.created_at, u.now), NEW.seq
    -- max() of one row: an aggregate subquery is computed once, so the id and the key
    -- that defaults to it are the same random value (a plain one is inlined twice).
    FROM (SELECT max(COALESCE(NEW.id, substr(t, 1, 8) || '-' || substr(t, 9, 4) || '-7' || substr(r, 1, 3)
                 || '-' || substr('89ab', 1 + abs(random() % 4), 1) || substr(r, 4, 3)
                 || '-' || substr(r, 7, 12))) AS id, max(now) AS now
          FROM (SELECT printf('%012x', now) AS t, lower(hex(randomblob(10))) AS r, now
                FROM (SELECT CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) AS now))) AS u;
    SELECT RAISE(IGNORE);
END
{body_tag};
-- Rows a writer inserts with a partition key but no `seq` are numbered here, in the
-- inserting transaction; SQLite has one writer at a time, so that is commit order.
DROP TRIGGER IF EXISTS {outbox_trg:number};
CREATE TRIGGER {outbox_trg:number} AFTER INSERT ON {outbox_table}
WHEN NEW.partition_key IS NOT NULL AND NEW.seq IS NULL {body_tag}
BEGIN
    INSERT INTO {outbox_keys_table} (partition_key, last_seq) VALUES (NEW.partition_key, 1)
        ON CONFLICT (partition_key) DO UPDATE SET last_seq = last_seq + 1;
    UPDATE {outbox_table} SET seq = (SELECT last_seq FROM {outbox_keys_table} WHERE partition_key = NEW.partition_key)
        WHERE rowid = NEW.rowid;
END
{body_tag};
