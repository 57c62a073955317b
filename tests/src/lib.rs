//! Harness for cross-process tests: starts the real `tollgate-authority` and
//! `tollgate-supervisor` binaries on free ports in their own data directories and stops them
//! (SIGTERM or SIGKILL) on demand or on drop (`authority`, `supervisor`), with a test PKI
//! (`pki`), client helpers (`client`) and the host's (`host`: binaries, root, leftovers).
//!
//! Binaries are looked up in the cargo target directory next to the running test executable
//! (or in `TOLLGATE_BIN_DIR`); `scripts/test` builds them before the tests run.

#![forbid(unsafe_code)]

pub mod fake_models;
pub mod flood;
pub mod lan;
pub mod llama;
pub mod model_gateway;
pub mod relay;
pub mod remote;
pub mod run_fixture;

mod authority;
mod client;
mod host;
mod pki;
mod supervisor;

pub use authority::AuthorityProcess;
pub use client::{authed, reflected_services, sample, scrape_metrics};
pub use host::{
    bin_path, cpu_weight_file, is_warm, leftovers, pids_cgroup_dir, private_dir, repo_root,
    require_root, stderr_line, supervisor_audit, wait_for_file,
};
pub use pki::Pki;
pub use supervisor::{daemons, SupervisorProcess};

/// A scripted model server speaking the three APIs coding agents use (tests/tests/coding_agents.rs).
pub mod scripted_models;
