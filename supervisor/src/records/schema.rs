//! The database file and its schema: the file kept private, and the migrations applied in
//! order on open.

use std::path::Path;

use rusqlite::Connection;

use super::error::RecordsError;

/// Schema migrations, in order; `PRAGMA user_version` counts how many have been applied.
/// Version 1 is the original table (created with `IF NOT EXISTS`, so databases from before
/// versioning adopt it unchanged).
pub(super) const MIGRATIONS: [&str; 4] = [
    "CREATE TABLE IF NOT EXISTS runs (
    run_id     TEXT PRIMARY KEY,
    owner      TEXT NOT NULL,
    subject    TEXT NOT NULL,
    receipt    BLOB NOT NULL,
    state      TEXT NOT NULL,
    host_id    INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    ended_at   INTEGER,
    expires_at INTEGER NOT NULL,
    report     TEXT
);
CREATE INDEX IF NOT EXISTS runs_state ON runs(state);",
    // Delegation: a child run points at the run whose gateway started it.
    "ALTER TABLE runs ADD COLUMN parent_run_id TEXT;
ALTER TABLE runs ADD COLUMN depth INTEGER NOT NULL DEFAULT 0;
CREATE INDEX runs_parent ON runs(parent_run_id) WHERE parent_run_id IS NOT NULL;",
    // Starts that failed before the agent existed may be tried again: count the tries.
    "ALTER TABLE runs ADD COLUMN attempts INTEGER NOT NULL DEFAULT 1;",
    // Live restore: what the next supervisor needs to re-adopt a run left running detached.
    "ALTER TABLE runs ADD COLUMN detached TEXT;",
];

/// Applies the migrations `conn` lacks, each in its own transaction with its version bump.
pub(super) fn migrate(conn: &mut Connection, path: &Path) -> Result<(), RecordsError> {
    let known = MIGRATIONS.len() as i64;
    let found: i64 = conn.query_row("PRAGMA user_version", [], |row| row.get(0))?;
    if found > known {
        return Err(RecordsError::NewerSchema {
            path: path.to_owned(),
            found,
            known,
        });
    }
    for (version, migration) in MIGRATIONS.iter().enumerate().skip(found as usize) {
        let tx = conn.transaction()?;
        tx.execute_batch(migration)?;
        tx.execute_batch(&format!("PRAGMA user_version = {}", version + 1))?;
        tx.commit()?;
    }
    Ok(())
}

/// Makes `path` mode 0600: every receipt is in the database. With `create`, creates it first
/// if absent (so SQLite never creates it with the umask's mode; SQLite gives `-wal` and `-shm`
/// the database's mode). Without, a missing file is fine.
pub(super) fn make_private(path: &Path, create: bool) -> Result<(), RecordsError> {
    use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
    let file_error = |source| RecordsError::File {
        path: path.to_owned(),
        source,
    };
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .write(create)
        .create(create)
        .truncate(false)
        .mode(0o600)
        .open(path)
    {
        Ok(file) => file,
        Err(e) if !create && e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(file_error(e)),
    };
    // The mode given to open() is filtered by the umask, and an older file keeps its own.
    file.set_permissions(std::fs::Permissions::from_mode(0o600))
        .map_err(file_error)
}
