-- The table refuses rows the relay could not read. A writer in any language gets the
-- error at INSERT, inside its own transaction, instead of a row that is dead-lettered
-- later. NOT VALID: rows already in the table are not checked (the relay dead-letters an
-- unreadable one alone); every new or updated row is. Dropped and added again on each
-- migrate, so the definition stays the current one.
ALTER TABLE {outbox} DROP CONSTRAINT IF EXISTS {outbox_headers_check};
ALTER TABLE {outbox} ADD CONSTRAINT {outbox_headers_check}
    CHECK (jsonb_typeof(headers) = 'object'
           AND NOT jsonb_path_exists(headers, '$.* ? (@.type() != "string")')) NOT VALID;
