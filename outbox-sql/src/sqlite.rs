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
//! | `next_seq` | 1 partition_key, 2 count ≥ 1 → `last_seq`, the number of the last of `count` new rows of that key |
//! | `insert` | 1 id, 2 destination, 3 event_type, 4 aggregate_type?, 5 aggregate_id?, 6 partition_key?, 7 tenant_id?, 8 idempotency_key, 9 payload blob, 10 content_type, 11 headers JSON, 12 available_at ms?, 13 delay ms (used when 12 is NULL), 14 seq? (from `next_seq`; NULL without a partition key) |
//! | `claim` | 1 limit, 2 owner, 3 token, 4 lease ms |
//! | `claim_filtered` | as `claim`, 5 destinations JSON array |
//! | [`Statements::claim_ordered`] | as `claim` / `claim_filtered` |
//! | `halted_keys` | none → destination, halted |
//! | `complete` | 1 token, 2 JSON array of `{"id","status","delay_ms","error"}` → returns applied ids |
//! | `reject` | 1 token, 2 rowid (from the claim), 3 reason: dead-letters a claimed row that cannot be read as a message |
//! | `delete_published`, `release` | 1 token, 2 ids JSON array → returns affected ids |
//! | `stats` | none → destination, pending, leased, dead, published, oldest created_at ms |
//! | dead-letter filter (`list_dead`, `count_dead`, `replay_dead`, `discard_dead`) | 1 ids JSON?, 2 destinations JSON?, 3 event types JSON?, 4 created after ms?, 5 created before ms?, 6 error text?, 7 ids above (text)?; `list_dead` adds 8 limit |
//! | `find` | 1 id (lowercase text), 2 idempotency key, 3 limit → [`MESSAGE_COLUMNS`], `status`, `last_error`, `published_at`, `dead_at` |
//! | `purge` | 1 published age ms, 2 dead age ms (NULL keeps dead letters), 3 limit |
//! | `inbox_record` | 1 consumer, 2 message id |
//! | `inbox_purge` | 1 age ms, 2 limit |
//! | `idle_keys` | 1 limit → partition_key |
//! | `lock_key`, `forget_key` | 1 partition key |
//! | `migration_applied`, `record_migration` | 1 migration id |
//!
//! Rows read back (claim, `list_dead`) have the columns of [`MESSAGE_COLUMNS`] in order,
//! the claim followed by `rowid` (the handle `reject` needs when `id` itself is
//! unreadable) and `waited_ms` (from the insert to the claim), `list_dead` by
//! `last_error` and `dead_at`.
//!
//! # Per-key ordering
//!
//! A row with a partition key is numbered when it is enqueued, in the writer's
//! transaction: `next_seq` bumps the key's counter row (in `<outbox>_keys`) and returns
//! the new value, and the row is inserted with it as `seq` (a batch of `n` rows of one key
//! bumps the counter by `n` once and numbers them `last_seq - n + 1 ..= last_seq` in
//! batch order). SQLite has one writer at a time, so the transaction that got number `s`
//! commits (or rolls back, taking its number back with it) before any other transaction
//! can get `s + 1`: `seq` order is commit order. Numbers may have gaps; only their order
//! matters. Anything else that writes the table must number keyed rows the same way, or
//! they are unordered.
//!
//! [`Statements::claim_ordered`] takes a keyed row only if no row of its key and destination with a lower
//! `seq` is pending or leased (or dead, under [`DeadHead::Halt`](outbox_engine::DeadHead)).
//! The claim is one statement, so it sees one consistent state of the table.

use crate::{Admin, Dialect, KEY_IDLE, Shared, TableNames, waiting_filter};

/// Migration files of the outbox table.
pub const OUTBOX_MIGRATIONS: &[(&str, &str)] = &[
    ("001_outbox", include_str!("../sql/sqlite/001_outbox.sql")),
    (
        "002_ordering",
        include_str!("../sql/sqlite/002_ordering.sql"),
    ),
    (
        "003_row_checks",
        include_str!("../sql/sqlite/003_row_checks.sql"),
    ),
    ("004_writers", include_str!("../sql/sqlite/004_writers.sql")),
    ("006_heads", include_str!("../sql/sqlite/006_heads.sql")),
];
/// Migration files of the inbox table.
pub const INBOX_MIGRATIONS: &[(&str, &str)] =
    &[("001_inbox", include_str!("../sql/sqlite/001_inbox.sql"))];

/// The current time in unix milliseconds, as SQLite computes it (stable within a statement).
///
/// SQLite keeps `now` as whole milliseconds; `julianday` turns it into a float, so the
/// product is rounded back rather than truncated (truncating lands one millisecond early
/// about half of the time). `unixepoch('now', 'subsec')` would need SQLite 3.42.
pub const NOW_MS: &str = "CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)";

/// `t` in unix milliseconds, rounded up. Stored times are whole milliseconds, so for a
/// stored `c`, `c >= t` exactly when `c >= ceil_ms(t)` (and likewise for `<`).
///
/// ```
/// use chrono::{TimeZone, Utc};
/// use outbox_sql::sqlite::ceil_ms;
///
/// let t = Utc.timestamp_opt(1, 1).unwrap(); // one second and one nanosecond
/// assert_eq!(ceil_ms(t), 1001);
/// assert_eq!(ceil_ms(Utc.timestamp_opt(1, 0).unwrap()), 1000);
/// ```
pub fn ceil_ms(t: chrono::DateTime<chrono::Utc>) -> i64 {
    let floor = t.timestamp_millis();
    if t.timestamp_subsec_nanos().is_multiple_of(1_000_000) {
        floor
    } else {
        floor.saturating_add(1)
    }
}

/// The columns every message-returning statement yields, in order.
pub const MESSAGE_COLUMNS: &str = "id, destination, event_type, aggregate_type, aggregate_id, partition_key, tenant_id, idempotency_key, payload, content_type, headers, attempts, created_at";

/// Every SQLite statement, rendered for one set of table names.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Statements {
    /// Numbers new rows of one partition key: bumps its counter, returns the last number.
    pub next_seq: String,
    /// Inserts one message (a batch repeats it in the caller's transaction).
    pub insert: String,
    /// Leases due rows of any destination.
    pub claim: String,
    /// Leases due rows of some destinations.
    pub claim_filtered: String,
    /// Per-key ordered claims: `[skip, skip filtered, halt, halt filtered]`.
    claim_ordered: [String; 4],
    /// Completes leased rows.
    pub complete: String,
    /// Dead-letters one claimed row that cannot be read as a message, by `rowid`.
    pub reject: String,
    /// Deletes leased rows on publish (delete-on-publish mode).
    pub delete_published: String,
    /// Gives leased rows back.
    pub release: String,
    /// The statements every dialect has, with the same parameters.
    pub shared: Shared,
    /// Dead letters and purge.
    pub admin: Admin,
}

impl Statements {
    /// Renders every statement for `names`.
    pub fn new(names: &TableNames) -> Self {
        let r = |t: &str| names.render(Dialect::Sqlite, &t.replace("{now}", NOW_MS));
        let dead = |t: &str| r(&t.replace("{dead_filter}", DEAD_FILTER));
        Self {
            next_seq: r(NEXT_SEQ),
            insert: r(INSERT),
            claim: r(&claim("")),
            claim_filtered: r(&claim(&only_destinations("d"))),
            claim_ordered: [(false, false), (true, false), (false, true), (true, true)]
                .map(|(filtered, halt)| r(&claim_ordered(filtered, halt))),
            complete: r(COMPLETE),
            reject: r(REJECT),
            delete_published: r(
                "DELETE FROM {outbox} WHERE id IN (SELECT value FROM json_each(?2)) AND status = 'leased' AND lease_token = ?1 RETURNING id",
            ),
            release: r(RELEASE),
            admin: Admin {
                list_dead: dead(LIST_DEAD),
                list_waiting: r(
                    &LIST_WAITING.replace("{dead_filter}", &waiting_filter(DEAD_FILTER))
                ),
                count_dead: dead("SELECT COUNT(*) AS dead FROM {outbox} WHERE {dead_filter}"),
                replay_dead: dead(
                    "UPDATE {outbox} SET status = 'pending', available_at = {now}, attempts = 0, dead_at = NULL WHERE {dead_filter}",
                ),
                discard_dead: dead("DELETE FROM {outbox} WHERE {dead_filter}"),
                find: r(FIND),
                purge: r(PURGE),
            },
            shared: Shared {
                create_migrations: r(
                    "CREATE TABLE IF NOT EXISTS {migrations} (id TEXT PRIMARY KEY NOT NULL, applied_at INTEGER NOT NULL)",
                ),
                migration_applied: r("SELECT 1 FROM {migrations} WHERE id = ?1"),
                record_migration: r(
                    "INSERT OR IGNORE INTO {migrations} (id, applied_at) VALUES (?1, {now})",
                ),
                stats: r(STATS),
                halted_keys: r(HALTED_KEYS),
                gauges_unfinished: r(GAUGES_UNFINISHED),
                gauges_dead: r(GAUGES_DEAD),
                inbox_record: r(
                    "INSERT INTO {inbox} (consumer, message_id, received_at) VALUES (?1, ?2, {now}) ON CONFLICT DO NOTHING",
                ),
                inbox_purge: r(
                    "DELETE FROM {inbox} WHERE rowid IN (SELECT rowid FROM {inbox} WHERE received_at <= {now} - ?1 LIMIT ?2)",
                ),
                idle_keys: r(&format!(
                    "SELECT k.partition_key FROM {{outbox_keys}} AS k WHERE {KEY_IDLE} LIMIT ?1"
                )),
                lock_key: r("SELECT partition_key FROM {outbox_keys} WHERE partition_key = ?1"),
                forget_key: r(&format!(
                    "DELETE FROM {{outbox_keys}} AS k WHERE k.partition_key = ?1 AND {KEY_IDLE}"
                )),
            },
        }
    }
}

impl Statements {
    /// The claim for per-key ordering; `halt` keeps keys behind a dead head.
    pub fn claim_ordered(&self, filtered: bool, halt: bool) -> &str {
        &self.claim_ordered[usize::from(halt) * 2 + usize::from(filtered)]
    }

    /// The claim `request` needs: of any or some destinations, per-key ordered or not.
    pub fn claim_for(&self, request: &outbox_engine::ClaimRequest) -> &str {
        match crate::ordered_claim(request) {
            Some((filtered, halt)) => self.claim_ordered(filtered, halt),
            None if request.destinations.is_some() => &self.claim_filtered,
            None => &self.claim,
        }
    }
}

/// Keeps the rows of table alias `alias` whose destination is in the bound JSON list `?5`.
fn only_destinations(alias: &str) -> String {
    format!("AND {alias}.destination IN (SELECT value FROM json_each(?5))")
}

fn claim(filter: &str) -> String {
    CLAIM.replace(
        "{due}",
        &format!(
            "SELECT d.id FROM {{outbox}} AS d
    WHERE d.status IN ('pending', 'leased') AND d.available_at <= {{now}} {filter}
    ORDER BY d.available_at, d.id
    LIMIT ?1"
        ),
    )
}

/// The per-key ordered claim: a keyed row is leased only when no row of its key and
/// destination with a lower `seq` holds the key back (is pending or leased, or dead when
/// `halt`). As on PostgreSQL (see `due_ordered` there), only a window of the earliest due
/// rows, four times the limit, is checked row by row; when it yields fewer than the limit,
/// the head of each (key, destination) pair is looked up by a skip scan of the head index,
/// and the earliest unkeyed rows are read from their own index, so a backlog held back
/// behind a few heads costs a probe per key, not per row.
///
/// Every status list repeats an index's condition word for word: SQLite uses a partial
/// index only when the query contains its WHERE terms, and would otherwise scan.
fn claim_ordered(filtered: bool, halt: bool) -> String {
    let holding = |alias: &str| {
        let all = format!("{alias}.status IN ('pending', 'leased', 'dead')");
        if halt {
            all
        } else {
            format!("{all} AND {alias}.status <> 'dead'")
        }
    };
    let only = |alias: &str| {
        if filtered {
            only_destinations(alias)
        } else {
            String::new()
        }
    };
    let (hold_p, hold_x) = (holding("p"), holding("x"));
    let (only_c, only_q, only_f, only_d) = (only("c"), only("q"), only("f"), only("d"));
    CLAIM.replace(
        "{due}",
        &format!(
            "WITH RECURSIVE front AS MATERIALIZED (
        SELECT w.id FROM (
            SELECT c.id, c.partition_key, c.destination, c.seq FROM {{outbox}} AS c
            WHERE c.status IN ('pending', 'leased') AND c.available_at <= {{now}} {only_c}
            ORDER BY c.available_at, c.id LIMIT ?1 * 4) AS w
        WHERE w.seq IS NULL OR NOT EXISTS (SELECT 1 FROM {{outbox}} AS p WHERE p.partition_key = w.partition_key AND p.destination = w.destination AND p.seq < w.seq AND {hold_p})
        LIMIT ?1
    ),
    pairs(partition_key, destination) AS (
        SELECT * FROM (
            SELECT k.partition_key, k.destination FROM {{outbox}} AS k
            WHERE k.partition_key IS NOT NULL AND k.status IN ('pending', 'leased', 'dead')
            ORDER BY k.partition_key, k.destination LIMIT 1)
        UNION ALL
        SELECT n.partition_key, n.destination FROM pairs AS q JOIN {{outbox}} AS n ON n.rowid = (
            SELECT k.rowid FROM {{outbox}} AS k
            WHERE k.partition_key IS NOT NULL AND k.status IN ('pending', 'leased', 'dead')
              AND (k.partition_key, k.destination) > (q.partition_key, q.destination)
            ORDER BY k.partition_key, k.destination LIMIT 1)
    )
    SELECT d.id FROM {{outbox}} AS d
    WHERE d.id IN (
            SELECT id FROM front
            UNION ALL
            SELECT id FROM (
                SELECT h.id FROM (
                    SELECT (SELECT x.id FROM {{outbox}} AS x
                            WHERE x.partition_key = q.partition_key AND x.destination = q.destination AND {hold_x}
                            ORDER BY x.seq LIMIT 1) AS id
                    FROM pairs AS q
                    WHERE (SELECT count(*) FROM front) < ?1 {only_q}) AS h
                WHERE EXISTS (SELECT 1 FROM {{outbox}} AS y WHERE y.id = h.id AND y.status IN ('pending', 'leased') AND y.available_at <= {{now}})
                LIMIT ?1)
            UNION ALL
            SELECT id FROM (
                SELECT f.id FROM {{outbox}} AS f
                WHERE f.partition_key IS NULL AND f.status IN ('pending', 'leased') AND f.available_at <= {{now}} {only_f}
                  AND (SELECT count(*) FROM front) < ?1
                ORDER BY f.available_at, f.id LIMIT ?1)
        )
      AND d.status IN ('pending', 'leased') AND d.available_at <= {{now}} {only_d}
    ORDER BY d.available_at, d.id
    LIMIT ?1"
        ),
    )
}

const HALTED_KEYS: &str = "SELECT d.destination, count(DISTINCT d.partition_key) AS halted
FROM {outbox} AS d
WHERE d.status = 'dead' AND d.seq IS NOT NULL
  AND EXISTS (SELECT 1 FROM {outbox} AS p WHERE p.partition_key = d.partition_key AND p.destination = d.destination AND p.seq > d.seq AND p.status IN ('pending', 'leased', 'dead') AND p.status <> 'dead')
GROUP BY d.destination";

const NEXT_SEQ: &str = "INSERT INTO {outbox_keys} (partition_key, last_seq) VALUES (?1, ?2)
ON CONFLICT (partition_key) DO UPDATE SET last_seq = last_seq + excluded.last_seq
RETURNING last_seq";

const INSERT: &str = "INSERT INTO {outbox} (id, destination, event_type, aggregate_type, aggregate_id, partition_key, tenant_id, idempotency_key, payload, content_type, headers, available_at, created_at, seq)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, COALESCE(?12, {now} + ?13), {now}, ?14)";

const CLAIM: &str = "UPDATE {outbox}
SET status = 'leased', lease_owner = ?2, lease_token = ?3,
    lease_until = {now} + ?4, available_at = {now} + ?4, attempts = attempts + 1
WHERE id IN (
    {due}
)
RETURNING id, destination, event_type, aggregate_type, aggregate_id, partition_key, tenant_id, idempotency_key, payload, content_type, headers, attempts, created_at, rowid,
    {now} - created_at AS waited_ms";

const REJECT: &str = "UPDATE {outbox}
SET status = 'dead', available_at = NULL, dead_at = {now}, last_error = ?3,
    lease_owner = NULL, lease_token = NULL, lease_until = NULL
WHERE rowid = ?2 AND status = 'leased' AND lease_token = ?1";

// RETURNING names the updated table's columns unqualified: SQLite 3.46 rejects `o.id`
// there ("no such column"). The batch's columns are named apart from the table's.
const COMPLETE: &str = "UPDATE {outbox} AS o
SET status = CASE WHEN c.new_status = 'deferred' THEN 'pending' ELSE c.new_status END,
    available_at = CASE WHEN c.new_status IN ('pending', 'deferred') THEN {now} + c.delay_ms END,
    attempts = CASE WHEN c.new_status = 'deferred' THEN MAX(o.attempts - 1, 0) ELSE o.attempts END,
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

const GAUGES_UNFINISHED: &str = "SELECT destination,
    count(*) FILTER (WHERE status = 'pending') AS pending,
    count(*) FILTER (WHERE status = 'leased') AS leased,
    {now} - min(created_at) AS oldest_ms
FROM (SELECT destination, status, created_at FROM {outbox}
      WHERE status IN ('pending', 'leased') ORDER BY available_at, id LIMIT ?1) AS unfinished
GROUP BY destination";

const GAUGES_DEAD: &str = "SELECT destination, count(*) AS dead
FROM (SELECT destination FROM {outbox} WHERE status = 'dead' LIMIT ?1) AS dead
GROUP BY destination";

const DEAD_FILTER: &str = "status = 'dead'
  AND (?1 IS NULL OR id IN (SELECT value FROM json_each(?1)))
  AND (?2 IS NULL OR destination IN (SELECT value FROM json_each(?2)))
  AND (?3 IS NULL OR event_type IN (SELECT value FROM json_each(?3)))
  AND (?4 IS NULL OR created_at >= ?4)
  AND (?5 IS NULL OR created_at < ?5)
  AND (?6 IS NULL OR instr(last_error, ?6) > 0)
  AND (?7 IS NULL OR id > ?7)";

const LIST_DEAD: &str = "SELECT id, destination, event_type, aggregate_type, aggregate_id, partition_key, tenant_id, idempotency_key, payload, content_type, headers, attempts, created_at, last_error, dead_at
FROM {outbox} WHERE {dead_filter} ORDER BY id LIMIT ?8";

const LIST_WAITING: &str = "SELECT id, destination, event_type, aggregate_type, aggregate_id, partition_key, tenant_id, idempotency_key, payload, content_type, headers, attempts, created_at, status, last_error, available_at
FROM {outbox} WHERE {dead_filter} ORDER BY id LIMIT ?8";

const FIND: &str = "SELECT id, destination, event_type, aggregate_type, aggregate_id, partition_key, tenant_id, idempotency_key, payload, content_type, headers, attempts, created_at, status, last_error, published_at, dead_at
FROM {outbox} WHERE id = ?1 OR idempotency_key = ?2 ORDER BY id LIMIT ?3";

const PURGE: &str = "DELETE FROM {outbox} WHERE id IN (
    SELECT id FROM {outbox}
    WHERE (status = 'published' AND published_at <= {now} - ?1)
       OR (?2 IS NOT NULL AND status = 'dead' AND dead_at <= {now} - ?2)
    LIMIT ?3
)";
