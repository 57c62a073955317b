//! Keeping the authority's state safe: `tollgate-authority backup` copies the database while
//! the authority serves (SQLite's online backup: one consistent snapshot, whatever is being
//! written meanwhile), and `tollgate-authority restore` puts a backup in place of a lost or
//! damaged database — only while no authority holds the data directory.
//!
//! A restored database cannot know what was minted, revoked or rotated after its backup, so
//! it is made safe before it is served: every key it holds is withdrawn (the receipts they
//! signed stop verifying everywhere, including any minted after the backup; the next start
//! signs with a new key), and its revocation history gets a new id, which makes every
//! supervisor read the revocations again from the start instead of assuming the ones it
//! already saw. Runs already started go on; receipts not yet started are minted again.

use std::path::{Path, PathBuf};

use rusqlite::{Connection, OpenFlags};

use crate::error::AuthorityError;
use crate::store::Store;
use crate::DATABASE_FILE;

/// What a restore did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestoreReport {
    /// The database now in place.
    pub database: PathBuf,
    /// The keys withdrawn: receipts they signed no longer verify.
    pub withdrawn_keys: Vec<String>,
    /// The new revocation history id.
    pub history: String,
}

/// Copies the database of `data_dir` to `to` (created 0600; never overwritten), consistent
/// while an authority serves it. Blocking.
pub fn backup(data_dir: &Path, to: &Path) -> Result<(), AuthorityError> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let database = data_dir.join(DATABASE_FILE);
    if !database.exists() {
        return Err(AuthorityError::DatabaseMissing { path: database });
    }
    let source = Connection::open_with_flags(
        &database,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    source.busy_timeout(std::time::Duration::from_secs(5))?;
    // Created here, private and new: a backup holds every operator's token hash.
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(to)
        .map_err(AuthorityError::write_file(to))?;
    let copied = (|| {
        let mut target = Connection::open(to)?;
        // All pages in one step: one read transaction, so one consistent snapshot (retried
        // while a writer holds the database for a moment).
        let backup = rusqlite::backup::Backup::new(&source, &mut target)?;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            match backup.step(-1)? {
                rusqlite::backup::StepResult::Done => break,
                _ if std::time::Instant::now() > deadline => {
                    return Err(AuthorityError::DatabaseUnreadable {
                        path: database.clone(),
                        detail: "the database stayed busy for 30 s".into(),
                    })
                }
                _ => std::thread::sleep(std::time::Duration::from_millis(50)),
            }
        }
        drop(backup);
        target.execute_batch("PRAGMA journal_mode = DELETE;")?;
        Ok::<(), AuthorityError>(())
    })();
    if let Err(e) = copied {
        let _ = std::fs::remove_file(to);
        return Err(e);
    }
    std::fs::File::open(to)
        .and_then(|file| file.sync_all())
        .map_err(AuthorityError::write_file(to))?;
    Ok(())
}

/// Puts the backup `from` in place as the database of `data_dir` (which no authority may
/// hold), checked and migrated, its keys withdrawn and its revocation history renewed.
/// Blocking.
pub fn restore(data_dir: &Path, from: &Path) -> Result<RestoreReport, AuthorityError> {
    crate::files::ensure_private_dir(data_dir)?;
    // Held for the whole restore: a serving authority, or a second restore, is refused.
    let _lock = tollgate_daemon::files::DataDirLock::acquire(data_dir)?;
    let database = data_dir.join(DATABASE_FILE);
    let staged = data_dir.join(format!("{DATABASE_FILE}.restoring"));
    let _ = std::fs::remove_file(&staged);
    std::fs::copy(from, &staged).map_err(|source| AuthorityError::DatabaseUnreadable {
        path: from.to_owned(),
        detail: source.to_string(),
    })?;
    let prepared = (|| {
        let store = Store::open(&staged)?;
        let withdrawn_keys = store.prepare_restored(tollgate_receipt::unix_now())?;
        let history = store.history_id()?;
        drop(store);
        Ok::<_, AuthorityError>((withdrawn_keys, history))
    })();
    let (withdrawn_keys, history) = match prepared {
        Ok(prepared) => prepared,
        Err(e) => {
            let _ = std::fs::remove_file(&staged);
            return Err(e);
        }
    };
    // The damaged database's journal must not be replayed onto the restored one.
    for suffix in ["-wal", "-shm"] {
        let _ = std::fs::remove_file(data_dir.join(format!("{DATABASE_FILE}{suffix}")));
        let _ = std::fs::remove_file(data_dir.join(format!("{DATABASE_FILE}.restoring{suffix}")));
    }
    std::fs::rename(&staged, &database).map_err(AuthorityError::write_file(&database))?;
    std::fs::File::open(data_dir)
        .and_then(|dir| dir.sync_all())
        .map_err(AuthorityError::write_file(data_dir))?;
    Ok(RestoreReport {
        database,
        withdrawn_keys,
        history,
    })
}
