//! The reliability battery's library half: the consumers that record deliveries (also
//! used by the CLI's own tests) and the counting. The `outbox-battery` binary drives
//! writers, relays and faults; see `docs/RELIABILITY.md`.

pub mod consumers;
pub mod verdict;
