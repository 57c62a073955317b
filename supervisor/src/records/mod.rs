//! Durable run records in SQLite: single use of receipts, states, teardown reports.
//!
//! A run's row is inserted (with the receipt) before anything is spawned, and `run_id` is
//! the receipt id and the primary key: a receipt can start at most one sandbox, ever, across
//! restarts. WAL with `synchronous=FULL`, integrity check on open, like the authority.

mod error;
mod group_commit;
mod queries;
mod schema;
mod store;
mod types;

#[cfg(test)]
mod tests;

pub use error::RecordsError;
pub use store::RunRecords;
pub use types::{NewRun, RouteUsage, RunRecord, RunState, TeardownReport, MAX_START_ATTEMPTS};
