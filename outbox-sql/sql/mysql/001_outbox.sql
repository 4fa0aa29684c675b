-- The outbox table (MySQL 8 / MariaDB >= 10.6, InnoDB). Times are UTC DATETIME(6);
-- ids and tokens are UUID text. For leased rows `available_at` holds the lease deadline;
-- finished rows have it NULL, so the (available_at, id) index serves the due and the
-- reclaim path in order, like a partial index. `seq` numbers the rows of one partition
-- key in commit order (see 002_ordering); NULL for rows without a key. The key index has
-- the status before `seq` (MySQL has no partial indexes), so an ordered claim reads only
-- a key's pending, leased or dead rows, however many published rows the key has kept.
CREATE TABLE IF NOT EXISTS {outbox} (
    id              CHAR(36)     CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    destination     VARCHAR(255) NOT NULL,
    event_type      VARCHAR(255) NOT NULL,
    aggregate_type  VARCHAR(255),
    aggregate_id    VARCHAR(255),
    partition_key   VARCHAR(255),
    tenant_id       VARCHAR(255),
    idempotency_key VARCHAR(255) NOT NULL,
    payload         LONGBLOB     NOT NULL,
    content_type    VARCHAR(255) NOT NULL,
    headers         LONGTEXT     NOT NULL,
    status          VARCHAR(16)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL DEFAULT 'pending',
    attempts        INT          NOT NULL DEFAULT 0,
    available_at    DATETIME(6),
    lease_owner     VARCHAR(255),
    lease_token     CHAR(36)     CHARACTER SET ascii COLLATE ascii_bin,
    lease_until     DATETIME(6),
    last_error      TEXT,
    created_at      DATETIME(6)  NOT NULL,
    published_at    DATETIME(6),
    dead_at         DATETIME(6),
    seq             BIGINT,
    PRIMARY KEY (id),
    INDEX {outbox_due_idx} (available_at, id),
    INDEX {outbox_published_idx} (status, published_at),
    INDEX {outbox_dead_idx} (status, dead_at),
    INDEX {outbox_key_idx} (partition_key, status, seq),
    CONSTRAINT {outbox_status_check} CHECK (status IN ('pending', 'leased', 'published', 'dead')),
    -- Rows the relay could not read are refused (on tables created by this version; MySQL
    -- cannot add a constraint idempotently to an older table, whose unreadable rows the
    -- relay dead-letters one by one). Completions find rows by the id's exact text.
    CONSTRAINT {outbox_id_check} CHECK (id LIKE '________-____-____-____-____________' AND id REGEXP '^[0-9a-f-]+$'),
    CONSTRAINT {outbox_headers_check} CHECK (JSON_VALID(headers) AND JSON_TYPE(headers) = 'OBJECT')
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
