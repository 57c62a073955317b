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

/// How long [`DataDirLock::acquire`] waits for a lock another process holds.
pub const LOCK_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// An exclusive lock on a data directory, held for the daemon's lifetime.
#[derive(Debug)]
pub struct DataDirLock {
    _lock: nix::fcntl::Flock<fs::File>,
}

impl DataDirLock {
    /// Takes `<dir>/lock`, failing if another process still holds it after
    /// [`LOCK_GRACE`]: a daemon that just crashed can leave a child between `fork` and `exec`
    /// holding the inherited descriptor for a few milliseconds, and a restart must not lose
    /// that race; a live second daemon holds it for good and is refused.
    pub fn acquire(dir: &Path) -> Result<Self, LockError> {
        let path = dir.join("lock");
        let mut file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&path)
            .map_err(|source| LockError::Open {
                path: path.clone(),
                source,
            })?;
        let deadline = std::time::Instant::now() + LOCK_GRACE;
        loop {
            match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
                Ok(lock) => return Ok(Self { _lock: lock }),
                Err((back, _)) if std::time::Instant::now() < deadline => {
                    file = back;
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                Err(_) => {
                    return Err(LockError::InUse {
                        dir: dir.to_owned(),
                    })
                }
            }
        }
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

/// Why a secret file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SecretFileError {
    /// It could not be opened (a link is refused: never followed).
    #[error("{path}: {source} (a secret file is a regular file, not a link)")]
    Open {
        /// The file.
        path: PathBuf,
        /// The failure.
        source: io::Error,
    },
    /// It could not be read.
    #[error("{path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The failure.
        source: io::Error,
    },
    /// It is not a regular file.
    #[error("{path} is not a regular file")]
    NotAFile {
        /// The file.
        path: PathBuf,
    },
    /// Someone but root could read or change it.
    #[error("{path} must be owned by root with mode 0600 or stricter (chown root {path}; chmod 600 {path})")]
    NotPrivate {
        /// The file.
        path: PathBuf,
    },
    /// It holds nothing.
    #[error("{path} is empty")]
    Empty {
        /// The file.
        path: PathBuf,
    },
}

/// Reads a secret (a token) from a file only root can read: a regular file owned by root
/// with no group or other permissions, checked and read through one descriptor that never
/// followed a link; trailing whitespace is dropped and an empty secret is refused.
pub fn read_secret_file(path: &Path) -> Result<crate::Secret, SecretFileError> {
    use std::io::Read as _;
    use std::os::unix::fs::MetadataExt as _;
    let mut file = OpenOptions::new()
        .read(true)
        .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
        .open(path)
        .map_err(|source| SecretFileError::Open {
            path: path.to_owned(),
            source,
        })?;
    let read_error = |source| SecretFileError::Read {
        path: path.to_owned(),
        source,
    };
    let meta = file.metadata().map_err(read_error)?;
    if !meta.is_file() {
        return Err(SecretFileError::NotAFile {
            path: path.to_owned(),
        });
    }
    if meta.uid() != 0 || meta.mode() & 0o077 != 0 {
        return Err(SecretFileError::NotPrivate {
            path: path.to_owned(),
        });
    }
    let mut text = zeroize::Zeroizing::new(String::new());
    file.read_to_string(&mut text).map_err(read_error)?;
    let trimmed = text.trim_end();
    if trimmed.is_empty() {
        return Err(SecretFileError::Empty {
            path: path.to_owned(),
        });
    }
    Ok(crate::Secret::new(trimmed.to_owned()))
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
    fn secret_files_must_be_root_only_regular_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        write_atomic(&path, b"tgt_abc\n", 0o600).unwrap();
        let uid_is_root = nix::unistd::geteuid().is_root();
        match read_secret_file(&path) {
            Ok(secret) => {
                assert!(uid_is_root);
                assert_eq!(secret.expose(), "tgt_abc");
            }
            Err(e) => assert!(!uid_is_root && matches!(e, SecretFileError::NotPrivate { .. })),
        }
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        let open = read_secret_file(&path).unwrap_err();
        assert!(matches!(open, SecretFileError::NotPrivate { .. }), "{open}");
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        let linked = read_secret_file(&link).unwrap_err();
        assert!(matches!(linked, SecretFileError::Open { .. }), "{linked}");
        write_atomic(&path, b"\n", 0o600).unwrap();
        if uid_is_root {
            let empty = read_secret_file(&path).unwrap_err();
            assert!(matches!(empty, SecretFileError::Empty { .. }), "{empty}");
        }
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
