-- Receivers record each (consumer, message id) inside their own transaction.
CREATE TABLE IF NOT EXISTS {inbox} (
    consumer    TEXT    NOT NULL,
    message_id  TEXT    NOT NULL,
    received_at INTEGER NOT NULL,
    PRIMARY KEY (consumer, message_id)
);
CREATE INDEX IF NOT EXISTS {inbox_received_idx} ON {inbox_table} (received_at);
