//! Errors of the writer, the reader and key loading. Verification has its own
//! [`VerifyError`](crate::VerifyError).

use std::path::PathBuf;

use crate::problem::VerifyError;

/// Why opening, appending to, reading or configuring an audit log failed.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    /// The configuration is unusable; the message names the field.
    #[error("audit configuration: {0}")]
    Config(String),
    /// The log directory cannot be created, or is open to other users.
    #[error("audit directory: {0}")]
    PrivateDir(#[from] crate::files::PrivateDirError),
    /// The log directory cannot be created, listed or synced.
    #[error("audit directory {path}: {source}; check that it exists, is a directory and is writable by this user")]
    Dir {
        /// The directory.
        path: PathBuf,
        /// The I/O failure.
        source: std::io::Error,
    },
    /// A log, checkpoint or key file cannot be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O failure.
        source: std::io::Error,
    },
    /// A log, checkpoint or recovery file cannot be written, truncated or synced.
    #[error("cannot write {path}: {source}; check free space and permissions")]
    Write {
        /// The file.
        path: PathBuf,
        /// The I/O failure.
        source: std::io::Error,
    },
    /// Another [`AuditLog`](crate::AuditLog) in this process has the directory open.
    #[error("audit directory {dir} is already open in this process; share the AuditLog (it is cheap to clone) instead of opening it twice")]
    AlreadyOpen {
        /// The directory.
        dir: PathBuf,
    },
    /// The existing log does not verify, so appending would extend a broken chain.
    #[error("existing audit log in {dir} does not verify: {source}; refusing to append to it. Check it with `tollgate audit verify`, then move the directory aside to start a new log")]
    Broken {
        /// The directory.
        dir: PathBuf,
        /// What is wrong and where.
        #[source]
        source: Box<VerifyError>,
    },
    /// `checkpoint.pub` lists the configured key id with a different public key.
    #[error("{path} lists key id {key_id} with a different public key than the configured checkpoint key; use a distinct key id for a new key")]
    CheckpointKeyConflict {
        /// The `checkpoint.pub` file.
        path: PathBuf,
        /// The key id.
        key_id: String,
    },
    /// `checkpoint.pub` cannot be parsed.
    #[error(
        "{path}: {detail}; restore it or move it aside (it is rewritten from the configured key)"
    )]
    CheckpointPub {
        /// The `checkpoint.pub` file.
        path: PathBuf,
        /// What is wrong with it.
        detail: String,
    },
    /// The writer thread cannot be started.
    #[error("cannot start the audit writer thread: {source}")]
    Spawn {
        /// The failure.
        source: std::io::Error,
    },
    /// The log was closed; nothing more can be appended.
    #[error("the audit log is closed; open it again to append")]
    Closed,
    /// The writer cannot write now (disk full, an I/O error): this entry was not recorded.
    /// It retries by itself and accepts entries again once it can write.
    #[error("the audit log cannot be written now ({detail}); the entry was not recorded. The writer retries and resumes by itself once the cause is gone (free disk space)")]
    Unavailable {
        /// Why it cannot write.
        detail: String,
    },
    /// The writer could not put its file back to a whole entry and stopped: entries are no
    /// longer being recorded.
    #[error("the audit writer stopped after an error ({detail}); nothing more is recorded. Fix the cause (disk full? permissions?) and restart: reopening recovers the log")]
    WriterFailed {
        /// The first error the writer hit.
        detail: String,
    },
    /// Another process is writing this log.
    #[error("audit directory {dir} is being written by another process (lock held on {dir}/writer.lock); stop it or use another data directory")]
    InUse {
        /// The log directory.
        dir: PathBuf,
    },
    /// The checkpoint key file does not hold a key.
    #[error("{path} does not hold a checkpoint key (64 hex digits); restore it from a backup, or move it aside to start a new key (and a new audit directory)")]
    CheckpointKeyFile {
        /// The key file.
        path: PathBuf,
    },
    /// The audit key file cannot be read.
    #[error("cannot read audit key file {path}: {source}")]
    KeyFile {
        /// The key file.
        path: PathBuf,
        /// The I/O failure.
        source: std::io::Error,
    },
    /// The environment variable meant to hold the audit key is not set.
    #[error("environment variable {name} is not set; it must hold the audit key (hex, at least 32 bytes)")]
    KeyEnvMissing {
        /// The variable.
        name: String,
    },
    /// The audit key is shorter than [`AuditKey::MIN_LEN`](crate::AuditKey::MIN_LEN).
    #[error("audit key from {origin} has {len} bytes; it needs at least 32 (e.g. 64 hex digits from `openssl rand -hex 32`)")]
    KeyTooShort {
        /// Where the key came from.
        origin: String,
        /// Its length in bytes after decoding.
        len: usize,
    },
    /// The directory holds no log files (reading needs at least one).
    #[error("no audit log in {dir}: no log-NNNNNN.jsonl files")]
    NoLog {
        /// The directory.
        dir: PathBuf,
    },
    /// A line of the log cannot be read as an entry.
    #[error(
        "{path}:{line}: not an audit entry: {detail}; run `tollgate audit verify` on the directory"
    )]
    BadEntry {
        /// The log file.
        path: PathBuf,
        /// Its 1-based line number.
        line: usize,
        /// What the parser said.
        detail: String,
    },
}

impl AuditError {
    /// The exit code a daemon or the CLI stops with for this error (sysexits-style), so every
    /// component reports the same failure the same way.
    pub fn exit_code(&self) -> i32 {
        match self {
            Self::Config(_) | Self::KeyEnvMissing { .. } | Self::KeyTooShort { .. } => 78, // EX_CONFIG
            Self::Read { .. } | Self::KeyFile { .. } | Self::NoLog { .. } => 66, // EX_NOINPUT
            Self::Broken { .. }
            | Self::CheckpointKeyConflict { .. }
            | Self::CheckpointPub { .. }
            | Self::CheckpointKeyFile { .. }
            | Self::BadEntry { .. } => 65, // EX_DATAERR
            Self::Dir { .. } | Self::PrivateDir(_) | Self::Write { .. } => 73,   // EX_CANTCREAT
            Self::AlreadyOpen { .. } | Self::InUse { .. } | Self::Unavailable { .. } => 75, // EX_TEMPFAIL
            Self::Spawn { .. } | Self::Closed | Self::WriterFailed { .. } => 70, // EX_SOFTWARE
        }
    }
}
