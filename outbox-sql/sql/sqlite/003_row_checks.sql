-- The table refuses rows the relay could not read or the Rust builder would not build
-- (`Limits::default()`): an id that is not a lowercase hyphenated UUID (completions find
-- rows by that exact text), names that are not 1 to 255 bytes of text without control
-- characters, a destination outside A-Z a-z 0-9 _ - . : /, a payload over 1 MiB, headers
-- that are not a JSON object of at most 64 strings with HTTP-token names up to 128 bytes
-- and values up to 8 KiB. Triggers, because SQLite cannot add a CHECK to an existing
-- table; rows already in the table are not checked (the relay dead-letters an unreadable
-- one alone). Each error names its column. NULL id, idempotency_key and content_type pass
-- here: 004_writers fills them in. SQLite's text functions (GLOB, length of text) stop at
-- a NUL, so every text check also looks for one in the bytes: what follows a NUL would
-- otherwise pass unchecked. Dropped and created again on each migrate.
DROP TRIGGER IF EXISTS {outbox_check_insert_trg};
DROP TRIGGER IF EXISTS {outbox_check_update_trg};
DROP TRIGGER IF EXISTS {outbox_trg:id_check};
CREATE TRIGGER {outbox_trg:id_check} BEFORE INSERT ON {outbox_table}
WHEN NEW.id IS NOT NULL AND NOT (typeof(NEW.id) = 'text' AND length(CAST(NEW.id AS BLOB)) = 36 AND NEW.id GLOB '[0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f]-[0-9a-f][0-9a-f][0-9a-f][0-9a-f]-[0-9a-f][0-9a-f][0-9a-f][0-9a-f]-[0-9a-f][0-9a-f][0-9a-f][0-9a-f]-[0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f]')
BEGIN SELECT RAISE(ABORT, 'outbox row refused: column id must be a lowercase hyphenated UUID'); END;
DROP TRIGGER IF EXISTS {outbox_trg:headers_check};
CREATE TRIGGER {outbox_trg:headers_check} BEFORE INSERT ON {outbox_table}
WHEN NOT (json_valid(NEW.headers) AND json_type(NEW.headers) = 'object'
          AND (SELECT count(*) FROM json_each(NEW.headers)) <= 64
          AND NOT EXISTS (SELECT 1 FROM json_each(NEW.headers)
                          WHERE type <> 'text' OR length(CAST(key AS BLOB)) NOT BETWEEN 1 AND 128
                             OR key GLOB '*[^-A-Za-z0-9!#$%&''*+.^_`|~]*' OR instr(CAST(key AS BLOB), x'00') > 0
                             OR length(CAST(value AS BLOB)) > 8192
                             OR value GLOB '*[' || char(1, 45, 8, 10, 45, 31, 127, 45, 159) || ']*'
                             OR instr(CAST(value AS BLOB), x'00') > 0))
BEGIN SELECT RAISE(ABORT, 'outbox row refused: column headers must be a JSON object of at most 64 string values (names HTTP tokens up to 128 bytes, values up to 8192 bytes without control characters)'); END;
DROP TRIGGER IF EXISTS {outbox_trg:update_check};
CREATE TRIGGER {outbox_trg:update_check} BEFORE UPDATE OF id, headers ON {outbox_table}
WHEN NOT (typeof(NEW.id) = 'text' AND length(NEW.id) = 36)
  OR NOT (json_valid(NEW.headers) AND json_type(NEW.headers) = 'object'
          AND NOT EXISTS (SELECT 1 FROM json_each(NEW.headers) WHERE type <> 'text'))
BEGIN SELECT RAISE(ABORT, 'outbox row refused: column id must be a lowercase hyphenated UUID, column headers a JSON object of strings'); END;
DROP TRIGGER IF EXISTS {outbox_trg:destination_check};
CREATE TRIGGER {outbox_trg:destination_check} BEFORE INSERT ON {outbox_table}
WHEN typeof(NEW.destination) <> 'text' OR length(CAST(NEW.destination AS BLOB)) NOT BETWEEN 1 AND 255
  OR NEW.destination GLOB '*[^-A-Za-z0-9_.:/]*' OR instr(CAST(NEW.destination AS BLOB), x'00') > 0
BEGIN SELECT RAISE(ABORT, 'outbox row refused: column destination must be 1 to 255 characters of A-Z a-z 0-9 _ - . : /'); END;
DROP TRIGGER IF EXISTS {outbox_trg:event_type_check};
CREATE TRIGGER {outbox_trg:event_type_check} BEFORE INSERT ON {outbox_table}
WHEN typeof(NEW.event_type) <> 'text' OR length(CAST(NEW.event_type AS BLOB)) NOT BETWEEN 1 AND 255
  OR NEW.event_type GLOB '*[' || char(1, 45, 31, 127, 45, 159) || ']*' OR instr(CAST(NEW.event_type AS BLOB), x'00') > 0
BEGIN SELECT RAISE(ABORT, 'outbox row refused: column event_type must be 1 to 255 bytes of text without control characters'); END;
DROP TRIGGER IF EXISTS {outbox_trg:aggregate_type_check};
CREATE TRIGGER {outbox_trg:aggregate_type_check} BEFORE INSERT ON {outbox_table}
WHEN NEW.aggregate_type IS NOT NULL AND (typeof(NEW.aggregate_type) <> 'text' OR length(CAST(NEW.aggregate_type AS BLOB)) NOT BETWEEN 1 AND 255
  OR NEW.aggregate_type GLOB '*[' || char(1, 45, 31, 127, 45, 159) || ']*' OR instr(CAST(NEW.aggregate_type AS BLOB), x'00') > 0)
BEGIN SELECT RAISE(ABORT, 'outbox row refused: column aggregate_type must be NULL or 1 to 255 bytes of text without control characters'); END;
DROP TRIGGER IF EXISTS {outbox_trg:aggregate_id_check};
CREATE TRIGGER {outbox_trg:aggregate_id_check} BEFORE INSERT ON {outbox_table}
WHEN NEW.aggregate_id IS NOT NULL AND (typeof(NEW.aggregate_id) <> 'text' OR length(CAST(NEW.aggregate_id AS BLOB)) NOT BETWEEN 1 AND 255
  OR NEW.aggregate_id GLOB '*[' || char(1, 45, 31, 127, 45, 159) || ']*' OR instr(CAST(NEW.aggregate_id AS BLOB), x'00') > 0)
BEGIN SELECT RAISE(ABORT, 'outbox row refused: column aggregate_id must be NULL or 1 to 255 bytes of text without control characters'); END;
DROP TRIGGER IF EXISTS {outbox_trg:partition_key_check};
CREATE TRIGGER {outbox_trg:partition_key_check} BEFORE INSERT ON {outbox_table}
WHEN NEW.partition_key IS NOT NULL AND (typeof(NEW.partition_key) <> 'text' OR length(CAST(NEW.partition_key AS BLOB)) NOT BETWEEN 1 AND 255
  OR NEW.partition_key GLOB '*[' || char(1, 45, 31, 127, 45, 159) || ']*' OR instr(CAST(NEW.partition_key AS BLOB), x'00') > 0)
BEGIN SELECT RAISE(ABORT, 'outbox row refused: column partition_key must be NULL or 1 to 255 bytes of text without control characters'); END;
DROP TRIGGER IF EXISTS {outbox_trg:tenant_id_check};
CREATE TRIGGER {outbox_trg:tenant_id_check} BEFORE INSERT ON {outbox_table}
WHEN NEW.tenant_id IS NOT NULL AND (typeof(NEW.tenant_id) <> 'text' OR length(CAST(NEW.tenant_id AS BLOB)) NOT BETWEEN 1 AND 255
  OR NEW.tenant_id GLOB '*[' || char(1, 45, 31, 127, 45, 159) || ']*' OR instr(CAST(NEW.tenant_id AS BLOB), x'00') > 0)
BEGIN SELECT RAISE(ABORT, 'outbox row refused: column tenant_id must be NULL or 1 to 255 bytes of text without control characters'); END;
DROP TRIGGER IF EXISTS {outbox_trg:idempotency_key_check};
CREATE TRIGGER {outbox_trg:idempotency_key_check} BEFORE INSERT ON {outbox_table}
WHEN NEW.idempotency_key IS NOT NULL AND (typeof(NEW.idempotency_key) <> 'text' OR length(CAST(NEW.idempotency_key AS BLOB)) NOT BETWEEN 1 AND 255
  OR NEW.idempotency_key GLOB '*[' || char(1, 45, 31, 127, 45, 159) || ']*' OR instr(CAST(NEW.idempotency_key AS BLOB), x'00') > 0)
BEGIN SELECT RAISE(ABORT, 'outbox row refused: column idempotency_key must be 1 to 255 bytes of text without control characters (leave it out to use the id)'); END;
DROP TRIGGER IF EXISTS {outbox_trg:content_type_check};
CREATE TRIGGER {outbox_trg:content_type_check} BEFORE INSERT ON {outbox_table}
WHEN NEW.content_type IS NOT NULL AND (typeof(NEW.content_type) <> 'text' OR length(CAST(NEW.content_type AS BLOB)) NOT BETWEEN 1 AND 255
  OR NEW.content_type GLOB '*[' || char(1, 45, 31, 127, 45, 159) || ']*' OR instr(CAST(NEW.content_type AS BLOB), x'00') > 0)
BEGIN SELECT RAISE(ABORT, 'outbox row refused: column content_type must be 1 to 255 bytes of text without control characters'); END;
DROP TRIGGER IF EXISTS {outbox_trg:payload_check};
CREATE TRIGGER {outbox_trg:payload_check} BEFORE INSERT ON {outbox_table}
WHEN length(CAST(NEW.payload AS BLOB)) > 1048576
BEGIN SELECT RAISE(ABORT, 'outbox row refused: column payload is over 1048576 bytes'); END;
