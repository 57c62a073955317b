//! Errors of the authority, with one explicit mapping to gRPC status codes and exit codes.

use std::path::{Path, PathBuf};

use tollgate_daemon::files::LockError;
use tollgate_daemon::token::BearerError;

/// Failures that stop the daemon or a storage operation.
#[derive(Debug, thiserror::Error)]
pub enum AuthorityError {
    /// The configuration file or a flag is unusable.
    #[error("configuration: {0}")]
    Config(String),
    /// The data directory (or its key directory) cannot be created, or is open to other users.
    #[error("data directory: {0}")]
    PrivateDir(tollgate_audit::PrivateDirError),
    /// The data directory cannot be created or secured.
    #[error("data directory {path}: {source}")]
    DataDir {
        /// The directory.
        path: PathBuf,
        /// The I/O failure.
        source: std::io::Error,
    },
    /// The database file cannot be opened or read (permissions, missing directory...).
    #[error(
        "cannot open database {path}: {detail}; fix its permissions or restore it from a backup"
    )]
    DatabaseUnreadable {
        /// The database file.
        path: PathBuf,
        /// What SQLite said.
        detail: String,
    },
    /// The database is gone but the directory was initialised before: starting afresh would
    /// silently lose every receipt, revocation and operator.
    #[error("database {path} is missing but this data directory was initialised before (it holds keys or admin.token); restore the database from a backup, or move the directory aside to start afresh")]
    DatabaseMissing {
        /// The database file.
        path: PathBuf,
    },
    /// Another authority holds the data directory.
    #[error("data directory {path} is in use by another tollgate-authority (lock held on {path}/lock); stop it or use another --data-dir")]
    DataDirInUse {
        /// The directory.
        path: PathBuf,
    },
    /// The database exists but is damaged. The daemon never resets it: the receipts and
    /// revocations in it must not be lost silently.
    #[error("database {path} is corrupt ({detail}); refusing to start: restore it from a backup or move it aside to start empty")]
    DatabaseCorrupt {
        /// The database file.
        path: PathBuf,
        /// What the integrity check or SQLite reported.
        detail: String,
    },
    /// The database was written by a newer version of Tollgate.
    #[error("database {path} has schema version {found}, newer than this build supports ({supported}); upgrade tollgate-authority")]
    SchemaTooNew {
        /// The database file.
        path: PathBuf,
        /// Schema version found.
        found: i64,
        /// Highest version this build knows.
        supported: i64,
    },
    /// A storage operation failed at run time.
    #[error("database error: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// A signing key file cannot be read or written.
    #[error("signing key file {path}: {detail}")]
    KeyFile {
        /// The key file.
        path: PathBuf,
        /// What went wrong.
        detail: String,
    },
    /// Writing a file (token, address, key) failed.
    #[error("cannot write {path}: {source}")]
    WriteFile {
        /// The file.
        path: PathBuf,
        /// The I/O failure.
        source: std::io::Error,
    },
    /// The listen address could not be bound.
    #[error("cannot listen on {addr}: {source}; pick another address with --listen (\"127.0.0.1:0\" chooses a free port)")]
    Bind {
        /// The address.
        addr: String,
        /// The I/O failure.
        source: std::io::Error,
    },
    /// The gRPC server failed.
    #[error("gRPC server: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// The audit log could not be opened or written.
    #[error("audit log: {0}")]
    Audit(#[from] tollgate_audit::AuditError),
    /// A blocking storage task panicked or was cancelled.
    #[error("storage task failed: {0}")]
    Task(String),
    /// The public keys in the database do not form a key set (a key that does not parse).
    #[error("the stored public keys do not form a key set: {0}")]
    StoredKeys(#[from] tollgate_receipt::KeySetError),
}

impl AuthorityError {
    /// Process exit code for this error when it stops the daemon (sysexits-style).
    pub fn exit_code(&self) -> i32 {
        match self {
            Self::Config(_) => 78,              // EX_CONFIG
            Self::DatabaseCorrupt { .. } => 65, // EX_DATAERR
            Self::SchemaTooNew { .. } => 65,    // EX_DATAERR
            Self::StoredKeys(_) => 65,          // EX_DATAERR
            Self::DatabaseUnreadable { .. } | Self::DatabaseMissing { .. } => 66, // EX_NOINPUT
            Self::DataDirInUse { .. } => 75,    // EX_TEMPFAIL
            Self::Bind { .. } => 69,            // EX_UNAVAILABLE
            Self::DataDir { .. }
            | Self::PrivateDir(_)
            | Self::KeyFile { .. }
            | Self::WriteFile { .. } => 73, // EX_CANTCREAT
            Self::Sqlite(_) | Self::Transport(_) | Self::Task(_) => 70, // EX_SOFTWARE
            Self::Audit(e) => e.exit_code(),
        }
    }

    /// Wraps a failed write of `path` (token, address, key).
    pub(crate) fn write_file(path: &Path) -> impl FnOnce(std::io::Error) -> Self + '_ {
        move |source| Self::WriteFile {
            path: path.to_owned(),
            source,
        }
    }

    /// Wraps blocking work that panicked or was cancelled.
    pub(crate) fn task(error: tokio::task::JoinError) -> Self {
        Self::Task(error.to_string())
    }
}

/// The data directory's lock, in the authority's words: another holder is
/// [`AuthorityError::DataDirInUse`] (exit 75), a lock file that cannot be opened a
/// [`AuthorityError::WriteFile`] (exit 73).
impl From<LockError> for AuthorityError {
    fn from(error: LockError) -> Self {
        match error {
            LockError::InUse { dir } => Self::DataDirInUse { path: dir },
            LockError::Open { path, source } => Self::WriteFile { path, source },
        }
    }
}

/// Why one gRPC call failed. Converted to a [`tonic::Status`] in exactly one place (`status.rs`).
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// No token, or one the authority does not know.
    #[error("{0}")]
    Unauthenticated(String),
    /// The caller may not do this; the message names the offending grant.
    #[error("{0}")]
    PermissionDenied(String),
    /// A request field is malformed; the message names it.
    #[error("{field}: {reason}")]
    InvalidArgument {
        /// The request field, e.g. `fs[1].path`.
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The receipt (or other object) does not exist.
    #[error("{0}")]
    NotFound(String),
    /// An operator with this name already exists.
    #[error("{0}")]
    AlreadyExists(String),
    /// The object is not in a state that allows this (a revoked or expired receipt).
    #[error("{0}")]
    FailedPrecondition(String),
    /// Storage failed; details are logged, not sent.
    #[error("internal error: {0}")]
    Internal(#[from] AuthorityError),
}

/// A request without a usable bearer token, told what to send.
impl From<BearerError> for CallError {
    fn from(error: BearerError) -> Self {
        Self::Unauthenticated(match error {
            BearerError::Missing => "missing \"authorization: Bearer <token>\" metadata; pass an operator token (or, for DelegateReceipt, a supervisor's delegation token)".into(),
            BearerError::Malformed => "authorization metadata must be \"Bearer <token>\"".into(),
        })
    }
}

impl CallError {
    /// Shorthand for [`CallError::InvalidArgument`].
    pub fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::InvalidArgument {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shared_crates_errors_keep_the_authoritys_words_and_exit_codes() {
        let missing = CallError::from(BearerError::Missing).to_string();
        assert!(missing.contains("pass an operator token"), "{missing}");
        let in_use = AuthorityError::from(LockError::InUse {
            dir: "/data".into(),
        });
        assert_eq!(in_use.exit_code(), 75);
        assert!(
            in_use
                .to_string()
                .contains("in use by another tollgate-authority (lock held on /data/lock)"),
            "{in_use}"
        );
        let open = AuthorityError::from(LockError::Open {
            path: "/data/lock".into(),
            source: std::io::ErrorKind::PermissionDenied.into(),
        });
        assert_eq!(open.exit_code(), 73);
    }
}
