-- The `rotate` layout (published_rows = "rotate"; PostgreSQL 13 or later), run before
-- 001, whose CREATE TABLE IF NOT EXISTS then finds this table. The outbox is partitioned
-- by `slot` into three slots; one is current, and the `slot` default puts every new row
-- there, so writers in other languages need not know. Finished rows leave with their
-- slot: `<outbox>_rotate_prepare`, then `<outbox>_rotate`, move the oldest slot's pending,
-- leased and dead rows to the current slot, empty it with TRUNCATE (no dead tuples, no
-- VACUUM, whatever snapshot another session holds) and make it current. See decision 0031.
CREATE TABLE IF NOT EXISTS {outbox_fn:slots} (
    slot    smallint    PRIMARY KEY CHECK (slot BETWEEN 0 AND 2),
    part    regclass    NOT NULL,
    current boolean     NOT NULL,
    since   timestamptz NOT NULL DEFAULT now()
);
CREATE OR REPLACE FUNCTION {outbox_fn:current_slot}() RETURNS smallint
    LANGUAGE sql STABLE AS {body_tag}
SELECT slot FROM {outbox_fn:slots} WHERE current
{body_tag};
CREATE TABLE IF NOT EXISTS {outbox} (
    id              uuid        NOT NULL,
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
    dead_at         timestamptz,
    slot            smallint    NOT NULL DEFAULT {outbox_fn:current_slot}()
) PARTITION BY LIST (slot);
DO {body_tag}
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_partitioned_table WHERE partrelid = {outbox_literal}::regclass) THEN
        RAISE EXCEPTION USING ERRCODE = 'wrong_object_type',
            MESSAGE = format('table %s exists without slots: published_rows = rotate needs a table created in that layout (decision 0031 shows how to move rows over)', {outbox_literal});
    END IF;
END
{body_tag};
CREATE TABLE IF NOT EXISTS {outbox_fn:slot_0} PARTITION OF {outbox} FOR VALUES IN (0);
CREATE TABLE IF NOT EXISTS {outbox_fn:slot_1} PARTITION OF {outbox} FOR VALUES IN (1);
CREATE TABLE IF NOT EXISTS {outbox_fn:slot_2} PARTITION OF {outbox} FOR VALUES IN (2);
-- Ids are unique per slot. A primary key on the partitioned table would have to be
-- (id, slot), and the planner would not know that one id matches one row: it then
-- estimated dozens of rows per id and searched other indexes too on every completion.
CREATE UNIQUE INDEX IF NOT EXISTS {outbox_trg:slot_0_id} ON {outbox_fn:slot_0} (id);
CREATE UNIQUE INDEX IF NOT EXISTS {outbox_trg:slot_1_id} ON {outbox_fn:slot_1} (id);
CREATE UNIQUE INDEX IF NOT EXISTS {outbox_trg:slot_2_id} ON {outbox_fn:slot_2} (id);
INSERT INTO {outbox_fn:slots} (slot, part, current) VALUES
    (0, {outbox_lit:slot_0}::regclass, true),
    (1, {outbox_lit:slot_1}::regclass, false),
    (2, {outbox_lit:slot_2}::regclass, false)
-- A slot keeps its state across migrations; its partition is looked up again, in case the
-- table was dropped and created anew.
ON CONFLICT (slot) DO UPDATE SET part = EXCLUDED.part;
-- Whether the oldest slot is due: the current slot has been current (`since`) for half of
-- `published_age_ms`, and no row of the oldest slot was published within
-- `published_age_ms`. Published rows then stay between one and one and a half times the
-- age.
CREATE OR REPLACE FUNCTION {outbox_fn:rotation_due}(since timestamptz, oldest smallint, published_age_ms bigint)
    RETURNS boolean LANGUAGE sql STABLE AS {body_tag}
SELECT now() - since >= published_age_ms * interval '1 millisecond' / 2 AND NOT EXISTS (
    SELECT 1 FROM {outbox} WHERE slot = oldest AND status = 'published'
        AND published_at > now() - published_age_ms * interval '1 millisecond')
{body_tag};
-- A rotation takes two transactions. This is the first: if the oldest slot is due, it
-- moves the slot's pending rows, and its dead letters unless `dead_age_ms` is set and
-- they died longer ago than that, to the current slot, locked row by row (relays skip
-- them and go on; rows a relay holds are skipped here). It waits for no one. It must
-- commit before `<outbox>_rotate` waits for the slot: `FOR UPDATE` also keeps the lock of
-- a row a relay leased after the statement began, and a relay waiting for that row while
-- it holds the slot would deadlock with the rotation. The moves are flagged
-- (`outbox.rotating`) so the per-key numbering trigger, which PostgreSQL fires for a row
-- moved between partitions, leaves their numbers alone; a row's commit time is kept
-- before its move rewrites `xmin`. Returns how many rows moved.
CREATE OR REPLACE FUNCTION {outbox_fn:rotate_prepare}(published_age_ms bigint, dead_age_ms bigint DEFAULT NULL)
    RETURNS bigint LANGUAGE plpgsql AS {body_tag}
DECLARE
    live {outbox_fn:slots}%ROWTYPE;
    oldest {outbox_fn:slots}%ROWTYPE;
    dead_age interval := dead_age_ms * interval '1 millisecond';
    moved bigint;
BEGIN
    SELECT * INTO live FROM {outbox_fn:slots} WHERE current FOR UPDATE;
    SELECT * INTO oldest FROM {outbox_fn:slots} WHERE slot = (live.slot + 1) % 3 FOR UPDATE;
    IF NOT {outbox_fn:rotation_due}(live.since, oldest.slot, published_age_ms) THEN
        RETURN 0;
    END IF;
    PERFORM set_config('outbox.rotating', 'on', true);
    UPDATE {outbox} SET slot = live.slot,
        committed_at = COALESCE(committed_at, CASE WHEN current_setting('track_commit_timestamp') = 'on' THEN pg_xact_commit_timestamp(xmin) END)
    WHERE slot = oldest.slot AND id IN (
        SELECT id FROM {outbox} WHERE slot = oldest.slot
            AND (status = 'pending' OR (status = 'dead' AND (dead_age IS NULL OR dead_at > now() - dead_age)))
        FOR UPDATE SKIP LOCKED);
    GET DIAGNOSTICS moved = ROW_COUNT;
    RETURN moved;
END
{body_tag};
-- The second transaction: retires the oldest slot if it is due, and returns how many rows
-- left with it (0 if not due). Before it takes any row lock, it locks the slot whole
-- (waiting at most 2 s, so relays stall no longer than that), then moves the pending,
-- leased and dead rows left (flagged, as above) and empties the slot with TRUNCATE.
-- Alone it is complete too, but then every pending row moves while relays wait.
CREATE OR REPLACE FUNCTION {outbox_fn:rotate}(published_age_ms bigint, dead_age_ms bigint DEFAULT NULL)
    RETURNS bigint LANGUAGE plpgsql AS {body_tag}
DECLARE
    live {outbox_fn:slots}%ROWTYPE;
    oldest {outbox_fn:slots}%ROWTYPE;
    dead_age interval := dead_age_ms * interval '1 millisecond';
    emptied bigint;
    moved bigint;
BEGIN
    SELECT * INTO live FROM {outbox_fn:slots} WHERE current FOR UPDATE;
    SELECT * INTO oldest FROM {outbox_fn:slots} WHERE slot = (live.slot + 1) % 3 FOR UPDATE;
    IF NOT {outbox_fn:rotation_due}(live.since, oldest.slot, published_age_ms) THEN
        RETURN 0;
    END IF;
    -- Counted before the lock, so relays do not wait for the count; no row arrives in a
    -- slot that is not current, so only the moves below change it.
    EXECUTE format('SELECT count(*) FROM %s', oldest.part) INTO emptied;
    PERFORM set_config('lock_timeout', '2s', true);
    EXECUTE format('LOCK TABLE %s IN ACCESS EXCLUSIVE MODE', oldest.part);
    PERFORM set_config('outbox.rotating', 'on', true);
    UPDATE {outbox} SET slot = live.slot,
        committed_at = COALESCE(committed_at, CASE WHEN current_setting('track_commit_timestamp') = 'on' THEN pg_xact_commit_timestamp(xmin) END)
    WHERE slot = oldest.slot
        AND (status IN ('pending', 'leased') OR (status = 'dead' AND (dead_age IS NULL OR dead_at > now() - dead_age)));
    GET DIAGNOSTICS moved = ROW_COUNT;
    emptied := emptied - moved;
    EXECUTE format('TRUNCATE %s', oldest.part);
    UPDATE {outbox_fn:slots} SET current = (slot = oldest.slot),
        since = CASE WHEN slot = oldest.slot THEN now() ELSE since END;
    RETURN emptied;
END
{body_tag};
