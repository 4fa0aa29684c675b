//! PostgreSQL statements.
//!
//! Parameters (`$n`), by statement:
//!
//! | statement | parameters |
//! |---|---|
//! | `insert` | 1 id uuid, 2 destination, 3 event_type, 4 aggregate_type?, 5 aggregate_id?, 6 partition_key?, 7 tenant_id?, 8 idempotency_key, 9 payload bytea, 10 content_type, 11 headers (JSON text), 12 available_at timestamptz?, 13 delay ms bigint (used when 12 is NULL) |
//! | `insert_batch` | the same thirteen, each as an array |
//! | `claim` | 1 limit, 2 owner, 3 token uuid, 4 lease ms |
//! | `claim_filtered` | as `claim`, 5 destinations text[] |
//! | [`Statements::claim_ordered`] | as `claim` / `claim_filtered` |
//! | `halted_keys` | none → destination, halted |
//! | `complete` | 1 token, 2 ids uuid[], 3 statuses text[], 4 delays ms bigint[], 5 errors text[] → no row if each id's row changed, else `id`, `applied` for each id |
//! | `delete_published` | 1 token, 2 ids uuid[] → no row if each id's row changed, else `id`, `applied` for each id |
//! | `release` | 1 token, 2 ids uuid[] → returns released ids |
//! | `stats` | none → destination, pending, leased, dead, published, oldest created_at |
//! | `gauges_unfinished`, `gauges_dead` | 1 limit |
//! | dead-letter filter (`list_dead`, `count_dead`, `replay_dead`, `discard_dead`) | 1 ids uuid[]?, 2 destinations text[]?, 3 event types text[]?, 4 created after?, 5 created before?, 6 error text?, 7 ids above uuid?; `list_dead` adds 8 limit |
//! | `find` | 1 id uuid?, 2 idempotency key, 3 limit → [`MESSAGE_COLUMNS`], `status`, `last_error`, `published_at`, `dead_at` |
//! | `purge` | 1 published age ms, 2 dead age ms (NULL keeps dead letters), 3 limit |
//! | `rotate_prepare` | 1 published age ms, 2 dead age ms (NULL keeps dead letters) → `moved` |
//! | `rotate` | as `rotate_prepare` → `emptied` |
//! | `inbox_record` | 1 consumer, 2 message id |
//! | `inbox_purge` | 1 age ms, 2 limit |
//! | `idle_keys` | 1 limit → partition_key |
//! | `lock_key`, `forget_key` | 1 partition key |
//! | `notify` | 1 payload (the qualified outbox table name) |
//! | `migration_lock` | 1 lock key bigint |
//!
//! Rows read back (claim, `list_dead`) have the columns of [`MESSAGE_COLUMNS`] in order,
//! `list_dead` followed by `last_error` and `dead_at`, the claim by `waited_ms` (from the
//! commit, or the transaction's start without commit timestamps, to the claim) and
//! `from_commit` (1 or 0).

use crate::{Admin, Dialect, KEY_IDLE, Shared, TableNames, waiting_filter};

/// Migration files of the outbox table.
pub const OUTBOX_MIGRATIONS: &[(&str, &str)] = &[
    ("001_outbox", include_str!("../sql/postgres/001_outbox.sql")),
    (
        "002_ordering",
        include_str!("../sql/postgres/002_ordering.sql"),
    ),
    (
        "003_row_checks",
        include_str!("../sql/postgres/003_row_checks.sql"),
    ),
    (
        "004_writers",
        include_str!("../sql/postgres/004_writers.sql"),
    ),
    (
        "005_commit_time",
        include_str!("../sql/postgres/005_commit_time.sql"),
    ),
    ("006_heads", include_str!("../sql/postgres/006_heads.sql")),
];
/// The migration that comes first in the `rotate` layout: the table in three slots and
/// `<outbox>_rotate` (see the file).
pub const SLOT_MIGRATION: (&str, &str) =
    ("000_slots", include_str!("../sql/postgres/000_slots.sql"));
/// Migration files of the inbox table.
pub const INBOX_MIGRATIONS: &[(&str, &str)] =
    &[("001_inbox", include_str!("../sql/postgres/001_inbox.sql"))];

/// The columns every message-returning statement yields, in order.
pub const MESSAGE_COLUMNS: &str = "id, destination, event_type, aggregate_type, aggregate_id, partition_key, tenant_id, idempotency_key, payload, content_type, headers::text AS headers, attempts, created_at";

const DEAD_FILTER: &str = "status = 'dead'
  AND ($1::uuid[] IS NULL OR id = ANY($1))
  AND ($2::text[] IS NULL OR destination = ANY($2))
  AND ($3::text[] IS NULL OR event_type = ANY($3))
  AND ($4::timestamptz IS NULL OR created_at >= $4)
  AND ($5::timestamptz IS NULL OR created_at < $5)
  AND ($6::text IS NULL OR strpos(last_error, $6) > 0)
  AND ($7::uuid IS NULL OR id > $7)";

/// Every PostgreSQL statement, rendered for one set of table names.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Statements {
    /// Takes the migration lock for this transaction: `(key bigint)`.
    pub migration_lock: String,
    /// Inserts one message.
    pub insert: String,
    /// Inserts many messages in one statement.
    pub insert_batch: String,
    /// Leases due rows of any destination.
    pub claim: String,
    /// Leases due rows of some destinations.
    pub claim_filtered: String,
    /// Per-key ordered claims: `[skip, skip filtered, halt, halt filtered]`.
    claim_ordered: [String; 4],
    /// Completes leased rows.
    pub complete: String,
    /// Deletes leased rows on publish (delete-on-publish mode).
    pub delete_published: String,
    /// Gives leased rows back.
    pub release: String,
    /// Moves the rows free to move out of the oldest slot if it is due (the `rotate`
    /// layout). Run it, and let it commit, right before `rotate`.
    pub rotate_prepare: String,
    /// Retires the oldest slot if due (the `rotate` layout): the purge of that layout.
    pub rotate: String,
    /// Sends a wakeup after commit: `(channel payload text)`.
    pub notify: String,
    /// The statements every dialect has, with the same parameters.
    pub shared: Shared,
    /// Dead letters and purge.
    pub admin: Admin,
}

/// The LISTEN/NOTIFY channel every outbox table signals on; the payload names the table.
pub const NOTIFY_CHANNEL: &str = "outbox_wakeup";

impl Statements {
    /// Renders every statement for `names`.
    pub fn new(names: &TableNames) -> Self {
        let r = |t: &str| names.render(Dialect::Postgres, t);
        let dead = |t: &str| r(&t.replace("{dead_filter}", DEAD_FILTER));
        let waiting = |t: &str| r(&t.replace("{dead_filter}", &waiting_filter(DEAD_FILTER)));
        Self {
            migration_lock: "SELECT pg_advisory_xact_lock($1)".to_owned(),
            insert: r(INSERT),
            insert_batch: r(INSERT_BATCH),
            claim: r(&claim("")),
            claim_filtered: r(&claim(&only_destinations("d"))),
            claim_ordered: claims_ordered(&r, false),
            complete: r(&report_stale(&COMPLETE.replace("{commit}", COMMIT_ASYNC))),
            delete_published: r(&report_stale(&format!(
                "DELETE FROM {{outbox}} WHERE id = ANY($2) AND status = 'leased' AND lease_token = $1{COMMIT_ASYNC} RETURNING id",
            ))),
            release: r(RELEASE),
            rotate_prepare: r("SELECT {outbox_fn:rotate_prepare}($1, $2) AS moved"),
            rotate: r("SELECT {outbox_fn:rotate}($1, $2) AS emptied"),
            admin: Admin {
                list_dead: dead(LIST_DEAD),
                list_waiting: waiting(LIST_WAITING),
                count_dead: dead("SELECT COUNT(*) AS dead FROM {outbox} WHERE {dead_filter}"),
                replay_dead: dead(
                    "UPDATE {outbox} SET status = 'pending', available_at = now(), attempts = 0, dead_at = NULL WHERE {dead_filter}",
                ),
                discard_dead: dead("DELETE FROM {outbox} WHERE {dead_filter}"),
                find: r(FIND),
                purge: r(PURGE),
            },
            shared: Shared {
                create_migrations: r(
                    "CREATE TABLE IF NOT EXISTS {migrations} (id text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())",
                ),
                migration_applied: r("SELECT 1 FROM {migrations} WHERE id = $1"),
                record_migration: r(
                    "INSERT INTO {migrations} (id) VALUES ($1) ON CONFLICT (id) DO NOTHING",
                ),
                stats: r(STATS),
                halted_keys: r(HALTED_KEYS),
                gauges_unfinished: r(GAUGES_UNFINISHED),
                gauges_dead: r(GAUGES_DEAD),
                inbox_record: r(
                    "INSERT INTO {inbox} (consumer, message_id) VALUES ($1, $2) ON CONFLICT DO NOTHING",
                ),
                inbox_purge: r(
                    "DELETE FROM {inbox} WHERE ctid IN (SELECT ctid FROM {inbox} WHERE received_at <= now() - $1 * interval '1 millisecond' LIMIT $2)",
                ),
                idle_keys: r(&format!(
                    "SELECT k.partition_key FROM {{outbox_keys}} AS k WHERE {KEY_IDLE} LIMIT $1"
                )),
                lock_key: r(
                    "SELECT partition_key FROM {outbox_keys} WHERE partition_key = $1 FOR UPDATE SKIP LOCKED",
                ),
                forget_key: r(&format!(
                    "DELETE FROM {{outbox_keys}} AS k WHERE k.partition_key = $1 AND {KEY_IDLE}"
                )),
            },
            notify: format!("SELECT pg_notify('{NOTIFY_CHANNEL}', $1)"),
        }
    }
}

impl Statements {
    /// The statements for a table whose published rows are kept as `published` says: in
    /// the `rotate` layout the claims search each slot by itself.
    pub fn for_rows(names: &TableNames, published: outbox_engine::PublishedRows) -> Self {
        let mut sql = Self::new(names);
        if published == outbox_engine::PublishedRows::Rotate {
            let r = |t: &str| names.render(Dialect::Postgres, t);
            sql.claim = r(&claim_in_slots(""));
            sql.claim_filtered = r(&claim_in_slots(&only_destinations("d")));
            sql.claim_ordered = claims_ordered(&r, true);
        }
        sql
    }

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

/// Runs `fenced`, a statement that changes the leased rows of the ids in `$2` and returns
/// the `id` of each row it changed, and reports in the fewest rows: none when it changed
/// one row for each id asked for (the usual case), and otherwise each id asked for with
/// `applied`, whether its row changed. A completion then sends nothing back but the
/// rare lease conflict.
fn report_stale(fenced: &str) -> String {
    format!(
        "WITH done AS (
{fenced}
)
SELECT r.id, r.id IN (SELECT done.id FROM done) AS applied
FROM unnest($2::uuid[]) AS r(id)
WHERE (SELECT count(*) FROM done) < cardinality($2)"
    )
}

/// Keeps the rows of table alias `alias` whose destination is in the bound list `$5`.
fn only_destinations(alias: &str) -> String {
    format!("AND {alias}.destination = ANY($5)")
}

fn claim(filter: &str) -> String {
    CLAIM
        .replace("{due}", &due("d.id", filter, ""))
        .replace("{commit}", COMMIT_ASYNC)
}

/// The claim of the `rotate` layout: each slot is searched by a query of its own, so each
/// is planned as one table read in due-index order up to the limit, as the plain table
/// is. Searched together, the planner may sort every due row of all slots instead, which
/// it does when a slot's statistics date from when it held published rows only: the cost
/// of each claim then grows with the backlog.
fn claim_in_slots(filter: &str) -> String {
    let slots: Vec<String> = (0..3)
        .map(|slot| {
            format!(
                "SELECT * FROM ({}) AS s{slot}",
                due(
                    "d.id, d.available_at",
                    filter,
                    &format!("AND d.slot = {slot}")
                )
            )
        })
        .collect();
    CLAIM.replace("{commit}", COMMIT_ASYNC).replace(
        "{due}",
        &format!(
            "SELECT due.id FROM (\n    {}\n) AS due ORDER BY due.available_at, due.id LIMIT $1",
            slots.join("\n    UNION ALL ")
        ),
    )
}

/// Locks the due rows to lease, earliest first, at most `$1`, returning `columns`.
fn due(columns: &str, filter: &str, slot: &str) -> String {
    format!(
        "SELECT {columns} FROM {{outbox}} AS d
    WHERE d.status IN ('pending', 'leased') AND d.available_at <= now() {slot} {filter}
    ORDER BY d.available_at, d.id
    LIMIT $1
    FOR UPDATE SKIP LOCKED"
    )
}

/// The per-key ordered claims, `[skip, skip filtered, halt, halt filtered]`, rendered by
/// `r`; `slots` for the `rotate` layout.
fn claims_ordered(r: &impl Fn(&str) -> String, slots: bool) -> [String; 4] {
    [(false, false), (true, false), (false, true), (true, true)].map(|(filtered, halt)| {
        // Committed synchronously: see `COMMIT_ASYNC`.
        let claim = CLAIM.replace("{commit}", "");
        r(&claim.replace("{due}", &due_ordered(filtered, halt, slots)))
    })
}

/// Locks the rows a per-key ordered claim may lease, earliest first, at most `$1`. A keyed
/// row may be leased only when it is its key and destination's head: no row of the pair
/// with a lower `seq` is pending or leased (or dead, when `halt`).
///
/// Testing each due row for being a head, as the due index yields them, costs a probe per
/// row, and when the earliest rows all wait behind heads that are leased, backing off or
/// dead, a claim would probe the whole backlog to find a few heads. So only a window of
/// the earliest due rows (four times the limit) is tested that way. When it yields fewer
/// than the limit, the claim also looks up the head of each (key, destination) pair that
/// has unfinished rows, with one probe per pair (a skip scan of the head index, stopping
/// at the limit), and the earliest unkeyed due rows from their own index. Its cost then
/// grows with the number of keys, not with the rows waiting behind them.
fn due_ordered(filtered: bool, halt: bool, slots: bool) -> String {
    let holds = if halt {
        "('pending', 'leased', 'dead')"
    } else {
        "('pending', 'leased')"
    };
    let only = |alias: &str| {
        if filtered {
            only_destinations(alias)
        } else {
            String::new()
        }
    };
    let window = earliest(
        "c",
        "c.id, c.partition_key, c.destination, c.seq",
        &format!("c.status IN ('pending', 'leased') {}", only("c")),
        "$1 * 4",
        slots,
    );
    let unkeyed = earliest(
        "f",
        "f.id",
        &format!(
            "f.partition_key IS NULL AND f.status IN ('pending', 'leased') {}",
            only("f")
        ),
        "$1",
        slots,
    );
    let filter = only("d");
    let head_filter = only("q");
    format!(
        "WITH RECURSIVE front AS MATERIALIZED (
        SELECT w.id FROM ({window}) AS w
        WHERE w.seq IS NULL OR NOT EXISTS (SELECT 1 FROM {{outbox}} AS p WHERE p.partition_key = w.partition_key AND p.destination = w.destination AND p.seq < w.seq AND p.status IN {holds})
        LIMIT $1
    ),
    pairs AS (
        (SELECT k.partition_key, k.destination FROM {{outbox}} AS k
         WHERE k.partition_key IS NOT NULL AND k.status IN ('pending', 'leased', 'dead')
         ORDER BY k.partition_key, k.destination LIMIT 1)
        UNION ALL
        SELECT n.partition_key, n.destination FROM pairs AS q CROSS JOIN LATERAL (
            SELECT k.partition_key, k.destination FROM {{outbox}} AS k
            WHERE k.partition_key IS NOT NULL AND k.status IN ('pending', 'leased', 'dead')
              AND (k.partition_key, k.destination) > (q.partition_key, q.destination)
            ORDER BY k.partition_key, k.destination LIMIT 1) AS n
    )
    SELECT d.id FROM {{outbox}} AS d
    WHERE d.id = ANY(ARRAY(
            SELECT id FROM front
            UNION ALL
            (SELECT h.id FROM pairs AS q CROSS JOIN LATERAL (
                SELECT x.id, x.status, x.available_at FROM {{outbox}} AS x
                WHERE x.partition_key = q.partition_key AND x.destination = q.destination
                  AND x.status IN {holds}
                ORDER BY x.seq LIMIT 1) AS h
             WHERE (SELECT count(*) FROM front) < $1 {head_filter}
               AND h.status IN ('pending', 'leased') AND h.available_at <= now()
             LIMIT $1)
            UNION ALL
            SELECT u.id FROM ({unkeyed}) AS u WHERE (SELECT count(*) FROM front) < $1
        ))
      AND d.status IN ('pending', 'leased') AND d.available_at <= now() {filter}
    ORDER BY d.available_at, d.id
    LIMIT $1
    FOR UPDATE SKIP LOCKED"
    )
}

/// `columns` of the earliest due rows (the table read as `alias`) that meet `condition`,
/// at most `limit`, in due-index order: with `slots`, each slot is read by itself and the
/// reads are merged, as in [`claim_in_slots`].
fn earliest(alias: &str, columns: &str, condition: &str, limit: &str, slots: bool) -> String {
    let read = |slot: &str| {
        format!(
            "SELECT {columns}, {alias}.available_at AS due_at FROM {{outbox}} AS {alias}
            WHERE {condition} AND {alias}.available_at <= now() {slot}
            ORDER BY {alias}.available_at, {alias}.id LIMIT {limit}"
        )
    };
    if !slots {
        return read("");
    }
    let reads: Vec<String> = (0..3)
        .map(|slot| {
            format!(
                "SELECT * FROM ({}) AS e{slot}",
                read(&format!("AND {alias}.slot = {slot}"))
            )
        })
        .collect();
    format!(
        "SELECT * FROM ({}) AS e ORDER BY e.due_at, e.id LIMIT {limit}",
        reads.join(" UNION ALL ")
    )
}

const HALTED_KEYS: &str = "SELECT d.destination, count(DISTINCT d.partition_key) AS halted
FROM {outbox} d
WHERE d.status = 'dead' AND d.seq IS NOT NULL
  AND EXISTS (SELECT 1 FROM {outbox} p WHERE p.partition_key = d.partition_key AND p.destination = d.destination AND p.seq > d.seq AND p.status IN ('pending', 'leased'))
GROUP BY d.destination";

const RELEASE: &str = "UPDATE {outbox}
SET status = 'pending', available_at = now(), attempts = GREATEST(attempts - 1, 0),
    lease_owner = NULL, lease_token = NULL, lease_until = NULL
WHERE id = ANY($2) AND status = 'leased' AND lease_token = $1
RETURNING id";

const INSERT: &str = "INSERT INTO {outbox} (id, destination, event_type, aggregate_type, aggregate_id, partition_key, tenant_id, idempotency_key, payload, content_type, headers, available_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11::jsonb, COALESCE($12, now() + $13 * interval '1 millisecond'))";

const INSERT_BATCH: &str = "INSERT INTO {outbox} (id, destination, event_type, aggregate_type, aggregate_id, partition_key, tenant_id, idempotency_key, payload, content_type, headers, available_at)
SELECT m.id, m.destination, m.event_type, m.aggregate_type, m.aggregate_id, m.partition_key, m.tenant_id, m.idempotency_key, m.payload, m.content_type, m.headers::jsonb,
       COALESCE(m.at, now() + m.delay_ms * interval '1 millisecond')
FROM UNNEST($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[], $9::bytea[], $10::text[], $11::text[], $12::timestamptz[], $13::bigint[])
  AS m(id, destination, event_type, aggregate_type, aggregate_id, partition_key, tenant_id, idempotency_key, payload, content_type, headers, at, delay_ms)";

/// Ends the `WHERE` of the relay's unordered claims and its completions, which run as
/// statements of their own: their commits do not wait for the WAL to reach the disk
/// (decision 0049). `set_config(…, true)` lasts until the statement's own transaction
/// ends, after its commit was recorded, so no other statement on the connection is
/// affected. A database crash can undo the last such commits: a claim undone puts its
/// rows back to be claimed, a completion undone leaves its rows leased until the lease
/// lapses, and either way they are published again, never lost. Per-key ordered claims
/// keep synchronous commits: each claim then makes every completion before it durable,
/// so a head whose completion was undone can never be sent again after the message
/// behind it.
pub const COMMIT_ASYNC: &str = "
  AND (SELECT set_config('synchronous_commit', 'off', true)) = 'off'";

/// The locked ids come back as an array (an InitPlan), so the UPDATE finds them through the
/// primary key; a join with a CTE let the planner hash the whole table on every claim.
/// The commit-timestamp setting is read once per statement (a scalar subquery), and the
/// wait is computed in `double precision` (`date_part`), not `numeric` (`EXTRACT`): per
/// row they cost about 0.2 µs each otherwise.
const CLAIM: &str = "UPDATE {outbox} AS o
SET status = 'leased', lease_owner = $2, lease_token = $3,
    lease_until = now() + $4 * interval '1 millisecond',
    available_at = now() + $4 * interval '1 millisecond',
    attempts = o.attempts + 1,
    committed_at = COALESCE(o.committed_at, CASE WHEN (SELECT current_setting('track_commit_timestamp') = 'on') THEN pg_xact_commit_timestamp(o.xmin) END)
WHERE o.id = ANY(ARRAY(
    {due}
)){commit}
RETURNING o.id, o.destination, o.event_type, o.aggregate_type, o.aggregate_id, o.partition_key, o.tenant_id, o.idempotency_key, o.payload, o.content_type, o.headers::text AS headers, o.attempts, o.created_at,
    CAST(date_part('epoch', now() - COALESCE(o.committed_at, o.created_at)) * 1000 AS bigint) AS waited_ms,
    CAST(CASE WHEN o.committed_at IS NULL THEN 0 ELSE 1 END AS bigint) AS from_commit";

const COMPLETE: &str = "UPDATE {outbox} AS o
SET status = CASE WHEN c.status = 'deferred' THEN 'pending' ELSE c.status END,
    available_at = CASE WHEN c.status IN ('pending', 'deferred') THEN now() + c.delay_ms * interval '1 millisecond' END,
    attempts = CASE WHEN c.status = 'deferred' THEN GREATEST(o.attempts - 1, 0) ELSE o.attempts END,
    last_error = COALESCE(c.error, o.last_error),
    published_at = CASE WHEN c.status = 'published' THEN now() END,
    dead_at = CASE WHEN c.status = 'dead' THEN now() END,
    lease_owner = NULL, lease_token = NULL, lease_until = NULL
FROM UNNEST($2::uuid[], $3::text[], $4::bigint[], $5::text[]) AS c(id, status, delay_ms, error)
WHERE o.id = c.id AND o.status = 'leased' AND o.lease_token = $1{commit}
RETURNING o.id";

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
    CAST(EXTRACT(EPOCH FROM now() - min(created_at)) * 1000 AS bigint) AS oldest_ms
FROM (SELECT destination, status, created_at FROM {outbox}
      WHERE status IN ('pending', 'leased') ORDER BY available_at, id LIMIT $1) AS unfinished
GROUP BY destination";

const GAUGES_DEAD: &str = "SELECT destination, count(*) AS dead
FROM (SELECT destination FROM {outbox} WHERE status = 'dead' LIMIT $1) AS dead
GROUP BY destination";

const LIST_DEAD: &str = "SELECT id, destination, event_type, aggregate_type, aggregate_id, partition_key, tenant_id, idempotency_key, payload, content_type, headers::text AS headers, attempts, created_at, last_error, dead_at
FROM {outbox} WHERE {dead_filter} ORDER BY id LIMIT $8";

const LIST_WAITING: &str = "SELECT id, destination, event_type, aggregate_type, aggregate_id, partition_key, tenant_id, idempotency_key, payload, content_type, headers::text AS headers, attempts, created_at, status, last_error, available_at
FROM {outbox} WHERE {dead_filter} ORDER BY id LIMIT $8";

const FIND: &str = "SELECT id, destination, event_type, aggregate_type, aggregate_id, partition_key, tenant_id, idempotency_key, payload, content_type, headers::text AS headers, attempts, created_at, status, last_error, published_at, dead_at
FROM {outbox} WHERE id = $1 OR idempotency_key = $2 ORDER BY id LIMIT $3";

const PURGE: &str = "DELETE FROM {outbox} WHERE id IN (
    SELECT id FROM {outbox}
    WHERE (status = 'published' AND published_at <= now() - $1 * interval '1 millisecond')
       OR ($2::bigint IS NOT NULL AND status = 'dead' AND dead_at <= now() - $2 * interval '1 millisecond')
    LIMIT $3
    FOR UPDATE SKIP LOCKED
)";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_unordered_claims_and_completions_commit_asynchronously() {
        for published in [
            outbox_engine::PublishedRows::Keep,
            outbox_engine::PublishedRows::Rotate,
        ] {
            let sql = Statements::for_rows(&TableNames::default(), published);
            for asynchronous in [
                &sql.claim,
                &sql.claim_filtered,
                &sql.complete,
                &sql.delete_published,
            ] {
                assert_eq!(
                    asynchronous.matches(COMMIT_ASYNC).count(),
                    1,
                    "{asynchronous}"
                );
            }
            let ordered = (0..4).map(|i| sql.claim_ordered(i % 2 == 1, i >= 2));
            for synchronous in ordered.chain([sql.release.as_str(), sql.admin.replay_dead.as_str()])
            {
                assert!(!synchronous.contains("synchronous_commit"), "{synchronous}");
            }
        }
    }
}
