//! The supervisor turns one receipt into one sandbox. This crate starts with receipt
//! admission, the first step of every run; sandboxing, the daemon and teardown arrive with
//! the supervisor issue.

// Audited `unsafe` blocks (the pre-exec hook and pidfd_open in `sandbox`, open_tree in
// `beneath`) are allowed where they stand, each with its `// SAFETY:` line.
#![deny(unsafe_code)]

pub mod admission;
pub mod beneath;
pub mod cgroup;
pub mod children;
pub mod complete;
pub mod daemon;
pub mod exec;
pub mod gateway;
pub mod hub;
pub mod models;
pub mod records;
pub mod runs;
pub mod sandbox;
pub mod service;
pub mod snapshot;
pub mod warm;
