//! The one source of the outbox schema.
//!
//! DDL (as migrations) and every statement the relay and the enqueue path run, for
//! PostgreSQL, SQLite and MySQL/MariaDB, rendered for validated table names. The sqlx
//! and diesel backends both execute exactly this text, binding parameters in the order
//! each statement's documentation gives, so the table means the same thing whichever
//! library wrote it — and any other language can write it too.
//!
//! Row conventions shared by every dialect:
//! - `status` is one of `pending`, `leased`, `published`, `dead` (always written as
//!   literals in `WHERE` clauses so partial indexes match);
//! - `available_at` is when a pending row is due, and for a leased row its lease deadline;
//!   finished rows (`published`, `dead`) have `available_at` NULL, so one index on
//!   `(available_at, id)` serves the claim and the reclaim of lapsed leases;
//! - `attempts` counts claims; a release gives one back;
//! - every completion is conditioned on `status = 'leased' AND lease_token = <token>`.
//!
//! ```
//! use outbox_sql::{Dialect, TableNames, outbox_migrations, postgres};
//!
//! let names = TableNames::default().outbox("billing_outbox")?;
//! let sql = postgres::Statements::new(&names);
//! assert!(sql.claim.contains("FOR UPDATE SKIP LOCKED"));
//! let keep = outbox_engine::PublishedRows::Keep;
//! assert!(outbox_migrations(Dialect::Postgres, &names, keep)[0].statements[0].contains("\"billing_outbox\""));
//! # Ok::<(), outbox_sql::IdentError>(())
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]

mod ident;
pub mod mysql;
pub mod postgres;
pub mod sqlite;
pub mod values;

pub use ident::{Ident, IdentError, MAX_IDENT_BYTES};

/// A SQL dialect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dialect {
    /// PostgreSQL 12 or later.
    Postgres,
    /// SQLite 3.38 or later (JSON functions built in, `RETURNING`, `UPDATE … FROM`).
    Sqlite,
    /// MySQL 8 or MariaDB 10.6 or later (`SKIP LOCKED`).
    MySql,
}

impl Dialect {
    /// The short name stores and URLs use: `postgres`, `sqlite`, `mysql`.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Postgres => "postgres",
            Self::Sqlite => "sqlite",
            Self::MySql => "mysql",
        }
    }

    /// The identifier quote character.
    pub const fn quote_char(self) -> char {
        match self {
            Self::Postgres | Self::Sqlite => '"',
            Self::MySql => '`',
        }
    }
}

/// The names of the outbox and inbox tables, optionally in a schema (a PostgreSQL
/// schema, a MySQL database, an attached SQLite database).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableNames {
    schema: Option<Ident>,
    outbox: Ident,
    inbox: Ident,
}

impl Default for TableNames {
    /// `outbox` and `outbox_inbox`, unqualified.
    fn default() -> Self {
        Self {
            schema: None,
            outbox: Ident::parse("outbox").expect("valid"),
            inbox: Ident::parse("outbox_inbox").expect("valid"),
        }
    }
}

impl TableNames {
    /// Puts both tables in `schema`.
    ///
    /// # Errors
    ///
    /// [`IdentError`] if the name is not a valid identifier (see [`Ident`]).
    pub fn schema(mut self, schema: &str) -> Result<Self, IdentError> {
        self.schema = Some(Ident::parse(schema)?);
        Ok(self)
    }

    /// Names the outbox table.
    ///
    /// # Errors
    ///
    /// [`IdentError`] if the name is not a valid identifier (see [`Ident`]).
    pub fn outbox(mut self, table: &str) -> Result<Self, IdentError> {
        self.outbox = Ident::parse(table)?;
        Ok(self)
    }

    /// Names the inbox table.
    ///
    /// # Errors
    ///
    /// [`IdentError`] if the name is not a valid identifier (see [`Ident`]).
    pub fn inbox(mut self, table: &str) -> Result<Self, IdentError> {
        self.inbox = Ident::parse(table)?;
        Ok(self)
    }

    /// The schema, if any.
    pub fn schema_name(&self) -> Option<&Ident> {
        self.schema.as_ref()
    }
    /// The outbox table name.
    pub fn outbox_name(&self) -> &Ident {
        &self.outbox
    }
    /// The inbox table name.
    pub fn inbox_name(&self) -> &Ident {
        &self.inbox
    }

    fn qualified(&self, dialect: Dialect, name: &Ident) -> String {
        match &self.schema {
            Some(schema) => format!("{}.{}", schema.quoted(dialect), name.quoted(dialect)),
            None => name.quoted(dialect),
        }
    }

    /// Index names: schema-qualified in SQLite (where the index names the schema), bare
    /// elsewhere (where an index lives in its table's schema).
    fn index(&self, dialect: Dialect, table: &Ident, suffix: &str) -> String {
        let name = table.derived(suffix);
        match dialect {
            Dialect::Sqlite => self.qualified(dialect, &name),
            Dialect::Postgres | Dialect::MySql => name.quoted(dialect),
        }
    }

    /// A PostgreSQL dollar-quote tag that no configured name contains, so a function body
    /// can never be ended early by a table name.
    fn body_tag(&self) -> String {
        let names = [self.schema.as_ref(), Some(&self.outbox), Some(&self.inbox)];
        (0..)
            .map(|n| {
                if n == 0 {
                    "$outbox$".to_owned()
                } else {
                    format!("$outbox{n}$")
                }
            })
            .find(|tag| {
                names
                    .iter()
                    .flatten()
                    .all(|name| !name.name().contains(tag.as_str()))
            })
            .expect("some tag is free")
    }

    /// Replaces the `{placeholders}` of a SQL template with quoted names.
    pub fn render(&self, dialect: Dialect, template: &str) -> String {
        let migrations = Ident::parse("outbox_migrations").expect("valid");
        let pairs = [
            ("{outbox}", self.qualified(dialect, &self.outbox)),
            ("{outbox_table}", self.outbox.quoted(dialect)),
            (
                "{outbox_due_idx}",
                self.index(dialect, &self.outbox, "_due_idx"),
            ),
            (
                "{outbox_dead_idx}",
                self.index(dialect, &self.outbox, "_dead_idx"),
            ),
            (
                "{outbox_published_idx}",
                self.index(dialect, &self.outbox, "_published_idx"),
            ),
            (
                "{outbox_finished_idx}",
                self.index(dialect, &self.outbox, "_finished_idx"),
            ),
            (
                "{outbox_status_check}",
                self.outbox.derived("_status_check").quoted(dialect),
            ),
            (
                "{outbox_headers_check}",
                self.outbox.derived("_headers_check").quoted(dialect),
            ),
            (
                "{outbox_id_check}",
                self.outbox.derived("_id_check").quoted(dialect),
            ),
            (
                "{outbox_check_insert_trg}",
                self.index(dialect, &self.outbox, "_check_insert"),
            ),
            (
                "{outbox_check_update_trg}",
                self.index(dialect, &self.outbox, "_check_update"),
            ),
            ("{inbox}", self.qualified(dialect, &self.inbox)),
            ("{inbox_table}", self.inbox.quoted(dialect)),
            (
                "{inbox_received_idx}",
                self.index(dialect, &self.inbox, "_received_idx"),
            ),
            ("{migrations}", self.qualified(dialect, &migrations)),
            (
                "{outbox_keys}",
                self.qualified(dialect, &self.outbox.derived("_keys")),
            ),
            (
                "{outbox_keys_table}",
                self.outbox.derived("_keys").quoted(dialect),
            ),
            (
                "{outbox_key_idx}",
                self.index(dialect, &self.outbox, "_key_idx"),
            ),
            (
                "{outbox_seq_fn}",
                self.qualified(dialect, &self.outbox.derived("_assign_seq")),
            ),
            (
                "{outbox_seq_trg}",
                self.outbox.derived("_seq_trg").quoted(dialect),
            ),
            (
                "{body_tag}",
                // Only PostgreSQL quotes bodies; elsewhere the marker only tells the
                // statement splitter where a body with its own `;` lines starts and ends.
                match dialect {
                    Dialect::Postgres => self.body_tag(),
                    Dialect::Sqlite | Dialect::MySql => String::new(),
                },
            ),
            (
                "{outbox_literal}",
                format!(
                    "'{}'",
                    self.qualified(dialect, &self.outbox).replace('\'', "''")
                ),
            ),
        ];
        // One left-to-right pass, so a quoted name that happens to contain `{outbox}`
        // is never substituted again.
        let mut out = String::with_capacity(template.len() + 64);
        let mut rest = template;
        'scan: while let Some(start) = rest.find('{') {
            out.push_str(&rest[..start]);
            rest = &rest[start..];
            for (key, value) in &pairs {
                if let Some(after) = rest.strip_prefix(key) {
                    out.push_str(value);
                    rest = after;
                    continue 'scan;
                }
            }
            if let Some((value, after)) = self.derived_placeholder(dialect, rest) {
                out.push_str(&value);
                rest = after;
                continue 'scan;
            }
            out.push('{');
            rest = &rest[1..];
        }
        out.push_str(rest);
        out
    }
}

impl TableNames {
    /// `{outbox_fn:NAME}` is the schema-qualified routine or table `<outbox>_NAME`,
    /// `{outbox_lit:NAME}` the same name as a string literal, `{outbox_trg:NAME}` the
    /// trigger `<outbox>_NAME` (schema-qualified in SQLite); NAME is `[a-z0-9_]+`.
    fn derived_placeholder<'t>(
        &self,
        dialect: Dialect,
        text: &'t str,
    ) -> Option<(String, &'t str)> {
        let (kind, rest) = ["{outbox_fn:", "{outbox_trg:", "{outbox_lit:"]
            .into_iter()
            .find_map(|kind| Some((kind, text.strip_prefix(kind)?)))?;
        let end = rest.find('}')?;
        let name = &rest[..end];
        if name.is_empty()
            || !name
                .bytes()
                .all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'_'))
        {
            return None;
        }
        let value = match kind {
            "{outbox_fn:" => self.qualified(dialect, &self.outbox.derived(&format!("_{name}"))),
            "{outbox_lit:" => {
                let qualified = self.qualified(dialect, &self.outbox.derived(&format!("_{name}")));
                format!("'{}'", qualified.replace('\'', "''"))
            }
            _ => self.index(dialect, &self.outbox, &format!("_{name}")),
        };
        Some((value, &rest[end + 1..]))
    }
}

/// No row of the key of counter row `k` holds the counter: none pending, leased or dead
/// (published rows are never compared by the ordered claim).
const KEY_IDLE: &str = "NOT EXISTS (SELECT 1 FROM {outbox} AS o WHERE o.partition_key = k.partition_key AND o.status IN ('pending', 'leased', 'dead'))";

/// The statements every dialect has, with the same parameters in the same order, so a
/// backend runs them from code written once.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Shared {
    /// Creates the migrations table.
    pub create_migrations: String,
    /// `(id)` → a row if that migration was applied.
    pub migration_applied: String,
    /// Records a migration: `(id)`.
    pub record_migration: String,
    /// Counts per destination and state: no parameters → destination, pending, leased,
    /// dead, published, oldest (`created_at` of the oldest unfinished row).
    pub stats: String,
    /// Counts halted keys per destination (keys with a dead row followed by unfinished
    /// ones, counted under the dead row's destination): → destination, halted.
    pub halted_keys: String,
    /// The pending and leased rows per destination, the earliest due first, at most
    /// `(limit)` rows, read through the due index: → destination, pending, leased,
    /// oldest_ms (age of the oldest by the database clock).
    pub gauges_unfinished: String,
    /// The dead letters per destination, at most `(limit)` rows, read through the dead
    /// index: → destination, dead.
    pub gauges_dead: String,
    /// Records a delivery in the inbox: `(consumer, message id)` → one row affected if
    /// new, zero if a duplicate.
    pub inbox_record: String,
    /// Deletes one bounded batch of old inbox rows: `(age ms, limit)`.
    pub inbox_purge: String,
    /// Keys whose counter row is left with no pending, leased or dead row of the key, at
    /// most `(limit)`: → partition_key. Reads without locks; `forget_key` checks again.
    pub idle_keys: String,
    /// Locks one key's counter row unless a writer holds it: `(key)` → partition_key, no
    /// row when it is held or gone. SQLite has no row locks and reads it only.
    pub lock_key: String,
    /// Deletes one key's counter row if the key still has no pending, leased or dead row:
    /// `(key)`. Run after `lock_key`, in its transaction, as a statement of its own: its
    /// snapshot then holds every row numbered before the lock was taken, and no writer
    /// numbers a row of the key until the transaction ends. (A single `DELETE … WHERE NOT
    /// EXISTS` would judge the key on a snapshot taken before it waited for the lock.)
    /// The key's next row is numbered from 1 again, which keeps commit order: no row the
    /// ordered claim compares it with is left.
    pub forget_key: String,
}

/// The operator's statements of the dialects that bind a whole dead-letter filter
/// (PostgreSQL, SQLite; see each dialect's parameter table). MySQL builds them per filter
/// shape instead.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Admin {
    /// Lists matching dead letters.
    pub list_dead: String,
    /// Lists the pending and leased rows the same filter matches, in id order, with
    /// `status`, `last_error` and `available_at` (the next attempt).
    pub list_waiting: String,
    /// Counts matching dead letters (column `dead`).
    pub count_dead: String,
    /// Replays matching dead letters.
    pub replay_dead: String,
    /// Deletes matching dead letters.
    pub discard_dead: String,
    /// Finds messages by id or idempotency key, in any state.
    pub find: String,
    /// Deletes one bounded batch of old finished rows.
    pub purge: String,
}

/// A dead-letter filter's `WHERE` clause turned to the rows still waiting to be
/// published (pending or leased), with the same parameters.
pub(crate) fn waiting_filter(dead_filter: &str) -> String {
    const DEAD: &str = "status = 'dead'";
    assert!(
        dead_filter.starts_with(DEAD),
        "a dead-letter filter starts with its status"
    );
    dead_filter.replacen(DEAD, "status IN ('pending', 'leased')", 1)
}

/// The table names a store's settings ask for (`store.schema`, `store.table`,
/// `store.inbox_table`), for every backend's driver.
///
/// # Errors
///
/// A configuration [`BuildError`](outbox_engine::registry::BuildError) naming the setting
/// whose name is not a valid identifier.
pub fn table_names(
    settings: &outbox_engine::StoreSettings,
) -> Result<TableNames, outbox_engine::registry::BuildError> {
    use outbox_engine::registry::BuildError;
    let mut names = TableNames::default();
    if let Some(schema) = &settings.schema {
        names = names
            .schema(schema)
            .map_err(|e| BuildError::config(format!("store.schema: {e}")))?;
    }
    if let Some(table) = &settings.table {
        names = names
            .outbox(table)
            .map_err(|e| BuildError::config(format!("store.table: {e}")))?;
    }
    if let Some(table) = &settings.inbox_table {
        names = names
            .inbox(table)
            .map_err(|e| BuildError::config(format!("store.inbox_table: {e}")))?;
    }
    Ok(names)
}

/// The `store.published_rows` of `settings`, if `dialect` supports it (see
/// [`check_published_rows`]), for every backend's driver.
///
/// # Errors
///
/// A configuration [`BuildError`](outbox_engine::registry::BuildError) naming the setting.
pub fn published_rows(
    dialect: Dialect,
    settings: &outbox_engine::StoreSettings,
) -> Result<outbox_engine::PublishedRows, outbox_engine::registry::BuildError> {
    check_published_rows(dialect, settings.published_rows).map_err(|e| {
        outbox_engine::registry::BuildError::config(format!("store.published_rows: {e}"))
    })?;
    Ok(settings.published_rows)
}

/// One migration: an id recorded in the migrations table, and its statements.
///
/// Every statement must be idempotent (`IF NOT EXISTS`, `ADD COLUMN IF NOT EXISTS`, …):
/// backends run all of them on every `migrate`, so a table dropped by hand is recreated
/// even though its migration is recorded. The record is history, not a skip list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Migration {
    /// `<table name>/<file>`, e.g. `outbox/001_outbox`.
    pub id: String,
    /// Statements to run in order.
    pub statements: Vec<String>,
}

/// The outbox table's migrations for `dialect`, oldest first. With
/// [`PublishedRows::Rotate`](outbox_engine::PublishedRows::Rotate) on PostgreSQL the first
/// creates the table in three slots ([`postgres::SLOT_MIGRATION`]); the other dialects
/// have no slots, and their backends refuse that mode before asking (see
/// [`check_published_rows`]).
pub fn outbox_migrations(
    dialect: Dialect,
    names: &TableNames,
    published: outbox_engine::PublishedRows,
) -> Vec<Migration> {
    let files = match dialect {
        Dialect::Postgres => postgres::OUTBOX_MIGRATIONS,
        Dialect::Sqlite => sqlite::OUTBOX_MIGRATIONS,
        Dialect::MySql => mysql::OUTBOX_MIGRATIONS,
    };
    let slots = (dialect == Dialect::Postgres && published == outbox_engine::PublishedRows::Rotate)
        .then_some(postgres::SLOT_MIGRATION);
    let files: Vec<_> = slots.into_iter().chain(files.iter().copied()).collect();
    migrations(dialect, names, names.outbox_name(), &files)
}

/// Whether `dialect` supports `published`: only PostgreSQL has the slots of
/// [`PublishedRows::Rotate`](outbox_engine::PublishedRows::Rotate). The error is a
/// sentence for the user.
///
/// ```
/// use outbox_engine::PublishedRows;
/// use outbox_sql::{Dialect, check_published_rows};
///
/// assert!(check_published_rows(Dialect::Postgres, PublishedRows::Rotate).is_ok());
/// assert!(check_published_rows(Dialect::Sqlite, PublishedRows::Rotate).is_err());
/// ```
pub fn check_published_rows(
    dialect: Dialect,
    published: outbox_engine::PublishedRows,
) -> Result<(), String> {
    if published == outbox_engine::PublishedRows::Rotate && dialect != Dialect::Postgres {
        return Err(format!(
            "published_rows = \"rotate\" needs PostgreSQL (its slots are table partitions); {dialect:?} offers \"keep\" and \"delete\""
        ));
    }
    Ok(())
}

/// The inbox table's migrations for `dialect`, oldest first.
pub fn inbox_migrations(dialect: Dialect, names: &TableNames) -> Vec<Migration> {
    let files = match dialect {
        Dialect::Postgres => postgres::INBOX_MIGRATIONS,
        Dialect::Sqlite => sqlite::INBOX_MIGRATIONS,
        Dialect::MySql => mysql::INBOX_MIGRATIONS,
    };
    migrations(dialect, names, names.inbox_name(), files)
}

fn migrations(
    dialect: Dialect,
    names: &TableNames,
    table: &Ident,
    files: &[(&str, &str)],
) -> Vec<Migration> {
    files
        .iter()
        .map(|(file, sql)| Migration {
            id: format!("{}/{}", table.name(), file),
            statements: split_statements(sql)
                .iter()
                .map(|statement| names.render(dialect, statement))
                .collect(),
        })
        .collect()
}

/// Every statement of the outbox and inbox migrations for `names`, as one script a
/// migration tool (Flyway, Alembic, Prisma, `psql -f`, the `mysql` client) can apply: the
/// same DDL `migrate` runs, idempotent, so running `migrate` afterwards is safe. MySQL
/// statements with bodies are wrapped in `DELIMITER` lines.
///
/// ```
/// use outbox_engine::PublishedRows;
/// use outbox_sql::{Dialect, TableNames, schema_script};
///
/// let script = schema_script(Dialect::Postgres, &TableNames::default(), PublishedRows::Keep);
/// assert!(script.contains("CREATE TABLE IF NOT EXISTS \"outbox\""));
/// assert!(script.contains("FUNCTION \"outbox_enqueue\""));
/// ```
pub fn schema_script(
    dialect: Dialect,
    names: &TableNames,
    published: outbox_engine::PublishedRows,
) -> String {
    let mut script = String::from(
        "-- The outbox schema, as `migrate` applies it. Every statement is idempotent.\n",
    );
    let all = outbox_migrations(dialect, names, published)
        .into_iter()
        .chain(inbox_migrations(dialect, names));
    for migration in all {
        script.push_str(&format!("\n-- {}\n", migration.id));
        for statement in migration.statements {
            if dialect == Dialect::MySql && statement.contains(';') {
                script.push_str(&format!("DELIMITER //\n{statement}\n//\nDELIMITER ;\n"));
            } else {
                script.push_str(&format!("{statement};\n"));
            }
        }
    }
    script
}

/// Splits a migration template into statements: each ends with `;` at the end of a line,
/// except inside a function body between two `{body_tag}` markers. Comment lines are
/// dropped.
fn split_statements(sql: &str) -> Vec<String> {
    let mut statements = Vec::new();
    let mut current = String::new();
    let mut in_body = false;
    for line in sql.lines() {
        if !in_body && (line.trim_start().starts_with("--") || line.trim().is_empty()) {
            continue;
        }
        if line.matches("{body_tag}").count() % 2 == 1 {
            in_body = !in_body;
        }
        current.push_str(line);
        current.push('\n');
        if !in_body && line.trim_end().ends_with(';') {
            let statement = current.trim().trim_end_matches(';').trim().to_owned();
            statements.push(statement);
            current.clear();
        }
    }
    if !current.trim().is_empty() {
        statements.push(current.trim().to_owned());
    }
    statements
}

/// For a per-key ordered claim: whether it is filtered by destination and whether a dead
/// head halts its key; `None` for an unordered claim.
fn ordered_claim(request: &outbox_engine::ClaimRequest) -> Option<(bool, bool)> {
    match request.ordering {
        outbox_engine::MessageOrder::PerKey(dead) => Some((
            request.destinations.is_some(),
            dead == outbox_engine::DeadHead::Halt,
        )),
        _ => None,
    }
}

/// The status token a completion is bound with: `published`, `pending` (retry),
/// `deferred` (retry that gives the attempt back; stored as `pending`), `dead`.
pub fn completion_status(action: &outbox_engine::CompleteAction) -> &'static str {
    match action {
        outbox_engine::CompleteAction::Published => outbox_engine::Status::Published.as_str(),
        outbox_engine::CompleteAction::Retry { .. } => outbox_engine::Status::Pending.as_str(),
        // A transport token, never stored: pending again, attempt given back.
        outbox_engine::CompleteAction::Defer { .. } => "deferred",
        outbox_engine::CompleteAction::Dead { .. } => outbox_engine::Status::Dead.as_str(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_placeholders_once_and_quotes_names() {
        let names = TableNames::default()
            .schema("app")
            .unwrap()
            .outbox(r#""my {outbox}""#)
            .unwrap();
        let sql = names.render(
            Dialect::Postgres,
            "SELECT * FROM {outbox} WHERE x = '{unknown}'",
        );
        assert_eq!(
            sql,
            r#"SELECT * FROM "app"."my {outbox}" WHERE x = '{unknown}'"#
        );
        let mysql = names.render(Dialect::MySql, "{outbox}");
        assert_eq!(mysql, "`app`.`my {outbox}`");
    }

    #[test]
    fn renders_derived_names_and_the_table_as_a_literal() {
        let names = TableNames::default()
            .schema("app")
            .unwrap()
            .outbox(r#""it's""#)
            .unwrap();
        let sql = names.render(
            Dialect::Postgres,
            "{outbox_fn:enqueue} {outbox_trg:fill_trg} {outbox_literal} {outbox_fn:Bad}",
        );
        assert_eq!(
            sql,
            r#""app"."it's_enqueue" "it's_fill_trg" '"app"."it''s"' {outbox_fn:Bad}"#
        );
        let sqlite = names.render(Dialect::Sqlite, "{outbox_trg:fill}");
        assert_eq!(sqlite, r#""app"."it's_fill""#);
    }

    #[test]
    fn migrations_render_without_leftover_placeholders() {
        for dialect in [Dialect::Postgres, Dialect::Sqlite, Dialect::MySql] {
            let names = TableNames::default();
            let rotate = outbox_engine::PublishedRows::Rotate;
            for m in outbox_migrations(dialect, &names, rotate)
                .into_iter()
                .chain(inbox_migrations(dialect, &names))
            {
                assert!(!m.statements.is_empty());
                for s in &m.statements {
                    assert!(
                        !s.contains("{outbox") && !s.contains("{inbox"),
                        "{dialect:?}: {s}"
                    );
                }
            }
        }
    }

    #[test]
    fn splits_statements_at_line_ends() {
        let parts = split_statements(
            "-- c\nCREATE TABLE a (x int);\n\nCREATE INDEX i ON a (x)\n  WHERE x > 0;\n",
        );
        assert_eq!(
            parts,
            vec![
                "CREATE TABLE a (x int)",
                "CREATE INDEX i ON a (x)\n  WHERE x > 0"
            ]
        );
    }
}
