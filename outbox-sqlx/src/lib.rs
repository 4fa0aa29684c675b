//! Transactional outbox stores on [sqlx](https://docs.rs/sqlx): PostgreSQL (primary),
//! SQLite (embedded) and MySQL 8 / MariaDB ≥ 10.6, each behind a Cargo feature
//! (`postgres`, `sqlite`, `mysql`).
//!
//! Each backend gives you three things:
//!
//! - **enqueue inside your transaction**: `outbox.enqueue(&mut tx, &message)` runs one
//!   `INSERT` on the connection you pass and nothing else — no commit, no other
//!   connection, no network call — so the message commits or rolls back with your
//!   business change;
//! - **a relay store** implementing [`outbox_engine::Store`] (claim with
//!   `FOR UPDATE SKIP LOCKED` or a single atomic SQLite statement, token-fenced batched
//!   completion) plus stats, dead letters and purge;
//! - **an inbox** for receivers, whatever the sink: [`Inbox::record`] writes
//!   `(consumer, key)` inside the receiver's own transaction and answers whether the
//!   delivery is new or a duplicate.
//!
//! The SQL comes from `outbox-sql`, the one source of the schema that every backend runs.
//! Table and schema names are validated identifiers, so no name can inject SQL.
//!
//! The store and the inbox are written once, as [`SqlOutbox`] and [`SqlInbox`] over a
//! sealed [`SqlDialect`]; `PgOutbox`, `SqliteOutbox` and `MySqlOutbox` (and the inboxes)
//! are their aliases, documented in each dialect's module.
//!
//! Run [`postgres::PgOutbox::migrate`] (or the SQLite/MySQL equivalent) once at start-up;
//! migrations are idempotent and safe to run from several processes at once.
//!
//! Every store implements [`outbox_engine::Backend`] too, and [`POSTGRES`], [`SQLITE`] and
//! [`MYSQL`] are the drivers that open them from a URL (`postgres://…`, `sqlite:…`,
//! `mysql://…` / `mariadb://…`) for the `outbox` front crate's registry. The pools they
//! open close a connection that stops answering (see [`release_check`], which pools you
//! build for a relay should use too).

#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
mod common;
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
mod dialect;
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
mod driver;
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
mod error;
#[cfg(any(feature = "postgres", feature = "sqlite"))]
mod filtered;
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
mod inbox;
#[cfg(any(feature = "sqlite", feature = "mysql"))]
mod keyed;
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
mod migrate;
#[cfg(feature = "mysql")]
pub mod mysql;
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
mod pool;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
mod rows;
#[cfg(feature = "sqlite")]
pub mod sqlite;
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
mod store;

#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
pub use dialect::SqlDialect;
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
#[doc(hidden)]
pub use dialect::{AdminDialect, DeadChange, KeyedDialect, RelayDialect, Tables};
#[cfg(feature = "mysql")]
pub use driver::MYSQL;
#[cfg(feature = "postgres")]
pub use driver::POSTGRES;
#[cfg(feature = "sqlite")]
pub use driver::SQLITE;
#[cfg(any(feature = "postgres", feature = "sqlite"))]
#[doc(hidden)]
pub use filtered::FilteredDialect;
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
pub use inbox::SqlInbox;
pub use outbox_sql::{Ident, IdentError, TableNames};
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
pub use pool::release_check;
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
pub use store::SqlOutbox;

pub use outbox_engine::{Delivery, Inbox, PublishedRows};

/// The `sqlx` this crate is built on (runtime Tokio, with the `uuid` and `chrono` types
/// and the drivers of the features that are on), for your pool and transactions at the
/// version the stores are tested with: `outbox_sqlx::sqlx::PgPool`, say. Add your own
/// `sqlx` dependency (same minor version) for its macros.
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
pub use sqlx;
