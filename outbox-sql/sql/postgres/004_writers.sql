-- Writers in other languages (docs/writing-from-other-languages.md). A row needs only
-- destination, event_type and payload: the id defaults to a fresh UUIDv7, the
-- idempotency key to the id, available_at to now, content_type to application/json.
-- `<outbox>_enqueue(...)` does the same in one call and wakes the relays after COMMIT;
-- `<outbox>_key(namespace, parts...)` is the Rust `deterministic_key`.
CREATE OR REPLACE FUNCTION {outbox_fn:uuidv7}() RETURNS uuid
    LANGUAGE sql VOLATILE PARALLEL SAFE AS {body_tag}
-- 48 bits of unix milliseconds over a random (v4) UUID, version bits turned from 4 to 7.
SELECT encode(set_bit(set_bit(overlay(uuid_send(gen_random_uuid())
    PLACING substring(int8send(floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3)
    FROM 1 FOR 6), 52, 1), 53, 1), 'hex')::uuid
{body_tag};
ALTER TABLE {outbox}
    ALTER COLUMN id SET DEFAULT {outbox_fn:uuidv7}(),
    ALTER COLUMN available_at SET DEFAULT now(),
    ALTER COLUMN content_type SET DEFAULT 'application/json';
-- What a column default cannot say: the idempotency key defaults to the row's own id, a
-- pending row written with available_at NULL is due now rather than never, and a NULL
-- written explicitly (a driver's None) means the default too. The WHEN clause keeps the
-- trigger off the Rust path, which always sets all of them.
CREATE OR REPLACE FUNCTION {outbox_fn:fill}() RETURNS trigger LANGUAGE plpgsql AS {body_tag}
BEGIN
    NEW.id := COALESCE(NEW.id, {outbox_fn:uuidv7}());
    NEW.idempotency_key := COALESCE(NEW.idempotency_key, NEW.id::text);
    NEW.content_type := COALESCE(NEW.content_type, 'application/json');
    NEW.headers := COALESCE(NEW.headers, '{}');
    IF NEW.status = 'pending' THEN
        NEW.available_at := COALESCE(NEW.available_at, now());
    END IF;
    RETURN NEW;
END
{body_tag};
DROP TRIGGER IF EXISTS {outbox_trg:fill_trg} ON {outbox};
CREATE TRIGGER {outbox_trg:fill_trg} BEFORE INSERT ON {outbox} FOR EACH ROW
    WHEN (NEW.id IS NULL OR NEW.idempotency_key IS NULL OR NEW.content_type IS NULL
          OR NEW.headers IS NULL OR (NEW.available_at IS NULL AND NEW.status = 'pending'))
    EXECUTE FUNCTION {outbox_fn:fill}();
-- One statement for a writer: inserts the message (the table's checks apply, keyed rows
-- are numbered at COMMIT) and signals the relays, which PostgreSQL delivers only if the
-- transaction commits. Returns the new id.
CREATE OR REPLACE FUNCTION {outbox_fn:enqueue}(
    destination text,
    event_type text,
    payload bytea,
    partition_key text DEFAULT NULL,
    idempotency_key text DEFAULT NULL,
    headers jsonb DEFAULT '{}',
    content_type text DEFAULT 'application/json',
    available_at timestamptz DEFAULT NULL,
    aggregate_type text DEFAULT NULL,
    aggregate_id text DEFAULT NULL,
    tenant_id text DEFAULT NULL
) RETURNS uuid LANGUAGE plpgsql VOLATILE AS {body_tag}
DECLARE
    new_id uuid := {outbox_fn:uuidv7}();
BEGIN
    INSERT INTO {outbox} (id, destination, event_type, payload, partition_key, idempotency_key,
                          headers, content_type, available_at, aggregate_type, aggregate_id, tenant_id)
    VALUES (new_id, $1, $2, $3, $4, COALESCE($5, new_id::text), COALESCE($6, '{}'),
            COALESCE($7, 'application/json'), COALESCE($8, now()), $9, $10, $11);
    PERFORM pg_notify('outbox_wakeup', {outbox_literal});
    RETURN new_id;
END
{body_tag};
-- SHA-1 (FIPS 180-4), only because UUIDv5 needs it and core PostgreSQL has no sha1();
-- pgcrypto would need an extension the writer's role may not be allowed to create.
CREATE OR REPLACE FUNCTION {outbox_fn:sha1}(message bytea) RETURNS bytea
    LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS {body_tag}
DECLARE
    m32 constant bigint := 4294967295;
    bits bigint := octet_length(message)::bigint * 8;
    padded bytea;
    h bigint[] := ARRAY[1732584193, 4023233417, 2562383102, 271733878, 3285377520];
    w bigint[] := array_fill(0::bigint, ARRAY[80]);
    a bigint; b bigint; c bigint; d bigint; e bigint; f bigint; k bigint; t bigint;
    chunk int; i int;
BEGIN
    padded := message || '\x80'::bytea
        || decode(repeat('00', (119 - octet_length(message) % 64) % 64), 'hex')
        || int8send(bits);
    FOR chunk IN 0 .. octet_length(padded) / 64 - 1 LOOP
        FOR i IN 0 .. 15 LOOP
            w[i + 1] := (get_byte(padded, chunk * 64 + i * 4)::bigint << 24)
                | (get_byte(padded, chunk * 64 + i * 4 + 1) << 16)
                | (get_byte(padded, chunk * 64 + i * 4 + 2) << 8)
                | get_byte(padded, chunk * 64 + i * 4 + 3);
        END LOOP;
        FOR i IN 17 .. 80 LOOP
            t := w[i - 3] # w[i - 8] # w[i - 14] # w[i - 16];
            w[i] := ((t << 1) | (t >> 31)) & m32;
        END LOOP;
        a := h[1]; b := h[2]; c := h[3]; d := h[4]; e := h[5];
        FOR i IN 1 .. 80 LOOP
            IF i <= 20 THEN
                f := (b & c) | ((~b & m32) & d); k := 1518500249;
            ELSIF i <= 40 THEN
                f := b # c # d; k := 1859775393;
            ELSIF i <= 60 THEN
                f := (b & c) | (b & d) | (c & d); k := 2400959708;
            ELSE
                f := b # c # d; k := 3395469782;
            END IF;
            t := ((((a << 5) | (a >> 27)) & m32) + f + e + k + w[i]) & m32;
            e := d; d := c; c := ((b << 30) | (b >> 2)) & m32; b := a; a := t;
        END LOOP;
        h[1] := (h[1] + a) & m32; h[2] := (h[2] + b) & m32; h[3] := (h[3] + c) & m32;
        h[4] := (h[4] + d) & m32; h[5] := (h[5] + e) & m32;
    END LOOP;
    RETURN substring(int8send(h[1]) FROM 5) || substring(int8send(h[2]) FROM 5)
        || substring(int8send(h[3]) FROM 5) || substring(int8send(h[4]) FROM 5)
        || substring(int8send(h[5]) FROM 5);
END
{body_tag};
-- The Rust `deterministic_key(namespace, parts)`: UUIDv5 of the namespace and each part
-- written as `<byte length>:<part>`, joined with nothing.
CREATE OR REPLACE FUNCTION {outbox_fn:key}(namespace uuid, VARIADIC parts text[]) RETURNS uuid
    LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS {body_tag}
DECLARE
    name bytea := ''::bytea;
    part text;
    digest bytea;
BEGIN
    FOREACH part IN ARRAY parts LOOP
        IF part IS NULL THEN
            RAISE EXCEPTION 'deterministic key parts must not be NULL';
        END IF;
        name := name || convert_to(octet_length(part) || ':' || part, 'UTF8');
    END LOOP;
    digest := substring({outbox_fn:sha1}(uuid_send(namespace) || name) FROM 1 FOR 16);
    digest := set_byte(digest, 6, (get_byte(digest, 6) & 15) | 80);
    digest := set_byte(digest, 8, (get_byte(digest, 8) & 63) | 128);
    RETURN encode(digest, 'hex')::uuid;
END
{body_tag};
