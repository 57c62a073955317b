//! CLI errors: one line each, with one exit code per kind.

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// A file given on the command line is unusable.
    #[error("{0}")]
    Input(String),
    /// A daemon cannot be reached.
    #[error("cannot reach the {daemon} at {addr}: {detail}; start tollgate-{daemon} or pass --{daemon} ADDR")]
    Unreachable {
        /// "authority" or "supervisor".
        daemon: &'static str,
        /// The address tried.
        addr: String,
        /// The transport error.
        detail: String,
    },
    /// The connection failed under a call, before the daemon answered it.
    #[error("the connection to the daemon failed before it answered ({0}); a daemon serving TLS refuses plaintext (pass --ca) and one requiring client certificates refuses clients without one (pass --cert and --key)")]
    ConnectionFailed(String),
    /// The supervisor went away while a run was being followed: stopped, crashed or
    /// restarted (the run goes on under a supervisor with --live-restore).
    #[error("the supervisor stopped or restarted while run {run_id} was going on (with --live-restore the run goes on): follow it with `tollgate watch {run_id}`")]
    SupervisorGone {
        /// The run that was followed.
        run_id: String,
    },
    /// A daemon answered with an error.
    #[error("refused ({code}): {message}")]
    Refused {
        /// The gRPC code, in words.
        code: String,
        /// Its message.
        message: String,
        /// The raw code, for the exit status.
        status: tonic::Code,
    },
    /// A receipt failed verification.
    #[error("receipt is not valid: {0}")]
    InvalidReceipt(#[from] tollgate_receipt::VerifyError),
    /// `tollgate mint --dry-run` found grants above the caller's ceiling.
    #[error("{0} violation(s) of your ceiling (listed above); nothing was minted")]
    AboveCeiling(usize),
    /// `tollgate doctor` found checks that fail.
    #[error(
        "{0} check(s) failed: this host cannot run tollgate-supervisor as it is (fixes above)"
    )]
    Doctor(usize),
    /// No token was given for the daemon a command talks to.
    #[error("{}", no_token(.0))]
    NoToken(Daemon),
    /// Writing output failed.
    #[error("cannot write {path}: {detail}")]
    Output {
        /// The file.
        path: String,
        /// What went wrong.
        detail: String,
    },
    /// Standard output cannot be written (a full disk, `/dev/full`, an I/O error).
    #[error("cannot write to standard output: {0}; nothing more was printed")]
    Stdout(std::io::Error),
    /// Standard output is a pipe whose reader went away (`tollgate ps | head`): the command
    /// ends quietly, as a Unix filter does.
    #[error("standard output was closed")]
    StdoutClosed,
    /// A run could not start (`tollgate run` exits 125).
    #[error("the run could not start: {0}")]
    RunNotStarted(String),
    /// A run ended; `tollgate run` exits with this code (the agent's, or 128+signal).
    #[error("{reason}")]
    RunEnded {
        /// The exit status to use.
        code: u8,
        /// Why the run ended, when not by a normal agent exit.
        reason: String,
    },
    /// Audit logs failed verification (the details are printed).
    #[error("{0} audit log(s) failed verification")]
    AuditBroken(usize),
    /// A snapshot could not be restored.
    #[error("restore: {0}")]
    Restore(#[from] SnapshotError),
    /// A root file system could not be imported, listed or removed.
    #[error("rootfs: {0}")]
    Rootfs(#[from] RootfsError),
    /// Something else went wrong (quickstart's child process, for example).
    #[error("{0}")]
    Other(String),
}

impl From<tonic::Status> for CliError {
    fn from(status: tonic::Status) -> Self {
        // A status made by the client's own transport (it carries the error under it); one
        // the daemon sent never does.
        if let Some(source) = std::error::Error::source(&status) {
            return Self::ConnectionFailed(format!("{}: {source}", status.message()));
        }
        Self::Refused {
            code: code_words(status.code()),
            message: status.message().replace('\n', " "),
            status: status.code(),
        }
    }
}

/// "PermissionDenied" -> "permission denied".
fn code_words(code: tonic::Code) -> String {
    let mut words = String::new();
    for (i, c) in format!("{code:?}").chars().enumerate() {
        if c.is_uppercase() && i > 0 {
            words.push(' ');
        }
        words.push(c.to_ascii_lowercase());
    }
    words
}

use std::path::PathBuf;

use tollgate_files::snapshot::SnapshotError;

impl CliError {
    /// The process exit code (sysexits-style; 1 for an invalid receipt).
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Input(_) => 66, // EX_NOINPUT
            Self::Unreachable { .. } | Self::ConnectionFailed(_) | Self::SupervisorGone { .. } => {
                69 // EX_UNAVAILABLE
            }
            Self::NoToken(_) => 77,
            Self::Doctor(_) => 1,
            Self::AboveCeiling(_) => 77, // EX_NOPERM
            Self::InvalidReceipt(_) | Self::AuditBroken(_) => 1,
            Self::RunNotStarted(_) => 125,
            Self::RunEnded { code, .. } => *code,
            Self::Output { .. } => 73, // EX_CANTCREAT
            Self::Stdout(_) => 74,     // EX_IOERR
            Self::StdoutClosed => 141, // 128 + SIGPIPE, as a shell reports a filter it ended
            Self::Other(_) => 70,      // EX_SOFTWARE
            Self::Rootfs(e) => e.exit_code(),
            Self::Restore(e) => match e {
                SnapshotError::BadId(_) => 64, // EX_USAGE
                SnapshotError::NotFound { .. } => 66,
                SnapshotError::BadManifest { .. } => 65,
                SnapshotError::NotAFile { .. } | SnapshotError::GrantMoved { .. } => 73,
                SnapshotError::Io { .. } => 74, // EX_IOERR
                SnapshotError::TooLarge { .. } | SnapshotError::QuotaSpent { .. } => 70,
            },
            Self::Refused { status, .. } => match status {
                tonic::Code::Unauthenticated | tonic::Code::PermissionDenied => 77,
                tonic::Code::InvalidArgument => 65, // EX_DATAERR
                tonic::Code::NotFound => 66,
                tonic::Code::AlreadyExists => 73,
                tonic::Code::Unavailable => 69,
                _ => 70,
            },
        }
    }
}

/// Why a root file system could not be imported, listed or removed (`tollgate rootfs`). It
/// lives here, with the error it converts into, so that this leaf depends on no command.
#[derive(Debug, thiserror::Error)]
pub enum RootfsError {
    /// Not a name a receipt can give.
    #[error("{0:?} is not a root file system name: use letters, digits, '.', '_' and '-' (1 to 64, not starting with '.')")]
    Name(String),
    /// The name is taken.
    #[error("{0} already exists: remove it first with `tollgate rootfs rm NAME` (stop the runs using it)")]
    Exists(PathBuf),
    /// The archive holds no userland.
    #[error("the archive has no usr or bin at its top: it is not a root file system (make one with `docker export CONTAINER > FILE.tar`)")]
    NotUserland,
    /// An entry would land outside the destination.
    #[error("the archive's entry {0:?} points outside the root file system; refused")]
    Outside(String),
    /// The archive cannot be read.
    #[error("reading the archive: {0}")]
    Archive(std::io::Error),
    /// A file or directory could not be used.
    #[error("{path}: {source}")]
    Io {
        /// Which.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// No root file system has the name.
    #[error("no root file system named {name} under {dir}")]
    Missing {
        /// The name.
        name: String,
        /// The rootfs directory.
        dir: PathBuf,
    },
}

impl RootfsError {
    /// The exit code (sysexits).
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Name(_) => 64,                                           // EX_USAGE
            Self::NotUserland | Self::Outside(_) | Self::Archive(_) => 65, // EX_DATAERR
            Self::Missing { .. } => 66,                                    // EX_NOINPUT
            Self::Exists(_) => 73,                                         // EX_CANTCREAT
            Self::Io { .. } => 74,                                         // EX_IOERR
        }
    }
}

/// What to pass when no token was given, for the daemon that needs it.
fn no_token(daemon: &Daemon) -> &'static str {
    match daemon {
        Daemon::Authority => "no operator token: pass --token-file PATH or set TOLLGATE_AUTHORITY_TOKEN_FILE (the admin token is <authority data dir>/admin.token)",
        Daemon::Supervisor => "no supervisor token: pass --token-file PATH or set TOLLGATE_SUPERVISOR_TOKEN_FILE (the supervisor's <data dir>/admin.token, or your operator token from the authority), or --cert/--key with your operator certificate",
    }
}

/// Which daemon a command talks to (whose token it needs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Daemon {
    /// The authority.
    #[default]
    Authority,
    /// The supervisor.
    Supervisor,
}
