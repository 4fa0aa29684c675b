-- The per-key ordered claim finds the head of each (key, destination) pair, the row of the
-- pair with the lowest `seq` still pending, leased or dead, with one probe per pair and
-- status; and the unkeyed due rows with one read (decision 0034). MySQL has no partial
-- indexes, so `head_key` stands in for one: the partition key while the row is unfinished
-- (pending, leased or dead), NULL once published, so a key's published history sits in
-- the NULL entries and is never read. The head index replaces the key index of 001.
-- MySQL 8 has no ADD COLUMN / ADD INDEX IF NOT EXISTS, so a procedure makes each change,
-- and a handler skips the ones an earlier run made (1060 duplicate column, 1061 duplicate
-- key, 1091 nothing to drop). Adding a virtual column changes only the table's definition;
-- the indexes are built online, with writers going on.
CREATE PROCEDURE IF NOT EXISTS {outbox_fn:migrate_006}() MODIFIES SQL DATA {body_tag}
BEGIN
    DECLARE CONTINUE HANDLER FOR 1060, 1061, 1091 BEGIN END;
    ALTER TABLE {outbox} ADD COLUMN head_key VARCHAR(255)
        AS (IF(status IN ('pending', 'leased', 'dead'), partition_key, NULL)) VIRTUAL;
    ALTER TABLE {outbox} ADD INDEX {outbox_trg:head_idx} (head_key, destination, status, seq);
    ALTER TABLE {outbox} ADD INDEX {outbox_trg:unkeyed_idx} (partition_key, available_at, id);
    ALTER TABLE {outbox} DROP INDEX {outbox_key_idx};
END
{body_tag};
CALL {outbox_fn:migrate_006}();
DROP PROCEDURE IF EXISTS {outbox_fn:migrate_006};
