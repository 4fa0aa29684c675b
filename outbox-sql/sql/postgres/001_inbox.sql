-- Receivers record each (consumer, message id) inside their own transaction.
CREATE TABLE IF NOT EXISTS {inbox} (
    consumer    text        NOT NULL,
    message_id  text        NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, message_id)
);
CREATE INDEX IF NOT EXISTS {inbox_received_idx} ON {inbox} (received_at);
