//! The supervisor turns one receipt into one sandbox and is the only gateway out of it.
//!
//! Dependencies between its modules run one way (docs/architecture.md):
//!
//! 1. leaves: [`error`], [`status`], [`wire`], [`records`], [`cgroup`], [`sandbox`],
//!    [`exec`], [`hub`], [`host_ids`], [`admission`], [`warm`], [`egress`], [`link`];
//! 2. [`gateway`]: the call gate and one handler per tool family, on each run's socket;
//! 3. [`runs`]: the lifecycle (admit, start, teardown) over the leaves and the gateway;
//! 4. [`service`] (the gRPC API) and [`daemon`] (`Supervisor::open` / `run` / `serve`).

// Three audited `unsafe` blocks are allowed where they stand, each with its `// SAFETY:`
// line, all in `sandbox`: the pre-exec hook, pidfd_open, and owning the descriptor it returns.
#![deny(unsafe_code)]

pub mod admission;
pub mod approval_api;
pub mod approvals;
// Files beneath a grant and their snapshots live in `tollgate-files` (the CLI's restore uses
// them without linking the sandbox); re-exported under their old paths.
pub use tollgate_files::{beneath, snapshot};
pub mod callers;
pub mod cgroup;
pub mod copy_in;
pub mod copy_out;
pub mod daemon;
pub mod egress;
pub mod error;
pub mod exec;
pub mod gateway;
pub mod host_ids;
pub mod host_limits;
pub mod hub;
pub mod link;
pub mod memory;
pub mod metrics;
pub mod records;
pub mod runs;
pub mod sandbox;
pub mod service;
pub mod status;
pub mod warm;
pub mod wire;

/// This component's name in audit entries.
pub const COMPONENT: &str = "supervisor";
