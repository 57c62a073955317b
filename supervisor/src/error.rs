//! Why a run could not start: one error type shared by the run manager, the warm pool and
//! delegation on the gateway, mapped to a gRPC status in `status`.

use tollgate_audit::AuditError;
use tollgate_receipt::VerifyError;

use crate::cgroup::CgroupError;
use crate::records::RecordsError;
use crate::sandbox::SandboxError;

/// Why a run could not start. Nothing was spawned.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The receipt failed verification (the reason is typed).
    #[error(transparent)]
    Receipt(#[from] VerifyError),
    /// The receipt already started a sandbox (single use).
    #[error("receipt {0} has already been used to start a run; mint a new one")]
    AlreadyUsed(String),
    /// An argv was given but the receipt pins its agent.
    #[error("receipt {0} pins its agent command; start it without an argv")]
    ArgvNotAllowed(String),
    /// Every host id of the configured range is in use.
    #[error("no free sandbox host id in {0:?}: every one is a live run's; end some runs or give the supervisor more (--host-id-count)")]
    NoHostId(std::ops::Range<u32>),
    /// A host limit refused what a new sandbox needs (descriptors, processes, memory).
    #[error(transparent)]
    HostLimit(#[from] HostLimit),
    /// The sandbox could not be planned or built.
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    /// The cgroup could not be created with the receipt's limits.
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    /// Recording the run failed.
    #[error(transparent)]
    Records(#[from] RecordsError),
    /// The audit log could not record the start: nothing runs unaudited.
    #[error("audit log: {0}")]
    Audit(#[from] AuditError),
    /// The authority's revocations are older than `--max-staleness`: nothing new starts.
    #[error("{0}")]
    Stale(String),
    /// The supervisor is shutting down and starts nothing new.
    #[error("the supervisor is shutting down; start the run elsewhere or after it restarts")]
    ShuttingDown,
    /// A child would take its live siblings past their parent's memory, pids or cpu.
    #[error("{0}")]
    ChildrenLimits(String),
    /// A granted path cannot be pinned as signed (a symbolic link on it, or a mounted grant
    /// that does not exist): refused before the receipt is spent.
    #[error("{reason}")]
    Grant {
        /// Stable code: `grant_link`, `grant_missing`, `grant_wx`, ….
        code: &'static str,
        /// One line naming the grant and what is wrong with it.
        reason: String,
    },
    /// A delegation rule refused the start (`code` names which, for the audit entry).
    #[error("{reason}")]
    Delegated {
        /// Stable code: `delegated`, `parent_not_live`, `grant_escapes`, `children_limits`.
        code: &'static str,
        /// One line naming the rule and what broke it.
        reason: String,
    },
}

impl StartError {
    /// Stable code for audit entries.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Receipt(e) => e.failure().code(),
            Self::AlreadyUsed(_) => "already_used",
            Self::ArgvNotAllowed(_) => "argv_not_allowed",
            Self::NoHostId(_) => "no_host_id",
            Self::HostLimit(limit) => limit.code(),
            Self::ShuttingDown => "shutting_down",
            Self::Stale(_) => "authority_stale",
            Self::Delegated { code, .. } | Self::Grant { code, .. } => code,
            Self::ChildrenLimits(_) => "children_limits",
            Self::Sandbox(
                SandboxError::NoAgent
                | SandboxError::NotExecutable(_)
                | SandboxError::NotInSandbox(_),
            ) => "argv",
            Self::Sandbox(_) | Self::Cgroup(_) | Self::Records(_) | Self::Audit(_) => "internal",
        }
    }
}

impl StartError {
    /// This error as the host limit that caused it, when an operating-system error in it is
    /// one (`EMFILE`, `ENFILE`, `ENOMEM`; `EAGAIN` only from starting a process, where it
    /// means no pid or thread was left); otherwise unchanged.
    pub(crate) fn host_limited(self) -> Self {
        let limit = match &self {
            Self::Sandbox(SandboxError::Spawn(e)) => {
                let (source, spawning) = e.source_io();
                HostLimit::of(source, spawning)
            }
            Self::Sandbox(SandboxError::Control(source) | SandboxError::RunDir { source, .. })
            | Self::Cgroup(CgroupError::Io { source, .. }) => HostLimit::of(source, false),
            _ => None,
        };
        limit.map_or(self, Self::HostLimit)
    }
}

/// A host limit that refused a new sandbox: each names the limit and how to raise it.
#[derive(Debug, thiserror::Error)]
pub enum HostLimit {
    /// The supervisor's own open-file limit (`EMFILE`).
    #[error("the supervisor reached its open-file limit (RLIMIT_NOFILE {limit}; a live run holds about 3 descriptors): raise it (LimitNOFILE= in its service unit, at most fs.nr_open) or end some runs")]
    Descriptors {
        /// The soft limit in force.
        limit: u64,
    },
    /// The host's open-file table (`ENFILE`).
    #[error("the host's open-file table is full (fs.file-max): raise it (sysctl fs.file-max) or end some runs")]
    FileTable,
    /// No pid or thread was left for the sandbox's processes (`EAGAIN` from `clone`).
    #[error("the host has no process left for a new sandbox (kernel.pid_max {pid_max}, kernel.threads-max {threads_max}, or the supervisor's RLIMIT_NPROC or pids.max): raise them (sysctl kernel.pid_max) or end some runs")]
    Processes {
        /// `kernel.pid_max` (0 when unreadable).
        pid_max: u64,
        /// `kernel.threads-max` (0 when unreadable).
        threads_max: u64,
    },
    /// The kernel had no memory for the sandbox (`ENOMEM`).
    #[error("the host is out of memory for a new sandbox (ENOMEM): free memory or end some runs")]
    Memory,
}

impl HostLimit {
    /// The limit behind `error`, if it is one; `spawning`: it came from starting a process.
    pub fn of(error: &std::io::Error, spawning: bool) -> Option<Self> {
        match error.raw_os_error()? {
            libc::EMFILE => Some(Self::Descriptors {
                limit: nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
                    .map_or(0, |(soft, _)| soft),
            }),
            libc::ENFILE => Some(Self::FileTable),
            libc::ENOMEM => Some(Self::Memory),
            libc::EAGAIN if spawning => Some(Self::Processes {
                pid_max: read_number("/proc/sys/kernel/pid_max"),
                threads_max: read_number("/proc/sys/kernel/threads-max"),
            }),
            _ => None,
        }
    }

    /// Stable code for audit entries.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Descriptors { .. } => "host_descriptors",
            Self::FileTable => "host_file_table",
            Self::Processes { .. } => "host_processes",
            Self::Memory => "host_memory",
        }
    }
}

/// A number from a `/proc/sys` file (0 when unreadable).
pub(crate) fn read_number(path: &str) -> u64 {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|text| text.trim().parse().ok())
        .unwrap_or(0)
}

/// Why input could not reach a run.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    /// No live run has the id.
    #[error("no live run {0}")]
    NotLive(String),
    /// The run was started without input, or its input was closed.
    #[error("run {0} takes no input: start it with stdin or a terminal (tollgate run -i or -t)")]
    NoInput(String),
    /// Writing failed (the agent closed its stdin, or ended).
    #[error("the agent's input: {0}")]
    Write(std::io::Error),
}

/// Why a live run's powers could not be changed.
#[derive(Debug, thiserror::Error)]
pub enum AmendError {
    /// No live run has the id.
    #[error("no live run {0}")]
    NotLive(String),
    /// A narrowing that would widen, or name a grant the run does not have.
    #[error("{0}")]
    NotANarrowing(String),
    /// The amendment is refused (signature, run, freshness, shape).
    #[error("amendment refused: {0}")]
    Amendment(#[from] tollgate_receipt::amendment::AmendmentError),
    /// A mounted grant could not be unmounted from the live sandbox (nothing was changed).
    #[error("unmounting {target} from the live sandbox: {reason}")]
    Unmount {
        /// The sandbox path.
        target: String,
        /// Why.
        reason: String,
    },
    /// A gateway-only program could not be hidden from the live sandbox's agent, so it was
    /// not added (nothing was changed).
    #[error("hiding {program} from the live sandbox's agent: {reason}")]
    Hide {
        /// The program (a sandbox path).
        program: String,
        /// Why.
        reason: String,
    },
    /// The run's receipt was revoked: nothing widens it.
    #[error("run {0}'s receipt is revoked")]
    Revoked(String),
    /// The change could not be audited, so it was not made.
    #[error("the audit log: {0}")]
    Audit(#[from] AuditError),
}

/// Why a workspace could not be found or removed.
#[derive(Debug, thiserror::Error)]
pub enum WorkspaceError {
    /// The run is neither live nor has a kept workspace.
    #[error("run {0} has no workspace: it is not live, and none was kept (or its time is up)")]
    NotFound(String),
    /// Removing it failed.
    #[error("removing {path}: {source}")]
    Remove {
        /// The directory.
        path: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
}
