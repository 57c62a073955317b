//! Why confining the agent failed: one variant per step.

/// A confinement step failed; the agent is not started.
#[derive(Debug, thiserror::Error)]
pub enum ConfineError {
    /// Dropping a capability from the bounding set failed.
    #[error("dropping capability {cap} from the bounding set: {source}")]
    Bounding {
        /// The capability number.
        cap: u32,
        /// The error.
        source: std::io::Error,
    },
    /// Clearing supplementary groups failed.
    #[error("clearing supplementary groups: {0}")]
    Groups(nix::Error),
    /// Switching to the agent's uid/gid failed.
    #[error("switching to the agent's ids: {0}")]
    Ids(nix::Error),
    /// Clearing a capability set failed, or a capability survived.
    #[error("clearing capabilities: {0}")]
    Capabilities(String),
    /// Setting `no_new_privs` failed.
    #[error("setting no_new_privs: {0}")]
    NoNewPrivs(nix::Error),
    /// The kernel cannot enforce the Landlock rules the receipt promises (fail closed).
    #[error("landlock: {0}")]
    Landlock(String),
    /// Building or installing the seccomp filter failed.
    #[error("seccomp: {0}")]
    Seccomp(String),
    /// Marking inherited descriptors close-on-exec failed.
    #[error("closing inherited descriptors: {0}")]
    Fds(std::io::Error),
    /// Disabling core dumps failed.
    #[error("disabling core dumps: {0}")]
    CoreDumps(nix::Error),
}
