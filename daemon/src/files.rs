//! A daemon's own files: the data directory's lock (one daemon per directory) and private
//! files written atomically (temp file, fsync, rename, fsync directory), created with their
//! final mode from the start so a secret is never readable by others, even briefly.

use std::fs::{self, OpenOptions};
use std::io::{self, Write as _};
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

/// Why a data directory could not be locked.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// The lock file could not be opened.
    #[error("cannot open {path}: {source}")]
    Open {
        /// The lock file.
        path: PathBuf,
        /// The failure.
        source: io::Error,
    },
    /// Another process holds the lock.
    #[error("data directory {dir} is in use by another process (stop it, or give this one another --data-dir)")]
    InUse {
        /// The data directory.
        dir: PathBuf,
    },
}

/// An exclusive lock on a data directory, held for the daemon's lifetime.
#[derive(Debug)]
pub struct DataDirLock {
    _lock: nix::fcntl::Flock<fs::File>,
}

impl DataDirLock {
    /// Takes `<dir>/lock`, failing at once if another process holds it.
    pub fn acquire(dir: &Path) -> Result<Self, LockError> {
        let path = dir.join("lock");
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&path)
            .map_err(|source| LockError::Open {
                path: path.clone(),
                source,
            })?;
        let lock = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock)
            .map_err(|_| LockError::InUse {
                dir: dir.to_owned(),
            })?;
        Ok(Self { _lock: lock })
    }
}

/// Atomically replaces `path` with `contents`, with exactly `mode`: readers see the old file
/// or the new one, never a part, and a crash leaves one of the two.
pub fn write_atomic(path: &Path, contents: &[u8], mode: u32) -> io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    let temp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let result = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&temp)?;
        // The mode given to open() is filtered by the umask; set it exactly.
        file.set_permissions(fs::Permissions::from_mode(mode))?;
        file.write_all(contents)?;
        file.sync_all()?;
        fs::rename(&temp, path)?;
        fs::File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = fs::remove_file(&temp);
    }
    result
}

/// Writes a daemon's readiness file: the address it serves, one line, atomically (0644), so
/// whoever waits for it reads a whole address or nothing.
pub fn write_readiness(path: &Path, address: &str) -> io::Result<()> {
    write_atomic(path, format!("{address}\n").as_bytes(), 0o644)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_on_one_directory_is_refused_until_the_first_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let first = DataDirLock::acquire(dir.path()).unwrap();
        let second = DataDirLock::acquire(dir.path()).unwrap_err();
        assert!(matches!(second, LockError::InUse { .. }), "{second}");
        drop(first);
        DataDirLock::acquire(dir.path()).unwrap();
    }

    #[test]
    fn atomic_writes_replace_whole_files_with_their_exact_mode() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret");
        write_atomic(&path, b"one", 0o600).unwrap();
        write_atomic(&path, b"two", 0o600).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"two");
        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o600);
        assert_eq!(
            fs::read_dir(dir.path()).unwrap().count(),
            1,
            "no temp file left"
        );
        write_readiness(&dir.path().join("ready"), "127.0.0.1:1").unwrap();
        assert_eq!(
            fs::read_to_string(dir.path().join("ready")).unwrap(),
            "127.0.0.1:1\n"
        );
    }
}
