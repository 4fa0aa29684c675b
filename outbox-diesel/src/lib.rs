//! The transactional outbox for diesel users: enqueue inside your own
//! `conn.transaction(|conn| …)` (sync, or diesel-async with the `async` feature), and the
//! receiver's inbox on your connection, on PostgreSQL, SQLite and MySQL/MariaDB.
//!
//! This crate is the writing side only. The relay reads the table through the one SQL
//! store of each database, `outbox-sqlx` (decision 0038): build it with
//! `outbox_sqlx::postgres::PgOutbox` and friends, or name it by URL in the `outbox`
//! front crate and CLI, where `diesel+postgres://…`, `diesel+sqlite:PATH` and
//! `diesel+mysql://…` open that same store. The table, its statements and its migrations
//! are the ones `outbox-sqlx` runs (one source, the `outbox-sql` crate), so a row you
//! enqueue here is the row the relay claims.
//!
//! | feature | gives |
//! |---|---|
//! | `postgres` | [`postgres::PgOutbox`], [`postgres::PgInbox`] on `PgConnection` |
//! | `sqlite` | [`sqlite::SqliteOutbox`], [`sqlite::SqliteInbox`] on `SqliteConnection`, [`sqlite::Pragmas`] for your pool |
//! | `mysql` | [`mysql::MysqlOutbox`], [`mysql::MysqlInbox`] on `MysqlConnection` (MySQL 8, MariaDB ≥ 10.6) |
//! | `async` | enqueue and record on the diesel-async connections of the dialects that are on |
//!
//! [`schema`] has the table as diesel `table!`s, to query it with the DSL.
//!
//! Nothing here opens a connection, commits, or spawns work: each call runs its
//! statements on the connection you pass.

#![cfg_attr(docsrs, feature(doc_cfg))]
// Without a dialect feature only the shared layer compiles, and nothing uses it.
#![cfg_attr(
    not(any(feature = "postgres", feature = "sqlite", feature = "mysql")),
    allow(dead_code, unused_imports)
)]

#[cfg(feature = "async")]
#[cfg_attr(docsrs, doc(cfg(feature = "async")))]
mod asynchronous;
mod dialect;
mod error;
mod inbox;
#[cfg(any(feature = "sqlite", feature = "mysql"))]
mod keyed;
mod migrate;
pub mod schema;
mod writer;

#[cfg(feature = "mysql")]
#[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
pub mod mysql;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub mod postgres;
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub mod sqlite;

#[cfg(feature = "async")]
pub use asynchronous::AsyncDialect;
pub use dialect::DieselDialect;
pub use inbox::DieselInbox;
pub use outbox_engine::PublishedRows;
pub use outbox_sql::TableNames;
pub use writer::DieselOutbox;

/// The diesel this crate is built on, for matching versions.
pub use diesel;
/// The diesel-async this crate is built on (feature `async`), for your async connections
/// and transactions at the version we test.
#[cfg(feature = "async")]
pub use diesel_async;
