//! Confining the agent process before it executes: capabilities, ids, `no_new_privs`,
//! Landlock and seccomp. Each step has its own [`ConfineError`] variant.
//!
//! One module per concern: `privileges` (capabilities, ids, inherited state; the only one with
//! `unsafe` outside tests), `landlock` and `seccomp`; the error is a leaf they all use.
//! Callers use the items re-exported here.

mod error;
mod landlock;
mod privileges;
mod seccomp;

pub use self::error::ConfineError;
pub use self::landlock::{
    prepare_landlock, with_interpreters, PreparedLandlock, REQUIRED_LANDLOCK_ABI,
};
pub use self::privileges::{
    become_agent, clear_groups, drop_bounding_set, mark_fds_cloexec_from, no_core_dumps,
    no_new_privs,
};
pub use self::seccomp::SeccompPrograms;
