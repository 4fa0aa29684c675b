//! MySQL 8 / MariaDB ≥ 10.6 statements.
//!
//! Times are UTC `DATETIME(6)` computed by the server (`UTC_TIMESTAMP(6)`); ids and tokens
//! are UUID text (lowercase, hyphenated, so text order is id order). MySQL has no
//! `UPDATE … RETURNING` and no array parameters, so the claim and completions run as
//! short transactions of a few statements, and statements that take a list of ids are
//! built for the list's length (`?` placeholders only; no value is ever written into
//! SQL). A list statement may be given the same id more than once, so callers can pad a
//! list to a few fixed lengths and keep the prepared statements cached.
//!
//! Relay transactions (claim, complete, release, purge, dead-letter changes) should run
//! at [`RELAY_ISOLATION`]: under `REPEATABLE READ` InnoDB takes gap locks on the ranges a
//! claim scans, which block concurrent enqueues until the claim commits.
//!
//! The claim is `claim_select` then `claim_lease` for the selected ids, in one
//! transaction; the selected rows are returned with `attempts + 1` (an ordered claim
//! finds its candidates in up to five statements and checks them with `heads` in
//! between; see below). A completion is `lock_leased` (the rows it returns are the ones
//! still held, the others are stale), then `publish` / `delete_published` / `release`
//! for the held ids and one `retry` or `dead` per held row, in one transaction.
//!
//! | statement | parameters (`?`, in order) |
//! |---|---|
//! | `next_seq` | partition_key, count ≥ 1, count → the connection's `LAST_INSERT_ID()` (the OK packet's last insert id) is the number of the last of `count` new rows of that key |
//! | `insert` | id, destination, event_type, aggregate_type?, aggregate_id?, partition_key?, tenant_id?, idempotency_key, payload, content_type, headers JSON, available_at? (UTC), delay ms (used when available_at is NULL), seq? (from `next_seq`; NULL without a partition key) |
//! | [`Statements::insert_batch`] | the fourteen above, per row |
//! | [`Statements::claim_select`] | destinations… (when filtered), limit → [`MESSAGE_COLUMNS`], `waited_ms` (from the insert, by the server's clock) |
//! | `window_end` | offset → `available_at`, `id` |
//! | [`Statements::claim_select_ordered`] | destinations…, (with a window: end `available_at`, end `available_at`, end id), limit → as `claim_select` |
//! | [`Statements::claim_heads`] | destinations… once per holding status, limit → id, `available_at` |
//! | [`Statements::claim_unkeyed`] | destinations…, limit → id, `available_at` |
//! | [`Statements::claim_candidates`] | ids… → as `claim_select` |
//! | [`Statements::heads`] | ids… → the ids no earlier row of their key holds back |
//! | [`Statements::claim_lease`] | owner, token, lease ms, lease ms, ids… |
//! | [`Statements::lock_leased`] | ids…, token → the ids still held |
//! | [`Statements::publish`], [`Statements::delete_published`], [`Statements::release`] | ids…, token |
//! | `retry` | delay ms, error, id, token |
//! | `dead` | reason, id, token |
//! | `reject` | reason, id: dead-letters a row the claim has locked but cannot read as a message |
//! | `stats` | none → destination, pending, leased, dead, published, oldest |
//! | `gauges_unfinished`, `gauges_dead` | limit |
//! | `halted_keys` | none → destination, halted |
//! | [`Statements::dead_filter`] users | ids…, destinations…, event types…, after?, before?, error?, ids above? (each only when set in the [`DeadFilterShape`]); `list_dead` adds limit and yields [`MESSAGE_COLUMNS`], `last_error`, `dead_at` |
//! | `purge_published` | age ms, limit |
//! | `purge_dead` | age ms, limit |
//! | `check_outbox`, `check_keys`, `check_inbox` | none (fail if a column is missing) |
//! | `migration_lock` | name, timeout s → 1 when held |
//! | `migration_unlock`, `migration_applied`, `record_migration` | name / migration id |
//! | `inbox_record` | consumer, message id → 1 row affected if new, 0 if a duplicate |
//! | `inbox_purge` | age ms, limit |
//! | `idle_keys` | limit → partition_key |
//! | `lock_key`, `forget_key` | partition key |
//!
//! Millisecond parameters are multiplied by 1,000 in SQL, so they must stay below about
//! 9.2 × 10¹⁵; callers clamp durations to a sane maximum (far beyond any retry delay).
//!
//! # Per-key ordering
//!
//! A row with a partition key is numbered when it is enqueued, in the writer's
//! transaction: `next_seq` bumps the key's counter row (in `<outbox>_keys`) and hands the
//! new value back through `LAST_INSERT_ID(expr)`, and the row is inserted with it as
//! `seq` (a batch of `n` rows of one key bumps the counter by `n` once and numbers them
//! `last - n + 1 ..= last` in batch order). InnoDB keeps the counter row locked until the
//! writer's transaction ends, so a second writer of the same key waits there until the
//! first commits or rolls back: `seq` order is commit order. Writers of different keys
//! lock different counter rows and do not wait for each other. A transaction that
//! numbers several keys should do so in one order (sorted), as any transaction locking
//! several rows should, or two such transactions can deadlock; InnoDB then rolls one back.
//! Numbers may have gaps; only their order matters. Anything else that writes the table
//! must number keyed rows the same way, or they are unordered.
//!
//! An ordered claim (`claim_select_ordered`) takes a keyed row only if no row of its key
//! and destination with a lower `seq` is pending or leased (or dead, under `halt`): its
//! `seq` is at most the lowest `seq` of its key and destination in each of those states,
//! each found by one dive into the head index `(head_key, destination, status, seq)`
//! (`head_key` is the partition key of unfinished rows, NULL once published), so the check
//! costs the same however long the key's history or backlog. Those subqueries are plain
//! consistent reads: the statement's `FOR UPDATE SKIP LOCKED` applies to the outer rows
//! only, so a head another relay is claiming right now is skipped but still seen by the
//! subqueries (checked on MariaDB 10.11; MySQL documents that a locking clause does not
//! reach nested subqueries). The outer rows are locking reads of their newest committed
//! versions, while InnoDB keeps one read view for the whole statement, opened at its
//! first consistent read; so a row committed after that view opened can pass the check
//! while its predecessor, committed just before it, is not in the view. The candidates
//! with a key are therefore checked again with [`Statements::heads`], a new statement (a
//! new view, at `READ COMMITTED`) run once the candidates are locked, and only the rows
//! it returns are leased.
//!
//! The walk tests only a window of due rows, four times the batch (decision 0034):
//! `window_end` finds where it ends, and when more rows are due than that, the walk stops
//! there. If it found fewer rows than the batch, [`Statements::claim_heads`] reads the
//! due heads of every pair, [`Statements::claim_unkeyed`] the earliest unkeyed due rows,
//! and [`Statements::claim_candidates`] locks the earliest of those, so a backlog waiting
//! behind held-back heads is never read row by row.

use crate::{Dialect, Shared, TableNames};

/// Migration files of the outbox table.
pub const OUTBOX_MIGRATIONS: &[(&str, &str)] = &[
    ("001_outbox", include_str!("../sql/mysql/001_outbox.sql")),
    (
        "002_ordering",
        include_str!("../sql/mysql/002_ordering.sql"),
    ),
    ("004_writers", include_str!("../sql/mysql/004_writers.sql")),
    ("006_heads", include_str!("../sql/mysql/006_heads.sql")),
];
/// Migration files of the inbox table.
pub const INBOX_MIGRATIONS: &[(&str, &str)] =
    &[("001_inbox", include_str!("../sql/mysql/001_inbox.sql"))];

/// The columns every message-returning statement yields, in order.
pub const MESSAGE_COLUMNS: &str = "id, destination, event_type, aggregate_type, aggregate_id, partition_key, tenant_id, idempotency_key, payload, content_type, headers, attempts, created_at";

/// Run before starting a relay transaction (it applies to the next transaction only).
pub const RELAY_ISOLATION: &str = "SET TRANSACTION ISOLATION LEVEL READ COMMITTED";

/// Longest `last_error` the table keeps, in bytes (`TEXT`); callers cut longer reasons.
pub const MAX_ERROR_BYTES: usize = 65_535;

/// Longest `lease_owner` the table keeps, in characters; callers cut longer names.
pub const MAX_OWNER_CHARS: usize = 255;

/// Which parts of a dead-letter filter are set, and how many values each list has.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeadFilterShape {
    /// Number of ids (0 = no id condition).
    pub ids: usize,
    /// Number of destinations.
    pub destinations: usize,
    /// Number of event types.
    pub event_types: usize,
    /// A lower bound on `created_at` is bound.
    pub after: bool,
    /// An upper bound on `created_at` is bound.
    pub before: bool,
    /// An error substring is bound.
    pub error: bool,
    /// A lower bound (exclusive) on the id is bound: the next page of a list.
    pub after_id: bool,
}

/// Every MySQL statement for one set of table names; list statements are built per call.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Statements {
    outbox: String,
    due_index: String,
    head_index: String,
    unkeyed_index: String,
    /// The lowest `seq` of `d`'s key among pending, leased and dead rows.
    lowest_seq: [String; 3],
    insert_head: String,
    /// The end of an ordered claim's window: `(offset)` → `available_at`, `id` of the due
    /// row that many rows into due order, or no row when fewer are due. Reads the due
    /// index only (finished rows have no `available_at`).
    pub window_end: String,
    /// Takes the migration lock: `(name, timeout s)` → 1 when held.
    pub migration_lock: String,
    /// Releases the migration lock: `(name)`.
    pub migration_unlock: String,
    /// Reads no row but names every outbox column: fails if the table is not an outbox.
    pub check_outbox: String,
    /// Reads no row but names every column of the key counters: fails if that table is
    /// not ours.
    pub check_keys: String,
    /// Reads no row but names every inbox column: fails if the table is not an inbox.
    pub check_inbox: String,
    /// Numbers new rows of one partition key: bumps its counter; the last number is the
    /// statement's last insert id.
    pub next_seq: String,
    /// Inserts one message.
    pub insert: String,
    /// Schedules one leased row again.
    pub retry: String,
    /// Schedules one leased row again and gives the attempt back (a deferred failure):
    /// delay ms, error, id, token.
    pub defer: String,
    /// Dead-letters one leased row.
    pub dead: String,
    /// Dead-letters one row locked by a claim (not yet leased) that cannot be read as a
    /// message; the claim counts as an attempt.
    pub reject: String,
    /// Deletes one bounded batch of old published rows.
    pub purge_published: String,
    /// Deletes one bounded batch of old dead letters.
    pub purge_dead: String,
    /// The statements every dialect has, with the same parameters.
    pub shared: Shared,
}

const NOW: &str = "UTC_TIMESTAMP(6)";
const LEASE_CLEARED: &str = "lease_owner = NULL, lease_token = NULL, lease_until = NULL";

/// `AND <prefix>destination IN (?, …)` for `destinations` values, or nothing.
fn destination_filter(prefix: &str, destinations: usize) -> String {
    if destinations == 0 {
        String::new()
    } else {
        format!("AND {prefix}destination IN ({}) ", list(destinations))
    }
}

fn list(n: usize) -> String {
    let mut s = String::with_capacity(n * 3);
    for i in 0..n {
        s.push_str(if i == 0 { "?" } else { ", ?" });
    }
    s
}

impl Statements {
    /// Renders the fixed statements for `names`.
    pub fn new(names: &TableNames) -> Self {
        // Only the templates are expanded; the quoted names are substituted last, in
        // one pass, so a name can never be rewritten into SQL.
        let r = |t: &str| {
            names.render(
                Dialect::MySql,
                &t.replace("{now}", NOW).replace("{cleared}", LEASE_CLEARED),
            )
        };
        Self {
            outbox: r("{outbox}"),
            due_index: r("{outbox_due_idx}"),
            head_index: r("{outbox_trg:head_idx}"),
            unkeyed_index: r("{outbox_trg:unkeyed_idx}"),
            lowest_seq: ["pending", "leased", "dead"].map(|status| r(&key_seq(status, "ASC"))),
            insert_head: r(INSERT_HEAD),
            window_end: r(
                "SELECT available_at, id FROM {outbox} FORCE INDEX ({outbox_due_idx}) WHERE available_at <= {now} ORDER BY available_at, id LIMIT 1 OFFSET ?",
            ),
            migration_lock: "SELECT GET_LOCK(?, ?) AS locked".to_owned(),
            migration_unlock: "SELECT RELEASE_LOCK(?)".to_owned(),
            check_outbox: r(&format!(
                "SELECT {MESSAGE_COLUMNS}, status, available_at, lease_owner, lease_token, lease_until, last_error, published_at, dead_at, seq FROM {{outbox}} WHERE 1 = 0"
            )),
            check_keys: r("SELECT partition_key, last_seq FROM {outbox_keys} WHERE 1 = 0"),
            check_inbox: r("SELECT consumer, message_id, received_at FROM {inbox} WHERE 1 = 0"),
            next_seq: r(NEXT_SEQ),
            insert: r(&format!("{INSERT_HEAD} {INSERT_ROW}")),
            retry: r(
                "UPDATE {outbox} SET status = 'pending', available_at = {now} + INTERVAL (? * 1000) MICROSECOND, last_error = ?, {cleared} WHERE id = ? AND status = 'leased' AND lease_token = ?",
            ),
            defer: r(
                "UPDATE {outbox} SET status = 'pending', available_at = {now} + INTERVAL (? * 1000) MICROSECOND, last_error = ?, attempts = GREATEST(attempts - 1, 0), {cleared} WHERE id = ? AND status = 'leased' AND lease_token = ?",
            ),
            dead: r(
                "UPDATE {outbox} SET status = 'dead', available_at = NULL, dead_at = {now}, last_error = ?, {cleared} WHERE id = ? AND status = 'leased' AND lease_token = ?",
            ),
            reject: r(
                "UPDATE {outbox} SET status = 'dead', available_at = NULL, dead_at = {now}, last_error = ?, attempts = attempts + 1, {cleared} WHERE id = ?",
            ),
            purge_published: r(
                "DELETE FROM {outbox} WHERE status = 'published' AND published_at <= {now} - INTERVAL (? * 1000) MICROSECOND ORDER BY published_at, id LIMIT ?",
            ),
            purge_dead: r(
                "DELETE FROM {outbox} WHERE status = 'dead' AND dead_at <= {now} - INTERVAL (? * 1000) MICROSECOND ORDER BY dead_at, id LIMIT ?",
            ),
            shared: Shared {
                create_migrations: r(
                    "CREATE TABLE IF NOT EXISTS {migrations} (id VARCHAR(255) NOT NULL PRIMARY KEY, applied_at DATETIME(6) NOT NULL) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin",
                ),
                migration_applied: r("SELECT 1 FROM {migrations} WHERE id = ?"),
                record_migration: r(
                    "INSERT IGNORE INTO {migrations} (id, applied_at) VALUES (?, {now})",
                ),
                stats: r(STATS),
                gauges_unfinished: r(GAUGES_UNFINISHED),
                gauges_dead: r(GAUGES_DEAD),
                halted_keys: r(&HALTED_KEYS
                    .replace("{key_seq_pending}", &key_seq("pending", "DESC"))
                    .replace("{key_seq_leased}", &key_seq("leased", "DESC"))),
                inbox_record: r(
                    "INSERT IGNORE INTO {inbox} (consumer, message_id, received_at) VALUES (?, ?, {now})",
                ),
                inbox_purge: r(
                    "DELETE FROM {inbox} WHERE received_at <= {now} - INTERVAL (? * 1000) MICROSECOND ORDER BY received_at, consumer, message_id LIMIT ?",
                ),
                idle_keys: r(&format!(
                    "SELECT k.partition_key FROM {{outbox_keys}} AS k WHERE {KEY_IDLE} LIMIT ?"
                )),
                lock_key: r(
                    "SELECT partition_key FROM {outbox_keys} WHERE partition_key = ? FOR UPDATE SKIP LOCKED",
                ),
                forget_key: r(&format!(
                    "DELETE k FROM {{outbox_keys}} AS k WHERE k.partition_key = ? AND {KEY_IDLE}"
                )),
            },
        }
    }

    /// Inserts `rows` messages in one statement.
    pub fn insert_batch(&self, rows: usize) -> String {
        let row = INSERT_ROW.replace("{now}", NOW);
        let mut sql = String::with_capacity(self.insert_head.len() + rows * (row.len() + 2));
        sql.push_str(&self.insert_head);
        for i in 0..rows {
            sql.push_str(if i == 0 { " " } else { ", " });
            sql.push_str(&row);
        }
        sql
    }

    /// Selects and locks up to `limit` due rows (pending and due, or leased with a lapsed
    /// lease), oldest first, skipping rows other transactions hold. The due index is
    /// forced so the scan stops after `limit` rows and locks nothing else.
    pub fn claim_select(&self, destinations: usize) -> String {
        self.select_due(destinations, "")
    }

    /// As [`claim_select`](Self::claim_select), but only rows without a partition key
    /// and keyed rows no earlier row of their key holds back (pending or leased, or dead
    /// when `halt`). With `window`, only rows up to the window's end (from
    /// [`window_end`](Self::window_end)) are tested, so a claim whose earliest rows all wait
    /// behind held-back heads stops there; [`claim_heads`](Self::claim_heads) then finds
    /// the heads the window did not hold. Check the keyed candidates again with
    /// [`heads`](Self::heads) before leasing them (see the
    /// [module documentation](self#per-key-ordering)).
    pub fn claim_select_ordered(&self, destinations: usize, halt: bool, window: bool) -> String {
        let window = if window {
            "AND (d.available_at < ? OR (d.available_at = ? AND d.id <= ?)) "
        } else {
            ""
        };
        self.select_due(
            destinations,
            &format!("{window}AND {} ", self.head_condition(halt)),
        )
    }

    /// The due heads of the (key, destination) pairs that have unfinished rows, earliest
    /// first, at most `limit` (id and `available_at` of each): with
    /// [`claim_unkeyed`](Self::claim_unkeyed), the rows an ordered claim locks with
    /// [`claim_candidates`](Self::claim_candidates) when its window held fewer heads than
    /// it wants. A plain read, whose cost grows with the pairs, not with the rows waiting
    /// behind their heads: the lowest `seq` of each pair in each holding status comes from
    /// a loose scan of the head index (one probe per pair), a window function keeps each
    /// pair's lowest, and the join back to its row binds every column of the index (the
    /// join order is fixed: taken the other way round, it scans the table).
    pub fn claim_heads(&self, destinations: usize, halt: bool) -> String {
        let statuses: &[&str] = if halt {
            &["pending", "leased", "dead"]
        } else {
            &["pending", "leased"]
        };
        let lowest: Vec<String> = statuses
            .iter()
            .map(|status| {
                format!(
                    "(SELECT head_key, destination, status, MIN(seq) AS seq FROM {} FORCE INDEX ({}) WHERE status = '{status}' {}GROUP BY head_key, destination, status LIMIT {BARRIER})",
                    self.outbox,
                    self.head_index,
                    destination_filter("", destinations)
                )
            })
            .collect();
        format!(
            "SELECT x.id, x.available_at FROM (SELECT s.head_key, s.destination, s.status, s.seq, ROW_NUMBER() OVER (PARTITION BY s.head_key, s.destination ORDER BY s.seq) AS n FROM ({}) AS s) AS h STRAIGHT_JOIN {outbox} AS x FORCE INDEX ({head}) ON x.head_key = h.head_key AND x.destination = h.destination AND x.status = h.status AND x.seq = h.seq WHERE h.n = 1 AND h.status IN ('pending', 'leased') AND x.available_at <= {NOW} ORDER BY x.available_at, x.id LIMIT ?",
            lowest.join(" UNION ALL "),
            outbox = self.outbox,
            head = self.head_index,
        )
    }

    /// The earliest due rows without a partition key, at most `limit` (id and
    /// `available_at` of each), from their own index: a backlog of keyed rows waiting
    /// behind their heads cannot hide them.
    pub fn claim_unkeyed(&self, destinations: usize) -> String {
        format!(
            "SELECT u.id, u.available_at FROM {} AS u FORCE INDEX ({}) WHERE u.partition_key IS NULL AND u.available_at <= {NOW} {}ORDER BY u.available_at, u.id LIMIT ?",
            self.outbox,
            self.unkeyed_index,
            destination_filter("u.", destinations)
        )
    }

    /// Locks the rows of `ids` that are still due, skipping rows other transactions hold:
    /// `(ids…)` → [`MESSAGE_COLUMNS`], `waited_ms`. The primary key is forced: ordered
    /// by the due index, MySQL would scan it for the ids.
    pub fn claim_candidates(&self, ids: usize) -> String {
        format!(
            "SELECT {}, CAST(TIMESTAMPDIFF(MICROSECOND, d.created_at, {NOW}) DIV 1000 AS SIGNED) AS waited_ms FROM {} AS d FORCE INDEX (PRIMARY) WHERE d.id IN ({}) AND d.status IN ('pending', 'leased') AND d.available_at <= {NOW} FOR UPDATE SKIP LOCKED",
            qualified_columns(),
            self.outbox,
            list(ids)
        )
    }

    /// `d` has no key, or no row of its key and destination with a lower `seq` holds the
    /// key back: `d.seq` is at most the lowest `seq` of the key in each holding status
    /// (pending, leased, and dead when `halt`). Each lowest `seq` is one dive into the head
    /// index, `(head_key, destination, status, seq)`, by `ORDER BY seq LIMIT 1`; a `NOT
    /// EXISTS (… p.seq < d.seq)` would make MySQL read every entry of the key with that
    /// status (a dependent subquery uses `ref` access, without a range on `seq`), and with
    /// `status IN (…)`, every entry of the key.
    fn head_condition(&self, halt: bool) -> String {
        let holding = if halt { 3 } else { 2 };
        let checks: Vec<String> = self.lowest_seq[..holding]
            .iter()
            .map(|lowest| format!("d.seq <= COALESCE({lowest}, d.seq)"))
            .collect();
        format!("(d.seq IS NULL OR ({}))", checks.join(" AND "))
    }

    fn select_due(&self, destinations: usize, ordering: &str) -> String {
        let filter = destination_filter("d.", destinations);
        format!(
            "SELECT {}, CAST(TIMESTAMPDIFF(MICROSECOND, d.created_at, {NOW}) DIV 1000 AS SIGNED) AS waited_ms FROM {} AS d FORCE INDEX ({}) WHERE d.status IN ('pending', 'leased') AND d.available_at <= {NOW} {filter}{ordering}ORDER BY d.available_at, d.id LIMIT ? FOR UPDATE SKIP LOCKED",
            qualified_columns(),
            self.outbox,
            self.due_index
        )
    }

    /// Of `ids`, the ones that are heads of their key (or have no key): a plain
    /// consistent read, so at `READ COMMITTED` it sees every row committed before it
    /// started. Run it after `claim_select_ordered` locked the candidates.
    pub fn heads(&self, ids: usize, halt: bool) -> String {
        format!(
            "SELECT d.id FROM {} AS d WHERE d.id IN ({}) AND {}",
            self.outbox,
            list(ids),
            self.head_condition(halt)
        )
    }

    /// Leases the selected rows: the lease deadline goes to `lease_until` and to
    /// `available_at`, so a lapsed lease is due again.
    pub fn claim_lease(&self, ids: usize) -> String {
        format!(
            "UPDATE {} SET status = 'leased', lease_owner = ?, lease_token = ?, lease_until = {NOW} + INTERVAL (? * 1000) MICROSECOND, available_at = {NOW} + INTERVAL (? * 1000) MICROSECOND, attempts = attempts + 1 WHERE id IN ({})",
            self.outbox,
            list(ids)
        )
    }

    /// Locks the rows of `ids` that are still leased with the token, returning their ids.
    pub fn lock_leased(&self, ids: usize) -> String {
        format!(
            "SELECT id FROM {} WHERE id IN ({}) AND status = 'leased' AND lease_token = ? FOR UPDATE",
            self.outbox,
            list(ids)
        )
    }

    /// Marks leased rows published.
    pub fn publish(&self, ids: usize) -> String {
        format!(
            "UPDATE {} SET status = 'published', available_at = NULL, published_at = {NOW}, {LEASE_CLEARED} WHERE id IN ({}) AND status = 'leased' AND lease_token = ?",
            self.outbox,
            list(ids)
        )
    }

    /// Deletes leased rows on publish (delete-on-publish mode).
    pub fn delete_published(&self, ids: usize) -> String {
        format!(
            "DELETE FROM {} WHERE id IN ({}) AND status = 'leased' AND lease_token = ?",
            self.outbox,
            list(ids)
        )
    }

    /// Gives leased rows back without counting the attempt.
    pub fn release(&self, ids: usize) -> String {
        format!(
            "UPDATE {} SET status = 'pending', available_at = {NOW}, attempts = GREATEST(attempts - 1, 0), {LEASE_CLEARED} WHERE id IN ({}) AND status = 'leased' AND lease_token = ?",
            self.outbox,
            list(ids)
        )
    }

    /// The `WHERE` clause of a dead-letter operation.
    pub fn dead_filter(&self, shape: DeadFilterShape) -> String {
        let mut sql = String::from("status = 'dead'");
        if shape.ids > 0 {
            sql.push_str(&format!(" AND id IN ({})", list(shape.ids)));
        }
        if shape.destinations > 0 {
            sql.push_str(&format!(
                " AND destination IN ({})",
                list(shape.destinations)
            ));
        }
        if shape.event_types > 0 {
            sql.push_str(&format!(" AND event_type IN ({})", list(shape.event_types)));
        }
        if shape.after {
            sql.push_str(" AND created_at >= ?");
        }
        if shape.before {
            sql.push_str(" AND created_at < ?");
        }
        if shape.error {
            sql.push_str(" AND LOCATE(?, last_error) > 0");
        }
        if shape.after_id {
            sql.push_str(" AND id > ?");
        }
        sql
    }

    /// Finds messages by id or idempotency key, in any state: `(id, key, limit)` →
    /// [`MESSAGE_COLUMNS`], `status`, `last_error`, `published_at`, `dead_at`.
    pub fn find(&self) -> String {
        format!(
            "SELECT {MESSAGE_COLUMNS}, status, last_error, published_at, dead_at FROM {} WHERE id = ? OR idempotency_key = ? ORDER BY id LIMIT ?",
            self.outbox
        )
    }

    /// Lists matching dead letters, oldest first; the last parameter is the limit.
    pub fn list_dead(&self, shape: DeadFilterShape) -> String {
        format!(
            "SELECT {MESSAGE_COLUMNS}, last_error, dead_at FROM {} WHERE {} ORDER BY id LIMIT ?",
            self.outbox,
            self.dead_filter(shape)
        )
    }

    /// Lists the pending and leased rows the filter matches, oldest first, with `status`,
    /// `last_error` and `available_at`; the last parameter is the limit.
    pub fn list_waiting(&self, shape: DeadFilterShape) -> String {
        format!(
            "SELECT {MESSAGE_COLUMNS}, status, last_error, available_at FROM {} WHERE {} ORDER BY id LIMIT ?",
            self.outbox,
            crate::waiting_filter(&self.dead_filter(shape))
        )
    }

    /// Replays matching dead letters: pending, due now, zero attempts, reason kept.
    pub fn replay_dead(&self, shape: DeadFilterShape) -> String {
        format!(
            "UPDATE {} SET status = 'pending', available_at = {NOW}, attempts = 0, dead_at = NULL WHERE {}",
            self.outbox,
            self.dead_filter(shape)
        )
    }

    /// Deletes matching dead letters.
    pub fn discard_dead(&self, shape: DeadFilterShape) -> String {
        format!(
            "DELETE FROM {} WHERE {}",
            self.outbox,
            self.dead_filter(shape)
        )
    }

    /// Counts matching dead letters.
    pub fn count_dead(&self, shape: DeadFilterShape) -> String {
        format!(
            "SELECT COUNT(*) AS dead FROM {} WHERE {}",
            self.outbox,
            self.dead_filter(shape)
        )
    }
}

/// Most ids one list statement takes (the padded length never exceeds it).
pub const ID_CHUNK: usize = 4096;
/// Most rows one multi-row `INSERT` carries (14 parameters each; the protocol allows
/// 65,535 per statement).
pub const INSERT_CHUNK_ROWS: usize = 500;
/// Payload and header bytes after which a multi-row `INSERT` is cut, so one statement
/// stays well under the server's `max_allowed_packet` (16 MiB by default on MariaDB).
pub const INSERT_CHUNK_BYTES: usize = 4 * 1024 * 1024;

/// Splits `messages` into the runs that one multi-row `INSERT` each carries: at most
/// [`INSERT_CHUNK_ROWS`] rows, and cut once payloads and headers pass
/// [`INSERT_CHUNK_BYTES`] (a single larger message still goes alone). Yields index ranges.
///
/// ```
/// use outbox_engine::NewMessage;
/// use outbox_sql::mysql::insert_chunks;
///
/// let sized = |n| NewMessage::builder("d", "e").bytes(vec![0; n], "x").build().unwrap();
/// let large: Vec<_> = (0..5).map(|_| sized(1_000_000)).collect();
/// assert_eq!(insert_chunks(&large).collect::<Vec<_>>(), [0..4, 4..5]);
/// let small: Vec<_> = (0..501).map(|_| sized(10)).collect();
/// assert_eq!(insert_chunks(&small).collect::<Vec<_>>(), [0..500, 500..501]);
/// ```
pub fn insert_chunks(
    messages: &[outbox_engine::NewMessage],
) -> impl Iterator<Item = std::ops::Range<usize>> + '_ {
    let mut start = 0;
    std::iter::from_fn(move || {
        if start == messages.len() {
            return None;
        }
        let (mut end, mut bytes) = (start, 0);
        while end < messages.len() && end - start < INSERT_CHUNK_ROWS {
            let m = &messages[end];
            let size = m.payload().len()
                + m.headers()
                    .iter()
                    .map(|(k, v)| k.len() + v.len() + 8)
                    .sum::<usize>()
                + 2048;
            if end > start && bytes + size > INSERT_CHUNK_BYTES {
                break;
            }
            bytes += size;
            end += 1;
        }
        let chunk = start..end;
        start = end;
        Some(chunk)
    })
}
/// Longest interval bound into SQL, in milliseconds (about 1,000 years); longer ones are
/// clamped so date arithmetic never leaves the `DATETIME` range.
pub const MAX_INTERVAL_MS: i64 = 1000 * 366 * 24 * 3600 * 1000;
/// Most values a dead-letter filter may list in total.
pub const MAX_FILTER_VALUES: usize = 60_000;
/// The named lock (`GET_LOCK`) that serialises migrations on one server, whichever
/// backend runs them.
pub const MIGRATION_LOCK: &str = "outbox-sqlx.migrate";
/// How long a migration waits for another one to finish, in seconds.
pub const MIGRATION_LOCK_TIMEOUT_S: i64 = 120;

/// A list statement's length for `n` ids: the next power of two, so few distinct
/// statements are prepared; the padding repeats the last id.
pub fn padded(n: usize) -> usize {
    n.max(1).next_power_of_two()
}

/// A duration as the milliseconds the statements take, clamped to [`MAX_INTERVAL_MS`].
pub fn interval_ms(d: std::time::Duration) -> i64 {
    crate::values::millis(d).min(MAX_INTERVAL_MS)
}

/// An instant as the naive UTC `DATETIME(6)` the table stores, clamped into the range
/// the column holds (anything before 1970 is simply due; the far future stays far).
pub fn db_time(t: chrono::DateTime<chrono::Utc>) -> chrono::NaiveDateTime {
    use chrono::NaiveDate;
    let min = NaiveDate::from_ymd_opt(1970, 1, 1)
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .expect("valid date");
    let max = NaiveDate::from_ymd_opt(9999, 12, 31)
        .and_then(|d| d.and_hms_micro_opt(23, 59, 59, 999_999))
        .expect("valid date");
    t.naive_utc().clamp(min, max)
}

/// `s` cut to at most `max` bytes on a character boundary (the `last_error` column).
pub fn clip_bytes(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut cut = max;
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    &s[..cut]
}

/// `s` cut to at most `max` characters (the `lease_owner` column).
pub fn clip_chars(s: &str, max: usize) -> &str {
    match s.char_indices().nth(max) {
        Some((at, _)) => &s[..at],
        None => s,
    }
}

/// [`MESSAGE_COLUMNS`] qualified with the alias `d`.
fn qualified_columns() -> String {
    MESSAGE_COLUMNS
        .split(", ")
        .map(|c| format!("d.{c}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The `seq` of one end of a key's rows in one status: `{status}` and `{order}` are filled
/// in. The head index is forced: with few rows in a status, the optimizer would rather
/// read that status off the `(status, published_at)` index and sort.
const KEY_SEQ: &str = "(SELECT p.seq FROM {outbox} AS p FORCE INDEX ({outbox_trg:head_idx}) WHERE p.head_key = d.partition_key AND p.destination = d.destination AND p.status = '{status}' ORDER BY p.seq {order} LIMIT 1)";

// A dead row halts its key when the key's highest pending or leased `seq` is above it
// (one dive into the key index per status, as in `head_condition`).
const HALTED_KEYS: &str = "SELECT d.destination, COUNT(DISTINCT d.partition_key) AS halted
FROM {outbox} AS d
WHERE d.status = 'dead' AND d.seq IS NOT NULL
  AND (d.seq < {key_seq_pending} OR d.seq < {key_seq_leased})
GROUP BY d.destination";

fn key_seq(status: &str, order: &str) -> String {
    KEY_SEQ
        .replace("{status}", status)
        .replace("{order}", order)
}

/// A `LIMIT` no result reaches, which keeps the optimizer from pushing conditions into a
/// derived table: pushed into a loose index scan, the `head_key IS NOT NULL` it infers
/// from the join turns it into a range scan of every unfinished row. (The NULL pairs, of
/// unkeyed and published rows, find no row in that join.)
const BARRIER: &str = "18446744073709551615";

/// No row of the key of counter row `k` is pending, leased or dead: one probe of the head
/// index, whose `head_key` is NULL on published rows.
const KEY_IDLE: &str = "NOT EXISTS (SELECT 1 FROM {outbox} AS o FORCE INDEX ({outbox_trg:head_idx}) WHERE o.head_key = k.partition_key)";

const NEXT_SEQ: &str = "INSERT INTO {outbox_keys} (partition_key, last_seq) VALUES (?, LAST_INSERT_ID(?)) ON DUPLICATE KEY UPDATE last_seq = LAST_INSERT_ID(last_seq + ?)";

const INSERT_HEAD: &str = "INSERT INTO {outbox} (id, destination, event_type, aggregate_type, aggregate_id, partition_key, tenant_id, idempotency_key, payload, content_type, headers, available_at, created_at, seq) VALUES";

const INSERT_ROW: &str = "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, COALESCE(?, {now} + INTERVAL (? * 1000) MICROSECOND), {now}, ?)";

const STATS: &str = "SELECT destination,
    CAST(SUM(status = 'pending') AS SIGNED) AS pending,
    CAST(SUM(status = 'leased') AS SIGNED) AS leased,
    CAST(SUM(status = 'dead') AS SIGNED) AS dead,
    CAST(SUM(status = 'published') AS SIGNED) AS published,
    MIN(CASE WHEN status IN ('pending', 'leased') THEN created_at END) AS oldest
FROM {outbox} GROUP BY destination ORDER BY destination";

/// Finished rows have `available_at` NULL, so the due index holds exactly the
/// unfinished ones.
const GAUGES_UNFINISHED: &str = "SELECT destination,
    CAST(SUM(status = 'pending') AS SIGNED) AS pending,
    CAST(SUM(status = 'leased') AS SIGNED) AS leased,
    CAST(TIMESTAMPDIFF(MICROSECOND, MIN(created_at), UTC_TIMESTAMP(6)) DIV 1000 AS SIGNED) AS oldest_ms
FROM (SELECT destination, status, created_at FROM {outbox}
      WHERE available_at IS NOT NULL ORDER BY available_at, id LIMIT ?) AS unfinished
GROUP BY destination";

const GAUGES_DEAD: &str = "SELECT destination, CAST(COUNT(*) AS SIGNED) AS dead
FROM (SELECT destination FROM {outbox} WHERE status = 'dead' LIMIT ?) AS dead
GROUP BY destination";

#[cfg(test)]
mod tests {
    use super::*;

    fn names(table: &str) -> TableNames {
        TableNames::default().outbox(table).unwrap()
    }

    #[test]
    fn placeholders_match_the_parameter_table() {
        let sql = Statements::new(&TableNames::default());
        let count = |s: &str| s.matches('?').count();
        assert_eq!(count(&sql.next_seq), 3);
        assert_eq!(count(&sql.insert), 14);
        assert_eq!(count(&sql.insert_batch(3)), 42);
        assert_eq!(count(&sql.claim_select(0)), 1);
        assert_eq!(count(&sql.claim_select(2)), 3);
        assert_eq!(count(&sql.window_end), 1);
        for halt in [false, true] {
            assert_eq!(count(&sql.claim_select_ordered(0, halt, false)), 1);
            assert_eq!(count(&sql.claim_select_ordered(2, halt, true)), 6);
            assert_eq!(count(&sql.heads(4, halt)), 4);
        }
        assert_eq!(count(&sql.claim_heads(0, false)), 1);
        assert_eq!(count(&sql.claim_heads(2, false)), 5);
        assert_eq!(count(&sql.claim_heads(2, true)), 7);
        assert_eq!(count(&sql.claim_unkeyed(2)), 3);
        assert_eq!(count(&sql.claim_candidates(3)), 3);
        assert_eq!(count(&sql.shared.halted_keys), 0);
        assert_eq!(count(&sql.claim_lease(3)), 7);
        assert_eq!(count(&sql.lock_leased(3)), 4);
        assert_eq!(count(&sql.publish(2)), 3);
        assert_eq!(count(&sql.release(2)), 3);
        assert_eq!(count(&sql.delete_published(2)), 3);
        assert_eq!(count(&sql.retry), 4);
        assert_eq!(count(&sql.dead), 3);
        assert_eq!(count(&sql.purge_published), 2);
        assert_eq!(count(&sql.purge_dead), 2);
        assert_eq!(count(&sql.shared.inbox_record), 2);
        assert_eq!(count(&sql.shared.inbox_purge), 2);
        assert_eq!(count(&sql.shared.idle_keys), 1);
        assert_eq!(count(&sql.shared.lock_key), 1);
        assert_eq!(count(&sql.shared.forget_key), 1);
        let shape = DeadFilterShape {
            ids: 2,
            destinations: 1,
            event_types: 3,
            after: true,
            before: false,
            error: true,
            after_id: true,
        };
        assert_eq!(count(&sql.dead_filter(shape)), 9);
        assert_eq!(count(&sql.find()), 3);
        assert_eq!(count(&sql.list_dead(shape)), 10);
    }

    #[test]
    fn hostile_names_stay_one_identifier() {
        // A name that looks like SQL fragments the builders used to search for.
        let sql = Statements::new(&names(r#""VALUES , {outbox} ? `x""#));
        let batch = sql.insert_batch(2);
        assert!(
            batch.starts_with("INSERT INTO `VALUES , {outbox} ? ``x` ("),
            "{batch}"
        );
        assert!(
            sql.claim_select(0)
                .contains("FORCE INDEX (`VALUES , {outbox} ? ``x_due_idx`)")
        );
    }
}
