//! Why building the sandbox failed: one variant per step, naming the step and the path.

use std::path::PathBuf;

/// A step of building the sandbox failed.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// Changing the mount tree's propagation (so nothing propagates back to the host, and,
    /// once built, nothing from it) failed.
    #[error("setting mount propagation: {0}")]
    Private(nix::Error),
    /// Mounting a file system failed.
    #[error("mounting {what} at {target}: {source}")]
    Mount {
        /// What was mounted.
        what: String,
        /// Where.
        target: PathBuf,
        /// The error.
        source: nix::Error,
    },
    /// Making a mount read-only (and nosuid, nodev) failed.
    #[error("making {target} read-only: {source}")]
    ReadOnly {
        /// The mount.
        target: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// Creating a mount point or link in the new root failed.
    #[error("creating {path} in the new root: {source}")]
    MountPoint {
        /// The path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// Attaching a grant's detached mount (sent by the supervisor) failed.
    #[error("attaching the grant {grant} at {target}: {source}")]
    Attach {
        /// The granted host path (for the message only: the mount came as a descriptor).
        grant: PathBuf,
        /// Where inside the sandbox.
        target: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The supervisor sent a different number of detached mounts than the plan needs.
    #[error("the plan needs {expected} detached mounts but {received} came with it")]
    MountCount {
        /// Mounts received.
        received: usize,
        /// Mounts the plan needs.
        expected: usize,
    },
    /// A bind source does not exist on the host.
    #[error("bind source {0} does not exist")]
    MissingSource(PathBuf),
    /// Moving the new root over the base's and changing into it failed.
    #[error("switching to the new root: {0}")]
    SwitchRoot(nix::Error),
    /// A step of making the sandboxes' base mount namespace failed: a new mount namespace,
    /// its descriptor, `pivot_root` into the base, or the way back to the host's.
    #[error("the sandboxes' base mount namespace: {step}: {source}")]
    Base {
        /// The step.
        step: &'static str,
        /// The error.
        source: nix::Error,
    },
    /// The directory the base is built on holds something, which the base would cover.
    #[error("the sandboxes' mount point {0} is not empty; it must be an empty directory (the data directory's root/): empty it or choose another --data-dir")]
    MountPointNotEmpty(PathBuf),
    /// Reading how much the sandbox's root tmpfs holds (`statvfs`), which `/tmp`'s size is
    /// added to, failed.
    #[error("reading what the sandbox's root holds, to size /tmp: {0}")]
    RootSize(nix::Error),
    /// Setting the host name failed.
    #[error("setting the host name: {0}")]
    Hostname(nix::Error),
    /// A program granted only through the gateway cannot be hidden from the agent, or the
    /// agent would reach it all the same.
    #[error("gateway-only program {program}: {reason}")]
    GatewayProgram {
        /// The program (a sandbox path).
        program: PathBuf,
        /// Why, in one line.
        reason: String,
    },
    /// Bringing up the loopback interface failed.
    #[error("bringing up loopback: {0}")]
    Loopback(std::io::Error),
}
