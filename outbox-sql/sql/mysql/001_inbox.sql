-- Receivers record each (consumer, message id) inside their own transaction.
CREATE TABLE IF NOT EXISTS {inbox} (
    consumer    VARCHAR(191) NOT NULL,
    message_id  VARCHAR(191) NOT NULL,
    received_at DATETIME(6)  NOT NULL,
    PRIMARY KEY (consumer, message_id),
    INDEX {inbox_received_idx} (received_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
