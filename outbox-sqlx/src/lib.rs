//! sqlx stores.
