//! Integration tests of the audit log through its public API.

mod common;
mod crash;
mod lifecycle;
mod space;
mod tamper;
