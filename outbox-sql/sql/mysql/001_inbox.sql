-- Receivers record each (consumer, message id) inside their own transaction.
-- The keys are VARBINARY so they compare byte for byte: text collations ignore trailing
-- spaces (PAD SPACE) or case, and would make two different ids one duplicate.
CREATE TABLE IF NOT EXISTS {inbox} (
    consumer    VARBINARY(191) NOT NULL,
    message_id  VARBINARY(191) NOT NULL,
    received_at DATETIME(6)    NOT NULL,
    PRIMARY KEY (consumer, message_id),
    INDEX {inbox_received_idx} (received_at)
) ENGINE = InnoDB;
