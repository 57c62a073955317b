//! Why a sandbox could not be prepared or started.

use std::path::PathBuf;

use super::child::SpawnError;

/// A sandbox could not be prepared or started.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// The receipt pins no agent and none was given.
    #[error("no agent command: the receipt pins none and none was given")]
    NoAgent,
    /// The agent's executable is not in the receipt's exec list.
    #[error("{0} is not in the receipt's exec list")]
    NotExecutable(String),
    /// The agent's executable is not on a path the sandbox mounts executable.
    #[error("{0} cannot run in a sandbox: only programs on the system paths (/usr, /bin, ...), beneath a read grant's mount or beneath a write grant with exec = true are executable there; other write grants, /work and /tmp are mounted noexec")]
    NotInSandbox(String),
    /// A file-system grant cannot be mounted safely (re-checked here: the supervisor does
    /// not rely on every signer having validated it).
    #[error("fs grant {path}: {reason}")]
    BadGrant {
        /// The grant's host path.
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// Preparing the run directory failed.
    #[error("preparing {path}: {source}")]
    RunDir {
        /// The directory.
        path: PathBuf,
        /// The failure.
        source: std::io::Error,
    },
    /// Starting `tollgate-shim` in the sandbox's cgroup failed (which step is in the
    /// [`SpawnError`]).
    #[error(transparent)]
    Spawn(#[from] SpawnError),
    /// Talking to the shim failed.
    #[error("control socket: {0}")]
    Control(std::io::Error),
    /// The shim reported a failure (the step and reason).
    #[error("sandbox setup failed: {0}")]
    Setup(String),
}
