-- The table refuses rows the relay could not read or the Rust builder would not build
-- (`Limits::default()`: names 1 to 255 bytes without control characters, payload at most
-- 1 MiB, at most 64 headers of HTTP-token names up to 128 bytes and string values up to
-- 8 KiB). A writer in any language gets the error at INSERT, inside its own transaction;
-- each constraint is named after its column (`<outbox>_<column>_check`). NOT VALID: rows
-- already in the table are not checked (the relay dead-letters an unreadable one alone);
-- every new or updated row is. Dropped and added again on each migrate, so the
-- definitions stay the current ones.
CREATE OR REPLACE FUNCTION {outbox_fn:field_ok}(value text) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE AS {body_tag}
SELECT octet_length(value) BETWEEN 1 AND 255 AND value !~ '[\u0001-\u001f\u007f-\u009f]'
{body_tag};
CREATE OR REPLACE FUNCTION {outbox_fn:headers_ok}(headers jsonb) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE AS {body_tag}
SELECT jsonb_typeof(headers) = 'object' AND COALESCE((
    SELECT count(*) <= 64 AND bool_and(
        jsonb_typeof(value) = 'string'
        AND key ~ '^[A-Za-z0-9!#$%&''*+.^_`|~-]{1,128}$'
        AND octet_length(value #>> '{}') <= 8192
        AND (value #>> '{}') !~ '[\u0001-\u0008\u000a-\u001f\u007f-\u009f]')
    FROM jsonb_each(headers)), true)
{body_tag};
ALTER TABLE {outbox} DROP CONSTRAINT IF EXISTS {outbox_headers_check};
ALTER TABLE {outbox} ADD CONSTRAINT {outbox_headers_check}
    CHECK ({outbox_fn:headers_ok}(headers)) NOT VALID;
ALTER TABLE {outbox} DROP CONSTRAINT IF EXISTS {outbox_check:destination};
ALTER TABLE {outbox} ADD CONSTRAINT {outbox_check:destination}
    CHECK (destination ~ '^[A-Za-z0-9_.:/-]{1,255}$') NOT VALID;
ALTER TABLE {outbox} DROP CONSTRAINT IF EXISTS {outbox_check:event_type};
ALTER TABLE {outbox} ADD CONSTRAINT {outbox_check:event_type}
    CHECK ({outbox_fn:field_ok}(event_type)) NOT VALID;
ALTER TABLE {outbox} DROP CONSTRAINT IF EXISTS {outbox_check:aggregate_type};
ALTER TABLE {outbox} ADD CONSTRAINT {outbox_check:aggregate_type}
    CHECK ({outbox_fn:field_ok}(aggregate_type)) NOT VALID;
ALTER TABLE {outbox} DROP CONSTRAINT IF EXISTS {outbox_check:aggregate_id};
ALTER TABLE {outbox} ADD CONSTRAINT {outbox_check:aggregate_id}
    CHECK ({outbox_fn:field_ok}(aggregate_id)) NOT VALID;
ALTER TABLE {outbox} DROP CONSTRAINT IF EXISTS {outbox_check:partition_key};
ALTER TABLE {outbox} ADD CONSTRAINT {outbox_check:partition_key}
    CHECK ({outbox_fn:field_ok}(partition_key)) NOT VALID;
ALTER TABLE {outbox} DROP CONSTRAINT IF EXISTS {outbox_check:tenant_id};
ALTER TABLE {outbox} ADD CONSTRAINT {outbox_check:tenant_id}
    CHECK ({outbox_fn:field_ok}(tenant_id)) NOT VALID;
ALTER TABLE {outbox} DROP CONSTRAINT IF EXISTS {outbox_check:idempotency_key};
ALTER TABLE {outbox} ADD CONSTRAINT {outbox_check:idempotency_key}
    CHECK ({outbox_fn:field_ok}(idempotency_key)) NOT VALID;
ALTER TABLE {outbox} DROP CONSTRAINT IF EXISTS {outbox_check:content_type};
ALTER TABLE {outbox} ADD CONSTRAINT {outbox_check:content_type}
    CHECK ({outbox_fn:field_ok}(content_type)) NOT VALID;
ALTER TABLE {outbox} DROP CONSTRAINT IF EXISTS {outbox_check:payload};
ALTER TABLE {outbox} ADD CONSTRAINT {outbox_check:payload}
    CHECK (octet_length(payload) <= 1048576) NOT VALID;
