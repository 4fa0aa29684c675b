//! The examples' code, shared by `cargo run --example …` and the tests that run them.

pub mod quickstart;
