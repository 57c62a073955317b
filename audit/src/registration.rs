//! The right to write one log directory, in this process and against other processes.

use std::collections::BTreeSet;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::PathBuf;
use std::sync::Mutex;

use crate::error::AuditError;
use crate::queue::lock;

// Directories with an open AuditLog in this process: two writers on one chain would fork it.
static OPEN_DIRS: Mutex<BTreeSet<PathBuf>> = Mutex::new(BTreeSet::new());

/// The name of the lock file that keeps a second process from writing the same log.
pub(crate) const WRITER_LOCK_FILE: &str = "writer.lock";

/// The right to write one log directory: registered in this process, and an exclusive
/// `flock` on `<dir>/writer.lock` against other processes (released when the holder exits,
/// however it exits).
pub(crate) struct Registration {
    dir: PathBuf,
    _flock: nix::fcntl::Flock<File>,
}

impl Registration {
    pub(crate) fn claim(dir: PathBuf) -> Result<Self, AuditError> {
        if !lock(&OPEN_DIRS).insert(dir.clone()) {
            return Err(AuditError::AlreadyOpen { dir });
        }
        let path = dir.join(WRITER_LOCK_FILE);
        let flock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&path)
            .map_err(|source| AuditError::Write {
                path: path.clone(),
                source,
            })
            .and_then(|file| {
                nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock)
                    .map_err(|_| AuditError::InUse { dir: dir.clone() })
            });
        match flock {
            Ok(flock) => Ok(Self { dir, _flock: flock }),
            Err(e) => {
                lock(&OPEN_DIRS).remove(&dir);
                Err(e)
            }
        }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        lock(&OPEN_DIRS).remove(&self.dir);
    }
}
