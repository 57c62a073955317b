//! The contract between the supervisor and `tollgate-shim`: the [`plan`] the supervisor
//! derives from a receipt, the [`protocol`] messages on the control socket between them, and
//! the [`spawner`] messages by which the supervisor has its shims started.
//!
//! Pure data in its own crate so the supervisor, which builds plans and reads the shim's
//! answers, does not link the shim's sandboxing code, and the shim does not link the
//! supervisor's.
#![forbid(unsafe_code)]

pub mod plan;
pub mod protocol;
pub mod spawner;
