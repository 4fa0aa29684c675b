-- Writers in other languages (docs/writing-from-other-languages.md). A row needs only
-- destination, event_type and payload; the trigger below fills in the rest, refuses what
-- the Rust builder would not build (`Limits::default()`; each error names its column) and
-- numbers keyed rows. `<outbox>_enqueue(...)` does the same in one CALL and returns the id;
-- `<outbox>_key(namespace, JSON_ARRAY(parts...))` is the Rust `deterministic_key`.
-- MySQL runs DDL outside transactions, so these are created once (IF NOT EXISTS; MySQL
-- >= 8.0.29 or MariaDB) and never dropped by a later migrate while writers use them; a
-- changed definition needs a new migration. With binary logging on, creating functions
-- and triggers needs SUPER or `log_bin_trust_function_creators = 1`.
CREATE FUNCTION IF NOT EXISTS {outbox_fn:uuidv7}() RETURNS CHAR(36) CHARACTER SET ascii
    NOT DETERMINISTIC NO SQL {body_tag}
BEGIN
    -- 48 bits of unix milliseconds, version 7, the RFC 9562 variant, 74 random bits.
    DECLARE t CHAR(12) CHARACTER SET ascii DEFAULT LPAD(LOWER(HEX(FLOOR(UNIX_TIMESTAMP(SYSDATE(6)) * 1000))), 12, '0');
    DECLARE r CHAR(32) CHARACTER SET ascii DEFAULT MD5(CONCAT(UUID(), RAND(), CONNECTION_ID()));
    RETURN CONCAT(SUBSTR(t, 1, 8), '-', SUBSTR(t, 9, 4), '-7', SUBSTR(r, 1, 3), '-',
                  SUBSTR('89ab', 1 + FLOOR(RAND() * 4), 1), SUBSTR(r, 4, 3), '-', SUBSTR(r, 7, 12));
END
{body_tag};
CREATE TRIGGER IF NOT EXISTS {outbox_trg:fill_trg} BEFORE INSERT ON {outbox} FOR EACH ROW {body_tag}
BEGIN
    DECLARE n INT;
    DECLARE i INT DEFAULT 0;
    DECLARE header_name LONGTEXT;
    DECLARE header_value LONGTEXT;
    DECLARE next_seq BIGINT;
    IF NEW.id IS NULL THEN
        SET NEW.id = {outbox_fn:uuidv7}();
    END IF;
    SET NEW.idempotency_key = COALESCE(NEW.idempotency_key, NEW.id);
    SET NEW.content_type = COALESCE(NEW.content_type, 'application/json');
    SET NEW.headers = COALESCE(NEW.headers, '{}');
    SET NEW.created_at = COALESCE(NEW.created_at, UTC_TIMESTAMP(6));
    IF NEW.status = 'pending' AND NEW.available_at IS NULL THEN
        SET NEW.available_at = UTC_TIMESTAMP(6);
    END IF;
    IF NOT NEW.id REGEXP '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$' THEN
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'outbox row refused: column id must be a lowercase hyphenated UUID';
    END IF;
    IF NOT NEW.destination REGEXP '^[-A-Za-z0-9_.:/]{1,255}$' THEN
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'outbox row refused: column destination must be 1 to 255 characters of A-Z a-z 0-9 _ - . : /';
    END IF;
    IF LENGTH(NEW.event_type) NOT BETWEEN 1 AND 255 OR NEW.event_type REGEXP '[[:cntrl:]]' THEN
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'outbox row refused: column event_type must be 1 to 255 bytes without control characters';
    END IF;
    IF LENGTH(NEW.aggregate_type) NOT BETWEEN 1 AND 255 OR NEW.aggregate_type REGEXP '[[:cntrl:]]' THEN
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'outbox row refused: column aggregate_type must be NULL or 1 to 255 bytes without control characters';
    END IF;
    IF LENGTH(NEW.aggregate_id) NOT BETWEEN 1 AND 255 OR NEW.aggregate_id REGEXP '[[:cntrl:]]' THEN
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'outbox row refused: column aggregate_id must be NULL or 1 to 255 bytes without control characters';
    END IF;
    IF LENGTH(NEW.partition_key) NOT BETWEEN 1 AND 255 OR NEW.partition_key REGEXP '[[:cntrl:]]' THEN
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'outbox row refused: column partition_key must be NULL or 1 to 255 bytes without control characters';
    END IF;
    IF LENGTH(NEW.tenant_id) NOT BETWEEN 1 AND 255 OR NEW.tenant_id REGEXP '[[:cntrl:]]' THEN
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'outbox row refused: column tenant_id must be NULL or 1 to 255 bytes without control characters';
    END IF;
    IF LENGTH(NEW.idempotency_key) NOT BETWEEN 1 AND 255 OR NEW.idempotency_key REGEXP '[[:cntrl:]]' THEN
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'outbox row refused: column idempotency_key must be 1 to 255 bytes without control characters (leave it out to use the id)';
    END IF;
    IF LENGTH(NEW.content_type) NOT BETWEEN 1 AND 255 OR NEW.content_type REGEXP '[[:cntrl:]]' THEN
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'outbox row refused: column content_type must be 1 to 255 bytes without control characters';
    END IF;
    IF LENGTH(NEW.payload) > 1048576 THEN
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'outbox row refused: column payload is over 1048576 bytes';
    END IF;
    IF NOT JSON_VALID(NEW.headers) OR JSON_TYPE(NEW.headers) <> 'OBJECT' OR JSON_LENGTH(NEW.headers) > 64 THEN
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'outbox row refused: column headers must be a JSON object of at most 64 string values';
    END IF;
    SET n = JSON_LENGTH(NEW.headers);
    WHILE i < n DO
        SET header_name = JSON_UNQUOTE(JSON_EXTRACT(JSON_KEYS(NEW.headers), CONCAT('$[', i, ']')));
        IF NOT header_name REGEXP '^[-A-Za-z0-9!#$%&''*+.^_`|~]{1,128}$' THEN
            SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'outbox row refused: column headers has a name that is not an HTTP token of 1 to 128 bytes';
        END IF;
        SET header_value = JSON_EXTRACT(NEW.headers, CONCAT('$."', header_name, '"'));
        IF JSON_TYPE(header_value) <> 'STRING' THEN
            SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'outbox row refused: column headers must hold string values only';
        END IF;
        SET header_value = JSON_UNQUOTE(header_value);
        IF LENGTH(header_value) > 8192 OR REPLACE(header_value, CHAR(9), '') REGEXP '[[:cntrl:]]' THEN
            SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'outbox row refused: column headers has a value over 8192 bytes or with control characters';
        END IF;
        SET i = i + 1;
    END WHILE;
    -- A keyed row a writer inserts without `seq` is numbered like the Rust enqueue does:
    -- the counter row stays locked until this transaction ends, so `seq` is commit order.
    IF NEW.partition_key IS NOT NULL AND NEW.seq IS NULL THEN
        INSERT INTO {outbox_keys} (partition_key, last_seq) VALUES (NEW.partition_key, 1)
            ON DUPLICATE KEY UPDATE last_seq = last_seq + 1;
        SELECT last_seq INTO next_seq FROM {outbox_keys} WHERE partition_key = NEW.partition_key;
        SET NEW.seq = next_seq;
    END IF;
END
{body_tag};
CREATE PROCEDURE IF NOT EXISTS {outbox_fn:enqueue}(
    IN p_destination VARCHAR(255),
    IN p_event_type VARCHAR(255),
    IN p_payload LONGBLOB,
    IN p_partition_key VARCHAR(255),
    IN p_idempotency_key VARCHAR(255),
    IN p_headers LONGTEXT
) MODIFIES SQL DATA {body_tag}
BEGIN
    DECLARE new_id CHAR(36) CHARACTER SET ascii DEFAULT {outbox_fn:uuidv7}();
    INSERT INTO {outbox} (id, destination, event_type, payload, partition_key, idempotency_key, headers)
        VALUES (new_id, p_destination, p_event_type, p_payload, p_partition_key,
                p_idempotency_key, COALESCE(p_headers, '{}'));
    SELECT CAST(new_id AS CHAR) AS id;
END
{body_tag};
CREATE FUNCTION IF NOT EXISTS {outbox_fn:key}(namespace CHAR(36), parts JSON) RETURNS CHAR(36) CHARACTER SET ascii
    DETERMINISTIC NO SQL {body_tag}
BEGIN
    -- UUIDv5 of the namespace and each part written as `<byte length>:<part>`.
    DECLARE name LONGBLOB DEFAULT '';
    DECLARE part LONGTEXT CHARACTER SET utf8mb4;
    DECLARE i INT DEFAULT 0;
    DECLARE digest CHAR(40) CHARACTER SET ascii;
    IF JSON_TYPE(parts) <> 'ARRAY' THEN
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'deterministic key parts must be a JSON array of strings';
    END IF;
    WHILE i < JSON_LENGTH(parts) DO
        IF JSON_TYPE(JSON_EXTRACT(parts, CONCAT('$[', i, ']'))) <> 'STRING' THEN
            SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'deterministic key parts must be a JSON array of strings';
        END IF;
        SET part = JSON_UNQUOTE(JSON_EXTRACT(parts, CONCAT('$[', i, ']')));
        SET name = CONCAT(name, LENGTH(part), ':', CONVERT(part USING utf8mb4));
        SET i = i + 1;
    END WHILE;
    SET digest = LOWER(SHA1(CONCAT(UNHEX(REPLACE(namespace, '-', '')), name)));
    RETURN CONCAT(SUBSTR(digest, 1, 8), '-', SUBSTR(digest, 9, 4), '-5', SUBSTR(digest, 14, 3), '-',
                  LOWER(HEX((CONV(SUBSTR(digest, 17, 1), 16, 10) & 3) | 8)), SUBSTR(digest, 18, 3), '-',
                  SUBSTR(digest, 21, 12));
END
{body_tag};
