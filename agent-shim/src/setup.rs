//! Building the sandbox's file system and network, from inside its new namespaces.
//!
//! Runs in the shim's pid 1, which is still real root in mount, pid, net, ipc, uts and cgroup
//! namespaces owned by the host's user namespace. Building the mounts as real root matters:
//! the mounts are then owned by the host user namespace, so nothing the agent later does
//! inside its own user namespace can unmount or remount them ("locked" mounts).
//!
//! Each privileged step has its own [`SetupError`] variant naming the step and the path.

// The privileged steps of building the sandbox call the kernel directly: `unsafe` is allowed in this
// module, and every block carries its `// SAFETY:` line (clippy::undocumented_unsafe_blocks).
#![allow(unsafe_code)]

mod base;
mod error;
mod mounts;
mod net;
mod programs;
mod root;
mod userland;
mod views;

pub use base::make_base;
pub use error::SetupError;
pub(crate) use programs::{hide_programs, reveal_program};
pub use root::{finish_root, prepare_root, PlanMounts};
