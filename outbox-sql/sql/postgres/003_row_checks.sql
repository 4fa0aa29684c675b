-- The table refuses rows the relay could not read or the Rust builder would not build
-- (`Limits::default()`: names 1 to 255 bytes without control characters, a destination of
-- A-Z a-z 0-9 _ - . : /, payload at most 1 MiB, headers a JSON object of at most 64
-- string values with HTTP-token names up to 128 bytes and values up to 8 KiB). A writer in
-- any language gets the error at INSERT, inside its own transaction, naming the column
-- (`outbox row refused: column event_type ...`, SQLSTATE 23514 check_violation). Rows
-- already in the table are not checked (the relay dead-letters an unreadable one alone).
-- One PL/pgSQL trigger rather than a CHECK per column: PostgreSQL prepares every CHECK
-- again for each INSERT statement, which cost about 2 µs per constraint per single-row
-- insert; the trigger keeps its plan for the session. It fires after the `fill` trigger of
-- 004 (triggers fire in name order), so it sees the defaults. Replaced on each migrate, so
-- the definition stays the current one; the CHECK an earlier version added is dropped.
ALTER TABLE {outbox} DROP CONSTRAINT IF EXISTS {outbox_headers_check};
CREATE OR REPLACE FUNCTION {outbox_fn:refuse}() RETURNS trigger LANGUAGE plpgsql AS {body_tag}
DECLARE
    header_name text;
    header_value jsonb;
    headers int := 0;
BEGIN
    IF NOT (NEW.destination ~ '^[A-Za-z0-9_.:/-]+$' AND octet_length(NEW.destination) <= 255) THEN
        RAISE check_violation USING COLUMN = 'destination',
            MESSAGE = 'outbox row refused: column destination must be 1 to 255 characters of A-Z a-z 0-9 _ - . : /';
    END IF;
    IF NOT (octet_length(NEW.event_type) BETWEEN 1 AND 255 AND NEW.event_type !~ '[\u0001-\u001f\u007f-\u009f]') THEN
        RAISE check_violation USING COLUMN = 'event_type',
            MESSAGE = 'outbox row refused: column event_type must be 1 to 255 bytes without control characters';
    END IF;
    IF NOT (octet_length(NEW.aggregate_type) BETWEEN 1 AND 255 AND NEW.aggregate_type !~ '[\u0001-\u001f\u007f-\u009f]') THEN
        RAISE check_violation USING COLUMN = 'aggregate_type',
            MESSAGE = 'outbox row refused: column aggregate_type must be NULL or 1 to 255 bytes without control characters';
    END IF;
    IF NOT (octet_length(NEW.aggregate_id) BETWEEN 1 AND 255 AND NEW.aggregate_id !~ '[\u0001-\u001f\u007f-\u009f]') THEN
        RAISE check_violation USING COLUMN = 'aggregate_id',
            MESSAGE = 'outbox row refused: column aggregate_id must be NULL or 1 to 255 bytes without control characters';
    END IF;
    IF NOT (octet_length(NEW.partition_key) BETWEEN 1 AND 255 AND NEW.partition_key !~ '[\u0001-\u001f\u007f-\u009f]') THEN
        RAISE check_violation USING COLUMN = 'partition_key',
            MESSAGE = 'outbox row refused: column partition_key must be NULL or 1 to 255 bytes without control characters';
    END IF;
    IF NOT (octet_length(NEW.tenant_id) BETWEEN 1 AND 255 AND NEW.tenant_id !~ '[\u0001-\u001f\u007f-\u009f]') THEN
        RAISE check_violation USING COLUMN = 'tenant_id',
            MESSAGE = 'outbox row refused: column tenant_id must be NULL or 1 to 255 bytes without control characters';
    END IF;
    IF NOT (octet_length(NEW.idempotency_key) BETWEEN 1 AND 255 AND NEW.idempotency_key !~ '[\u0001-\u001f\u007f-\u009f]') THEN
        RAISE check_violation USING COLUMN = 'idempotency_key',
            MESSAGE = 'outbox row refused: column idempotency_key must be 1 to 255 bytes without control characters (leave it out to use the id)';
    END IF;
    IF NOT (octet_length(NEW.content_type) BETWEEN 1 AND 255 AND NEW.content_type !~ '[\u0001-\u001f\u007f-\u009f]') THEN
        RAISE check_violation USING COLUMN = 'content_type',
            MESSAGE = 'outbox row refused: column content_type must be 1 to 255 bytes without control characters';
    END IF;
    IF octet_length(NEW.payload) > 1048576 THEN
        RAISE check_violation USING COLUMN = 'payload',
            MESSAGE = 'outbox row refused: column payload is over 1048576 bytes';
    END IF;
    IF NEW.headers IS DISTINCT FROM '{}'::jsonb THEN
        IF jsonb_typeof(NEW.headers) IS DISTINCT FROM 'object' THEN
            RAISE check_violation USING COLUMN = 'headers',
                MESSAGE = 'outbox row refused: column headers must be a JSON object of string values';
        END IF;
        FOR header_name, header_value IN SELECT * FROM jsonb_each(NEW.headers) LOOP
            headers := headers + 1;
            IF headers > 64 OR jsonb_typeof(header_value) <> 'string'
               OR header_name !~ '^[A-Za-z0-9!#$%&''*+.^_`|~-]+$' OR octet_length(header_name) > 128
               OR octet_length(header_value #>> '{}') > 8192
               OR (header_value #>> '{}') ~ '[\u0001-\u0008\u000a-\u001f\u007f-\u009f]' THEN
                RAISE check_violation USING COLUMN = 'headers',
                    MESSAGE = 'outbox row refused: column headers must be a JSON object of at most 64 string values (names HTTP tokens up to 128 bytes, values up to 8192 bytes without control characters)';
            END IF;
        END LOOP;
    END IF;
    RETURN NEW;
END
{body_tag};
DROP TRIGGER IF EXISTS {outbox_trg:refuse_trg} ON {outbox};
CREATE TRIGGER {outbox_trg:refuse_trg} BEFORE INSERT OR UPDATE OF destination, event_type,
    aggregate_type, aggregate_id, partition_key, tenant_id, idempotency_key, content_type,
    payload, headers ON {outbox}
    FOR EACH ROW EXECUTE FUNCTION {outbox_fn:refuse}();
