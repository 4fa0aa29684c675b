//! SQLite statements.
//!
//! Times are unix milliseconds computed by SQLite ([`NOW_MS`]); ids and tokens are UUID
//! text (hyphenated, lowercase, so text order is UUIDv7 time order); lists are bound as
//! one JSON array text and read with `json_each`. Every relay statement is a single
//! atomic statement that takes SQLite's write lock when it starts, so the relay needs no
//! explicit transaction.
//!
//! | statement | parameters (`?n`) |
//! |---|---|
//! | `insert` | 1 id, 2 destination, 3 event_type, 4 aggregate_type?, 5 aggregate_id?, 6 partition_key?, 7 tenant_id?, 8 idempotency_key, 9 payload blob, 10 content_type, 11 headers JSON, 12 available_at ms?, 13 delay ms (used when 12 is NULL) |
//! | `claim` | 1 limit, 2 owner, 3 token, 4 lease ms |
//! | `claim_filtered` | as `claim`, 5 destinations JSON array |
//! | `complete` | 1 token, 2 JSON array of `{"id","status","delay_ms","error"}` → returns applied ids |
//! | `delete_published`, `release` | 1 token, 2 ids JSON array → returns affected ids |
//! | `stats` | none → destination, pending, leased, dead, published, oldest created_at ms |
//! | dead-letter filter (`list_dead`, `replay_dead`, `discard_dead`) | 1 ids JSON?, 2 destinations JSON?, 3 event types JSON?, 4 created after ms?, 5 created before ms?, 6 error text?; `list_dead` adds 7 limit |
//! | `purge` | 1 published age ms, 2 dead age ms (NULL keeps dead letters), 3 limit |
//! | `inbox_record` | 1 consumer, 2 message id |
//! | `inbox_purge` | 1 age ms, 2 limit |
//! | `migration_applied`, `record_migration` | 1 migration id |
//!
//! Rows read back (claim, `list_dead`) have the columns of [`MESSAGE_COLUMNS`] in order,
//! `list_dead` followed by `last_error` and `dead_at`.

use crate::{Dialect, TableNames};

/// Migration files of the outbox table.
pub const OUTBOX_MIGRATIONS: &[(&str, &str)] =
    &[("001_outbox", include_str!("../sql/sqlite/001_outbox.sql"))];
/// Migration files of the inbox table.
pub const INBOX_MIGRATIONS: &[(&str, &str)] =
    &[("001_inbox", include_str!("../sql/sqlite/001_inbox.sql"))];

/// The current time in unix milliseconds, as SQLite computes it (stable within a statement).
///
/// SQLite keeps `now` as whole milliseconds; `julianday` turns it into a float, so the
/// product is rounded back rather than truncated (truncating lands one millisecond early
/// about half of the time). `unixepoch('now', 'subsec')` would need SQLite 3.42.
pub const NOW_MS: &str = "CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)";

/// The columns every message-returning statement yields, in order.
pub const MESSAGE_COLUMNS: &str = "id, destination, event_type, aggregate_type, aggregate_id, partition_key, tenant_id, idempotency_key, payload, content_type, headers, attempts, created_at";

/// Every SQLite statement, rendered for one set of table names.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Statements {
    /// Creates the migrations table.
    pub create_migrations: String,
    /// `(id)` → a row if that migration was applied.
    pub migration_applied: String,
    /// Records a migration: `(id)`.
    pub record_migration: String,
    /// Inserts one message (a batch repeats it in the caller's transaction).
    pub insert: String,
    /// Leases due rows of any destination.
    pub claim: String,
    /// Leases due rows of some destinations.
    pub claim_filtered: String,
    /// Completes leased rows.
    pub complete: String,
    /// Deletes leased rows on publish (delete-on-publish mode).
    pub delete_published: String,
    /// Gives leased rows back.
    pub release: String,
    /// Counts per destination and state.
    pub stats: String,
    /// Lists matching dead letters.
    pub list_dead: String,
    /// Replays matching dead letters.
    pub replay_dead: String,
    /// Deletes matching dead letters.
    pub discard_dead: String,
    /// Deletes one bounded batch of old finished rows.
    pub purge: String,
    /// Records a delivery in the inbox: one row affected if new, zero if a duplicate.
    pub inbox_record: String,
    /// Deletes one bounded batch of old inbox rows.
    pub inbox_purge: String,
}

impl Statements {
    /// Renders every statement for `names`.
    pub fn new(names: &TableNames) -> Self {
        let r = |t: &str| names.render(Dialect::Sqlite, &t.replace("{now}", NOW_MS));
        let dead = |t: &str| r(&t.replace("{dead_filter}", DEAD_FILTER));
        Self {
            create_migrations: r(
                "CREATE TABLE IF NOT EXISTS {migrations} (id TEXT PRIMARY KEY NOT NULL, applied_at INTEGER NOT NULL)",
            ),
            migration_applied: r("SELECT 1 FROM {migrations} WHERE id = ?1"),
            record_migration: r(
                "INSERT OR IGNORE INTO {migrations} (id, applied_at) VALUES (?1, {now})",
            ),
            insert: r(INSERT),
            claim: r(&CLAIM.replace("{filter}", "")),
            claim_filtered: r(&CLAIM.replace(
                "{filter}",
                "AND destination IN (SELECT value FROM json_each(?5))",
            )),
            complete: r(COMPLETE),
            delete_published: r(
                "DELETE FROM {outbox} WHERE id IN (SELECT value FROM json_each(?2)) AND status = 'leased' AND lease_token = ?1 RETURNING id",
            ),
            release: r(RELEASE),
            stats: r(STATS),
            list_dead: dead(LIST_DEAD),
            replay_dead: dead(
                "UPDATE {outbox} SET status = 'pending', available_at = {now}, attempts = 0, dead_at = NULL WHERE {dead_filter}",
            ),
            discard_dead: dead("DELETE FROM {outbox} WHERE {dead_filter}"),
            purge: r(PURGE),
            inbox_record: r(
                "INSERT INTO {inbox} (consumer, message_id, received_at) VALUES (?1, ?2, {now}) ON CONFLICT DO NOTHING",
            ),
            inbox_purge: r(
                "DELETE FROM {inbox} WHERE rowid IN (SELECT rowid FROM {inbox} WHERE received_at <= {now} - ?1 LIMIT ?2)",
            ),
        }
    }
}

const INSERT: &str = "INSERT INTO {outbox} (id, destination, event_type, aggregate_type, aggregate_id, partition_key, tenant_id, idempotency_key, payload, content_type, headers, available_at, created_at)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, COALESCE(?12, {now} + ?13), {now})";

const CLAIM: &str = "UPDATE {outbox}
SET status = 'leased', lease_owner = ?2, lease_token = ?3,
    lease_until = {now} + ?4, available_at = {now} + ?4, attempts = attempts + 1
WHERE id IN (
    SELECT id FROM {outbox}
    WHERE status IN ('pending', 'leased') AND available_at <= {now} {filter}
    ORDER BY available_at, id
    LIMIT ?1
)
RETURNING id, destination, event_type, aggregate_type, aggregate_id, partition_key, tenant_id, idempotency_key, payload, content_type, headers, attempts, created_at";

// RETURNING names the updated table's columns unqualified: SQLite 3.46 rejects `o.id`
// there ("no such column"). The batch's columns are named apart from the table's.
const COMPLETE: &str = "UPDATE {outbox} AS o
SET status = c.new_status,
    available_at = CASE WHEN c.new_status = 'pending' THEN {now} + c.delay_ms END,
    last_error = COALESCE(c.error, o.last_error),
    published_at = CASE WHEN c.new_status = 'published' THEN {now} END,
    dead_at = CASE WHEN c.new_status = 'dead' THEN {now} END,
    lease_owner = NULL, lease_token = NULL, lease_until = NULL
FROM (
    SELECT json_extract(value, '$.id') AS message_id, json_extract(value, '$.status') AS new_status,
           json_extract(value, '$.delay_ms') AS delay_ms, json_extract(value, '$.error') AS error
    FROM json_each(?2)
) AS c
WHERE o.id = c.message_id AND o.status = 'leased' AND o.lease_token = ?1
RETURNING id";

const RELEASE: &str = "UPDATE {outbox}
SET status = 'pending', available_at = {now}, attempts = MAX(attempts - 1, 0),
    lease_owner = NULL, lease_token = NULL, lease_until = NULL
WHERE id IN (SELECT value FROM json_each(?2)) AND status = 'leased' AND lease_token = ?1
RETURNING id";

const STATS: &str = "SELECT destination,
    count(*) FILTER (WHERE status = 'pending') AS pending,
    count(*) FILTER (WHERE status = 'leased') AS leased,
    count(*) FILTER (WHERE status = 'dead') AS dead,
    count(*) FILTER (WHERE status = 'published') AS published,
    min(created_at) FILTER (WHERE status IN ('pending', 'leased')) AS oldest
FROM {outbox} GROUP BY destination ORDER BY destination";

const DEAD_FILTER: &str = "status = 'dead'
  AND (?1 IS NULL OR id IN (SELECT value FROM json_each(?1)))
  AND (?2 IS NULL OR destination IN (SELECT value FROM json_each(?2)))
  AND (?3 IS NULL OR event_type IN (SELECT value FROM json_each(?3)))
  AND (?4 IS NULL OR created_at >= ?4)
  AND (?5 IS NULL OR created_at < ?5)
  AND (?6 IS NULL OR instr(last_error, ?6) > 0)";

const LIST_DEAD: &str = "SELECT id, destination, event_type, aggregate_type, aggregate_id, partition_key, tenant_id, idempotency_key, payload, content_type, headers, attempts, created_at, last_error, dead_at
FROM {outbox} WHERE {dead_filter} ORDER BY id LIMIT ?7";

const PURGE: &str = "DELETE FROM {outbox} WHERE id IN (
    SELECT id FROM {outbox}
    WHERE (status = 'published' AND published_at <= {now} - ?1)
       OR (?2 IS NOT NULL AND status = 'dead' AND dead_at <= {now} - ?2)
    LIMIT ?3
)";
