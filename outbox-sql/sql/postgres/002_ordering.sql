-- Per-key ordering. Each row with a partition key gets `seq`, its position within the
-- key in COMMIT order: a deferred constraint trigger numbers the row when its transaction
-- commits, taking a row lock on the key's counter, so two transactions that commit rows
-- of the same key are numbered in the order they commit, whatever order they inserted
-- in. Writers of different keys never wait for each other; writers of one key wait only
-- for each other's commit, not for each other's whole transaction.
ALTER TABLE {outbox} ADD COLUMN IF NOT EXISTS seq bigint;
CREATE TABLE IF NOT EXISTS {outbox_keys} (
    partition_key text   PRIMARY KEY,
    last_seq      bigint NOT NULL
);
CREATE INDEX IF NOT EXISTS {outbox_key_idx} ON {outbox} (partition_key, seq)
    WHERE status IN ('pending', 'leased', 'dead');
CREATE OR REPLACE FUNCTION {outbox_seq_fn}() RETURNS trigger LANGUAGE plpgsql AS {body_tag}
DECLARE
    next_seq bigint;
BEGIN
    -- A row a rotation moves between slots (000_slots) keeps its number.
    IF current_setting('outbox.rotating', true) = 'on' THEN
        RETURN NULL;
    END IF;
    INSERT INTO {outbox_keys} AS k (partition_key, last_seq) VALUES (NEW.partition_key, 1)
    ON CONFLICT (partition_key) DO UPDATE SET last_seq = k.last_seq + 1
    RETURNING k.last_seq INTO next_seq;
    UPDATE {outbox} SET seq = next_seq WHERE id = NEW.id;
    RETURN NULL;
END
{body_tag};
DROP TRIGGER IF EXISTS {outbox_seq_trg} ON {outbox};
CREATE CONSTRAINT TRIGGER {outbox_seq_trg} AFTER INSERT ON {outbox}
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
    WHEN (NEW.partition_key IS NOT NULL)
    EXECUTE FUNCTION {outbox_seq_fn}();
