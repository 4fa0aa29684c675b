//! The transactional outbox for diesel users: enqueue inside your own
//! `conn.transaction(|conn| …)`, a relay store over an r2d2 pool, and the receiver's
//! inbox, on PostgreSQL, SQLite and MySQL/MariaDB.
//!
//! The table, its statements and its migrations are those of `outbox-sqlx` (one source,
//! the `outbox-sql` crate): a table created and written by one backend is migrated,
//! drained and operated by the other, and the CLI operates both.
//!
//! | feature | gives |
//! |---|---|
//! | `postgres` | [`postgres::PgOutbox`], [`postgres::PgInbox`] on `PgConnection` |
//! | `sqlite` | [`sqlite::SqliteOutbox`], [`sqlite::SqliteInbox`] on `SqliteConnection`, [`sqlite::Pragmas`] for its pool |
//! | `mysql` | [`mysql::MysqlOutbox`], [`mysql::MysqlInbox`] on `MysqlConnection` (MySQL 8, MariaDB ≥ 10.6) |
//! | `async` | enqueue and record on the diesel-async connections of the dialects that are on |
//!
//! [`schema`] has the table as diesel `table!`s, to query it with the DSL.
//!
//! The relay store runs each call on a pooled connection in tokio's blocking pool
//! (decision 0029): the relay is async, the statements are diesel's sync ones, and
//! nothing holds a transaction across an `.await`.

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
mod driver;
mod error;
mod inbox;
#[cfg(any(feature = "sqlite", feature = "mysql"))]
mod keyed;
mod migrate;
mod rows;
pub mod schema;
mod store;

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
#[cfg(feature = "mysql")]
pub use driver::MYSQL;
#[cfg(feature = "postgres")]
pub use driver::POSTGRES;
#[cfg(feature = "sqlite")]
pub use driver::SQLITE;
pub use inbox::DieselInbox;
pub use outbox_sql::TableNames;
pub use store::{DieselOutbox, PublishedRows};

/// The diesel this crate is built on, for matching versions.
pub use diesel;
