//! The supervisor turns one receipt into one sandbox. This crate starts with receipt
//! admission, the first step of every run; sandboxing, the daemon and teardown arrive with
//! the supervisor issue.

// Three audited `unsafe` blocks are allowed where they stand, each with its `// SAFETY:`
// line, all in `sandbox`: the pre-exec hook, pidfd_open, and owning the descriptor it returns.
#![deny(unsafe_code)]

pub mod admission;
// Files beneath a grant and their snapshots live in `tollgate-files` (the CLI's restore uses
// them without linking the sandbox); re-exported under their old paths.
pub use tollgate_files::{beneath, snapshot};
pub mod cgroup;
pub mod daemon;
pub mod error;
pub mod exec;
pub mod gateway;
pub mod hub;
pub mod records;
pub mod runs;
pub mod sandbox;
pub mod service;
pub mod status;
pub mod warm;
pub mod wire;

/// This component's name in audit entries.
pub const COMPONENT: &str = "supervisor";
