-- The table refuses rows the relay could not read: an id that is not a lowercase
-- hyphenated UUID (completions find rows by that exact text) and headers that are not a
-- JSON object of strings. Triggers, because SQLite cannot add a CHECK to an existing
-- table; rows already in the table are not checked (the relay dead-letters an unreadable
-- one alone). The error names the column.
CREATE TRIGGER IF NOT EXISTS {outbox_check_insert_trg} BEFORE INSERT ON {outbox_table}
WHEN NOT (typeof(NEW.id) = 'text' AND length(NEW.id) = 36 AND NEW.id GLOB '[0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f]-[0-9a-f][0-9a-f][0-9a-f][0-9a-f]-[0-9a-f][0-9a-f][0-9a-f][0-9a-f]-[0-9a-f][0-9a-f][0-9a-f][0-9a-f]-[0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f]')
  OR NOT (json_valid(NEW.headers) AND json_type(NEW.headers) = 'object'
          AND NOT EXISTS (SELECT 1 FROM json_each(NEW.headers) WHERE type <> 'text'))
BEGIN SELECT RAISE(ABORT, 'outbox row refused: column id must be a lowercase hyphenated UUID, column headers a JSON object of strings'); END;
CREATE TRIGGER IF NOT EXISTS {outbox_check_update_trg} BEFORE UPDATE OF id, headers ON {outbox_table}
WHEN NOT (typeof(NEW.id) = 'text' AND length(NEW.id) = 36 AND NEW.id GLOB '[0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f]-[0-9a-f][0-9a-f][0-9a-f][0-9a-f]-[0-9a-f][0-9a-f][0-9a-f][0-9a-f]-[0-9a-f][0-9a-f][0-9a-f][0-9a-f]-[0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f]')
  OR NOT (json_valid(NEW.headers) AND json_type(NEW.headers) = 'object'
          AND NOT EXISTS (SELECT 1 FROM json_each(NEW.headers) WHERE type <> 'text'))
BEGIN SELECT RAISE(ABORT, 'outbox row refused: column id must be a lowercase hyphenated UUID, column headers a JSON object of strings'); END;
