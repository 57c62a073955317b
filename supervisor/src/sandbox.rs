//! From a verified receipt to a running sandbox: the plan (pure, unit-tested) and the spawn
//! of `tollgate-shim` in the sandbox's cgroup without copying the supervisor (see [`crate::warm`] for sandboxes prepared
//! ahead of need).

mod child;
mod control;
mod dirs;
mod error;
mod link;
mod plan;
mod process;
mod spawn;

pub(crate) use child::ChildFds;
pub use child::{ShimChild, SpawnError};
pub(crate) use control::{bind_unix, recv_with_fds};
pub use dirs::RunDirs;
pub use error::SandboxError;
pub use link::ControlLink;
pub(crate) use link::{send_blocking, set_nonblocking};
pub use plan::{create_mount_point, plan_for, sandbox_base, AGENT_INNER_ID};
pub use process::{IdleShim, PidOne, ReattachedSandbox, SandboxOutput, SandboxProcess, ShimWatch};
pub(crate) use spawn::spawn_in_cgroup;
pub use spawn::Spawner;

/// Host directories shown read-only inside every sandbox (those that exist on the host): the
/// receipt crate's list, the same one the authority refuses mount targets beneath.
pub use tollgate_receipt::paths::SYSTEM_PATHS;
