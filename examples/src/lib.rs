//! The examples' code, shared by `cargo run --example …` and the tests that run them.

pub mod commerce_notifications;
pub mod quickstart;
pub mod saas_event_bus;
pub mod webhook_gateway;

mod support;
