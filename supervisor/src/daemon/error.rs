//! Why the supervisor daemon could not start or stopped: one typed error, each variant with
//! its exit code (sysexits), mapped in exactly one place.

use std::path::PathBuf;

use crate::cgroup::CgroupError;

/// A fatal daemon error, with its exit code.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// Not started as root.
    #[error("must run as root (it builds namespaces and cgroups)")]
    NotRoot,
    /// The configuration file (`--config`) is unreadable or wrong.
    #[error("--config {}: {problem}", .path.display())]
    ConfigFile {
        /// The file.
        path: PathBuf,
        /// What is wrong, in one line.
        problem: String,
    },
    /// A setting neither a flag nor the configuration file gives.
    #[error("{0}")]
    MissingSetting(&'static str),
    /// The shim binary is not where it was looked for.
    #[error("shim {} not found; pass --shim PATH", .0.display())]
    ShimMissing(PathBuf),
    /// The audit key (`--audit-key-file`, `TOLLGATE_AUDIT_KEY`) could not be read.
    #[error("{0}")]
    AuditKey(tollgate_audit::AuditError),
    /// The routes file, a route's key, the classifier, or a local route's probe failed.
    #[error("routes: {0}")]
    Routes(#[from] tollgate_router_backends::LoadError),
    /// An egress file (`--egress-hosts`, `--egress-secrets`, `--egress-extra-roots`) is
    /// unreadable or wrong, or a secret it names cannot be read.
    #[error("{0}")]
    Egress(#[from] crate::egress::config::EgressConfigError),
    /// The delegation token file is unusable.
    #[error("--delegation-token-file: {0}")]
    DelegationToken(String),
    /// The data directory cannot be created, or other users can enter it.
    #[error("data directory: {0}")]
    DataDir(tollgate_audit::PrivateDirError),
    /// Another process holds the data directory.
    #[error("{0}")]
    DataDirInUse(#[from] tollgate_daemon::files::LockError),
    /// Another live supervisor holds this one's cgroup parent or host ids.
    #[error("{0}")]
    HostClaim(#[from] tollgate_daemon::host::ClaimError),
    /// TLS (`--tls-cert`, `--tls-key`, `--tls-client-ca`, `--authority-ca`) cannot be set up,
    /// or plaintext was asked for where it is refused.
    #[error("{0}")]
    Tls(String),
    /// `--authority` names a readiness file that cannot be read.
    #[error("--authority: {0}")]
    AuthorityAddress(String),
    /// The pinned key file (`--trust-keys`) is unreadable or wrong.
    #[error("{0}")]
    KeyFile(String),
    /// The admin token could not be read or created.
    #[error("cannot {action} {path}: {source}")]
    AdminToken {
        /// `read` or `write`.
        action: &'static str,
        /// `<data-dir>/admin.token`.
        path: PathBuf,
        /// The failure.
        source: std::io::Error,
    },
    /// The authority could not be reached for the key set, or its revocations.
    #[error("cannot fetch the key set from the authority at {url}: {detail}; is it running? (or use --trust-keys FILE)")]
    Authority {
        /// Its URL.
        url: String,
        /// The last error.
        detail: String,
    },
    /// A delegation token without an authority to ask.
    #[error("--delegation-token-file needs an authority: give --authority (or authority in the config file), not --trust-keys; delegation asks the authority")]
    DelegationNeedsAuthority,
    /// The audit log's redaction could not be set up.
    #[error("audit redaction: {0}")]
    Redaction(String),
    /// Opening the run manager failed (database, recovery sweep).
    #[error("{0}")]
    Runs(#[from] crate::error::StartError),
    /// The audit log could not be opened.
    #[error("audit log: {0}")]
    Audit(#[from] tollgate_audit::AuditError),
    /// The listen address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address.
        addr: String,
        /// The failure.
        source: std::io::Error,
    },
    /// The readiness file could not be written.
    #[error("cannot write {path}: {source}")]
    Readiness {
        /// `<data-dir>/supervisor.addr`.
        path: PathBuf,
        /// The failure.
        source: std::io::Error,
    },
    /// The signal handlers could not be installed.
    #[error("cannot handle signals: {0}")]
    Signals(std::io::Error),
    /// The gRPC server failed.
    #[error("{0}")]
    Serve(#[from] tonic::transport::Error),
    /// The reflection service could not be built.
    #[error("reflection: {0}")]
    Reflection(String),
    /// Blocking work panicked.
    #[error("internal task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

impl DaemonError {
    /// sysexits-style exit code.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::NotRoot => 77, // EX_NOPERM
            Self::AuditKey(e) => u8::try_from(e.exit_code()).unwrap_or(78),
            Self::ShimMissing(_)
            | Self::Routes(_)
            | Self::Egress(_)
            | Self::DelegationToken(_)
            | Self::ConfigFile { .. }
            | Self::Tls(_)
            | Self::MissingSetting(_) => 78,
            Self::KeyFile(_)
            | Self::AuthorityAddress(_)
            | Self::AdminToken { .. }
            | Self::DelegationNeedsAuthority
            | Self::Redaction(_) => 78, // EX_CONFIG
            Self::DataDir(_) => 73,      // EX_CANTCREAT
            Self::DataDirInUse(_) => 75, // EX_TEMPFAIL
            Self::HostClaim(tollgate_daemon::host::ClaimError::Io { .. }) => 73,
            Self::HostClaim(_) => 75,
            Self::Authority { .. }
            | Self::Listen { .. }
            | Self::Readiness { .. }
            | Self::Serve(_)
            | Self::Reflection(_) => 69,
            Self::Signals(_) => 71, // EX_OSERR // EX_UNAVAILABLE
            // The host's cgroups cannot hold the runs' parent: the operator's set-up to fix.
            Self::Runs(crate::error::StartError::Cgroup(
                CgroupError::ControllersUnavailable { .. } | CgroupError::ProcessesInTheWay { .. },
            )) => 78,
            Self::Runs(_) | Self::Task(_) => 70, // EX_SOFTWARE
            Self::Audit(e) => u8::try_from(e.exit_code()).unwrap_or(70),
        }
    }
}
