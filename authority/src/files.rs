//! Private files: written atomically (temp file, fsync, rename, fsync directory) and created
//! with mode 0600 from the start, so a secret is never readable by others even briefly.

use std::fs::{self, OpenOptions};
use std::io::Write as _;
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::Path;

use crate::error::AuthorityError;

/// Creates `dir` (and parents) as 0700, or refuses an existing one that other users can
/// enter, naming the `chmod` that fixes it (the rule both daemons share, from the audit crate).
pub fn ensure_private_dir(dir: &Path) -> Result<(), AuthorityError> {
    tollgate_audit::ensure_private_dir(dir).map_err(AuthorityError::PrivateDir)
}

/// An exclusive lock on a data directory, held for the daemon's lifetime.
#[derive(Debug)]
pub struct DirLock {
    _lock: nix::fcntl::Flock<fs::File>,
}

impl DirLock {
    /// Takes `<dir>/lock`, failing at once if another process holds it.
    pub fn acquire(dir: &Path) -> Result<Self, AuthorityError> {
        let path = dir.join("lock");
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&path)
            .map_err(|source| AuthorityError::WriteFile {
                path: path.clone(),
                source,
            })?;
        let lock = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock)
            .map_err(|_| AuthorityError::DataDirInUse {
                path: dir.to_owned(),
            })?;
        Ok(Self { _lock: lock })
    }
}

/// Atomically replaces `path` with `contents`, with the given mode.
pub fn write_atomic(path: &Path, contents: &[u8], mode: u32) -> Result<(), AuthorityError> {
    let wrap = |source| AuthorityError::WriteFile {
        path: path.to_owned(),
        source,
    };
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
    result.map_err(wrap)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_file_has_mode_0600_and_replaces_atomically() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret");
        write_atomic(&path, b"one", 0o600).unwrap();
        write_atomic(&path, b"two", 0o600).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"two");
        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(
            fs::read_dir(dir.path()).unwrap().count(),
            1,
            "no temp file left"
        );
    }
}
