//! The records' error type. A leaf, so every `records` module can return it.

use std::path::PathBuf;

/// A records operation failed.
#[derive(Debug, thiserror::Error)]
pub enum RecordsError {
    /// The database is damaged; never reset.
    #[error(
        "database {path} is corrupt ({detail}); refusing to start: restore it or move it aside"
    )]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What SQLite said.
        detail: String,
    },
    /// Any other SQLite failure.
    #[error("database error: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// The database file (or its `-wal`/`-shm`) could not be created or made private.
    #[error("database {path}: {source}")]
    File {
        /// The file.
        path: PathBuf,
        /// The failure.
        source: std::io::Error,
    },
    /// A stored report does not decode.
    #[error("stored report of run {0} is unreadable")]
    Report(String),
    /// The database was written by a newer supervisor.
    #[error("database {path} has schema version {found}, newer than this supervisor's {known}; run the newer supervisor or move the database aside")]
    NewerSchema {
        /// The file.
        path: PathBuf,
        /// Its `user_version`.
        found: i64,
        /// The newest this binary knows.
        known: i64,
    },
}
